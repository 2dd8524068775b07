//! Chaos in rooms: three nodes and one Redis under random joins, leaves,
//! state changes and signals, clean closes, dropped connections that come
//! back elsewhere (joining their rooms again, as a client would),
//! SIGKILLed and restarted nodes and Redis restarting empty. After a quiet
//! period every room's membership in Redis must equal the devices actually
//! in it, and every member's view (kept from its `room` frames and events,
//! as a client keeps it) must match it.
//!
//! The nodes run with different heartbeat settings, as a fleet does in the
//! middle of a rolling change of config: one with a 1.5 s lease, the
//! others with the default TTL of three 1.5 s heartbeats.
//!
//! On a Redis Cluster (`rooms_stay_right_through_chaos_on_a_cluster`) the
//! nodes share three primaries with a replica each, rooms on every shard,
//! and instead of Redis restarting empty the primaries of two shards are
//! SIGKILLed in turn, each while the chaos goes on; the cluster's
//! `cluster-node-timeout` makes each failover outlast the short lease.
//! [`failover`] is the same failover on its own, with checks at each step.
//!
//! A short run of each is part of `cargo test`; a longer one:
//! `ROOM_CHAOS_SECS=120 cargo test --release --test it rooms_chaos:: -- --nocapture`

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::common::cluster::Cluster;
use crate::common::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

mod failover;

const NODES: usize = 3;
const DEVICES: usize = 24;
/// Rooms on one Redis.
const ROOMS: usize = 4;
/// Rooms on each shard of a cluster.
const ROOMS_PER_SHARD: usize = 2;
const FLAGS: [&str; 4] = [
    "--max-frames-per-sec",
    "1000",
    "--max-room-messages-per-sec",
    "1000",
];
/// Each node's heartbeat settings: a rolling change of config, half done.
const HEARTBEATS: [&[&str]; NODES] = [
    &["--heartbeat-ms", "500", "--ttl-ms", "1500"],
    &["--heartbeat-ms", "1500"],
    &["--heartbeat-ms", "1500"],
];
/// The longest lease of the fleet: three of the longest heartbeats.
const LONGEST_TTL: Duration = Duration::from_millis(3 * 1500);
/// `cluster-node-timeout` of the chaos cluster: a failover outlasts the
/// shortest lease, as it may in production.
const NODE_TIMEOUT_MS: u64 = 1500;

/// One device: what it means to be in (its rooms, with its state in
/// each), its connection, and what it has been told of each room.
struct Device {
    user: String,
    device: String,
    client: Option<Client>,
    /// The rooms it joined, with its state there.
    rooms: BTreeMap<String, Value>,
    /// Per room, the members as this device was told: `user:device` ->
    /// state.
    views: BTreeMap<String, BTreeMap<String, Value>>,
    /// Rooms whose frame Redis could not take, to send again.
    retry: Vec<String>,
}

impl Device {
    fn member(&self) -> String {
        format!("{}:{}", self.user, self.device)
    }

    /// Applies one frame to the views.
    fn apply(&mut self, v: &Value) {
        let room = v["room"].as_str().unwrap_or_default().to_string();
        let who = format!(
            "{}:{}",
            v["user"].as_str().unwrap_or_default(),
            v["device"].as_str().unwrap_or_default()
        );
        match v["type"].as_str() {
            Some("room") => {
                let mut view = BTreeMap::new();
                for m in v["members"].as_array().into_iter().flatten() {
                    for d in m["devices"].as_array().into_iter().flatten() {
                        let key = format!(
                            "{}:{}",
                            m["user"].as_str().unwrap(),
                            d["device"].as_str().unwrap()
                        );
                        view.insert(key, d["state"].clone());
                    }
                }
                // A client keeps its own state: a room frame built before the
                // server saw its latest change shows the one before.
                let me = self.member();
                if let (Some(own), Some(state)) = (view.get_mut(&me), self.rooms.get(&room)) {
                    own.clone_from(state);
                }
                self.views.insert(room, view);
            }
            Some("room_join") | Some("room_update") => {
                self.views
                    .entry(room)
                    .or_default()
                    .insert(who, v["state"].clone());
            }
            Some("room_leave") => {
                self.views.entry(room).or_default().remove(&who);
            }
            // Redis was away (it restarts empty once): the client tries the
            // room again, with its state, as an app would.
            Some("error") if v["code"] == "unavailable" && self.rooms.contains_key(&room) => {
                self.retry.push(room);
            }
            Some("error") if v["code"] == "unavailable" => {}
            Some("error") => panic!("{}: refused {v}", self.member()),
            _ => {}
        }
    }
}

