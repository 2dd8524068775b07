//! Live cursors: room state at any rate, coalesced (issue 42). A device
//! may send `room_state` as often as it likes and is never refused for
//! it; the node writes and forwards at most `--room-state-hz` states per
//! device per second (the latest wins), and members that joined with
//! `"batch":true` get one `room_updates` frame per tick. Real Redis, two
//! nodes, real WebSocket clients.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::common::*;
use crate::rooms::{join, next_of};
use serde_json::{json, Value};

/// The tick of the nodes below: `--room-state-hz 10`.
const HZ: u64 = 10;
const TICK: Duration = Duration::from_millis(1000 / HZ);

/// Two nodes on one Redis, ticking at [`HZ`], whose general frame limit
/// lets a burst of 200 frames through (the default is 30 a second).
fn two_nodes(redis: &Redis) -> (Node, Node) {
    let hz = HZ.to_string();
    let flags = ["--room-state-hz", &hz, "--max-frames-per-sec", "1000"];
    (
        Node::start_with(redis, "n1", &flags),
        Node::start_with(redis, "n2", &flags),
    )
}

/// In room `doc`: alice/pen on the first node (sending states), bob/tab on
/// the second (batched) and carol/tab on the first (not batched).
async fn three_members((n1, n2): &(Node, Node)) -> [Client; 3] {
    let mut alice = Client::connect(n1, "alice", "pen").await;
    join(&mut alice, "doc", json!({"i": -1})).await;
    let mut bob = Client::connect(n2, "bob", "tab").await;
    join_batched(&mut bob, "doc", json!({})).await;
    let mut carol = Client::connect(n1, "carol", "tab").await;
    join(&mut carol, "doc", json!({})).await;
    [alice, bob, carol]
}

/// Joins `room` with batches asked for; the `room` frame.
async fn join_batched(c: &mut Client, room: &str, state: Value) -> Value {
    c.send(json!({"type": "join", "room": room, "state": state, "batch": true}))
        .await;
    c.expect("room").await
}

/// The states of `frame` (a `room_update` or a `room_updates`), as
/// `(user:device, state)`.
fn states(frame: &Value) -> Vec<(String, Value)> {
    let one = |u: &Value| {
        (
            format!(
                "{}:{}",
                u["user"].as_str().unwrap(),
                u["device"].as_str().unwrap()
            ),
            u["state"].clone(),
        )
    };
    match frame["type"].as_str() {
        Some("room_update") => vec![one(frame)],
        Some("room_updates") => frame["updates"]
            .as_array()
            .unwrap()
            .iter()
            .map(one)
            .collect(),
        _ => Vec::new(),
    }
}

/// What one member saw of the others' states until each of `last` was
/// seen (`user:device` -> its last `i`): the frames of states, in order.
/// Fails on an error frame, on a state older than one seen before, or
/// when [`DEADLINE`] passes first.
async fn watch_states(c: &mut Client, last: &HashMap<String, i64>) -> Vec<(Instant, Value)> {
    let deadline = Instant::now() + DEADLINE;
    let mut seen: HashMap<String, i64> = HashMap::new();
    let mut frames = Vec::new();
    while last.iter().any(|(m, i)| seen.get(m) != Some(i)) {
        let left = deadline.saturating_duration_since(Instant::now());
        let Some(Incoming::Frame(v)) = c.next_within(left).await else {
            panic!("{}/{}: saw {seen:?}, waited for {last:?}", c.user, c.device);
        };
        assert_ne!(v["type"], "error", "{v}");
        for (member, state) in states(&v) {
            let i = state["i"].as_i64().unwrap();
            let before = seen.insert(member.clone(), i);
            assert!(
                before.is_none_or(|b| b < i),
                "{member}: {i} after {before:?}"
            );
        }
        if !states(&v).is_empty() {
            frames.push((Instant::now(), v));
        }
    }
    frames
}

