//! Presence transitions across devices and nodes (design invariants 1-3).

use std::time::{Duration, Instant};

use crate::common::*;
use serde_json::json;

/// Two devices of one user on one node: one `online`, nothing when the
/// first leaves, one `offline` with `last_seen` when the last leaves.
#[tokio::test]
async fn multi_device_on_one_node() {
    let redis = Redis::start();
    let node = Node::start(&redis, "n1");
    let mut watcher = Client::connect(&node, "watcher", "w").await;
    let snap = watcher.watch(&["alice"]).await;
    assert_eq!(snap[0]["status"], "offline");
    assert!(snap[0]["last_seen"].is_null());

    let phone = Client::connect(&node, "alice", "phone").await;
    let ev = watcher.expect("presence").await;
    assert_eq!(
        (ev["user"].as_str(), ev["status"].as_str()),
        (Some("alice"), Some("online"))
    );
    assert_eq!(ev["devices"], 1);

    let laptop = Client::connect(&node, "alice", "laptop").await;
    wait_until("two devices counted", DEADLINE, || async {
        count(&redis, "alice").await == 2
    })
    .await;
    phone.close().await;
    wait_until("one device counted", DEADLINE, || async {
        count(&redis, "alice").await == 1
    })
    .await;
    let before = store_now();
    laptop.close().await;

    // The very next frame is the offline: nothing came for the first departure.
    let ev = watcher.expect("presence").await;
    assert_eq!(ev["status"], "offline", "{ev}");
    assert_eq!(ev["devices"], 0);
    let last_seen = ev["last_seen"].as_i64().expect("last_seen set");
    assert!(
        last_seen >= before - 1000,
        "last_seen {last_seen} before {before}"
    );

    // Redis at rest: nothing counted, no lease, last seen kept.
    let mut c = redis.aconn().await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("presence:{alice}:*")
        .query_async(&mut c)
        .await
        .unwrap();
    assert!(keys.is_empty(), "leftover leases {keys:?}");
    assert_eq!(count(&redis, "alice").await, 0);
    // The retention index follows the transition (a moment later: it is
    // written beside the atomic step).
    wait_until("last seen indexed", DEADLINE, || async {
        let mut c = redis.aconn().await;
        let seen: Option<i64> = redis::cmd("ZSCORE")
            .arg(index_key("presence-lastseen", "alice"))
            .arg("alice")
            .query_async(&mut c)
            .await
            .unwrap();
        seen == Some(last_seen)
    })
    .await;

    // A late watcher sees the same last seen.
    let mut late = Client::connect(&node, "late", "w").await;
    let snap = late.watch(&["alice"]).await;
    assert_eq!(snap[0]["status"], "offline");
    assert_eq!(snap[0]["last_seen"], last_seen);
}

/// Devices of one user on two nodes, watchers on both: exactly one
/// `online` and one `offline` each; events cross nodes.
#[tokio::test]
async fn two_nodes_share_one_redis() {
    let redis = Redis::start();
    let a = Node::start(&redis, "a");
    let b = Node::start(&redis, "b");
    let mut wa = Client::connect(&a, "wa", "w").await;
    let mut wb = Client::connect(&b, "wb", "w").await;
    wa.watch(&["alice"]).await;
    wb.watch(&["alice"]).await;

    let phone = Client::connect(&a, "alice", "phone").await;
    for w in [&mut wa, &mut wb] {
        let ev = w.expect("presence").await;
        assert_eq!(ev["status"], "online");
    }
    let laptop = Client::connect(&b, "alice", "laptop").await;
    wait_until("two devices counted", DEADLINE, || async {
        count(&redis, "alice").await == 2
    })
    .await;

    // A status change on node B reaches the watcher on node A.
    let mut laptop = laptop;
    laptop
        .send(json!({"type": "status", "status": "busy", "text": "focus"}))
        .await;
    for w in [&mut wa, &mut wb] {
        let ev = w.expect("presence").await;
        assert_eq!(
            (ev["status"].as_str(), ev["text"].as_str()),
            (Some("busy"), Some("focus"))
        );
        assert_eq!(ev["devices"], 2);
    }

    phone.close().await;
    wait_until("one device counted", DEADLINE, || async {
        count(&redis, "alice").await == 1
    })
    .await;
    laptop.close().await;
    for w in [&mut wa, &mut wb] {
        let ev = w.expect("presence").await;
        assert_eq!(ev["status"], "offline", "{ev}");
        assert!(ev["last_seen"].is_i64());
    }
}

