//! Lease refreshes batched across the sessions of a node: every session
//! keeps its lease, and a replaced connection whose refresh shares a batch
//! with others is closed without touching the new owner's index entry.

use std::time::{Duration, Instant};

use crate::common::*;
use serde_json::json;
use tokio_tungstenite::tungstenite::Message;

/// Sessions on the batching node.
const SESSIONS: usize = 200;
/// Heartbeat of the node that holds the replacing connection: shorter than
/// the batching node's, so that a deadline written by the replaced
/// connection would stand out in `presence-leases`.
const SHORT_HEARTBEAT_MS: u64 = 300;

async fn leases_index_score(redis: &Redis, member: &str) -> Option<i64> {
    let mut c = redis.aconn().await;
    let user = member.split(':').next().unwrap();
    redis::cmd("ZSCORE")
        .arg(index_key("presence-leases", user))
        .arg(member)
        .query_async(&mut c)
        .await
        .unwrap()
}

fn now_ms() -> i64 {
    presence_server::store::now_ms()
}

/// Refreshes queued from all sessions at once go out in batches.
async fn batch_sizes(node: &Node) -> (f64, f64) {
    (
        metric(node, "presence_refresh_batch_size_count").await,
        metric(node, "presence_refresh_batch_size_sum").await,
    )
}