/// A burst of 200 states is never refused; members on both nodes, batched
/// or not, get the last one, never an older one after a newer, and far
/// fewer frames than states: at most one per tick.
#[tokio::test]
async fn a_burst_of_states_is_coalesced_and_never_refused() {
    let redis = Redis::start();
    let nodes = two_nodes(&redis);
    let [mut alice, mut bob, mut carol] = three_members(&nodes).await;
    next_of(&mut alice, "room_join").await;
    next_of(&mut alice, "room_join").await;
    next_of(&mut bob, "room_join").await;

    let start = Instant::now();
    for i in 0..200 {
        alice
            .send(json!({"type": "room_state", "room": "doc", "state": {"i": i}}))
            .await;
    }
    let last = HashMap::from([("alice:pen".to_string(), 199)]);
    for member in [&mut bob, &mut carol] {
        let frames = watch_states(member, &last).await;
        let ticks = start.elapsed().as_millis() as usize / TICK.as_millis() as usize;
        assert!(
            frames.len() <= ticks + 2,
            "{}: {} frames in {ticks} ticks",
            member.user,
            frames.len()
        );
        let kind = if member.user == "bob" {
            "room_updates"
        } else {
            "room_update"
        };
        assert!(frames.iter().all(|(_, f)| f["type"] == kind), "{frames:?}");
    }
    // Not one of the 200 was refused.
    alice.send(json!({"type": "heartbeat"})).await;
    alice.watch(&["bob"]).await;
    let (waiting, _) = alice.waiting();
    assert!(waiting.iter().all(|f| f["type"] != "error"), "{waiting:?}");
}

/// Five devices moving at 60 Hz: a batched member gets at most one frame
/// per tick (plus slack) with everyone's latest; one that did not ask
/// gets `room_update` frames, at most one per tick per device.
#[tokio::test]
async fn members_get_one_batch_per_tick() {
    let redis = Redis::start();
    let (n1, n2) = two_nodes(&redis);
    let mut movers = Vec::new();
    for k in 0..5 {
        let node = if k % 2 == 0 { &n1 } else { &n2 };
        let mut c = Client::connect(node, &format!("u{k}"), "pen").await;
        join_batched(&mut c, "doc", json!({"i": -1})).await;
        movers.push(c);
    }
    let mut batched = Client::connect(&n2, "viewer", "b").await;
    join_batched(&mut batched, "doc", json!({})).await;
    let mut single = Client::connect(&n1, "viewer", "s").await;
    join(&mut single, "doc", json!({})).await;
    // Its own user's other device joining: a room_join.
    next_of(&mut batched, "room_join").await;

    let moves = 90;
    let start = Instant::now();
    for i in 0..moves {
        for c in &mut movers {
            c.send(json!({"type": "room_state", "room": "doc", "state": {"i": i}}))
                .await;
        }
        tokio::time::sleep(Duration::from_millis(16)).await;
    }
    let last: HashMap<String, i64> = (0..5).map(|k| (format!("u{k}:pen"), moves - 1)).collect();
    let frames = watch_states(&mut batched, &last).await;
    let secs = start.elapsed().as_secs_f64();
    let per_sec = frames.len() as f64 / secs;
    assert!(
        per_sec <= (HZ + 3) as f64,
        "{} batches in {secs:.2} s",
        frames.len()
    );
    assert!(frames.iter().all(|(_, f)| f["type"] == "room_updates"));
    // A batch carries several devices' states: fewer frames than updates.
    let updates: usize = frames.iter().map(|(_, f)| states(f).len()).sum();
    assert!(
        updates > frames.len(),
        "{updates} updates in {} frames",
        frames.len()
    );

    let frames = watch_states(&mut single, &last).await;
    let secs = start.elapsed().as_secs_f64();
    let mut per_device: HashMap<String, usize> = HashMap::new();
    for (_, f) in &frames {
        assert_eq!(f["type"], "room_update", "{f}");
        *per_device.entry(states(f)[0].0.clone()).or_default() += 1;
    }
    for (member, n) in per_device {
        assert!(
            n as f64 / secs <= (HZ + 3) as f64,
            "{member}: {n} updates in {secs:.2} s"
        );
    }
}

