//! Statuses that end: the reset is announced once in the fleet even when
//! the node that set the status is SIGKILLed, it survives a Redis restart,
//! and `until` and `kinds` are hidden exactly when the status is.

use std::time::{Duration, Instant};

use super::*;

/// Keeps heartbeating `user`'s HTTP `device` through `node` until aborted.
fn keep_beating(node: &Node, user: &str, device: &str) -> tokio::task::JoinHandle<()> {
    let url = format!(
        "{}/api/users/{user}/devices/{device}/heartbeat?kind=bot",
        node.http()
    );
    tokio::spawn(async move {
        loop {
            let (code, body) = post(&url, &json!({})).await;
            assert_eq!(code, 200, "{body}");
            tokio::time::sleep(Duration::from_millis(HEARTBEAT_MS / 2)).await;
        }
    })
}

/// The next `presence` frame of `user` that `c` gets before `deadline`.
async fn next_presence(c: &mut Client, user: &str, deadline: Instant) -> Option<Value> {
    loop {
        let left = deadline.checked_duration_since(Instant::now())?;
        match c.next_within(left).await {
            Some(Incoming::Frame(f)) if f["type"] == "presence" && f["user"] == user => {
                return Some(f)
            }
            Some(Incoming::Frame(_)) => continue,
            _ => return None,
        }
    }
}

/// Three nodes; alice keeps an HTTP device (through node B) and sets a
/// status with `until` from a socket on node A, which is then SIGKILLed.
/// At `until` every watcher, on B and on C, gets exactly one reset (back
/// to `online`, text and until cleared), and Redis keeps nothing of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_ends_once_in_the_fleet_when_its_node_is_killed() {
    let redis = Redis::start();
    let mut a = Node::start(&redis, "a");
    let b = Node::start(&redis, "b");
    let c = Node::start(&redis, "c");
    let beating = keep_beating(&b, "alice", "hb");
    let mut wb = Client::connect(&b, "wb", "w").await;
    let mut wc = Client::connect(&c, "wc", "w").await;
    wait_until("alice online", DEADLINE, || async {
        count(&redis, "alice").await == 1
    })
    .await;
    assert_eq!(wb.watch(&["alice"]).await[0]["status"], "online");
    assert_eq!(wc.watch(&["alice"]).await[0]["status"], "online");

    let mut desk = Client::connect(&a, "alice", "desk").await;
    let until = now() + 2_500;
    desk.send(json!({"type": "status", "status": "busy", "text": "meeting", "until": until}))
        .await;
    let own = desk.expect("presence").await;
    assert_eq!(
        (own["status"].as_str(), own["until"].as_i64()),
        (Some("busy"), Some(until))
    );
    for w in [&mut wb, &mut wc] {
        let ev = w.expect_presence("alice", "busy").await;
        assert_eq!(
            (ev["text"].as_str(), ev["until"].as_i64()),
            (Some("meeting"), Some(until))
        );
    }
    a.kill();

    for w in [&mut wb, &mut wc] {
        let deadline =
            Instant::now() + Duration::from_millis((until - now()).max(0) as u64 + 1_500);
        let ev = next_presence(w, "alice", deadline)
            .await
            .unwrap_or_else(|| panic!("{}: no reset by until + 1.5 s", w.user));
        let at = now();
        assert_eq!(ev["status"], "online", "{ev}");
        assert!(ev["text"].is_null() && ev["until"].is_null(), "{ev}");
        assert!(at >= until - 50, "reset {}ms early", until - at);
        assert_eq!(ev["kinds"], json!(["bot"]), "{ev}");
    }
    // Exactly once: nothing more of alice on either watcher.
    let quiet = Instant::now() + Duration::from_millis(1_500);
    for w in [&mut wb, &mut wc] {
        if let Some(ev) = next_presence(w, "alice", quiet).await {
            panic!("{}: a second announcement: {ev}", w.user);
        }
    }
    // One node of the fleet ran the reset.
    let ended = metric(&b, "presence_statuses_ended_total").await
        + metric(&c, "presence_statuses_ended_total").await;
    assert_eq!(ended, 1.0);
    assert!(metric(&b, "presence_http_heartbeats_total").await >= 1.0);
    let mut r = redis.aconn().await;
    let (status, text, left): (Option<String>, Option<String>, Option<String>) =
        redis::cmd("HMGET")
            .arg("presence-status:{alice}")
            .arg("status")
            .arg("text")
            .arg("until")
            .query_async(&mut r)
            .await
            .unwrap();
    assert_eq!(
        (status.as_deref(), text, left),
        (Some("online"), None, None)
    );
    assert!(index_members(&redis, "presence-until").await.is_empty());
    beating.abort();
}

