//! The proxy policy beyond one socket: the HTTP room reads ask the same
//! question for the viewer (the service key reads any room), two nodes on
//! one Redis each ask and cache on their own, and a Redis Cluster.

use std::time::Duration;

use super::backend::{Backend, Reply};
use super::{node, proxy_flags, refused_join, traces};
use crate::common::cluster::Cluster;
use crate::common::*;
use crate::rooms::{expect_event, expect_quiet, join, members};
use serde_json::{json, Value};

/// A backend that lets in everyone but carol.
async fn all_but_carol() -> Backend {
    Backend::start(|q| {
        if q["user"] == "carol" {
            Reply::ok(r#"{"allow":false}"#)
        } else {
            Reply::ok(r#"{"allow":true}"#)
        }
    })
    .await
}

/// `GET /api/rooms/{room}` and `POST /api/rooms/query` of `proxy` rooms
/// ask the backend about the viewer (no device, an empty state), and use
/// the answers a join would; the service key reads without asking; a
/// refusal is `403`, no answer `503`.
#[tokio::test]
async fn http_reads_ask_the_same_question() {
    let redis = Redis::start();
    let backend = all_but_carol().await;
    let node = node(
        &redis,
        "n1",
        &backend.url,
        &[
            "--room-join-timeout-ms",
            "300",
            "--service-key",
            "service-key-0123456789",
        ],
    );
    let base = node.http();
    let mut alice = Client::connect(&node, "alice", "web").await;
    join(&mut alice, "p:1", json!({})).await;
    let read = |viewer: &str| format!("{base}/api/rooms/p:1?viewer={viewer}");
    // Alice's join answered for her read too; bob's read asks.
    let (status, page) = get(&read("alice")).await;
    assert_eq!((status, page["users"].clone()), (200, json!(1)), "{page}");
    let (status, _) = get(&read("bob")).await;
    assert_eq!(status, 200);
    let asked = backend.asked();
    assert_eq!(asked.len(), 2);
    assert_eq!(
        String::from_utf8(asked[1].body.clone()).unwrap(),
        r#"{"user":"bob","device":"","room":"p:1","state":{}}"#
    );
    let (status, e) = get(&read("carol")).await;
    assert_eq!(
        (status, e["code"].clone()),
        (403, json!("forbidden")),
        "{e}"
    );
    let (status, _) = get(&format!("{base}/api/rooms/p:1")).await;
    assert_eq!(status, 403, "an anonymous read names no user to ask about");
    let (status, page) = get_as(
        &format!("{base}/api/rooms/p:1"),
        Some("service-key-0123456789"),
    )
    .await;
    assert_eq!((status, page["view"].clone()), (200, json!("service")));
    assert_eq!(backend.asked().len(), 3, "the service key asks nothing");

    let query = |viewer: &str| format!("{base}/api/rooms/query?viewer={viewer}");
    let body = json!({"rooms": ["p:1", "p:2", "open:1", "p:1"]});
    let (status, counts) = post(&query("alice"), &body).await;
    assert_eq!(status, 200, "{counts}");
    assert_eq!(counts["rooms"][0]["users"], 1);
    assert_eq!(backend.asked_about("p:2").len(), 1);
    assert_eq!(
        backend.asked().len(),
        4,
        "p:1 from the cache, open:1 not asked"
    );
    let (status, _) = post(&query("carol"), &body).await;
    assert_eq!(status, 403);

    backend.hold();
    let (status, e) = get(&format!("{base}/api/rooms/p:3?viewer=alice")).await;
    assert_eq!(
        (status, e["code"].clone()),
        (503, json!("unavailable")),
        "{e}"
    );
    backend.release();
}

/// Two nodes on one Redis, one backend: a member on each sees the other;
/// a refused join on one leaves nothing for the other to see; each node
/// asks (and keeps the answer) for itself.
#[tokio::test]
async fn two_nodes_ask_for_themselves_and_share_the_room() {
    let redis = Redis::start();
    let backend = all_but_carol().await;
    let a = node(&redis, "a", &backend.url, &[]);
    let b = node(&redis, "b", &backend.url, &[]);
    let mut alice = Client::connect(&a, "alice", "web").await;
    join(&mut alice, "p:2", json!({})).await;
    let mut bob = Client::connect(&b, "bob", "web").await;
    let frame = join(&mut bob, "p:2", json!({})).await;
    assert_eq!(members(&frame), ["alice:web", "bob:web"]);
    expect_event(&mut alice, "room_join", "p:2", "bob", "web").await;
    let mut carol = Client::connect(&b, "carol", "web").await;
    assert_eq!(refused_join(&mut carol, "p:2").await["code"], "forbidden");
    expect_quiet(&mut alice, Duration::from_millis(300)).await;
    let (_, rooms) = get_as(&format!("{}/api/users/carol/rooms", a.http()), Some(ADMIN)).await;
    assert_eq!(rooms["devices"], json!([]), "{rooms}");
    let mut phone = Client::connect(&b, "alice", "phone").await;
    join(&mut phone, "p:2", json!({})).await;
    expect_event(&mut bob, "room_join", "p:2", "alice", "phone").await;
    let users: Vec<Value> = backend
        .asked()
        .iter()
        .map(|a| a.json()["user"].clone())
        .collect();
    assert_eq!(
        users,
        ["alice", "bob", "carol", "alice"],
        "one question per node"
    );
}

/// On a Redis Cluster: allowed joins on two nodes see each other, and a
/// refused one leaves nothing on any shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_rooms_on_a_cluster() {
    let cluster = Cluster::start();
    let backend = all_but_carol().await;
    let flags = proxy_flags(&backend.url, &[]);
    let a = cluster.node_with("a", &flags);
    let b = cluster.node_with("b", &flags);
    let mut alice = Client::connect(&a, "alice", "web").await;
    join(&mut alice, "p:c", json!({})).await;
    let mut bob = Client::connect(&b, "bob", "web").await;
    let frame = join(&mut bob, "p:c", json!({})).await;
    assert_eq!(members(&frame), ["alice:web", "bob:web"]);
    expect_event(&mut alice, "room_join", "p:c", "bob", "web").await;
    let mut carol = Client::connect(&a, "carol", "web").await;
    assert_eq!(refused_join(&mut carol, "p:x").await["code"], "forbidden");
    for shard in cluster.shards() {
        let found = traces(&mut cluster.conn(shard.primary), "p:x");
        assert!(
            found.is_empty(),
            "p:x left on :{}: {found:?}",
            shard.primary
        );
    }
    assert_eq!(backend.asked().len(), 3);
}
