//! Chaos: three nodes and one Redis under random connects, clean closes,
//! dropped connections, reconnects elsewhere, status changes, SIGKILLed and
//! restarted nodes and Redis restarting empty; then, after a quiet period,
//! every invariant is checked.
//!
//! In cluster mode (`chaos_on_a_cluster`) the nodes share a Redis Cluster
//! of three primaries with a replica each, and instead of Redis restarting
//! empty, a primary is SIGKILLed and its replica promoted (once per shard).
//!
//! Ignored by default (they run for a while):
//! `CHAOS_SECS=180 cargo test --release --test it chaos:: -- --ignored --nocapture`

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use crate::common::cluster::Cluster;
use crate::common::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

const NODES: usize = 3;
const USERS: usize = 500;
const DEVICES_PER_USER: usize = 4;
const TARGET_DEVICES: usize = 2_000;
const WATCHERS: usize = 30;
const WATCHED_PER_WATCHER: usize = 100;

/// What one watcher believes about one user.
#[derive(Debug, Clone, PartialEq)]
struct View {
    status: String,
    text: Value,
}

impl View {
    fn of(record: &Value) -> Self {
        Self {
            status: record["status"].as_str().unwrap_or("?").to_string(),
            text: record["text"].clone(),
        }
    }

    fn online(&self) -> bool {
        self.status != "offline"
    }
}

struct Watcher {
    name: String,
    users: Vec<String>,
    client: Option<Client>,
    views: HashMap<String, View>,
    events: u64,
}

#[derive(Default, Debug)]
struct Tally {
    ops: BTreeMap<&'static str, u64>,
    faults: BTreeMap<&'static str, u64>,
    refused: u64,
    events: u64,
    duplicates: Vec<String>,
}

/// The Redis the nodes share.
enum Backend {
    One(Redis),
    Cluster(Cluster),
}

impl Backend {
    fn node(&self, id: &str) -> Node {
        let flags = [
            "--reconcile-interval-ms",
            "2000",
            "--max-frames-per-sec",
            "1000",
        ];
        match self {
            Self::One(redis) => Node::start_with(redis, id, &flags),
            Self::Cluster(cluster) => cluster.node_with(id, &flags),
        }
    }

    /// One Redis fault: one server restarts empty; on a cluster, a
    /// primary is SIGKILLed and its replica takes over (a shard that
    /// already failed over once has no replica left and is spared).
    /// Returns what it did, or None when nothing was left to do.
    fn fault(&mut self, failed_over: &mut Vec<u16>) -> Option<&'static str> {
        match self {
            Self::One(redis) => {
                redis.restart_empty();
                Some("redis restart (empty)")
            }
            Self::Cluster(cluster) => {
                let shard = cluster
                    .shards()
                    .into_iter()
                    .find(|s| !s.replicas.is_empty() && !failed_over.contains(&s.primary))?;
                cluster.kill(shard.primary);
                failed_over.push(shard.primary);
                failed_over.extend(&shard.replicas);
                Some("primary SIGKILL (replica promoted)")
            }
        }
    }

    /// Live leases of `user`'s devices and its counter, as Redis holds them.
    async fn leases_and_count(&self, user: &str) -> (usize, i64) {
        let mut pipe = redis::pipe();
        for d in 0..DEVICES_PER_USER {
            pipe.exists(format!("presence:{{{user}}}:d{d}"));
        }
        pipe.get(format!("presence-count:{{{user}}}"));
        let reply: Vec<redis::Value> = match self {
            Self::One(redis) => pipe.query_async(&mut redis.aconn().await).await.unwrap(),
            Self::Cluster(cluster) => {
                // One user's keys share a slot: ask the primary serving it.
                let port = cluster.shard_of(user).primary;
                pipe.query(&mut cluster.conn(port)).unwrap()
            }
        };
        let leases = reply[..DEVICES_PER_USER]
            .iter()
            .filter(|v| matches!(v, redis::Value::Int(1)))
            .count();
        let count = match &reply[DEVICES_PER_USER] {
            redis::Value::Nil => 0,
            v => redis::from_redis_value_ref::<i64>(v).unwrap(),
        };
        (leases, count)
    }
}

struct World {
    backend: Backend,
    nodes: Vec<Option<Node>>,
    /// (user, device) -> open client.
    devices: HashMap<(String, String), Client>,
    watchers: Vec<Watcher>,
    rng: StdRng,
    tally: Tally,
    restarts: usize,
}

impl World {
    fn live_nodes(&self) -> Vec<usize> {
        (0..NODES).filter(|i| self.nodes[*i].is_some()).collect()
    }

    fn random_node(&mut self) -> usize {
        let live = self.live_nodes();
        live[self.rng.random_range(0..live.len())]
    }

    fn random_device(&mut self) -> Option<(String, String)> {
        if self.devices.is_empty() {
            return None;
        }
        let i = self.rng.random_range(0..self.devices.len());
        self.devices.keys().nth(i).cloned()
    }

