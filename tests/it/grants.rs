//! Who may be in which room (issue 37, item 11): `*`, the rooms claim's
//! prefix marker, is no room-id character, so that a grant never names a
//! room and a prefix at once.

use crate::common::*;
use redis::Commands;
use serde_json::{json, Value};

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
