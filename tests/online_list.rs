//! `GET /api/online` over the bucketed `presence-online` index: a k-way
//! merge newest first, a cursor that survives shared scores, bounded work
//! per request; and the moves of older schemas' keys at start (schema-1
//! indexes into buckets, schema-2 device sets into the users' hashes).

mod common;

use std::collections::HashSet;

use common::*;
use serde_json::json;

/// Makes `n` users `<prefix>0..` online (lease, device set, counter) and
/// lists them in `presence-online` with `score` each.
async fn online_users(redis: &Redis, prefix: &str, n: usize, score: impl Fn(usize) -> i64) {
    let mut c = redis.aconn().await;
    presence_bench::fixture::live_leases(&mut c, prefix, n, "elsewhere 1 0", true)
        .await
        .unwrap();
    let mut pipe = redis::pipe();
    for i in 0..n {
        let user = format!("{prefix}{i}");
        pipe.cmd("ZADD")
            .arg(index_key("presence-online", &user))
            .arg(score(i))
            .arg(&user)
            .ignore();
    }
    pipe.query_async::<()>(&mut c).await.unwrap();
}

/// Every page of the online list from `base` with `limit`: (users, pages).
async fn walk(base: &str, limit: usize) -> (Vec<(String, i64)>, usize) {
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let url = match &cursor {
            Some(c) => format!("{base}/api/online?limit={limit}&cursor={c}"),
            None => format!("{base}/api/online?limit={limit}"),
        };
        let (status, page) = get(&url).await;
        assert_eq!(status, 200, "{page}");
        pages += 1;
        let users = page["users"].as_array().unwrap();
        assert!(users.len() <= limit);
        for u in users {
            seen.push((
                u["user"].as_str().unwrap().to_string(),
                u["active_at"].as_i64().unwrap(),
            ));
        }
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => return (seen, pages),
        }
        assert!(pages < 10_000, "the list never ends");
    }
}

#[tokio::test]
async fn pages_cover_every_user_once_even_when_scores_are_shared() {
    let redis = Redis::start();
    // 300 users, in runs of 50 sharing one score (a batch of refreshes
    // writes one time), spread over every bucket.
    online_users(&redis, "tie", 300, |i| 1_000_000 + (i / 50) as i64).await;
    let node = Node::start(&redis, "n1");
    for limit in [1, 7, 50, 1000] {
        let (seen, _) = walk(&node.http(), limit).await;
        let names: HashSet<&str> = seen.iter().map(|(u, _)| u.as_str()).collect();
        assert_eq!(seen.len(), 300, "limit {limit}: {} listed", seen.len());
        assert_eq!(names.len(), 300, "limit {limit}: a user listed twice");
        assert!(
            seen.windows(2).all(|w| w[0].1 >= w[1].1),
            "limit {limit}: not newest first"
        );
    }
}

#[tokio::test]
async fn a_viewer_who_sees_nobody_gets_short_pages_with_a_cursor() {
    let redis = Redis::start();
    online_users(&redis, "hidden", 1_000, |i| 2_000_000 + i as i64).await;
    // Watch policy `contacts`: an anonymous reader sees no one online.
    let node = Node::start_with(&redis, "n1", &["--watch-policy", "contacts"]);
    let (seen, pages) = walk(&node.http(), 10).await;
    assert!(seen.is_empty(), "{seen:?}");
    // Each request examines at most 4 x limit entries, and hands back a
    // cursor to go on from even when its page is empty.
    assert_eq!(pages, 1_000 / 40, "pages walked");
}

#[tokio::test]
async fn schema_1_indexes_move_into_buckets_at_start() {
    let redis = Redis::start();
    let mut c = redis.aconn().await;
    presence_bench::fixture::live_leases(&mut c, "old", 50, "elsewhere 1 0", false)
        .await
        .unwrap();
    let mut pipe = redis::pipe();
    for i in 0..50 {
        let user = format!("old{i}");
        pipe.cmd("ZADD")
            .arg("presence-online")
            .arg(3_000_000 + i)
            .arg(&user)
            .ignore();
        pipe.cmd("ZADD")
            .arg("presence-leases")
            .arg(4_000_000_000_000i64)
            .arg(format!("{user}:d"))
            .ignore();
        pipe.cmd("ZADD")
            .arg("presence-lastseen")
            .arg(1_000 + i)
            .arg(format!("gone{i}"))
            .ignore();
    }
    pipe.query_async::<()>(&mut c).await.unwrap();

    let node = Node::start(&redis, "n1");
    for old in ["presence-online", "presence-leases", "presence-lastseen"] {
        let exists: i64 = redis::cmd("EXISTS")
            .arg(old)
            .query_async(&mut c)
            .await
            .unwrap();
        assert_eq!(exists, 0, "{old} still there");
    }
    assert_eq!(index_members(&redis, "presence-online").await.len(), 50);
    assert_eq!(index_members(&redis, "presence-leases").await.len(), 50);
    assert_eq!(index_members(&redis, "presence-lastseen").await.len(), 50);
    let meta: Vec<String> = redis::cmd("HMGET")
        .arg("presence-meta")
        .arg("buckets")
        .arg("schema")
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(meta, ["16", "3"]);
    let (seen, _) = walk(&node.http(), 20).await;
    assert_eq!(seen.len(), 50);
    assert_eq!(seen[0].0, "old49");
}