    async fn connect(&mut self, user: String, device: String) {
        let n = self.random_node();
        let node = self.nodes[n].as_ref().unwrap();
        match Client::try_connect(node, &user, &device).await {
            Some(c) => {
                // A second connection of the same device replaces the first.
                self.devices.insert((user, device), c);
            }
            None => self.tally.refused += 1,
        }
    }

    /// Reads every watcher's pending frames; reconnects the ones whose node
    /// went away.
    async fn drain_watchers(&mut self) {
        for wi in 0..self.watchers.len() {
            loop {
                let item = match self.watchers[wi].client.as_mut() {
                    Some(c) => c.try_next(),
                    None => Some(Incoming::Closed(None)),
                };
                match item {
                    None => break,
                    Some(Incoming::Frame(v)) => self.watcher_frame(wi, &v),
                    Some(Incoming::Closed(_)) => {
                        self.watchers[wi].client = None;
                        self.reconnect_watcher(wi).await;
                        break;
                    }
                }
            }
        }
    }

    fn watcher_frame(&mut self, wi: usize, v: &Value) {
        let w = &mut self.watchers[wi];
        match v["type"].as_str() {
            Some("snapshot") => {
                for r in v["presence"].as_array().unwrap() {
                    w.views
                        .insert(r["user"].as_str().unwrap().to_string(), View::of(r));
                }
            }
            Some("presence") => {
                w.events += 1;
                self.tally.events += 1;
                let user = v["user"].as_str().unwrap().to_string();
                let new = View::of(v);
                if let Some(old) = w.views.get(&user) {
                    // Strict alternation, statuses aside: never the same
                    // record twice in a row.
                    if *old == new {
                        self.tally
                            .duplicates
                            .push(format!("{} saw {user} {new:?} twice", w.name));
                    }
                }
                w.views.insert(user, new);
            }
            _ => {}
        }
    }

