//! Subscribe on interest: a node holds `SSUBSCRIBE presence-events:{<user>}`
//! exactly while one of its sessions watches that user, and nothing global.

use std::time::Duration;

use crate::common::*;
use serde_json::json;

/// Subscribers of `user`'s events channel, across the server.
async fn shard_subscribers(redis: &Redis, user: &str) -> i64 {
    let mut c = redis.aconn().await;
    let reply: Vec<redis::Value> = redis::cmd("PUBSUB")
        .arg("SHARDNUMSUB")
        .arg(format!("presence-events:{{{user}}}"))
        .query_async(&mut c)
        .await
        .unwrap();
    redis::from_redis_value_ref(&reply[1]).unwrap()
}

/// Waits until `user`'s channel has `n` subscribers.
async fn wait_subscribers(redis: &Redis, user: &str, n: i64) {
    wait_until(
        &format!("{n} subscriber(s) of {user}'s events"),
        DEADLINE,
        || async { shard_subscribers(redis, user).await == n },
    )
    .await;
}

#[tokio::test]
async fn a_node_subscribes_to_exactly_the_users_its_sessions_watch() {
    let redis = Redis::start();
    let a = Node::start(&redis, "a");
    let b = Node::start(&redis, "b");

    // No global channel, no pattern: only the expiry listeners' keyevent
    // subscriptions are plain channels.
    let mut c = redis.aconn().await;
    let channels: Vec<String> = redis::cmd("PUBSUB")
        .arg("CHANNELS")
        .query_async(&mut c)
        .await
        .unwrap();
    assert!(
        channels.iter().all(|ch| ch.starts_with("__keyevent@")),
        "{channels:?}"
    );
    let patterns: i64 = redis::cmd("PUBSUB")
        .arg("NUMPAT")
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(patterns, 0);
    assert_eq!(shard_subscribers(&redis, "bob").await, 0);

    // The watch is answered after the subscription is in place.
    let mut on_a = Client::connect(&a, "alice", "phone").await;
    on_a.watch(&["bob"]).await;
    assert_eq!(shard_subscribers(&redis, "bob").await, 1);
    let mut on_b = Client::connect(&b, "carol", "laptop").await;
    on_b.watch(&["bob"]).await;
    assert_eq!(shard_subscribers(&redis, "bob").await, 2);

    // A transition crosses nodes on the user's own channel, once each.
    let bob = Client::connect(&b, "bob", "tab").await;
    on_a.expect_presence("bob", "online").await;
    on_b.expect_presence("bob", "online").await;
    // Nobody watches dave: his transitions reach no node.
    let dave = Client::connect(&a, "dave", "tab").await;
    assert_eq!(shard_subscribers(&redis, "dave").await, 0);
    dave.close().await;

    // Unwatch: the node lets go after a short linger.
    on_a.send(json!({"type": "unwatch", "users": ["bob"]}))
        .await;
    wait_subscribers(&redis, "bob", 1).await;
    // Disconnect: the same.
    on_b.close().await;
    wait_subscribers(&redis, "bob", 0).await;

    // Nothing came for bob after the unwatch.
    bob.close().await;
    on_a.send(json!({"type": "heartbeat"})).await;
    assert!(
        on_a.next_within(Duration::from_millis(300)).await.is_none(),
        "an event after unwatch"
    );
}

#[tokio::test]
async fn a_lost_subscription_is_renewed_and_what_it_missed_is_reread() {
    let redis = Redis::start();
    let a = Node::start(&redis, "a");
    let b = Node::start(&redis, "b");
    let mut watcher = Client::connect(&a, "alice", "phone").await;
    let snap = watcher.watch(&["bob"]).await;
    assert_eq!(snap[0]["status"], "offline");

    // Cut every subscription connection: events published until the
    // nodes are back are lost on the wire.
    let mut c = redis.aconn().await;
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut c)
        .await
        .unwrap();
    assert!(killed >= 2, "killed {killed} pubsub clients");
    let _bob = Client::connect(&b, "bob", "tab").await;

    // The node resubscribes and re-reads: bob shows online, once.
    watcher.expect_presence("bob", "online").await;
    wait_subscribers(&redis, "bob", 1).await;
    assert!(
        watcher
            .next_within(Duration::from_millis(2 * HEARTBEAT_MS))
            .await
            .is_none(),
        "a duplicate after the resync"
    );
    a.wait_log("subscribed to the events of 1 watched users")
        .await;
}

/// Sharded channels on the server now.
async fn shard_channels(redis: &Redis) -> usize {
    let mut c = redis.aconn().await;
    let channels: Vec<String> = redis::cmd("PUBSUB")
        .arg("SHARDCHANNELS")
        .query_async(&mut c)
        .await
        .unwrap();
    channels.len()
}

/// A session swapping whom it watches cannot make its node hold a channel
/// per user it glanced at in the last `LINGER`: beyond `MAX_LINGERING`
/// unwatched users, the node drops their subscriptions at once (issue 30,
/// item 10).
#[tokio::test]
async fn lingering_subscriptions_are_bounded() {
    use presence_server::registry::{LINGER, MAX_LINGERING};
    let redis = Redis::start();
    let batch = MAX_LINGERING * 6 / 10;
    let limit = batch.to_string();
    let node = Node::start_with(
        &redis,
        "a",
        &[
            "--max-watches",
            &limit,
            "--max-user-reads-per-sec",
            "1000000",
        ],
    );
    let mut c = Client::connect(&node, "swapper", "d").await;
    let mut unwatched_at = None;
    for round in ["a", "b"] {
        let users: Vec<String> = (0..batch).map(|i| format!("{round}{i}")).collect();
        c.send(json!({"type": "watch", "users": users})).await;
        c.expect("snapshot").await;
        c.send(json!({"type": "unwatch", "users": users})).await;
        unwatched_at.get_or_insert_with(std::time::Instant::now);
    }
    // The registry has taken both unwatches once this watch is answered.
    assert_eq!(c.watch(&["probe"]).await.len(), 1);
    let quickly = LINGER / 2;
    // 12,000 unwatched: the first 10,001 were dropped at once, the rest
    // linger as usual (without the bound all 12,000 would, for LINGER).
    wait_until("the lingering channels bounded", quickly, || async {
        shard_channels(&redis).await <= MAX_LINGERING
    })
    .await;
    assert!(
        unwatched_at.unwrap().elapsed() < LINGER + quickly,
        "too slow to tell a bound from the linger"
    );
}