/// A status with `until` set before Redis restarts empty: the session
/// re-asserts it and its end goes back into the due index with it (not a
/// reconciliation later: the default pass is a minute away), and at
/// `until` it is reset and announced, within a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_until_survives_a_redis_restart() {
    let mut redis = Redis::start();
    let node = Node::start(&redis, "n1");
    let mut watcher = Client::connect(&node, "watcher", "w").await;
    watcher.watch(&["alice"]).await;
    let mut alice = Client::connect(&node, "alice", "phone").await;
    watcher.expect_presence("alice", "online").await;
    let until = now() + 4_000;
    alice
        .send(json!({"type": "status", "status": "away", "text": "lunch", "until": until}))
        .await;
    alice.expect("presence").await;
    watcher.expect_presence("alice", "away").await;

    redis.restart_empty();
    // The session's next refresh puts the status back, with its end...
    wait_until(
        "the status re-asserted with its until",
        DEADLINE,
        || async {
            let mut c = redis.aconn().await;
            let u: Option<i64> = redis::cmd("HGET")
                .arg("presence-status:{alice}")
                .arg("until")
                .query_async(&mut c)
                .await
                .unwrap_or(None);
            u == Some(until)
        },
    )
    .await;
    // ...and its due entry.
    wait_until("the until re-indexed", DEADLINE, || async {
        index_members(&redis, "presence-until").await == ["alice"]
    })
    .await;
    assert!(
        now() < until,
        "the test was too slow to see the re-index first"
    );
    let deadline = Instant::now() + Duration::from_millis((until - now()).max(0) as u64 + 1_000);
    loop {
        let ev = next_presence(&mut watcher, "alice", deadline)
            .await
            .expect("the reset by until + 1 s");
        if ev["status"] == "online" && ev["until"].is_null() {
            assert!(now() >= until - 50);
            assert!(ev["text"].is_null(), "{ev}");
            break;
        }
        // Re-announcements of `away` after the restart may come first.
        assert_eq!(ev["status"], "away", "{ev}");
    }
    assert!(index_members(&redis, "presence-until").await.is_empty());
}