    async fn reconnect_watcher(&mut self, wi: usize) {
        for _ in 0..20 {
            let n = self.random_node();
            let name = self.watchers[wi].name.clone();
            let node = self.nodes[n].as_ref().unwrap();
            if let Some(mut c) = Client::try_connect(node, &name, "w").await {
                let users: Vec<&str> = self.watchers[wi].users.iter().map(String::as_str).collect();
                c.send(json!({"type":"watch","users":users})).await;
                self.watchers[wi].client = Some(c);
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!("watcher {wi} cannot reconnect");
    }

    /// One random client operation; the population hovers around
    /// [`TARGET_DEVICES`].
    async fn step(&mut self) {
        let grow = self.devices.len() < TARGET_DEVICES;
        let roll = self.rng.random_range(0..100);
        let (connect, close, drop, reconnect) = if grow {
            (50, 62, 72, 82)
        } else {
            (20, 45, 65, 80)
        };
        if roll < connect {
            let user = format!("u{}", self.rng.random_range(0..USERS));
            let device = format!("d{}", self.rng.random_range(0..DEVICES_PER_USER));
            self.connect(user, device).await;
            *self.tally.ops.entry("connect").or_default() += 1;
        } else if roll < close {
            if let Some(key) = self.random_device() {
                self.devices.remove(&key).unwrap().close().await;
                *self.tally.ops.entry("close").or_default() += 1;
            }
        } else if roll < drop {
            if let Some(key) = self.random_device() {
                self.devices.remove(&key).unwrap().drop_tcp();
                *self.tally.ops.entry("drop (no close frame)").or_default() += 1;
            }
        } else if roll < reconnect {
            // The same device again, on a random node, before the old
            // connection is gone.
            if let Some((user, device)) = self.random_device() {
                self.connect(user, device).await;
                *self.tally.ops.entry("reconnect").or_default() += 1;
            }
        } else if let Some(key) = self.random_device() {
            let status = ["online", "away", "busy"][self.rng.random_range(0..3)];
            let text = if self.rng.random_bool(0.5) {
                Value::Null
            } else {
                json!("brb")
            };
            let c = self.devices.get_mut(&key).unwrap();
            let frame = json!({"type":"status","status":status,"text":text}).to_string();
            let _ = c
                .sink_send(tokio_tungstenite::tungstenite::Message::Text(frame.into()))
                .await;
            *self.tally.ops.entry("status").or_default() += 1;
        }
    }

    /// SIGKILLs a node (one always stays); its devices are gone.
    fn kill_node(&mut self) {
        let live = self.live_nodes();
        if live.len() < 2 {
            return;
        }
        let n = live[self.rng.random_range(0..live.len())];
        let mut node = self.nodes[n].take().unwrap();
        let port = node.addr.port();
        node.kill();
        self.devices.retain(|_, c| c.port() != port);
        for w in &mut self.watchers {
            if w.client.as_ref().is_some_and(|c| c.port() == port) {
                w.client = None;
            }
        }
        *self.tally.faults.entry("node SIGKILL").or_default() += 1;
    }

    fn restart_dead_nodes(&mut self) {
        for n in 0..NODES {
            if self.nodes[n].is_none() {
                self.restarts += 1;
                let id = format!("n{n}-{}", self.restarts);
                self.nodes[n] = Some(self.backend.node(&id));
                *self.tally.faults.entry("node restart").or_default() += 1;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "runs for a while; see the module docs"]
async fn chaos() {
    run(Backend::One(Redis::start())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "runs for a while; see the module docs"]
async fn chaos_on_a_cluster() {
    run(Backend::Cluster(Cluster::start())).await;
}

async fn run(backend: Backend) {
    raise_fd_limit();
    let secs: u64 = env_u64("CHAOS_SECS", 60);
    let seed: u64 = env_u64("CHAOS_SEED", 1);
    let nodes = (0..NODES)
        .map(|n| Some(backend.node(&format!("n{n}"))))
        .collect();
    let mut rng = StdRng::seed_from_u64(seed);
    let watchers = (0..WATCHERS)
        .map(|i| {
            let mut users: Vec<String> = (0..WATCHED_PER_WATCHER)
                .map(|_| format!("u{}", rng.random_range(0..USERS)))
                .collect();
            users.sort();
            users.dedup();
            Watcher {
                name: format!("watcher{i}"),
                users,
                client: None,
                views: HashMap::new(),
                events: 0,
            }
        })
        .collect();
    let mut world = World {
        backend,
        nodes,
        devices: HashMap::new(),
        watchers,
        rng,
        tally: Tally::default(),
        restarts: 0,
    };
    for wi in 0..WATCHERS {
        world.reconnect_watcher(wi).await;
    }

    let start = Instant::now();
    let end = start + Duration::from_secs(secs);
    let mut next_kill = start + Duration::from_secs(5);
    let mut next_revive = None;
    let mut next_redis = start + Duration::from_secs(12);
    let mut failed_over = Vec::new();
    while Instant::now() < end {
        world.step().await;
        world.drain_watchers().await;
        let now = Instant::now();
        if now >= next_kill {
            world.kill_node();
            next_kill = now + Duration::from_millis(world.rng.random_range(4_000..10_000));
            next_revive = Some(now + Duration::from_millis(world.rng.random_range(500..3_000)));
        }
        if next_revive.is_some_and(|t| now >= t) {
            world.restart_dead_nodes();
            next_revive = None;
        }
        // No Redis fault in the last seconds: a failover must be over
        // before the quiet period starts.
        if now >= next_redis && now + Duration::from_secs(8) < end {
            if let Some(fault) = world.backend.fault(&mut failed_over) {
                *world.tally.faults.entry(fault).or_default() += 1;
            }
            next_redis = now + Duration::from_millis(world.rng.random_range(10_000..25_000));
        }
    }

    // Quiet: lapsed leases expire, Redis-restart resyncs and reconciliation
    // finish. Every node must be up so that watchers can reconnect.
    world.restart_dead_nodes();
    let quiet = TTL
        + Duration::from_secs(1)
        + Duration::from_millis(HEARTBEAT_MS + 500)
        + Duration::from_secs(3);
    let until = Instant::now() + quiet;
    while Instant::now() < until {
        world.drain_watchers().await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    world.drain_watchers().await;

    // The truth: who holds an open connection now.
    let mut open: HashMap<String, usize> = HashMap::new();
    for (user, _) in world.devices.keys() {
        *open.entry(user.clone()).or_default() += 1;
    }
    let mut violations: Vec<String> = world.tally.duplicates.clone();
    for u in 0..USERS {
        let user = format!("u{u}");
        let (leases, counter) = world.backend.leases_and_count(&user).await;
        let truth = open.get(&user).copied().unwrap_or(0);
        if counter != leases as i64 {
            violations.push(format!("{user}: counter {counter} != {leases} live leases"));
        }
        if leases != truth {
            violations.push(format!("{user}: {leases} leases but {truth} open devices"));
        }
    }
    for w in &world.watchers {
        for user in &w.users {
            let truth = open.get(user).copied().unwrap_or(0) > 0;
            match w.views.get(user) {
                Some(v) if v.online() == truth => {}
                other => violations.push(format!(
                    "{} believes {user} is {other:?}, truth online={truth}",
                    w.name
                )),
            }
        }
    }

    println!("chaos: {secs} s, seed {seed}");
    println!("operations: {:?}", world.tally.ops);
    println!("faults: {:?}", world.tally.faults);
    println!(
        "connections refused during faults: {}; events seen by watchers: {}; open devices at the end: {}",
        world.tally.refused,
        world.tally.events,
        world.devices.len()
    );
    println!("violations: {}", violations.len());
    if !violations.is_empty() && std::env::var_os("CHAOS_LOGS").is_some() {
        for n in world.nodes.iter().flatten() {
            let logs = n.logs();
            let tail: Vec<&str> = logs.lines().rev().take(80).collect();
            println!("--- node {} ---", n.id);
            for l in tail.iter().rev() {
                println!("{l}");
            }
        }
    }
    for v in violations.iter().take(30) {
        println!("  {v}");
    }
    assert!(violations.is_empty(), "{} violations", violations.len());
}