/// The same device reconnects on another node before its lease lapses: no
/// transition, and the old connection's late close leaves the new lease.
#[tokio::test]
async fn reconnect_on_another_node_keeps_the_lease() {
    let redis = Redis::start();
    let a = Node::start(&redis, "a");
    let b = Node::start(&redis, "b");
    let mut watcher = Client::connect(&b, "watcher", "w").await;
    watcher.watch(&["alice"]).await;

    let old = Client::connect(&a, "alice", "phone").await;
    assert_eq!(watcher.expect("presence").await["status"], "online");
    let mut new = Client::connect(&b, "alice", "phone").await;
    old.close().await;
    a.wait_log("alice/phone: closed").await;

    assert_eq!(
        lease_node(&redis, "alice", "phone").await.as_deref(),
        Some("b")
    );
    let (_, body) = get(&format!("{}/api/presence/alice", a.http())).await;
    assert_eq!(body["device_list"][0]["node"], "b", "{body}");
    assert_eq!(count(&redis, "alice").await, 1);

    // Pub/sub keeps order: had the late close announced anything, it would
    // arrive before this status change.
    new.send(json!({"type": "status", "status": "away"})).await;
    let ev = watcher.expect("presence").await;
    assert_eq!(ev["status"], "away", "{ev}");

    new.close().await;
    let ev = watcher.expect("presence").await;
    assert_eq!(ev["status"], "offline", "{ev}");
    assert_eq!(count(&redis, "alice").await, 0);
}

/// A node killed with SIGKILL: its users go offline for watchers on the
/// other node within TTL + 1 s, and the counters return to zero.
#[tokio::test]
async fn killed_node_users_go_offline_within_ttl() {
    let redis = Redis::start();
    let mut a = Node::start(&redis, "a");
    let b = Node::start(&redis, "b");
    let mut watcher = Client::connect(&b, "watcher", "w").await;
    watcher.watch(&["alice", "bob"]).await;

    let _phone = Client::connect(&a, "alice", "phone").await;
    let _laptop = Client::connect(&a, "alice", "laptop").await;
    let _bob = Client::connect(&a, "bob", "tab").await;
    let mut online = 0;
    while online < 2 {
        assert_eq!(watcher.expect("presence").await["status"], "online");
        online += 1;
    }
    wait_until("three devices counted", DEADLINE, || async {
        count(&redis, "alice").await == 2 && count(&redis, "bob").await == 1
    })
    .await;

    let killed = Instant::now();
    let killed_ms = presence_server::store::now_ms();
    a.kill();
    let mut offline = std::collections::HashSet::new();
    while offline.len() < 2 {
        let ev = watcher.expect("presence").await;
        assert_eq!(ev["status"], "offline", "{ev}");
        assert!(
            offline.insert(ev["user"].as_str().unwrap().to_string()),
            "second offline {ev}"
        );
        let elapsed = killed.elapsed();
        assert!(
            elapsed <= TTL + Duration::from_secs(1),
            "offline after {elapsed:?}"
        );
        // Last seen at the last activity (a refresh, a transition) before
        // the kill, not when the leases lapsed a TTL later (the departure
        // of alice's other lapsed device adds 1 ms to her clock).
        let last_seen = ev["last_seen"].as_i64().expect("last_seen set");
        assert!(
            last_seen <= killed_ms + 1,
            "last seen {} ms after the kill: {ev}",
            last_seen - killed_ms
        );
    }
    assert_eq!(count(&redis, "alice").await, 0);
    assert_eq!(count(&redis, "bob").await, 0);
    let mut c = redis.aconn().await;
    let fields: Vec<String> = redis::cmd("HKEYS")
        .arg("presence-status:{alice}")
        .query_async(&mut c)
        .await
        .unwrap();
    assert!(!fields.iter().any(|f| f.starts_with("d:")), "{fields:?}");
}

