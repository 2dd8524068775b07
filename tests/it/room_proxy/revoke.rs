//! Revoked at once under `proxy` too: a removal (`DELETE
//! /api/rooms/{room}/members/{user}`) voids every grant of the backend asked
//! before it, on every node, however long the nodes would keep it: the
//! join step refuses such a grant in the same atomic step, and the node
//! asks the backend again.

use super::backend::{Backend, Reply};
use super::{node, refused_join};
use crate::common::*;
use crate::rooms::join;
use serde_json::{json, Value};

/// `DELETE path` on `node` with the admin key; status and body.
async fn delete(node: &Node, path: &str) -> (u16, Value) {
    let r = reqwest::Client::new()
        .delete(format!("{}{path}", node.http()))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

/// Alice's grant is cached on both nodes (a join on one, a read on the
/// other); the backend changes its mind and removes her. Her next join and
/// her next read, each on the node that holds her old grant, ask again and
/// are refused; once the backend lets her in again, a grant asked after the
/// removal holds.
#[tokio::test]
async fn a_removal_voids_the_grants_every_node_keeps() {
    let redis = Redis::start();
    let backend = Backend::allowing().await;
    let n1 = node(&redis, "n1", &backend.url, &[]);
    let n2 = node(&redis, "n2", &backend.url, &[]);
    let mut alice = Client::connect(&n1, "alice", "web").await;
    join(&mut alice, "p:r", json!({})).await;
    let read = format!("{}/api/rooms/p:r?viewer=alice", n2.http());
    let (status, page) = get(&read).await;
    assert_eq!((status, page["users"].clone()), (200, json!(1)), "{page}");
    assert_eq!(backend.asked().len(), 2, "each node asked once");

    backend.answer(|_| Reply::ok(r#"{"allow":false}"#));
    let (status, body) = delete(&n2, "/api/rooms/p:r/members/alice").await;
    assert_eq!(status, 200, "{body}");
    let e = alice.expect("error").await;
    assert_eq!(
        (e["code"].clone(), e["room"].clone()),
        (json!("removed"), json!("p:r"))
    );

    // Both nodes still keep her grant (60 s): neither may use it.
    let e = refused_join(&mut alice, "p:r").await;
    assert_eq!(e["code"], "forbidden", "{e}");
    let (status, e) = get(&read).await;
    assert_eq!(
        (status, e["code"].clone()),
        (403, json!("forbidden")),
        "{e}"
    );
    assert_eq!(backend.asked().len(), 4, "each node asked again");
    let (_, page) = get_as(&format!("{}/api/rooms/p:r", n1.http()), Some(ADMIN)).await;
    assert_eq!(page["users"], 0, "{page}");

    backend.answer(|_| Reply::ok(r#"{"allow":true}"#));
    join(&mut alice, "p:r", json!({})).await;
    assert_eq!(backend.asked().len(), 5);
}