/// `until` and `kinds` follow the status: shown to whoever sees the user
/// online (contacts here), hidden from the others and for an invisible
/// user, on reads, snapshots, events and the online list; the owner sees
/// them always.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn until_and_kinds_are_hidden_exactly_when_the_status_is() {
    let redis = Redis::start();
    let node = Node::start_with(&redis, "n1", &["--admin-key", ADMIN]);
    let http = reqwest::Client::new();
    let r = http
        .put(format!("{}/api/users/alice/contacts", node.http()))
        .bearer_auth(ADMIN)
        .json(&json!({"contacts": ["carol"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let r = http
        .put(format!("{}/api/users/alice/privacy", node.http()))
        .json(&json!({"online": "contacts"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 204);
    let mut carol = Client::connect(&node, "carol", "c").await;
    carol.watch(&["alice"]).await;

    let url = format!("{}&kind=web", node.ws_url("alice", "tab"));
    let mut tab = Client::connect_raw(&url, "alice", "tab").await.unwrap();
    tab.expect("hello").await;
    assert_eq!(heartbeat(&node, "alice", "phone", "mobile").await.0, 200);
    let until = now() + 60_000;
    let (code, own) = put_status(
        &node,
        "alice",
        &json!({"status": "busy", "text": "call", "until": until}),
        None,
    )
    .await;
    assert_eq!(code, 200, "{own}");
    let ev = loop {
        let ev = carol.expect("presence").await;
        if ev["status"] == "busy" {
            break ev;
        }
    };
    assert_eq!(ev["until"], until);
    assert_eq!(ev["kinds"], json!(["mobile", "web"]));

    let shown = |v: &Value| (v["status"].clone(), v["until"].clone(), v["kinds"].clone());
    let visible = (json!("busy"), json!(until), json!(["mobile", "web"]));
    let hidden = (json!("offline"), Value::Null, json!([]));
    assert_eq!(shown(&presence_as(&node, "alice", "carol").await), visible);
    assert_eq!(shown(&presence_as(&node, "alice", "alice").await), visible);
    assert_eq!(shown(&presence_as(&node, "alice", "bob").await), hidden);
    let mut bob2 = Client::connect(&node, "bob", "b2").await;
    assert_eq!(shown(&bob2.watch(&["alice"]).await[0]), hidden);
    let list = |viewer: &'static str| {
        let url = format!("{}/api/online?viewer={viewer}", node.http());
        async move { get(&url).await.1["users"].clone() }
    };
    let carol_list = list("carol").await;
    let alice_entry = carol_list
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["user"] == "alice")
        .expect("alice listed for carol")
        .clone();
    assert_eq!(shown(&alice_entry), visible);
    assert!(!list("bob")
        .await
        .as_array()
        .unwrap()
        .iter()
        .any(|u| u["user"] == "alice"));

    // Invisible with an end: hidden from carol too; the owner sees it.
    tab.send(json!({"type": "status", "status": "invisible", "until": until}))
        .await;
    let own = tab.expect("presence").await;
    assert_eq!(
        (own["status"].clone(), own["until"].clone()),
        (json!("invisible"), json!(until))
    );
    let ev = loop {
        let ev = carol.expect("presence").await;
        if ev["status"] == "offline" {
            break ev;
        }
    };
    assert_eq!(shown(&ev), hidden);
    assert_eq!(shown(&presence_as(&node, "alice", "carol").await), hidden);
    let mine = presence_as(&node, "alice", "alice").await;
    assert_eq!(
        shown(&mine),
        (json!("invisible"), json!(until), json!(["mobile", "web"]))
    );
}

/// An invisible user who left keeps, for everyone else, the moment it went
/// invisible as its last seen: also once its status ends (or is replaced)
/// while it is offline, which must not reveal when it really left.
#[tokio::test]
async fn an_invisible_users_departure_stays_hidden_after_its_status_ends() {
    let redis = Redis::start();
    let node = Node::start(&redis, "n1");
    assert_eq!(heartbeat(&node, "bob", "d", "web").await.0, 200);
    let until = now() + 1_500;
    let body = json!({"status": "invisible", "until": until});
    assert_eq!(put_status(&node, "bob", &body, None).await.0, 200);
    let went_invisible = presence_as(&node, "bob", "x").await["last_seen"]
        .as_i64()
        .expect("shown a last seen while invisible");
    let later = now();
    wait_until("the clock moves on", DEADLINE, || async {
        now() > later + 20
    })
    .await;
    assert_eq!(leave(&node, "bob", "d", None).await.0, 204);
    assert_eq!(
        presence_as(&node, "bob", "x").await["last_seen"],
        went_invisible
    );
    // The status ends at `until`, bob offline all along.
    wait_until("bob's status ended", DEADLINE, || async {
        presence_as(&node, "bob", "bob").await["until"].is_null()
    })
    .await;
    let seen = presence_as(&node, "bob", "x").await;
    assert_eq!(seen["last_seen"], went_invisible, "{seen}");
    // The same for a status replaced while offline.
    assert_eq!(heartbeat(&node, "eve", "d", "web").await.0, 200);
    let body = json!({"status": "invisible"});
    assert_eq!(put_status(&node, "eve", &body, None).await.0, 200);
    let went_invisible = presence_as(&node, "eve", "x").await["last_seen"].clone();
    let later = now();
    wait_until("the clock moves on", DEADLINE, || async {
        now() > later + 20
    })
    .await;
    assert_eq!(leave(&node, "eve", "d", None).await.0, 204);
    let body = json!({"status": "away"});
    assert_eq!(put_status(&node, "eve", &body, None).await.0, 200);
    assert_eq!(
        presence_as(&node, "eve", "x").await["last_seen"],
        went_invisible
    );
}