/// A newcomer's `room` frame carries a state at most about one tick old,
/// and its first batch brings the latest.
#[tokio::test]
async fn a_newcomer_sees_states_at_most_a_tick_old() {
    let redis = Redis::start();
    let (n1, n2) = two_nodes(&redis);
    let mut alice = Client::connect(&n1, "alice", "pen").await;
    join(&mut alice, "doc", json!({"i": -1})).await;
    let mut dave = Client::connect(&n2, "dave", "tab").await;
    let mut sent_at = Vec::new();
    let mut joined = None;
    let mut i = 0;
    while i < 300 {
        alice
            .send(json!({"type": "room_state", "room": "doc", "state": {"i": i}}))
            .await;
        sent_at.push(Instant::now());
        if i == 60 {
            dave.send(json!({"type": "join", "room": "doc", "batch": true}))
                .await;
        }
        if let Some(Incoming::Frame(v)) = dave.next_within(Duration::from_millis(5)).await {
            assert_eq!(v["type"], "room", "{v}");
            joined = Some((Instant::now(), v));
            break;
        }
        i += 1;
    }
    let (at, room) = joined.expect("dave's room frame");
    let shown = room["members"][0]["devices"][0]["state"]["i"]
        .as_i64()
        .unwrap();
    let age = at.duration_since(sent_at[shown as usize]);
    // A write waits at most a tick; the read and the frame take a little.
    assert!(
        age <= TICK * 2 + Duration::from_millis(100),
        "state {shown} was {age:?} old"
    );
    alice
        .send(json!({"type": "room_state", "room": "doc", "state": {"i": i + 1}}))
        .await;
    let last = HashMap::from([("alice:pen".to_string(), i as i64 + 1)]);
    watch_states(&mut dave, &last).await;
}

/// A device that leaves right after a burst: its pending state is dropped,
/// and no update of it follows its `room_leave`, batched or not.
#[tokio::test]
async fn no_update_follows_a_leave() {
    let redis = Redis::start();
    let nodes = two_nodes(&redis);
    let [mut alice, mut bob, mut carol] = three_members(&nodes).await;
    for i in 0..50 {
        alice
            .send(json!({"type": "room_state", "room": "doc", "state": {"i": i}}))
            .await;
    }
    alice.send(json!({"type": "leave", "room": "doc"})).await;
    for member in [&mut bob, &mut carol] {
        let mut last = -1;
        loop {
            let v = member.recv().await;
            if v["type"] == "room_leave" && v["user"] == "alice" {
                break;
            }
            for (m, s) in states(&v) {
                assert_eq!(m, "alice:pen");
                last = s["i"].as_i64().unwrap();
            }
        }
        // The pending (latest) state never went out: it was not written.
        assert!(last < 49, "{}: saw the last state {last}", member.user);
        if let Some(Incoming::Frame(v)) = member.next_within(TICK * 3).await {
            assert!(
                states(&v).is_empty(),
                "{}: {v} after room_leave",
                member.user
            );
        }
    }
}

/// A device whose node dies mid-move lapses: the members on the other node
/// get its `room_leave`, and no update of it after.
#[tokio::test]
async fn no_update_follows_a_lapse() {
    let redis = Redis::start();
    let (mut n1, n2) = two_nodes(&redis);
    let mut alice = Client::connect(&n1, "alice", "pen").await;
    join(&mut alice, "doc", json!({"i": -1})).await;
    let mut bob = Client::connect(&n2, "bob", "tab").await;
    join_batched(&mut bob, "doc", json!({})).await;
    for i in 0..30 {
        alice
            .send(json!({"type": "room_state", "room": "doc", "state": {"i": i}}))
            .await;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    n1.kill();
    loop {
        let v = bob.recv().await;
        if v["type"] == "room_leave" && v["user"] == "alice" {
            break;
        }
        assert!(
            v["type"] == "room_updates" || v["type"] == "room_join",
            "{v}"
        );
    }
    if let Some(Incoming::Frame(v)) = bob.next_within(TICK * 3).await {
        panic!("{v} after alice's room_leave");
    }
}
