//! Issue 28 on a real Redis Cluster: HTTP devices, statuses that end and
//! the recently seen, with users on every shard (their keys, due entries
//! and last-seen buckets spread over the slots).

use std::time::{Duration, Instant};

use super::*;
use crate::common::cluster::Cluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_devices_statuses_that_end_and_recently_seen_on_every_shard() {
    let cluster = Cluster::start();
    let a = cluster.node("a");
    let mut b = cluster.node("b");
    let users: Vec<String> = cluster
        .shards()
        .iter()
        .enumerate()
        .map(|(i, shard)| cluster.user_on(shard, &format!("h{i}x")))
        .collect();
    let names: Vec<&str> = users.iter().map(String::as_str).collect();
    let mut watcher = Client::connect(&a, "watcher", "w").await;
    watcher.watch(&names).await;

    // Each user online through an HTTP device, with its kind.
    for user in &users {
        let (code, body) = heartbeat(&a, user, "hb", "tablet").await;
        assert_eq!(code, 200, "{body}");
        let ev = watcher.expect_presence(user, "online").await;
        assert_eq!(ev["kinds"], json!(["tablet"]));
    }
    // Statuses that end, set on node B, which then dies.
    let until = now() + 2_500;
    for user in &users {
        let body = json!({"status": "busy", "text": "call", "until": until});
        let (code, own) = put_status(&b, user, &body, None).await;
        assert_eq!((code, own["until"].as_i64()), (200, Some(until)), "{own}");
        watcher.expect_presence(user, "busy").await;
    }
    b.kill();
    // Kept online meanwhile through node A.
    let mut beats = 0;
    let mut reset: Vec<String> = Vec::new();
    let deadline = Instant::now() + Duration::from_millis((until - now()).max(0) as u64 + 2_000);
    while reset.len() < users.len() {
        assert!(
            Instant::now() < deadline,
            "resets by until + 2 s: {reset:?}"
        );
        for user in &users {
            assert_eq!(heartbeat(&a, user, "hb", "tablet").await.0, 200);
        }
        beats += 1;
        while let Some(Incoming::Frame(ev)) = watcher.next_within(Duration::from_millis(50)).await {
            assert_eq!(ev["status"], "online", "{ev}");
            assert!(ev["until"].is_null() && ev["text"].is_null(), "{ev}");
            assert!(now() >= until - 50, "early: {ev}");
            let user = ev["user"].as_str().unwrap().to_string();
            assert!(!reset.contains(&user), "a second reset of {user}");
            reset.push(user);
        }
    }
    assert!(beats > 1);
    assert!(index_members_on(&cluster, &users).await.is_empty());

    // They leave in order; the recently seen list them newest first.
    for user in &users {
        assert_eq!(leave(&a, user, "hb", None).await.0, 204);
        watcher.expect_presence(user, "offline").await;
        let before = now();
        wait_until("the clock moves on", DEADLINE, || async {
            now() > before + 2
        })
        .await;
    }
    let (code, body) = get(&format!(
        "{}/api/online?seen_within_ms=600000&limit=50&viewer=x",
        a.http()
    ))
    .await;
    assert_eq!(code, 200, "{body}");
    let listed: Vec<&str> = body["users"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|u| u["user"].as_str())
        .filter(|u| names.contains(u))
        .collect();
    let mut newest_first = names.clone();
    newest_first.reverse();
    assert_eq!(listed, newest_first, "{body}");
}

/// The users of `users` still in the due index of statuses that end.
async fn index_members_on(cluster: &Cluster, users: &[String]) -> Vec<String> {
    let mut left = Vec::new();
    for user in users {
        let key = index_key("presence-until", user);
        let shard = cluster.shard_of(&key);
        let mut c = cluster.conn(shard.primary);
        let score: Option<f64> = redis::cmd("ZSCORE")
            .arg(&key)
            .arg(user)
            .query(&mut c)
            .unwrap();
        if score.is_some() {
            left.push(user.clone());
        }
    }
    left
}
