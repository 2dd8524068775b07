//! A failover the rooms must survive: nodes with different heartbeat
//! settings (a fleet in the middle of a rolling change of config) share
//! rooms on every shard of a Redis Cluster whose `cluster-node-timeout`
//! makes the failover outlast the shortest lease, and one primary is
//! SIGKILLed, shortly after a node.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{memberships, Device};
use crate::common::cluster::{Cluster, Shard};
use crate::common::*;

/// `cluster-node-timeout` as a production cluster may set it: detection
/// and election take longer than the shortest lease below (1.5 s).
const NODE_TIMEOUT_MS: u64 = 1500;
/// Rooms on each shard.
const ROOMS_PER_SHARD: usize = 4;
/// The longest lease of the fleet (heartbeat 1,500 ms, TTL three of them).
const LONG_TTL: Duration = Duration::from_millis(4500);

/// `n` room ids whose keys live on `shard`.
fn rooms_on(cluster: &Cluster, shard: &Shard, prefix: &str, n: usize) -> Vec<String> {
    (0..)
        .map(|i| format!("{prefix}{i}"))
        .filter(|r| shard.serves(cluster.slot(&format!("r:{r}"))))
        .take(n)
        .collect()
}

/// What the devices were told, with when: the failure message.
struct Seen {
    start: Instant,
    lines: Vec<String>,
    /// `(observer, frame)` of every `room_join` and `room_leave`.
    events: Vec<(String, Value)>,
    /// The users the watcher saw go offline: their leases lapsed.
    offline: BTreeSet<String>,
}

impl Seen {
    fn note(&mut self, who: &str, what: &str) {
        let ms = self.start.elapsed().as_millis();
        self.lines.push(format!("+{ms} ms {who}: {what}"));
    }

    /// Reads every frame waiting for each device and applies it to its
    /// views.
    fn drain(&mut self, devices: &mut [Device]) {
        for d in devices {
            while let Some(client) = d.client.as_mut() {
                match client.try_next() {
                    Some(Incoming::Frame(v)) => {
                        self.note(&d.member(), &v.to_string());
                        if v["type"] == "room_join" || v["type"] == "room_leave" {
                            self.events.push((d.member(), v.clone()));
                        }
                        if v["type"] == "presence" && v["status"] == "offline" {
                            let user = v["user"].as_str().unwrap_or_default();
                            self.offline.insert(user.to_string());
                        }
                        d.apply(&v);
                    }
                    Some(other) => panic!("{}: {other:?}\n{}", d.member(), self.log()),
                    None => break,
                }
            }
        }
    }

    /// The `room_join` and `room_leave` frames about `member` since event
    /// `from`.
    fn about(&self, member: &str, from: usize) -> Vec<&(String, Value)> {
        self.events[from..]
            .iter()
            .filter(|(_, v)| {
                let who = (v["user"].as_str(), v["device"].as_str());
                member.split_once(':') == who.0.zip(who.1)
            })
            .collect()
    }

    fn log(&self) -> String {
        self.lines.join("\n")
    }
}

/// `observer: type room` of each event, for a failure message.
fn summary(events: &[&(String, Value)]) -> String {
    let lines: Vec<String> = events
        .iter()
        .map(|(who, v)| format!("{who}: {} {}", v["type"], v["room"]))
        .collect();
    format!("{} events: {}", lines.len(), lines.join(", "))
}

/// A device of `user` on `node`, in every one of `rooms`.
async fn join_all(node: &Node, user: &str, rooms: &[String]) -> Device {
    let mut client = Client::connect(node, user, "d").await;
    let mut joined = BTreeMap::new();
    for room in rooms {
        let state = json!({"u": user});
        client
            .send(json!({"type": "join", "room": room, "state": state}))
            .await;
        joined.insert(room.clone(), state);
    }
    Device {
        user: user.to_string(),
        device: "d".to_string(),
        client: Some(client),
        rooms: joined,
        views: BTreeMap::new(),
        retry: Vec::new(),
    }
}

/// The fleet of the scenario: the cluster, its rooms, the devices still
/// connected and what they were told.
struct Fleet {
    cluster: Cluster,
    /// The primary SIGKILLed, once it is.
    dead: Vec<u16>,
    rooms: Vec<String>,
    devices: Vec<Device>,
    seen: Seen,
}

