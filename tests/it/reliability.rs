//! Faults: Redis restarts, missed expired events (design invariant 4).

use std::time::{Duration, Instant};

use crate::common::*;
use serde_json::json;

async fn healthz(node: &Node) -> u16 {
    match reqwest::get(format!("{}/healthz", node.http())).await {
        Ok(r) => r.status().as_u16(),
        Err(_) => 0,
    }
}

/// Redis restarts empty: live sessions re-assert lease, count and status
/// within a heartbeat, watchers see no flicker, and a device that closed
/// while Redis was away is announced offline once (no ghost).
#[tokio::test]
async fn redis_restart_with_empty_data() {
    let mut redis = Redis::start();
    let a = Node::start(&redis, "a");
    let b = Node::start(&redis, "b");
    let mut w = Client::connect(&b, "watcher", "w").await;
    w.watch(&["alice", "bob", "carol"]).await;

    let mut alice = Client::connect(&a, "alice", "phone").await;
    assert_eq!(w.expect("presence").await["status"], "online");
    alice
        .send(json!({"type":"status","status":"busy","text":"focus"}))
        .await;
    assert_eq!(w.expect("presence").await["status"], "busy");
    let mut bob = Client::connect(&b, "bob", "laptop").await;
    assert_eq!(w.expect("presence").await["user"], "bob");
    let carol = Client::connect(&a, "carol", "tab").await;
    assert_eq!(w.expect("presence").await["user"], "carol");

    redis.kill();
    wait_until("healthz reports redis down", DEADLINE, || async {
        healthz(&a).await == 503
    })
    .await;
    // Carol leaves while Redis is away; sessions themselves stay open.
    carol.close().await;
    redis.restart_empty();
    let restarted = Instant::now();
    wait_until("healthz recovers", DEADLINE, || async {
        healthz(&a).await == 200 && healthz(&b).await == 200
    })
    .await;

    wait_until(
        "leases, counters and status re-asserted",
        DEADLINE,
        || async {
            let mut c = redis.aconn().await;
            let alice_status: Option<String> = redis::cmd("HGET")
                .arg("presence-status:{alice}")
                .arg("status")
                .query_async(&mut c)
                .await
                .unwrap();
            count(&redis, "alice").await == 1
                && count(&redis, "bob").await == 1
                && alice_status.as_deref() == Some("busy")
        },
    )
    .await;
    let took = restarted.elapsed();
    println!("re-asserted {took:?} after the restart (heartbeat {HEARTBEAT_MS} ms)");
    assert!(
        took <= Duration::from_millis(HEARTBEAT_MS + 500),
        "re-assert took {took:?}"
    );
    assert_eq!(count(&redis, "carol").await, 0, "carol is a ghost");

    // The next frame is carol's offline (from the resync): nothing for
    // alice or bob, whose leases were re-asserted without a flicker.
    w.expect_presence("carol", "offline").await;
    bob.send(json!({"type":"status","status":"away"})).await;
    w.expect_presence("bob", "away").await;

    // A new watcher sees the repaired truth, alice's status included.
    let mut late = Client::connect(&a, "late", "w").await;
    let snap = late.watch(&["alice", "bob", "carol"]).await;
    let got: Vec<(&str, &str)> = snap
        .iter()
        .map(|r| (r["user"].as_str().unwrap(), r["status"].as_str().unwrap()))
        .collect();
    assert_eq!(
        got,
        [("alice", "busy"), ("bob", "away"), ("carol", "offline")]
    );
    assert_eq!(snap[0]["text"], "focus");
    alice.send(json!({"type":"heartbeat"})).await;
}

/// Redis restarts empty: the re-asserted device's field and lease name its
/// node's run again, and the node writes its run record back, so the device
/// detail names the node again (here within the renewal, which follows the
/// reconciliation interval).
#[tokio::test]
async fn after_an_empty_restart_the_device_detail_names_the_node_again() {
    let mut redis = Redis::start();
    let a = Node::start_with(&redis, "a", &["--reconcile-interval-ms", "1000"]);
    let _phone = Client::connect(&a, "alice", "phone").await;
    assert_eq!(
        lease_node(&redis, "alice", "phone").await.as_deref(),
        Some("a")
    );
    redis.restart_empty();
    wait_until("the phone's node known again", DEADLINE, || async {
        lease_node(&redis, "alice", "phone").await.as_deref() == Some("a")
    })
    .await;
    let (_, body) = get(&format!("{}/api/presence/alice", a.http())).await;
    assert_eq!(body["device_list"][0]["node"], "a", "{body}");
}

/// Expired events missed (notifications off, and the deadline index lost
/// the lease): the reconciliation pass repairs the counter and emits the
/// missing offline once.
#[tokio::test]
async fn missed_expired_events_are_repaired_by_reconciliation() {
    let redis = Redis::start();
    let mut a = Node::start_with(&redis, "a", &["--reconcile-interval-ms", "1000"]);
    let b = Node::start_with(&redis, "b", &["--reconcile-interval-ms", "1000"]);
    let mut w = Client::connect(&b, "watcher", "w").await;
    w.watch(&["alice"]).await;
    let _phone = Client::connect(&a, "alice", "phone").await;
    assert_eq!(w.expect("presence").await["status"], "online");

    let mut c = redis.aconn().await;
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("notify-keyspace-events")
        .arg("")
        .query_async(&mut c)
        .await
        .unwrap();
    a.kill();
    let _: i64 = redis::cmd("ZREM")
        .arg(index_key("presence-leases", "alice"))
        .arg("alice:phone")
        .query_async(&mut c)
        .await
        .unwrap();

    let ev = w.expect_presence("alice", "offline").await;
    assert!(ev["last_seen"].as_i64().is_some());
    assert_eq!(count(&redis, "alice").await, 0);
    let fields: Vec<String> = redis::cmd("HKEYS")
        .arg("presence-status:{alice}")
        .query_async(&mut c)
        .await
        .unwrap();
    assert!(!fields.iter().any(|f| f.starts_with("d:")), "{fields:?}");
    b.wait_log("reconciliation repaired alice").await;
    let (_, health) = get(&format!("{}/healthz", b.http())).await;
    assert_eq!(health["counters"]["reconcile_repairs"], 1, "{health}");

    // Exactly once: alice's next arrival is the next thing the watcher
    // hears about her.
    let _alice_again = Client::connect(&b, "alice", "laptop").await;
    w.expect_presence("alice", "online").await;
}

