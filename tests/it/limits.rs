//! Slow consumers and floods: bounded per-connection resources.

use std::time::{Duration, Instant};

use crate::common::*;
use serde_json::json;
use tokio_tungstenite::tungstenite::Message;

/// A WebSocket of user `stalled` with a tiny receive buffer, which the test
/// never reads after the handshake, so the server's queue for it grows.
async fn stalled_client(node: &Node) -> tokio_tungstenite::WebSocketStream<tokio::net::TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let stream = socket.connect(node.addr).await.unwrap();
    let (ws, _) = tokio_tungstenite::client_async(node.ws_url("stalled", "s"), stream)
        .await
        .unwrap();
    ws
}

/// A watcher that stops reading is disconnected once its queue passes the
/// bound; its device is released, and a healthy watcher of the same user on
/// the same node gets every event meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_watcher_is_disconnected_without_affecting_others() {
    let redis = Redis::start();
    // A long heartbeat: the silent-client timeout must not beat the queue bound.
    let node = Node::start_with(
        &redis,
        "n1",
        &["--max-queued-events", "64", "--heartbeat-ms", "5000"],
    );
    let mut healthy = Client::connect(&node, "healthy", "h").await;
    healthy.watch(&["bob"]).await;
    let mut monitor = Client::connect(&node, "monitor", "m").await;
    monitor.watch(&["stalled"]).await;

    let mut stalled = stalled_client(&node).await;
    assert_eq!(monitor.expect("presence").await["status"], "online");
    stalled
        .send(Message::Text(
            json!({"type":"watch","users":["bob"]}).to_string().into(),
        ))
        .await
        .unwrap();
    wait_until("the stalled client watches bob", DEADLINE, || async {
        let (_, h) = get(&format!("{}/healthz", node.http())).await;
        h["registry"]["watching_sessions"] == 3
    })
    .await;

    // A burst of transitions of bob, 16 KiB each, published the way the
    // scripts publish them: 16 MiB, far beyond the bound and the kernel's
    // socket buffers.
    let text = "x".repeat(16 * 1024);
    let events = 1000u64;
    let mut c = redis.aconn().await;
    let mut pipe = redis::pipe();
    for seq in 1..=events {
        let status = if seq % 2 == 0 { "away" } else { "busy" };
        let ev = json!({"user":"bob","status":status,"devices":1,"last_seen":null,"text":text,"seq":seq});
        pipe.cmd("SPUBLISH")
            .arg("presence-events:{bob}")
            .arg(ev.to_string())
            .ignore();
    }
    pipe.query_async::<()>(&mut c).await.unwrap();

    monitor.expect_presence("stalled", "offline").await;
    let mut got = 0;
    while got < events {
        let ev = healthy.expect("presence").await;
        got += 1;
        assert_eq!(ev["user"], "bob");
    }
    let (_, h) = get(&format!("{}/healthz", node.http())).await;
    assert_eq!(h["counters"]["slow_consumers"], 1, "{h}");
    // The frozen session really ended.
    wait_until("the stalled session is gone", DEADLINE, || async {
        get(&format!("{}/healthz", node.http())).await.1["registry"]["sessions"] == 2
    })
    .await;
    assert_eq!(count(&redis, "stalled").await, 0);
    drop(stalled);
}

use futures_util::SinkExt;

/// One client floods frames; another client's watch on the same node is
/// still answered promptly, and the flooder is refused, then closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_does_not_delay_others() {
    let redis = Redis::start();
    let node = Node::start(&redis, "n1");
    let mut flooder = Client::connect(&node, "flooder", "f").await;
    let mut calm = Client::connect(&node, "calm", "c").await;
    let users: Vec<String> = (0..100).map(|i| format!("u{i}")).collect();
    let frame = json!({"type":"watch","users":users}).to_string();
    let flood = tokio::spawn(async move {
        for _ in 0..5000 {
            if flooder
                .sink_send(Message::Text(frame.clone().into()))
                .await
                .is_err()
            {
                break;
            }
        }
        flooder
    });
    let asked = Instant::now();
    calm.send(json!({"type":"watch","users":["someone"]})).await;
    calm.expect("snapshot").await;
    let took = asked.elapsed();
    println!("watch answered in {took:?} during a flood");
    assert!(took < Duration::from_secs(1), "watch took {took:?}");

    let mut flooder = flood.await.unwrap();
    let mut limited = false;
    let closed = loop {
        match flooder.next_within(DEADLINE).await {
            Some(Incoming::Frame(f)) if f["type"] == "error" => {
                assert_eq!(f["code"], "rate_limited", "{f}");
                limited = true;
            }
            Some(Incoming::Frame(_)) => {}
            Some(Incoming::Closed(c)) => break c,
            None => panic!("flooder not closed"),
        }
    };
    assert!(limited, "no rate_limited error before the close");
    assert_eq!(closed.map(|c| c.0), Some(1008));
    let (_, h) = get(&format!("{}/healthz", node.http())).await;
    assert_eq!(h["counters"]["floods"], 1, "{h}");
}

