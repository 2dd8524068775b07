//! Who may be in which room over a session's life (issue 37, items 7 and
//! 11): a fresh token whose rooms claim no longer covers a room takes the
//! device out of it, and `*`, the claim's prefix marker, is no room-id
//! character, so that a grant never names a room and a prefix at once.

use std::time::Duration;

use crate::common::jwt::{hs, jwt_node, now};
use crate::common::*;
use redis::Commands;
use serde_json::{json, Value};

/// A JWT node's WebSocket URL for `device`, the token to come in the first
/// frame (as the JS client sends it).
fn first_frame_url(node: &Node, device: &str) -> String {
    format!(
        "ws://{}/ws?device={device}",
        node.http().trim_start_matches("http://")
    )
}

/// A token for `sub`, valid for an hour, whose rooms claim is `rooms`.
fn granted(sub: &str, rooms: &[&str]) -> String {
    hs(json!({"sub": sub, "exp": now() + 3600, "rooms": rooms}))
}

/// `user`/`device` connected with `token` in its first frame, past `hello`.
async fn connect(node: &Node, user: &str, device: &str, token: &str) -> Client {
    let mut c = Client::connect_raw(&first_frame_url(node, device), user, device)
        .await
        .unwrap();
    c.send(json!({"type": "auth", "token": token})).await;
    assert_eq!(c.expect("hello").await["user"], user);
    c
}

/// Joins `room` and waits for its `room` frame.
async fn join(c: &mut Client, room: &str) {
    c.send(json!({"type": "join", "room": room})).await;
    let frame = c.expect("room").await;
    assert_eq!(frame["room"], room, "{frame}");
}

/// The next frame of `c` within [`DEADLINE`]; `what` says in the failure
/// what was awaited, and that nothing came.
async fn next_frame(c: &mut Client, what: &str) -> Value {
    match c.next_within(DEADLINE).await {
        Some(Incoming::Frame(v)) => v,
        other => panic!(
            "{}/{}: no frame within {DEADLINE:?} ({other:?}); expected {what}",
            c.user, c.device
        ),
    }
}

/// The next frame of `c`, which must be alice's `room_join` in `room`.
async fn expect_join_of_alice(c: &mut Client, room: &str) {
    let v = c.expect("room_join").await;
    assert_eq!(
        (v["room"].as_str(), v["user"].as_str()),
        (Some(room), Some("alice")),
        "{v}"
    );
}

