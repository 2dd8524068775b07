//! Revocation under every policy (issue 38), under JWT auth, across two
//! nodes and on a Redis Cluster: `DELETE /api/rooms/{room}/members/{user}`
//! takes every device of the user out of a `claim`, a `token` and a
//! `proxy` room within a second (the others see the leave, each removed
//! device gets `removed` and hears nothing more), and a join of its own
//! afterwards follows the room's policy.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::cluster::Cluster;
use crate::common::jwt::{hs, now, SECRET};
use crate::common::*;
use crate::room_proxy::backend::{Backend, Reply};
use crate::rooms::{expect_event, expect_quiet, next_of};

/// The `proxy` rooms' secret.
const JOIN_SECRET: &str = "room-revoke-join-secret-0123456789";

/// A backend that lets everyone in but bob's device `again`.
async fn backend() -> Backend {
    Backend::start(|q| {
        if q["user"] == "bob" && q["device"] == "again" {
            Reply::ok(r#"{"allow":false}"#)
        } else {
            Reply::ok(r#"{"allow":true}"#)
        }
    })
    .await
}

/// The nodes' flags: `tok:` rooms take room tokens, `px:` rooms ask
/// `url`, the rest follow the connection token's rooms claim.
fn flags(url: &str) -> Vec<&str> {
    vec![
        "--auth",
        "jwt",
        "--jwt-secret",
        SECRET,
        "--admin-key",
        ADMIN,
        "--room-policy",
        "tok:*=token",
        "--room-policy",
        "px:*=proxy",
        "--room-policy",
        "*=claim",
        "--room-join-url",
        url,
        "--room-join-secret",
        JOIN_SECRET,
    ]
}

/// `user`/`device` on `node`, with a token whose rooms claim is `claim:*`.
async fn connect(node: &Node, user: &str, device: &str) -> Client {
    let token = hs(json!({"sub": user, "exp": now() + 3600, "rooms": ["claim:*"]}));
    let url = format!("ws://{}/ws?device={device}&token={token}", node.addr);
    let mut c = Client::connect_raw(&url, user, device).await.unwrap();
    c.expect("hello").await;
    c
}

/// The join frame of `user` for `room`: with a room token in a `tok:` room.
fn join_frame(user: &str, room: &str) -> Value {
    let mut frame = json!({"type": "join", "room": room, "state": {}});
    if room.starts_with("tok:") {
        frame["token"] = json!(hs(json!({"sub": user, "room": room, "exp": now() + 600})));
    }
    frame
}

/// `c` (of `user`) joins `room`; the `room` frame, or the error.
async fn join(c: &mut Client, user: &str, room: &str) -> Value {
    c.send(join_frame(user, room)).await;
    loop {
        let v = c.recv().await;
        match v["type"].as_str() {
            Some("room") | Some("error") if v["room"] == room => return v,
            _ => {}
        }
    }
}

/// `DELETE` of `user` from `room` on `node`.
async fn remove(node: &Node, room: &str, user: &str) -> Value {
    let r = reqwest::Client::new()
        .delete(format!("{}/api/rooms/{room}/members/{user}", node.http()))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.json().await.unwrap()
}

/// In each of a `claim`, a `token` and a `proxy` room: alice on node A,
/// bob on node B; bob is removed (on node A) and is out within a second
/// for both; then his joins follow the policy: the claim and a fresh room
/// token let him in again, and the backend (asked again, not answered
/// from its cache) refuses him.
async fn revoke_everywhere(a: &Node, b: &Node, backend: &Backend) {
    let mut alice = connect(a, "alice", "web").await;
    let mut bob = connect(b, "bob", "phone").await;
    for room in ["claim:1", "tok:1", "px:1"] {
        assert_eq!(join(&mut alice, "alice", room).await["type"], "room");
        assert_eq!(join(&mut bob, "bob", room).await["type"], "room");
        expect_event(&mut alice, "room_join", room, "bob", "phone").await;

        let removed_at = Instant::now();
        let gone = remove(a, room, "bob").await;
        assert_eq!(gone["devices"], json!(["phone"]), "{gone}");
        let left = expect_event(&mut alice, "room_leave", room, "bob", "phone").await;
        assert_eq!(left["removed"], true, "{left}");
        let e = next_of(&mut bob, "error").await;
        assert_eq!(
            (e["code"].as_str(), e["room"].as_str()),
            (Some("removed"), Some(room))
        );
        let took = removed_at.elapsed();
        assert!(took < Duration::from_secs(1), "{room}: out after {took:?}");
        alice
            .send(json!({"type": "signal", "room": room, "data": "after"}))
            .await;
        expect_quiet(&mut bob, Duration::from_millis(300)).await;
    }
    // A join of his own follows each policy.
    assert_eq!(join(&mut bob, "bob", "claim:1").await["type"], "room");
    assert_eq!(join(&mut bob, "bob", "tok:1").await["type"], "room");
    let asked = backend.asked_about("px:1").len();
    let mut again = connect(b, "bob", "again").await;
    let e = join(&mut again, "bob", "px:1").await;
    assert_eq!(e["code"], "forbidden", "{e}");
    assert_eq!(backend.asked_about("px:1").len(), asked + 1, "asked again");
}

#[tokio::test]
async fn a_removal_is_at_once_under_every_policy_on_two_nodes() {
    let redis = Redis::start();
    let backend = backend().await;
    let a = Node::start_with(&redis, "a", &flags(&backend.url));
    let b = Node::start_with(&redis, "b", &flags(&backend.url));
    revoke_everywhere(&a, &b, &backend).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removal_is_at_once_under_every_policy_on_a_cluster() {
    let cluster = Cluster::start();
    let backend = backend().await;
    let a = cluster.node_with("a", &flags(&backend.url));
    let b = cluster.node_with("b", &flags(&backend.url));
    revoke_everywhere(&a, &b, &backend).await;
}