#[tokio::test]
async fn schema_2_device_sets_move_into_the_users_hashes_at_start() {
    let redis = Redis::start();
    let mut c = redis.aconn().await;
    // A schema-2 deployment: each user's devices in a set of their own.
    let mut pipe = redis::pipe();
    pipe.cmd("HSET")
        .arg("presence-meta")
        .arg("buckets")
        .arg(16)
        .arg("schema")
        .arg(2)
        .ignore();
    for i in 0..30 {
        let user = format!("old{i}");
        let devices: &[&str] = if i == 0 { &["d", "tab"] } else { &["d"] };
        for device in devices {
            pipe.cmd("SET")
                .arg(format!("presence:{{{user}}}:{device}"))
                .arg("elsewhere 1 0")
                .arg("PX")
                .arg(600_000)
                .ignore();
        }
        pipe.cmd("SADD")
            .arg(format!("presence-devices:{{{user}}}"))
            .arg(devices)
            .ignore();
        pipe.cmd("SET")
            .arg(format!("presence-count:{{{user}}}"))
            .arg(devices.len())
            .ignore();
        pipe.cmd("HSET")
            .arg(format!("presence-status:{{{user}}}"))
            .arg("status")
            .arg("busy")
            .arg("since")
            .arg(1)
            .ignore();
    }
    pipe.query_async::<()>(&mut c).await.unwrap();

    let node = Node::start(&redis, "n1");
    let sets: Vec<String> = redis::cmd("KEYS")
        .arg("presence-devices:*")
        .query_async(&mut c)
        .await
        .unwrap();
    assert!(sets.is_empty(), "{sets:?}");
    let schema: String = redis::cmd("HGET")
        .arg("presence-meta")
        .arg("schema")
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(schema, "3");
    let mut fields: Vec<String> = redis::cmd("HKEYS")
        .arg("presence-status:{old0}")
        .query_async(&mut c)
        .await
        .unwrap();
    fields.sort();
    assert_eq!(fields, ["d:d", "d:tab", "since", "status"]);
    let (_, old0) = get(&format!("{}/api/presence/old0", node.http())).await;
    assert_eq!(
        (&old0["status"], &old0["devices"]),
        (&json!("busy"), &json!(2))
    );
    assert_eq!(
        old0["device_list"].as_array().map(Vec::len),
        Some(2),
        "{old0}"
    );

    // The moved devices are the ones the steps count: taking one over and
    // closing it uncounts it, once.
    let tab = Client::connect(&node, "old0", "tab").await;
    assert_eq!(count(&redis, "old0").await, 2);
    tab.close().await;
    wait_until("old0's tab uncounted", DEADLINE, || async {
        count(&redis, "old0").await == 1
    })
    .await;
    let (_, old0) = get(&format!("{}/api/presence/old0", node.http())).await;
    assert_eq!(
        (&old0["status"], &old0["devices"]),
        (&json!("busy"), &json!(1))
    );
}

#[tokio::test]
async fn a_viewer_who_sees_some_gets_every_visible_user_once() {
    let redis = Redis::start();
    online_users(&redis, "mix", 300, |i| 5_000_000 + (i / 20) as i64).await;
    // Two of every three hide their online status from everyone.
    let mut c = redis.aconn().await;
    let mut pipe = redis::pipe();
    for i in (0..300).filter(|i| i % 3 != 0) {
        pipe.cmd("HSET")
            .arg(format!("presence-status:{{mix{i}}}"))
            .arg("show_online")
            .arg("nobody")
            .ignore();
    }
    pipe.query_async::<()>(&mut c).await.unwrap();
    let node = Node::start(&redis, "n1");
    for limit in [1, 7, 50] {
        let (seen, _) = walk(&node.http(), limit).await;
        let mut names: Vec<&str> = seen.iter().map(|(u, _)| u.as_str()).collect();
        assert!(seen.windows(2).all(|w| w[0].1 >= w[1].1), "limit {limit}");
        names.sort();
        let mut want: Vec<String> = (0..300)
            .filter(|i| i % 3 == 0)
            .map(|i| format!("mix{i}"))
            .collect();
        want.sort();
        assert_eq!(names, want, "limit {limit}");
    }
}
