//! A pause (`{"type":"pause"}`, issue 41, "Mobile and background tabs"):
//! the device steps away without leaving. A resume within the grace is no
//! transition for watchers or room members; past the grace the device
//! leaves once, as a lapse does; the grace is bounded by
//! `--pause-grace-ms`, may outlast the TTL, and a pause on a lease another
//! connection holds touches nothing.

use std::time::{Duration, Instant};

use crate::common::*;
use crate::rooms::{expect_event, join};
use redis::Commands;
use serde_json::{json, Value};

/// Sends a pause (asking `grace_ms`, if given) and returns the `paused`
/// frame, after checking the close that follows: 1000 "paused".
pub(crate) async fn pause(c: &mut Client, grace_ms: Option<u64>) -> Value {
    let frame = match grace_ms {
        Some(ms) => json!({"type": "pause", "grace_ms": ms}),
        None => json!({"type": "pause"}),
    };
    c.send(frame).await;
    let paused = c.expect("paused").await;
    assert_eq!(
        c.expect_closed().await,
        Some((1000, "paused".to_string())),
        "{}/{}: the close after paused",
        c.user,
        c.device
    );
    paused
}

/// Frames `c` gets within `window`, in order.
pub(crate) async fn frames_within(c: &mut Client, window: Duration) -> Vec<Value> {
    let end = Instant::now() + window;
    let mut frames = Vec::new();
    while let Some(left) = end.checked_duration_since(Instant::now()) {
        match c.next_within(left).await {
            Some(Incoming::Frame(v)) => frames.push(v),
            Some(Incoming::Closed(c)) => panic!("closed: {c:?}"),
            None => break,
        }
    }
    frames
}

/// The `presence` frame of bob, online and idle: his only device paused.
async fn expect_idle(alice: &mut Client) {
    let idle = alice.expect_presence("bob", "online").await;
    assert_eq!(idle["idle"], true, "{idle}");
}

/// Two nodes on one Redis with `extra` flags; alice watches bob from the
/// second node and is in `doc:1` with him, where bob (first node, device
/// `phone`) joined after her.
async fn setup(extra: &[&str]) -> (Redis, Node, Node, Client, Client) {
    let redis = Redis::start();
    let n1 = Node::start_with(&redis, "n1", extra);
    let n2 = Node::start_with(&redis, "n2", extra);
    let mut alice = Client::connect(&n2, "alice", "web").await;
    join(&mut alice, "doc:1", json!({})).await;
    alice.watch(&["bob"]).await;
    let mut bob = Client::connect(&n1, "bob", "phone").await;
    alice.expect_presence("bob", "online").await;
    join(&mut bob, "doc:1", json!({"page": 1})).await;
    expect_event(&mut alice, "room_join", "doc:1", "bob", "phone").await;
    (redis, n1, n2, alice, bob)
}

/// A pause and a resume on another node within the grace (the default
/// grace, the TTL, waited past): the watcher sees no offline or online,
/// only bob idle and back (tests/it/idle.rs), the room member no leave or
/// join.
#[tokio::test]
async fn a_resume_within_the_grace_is_no_transition() {
    let (_redis, _n1, n2, mut alice, mut bob) = setup(&[]).await;
    let paused = pause(&mut bob, None).await;
    assert_eq!(paused["grace_ms"], TTL.as_millis() as u64, "{paused}");
    expect_idle(&mut alice).await;
    let mut bob = Client::connect(&n2, "bob", "phone").await;
    let back = alice.expect_presence("bob", "online").await;
    assert_eq!(back.get("idle"), None, "{back}");
    join(&mut bob, "doc:1", json!({"page": 1})).await;
    // Past the TTL and the deadline passes' slack: a pause that released
    // the lease or left the room shows by now.
    let seen = frames_within(&mut alice, TTL + Duration::from_millis(1500)).await;
    assert!(seen.is_empty(), "alice saw {seen:?}");
}

/// Paused with a grace of 1.5 s under a TTL of 6 s and never resumed: one
/// offline and one room leave, after the grace and well before the TTL.
#[tokio::test]
async fn past_the_grace_the_device_leaves_once() {
    let flags = ["--ttl-ms", "6000", "--pause-grace-ms", "1500"];
    let (_redis, _n1, _n2, mut alice, mut bob) = setup(&flags).await;
    let start = Instant::now();
    assert_eq!(pause(&mut bob, None).await["grace_ms"], 1500);
    expect_idle(&mut alice).await;
    let seen = frames_within(&mut alice, Duration::from_millis(4500)).await;
    let at = start.elapsed();
    let offline: Vec<_> = seen.iter().filter(|v| v["type"] == "presence").collect();
    let left: Vec<_> = seen.iter().filter(|v| v["type"] == "room_leave").collect();
    assert_eq!(seen.len(), 2, "alice saw {seen:?}");
    assert_eq!(offline.len(), 1, "{seen:?}");
    assert_eq!(offline[0]["status"], "offline", "{seen:?}");
    assert_eq!(left.len(), 1, "{seen:?}");
    assert_eq!(left[0]["last"], true, "{seen:?}");
    assert!(at < Duration::from_millis(6000), "by {at:?}");
    // Nothing more (nothing early: the next test).
    let more = frames_within(&mut alice, Duration::from_millis(1000)).await;
    assert!(more.is_empty(), "then {more:?}");
}