/// A user may hold at most --max-devices-per-user devices; the same device
/// reconnecting is not one more.
#[tokio::test]
async fn devices_per_user_are_limited() {
    let redis = Redis::start();
    let node = Node::start_with(&redis, "n1", &["--max-devices-per-user", "2"]);
    let _a = Client::connect(&node, "alice", "a").await;
    let _b = Client::connect(&node, "alice", "b").await;
    let mut third = Client::connect_raw(&node.ws_url("alice", "c"), "alice", "c")
        .await
        .unwrap();
    let err = third.expect("error").await;
    assert_eq!(err["code"], "too_many_devices");
    assert_eq!(third.expect_closed().await.map(|c| c.0), Some(1008));
    assert_eq!(count(&redis, "alice").await, 2);
    // Device b reconnecting takes its own lease over.
    let _b2 = Client::connect(&node, "alice", "b").await;
    assert_eq!(count(&redis, "alice").await, 2);
}

/// A client that stops reading freezes its session even with no events for
/// it (its own heartbeat cannot run); the registry cuts it off anyway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_is_cut_off_without_events() {
    let redis = Redis::start();
    let node = Node::start(&redis, "n1");
    let mut monitor = Client::connect(&node, "monitor", "m").await;
    monitor.watch(&["stalled"]).await;
    let mut stalled = stalled_client(&node).await;
    assert_eq!(monitor.expect("presence").await["status"], "online");
    // Large snapshots it never reads fill every buffer on the way.
    let users: Vec<String> = (0..1000).map(|i| format!("u{i}")).collect();
    let frame = json!({"type":"watch","users":users}).to_string();
    for _ in 0..50 {
        stalled
            .send(Message::Text(frame.clone().into()))
            .await
            .unwrap();
    }
    monitor.expect_presence("stalled", "offline").await;
    wait_until("the frozen session is gone", DEADLINE, || async {
        get(&format!("{}/healthz", node.http())).await.1["registry"]["sessions"] == 1
    })
    .await;
    drop(stalled);
}

/// A room member that stops reading is disconnected once its queue passes
/// the bound, well before the stalled-client check would: room events go
/// through the same bounded delivery as presence events, not an unbounded
/// send to each member. A healthy member of the room gets every event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_room_member_is_disconnected_without_affecting_others() {
    let redis = Redis::start();
    let node = Node::start_with(
        &redis,
        "n1",
        &["--max-queued-events", "64", "--heartbeat-ms", "5000"],
    );
    let mut healthy = Client::connect(&node, "healthy", "h").await;
    crate::rooms::join(&mut healthy, "doc:1", json!({})).await;
    let mut monitor = Client::connect(&node, "monitor", "m").await;
    monitor.watch(&["stalled"]).await;
    let mut stalled = stalled_client(&node).await;
    assert_eq!(monitor.expect("presence").await["status"], "online");
    stalled
        .send(Message::Text(
            json!({"type":"join","room":"doc:1"}).to_string().into(),
        ))
        .await
        .unwrap();
    crate::rooms::expect_event(&mut healthy, "room_join", "doc:1", "stalled", "s").await;

    // 1,000 signals of 16 KiB, published the way room_signal.lua does.
    let data = "x".repeat(16 * 1024);
    let events = 1000u64;
    let mut c = redis.aconn().await;
    let mut pipe = redis::pipe();
    for n in 1..=events {
        let ev = json!({"e":"signal","room":"doc:1","user":"loud","device":"l","data":{"n":n,"pad":data}});
        pipe.cmd("SPUBLISH")
            .arg("presence-events-room:{r:doc:1}")
            .arg(ev.to_string())
            .ignore();
    }
    let start = Instant::now();
    pipe.query_async::<()>(&mut c).await.unwrap();

    monitor.expect_presence("stalled", "offline").await;
    let cut_after = start.elapsed();
    assert!(
        cut_after < Duration::from_secs(8),
        "cut off after {cut_after:?}"
    );
    let mut got = 0;
    while got < events {
        let ev = healthy.recv().await;
        if ev["type"] == "signal" {
            got += 1;
            assert_eq!(ev["data"]["n"], got, "in order");
        }
    }
    let (_, h) = get(&format!("{}/healthz", node.http())).await;
    assert_eq!(h["counters"]["slow_consumers"], 1, "{h}");
    drop(stalled);
}