impl Fleet {
    /// Reads what the devices were told until `done` holds, for at most
    /// `within`.
    async fn until(&mut self, what: &str, within: Duration, done: impl Fn(&Self) -> bool) {
        let deadline = Instant::now() + within;
        loop {
            self.seen.drain(&mut self.devices);
            if done(self) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{what}, not within {within:?}\n{}",
                self.seen.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Whether every device's view of every room holds exactly `members`.
    fn all_see(&self, members: &BTreeSet<String>) -> bool {
        self.devices.iter().all(|d| {
            self.rooms
                .iter()
                .all(|r| d.views.get(r).is_some_and(|v| v.keys().eq(members.iter())))
        })
    }

    /// The devices still connected.
    fn members(&self) -> BTreeSet<String> {
        self.devices.iter().map(Device::member).collect()
    }

    /// Redis's memberships of every room (members, deadlines and counts)
    /// are the devices still connected, and so is every device's view.
    fn check_rooms(&self) {
        let want = self.members();
        for room in &self.rooms {
            let slot = self.cluster.slot(&format!("r:{room}"));
            let shard = self
                .cluster
                .shards_without(&self.dead)
                .into_iter()
                .find(|s| s.serves(slot))
                .expect("a primary serves every slot");
            let (members, deadlines, counted): (BTreeSet<String>, BTreeSet<String>, Vec<u64>) =
                memberships(room)
                    .query(&mut self.cluster.conn(shard.primary))
                    .unwrap();
            let log = self.seen.log();
            assert_eq!(members, want, "{room}: Redis against the devices\n{log}");
            assert_eq!(deadlines, want, "{room}: the deadlines\n{log}");
            assert_eq!(counted, vec![1; want.len()], "{room}: the counts\n{log}");
        }
        assert!(
            self.all_see(&want),
            "a view is not {want:?}\n{}",
            self.seen.log()
        );
    }
}

/// On a cluster whose failover outlasts the shortest lease, with nodes of
/// different heartbeats in the same rooms on every shard: a device whose
/// lease holds keeps every membership across a primary's failover (no
/// leave and no join, for anyone); the memberships of a SIGKILLed node's
/// device leave once each; a clean close afterwards leaves every room at
/// once; Redis and every view agree at each step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rooms_survive_a_failover_with_mixed_heartbeats() {
    // The shards that stay up serve on while one fails over. (By default
    // every shard refuses writes from the primary's failure until its
    // replica's promotion: a lease shorter than that lapses whatever the
    // server does, and its memberships leave once; the rooms chaos run
    // covers that.)
    let cluster = Cluster::start_with(NODE_TIMEOUT_MS, &["--cluster-require-full-coverage", "no"]);
    let shards = cluster.shards();
    let victim = shards[0].primary;
    let rooms: Vec<String> = shards
        .iter()
        .enumerate()
        .flat_map(|(i, s)| rooms_on(&cluster, s, &format!("fo{i}:"), ROOMS_PER_SHARD))
        .collect();
    // The users live on the shards that stay up: their leases must hold.
    let user = |i: usize, prefix: &str| cluster.user_on(&shards[1 + i % 2], prefix);
    let (s, l, w, k) = (user(0, "s"), user(1, "l"), user(0, "w"), user(1, "k"));
    // A rolling change of config: a short lease on one node, the default
    // TTL of three heartbeats on the others.
    let a = cluster.node_with("a", &["--heartbeat-ms", "500", "--ttl-ms", "1500"]);
    let b = cluster.node_with("b", &["--heartbeat-ms", "1500"]);
    let c = cluster.node_with("c", &["--heartbeat-ms", "1500"]);
    let mut d = cluster.node_with("d", &["--heartbeat-ms", "1500"]);
    let mut devices = Vec::new();
    for (node, user) in [(&a, &s), (&b, &l), (&c, &w), (&d, &k)] {
        devices.push(join_all(node, user, &rooms).await);
    }
    // W watches the others: a lease that lapses shows as `offline`.
    let watch = json!({"type": "watch", "users": [&s, &l, &k]});
    devices[2].client.as_mut().unwrap().send(watch).await;
    let mut fleet = Fleet {
        cluster,
        dead: Vec::new(),
        rooms,
        devices,
        seen: Seen {
            start: Instant::now(),
            lines: Vec::new(),
            events: Vec::new(),
            offline: BTreeSet::new(),
        },
    };
    let everyone = fleet.members();
    fleet
        .until("every join shown", DEADLINE, |f| f.all_see(&everyone))
        .await;

    // K's node dies; half a second later, with K's lease far from lapsing,
    // the primary of the first shard.
    fleet.seen.note("test", "SIGKILL node d");
    d.kill();
    let k_member = fleet.devices.pop().unwrap().member();
    let from = fleet.seen.events.len();
    tokio::time::sleep(Duration::from_millis(500)).await;
    fleet
        .seen
        .note("test", &format!("SIGKILL primary {victim}"));
    fleet.cluster.kill(victim);
    fleet.dead.push(victim);
    fail_over(&mut fleet).await;

    for member in fleet.members() {
        let churn = fleet.seen.about(&member, from);
        let user = member.split(':').next().unwrap();
        assert!(
            churn.is_empty(),
            "{member} stayed connected, yet across the failover: {}; its lease {}\n{}",
            summary(&churn),
            if fleet.seen.offline.contains(user) {
                "lapsed"
            } else {
                "held"
            },
            fleet.seen.log()
        );
    }
    for user in [&s, &l] {
        assert!(
            !fleet.seen.offline.contains(user),
            "{user}'s lease lapsed across the failover, though its shard stayed up\n{}",
            fleet.seen.log()
        );
    }
    // K left each room once: a `room_leave` each, at most once per room as
    // each device saw it (a device whose node re-read a room after the
    // failover may learn it from that fresh `room` frame instead), and no
    // join; that K is gone everywhere is checked below.
    for d in &fleet.devices {
        let mut rooms = BTreeSet::new();
        for (_, v) in fleet
            .seen
            .about(&k_member, from)
            .into_iter()
            .filter(|(who, _)| *who == d.member())
        {
            let leave =
                (v["type"].as_str(), v["last"].as_bool()) == (Some("room_leave"), Some(true));
            assert!(
                leave && rooms.insert(v["room"].to_string()),
                "{}: K's events: {v} after {rooms:?}\n{}",
                d.member(),
                fleet.seen.log()
            );
        }
    }
    fleet.check_rooms();

    // A clean close now leaves every room at once: well before L's lease
    // could lapse and pass for a leave.
    let l_device = fleet.devices.remove(1);
    let l_member = l_device.member();
    fleet.seen.note("test", "L closes");
    let from = fleet.seen.events.len();
    l_device.client.unwrap().close().await;
    let stay = fleet.members();
    fleet
        .until("L's clean close leaving every room", LONG_TTL / 2, |f| {
            f.all_see(&stay)
        })
        .await;
    for (who, v) in fleet.seen.about(&l_member, from) {
        assert_eq!(
            (v["type"].as_str(), v["last"].as_bool()),
            (Some("room_leave"), Some(true)),
            "{who}: {v}"
        );
    }
    fleet.check_rooms();
}

/// Waits until the cluster is whole again, then one long lease more and a
/// second for the deadline pass: any membership whose deadline a refresh
/// missed would have lapsed by then. K's leaves must have come too.
async fn fail_over(fleet: &mut Fleet) {
    let killed = Instant::now();
    let mut healthy: Option<Instant> = None;
    let mut last_look = Instant::now();
    loop {
        fleet.seen.drain(&mut fleet.devices);
        if healthy.is_none() && last_look.elapsed() > Duration::from_millis(100) {
            last_look = Instant::now();
            if fleet.cluster.is_healthy(&fleet.dead) {
                fleet.seen.note("test", "cluster healthy");
                healthy = Some(Instant::now());
            }
        }
        let settled = healthy.is_some_and(|at| at.elapsed() > LONG_TTL + Duration::from_secs(1));
        if settled && fleet.all_see(&fleet.members()) {
            return;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(30),
            "no failover, or K never left\n{}",
            fleet.seen.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