/// The Redis the nodes share.
enum Backend {
    One(Redis),
    Cluster(Cluster),
}

impl Backend {
    /// Node `n` of the fleet (`id` names this run of it), with its
    /// heartbeat settings.
    fn node(&self, n: usize, id: &str) -> Node {
        let mut flags = FLAGS.to_vec();
        flags.extend(HEARTBEATS[n]);
        match self {
            Self::One(redis) => Node::start_with(redis, id, &flags),
            Self::Cluster(cluster) => cluster.node_with(id, &flags),
        }
    }

    /// The rooms: on a cluster, [`ROOMS_PER_SHARD`] on each shard.
    fn rooms(&self) -> Vec<String> {
        match self {
            Self::One(_) => (0..ROOMS).map(|r| format!("room{r}")).collect(),
            Self::Cluster(cluster) => cluster
                .shards()
                .iter()
                .enumerate()
                .flat_map(|(i, shard)| {
                    (0..)
                        .map(move |r| format!("room{i}:{r}"))
                        .filter(|r| shard.serves(cluster.slot(&format!("r:{r}"))))
                        .take(ROOMS_PER_SHARD)
                })
                .collect(),
        }
    }

    /// Redis fault number `n`: the server restarts empty (once), or the
    /// primary of shard `n` of the cluster is SIGKILLed, for its replica to
    /// take over while the chaos goes on (its port joins `killed`). `None`
    /// when there is no such fault, or the last failover is not over yet.
    fn fault(&mut self, n: usize, killed: &mut Vec<u16>) -> Option<&'static str> {
        match self {
            Self::One(redis) if n == 0 => {
                redis.restart_empty();
                Some("redis restart (empty)")
            }
            Self::One(_) => None,
            Self::Cluster(cluster) => {
                if n >= 2 || !cluster.is_healthy(killed) {
                    return None;
                }
                let victim = cluster.shards_without(killed).get(n)?.primary;
                cluster.kill(victim);
                killed.push(victim);
                Some("primary SIGKILL (replica promoted)")
            }
        }
    }

    /// Waits until every failover is over.
    fn settle(&self, killed: &[u16]) {
        if let Self::Cluster(cluster) = self {
            tokio::task::block_in_place(|| cluster.wait_healthy(killed));
        }
    }

    /// `room`'s memberships as Redis holds them (see [`memberships`]).
    async fn memberships(
        &self,
        room: &str,
        killed: &[u16],
    ) -> (BTreeSet<String>, BTreeSet<String>, Vec<u64>) {
        match self {
            Self::One(redis) => memberships(room)
                .query_async(&mut redis.aconn().await)
                .await
                .unwrap(),
            Self::Cluster(cluster) => {
                let slot = cluster.slot(&format!("r:{room}"));
                let shard = cluster
                    .shards_without(killed)
                    .into_iter()
                    .find(|s| s.serves(slot))
                    .unwrap();
                memberships(room)
                    .query(&mut cluster.conn(shard.primary))
                    .unwrap()
            }
        }
    }
}

/// The read of `room`'s memberships as Redis holds them: its members, the
/// members with a deadline, and its per-user device counts.
fn memberships(room: &str) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    pipe.cmd("HKEYS")
        .arg(format!("presence-room:{{r:{room}}}"))
        .cmd("ZRANGE")
        .arg(format!("presence-room-deadlines:{{r:{room}}}"))
        .arg(0)
        .arg(-1)
        .cmd("HVALS")
        .arg(format!("presence-room-users:{{r:{room}}}"));
    pipe
}

struct World {
    backend: Backend,
    rooms: Vec<String>,
    nodes: Vec<Option<Node>>,
    devices: Vec<Device>,
    rng: StdRng,
    ops: BTreeMap<&'static str, u64>,
}

