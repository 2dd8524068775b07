//! Chaos in rooms: three nodes and one Redis under random joins, leaves,
//! state changes and signals, clean closes, dropped connections that come
//! back elsewhere (joining their rooms again, as a client would),
//! SIGKILLed and restarted nodes and Redis restarting empty. After a quiet
//! period every room's membership in Redis must equal the devices actually
//! in it, and every member's view (kept from its `room` frames and events,
//! as a client keeps it) must match it.
//!
//! On a Redis Cluster (`rooms_stay_right_through_chaos_on_a_cluster`) the
//! nodes share three primaries with a replica each, and instead of Redis
//! restarting empty a primary is SIGKILLed and its replica promoted.
//!
//! [`failover`] is a primary's failover on its own, with nodes of
//! different heartbeat settings, checked at each step.
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
const ROOMS: usize = 4;
const FLAGS: [&str; 4] = [
    "--max-frames-per-sec",
    "1000",
    "--max-room-messages-per-sec",
    "1000",
];

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
    fn node(&self, id: &str) -> Node {
        match self {
            Self::One(redis) => Node::start_with(redis, id, &FLAGS),
            Self::Cluster(cluster) => cluster.node_with(id, &FLAGS),
        }
    }

    /// One Redis fault: the server restarts empty, or a primary of the
    /// cluster is SIGKILLed and its replica takes over.
    fn fault(&mut self) -> &'static str {
        match self {
            Self::One(redis) => {
                redis.restart_empty();
                "redis restart (empty)"
            }
            Self::Cluster(cluster) => {
                let victim = cluster.shards()[0].primary;
                cluster.kill(victim);
                tokio::task::block_in_place(|| cluster.wait_healthy(&[victim]));
                "primary SIGKILL (replica promoted)"
            }
        }
    }

    /// The members of `room` as Redis holds them.
    async fn members(&self, room: &str) -> BTreeSet<String> {
        let key = format!("presence-room:{{r:{room}}}");
        match self {
            Self::One(redis) => {
                let mut c = redis.aconn().await;
                redis::cmd("HKEYS")
                    .arg(&key)
                    .query_async(&mut c)
                    .await
                    .unwrap()
            }
            Self::Cluster(cluster) => {
                let slot = cluster.slot(&key);
                let shard = cluster
                    .shards()
                    .into_iter()
                    .find(|s| s.serves(slot))
                    .unwrap();
                let mut c = cluster.conn(shard.primary);
                redis::cmd("HKEYS").arg(&key).query(&mut c).unwrap()
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
            let mut closed = false;
            while let Some(client) = self.devices[i].client.as_mut() {
                match client.try_next() {
                    Some(Incoming::Frame(v)) => self.devices[i].apply(&v),
                    Some(Incoming::Closed(_)) => {
                        closed = true;
                        break;
                    }
                    None => break,
                }
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
        let room = format!("room{}", self.rng.random_range(0..ROOMS));
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
    run(Backend::Cluster(Cluster::start())).await;
}

async fn run(backend: Backend) {
    raise_fd_limit();
    let secs: u64 = env_u64("ROOM_CHAOS_SECS", 8);
    let seed: u64 = env_u64("CHAOS_SEED", 7);
    let nodes = (0..NODES)
        .map(|n| Some(backend.node(&format!("n{n}"))))
        .collect();
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
        nodes,
        devices,
        rng: StdRng::seed_from_u64(seed),
        ops: BTreeMap::new(),
    };
    let start = Instant::now();
    let end = start + Duration::from_secs(secs);
    let (mut killed, mut redis_restarted) = (None, false);
    while Instant::now() < end {
        world.step().await;
        world.drain().await;
        let elapsed = start.elapsed();
        if killed.is_none() && elapsed > Duration::from_secs(secs) / 4 {
            let n = world.live_node();
            if let Some(mut node) = world.nodes[n].take() {
                node.kill();
            }
            killed = Some((n, Instant::now()));
            *world.ops.entry("node SIGKILL").or_default() += 1;
        }
        if let Some((n, at)) = killed {
            if world.nodes[n].is_none() && at.elapsed() > Duration::from_secs(1) {
                world.nodes[n] = Some(world.backend.node(&format!("n{n}b")));
            }
        }
        if !redis_restarted && elapsed > Duration::from_secs(secs) / 2 {
            let fault = world.backend.fault();
            redis_restarted = true;
            *world.ops.entry(fault).or_default() += 1;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Quiet: dropped devices' memberships lapse, lost ones are joined again.
    let until = Instant::now() + TTL + Duration::from_secs(3);
    while Instant::now() < until {
        world.drain().await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    world.drain().await;
    eprintln!("rooms chaos, {secs} s: {:?}", world.ops);

    for r in 0..ROOMS {
        let room = format!("room{r}");
        let joined: BTreeSet<String> = world
            .devices
            .iter()
            .filter(|d| d.client.is_some() && d.rooms.contains_key(&room))
            .map(Device::member)
            .collect();
        assert_eq!(
            world.backend.members(&room).await,
            joined,
            "{room}: Redis against the devices in it"
        );
        for d in world
            .devices
            .iter()
            .filter(|d| joined.contains(&d.member()))
        {
            let view = d.views.get(&room).cloned().unwrap_or_default();
            let seen: BTreeSet<String> = view.keys().cloned().collect();
            assert_eq!(seen, joined, "{room}: the view of {}", d.member());
            for other in world
                .devices
                .iter()
                .filter(|o| joined.contains(&o.member()))
            {
                if view.get(&other.member()) != other.rooms.get(&room) {
                    panic!(
                        "{room}: {}'s state is {:?} as {} sees it, {:?} as it set it",
                        other.member(),
                        view.get(&other.member()),
                        d.member(),
                        other.rooms.get(&room)
                    );
                }
            }
        }
    }
}