#[tokio::test]
async fn concurrent_refreshes_keep_every_lease_and_close_the_replaced() {
    raise_fd_limit();
    let redis = Redis::start();
    let a = Node::start(&redis, "a");
    let b = Node::start_with(
        &redis,
        "b",
        &["--heartbeat-ms", &SHORT_HEARTBEAT_MS.to_string()],
    );
    let mut clients = Vec::with_capacity(SESSIONS);
    for i in 0..SESSIONS {
        clients.push(Client::connect(&a, &format!("r{i}"), "d").await);
    }
    let mut old = Client::connect(&a, "victim", "phone").await;
    let _new = Client::connect(&b, "victim", "phone").await;
    let replaced_at = now_ms();
    // The index still holds the old connection's connect-time deadline
    // (ZADD GT never lowers it). Set it to what node b writes, so that from
    // here on a deadline beyond node b's TTL can only come from the replaced
    // connection (whose first refresh is due at a's next ping at the
    // earliest: it sends nothing before the loop below).
    let mut c = redis.aconn().await;
    let _: i64 = redis::cmd("ZADD")
        .arg(index_key("presence-leases", "victim"))
        .arg("XX")
        .arg(now_ms() + 3 * SHORT_HEARTBEAT_MS as i64)
        .arg("victim:phone")
        .query_async(&mut c)
        .await
        .unwrap();

    // Every session (the replaced one too) sends heartbeats faster than the
    // throttle lets through, for three lease TTLs: their refreshes meet in
    // the node's batches. The replaced one learns at its first refresh.
    let (batches0, refreshes0) = batch_sizes(&a).await;
    let heartbeat = json!({"type": "heartbeat"}).to_string();
    let started = Instant::now();
    let mut replaced_closed = false;
    while started.elapsed() < TTL * 3 {
        for c in &mut clients {
            c.send(json!({"type": "heartbeat"})).await;
        }
        if !replaced_closed {
            // Fails once the node has closed it.
            let _ = old.sink_send(Message::Text(heartbeat.clone().into())).await;
            while let Some(incoming) = old.try_next() {
                if let Incoming::Closed(close) = incoming {
                    check_replaced(&redis, close, replaced_at, &a).await;
                    replaced_closed = true;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if !replaced_closed {
        let close = old.expect_closed().await;
        check_replaced(&redis, close, replaced_at, &a).await;
    }

    // Every other session is still connected, holds its lease and is in
    // the index with a deadline ahead.
    let now = now_ms();
    for (i, client) in clients.iter_mut().enumerate() {
        while let Some(incoming) = client.try_next() {
            assert!(
                matches!(incoming, Incoming::Frame(_)),
                "r{i} was closed: {incoming:?}"
            );
        }
        let user = format!("r{i}");
        let owner = lease_node(&redis, &user, "d").await;
        assert_eq!(owner.as_deref(), Some("a"), "{user}: lease");
        assert_eq!(count(&redis, &user).await, 1, "{user}");
        let score = leases_index_score(&redis, &format!("{user}:d")).await;
        assert!(score.is_some_and(|s| s > now), "{user}: deadline {score:?}");
    }

    // And they did go out together.
    let (batches1, refreshes1) = batch_sizes(&a).await;
    let (batches, refreshes) = (batches1 - batches0, refreshes1 - refreshes0);
    println!("{refreshes} refreshes in {batches} batches");
    assert!(
        refreshes >= (SESSIONS * 3) as f64,
        "only {refreshes} refreshes in three TTLs"
    );
    assert!(batches < refreshes, "no two refreshes shared a batch");
}

/// The replaced connection was closed with 4001 at its first refresh, and
/// has left the new owner's lease, count and index entry alone. Checked as
/// soon as the close arrives: node b writes at most now + 3 x 300 ms, so a
/// deadline of node a's TTL (1.5 s) would be the replaced connection's, for
/// the 0.6 s until node b's own refreshes pass it.
async fn check_replaced(redis: &Redis, close: Option<(u16, String)>, replaced_at: i64, a: &Node) {
    let closed_at = now_ms();
    let score = leases_index_score(redis, "victim:phone")
        .await
        .expect("the new owner's entry in presence-leases");
    let b_ttl = 3 * SHORT_HEARTBEAT_MS as i64;
    assert!(
        score <= now_ms() + b_ttl,
        "presence-leases holds {score}, {} ms ahead: not node b's deadline",
        score - now_ms()
    );
    assert_eq!(close.map(|(code, _)| code), Some(4001), "{}", a.logs());
    assert!(
        closed_at - replaced_at < TTL.as_millis() as i64,
        "closed {} ms after the takeover",
        closed_at - replaced_at
    );
    let owner = lease_node(redis, "victim", "phone").await;
    assert_eq!(owner.as_deref(), Some("b"), "lease owner");
    assert_eq!(count(redis, "victim").await, 1);
}

async fn status_field(redis: &Redis, user: &str, field: &str) -> Option<String> {
    let mut c = redis.aconn().await;
    redis::cmd("HGET")
        .arg(format!("presence-status:{{{user}}}"))
        .arg(field)
        .query_async(&mut c)
        .await
        .unwrap()
}

/// A status chosen on another device reaches this session through its
/// refreshes (the one outcome the node's refresher hands back besides a
/// lost lease), so that this session re-asserts it when Redis comes back
/// empty.
#[tokio::test]
async fn a_status_learned_by_refresh_is_reasserted_after_redis_restarts() {
    let mut redis = Redis::start();
    let a = Node::start(&redis, "a");
    let mut phone = Client::connect(&a, "alice", "phone").await;
    let _laptop = Client::connect(&a, "alice", "laptop").await;
    phone
        .send(json!({"type": "status", "status": "busy", "text": "focus"}))
        .await;
    wait_until("busy stored", DEADLINE, || async {
        status_field(&redis, "alice", "status").await.as_deref() == Some("busy")
    })
    .await;
    phone.close().await;
    a.wait_log("alice/phone: closed").await;
    // The phone's departure (which publishes, and so raises `seq` too) is
    // over once the laptop alone is counted.
    wait_until("the phone departed", DEADLINE, || async {
        count(&redis, "alice").await == 1
    })
    .await;
    // From here on only the laptop raises `seq` (its refreshes): once it
    // passes this point, the laptop has refreshed since the status
    // changed. Once it passes it again, the session had the first
    // refresh's answer (a session has one refresh in flight at a time),
    // and so learned the status: a restart right after the first could
    // lose that answer on its way (the refresh fails with a broken pipe).
    let mut since = now_ms();
    for which in ["a refresh of the laptop", "the laptop's next refresh"] {
        let seq = || async {
            let active = status_field(&redis, "alice", "seq").await;
            active.and_then(|a| a.parse::<i64>().ok()).unwrap_or(0)
        };
        wait_until(which, DEADLINE, || async { seq().await > since }).await;
        since = seq().await;
    }

    redis.restart_empty();
    wait_until("the laptop re-asserts busy", DEADLINE, || async {
        status_field(&redis, "alice", "status").await.as_deref() == Some("busy")
            && status_field(&redis, "alice", "text").await.as_deref() == Some("focus")
            && count(&redis, "alice").await == 1
    })
    .await;
}

/// A status change that Redis applied is the session's to re-assert, even
/// when reading the record back for the answer failed (here: Redis went
/// away between the two, which the contacts key of the wrong type stands
/// in for, deterministically).
#[tokio::test]
async fn a_status_stored_but_not_read_back_is_reasserted_after_redis_restarts() {
    let mut redis = Redis::start();
    // Refreshes due only every 2 s: the session cannot learn the status
    // from a refresh before Redis restarts.
    let a = Node::start_with(&redis, "a", &["--heartbeat-ms", "6000"]);
    let mut phone = Client::connect(&a, "alice", "phone").await;
    let mut c = redis.aconn().await;
    let _: () = redis::cmd("SET")
        .arg("presence-contacts:{alice}")
        .arg("not a set")
        .query_async(&mut c)
        .await
        .unwrap();
    phone
        .send(json!({"type": "status", "status": "busy", "text": "focus"}))
        .await;
    let err = phone.expect("error").await;
    assert_eq!(err["code"], "unavailable", "{err}");
    assert_eq!(
        status_field(&redis, "alice", "status").await.as_deref(),
        Some("busy")
    );

    redis.restart_empty();
    // A frame makes the session refresh as soon as its interval passed.
    let deadline = Instant::now() + DEADLINE;
    loop {
        phone.send(json!({"type": "heartbeat"})).await;
        if status_field(&redis, "alice", "status").await.as_deref() == Some("busy")
            && status_field(&redis, "alice", "text").await.as_deref() == Some("focus")
            && count(&redis, "alice").await == 1
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the phone never re-asserted busy: {:?}",
            status_field(&redis, "alice", "status").await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A session that closes while its refresh waits behind other batches is
/// released after that refresh, not before: a refresh that reached Redis
/// after the release would find the lease gone and claim it again, and the
/// user would come back online for a lease TTL after going offline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_closing_while_its_refresh_waits_stays_offline() {
    closing_during_a_refresh(false).await;
}

/// The same with the refresh already in Redis when the session closes: the
/// release follows its answer (the device is released, not left to lapse).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_closing_while_its_refresh_is_in_redis_is_released_after_it() {
    closing_during_a_refresh(true).await;
}

async fn closing_during_a_refresh(in_redis: bool) {
    let redis = Redis::start();
    // Refreshes are due 1 s after the last one.
    let node = Node::start_with(&redis, "a", &["--heartbeat-ms", "3000"]);
    let mut watcher = Client::connect(&node, "watcher", "w").await;
    watcher.watch(&["alice"]).await;
    let mut others = Vec::new();
    if !in_redis {
        for user in ["bob", "carol"] {
            others.push(Client::connect(&node, user, "d").await);
        }
    }
    let mut alice = Client::connect(&node, "alice", "a").await;
    watcher.expect_presence("alice", "online").await;
    tokio::time::sleep(Duration::from_millis(1100)).await;

    // Redis holds every write from here on. Without `in_redis`, bob's and
    // carol's refreshes take the refresher's two batches in flight, so
    // alice's waits its turn in the node.
    let mut c = redis.aconn().await;
    pause_writes(&mut c).await;
    let batch_out = |n: usize| {
        let node = &node;
        async move {
            wait_until("a batch out", DEADLINE, || async {
                metric(node, "presence_refresh_batch_size_count").await >= n as f64
            })
            .await
        }
    };
    for (i, other) in others.iter_mut().enumerate() {
        other.send(json!({"type": "heartbeat"})).await;
        batch_out(i + 1).await;
    }
    alice.send(json!({"type": "heartbeat"})).await;
    if in_redis {
        batch_out(1).await;
    }
    alice.close().await;
    // Her session stopped (it counts its device off as it does).
    let devices = 1.0 + others.len() as f64;
    wait_until("alice's session stopped", DEADLINE, || async {
        metric(&node, "presence_devices").await == devices
    })
    .await;
    unpause(&mut c).await;

    watcher.expect_presence("alice", "offline").await;
    // Released by the node once the refresh was settled, not left to lapse.
    node.wait_log("alice/a: releasing after the refresh that was out")
        .await;
    node.wait_log("alice/a: closed, device released, user offline")
        .await;
    if let Some(frame) = watcher.next_within(TTL + Duration::from_secs(1)).await {
        panic!("alice came back after going offline: {frame:?}");
    }
    assert_released(&redis, &mut c).await;
}

/// Redis holds every write command until [`unpause`] (reads still go).
async fn pause_writes(c: &mut redis::aio::MultiplexedConnection) {
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(10_000)
        .arg("WRITE")
        .query_async(c)
        .await
        .unwrap();
}

async fn unpause(c: &mut redis::aio::MultiplexedConnection) {
    let _: () = redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .query_async(c)
        .await
        .unwrap();
}

/// A node whose leases live 18 s (longer than any wait of these tests, so
/// only a release can bring an `offline`), a watcher of alice, and alice
/// connecting while Redis holds every write: her claim waits in Redis.
/// Returns the Redis, the node, the watcher, a connection to Redis and
/// alice (connected, not yet greeted).
async fn alice_connects_with_writes_paused() -> (
    Redis,
    Node,
    Client,
    redis::aio::MultiplexedConnection,
    Client,
) {
    let redis = Redis::start();
    let node = Node::start_with(&redis, "a", &["--heartbeat-ms", "6000"]);
    let mut watcher = Client::connect(&node, "watcher", "w").await;
    watcher.watch(&["alice"]).await;
    let mut c = redis.aconn().await;
    pause_writes(&mut c).await;
    let alice = Client::connect_raw(&node.ws_url("alice", "a"), "alice", "a")
        .await
        .unwrap();
    (redis, node, watcher, c, alice)
}

/// alice's device is gone from Redis: no lease, not counted.
async fn assert_released(redis: &Redis, c: &mut redis::aio::MultiplexedConnection) {
    let lease: Option<String> = redis::cmd("GET")
        .arg("presence:{alice}:a")
        .query_async(c)
        .await
        .unwrap();
    assert_eq!(lease, None);
    assert_eq!(count(redis, "alice").await, 0);
}

/// A session that closes while its claim of the lease is in Redis has the
/// lease the claim took released after it, not left online for a TTL.
#[tokio::test]
async fn a_device_closing_while_its_claim_is_in_redis_is_released_after_it() {
    let (redis, node, mut watcher, mut c, alice) = alice_connects_with_writes_paused().await;
    node.wait_log("alice/a: claiming the lease").await;
    alice.close().await;
    wait_until("alice's session stopped", DEADLINE, || async {
        metric(&node, "presence_sessions").await == 1.0
    })
    .await;
    unpause(&mut c).await;

    // The claim took the lease (the device did connect), then the release.
    watcher.expect_presence("alice", "online").await;
    watcher.expect_presence("alice", "offline").await;
    node.wait_log("alice/a: closed while claiming; releasing after the claim")
        .await;
    assert_released(&redis, &mut c).await;
}

/// A claim the node gave up on (Redis held it past the response timeout)
/// still takes the lease once Redis goes on, and announces the device. Its
/// session was closed with 1013 meanwhile (Redis is slow: come back
/// later), and the lease is left for the device's next connection to take
/// over, with no transition: released, a device reconnecting in a storm
/// (its old connection's lease still held) would flap offline and online
/// for its watchers. A clean close of that next connection then releases
/// it as usual.
#[tokio::test]
async fn a_claim_that_timed_out_is_left_for_the_device_to_take_over() {
    // Writes are held for 10 s: past the node's response timeout (5 s).
    let (redis, node, mut watcher, mut c, mut alice) = alice_connects_with_writes_paused().await;
    let close = alice.expect_closed().await;
    assert_eq!(close.map(|(code, _)| code), Some(1013), "{}", node.logs());
    unpause(&mut c).await;

    // The claim took the lease when Redis went on; the device comes back.
    watcher.expect_presence("alice", "online").await;
    let alice = Client::connect(&node, "alice", "a").await;
    if let Some(frame) = watcher.next_within(Duration::from_millis(500)).await {
        panic!("the device came back, yet its watcher got {frame:?}");
    }
    alice.close().await;
    watcher.expect_presence("alice", "offline").await;
    assert_released(&redis, &mut c).await;
}

/// A node (started with `extra` flags too) with one place for sessions
/// setting up, taken by alice, whose claim waits in a Redis that holds every
/// write. Returns the Redis, the node, a connection to Redis and alice
/// (connected, not yet greeted).
async fn one_place_taken(
    extra: &[&str],
) -> (Redis, Node, redis::aio::MultiplexedConnection, Client) {
    let redis = Redis::start();
    let args = [&["--max-pending-claims", "1"], extra].concat();
    let node = Node::start_with(&redis, "a", &args);
    let mut c = redis.aconn().await;
    pause_writes(&mut c).await;
    let alice = Client::connect_raw(&node.ws_url("alice", "a"), "alice", "a")
        .await
        .unwrap();
    node.wait_log("alice/a: claiming the lease").await;
    (redis, node, c, alice)
}

/// A node with `--max-pending-claims` sessions setting up sheds the next
/// one at once, before any Redis work: `1013` with the wait it asks for,
/// and no lease. The claim that waited is answered once Redis goes on; its
/// session is set up once its first request (a watch) is answered, and
/// then the shed device gets in.
#[tokio::test]
async fn a_node_with_its_most_claims_out_sheds_the_next_with_1013() {
    let (_redis, node, mut c, mut alice) = one_place_taken(&[]).await;

    let mut bob = Client::connect_raw(&node.ws_url("bob", "b"), "bob", "b")
        .await
        .unwrap();
    let (code, reason) = bob.expect_closed().await.expect("a close frame");
    assert_eq!(code, 1013, "{reason}");
    assert!(reason.ends_with("retry_after_ms=1000"), "{reason}");
    assert_eq!(metric(&node, "presence_connections_shed_total").await, 1.0);

    unpause(&mut c).await;
    alice.expect("hello").await;
    alice.watch(&["carol"]).await;
    let lease: Option<String> = redis::cmd("GET")
        .arg("presence:{bob}:b")
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(lease, None, "a shed session claimed nothing");
    // Its place is back: the next claim goes through.
    Client::connect(&node, "bob", "b").await;
}

/// Many sessions shed for each one let in: the wait the close names grows
/// (1 s, then up to 2 s) and the gauge shows it, so that a storm's clients
/// make a few attempts for each one the node lets in, not hundreds.
#[tokio::test]
async fn a_node_shedding_many_for_each_let_in_asks_for_a_longer_wait() {
    // The wait is capped at a third of the TTL: the test nodes' 1.5 s TTL
    // would keep it at 1 s, so these leases live 15 s.
    let (_redis, node, mut c, mut alice) = one_place_taken(&["--heartbeat-ms", "5000"]).await;

    let deadline = Instant::now() + Duration::from_secs(8);
    let mut waits = Vec::new();
    loop {
        let mut bob = Client::connect_raw(&node.ws_url("bob", "b"), "bob", "b")
            .await
            .unwrap();
        let (code, reason) = bob.expect_closed().await.expect("a close frame");
        assert_eq!(code, 1013, "{reason}");
        let wait: u64 = reason
            .rsplit_once("retry_after_ms=")
            .and_then(|(_, ms)| ms.parse().ok())
            .unwrap_or_else(|| panic!("no wait in {reason:?}"));
        waits.push(wait);
        if wait > 1_000 {
            break;
        }
        assert!(Instant::now() < deadline, "the wait never grew: {waits:?}");
    }
    let last = *waits.last().unwrap();
    assert_eq!(waits.first(), Some(&1_000), "{waits:?}");
    assert!(last <= 2_000, "at most doubled a window: {waits:?}");
    assert_eq!(
        metric(&node, "presence_shed_retry_after_ms").await,
        last as f64
    );
    unpause(&mut c).await;
    alice.expect("hello").await;
}
