//! The node's cache of the backend's answers: allowed answers serve
//! repeats, a refusal is kept as long as its `Cache-Control` says and no
//! longer, and a member's own rejoin (Redis lost its membership) uses the
//! cache, outlives a backend blip on an expired grant, but not forever.

use std::time::{Duration, Instant};

use super::backend::{Backend, Reply};
use super::{next_about, node, refused_join};
use crate::common::*;
use crate::rooms::{join, redis_counts};
use serde_json::json;

/// Whether `room` holds exactly one device in Redis, with its deadline.
async fn one_member(redis: &Redis, room: &str) -> bool {
    redis_counts(redis, room).await == (1, 1, 1)
}

/// An allowed answer serves the same user's next joins of the room, from
/// any device, for `--room-join-cache-ms`; another user is asked about.
/// With `--room-join-cache-ms 0` every join asks.
#[tokio::test]
async fn allowed_answers_serve_repeats() {
    let redis = Redis::start();
    let backend = Backend::allowing().await;
    let node = node(&redis, "n1", &backend.url, &[]);
    let mut web = Client::connect(&node, "alice", "web").await;
    join(&mut web, "p:c", json!({})).await;
    web.send(json!({"type": "leave", "room": "p:c"})).await;
    join(&mut web, "p:c", json!({})).await;
    let mut phone = Client::connect(&node, "alice", "phone").await;
    join(&mut phone, "p:c", json!({})).await;
    assert_eq!(backend.asked_about("p:c").len(), 1);
    let mut bob = Client::connect(&node, "bob", "web").await;
    join(&mut bob, "p:c", json!({})).await;
    assert_eq!(backend.asked_about("p:c").len(), 2);
    let hits = "presence_room_join_cache_hits_total{answer=\"allowed\"}";
    assert_eq!(metric(&node, hits).await, 2.0);

    let uncached = super::node(&redis, "n2", &backend.url, &["--room-join-cache-ms", "0"]);
    let mut carol = Client::connect(&uncached, "carol", "web").await;
    join(&mut carol, "p:z", json!({})).await;
    join(&mut carol, "p:z", json!({"again": true})).await;
    assert_eq!(backend.asked_about("p:z").len(), 2);
}

/// A refusal with `Cache-Control: max-age=2` is answered from the cache
/// for 2 s and then asked again; one without the header is never kept.
#[tokio::test]
async fn a_refusal_is_kept_as_long_as_its_cache_control_and_no_longer() {
    let redis = Redis::start();
    let backend = Backend::start(|q| match q["user"].as_str().unwrap_or("") {
        "carol" => Reply::status(403, "").cached("private, max-age=2"),
        _ => Reply::ok(r#"{"allow":false}"#),
    })
    .await;
    let node = node(&redis, "n1", &backend.url, &[]);
    let mut carol = Client::connect(&node, "carol", "web").await;
    let asked_by = |user: &str| {
        backend
            .asked()
            .into_iter()
            .filter(|a| a.json()["user"] == user)
            .collect::<Vec<_>>()
    };
    let start = Instant::now();
    let mut joins = 0;
    while asked_by("carol").len() < 2 {
        assert!(
            start.elapsed() < DEADLINE,
            "carol was never asked about again"
        );
        assert_eq!(refused_join(&mut carol, "p:r").await["code"], "forbidden");
        joins += 1;
        // Ten joins a second: within the session's frame rate.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let asked = asked_by("carol");
    let kept = asked[1].at - asked[0].at;
    assert!(
        kept >= Duration::from_secs(2) && kept < Duration::from_millis(3_500),
        "kept {kept:?}"
    );
    let hits = "presence_room_join_cache_hits_total{answer=\"refused\"}";
    assert_eq!(metric(&node, hits).await, f64::from(joins - 2));
    assert!(joins >= 10, "{joins} joins");

    let mut dave = Client::connect(&node, "dave", "web").await;
    for _ in 0..3 {
        assert_eq!(refused_join(&mut dave, "p:r").await["code"], "forbidden");
    }
    assert_eq!(asked_by("dave").len(), 3);
}

/// Redis loses its data: the member's session joins its room again, let
/// in by the cached answer (the backend is not asked again).
#[tokio::test]
async fn a_members_rejoin_is_answered_from_the_cache() {
    let mut redis = Redis::start();
    let backend = Backend::allowing().await;
    let node = node(&redis, "n1", &backend.url, &[]);
    let mut alice = Client::connect(&node, "alice", "web").await;
    join(&mut alice, "p:r", json!({"page": 1})).await;
    redis.restart_empty();
    wait_until("alice back in p:r", DEADLINE, || one_member(&redis, "p:r")).await;
    assert_eq!(backend.asked().len(), 1, "{:?}", backend.asked());
    let hits = "presence_room_join_cache_hits_total{answer=\"allowed\"}";
    assert_eq!(metric(&node, hits).await, 1.0);
}

/// With the backend down, a member whose membership Redis lost is let back
/// in on its expired grant for one more `--room-join-cache-ms`; past that
/// it is out with `unavailable`, and nothing of it is left in Redis.
#[tokio::test]
async fn a_grant_outlives_a_backend_blip_for_a_member_but_not_forever() {
    let mut redis = Redis::start();
    let backend = Backend::allowing().await;
    let cache = Duration::from_millis(4_000);
    let node = node(
        &redis,
        "n1",
        &backend.url,
        &["--room-join-cache-ms", "4000"],
    );
    let mut alice = Client::connect(&node, "alice", "web").await;
    join(&mut alice, "p:r", json!({"page": 1})).await;
    let granted = backend.asked()[0].at;
    backend.stop();

    // Past the grant, within its grace.
    tokio::time::sleep_until((granted + cache + Duration::from_millis(300)).into()).await;
    redis.restart_empty();
    wait_until("alice back in p:r", DEADLINE, || one_member(&redis, "p:r")).await;
    assert!(granted.elapsed() < 2 * cache, "{:?}", granted.elapsed());
    assert_eq!(metric(&node, "presence_room_join_stale_total").await, 1.0);
    let unreachable = "presence_room_join_requests_total{outcome=\"unreachable\"}";
    assert!(metric(&node, unreachable).await >= 1.0);

    // Past the grace too.
    tokio::time::sleep_until((granted + 2 * cache + Duration::from_millis(500)).into()).await;
    redis.restart_empty();
    let e = next_about(&mut alice, "error", "p:r").await;
    assert_eq!(e["code"], "unavailable", "{e}");
    super::wait_no_trace(&redis, "p:r").await;
    alice
        .send(json!({"type": "signal", "room": "p:r", "data": 1}))
        .await;
    assert_eq!(
        next_about(&mut alice, "error", "p:r").await["code"],
        "not_in_room"
    );
    assert_eq!(metric(&node, "presence_room_join_stale_total").await, 1.0);
}