/// Redis comes back empty while a user is invisible and hides its last
/// seen: its sessions re-assert those choices with the lease, so nobody
/// sees it flash online.
#[tokio::test]
async fn hidden_users_stay_hidden_when_redis_comes_back_empty() {
    let mut redis = Redis::start();
    let node = Node::start(&redis, "n1");
    let mut w = Client::connect(&node, "watcher", "w").await;
    w.watch(&["alice", "bob"]).await;
    let mut alice = Client::connect(&node, "alice", "phone").await;
    assert_eq!(w.expect("presence").await["status"], "online");
    alice
        .send(json!({"type":"privacy","online":"nobody","last_seen":"nobody"}))
        .await;
    alice
        .send(json!({"type":"status","status":"invisible"}))
        .await;
    // The node has the answer: it knows the status it is to re-assert.
    // (Stored alone is not enough: Redis may go away with the reply, and
    // then the node cannot know whether the change was made.)
    let own = alice.expect("presence").await;
    assert_eq!(own["status"], "invisible", "{own}");
    w.expect_presence("alice", "offline").await;
    let mut bob = Client::connect(&node, "bob", "laptop").await;
    assert_eq!(w.expect("presence").await["user"], "bob");

    // Stored before Redis goes away.
    wait_until("invisible stored", DEADLINE, || async {
        let mut c = redis.aconn().await;
        let st: Option<String> = redis::cmd("HGET")
            .arg("presence-status:{alice}")
            .arg("status")
            .query_async(&mut c)
            .await
            .unwrap();
        st.as_deref() == Some("invisible")
    })
    .await;
    redis.restart_empty();
    wait_until("alice's choices re-asserted", DEADLINE, || async {
        let mut c = redis.aconn().await;
        let h: (Option<String>, Option<String>, Option<String>) = redis::cmd("HMGET")
            .arg("presence-status:{alice}")
            .arg(&["status", "show_online", "show_last_seen"])
            .query_async(&mut c)
            .await
            .unwrap_or((None, None, None));
        h == (
            Some("invisible".into()),
            Some("nobody".into()),
            Some("nobody".into()),
        ) && count(&redis, "alice").await == 1
    })
    .await;
    // After the resync delay, the next thing the watcher hears is bob's
    // status change: alice never flashed online.
    wait_until("bob re-asserted", DEADLINE, || async {
        count(&redis, "bob").await == 1
    })
    .await;
    wait_until(
        "the registry re-read its watched users",
        DEADLINE,
        || async {
            get(&format!("{}/healthz", node.http())).await.1["registry"]["resynced"]
                .as_u64()
                .is_some_and(|n| n > 0)
        },
    )
    .await;
    bob.send(json!({"type":"status","status":"away"})).await;
    w.expect_presence("bob", "away").await;
    let (_, rec) = get(&format!("{}/api/presence/alice", node.http())).await;
    assert_eq!(
        (rec["status"].as_str(), rec["last_seen"].is_null()),
        (Some("offline"), true),
        "{rec}"
    );
}

/// A watch whose subscription or snapshot Redis does not answer in time
/// (here: every command held for 6 s, past the node's 5 s response
/// timeout) is tried again by the node, not refused: the client gets its
/// snapshot once Redis goes on, and no `unavailable`.
#[tokio::test]
async fn a_snapshot_redis_was_too_slow_for_is_tried_again() {
    let redis = Redis::start();
    let node = Node::start(&redis, "a");
    let _bob = Client::connect(&node, "bob", "b").await;
    let mut alice = Client::connect(&node, "alice", "a").await;
    let mut c = redis.aconn().await;
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(6_000)
        .arg("ALL")
        .query_async(&mut c)
        .await
        .unwrap();
    let asked = Instant::now();
    alice.send(json!({"type": "watch", "users": ["bob"]})).await;
    let deadline = Duration::from_secs(15);
    loop {
        let frame = match alice
            .next_within(deadline.saturating_sub(asked.elapsed()))
            .await
        {
            Some(Incoming::Frame(f)) => f,
            other => panic!(
                "no snapshot within {deadline:?}: {other:?}\n{}",
                node.logs()
            ),
        };
        assert_ne!(frame["type"], "error", "{frame}");
        if frame["type"] == "snapshot" {
            assert_eq!(frame["presence"][0]["status"], "online", "{frame}");
            break;
        }
    }
    assert!(
        asked.elapsed() >= Duration::from_secs(5),
        "Redis was paused"
    );
    assert!(
        node.logs().contains("timed out; trying again in 250ms"),
        "the first try timed out: {}",
        node.logs()
    );
}