/// Issue 37, item 7: alice is in `team:7:general` (granted by `team:7:*`)
/// and `doc:1`; her fresh token grants only `doc:1`. She leaves
/// `team:7:general` as with a leave frame (bob gets `room_leave`, Redis
/// forgets her membership) and is told `forbidden` about that room; then
/// she gets none of its events and her frames for it are `not_in_room`,
/// while `doc:1` stays joined.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_token_without_a_room_leaves_it() {
    let redis = Redis::start();
    let node = jwt_node(&redis, "n1", &["--room-policy", "claim"]);
    let both = ["team:7:*", "doc:1"];
    let mut bob = connect(&node, "bob", "laptop", &granted("bob", &both)).await;
    join(&mut bob, "team:7:general").await;
    join(&mut bob, "doc:1").await;
    // A second member who witnesses that the room's events went out.
    let mut carol = connect(&node, "carol", "tab", &granted("carol", &both)).await;
    join(&mut carol, "team:7:general").await;
    bob.expect("room_join").await;
    let mut alice = connect(&node, "alice", "web", &granted("alice", &both)).await;
    join(&mut alice, "team:7:general").await;
    join(&mut alice, "doc:1").await;
    expect_join_of_alice(&mut bob, "team:7:general").await;
    expect_join_of_alice(&mut bob, "doc:1").await;
    expect_join_of_alice(&mut carol, "team:7:general").await;

    alice
        .send(json!({"type": "auth", "token": granted("alice", &["doc:1"])}))
        .await;
    let told = next_frame(&mut alice, "an error forbidden about team:7:general").await;
    assert_eq!(
        (
            told["type"].as_str(),
            told["code"].as_str(),
            told["room"].as_str()
        ),
        (Some("error"), Some("forbidden"), Some("team:7:general")),
        "{told}"
    );
    let left = next_frame(&mut bob, "room_leave of alice in team:7:general").await;
    assert_eq!(
        (
            left["type"].as_str(),
            left["room"].as_str(),
            left["user"].as_str(),
            left["device"].as_str(),
            left["last"].as_bool()
        ),
        (
            Some("room_leave"),
            Some("team:7:general"),
            Some("alice"),
            Some("web"),
            Some(true)
        ),
        "{left}"
    );
    assert_eq!(carol.expect("room_leave").await["user"], "alice");
    // The store's leave step ran: Redis no longer counts her.
    let base = node.http();
    let (status, read) = get(&format!(
        "{base}/api/rooms/team:7:general?token={}",
        granted("bob", &both)
    ))
    .await;
    assert_eq!(
        (status, read["users"].as_u64(), read["devices"].as_u64()),
        (200, Some(2), Some(2)),
        "{read}"
    );

    // Her frames for the room are refused like any room she is not in.
    for frame in [
        json!({"type": "signal", "room": "team:7:general", "data": "still here"}),
        json!({"type": "room_state", "room": "team:7:general", "state": {"x": 1}}),
    ] {
        alice.send(frame).await;
        let e = alice.expect("error").await;
        assert_eq!(
            (e["code"].as_str(), e["room"].as_str()),
            (Some("not_in_room"), Some("team:7:general")),
            "{e}"
        );
    }
    // The room's events reach carol, and not alice ...
    bob.send(json!({"type": "signal", "room": "team:7:general", "data": "secret"}))
        .await;
    bob.send(json!({"type": "room_state", "room": "team:7:general", "state": {"y": 2}}))
        .await;
    assert_eq!(carol.expect("signal").await["data"], "secret");
    assert_eq!(carol.expect("room_update").await["state"], json!({"y": 2}));
    // ... who is still in doc:1 (her signal reaches bob) and hears of the
    // old room nothing more.
    alice
        .send(json!({"type": "signal", "room": "doc:1", "data": "hi"}))
        .await;
    let hi = bob.expect("signal").await;
    assert_eq!(
        (hi["room"].as_str(), hi["data"].as_str()),
        (Some("doc:1"), Some("hi"))
    );
    if let Some(Incoming::Frame(v)) = alice.next_within(Duration::from_millis(500)).await {
        panic!("alice got a frame after leaving: {v}");
    }
}

/// Issue 37, item 11: `*` marks a prefix in the rooms claim, so it is no
/// room-id character: a join, a room frame, and the HTTP room reads naming
/// a room with `*` get `invalid_id`, and nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_star_is_not_a_room_id_character() {
    let redis = Redis::start();
    let node = Node::start(&redis, "n1");
    let mut c = Client::connect(&node, "alice", "web").await;
    for frame in [
        json!({"type": "join", "room": "doc:abc*"}),
        json!({"type": "join", "room": "*"}),
        json!({"type": "leave", "room": "team:7*"}),
        json!({"type": "room_state", "room": "a*b", "state": {}}),
        json!({"type": "signal", "room": "team:*", "data": 1}),
    ] {
        c.send(frame.clone()).await;
        let e = next_frame(&mut c, "an error invalid_id").await;
        assert_eq!(
            (e["type"].as_str(), e["code"].as_str()),
            (Some("error"), Some("invalid_id")),
            "{frame} answered {e}"
        );
        let message = e["message"].as_str().unwrap_or_default();
        assert!(message.contains('*'), "the error names the character: {e}");
    }
    let base = node.http();
    let read = get(&format!("{base}/api/rooms/doc:abc*?viewer=alice")).await;
    let query = post(
        &format!("{base}/api/rooms/query?viewer=alice"),
        &json!({"rooms": ["doc:1", "team:7*"]}),
    )
    .await;
    for (what, (status, body)) in [("GET /api/rooms", read), ("POST /api/rooms/query", query)] {
        let code = body["code"].as_str();
        assert_eq!((status, code), (400, Some("invalid_id")), "{what}: {body}");
    }
    let keys: Vec<String> = redis.conn().keys("presence-room*").unwrap();
    assert!(keys.is_empty(), "refused frames wrote {keys:?}");
}
