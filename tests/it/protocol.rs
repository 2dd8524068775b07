//! The WebSocket protocol: bad input gets an error frame and the session
//! keeps working (design invariant 6).

use crate::common::*;
use serde_json::json;
use tokio_tungstenite::tungstenite::Message;

#[tokio::test]
async fn malformed_frames_get_error_frames_and_the_session_keeps_working() {
    let redis = Redis::start();
    let node = Node::start(&redis, "n1");
    let mut c = Client::connect(&node, "alice", "phone").await;
    let cases: Vec<(Message, &str)> = vec![
        (Message::Text("not json".into()), "bad_request"),
        (Message::Text("[1,2,3]".into()), "bad_request"),
        (Message::Text("{}".into()), "bad_request"),
        (Message::Text(r#"{"type":"dance"}"#.into()), "unknown_type"),
        (Message::Text(r#"{"type":"watch"}"#.into()), "bad_request"),
        (
            Message::Text(r#"{"type":"watch","users":"bob"}"#.into()),
            "bad_request",
        ),
        (
            Message::Text(r#"{"type":"watch","users":["b:ob"]}"#.into()),
            "invalid_id",
        ),
        (
            Message::Text(r#"{"type":"watch","users":[""]}"#.into()),
            "invalid_id",
        ),
        (
            Message::Text(r#"{"type":"status","status":"asleep"}"#.into()),
            "invalid_status",
        ),
        (
            Message::Text(r#"{"type":"privacy","online":"friends"}"#.into()),
            "bad_request",
        ),
        (Message::Text(r#"{"type":"status"}"#.into()), "bad_request"),
        (
            Message::Binary(vec![0, 159, 146, 150].into()),
            "unsupported",
        ),
    ];
    for (frame, code) in cases {
        let shown = format!("{frame:?}");
        c.send_raw(frame).await;
        let err = c.expect("error").await;
        assert_eq!(err["code"], code, "{shown}: {err}");
        assert!(!err["message"].as_str().unwrap().is_empty());
    }
    // Still alive and well.
    let snap = c.watch(&["alice"]).await;
    assert_eq!(snap[0]["status"], "online");
    c.send(json!({"type": "heartbeat"})).await;
    c.send(json!({"type": "status", "status": "busy", "extra": "ignored"}))
        .await;
    let ev = c.expect("presence").await;
    assert_eq!(ev["status"], "busy");
    assert_eq!(count(&redis, "alice").await, 1);
    let mut conn = redis.aconn().await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("presence:*")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(keys, ["presence:{alice}:phone"]);
}

#[tokio::test]
async fn hello_carries_the_timings() {
    let redis = Redis::start();
    let node = Node::start(&redis, "n1");
    let mut c = Client::connect_raw(&node.ws_url("alice", "phone"), "alice", "phone")
        .await
        .unwrap();
    let hello = c.recv().await;
    assert_eq!(
        hello,
        json!({"type":"hello","user":"alice","device":"phone",
               "heartbeat_ms": HEARTBEAT_MS, "ttl_ms": TTL.as_millis() as u64,
               "self": {"user":"alice","status":"online","devices":1,"last_seen":null,
                        "text":null,"until":null,"kinds":["other"]}})
    );
}

/// The hello of `user`/`device`, connected now.
async fn hello_of(node: &Node, user: &str, device: &str) -> (Client, serde_json::Value) {
    let mut c = Client::connect_raw(&node.ws_url(user, device), user, device)
        .await
        .unwrap();
    let hello = c.recv().await;
    assert_eq!(hello["type"], "hello", "{hello}");
    (c, hello)
}

/// A status set on one device is the user's: a device that connects later
/// learns it from its hello, without watching itself, and invisible shows
/// as such to its owner only.
#[tokio::test]
async fn hello_carries_the_users_own_record() {
    let redis = Redis::start();
    let node = Node::start(&redis, "n1");
    let mut phone = Client::connect(&node, "alice", "phone").await;
    let until = crate::common::jwt::now() * 1000 + 3_600_000;
    phone
        .send(json!({"type": "status", "status": "away", "text": "in a meeting", "until": until}))
        .await;
    assert_eq!(phone.expect("presence").await["status"], "away");
    let (_laptop, hello) = hello_of(&node, "alice", "laptop").await;
    assert_eq!(
        hello["self"],
        json!({"user":"alice","status":"away","devices":2,"last_seen":null,
               "text":"in a meeting","until":until,"kinds":["other"]})
    );
    phone
        .send(json!({"type": "status", "status": "invisible"}))
        .await;
    assert_eq!(phone.expect("presence").await["status"], "invisible");
    let (_tablet, hello) = hello_of(&node, "alice", "tablet").await;
    assert_eq!(
        (&hello["self"]["status"], &hello["self"]["devices"]),
        (&json!("invisible"), &json!(3)),
        "{hello}"
    );
    // Watchers still see her offline; the hello went to her only.
    let mut bob = Client::connect(&node, "bob", "b").await;
    let seen = bob.watch(&["alice"]).await;
    assert_eq!(seen[0]["status"], "offline", "{seen:?}");
}

#[tokio::test]
async fn oversized_frame_closes_with_1009() {
    let redis = Redis::start();
    let node = Node::start_with(&redis, "n1", &["--max-frame-bytes", "1024"]);
    let mut c = Client::connect(&node, "alice", "phone").await;
    let big = format!(r#"{{"type":"watch","users":["{}"]}}"#, "a".repeat(2000));
    c.send_raw(Message::Text(big.into())).await;
    let (code, reason) = c.expect_closed().await.expect("close frame");
    assert_eq!(code, 1009, "{reason}");
    // The device is released like any other close.
    wait_until("alice released", DEADLINE, || async {
        count(&redis, "alice").await == 0
    })
    .await;
}

#[tokio::test]
async fn watch_limit_and_unwatch() {
    let redis = Redis::start();
    let node = Node::start_with(&redis, "n1", &["--max-watches", "3"]);
    let mut w = Client::connect(&node, "watcher", "w").await;
    let snap = w.watch(&["a", "b", "b", "c"]).await;
    assert_eq!(snap.len(), 3, "duplicates collapse: {snap:?}");
    w.send(json!({"type":"watch","users":["d"]})).await;
    assert_eq!(w.expect("error").await["code"], "too_many_watches");
    // Watching an already watched user again is no new watch, and is not
    // read again: the client has it from the snapshot and live events.
    assert_eq!(w.watch(&["a"]).await.len(), 0);

    w.send(json!({"type":"unwatch","users":["a"]})).await;
    let snap = w.watch(&["d"]).await;
    assert_eq!(snap[0]["user"], "d");

    // Events stop for an unwatched user: a's arrival is not delivered, d's is.
    let _a = Client::connect(&node, "a", "x").await;
    wait_until("a counted", DEADLINE, || async {
        count(&redis, "a").await == 1
    })
    .await;
    let _d = Client::connect(&node, "d", "x").await;
    let ev = w.expect("presence").await;
    assert_eq!(ev["user"], "d", "{ev}");
}

#[tokio::test]
async fn replaced_connection_is_closed() {
    let redis = Redis::start();
    let a = Node::start(&redis, "a");
    let b = Node::start(&redis, "b");
    let mut old = Client::connect(&a, "alice", "phone").await;
    let _new = Client::connect(&b, "alice", "phone").await;
    // The old connection learns at its next lease refresh.
    let (code, _) = old.expect_closed().await.expect("close frame");
    assert_eq!(code, 4001);
    assert_eq!(count(&redis, "alice").await, 1);
    assert_eq!(
        lease_node(&redis, "alice", "phone").await.as_deref(),
        Some("b")
    );
}

#[tokio::test]
async fn silent_client_is_disconnected_and_released() {
    let redis = Redis::start();
    let node = Node::start(&redis, "n1");
    let mut w = Client::connect(&node, "watcher", "w").await;
    w.watch(&["alice"]).await;
    // A raw TCP WebSocket that never reads, so never answers pings.
    let (ws, _) = tokio_tungstenite::connect_async(node.ws_url("alice", "phone"))
        .await
        .unwrap();
    assert_eq!(w.expect("presence").await["status"], "online");
    let connected = std::time::Instant::now();
    let ev = w.expect("presence").await;
    assert_eq!(ev["status"], "offline");
    // Disconnected at the first ping after two silent heartbeats.
    let bound = std::time::Duration::from_millis(3 * HEARTBEAT_MS + 500);
    assert!(
        connected.elapsed() <= bound,
        "offline after {:?}",
        connected.elapsed()
    );
    drop(ws);
}

#[tokio::test]
async fn every_status_frame_is_answered_with_the_senders_record() {
    let redis = Redis::start();
    let node = Node::start(&redis, "n1");
    // A device that does not watch its own user.
    let mut phone = Client::connect(&node, "alice", "phone").await;
    phone
        .send(json!({"type": "status", "status": "away", "text": "lunch"}))
        .await;
    let own = phone.expect("presence").await;
    assert_eq!(
        (&own["user"], &own["status"], &own["text"], &own["devices"]),
        (&json!("alice"), &json!("away"), &json!("lunch"), &json!(1)),
        "{own}"
    );
    // Invisible shows as such to its owner.
    phone
        .send(json!({"type": "status", "status": "invisible"}))
        .await;
    assert_eq!(phone.expect("presence").await["status"], "invisible");

    // A device that watches its own user gets the answer once, not the
    // answer and then the same change again as an event.
    let mut laptop = Client::connect(&node, "alice", "laptop").await;
    laptop.watch(&["alice"]).await;
    laptop
        .send(json!({"type": "status", "status": "busy"}))
        .await;
    assert_eq!(laptop.expect("presence").await["status"], "busy");
    laptop.send(json!({"type": "heartbeat"})).await;
    assert!(
        laptop
            .next_within(std::time::Duration::from_millis(500))
            .await
            .is_none(),
        "the change came twice"
    );
    // The other device of the same user, watching nothing, hears nothing.
    assert!(phone.try_next().is_none());
}
