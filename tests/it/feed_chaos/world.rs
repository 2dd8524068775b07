//! The fleet of the feed chaos run and its churn: devices of users and
//! ghosts, watchers, nodes SIGKILLed and started again, and what every
//! client was told, with when.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use super::check::{self, Recorded};
use super::*;
use crate::feed::drain;

/// One device of a user or a ghost.
pub(super) struct Device {
    user: String,
    device: String,
    client: Option<Client>,
    /// The rooms it means to be in (joined again on each connection).
    rooms: BTreeSet<String>,
    /// Rooms whose join Redis could not take, to send again.
    retry: Vec<String>,
    /// Its connections so far.
    session: usize,
}

/// A client watching every user and ghost.
pub(super) struct Watcher {
    user: String,
    client: Option<Client>,
    /// Its connections so far.
    session: usize,
    /// Whether it should be connected.
    on: bool,
}

/// A `presence` frame a watcher got.
pub(super) struct PresenceSeen {
    /// The watcher's connection, `<watcher>#<session>`.
    pub watcher: String,
    pub user: String,
    pub frame: Value,
    /// When the test read it, epoch ms.
    pub at: i64,
}

/// A `room_join` of a user's first device or a `room_leave` of its last
/// that a member device got, as the feed names it.
pub(super) struct RoomSeen {
    /// The member's connection, `<user>:<device>#<session>`.
    pub member: String,
    pub room: String,
    pub user: String,
    /// `room_joined` or `room_left`.
    pub kind: &'static str,
    /// When the test read it, epoch ms.
    pub at: i64,
}

pub(super) struct World {
    pub backend: Backend,
    nodes: Vec<Option<Node>>,
    /// The node SIGKILLed and when, until it is started again.
    killed: Option<(usize, Instant)>,
    pub receiver: Receiver,
    rooms: Vec<String>,
    devices: Vec<Device>,
    watchers: Vec<Watcher>,
    /// The watched users: the users, then the ghosts.
    pub watched: Vec<String>,
    pub ghosts: BTreeSet<String>,
    rng: StdRng,
    /// Status texts handed out: each status change has its own.
    texts: u64,
    pub ops: BTreeMap<&'static str, u64>,
    pub kills: u64,
    pub presence_seen: Vec<PresenceSeen>,
    pub room_seen: Vec<RoomSeen>,
}

/// Now, epoch ms.
fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Sends `frame` if the client is connected; a connection that closed
/// meanwhile is found by the next drain.
async fn send(client: &mut Option<Client>, frame: Value) {
    if let Some(c) = client.as_mut() {
        let text = tokio_tungstenite::tungstenite::Message::text(frame.to_string());
        let _ = c.sink_send(text).await;
    }
}

impl World {
    /// The fleet: nodes, the ghosts invisible before anyone watches them,
    /// and the watchers connected; no device yet.
    pub async fn start(backend: Backend, receiver: Receiver, seed: u64) -> Self {
        let nodes = (0..NODES)
            .map(|n| Some(backend.node(&format!("n{n}"), &receiver.url)))
            .collect();
        let users: Vec<String> = (0..USERS).map(|u| format!("u{u}")).collect();
        let ghosts: Vec<String> = (0..GHOSTS).map(|g| format!("g{g}")).collect();
        let watched: Vec<String> = users.iter().chain(&ghosts).cloned().collect();
        let devices = watched
            .iter()
            .flat_map(|user| {
                (0..DEVICES_PER_USER).map(move |d| Device {
                    user: user.clone(),
                    device: format!("d{d}"),
                    client: None,
                    rooms: BTreeSet::new(),
                    retry: Vec::new(),
                    session: 0,
                })
            })
            .collect();
        let watchers = (0..WATCHERS)
            .map(|w| Watcher {
                user: format!("w{w}"),
                client: None,
                session: 0,
                on: true,
            })
            .collect();
        let mut world = Self {
            rooms: backend.rooms(),
            backend,
            nodes,
            killed: None,
            receiver,
            devices,
            watchers,
            watched,
            ghosts: ghosts.into_iter().collect(),
            rng: StdRng::seed_from_u64(seed),
            texts: 0,
            ops: BTreeMap::new(),
            kills: 0,
            presence_seen: Vec::new(),
            room_seen: Vec::new(),
        };
        world.ghosts_invisible().await;
        world.open_watchers().await;
        world
    }