impl World {
    fn live_node(&mut self) -> usize {
        let live: Vec<usize> = (0..NODES).filter(|&n| self.nodes[n].is_some()).collect();
        live[self.rng.random_range(0..live.len())]
    }

    /// Connects device `i` to a live node and joins its rooms again.
    async fn connect(&mut self, i: usize) {
        let n = self.live_node();
        let node = self.nodes[n].as_ref().unwrap();
        let (user, device) = (self.devices[i].user.clone(), self.devices[i].device.clone());
        let Some(mut client) = Client::try_connect(node, &user, &device).await else {
            return;
        };
        self.devices[i].views.clear();
        for (room, state) in &self.devices[i].rooms {
            client
                .send(json!({"type": "join", "room": room, "state": state}))
                .await;
        }
        self.devices[i].client = Some(client);
    }

    /// Reads what every device has been sent; a connection that closed is
    /// reconnected (its node died, or it was taken over).
    async fn drain(&mut self) {
        for i in 0..self.devices.len() {
            let (frames, closed) = self.devices[i]
                .client
                .as_mut()
                .map_or_else(Default::default, Client::waiting);
            for v in &frames {
                self.devices[i].apply(v);
            }
            if closed {
                self.devices[i].client = None;
                self.connect(i).await;
            }
            let d = &mut self.devices[i];
            for room in std::mem::take(&mut d.retry) {
                if let Some(state) = d.rooms.get(&room).cloned() {
                    send(d, json!({"type": "join", "room": room, "state": state})).await;
                }
            }
        }
    }

    /// One random operation of a random device.
    async fn step(&mut self) {
        let i = self.rng.random_range(0..self.devices.len());
        if self.devices[i].client.is_none() {
            self.connect(i).await;
            *self.ops.entry("connect").or_default() += 1;
            return;
        }
        let room = self.rooms[self.rng.random_range(0..self.rooms.len())].clone();
        let state = json!({"n": self.rng.random_range(0..1000)});
        let member = self.devices[i].member();
        let d = &mut self.devices[i];
        let op = match self.rng.random_range(0..100) {
            0..30 if !d.rooms.contains_key(&room) => {
                d.rooms.insert(room.clone(), state.clone());
                send(d, json!({"type": "join", "room": room, "state": state})).await;
                "join"
            }
            0..45 if d.rooms.contains_key(&room) => {
                d.rooms.remove(&room);
                d.views.remove(&room);
                send(d, json!({"type": "leave", "room": room})).await;
                "leave"
            }
            45..70 if d.rooms.contains_key(&room) => {
                d.rooms.insert(room.clone(), state.clone());
                // A device is not told of its own change.
                d.views
                    .entry(room.clone())
                    .or_default()
                    .insert(member, state.clone());
                send(
                    d,
                    json!({"type": "room_state", "room": room, "state": state}),
                )
                .await;
                "state"
            }
            70..85 if d.rooms.contains_key(&room) => {
                send(d, json!({"type": "signal", "room": room, "data": state})).await;
                "signal"
            }
            85..90 => {
                // A clean close: out of every room at once.
                d.rooms.clear();
                d.views.clear();
                if let Some(c) = d.client.take() {
                    c.close().await;
                }
                "close"
            }
            90..95 => {
                // A dropped connection that comes back at once, elsewhere.
                if let Some(c) = d.client.take() {
                    c.drop_tcp();
                }
                self.connect(i).await;
                "drop and return"
            }
            _ => "nothing",
        };
        *self.ops.entry(op).or_default() += 1;
    }
}