/// A client whose TCP connection drops without a close frame is released.
#[tokio::test]
async fn dropped_connection_goes_offline() {
    let redis = Redis::start();
    let node = Node::start(&redis, "n1");
    let mut watcher = Client::connect(&node, "watcher", "w").await;
    watcher.watch(&["alice"]).await;
    let phone = Client::connect(&node, "alice", "phone").await;
    assert_eq!(watcher.expect("presence").await["status"], "online");
    let dropped = Instant::now();
    phone.drop_tcp();
    let ev = watcher.expect("presence").await;
    assert_eq!(ev["status"], "offline");
    assert!(dropped.elapsed() <= TTL + Duration::from_secs(1));
    assert_eq!(count(&redis, "alice").await, 0);
}

fn store_now() -> i64 {
    presence_server::store::now_ms()
}

/// A rolling deploy: SIGTERM closes sessions with 1001 and leaves leases to
/// lapse; a device that reconnects to another node shows no transition.
#[tokio::test]
async fn sigterm_and_reconnect_elsewhere_shows_no_transition() {
    let redis = Redis::start();
    let mut a = Node::start(&redis, "a");
    let b = Node::start(&redis, "b");
    let mut watcher = Client::connect(&b, "watcher", "w").await;
    watcher.watch(&["alice", "bob"]).await;
    let mut phone = Client::connect(&a, "alice", "phone").await;
    assert_eq!(watcher.expect("presence").await["status"], "online");
    let mut bob = Client::connect(&a, "bob", "tab").await;
    assert_eq!(watcher.expect("presence").await["user"], "bob");

    unsafe {
        libc::kill(a.pid() as i32, libc::SIGTERM);
    }
    let (code, reason) = phone.expect_closed().await.expect("close frame");
    assert_eq!(code, 1001, "{reason}");
    assert_eq!(bob.expect_closed().await.expect("close frame").0, 1001);
    let status = a.wait_exit(DEADLINE).await.expect("node a exits");
    assert!(status.success(), "{status}");

    // Alice comes back on node B; bob does not come back.
    let mut phone = Client::connect(&b, "alice", "phone").await;
    // Bob's lease lapses: that offline is the next event, with no flicker of
    // alice before or after it.
    watcher.expect_presence("bob", "offline").await;
    phone
        .send(json!({"type": "status", "status": "away"}))
        .await;
    watcher.expect_presence("alice", "away").await;
    assert_eq!(count(&redis, "alice").await, 1);
}

/// The hash of an online user with one device and the default status holds
/// two fields: the device's and `seq`, which each refresh raises to its
/// time (it dates the last activity); with the event feed on (the default;
/// one Redis), also the window of its bound, `fs` and `fc`. Fails on
/// schema 3, which also kept `active`.
#[tokio::test]
async fn a_default_status_device_writes_only_its_field_and_seq() {
    let redis = Redis::start();
    let node = Node::start(&redis, "n1");
    let _phone = Client::connect(&node, "alice", "phone").await;
    let connected = presence_server::store::now_ms();
    let seq = || async {
        let mut c = redis.aconn().await;
        redis::cmd("HGET")
            .arg("presence-status:{alice}")
            .arg("seq")
            .query_async::<Option<i64>>(&mut c)
            .await
            .unwrap()
    };
    wait_until(
        "a refresh raises seq past the connect",
        DEADLINE,
        || async { seq().await > Some(connected + HEARTBEAT_MS as i64 / 3) },
    )
    .await;
    let mut c = redis.aconn().await;
    let mut fields: Vec<String> = redis::cmd("HKEYS")
        .arg("presence-status:{alice}")
        .query_async(&mut c)
        .await
        .unwrap();
    fields.sort();
    assert_eq!(fields, ["d:phone", "fc", "fs", "seq"]);
}