    pub fn count(&mut self, op: &'static str) {
        *self.ops.entry(op).or_default() += 1;
    }

    fn live_node(&mut self) -> usize {
        let live: Vec<usize> = (0..NODES).filter(|&n| self.nodes[n].is_some()).collect();
        live[self.rng.random_range(0..live.len())]
    }

    /// A live node, for reads.
    fn any_node(&self) -> &Node {
        self.nodes.iter().flatten().next().unwrap()
    }

    /// Every ghost chooses `invisible` (the admin key acting for it): a
    /// change while it is offline is no event, and once it holds, a
    /// ghost's devices come and go unseen.
    pub async fn ghosts_invisible(&self) {
        let http = reqwest::Client::new();
        for ghost in &self.ghosts {
            let url = format!("{}/api/users/{ghost}/status", self.any_node().http());
            let r = http
                .put(url)
                .bearer_auth(ADMIN)
                .json(&json!({"status": "invisible"}))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200, "{ghost}: {}", r.text().await.unwrap());
        }
    }

    /// Connects device `i` to a live node and joins its rooms again.
    async fn connect(&mut self, i: usize) {
        let n = self.live_node();
        let node = self.nodes[n].as_ref().unwrap();
        let d = &mut self.devices[i];
        let Some(client) = Client::try_connect(node, &d.user, &d.device).await else {
            return;
        };
        d.client = Some(client);
        d.session += 1;
        d.retry.clear();
        for room in d.rooms.clone() {
            send(
                &mut d.client,
                json!({"type": "join", "room": room, "state": {}}),
            )
            .await;
        }
    }

    /// Connects watcher `w` to a live node and watches everyone.
    async fn connect_watcher(&mut self, w: usize) {
        let n = self.live_node();
        let node = self.nodes[n].as_ref().unwrap();
        let watcher = &mut self.watchers[w];
        let Some(client) = Client::try_connect(node, &watcher.user, "w").await else {
            return;
        };
        watcher.client = Some(client);
        watcher.session += 1;
        let watch = json!({"type": "watch", "users": self.watched});
        send(&mut watcher.client, watch).await;
    }

    pub async fn open_watchers(&mut self) {
        for w in 0..self.watchers.len() {
            self.watchers[w].on = true;
            self.connect_watcher(w).await;
        }
    }

    pub async fn close_watchers(&mut self) {
        for w in &mut self.watchers {
            w.on = false;
            if let Some(c) = w.client.take() {
                c.close().await;
            }
        }
    }

    /// Reads what every client has been sent; a connection that closed
    /// (its node died) comes back on another node.
    pub async fn drain(&mut self) {
        for i in 0..self.devices.len() {
            self.drain_device(i).await;
        }
        for w in 0..self.watchers.len() {
            self.drain_watcher(w).await;
        }
    }

    async fn drain_device(&mut self, i: usize) {
        let (frames, closed) = self.devices[i]
            .client
            .as_mut()
            .map_or_else(Default::default, Client::waiting);
        for v in &frames {
            self.device_frame(i, v);
        }
        if closed {
            self.devices[i].client = None;
            self.connect(i).await;
        }
        let d = &mut self.devices[i];
        for room in std::mem::take(&mut d.retry) {
            if d.rooms.contains(&room) {
                send(
                    &mut d.client,
                    json!({"type": "join", "room": room, "state": {}}),
                )
                .await;
            }
        }
    }

    /// Notes a room event of another user; a join Redis could not take is
    /// sent again.
    fn device_frame(&mut self, i: usize, v: &Value) {
        let d = &mut self.devices[i];
        let kind = match (v["type"].as_str(), &v["first"], &v["last"]) {
            (Some("room_join"), Value::Bool(true), _) => "room_joined",
            (Some("room_leave"), _, Value::Bool(true)) => "room_left",
            (Some("error"), _, _) => {
                match (v["code"].as_str(), v["room"].as_str()) {
                    (Some("unavailable"), Some(room)) if d.rooms.contains(room) => {
                        d.retry.push(room.to_string());
                    }
                    // A status change Redis could not take; a leave of a
                    // room whose join it could not take.
                    (Some("unavailable"), _) | (Some("not_in_room"), _) => {}
                    _ => panic!("{}:{}: refused {v}", d.user, d.device),
                }
                return;
            }
            _ => return,
        };
        if v["user"] != d.user.as_str() {
            self.room_seen.push(RoomSeen {
                member: format!("{}:{}#{}", d.user, d.device, d.session),
                room: v["room"].as_str().unwrap().to_string(),
                user: v["user"].as_str().unwrap().to_string(),
                kind,
                at: now_ms(),
            });
        }
    }

    async fn drain_watcher(&mut self, w: usize) {
        if !self.watchers[w].on {
            return;
        }
        loop {
            let watcher = &mut self.watchers[w];
            let item = match watcher.client.as_mut() {
                Some(c) => c.try_next(),
                None => Some(Incoming::Closed(None)),
            };
            match item {
                None => return,
                Some(Incoming::Frame(v)) if v["type"] == "presence" => {
                    self.presence_seen.push(PresenceSeen {
                        watcher: format!("{}#{}", watcher.user, watcher.session),
                        user: v["user"].as_str().unwrap().to_string(),
                        frame: v,
                        at: now_ms(),
                    });
                }
                Some(Incoming::Frame(v)) if v["type"] == "snapshot" => {}
                Some(Incoming::Frame(v)) if v["code"] == "unavailable" => {
                    let watch = json!({"type": "watch", "users": self.watched});
                    send(&mut watcher.client, watch).await;
                }
                Some(Incoming::Frame(v)) => panic!("{}: {v}", watcher.user),
                Some(Incoming::Closed(_)) => {
                    watcher.client = None;
                    self.connect_watcher(w).await;
                    return;
                }
            }
        }
    }

    /// One random operation of a random device.
    async fn step(&mut self) {
        let i = self.rng.random_range(0..self.devices.len());
        if self.devices[i].client.is_none() {
            self.connect(i).await;
            self.count("connect");
            return;
        }
        let room = self.rooms[self.rng.random_range(0..self.rooms.len())].clone();
        let status = ["online", "away", "busy", "invisible"][self.rng.random_range(0..4)];
        let ghost = self.ghosts.contains(&self.devices[i].user);
        let d = &mut self.devices[i];
        let op = match self.rng.random_range(0..100) {
            0..25 if !d.rooms.contains(&room) => {
                d.rooms.insert(room.clone());
                send(
                    &mut d.client,
                    json!({"type": "join", "room": room, "state": {}}),
                )
                .await;
                "join"
            }
            0..40 if d.rooms.contains(&room) => {
                d.rooms.remove(&room);
                send(&mut d.client, json!({"type": "leave", "room": room})).await;
                "leave"
            }
            40..60 if !ghost => {
                // A text of its own: each status event is told apart.
                self.texts += 1;
                let frame =
                    json!({"type": "status", "status": status, "text": format!("t{}", self.texts)});
                send(&mut d.client, frame).await;
                "status"
            }
            60..68 => {
                d.rooms.clear();
                if let Some(c) = d.client.take() {
                    c.close().await;
                }
                "close"
            }
            68..76 => {
                // Dropped, and back at once elsewhere, in the same rooms.
                if let Some(c) = d.client.take() {
                    c.drop_tcp();
                }
                self.connect(i).await;
                "drop and return"
            }
            76..80 => {
                d.rooms.clear();
                if let Some(c) = d.client.take() {
                    c.drop_tcp();
                }
                "drop"
            }
            _ => "nothing",
        };
        self.count(op);
    }

    /// Random operations for `long`, a node SIGKILLed every
    /// [`KILL_EVERY`] (and started again a second later), the receiver
    /// down during `down` (from, for how long) from the start.
    pub async fn churn(&mut self, long: Duration, down: Option<(Duration, Duration)>) {
        let start = Instant::now();
        let mut next_kill = start + KILL_EVERY / 2;
        while start.elapsed() < long {
            self.step().await;
            self.drain().await;
            if let Some((from, length)) = down {
                let now = start.elapsed();
                let is_down = now >= from && now < from + length;
                if self.receiver.down.swap(is_down, Ordering::SeqCst) != is_down && is_down {
                    self.count("receiver down");
                }
            }
            if self.killed.is_none() && Instant::now() >= next_kill {
                next_kill += KILL_EVERY;
                let n = self.live_node();
                self.nodes[n].take().unwrap().kill();
                self.killed = Some((n, Instant::now()));
                self.kills += 1;
            }
            if self
                .killed
                .is_some_and(|(_, at)| at.elapsed() > Duration::from_secs(1))
            {
                self.revive();
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.receiver.down.store(false, Ordering::SeqCst);
    }

    /// Starts the SIGKILLed node again, if one is.
    fn revive(&mut self) {
        if let Some((n, _)) = self.killed.take() {
            let id = format!("n{n}r{}", self.kills);
            self.nodes[n] = Some(self.backend.node(&id, &self.receiver.url));
        }
    }

    /// Waits until the fleet is quiet (every node up, every device and
    /// membership as the test holds them, every feed moved into the log)
    /// and the receiver has every event of the feed; then adds the feed to
    /// `recorded`.
    pub async fn quiesce(&mut self, recorded: &mut Recorded, when: &str) {
        self.revive();
        let start = Instant::now();
        let deadline = start + QUIET_WITHIN;
        loop {
            self.drain().await;
            let why = match self.unquiet().await {
                Some(why) => why,
                None => {
                    let (events, _) = drain(self.any_node(), "", 1000).await;
                    let got = check::ids(&self.receiver.events());
                    let missing: Vec<&str> = events
                        .iter()
                        .map(|e| e["id"].as_str().unwrap())
                        .filter(|id| !got.contains(*id))
                        .collect();
                    if missing.is_empty() {
                        check::assert_in_order(&events, &format!("the feed {when}"));
                        recorded.add(&events);
                        eprintln!("{when}: quiet after {:.1?}", start.elapsed());
                        return;
                    }
                    let some = &missing[..missing.len().min(10)];
                    format!("{} events never delivered, e.g. {some:?}", missing.len())
                }
            };
            assert!(
                Instant::now() < deadline,
                "{when}: not quiet within {QUIET_WITHIN:?}: {why}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Why the fleet is not quiet yet; `None` when it is.
    async fn unquiet(&self) -> Option<String> {
        let mut want: BTreeMap<&str, u64> = BTreeMap::new();
        for d in &self.devices {
            *want.entry(&d.user).or_default() += d.client.is_some() as u64;
        }
        for w in &self.watchers {
            *want.entry(&w.user).or_default() += w.client.is_some() as u64;
        }
        let node = self.any_node();
        let users: Vec<&str> = want.keys().copied().collect();
        let url = format!("{}/api/presence/query", node.http());
        let (status, body) = post_as(&url, &json!({"users": users}), Some(ADMIN)).await;
        if status != 200 {
            return Some(format!("presence query: {status} {body}"));
        }
        for p in body["presence"].as_array().unwrap() {
            let user = p["user"].as_str().unwrap();
            if p["devices"].as_u64() != Some(want[user]) {
                return Some(format!(
                    "{user}: {} devices, {} held",
                    p["devices"], want[user]
                ));
            }
        }
        for room in &self.rooms {
            let url = format!("{}/api/rooms/{room}?limit=100", node.http());
            let (status, body) = get_as(&url, Some(ADMIN)).await;
            if status != 200 {
                return Some(format!("{room}: {status} {body}"));
            }
            let members: BTreeSet<String> = body["members"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|m| {
                    let devices = m["devices"].as_array().unwrap().iter();
                    devices.map(|d| {
                        format!(
                            "{}:{}",
                            m["user"].as_str().unwrap(),
                            d["device"].as_str().unwrap()
                        )
                    })
                })
                .collect();
            let held: BTreeSet<String> = self
                .devices
                .iter()
                .filter(|d| d.client.is_some() && d.rooms.contains(room))
                .map(|d| format!("{}:{}", d.user, d.device))
                .collect();
            if members != held {
                return Some(format!("{room}: members {members:?}, held {held:?}"));
            }
        }
        match self.backend.feeds_held() {
            Some(0) => None,
            Some(n) => Some(format!("{n} events not moved into the log")),
            None => Some("a Redis server did not answer".into()),
        }
    }
}