/// The same, timed: nothing before the grace is over.
#[tokio::test]
async fn nothing_leaves_before_the_grace() {
    let flags = ["--ttl-ms", "6000", "--pause-grace-ms", "1500"];
    let (_redis, _n1, _n2, mut alice, mut bob) = setup(&flags).await;
    let start = Instant::now();
    pause(&mut bob, None).await;
    expect_idle(&mut alice).await;
    let early = frames_within(
        &mut alice,
        Duration::from_millis(1300).saturating_sub(start.elapsed()),
    )
    .await;
    assert!(early.is_empty(), "before the grace: {early:?}");
    let ev = crate::rooms::next_of(&mut alice, "presence").await;
    assert_eq!(ev["status"], "offline", "{ev}");
    let at = start.elapsed();
    assert!(at >= Duration::from_millis(1400), "{ev} at {at:?}");
}

/// A grace longer than the TTL (4 s, TTL 1.5 s): the lease was extended,
/// so no offline and no leave at the TTL; both come after the grace.
#[tokio::test]
async fn a_grace_longer_than_the_ttl_outlasts_it() {
    let flags = ["--pause-grace-ms", "4000"];
    let (redis, _n1, _n2, mut alice, mut bob) = setup(&flags).await;
    // Past the refresh interval (a third of the heartbeat): the pause frame
    // itself starts a refresh, which the pause waits for (one landing after
    // it would set the lease back to the TTL).
    tokio::time::sleep(Duration::from_millis(HEARTBEAT_MS / 3 + 100)).await;
    let start = Instant::now();
    assert_eq!(pause(&mut bob, None).await["grace_ms"], 4000);
    expect_idle(&mut alice).await;
    let pttl: i64 = redis.conn().pttl("presence:{bob}:phone").unwrap();
    assert!(pttl > TTL.as_millis() as i64, "lease PTTL {pttl} ms");
    // Past the TTL and the deadline passes' slack (2.5 s), short of the grace.
    let quiet = Duration::from_millis(3300).saturating_sub(start.elapsed());
    let early = frames_within(&mut alice, quiet).await;
    assert!(early.is_empty(), "within the grace: {early:?}");
    let mut seen = Vec::new();
    while seen.len() < 2 {
        seen.push(alice.recv().await);
    }
    let at = start.elapsed();
    assert!(at >= Duration::from_millis(3900), "{seen:?} at {at:?}");
    let kinds: Vec<_> = seen.iter().map(|v| v["type"].as_str().unwrap()).collect();
    assert!(
        kinds.contains(&"presence") && kinds.contains(&"room_leave"),
        "{seen:?}"
    );
    let more = frames_within(&mut alice, Duration::from_millis(1000)).await;
    assert!(more.is_empty(), "then {more:?}");
}

/// A grace asked above `--pause-grace-ms` is cut to it, one below it is
/// kept, and the lease's TTL is what the answer says.
#[tokio::test]
async fn the_grace_asked_is_cut_to_the_bound() {
    let redis = Redis::start();
    let n1 = Node::start_with(&redis, "n1", &["--pause-grace-ms", "2000"]);
    let mut bob = Client::connect(&n1, "bob", "phone").await;
    assert_eq!(pause(&mut bob, Some(60_000)).await["grace_ms"], 2000);
    let pttl: i64 = redis.conn().pttl("presence:{bob}:phone").unwrap();
    assert!((1000..=2000).contains(&pttl), "lease PTTL {pttl} ms");
    let mut bob = Client::connect(&n1, "bob", "phone").await;
    assert_eq!(pause(&mut bob, Some(700)).await["grace_ms"], 700);
    let pttl: i64 = redis.conn().pttl("presence:{bob}:phone").unwrap();
    assert!((1..=700).contains(&pttl), "lease PTTL {pttl} ms");
}

/// A pause on a session whose lease another connection holds (its word
/// lost: the value is changed behind the node's back) touches nothing: the
/// lease keeps its value and TTL, the session closes with 4001, and the
/// watcher sees nothing.
#[tokio::test]
async fn a_pause_on_a_lease_taken_over_harms_nothing() {
    // A long heartbeat: no refresh is due when the pause comes (one would
    // find the lease replaced first, and the pause would never be sent).
    let flags = ["--heartbeat-ms", "5000", "--pause-grace-ms", "60000"];
    let (redis, n1, _n2, mut alice, mut bob) = setup(&flags).await;
    let key = "presence:{bob}:phone";
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg("12345")
        .arg("KEEPTTL")
        .query(&mut redis.conn())
        .unwrap();
    bob.send(json!({"type": "pause"})).await;
    let closed = bob.expect_closed().await;
    assert_eq!(closed.map(|c| c.0), Some(4001));
    let mut conn = redis.conn();
    let value: String = conn.get(key).unwrap();
    let pttl: i64 = conn.pttl(key).unwrap();
    assert_eq!(value, "12345");
    assert!(pttl <= 15_000, "lease PTTL {pttl} ms");
    n1.wait_log("pause found the lease replaced").await;
    let seen = frames_within(&mut alice, Duration::from_millis(300)).await;
    assert!(seen.is_empty(), "alice saw {seen:?}");
}