/// Sends `frame` if the device is connected; a connection that closed
/// meanwhile is found by the next drain.
async fn send(d: &mut Device, frame: Value) {
    if let Some(c) = d.client.as_mut() {
        let text = tokio_tungstenite::tungstenite::Message::text(frame.to_string());
        let _ = c.sink_send(text).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rooms_stay_right_through_chaos() {
    run(Backend::One(Redis::start())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rooms_stay_right_through_chaos_on_a_cluster() {
    run(Backend::Cluster(Cluster::start_with(NODE_TIMEOUT_MS, &[]))).await;
}

async fn run(backend: Backend) {
    raise_fd_limit();
    let secs: u64 = env_u64("ROOM_CHAOS_SECS", 8);
    let seed: u64 = env_u64("CHAOS_SEED", 7);
    let nodes = (0..NODES)
        .map(|n| Some(backend.node(n, &format!("n{n}"))))
        .collect();
    let rooms = backend.rooms();
    let devices = (0..DEVICES)
        .map(|i| Device {
            user: format!("u{}", i / 2),
            device: format!("d{}", i % 2),
            client: None,
            rooms: BTreeMap::new(),
            views: BTreeMap::new(),
            retry: Vec::new(),
        })
        .collect();
    let mut world = World {
        backend,
        rooms,
        nodes,
        devices,
        rng: StdRng::seed_from_u64(seed),
        ops: BTreeMap::new(),
    };
    let start = Instant::now();
    let end = start + Duration::from_secs(secs);
    // Two nodes SIGKILLed, at a quarter and at three quarters of the run
    // (each started again a second later), and the Redis faults from a
    // third of the run on (a second failover once the first is over).
    let (mut node_kills, mut killed): (usize, Option<(usize, Instant)>) = (0, None);
    let mut dead_primaries: Vec<u16> = Vec::new();
    let (mut faults, mut fault_look) = (0, Instant::now());
    while Instant::now() < end {
        world.step().await;
        world.drain().await;
        let elapsed = start.elapsed();
        if killed.is_none()
            && node_kills < 2
            && elapsed > Duration::from_secs(secs) * (1 + 2 * node_kills as u32) / 4
        {
            let n = world.live_node();
            if let Some(mut node) = world.nodes[n].take() {
                node.kill();
            }
            killed = Some((n, Instant::now()));
            node_kills += 1;
            *world.ops.entry("node SIGKILL").or_default() += 1;
        }
        if let Some((n, at)) = killed {
            if at.elapsed() > Duration::from_secs(1) {
                world.nodes[n] = Some(world.backend.node(n, &format!("n{n}r{node_kills}")));
                killed = None;
            }
        }
        // Whether the last failover is over is asked a few times a second:
        // each look opens a connection to every Redis server.
        let due = elapsed > Duration::from_secs(secs) * (1 + faults as u32) / 3;
        if due && fault_look.elapsed() > Duration::from_millis(200) {
            fault_look = Instant::now();
            if let Some(fault) = world.backend.fault(faults, &mut dead_primaries) {
                faults += 1;
                *world.ops.entry(fault).or_default() += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Quiet: the last failover ends, dropped devices' memberships lapse,
    // lost ones are joined again. A leave that failed in a failover while
    // its device stays connected lapses a lease TTL after its deadline:
    // two of the longest leases, and the pass.
    world.backend.settle(&dead_primaries);
    let until = Instant::now() + 2 * LONGEST_TTL + Duration::from_secs(2);
    while Instant::now() < until {
        world.drain().await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    world.drain().await;
    eprintln!("rooms chaos, {secs} s: {:?}", world.ops);

    for room in &world.rooms {
        let joined: BTreeSet<String> = world
            .devices
            .iter()
            .filter(|d| d.client.is_some() && d.rooms.contains_key(room))
            .map(Device::member)
            .collect();
        let (members, deadlines, counts) = world.backend.memberships(room, &dead_primaries).await;
        assert_eq!(members, joined, "{room}: Redis against the devices in it");
        assert_eq!(deadlines, joined, "{room}: the memberships with a deadline");
        let counted: u64 = counts.iter().sum();
        assert_eq!(counted, joined.len() as u64, "{room}: the per-user counts");
        for d in world
            .devices
            .iter()
            .filter(|d| joined.contains(&d.member()))
        {
            let view = d.views.get(room).cloned().unwrap_or_default();
            let seen: BTreeSet<String> = view.keys().cloned().collect();
            assert_eq!(seen, joined, "{room}: the view of {}", d.member());
            for other in world
                .devices
                .iter()
                .filter(|o| joined.contains(&o.member()))
            {
                if view.get(&other.member()) != other.rooms.get(room) {
                    panic!(
                        "{room}: {}'s state is {:?} as {} sees it, {:?} as it set it",
                        other.member(),
                        view.get(&other.member()),
                        d.member(),
                        other.rooms.get(room)
                    );
                }
            }
        }
    }
}
