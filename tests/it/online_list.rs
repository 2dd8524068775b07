//! `GET /api/online` over the bucketed `presence-leases` index (one entry
//! per device, its lease deadline): a k-way merge newest first, each user
//! once however many devices it has, a cursor that survives shared scores,
//! bounded work per request; and the moves of older schemas' keys at start
//! (schema-1 indexes into buckets, schema-2 device sets into the users'
//! hashes, schema 3's online index deleted).

use std::collections::{HashMap, HashSet};

use crate::common::*;
use serde_json::json;

/// Where the tests' deadlines start: five minutes ahead (their leases live
/// ten), so that no deadline pass touches them while a test runs.
fn deadline_base() -> i64 {
    presence_server::store::now_ms() + 300_000
}

/// Makes `n` users `<prefix>0..` online (lease, device field, counter) and
/// writes their device `d`'s deadline as `deadline_base() + offset(i)`.
async fn online_users(redis: &Redis, prefix: &str, n: usize, offset: impl Fn(usize) -> i64) {
    let mut c = redis.aconn().await;
    presence_bench::fixture::live_leases(&mut c, prefix, n, "elsewhere 1 0", false)
        .await
        .unwrap();
    let base = deadline_base();
    let mut pipe = redis::pipe();
    for i in 0..n {
        let user = format!("{prefix}{i}");
        pipe.cmd("ZADD")
            .arg(index_key("presence-leases", &user))
            .arg(base + offset(i))
            .arg(format!("{user}:d"))
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
    online_users(&redis, "tie", 300, |i| (i / 50) as i64).await;
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
    online_users(&redis, "hidden", 1_000, |i| i as i64).await;
    // Watch policy `contacts`: an anonymous reader sees no one online.
    let node = Node::start_with(&redis, "n1", &["--watch-policy", "contacts"]);
    let (seen, pages) = walk(&node.http(), 10).await;
    assert!(seen.is_empty(), "{seen:?}");
    // Each request examines at most 4 x limit entries, and hands back a
    // cursor to go on from even when its page is empty.
    assert_eq!(pages, 1_000 / 40, "pages walked");
}

/// The key schema this version writes to `presence-meta`.
const SCHEMA: &str = "5";

/// Marks the deployment in `redis` as one of key schema `schema` with the
/// default 16 buckets, as an older version left it.
async fn old_deployment(redis: &Redis, schema: u32) {
    redis::cmd("HSET")
        .arg("presence-meta")
        .arg("buckets")
        .arg(16)
        .arg("schema")
        .arg(schema)
        .query_async::<()>(&mut redis.aconn().await)
        .await
        .unwrap();
}

/// The key schema the deployment in `redis` is marked with.
async fn schema(redis: &Redis) -> String {
    redis::cmd("HGET")
        .arg("presence-meta")
        .arg("schema")
        .query_async(&mut redis.aconn().await)
        .await
        .unwrap()
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
    // Schema 4 lists who is online from the deadlines: no online index.
    assert!(index_members(&redis, "presence-online").await.is_empty());
    assert_eq!(index_members(&redis, "presence-leases").await.len(), 50);
    assert_eq!(index_members(&redis, "presence-lastseen").await.len(), 50);
    let meta: Vec<String> = redis::cmd("HMGET")
        .arg("presence-meta")
        .arg("buckets")
        .arg("schema")
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(meta, ["16", SCHEMA]);
    let (seen, _) = walk(&node.http(), 20).await;
    let names: HashSet<&str> = seen.iter().map(|(u, _)| u.as_str()).collect();
    assert_eq!((seen.len(), names.len()), (50, 50), "{seen:?}");
}

#[tokio::test]
async fn schema_2_device_sets_move_into_the_users_hashes_at_start() {
    let redis = Redis::start();
    let mut c = redis.aconn().await;
    // A schema-2 deployment: each user's devices in a set of their own.
    old_deployment(&redis, 2).await;
    let mut pipe = redis::pipe();
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
    assert_eq!(schema(&redis).await, SCHEMA);
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
    online_users(&redis, "mix", 300, |i| (i / 20) as i64).await;
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

/// Writes `user` online with `devices` as the nodes would: for each
/// (device, deadline), a lease, the device's field and its deadline entry;
/// then the counter. `extra` entries go into the index alone (a claimed
/// entry, or one of a device no longer counted).
async fn user_with_devices(
    redis: &Redis,
    user: &str,
    devices: &[(&str, i64)],
    extra: &[(&str, f64)],
) {
    let mut c = redis.aconn().await;
    let index = index_key("presence-leases", user);
    let mut pipe = redis::pipe();
    for (device, deadline) in devices {
        pipe.cmd("SET")
            .arg(format!("presence:{{{user}}}:{device}"))
            .arg("elsewhere 1 0")
            .arg("PX")
            .arg(600_000)
            .ignore();
        pipe.cmd("HSET")
            .arg(format!("presence-status:{{{user}}}"))
            .arg(format!("d:{device}"))
            .arg(1)
            .ignore();
        pipe.cmd("ZADD")
            .arg(&index)
            .arg(deadline)
            .arg(format!("{user}:{device}"))
            .ignore();
    }
    for (device, score) in extra {
        pipe.cmd("ZADD")
            .arg(&index)
            .arg(score)
            .arg(format!("{user}:{device}"))
            .ignore();
    }
    pipe.cmd("SET")
        .arg(format!("presence-count:{{{user}}}"))
        .arg(devices.len())
        .ignore();
    pipe.query_async::<()>(&mut c).await.unwrap();
}

/// Fails on schema 3, which listed users from `presence-online` (written
/// here by no one): the list reads the deadlines, one entry per device.
#[tokio::test]
async fn a_user_with_several_devices_is_listed_once_at_its_newest_device() {
    let redis = Redis::start();
    let base = deadline_base();
    // user -> the deadline of its newest device, which dates its entry.
    let mut newest: HashMap<String, i64> = HashMap::new();
    for i in 0..60usize {
        let user = format!("multi{i}");
        let names = ["phone", "laptop", "tab", "watch"];
        // 1 to 4 devices, deadlines shared within and across users.
        let devices: Vec<(&str, i64)> = (0..=i % 4)
            .map(|j| (names[j], base + ((i * 7 + j * 13) % 50) as i64))
            .collect();
        newest.insert(user.clone(), devices.iter().map(|d| d.1).max().unwrap());
        user_with_devices(&redis, &user, &devices, &[]).await;
    }
    // The newest entry of each of these lists no one: a device no longer
    // counted (its entry not yet removed), and a lapsed lease claimed for
    // departure (deadline + 1 s + 0.5).
    user_with_devices(
        &redis,
        "stale",
        &[("d", base + 5)],
        &[("gone", (base + 100) as f64)],
    )
    .await;
    newest.insert("stale".into(), base + 5);
    user_with_devices(
        &redis,
        "lapsing",
        &[("a", base + 3), ("b", base + 4)],
        &[("a", (base + 1_200) as f64 + 0.5)],
    )
    .await;
    newest.insert("lapsing".into(), base + 4);
    // Several devices, hidden from everyone: never listed.
    user_with_devices(&redis, "hider", &[("a", base + 60), ("b", base + 61)], &[]).await;
    let mut c = redis.aconn().await;
    redis::cmd("HSET")
        .arg("presence-status:{hider}")
        .arg("show_online")
        .arg("nobody")
        .query_async::<()>(&mut c)
        .await
        .unwrap();

    let node = Node::start(&redis, "n1");
    let ttl = TTL.as_millis() as i64;
    for limit in [1, 2, 3, 7, 50] {
        let (seen, _) = walk(&node.http(), limit).await;
        let names: HashSet<&str> = seen.iter().map(|(u, _)| u.as_str()).collect();
        assert_eq!(
            seen.len(),
            names.len(),
            "limit {limit}: a user listed twice: {seen:?}"
        );
        assert_eq!(names.len(), newest.len(), "limit {limit}: {seen:?}");
        for (user, active_at) in &seen {
            assert_eq!(
                *active_at + ttl,
                newest[user],
                "limit {limit}: {user} not dated by its newest device"
            );
        }
        assert!(
            seen.windows(2).all(|w| w[0].1 >= w[1].1),
            "limit {limit}: not newest first: {seen:?}"
        );
    }
}

/// Fails on schema 3, which kept `presence-online` and wrote schema 3.
#[tokio::test]
async fn schema_3_online_index_is_deleted_at_start_and_idempotently() {
    let redis = Redis::start();
    old_deployment(&redis, 3).await;
    online_users(&redis, "s3_", 40, |i| i as i64).await;
    v3_online_index(&redis, "s3_", 40).await;
    assert_eq!(index_members(&redis, "presence-online").await.len(), 40);

    let n1 = Node::start(&redis, "n1");
    assert!(index_members(&redis, "presence-online").await.is_empty());
    assert_eq!(schema(&redis).await, SCHEMA);
    let (seen, _) = walk(&n1.http(), 15).await;
    assert_eq!(seen.len(), 40);
    assert_eq!(seen[0].0, "s3_39");

    // The move again, as a second node starting at the same time would
    // run it: nothing breaks, the index goes again, the list is the same.
    old_deployment(&redis, 3).await;
    v3_online_index(&redis, "s3_", 40).await;
    let n2 = Node::start(&redis, "n2");
    assert!(index_members(&redis, "presence-online").await.is_empty());
    assert_eq!(schema(&redis).await, SCHEMA);
    let (again, _) = walk(&n2.http(), 15).await;
    assert_eq!(again, seen);
}

/// Schema 4 to 5 moves nothing: a node starting on a schema-4 deployment
/// does not walk the keyspace again for the moves of schema 4 (a SCAN over
/// every user's hash on every node starting at once). Here the sign of that
/// walk, a stray `active` field it would fold into `seq`, stays.
#[tokio::test]
async fn schema_4_to_5_walks_no_keys() {
    let redis = Redis::start();
    old_deployment(&redis, 4).await;
    let mut c = redis.aconn().await;
    redis::cmd("HSET")
        .arg("presence-status:{stray}")
        .arg("active")
        .arg(1_700_000_000_000_i64)
        .query_async::<()>(&mut c)
        .await
        .unwrap();
    let _n1 = Node::start(&redis, "n1");
    assert_eq!(schema(&redis).await, SCHEMA);
    let active: Option<i64> = redis::cmd("HGET")
        .arg("presence-status:{stray}")
        .arg("active")
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(active, Some(1_700_000_000_000));
}

/// Schema 3's own index of who is online, for users `<prefix>0..`.
async fn v3_online_index(redis: &Redis, prefix: &str, n: usize) {
    let mut c = redis.aconn().await;
    let mut pipe = redis::pipe();
    for i in 0..n {
        let user = format!("{prefix}{i}");
        pipe.cmd("ZADD")
            .arg(index_key("presence-online", &user))
            .arg(1_000 + i)
            .arg(&user)
            .ignore();
    }
    pipe.query_async::<()>(&mut c).await.unwrap();
}

/// Fails on schema 3, which kept `active` beside `seq`: at start each
/// user's `active` (its last refresh) is folded into `seq`, the larger of
/// the two kept, and deleted; running the move again changes nothing.
#[tokio::test]
async fn schema_3_active_is_folded_into_seq_at_start() {
    let redis = Redis::start();
    let mut c = redis.aconn().await;
    old_deployment(&redis, 3).await;
    let mut pipe = redis::pipe();
    // (user, active, seq): a refresh after the last transition, and the
    // other way round; and a user never refreshed since schema 3 wrote it.
    for (user, active, seq) in [
        ("f1", Some(5_000), 4_000),
        ("f2", Some(3_000), 9_000),
        ("f3", None, 7_000),
    ] {
        let key = format!("presence-status:{{{user}}}");
        pipe.cmd("HSET").arg(&key).arg("seq").arg(seq).ignore();
        if let Some(active) = active {
            pipe.cmd("HSET")
                .arg(&key)
                .arg("active")
                .arg(active)
                .ignore();
        }
    }
    pipe.query_async::<()>(&mut c).await.unwrap();
    let fields = |user: &'static str| {
        let redis = &redis;
        async move {
            let mut c = redis.aconn().await;
            let mut all: Vec<(String, String)> = redis::cmd("HGETALL")
                .arg(format!("presence-status:{{{user}}}"))
                .query_async(&mut c)
                .await
                .unwrap();
            all.sort();
            all
        }
    };
    let want = |seq: &str| vec![("seq".to_string(), seq.to_string())];
    let _n1 = Node::start(&redis, "n1");
    assert_eq!(fields("f1").await, want("5000"));
    assert_eq!(fields("f2").await, want("9000"));
    assert_eq!(fields("f3").await, want("7000"));
    old_deployment(&redis, 3).await;
    let _n2 = Node::start(&redis, "n2");
    assert_eq!(fields("f1").await, want("5000"));
    assert_eq!(fields("f2").await, want("9000"));
}
