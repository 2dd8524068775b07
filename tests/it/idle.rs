//! The idle mark (issue 41, "shown as idle to watchers"): a user whose
//! live devices are all paused is `"idle": true` in every record others are
//! shown of it, while its status stays what it chose. The mark flips when
//! the last active device pauses or leaves and when a device comes back
//! (a resume, or a new one); each flip is one `presence` frame for every
//! watcher, one `idle` event of the feed (and webhook), and nothing for a
//! viewer who may not see the user online.

use std::time::Duration;

use crate::common::*;
use crate::feed::drain;
use crate::pause::{frames_within, pause};
use serde_json::{json, Value};

/// `GET /api/presence/bob` with the admin key.
async fn bob(node: &Node) -> Value {
    let (status, body) = get_as(&format!("{}/api/presence/bob", node.http()), Some(ADMIN)).await;
    assert_eq!(status, 200, "{body}");
    body
}

/// The next frame of `c`, a `presence` of bob online with the idle mark
/// `idle` (absent when false).
async fn expect_bob(c: &mut Client, idle: bool) -> Value {
    let ev = c.expect_presence("bob", "online").await;
    assert_eq!(ev.get("idle").cloned(), idle.then_some(json!(true)), "{ev}");
    ev
}

/// bob on a phone and a web tab, alice watching him from another node:
/// pausing the phone shows nothing (the tab is active); closing the tab
/// leaves him idle; a new laptop brings him back, closing it leaves him
/// idle again, and the phone's resume brings him back. The HTTP read, the
/// device list and the feed agree.
#[tokio::test]
async fn a_user_whose_devices_are_all_paused_is_idle() {
    let redis = Redis::start();
    let flags = ["--admin-key", ADMIN];
    let n1 = Node::start_with(&redis, "n1", &flags);
    let n2 = Node::start_with(&redis, "n2", &flags);
    let mut alice = Client::connect(&n2, "alice", "web").await;
    alice.watch(&["bob"]).await;
    let mut phone = Client::connect(&n1, "bob", "phone").await;
    expect_bob(&mut alice, false).await;
    let web = Client::connect(&n2, "bob", "web").await;
    pause(&mut phone, None).await;
    let seen = frames_within(&mut alice, Duration::from_millis(500)).await;
    assert!(seen.is_empty(), "a tab is still active: {seen:?}");
    let read = bob(&n1).await;
    assert_eq!(read.get("idle"), None, "{read}");
    let paused: Vec<(&str, bool)> = read["device_list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| (d["device"].as_str().unwrap(), d["paused"] == true))
        .collect();
    assert_eq!(paused, [("phone", true), ("web", false)], "{read}");

    web.close().await;
    expect_bob(&mut alice, true).await;
    assert_eq!(bob(&n2).await["idle"], true);
    let laptop = Client::connect(&n1, "bob", "laptop").await;
    expect_bob(&mut alice, false).await;
    laptop.close().await;
    expect_bob(&mut alice, true).await;
    // A status set while idle: a status event without the mark.
    let body = json!({"status": "busy", "text": "x"});
    let (code, own) = crate::http_devices::put_status(&n1, "bob", &body, Some(ADMIN)).await;
    assert_eq!(code, 200, "{own}");
    let busy = alice.expect_presence("bob", "busy").await;
    assert_eq!(busy["idle"], true, "{busy}");
    let _phone = Client::connect(&n2, "bob", "phone").await;
    let back = alice.expect_presence("bob", "busy").await;
    assert_eq!(back.get("idle"), None, "{back}");
    assert_eq!(bob(&n1).await.get("idle"), None);

    // The feed: online, the flips each with the mark after it, the status
    // without it.
    wait_until("bob's flips in the feed", DEADLINE, || {
        let node = &n1;
        async move { drain(node, "", 100).await.0.len() >= 6 }
    })
    .await;
    let mut flips: Vec<(String, Option<bool>)> = Vec::new();
    for e in drain(&n1, "", 100).await.0 {
        if e["user"] == "bob" {
            let kind = e["type"].as_str().unwrap().to_string();
            flips.push((kind, e.get("idle").and_then(Value::as_bool)));
        }
    }
    let want = [
        ("online", None),
        ("idle", Some(true)),
        ("idle", Some(false)),
        ("idle", Some(true)),
        ("status", None),
        ("idle", Some(false)),
    ];
    let want: Vec<(String, Option<bool>)> = want.iter().map(|(k, i)| (k.to_string(), *i)).collect();
    assert_eq!(flips, want);
    // In the log itself: the status entry keeps the eight elements an older
    // node's parser takes (only flips, a kind it skips, have a ninth).
    let mut conn = redis.conn();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("presence-feed-log:*")
        .query(&mut conn)
        .unwrap();
    let mut records = Vec::new();
    for key in keys {
        let entries: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
            .arg(&key)
            .arg("-")
            .arg("+")
            .query(&mut conn)
            .unwrap();
        for (f, v) in entries.into_iter().flat_map(|(_, fields)| fields) {
            if f == "e" && v.contains("|s|") {
                let record: Value = serde_json::from_str(v.splitn(4, '|').nth(3).unwrap()).unwrap();
                records.push(record.as_array().unwrap().len());
            }
        }
    }
    assert_eq!(records, [8], "the status entry's record");
}

/// A user who is invisible, or who shows itself online to its contacts
/// only, flips idle unseen: a watcher who sees it offline is told nothing,
/// and an HTTP read shows it offline without the mark.
#[tokio::test]
async fn the_mark_goes_with_the_status() {
    let redis = Redis::start();
    let node = Node::start_with(&redis, "n1", &["--admin-key", ADMIN]);
    let mut alice = Client::connect(&node, "alice", "web").await;
    alice.watch(&["bob"]).await;
    let mut phone = Client::connect(&node, "bob", "phone").await;
    expect_bob(&mut alice, false).await;
    phone
        .send(json!({"type": "status", "status": "invisible"}))
        .await;
    alice.expect_presence("bob", "offline").await;
    phone.expect_presence("bob", "invisible").await;
    pause(&mut phone, None).await;
    let seen = frames_within(&mut alice, Duration::from_millis(500)).await;
    assert!(seen.is_empty(), "alice saw {seen:?}");
    let (status, read) = get_as(&format!("{}/api/presence/bob", node.http()), None).await;
    assert_eq!(status, 200, "{read}");
    assert_eq!(
        (read["status"].clone(), read.get("idle")),
        (json!("offline"), None)
    );
    // The service sees the truth.
    let truth = bob(&node).await;
    assert_eq!(
        (truth["status"].clone(), truth["idle"].clone()),
        (json!("invisible"), json!(true))
    );
}
