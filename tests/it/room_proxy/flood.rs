//! A node never has more than `--room-join-max-in-flight` questions out
//! to the backend: a flood of joins is refused `unavailable` at once
//! beyond it, and joins of the same (user, room) share one question.

use std::time::{Duration, Instant};

use super::backend::Backend;
use super::node;
use crate::common::*;
use crate::rooms::{next_of, redis_counts};
use serde_json::json;

/// 200 devices of 200 users join one `proxy` room while the backend
/// holds its answers: exactly 8 questions reach it (the cap), the 192
/// others are refused with `unavailable` while those 8 are still out, and
/// once the backend answers, the 8 are in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_joins_never_has_more_than_the_cap_in_flight() {
    raise_fd_limit();
    let redis = Redis::start();
    let backend = Backend::allowing().await;
    let node = node(
        &redis,
        "n1",
        &backend.url,
        &[
            "--room-join-max-in-flight",
            "8",
            "--room-join-timeout-ms",
            "30000",
        ],
    );
    let mut clients = Vec::new();
    for i in 0..200 {
        clients.push(Client::connect(&node, &format!("u{i:03}"), "d").await);
    }
    backend.hold();
    let sent = Instant::now();
    for c in clients.iter_mut() {
        c.send(json!({"type": "join", "room": "p:flood", "state": {}}))
            .await;
    }
    let mut refused = vec![false; clients.len()];
    while refused.iter().filter(|r| **r).count() < 192 {
        assert!(
            sent.elapsed() < DEADLINE,
            "only {} refused",
            refused.iter().filter(|r| **r).count()
        );
        for (c, r) in clients.iter_mut().zip(refused.iter_mut()) {
            if let Some(Incoming::Frame(v)) = c.try_next() {
                assert_eq!(
                    (v["type"].as_str(), v["code"].as_str()),
                    (Some("error"), Some("unavailable")),
                    "{v}"
                );
                assert_eq!(v["room"], "p:flood");
                *r = true;
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Refused without the backend's word: it still holds the first eight.
    assert_eq!(backend.in_flight(), 8);
    assert_eq!(backend.asked().len(), 8);
    assert_eq!(metric(&node, "presence_room_join_shed_total").await, 192.0);
    assert_eq!(metric(&node, "presence_room_join_in_flight").await, 8.0);
    backend.release();
    for (c, _) in clients.iter_mut().zip(&refused).filter(|(_, r)| !**r) {
        let frame = next_of(c, "room").await;
        assert_eq!(frame["room"], "p:flood");
    }
    assert_eq!(backend.most_in_flight(), 8);
    assert_eq!(redis_counts(&redis, "p:flood").await, (8, 8, 8));
    wait_until("no question out", DEADLINE, || async {
        metric(&node, "presence_room_join_in_flight").await == 0.0
    })
    .await;
}

/// Five devices of one user join one room while its question is out:
/// they wait for that one question, and all five are in.
#[tokio::test]
async fn joins_of_one_user_and_room_share_one_question() {
    let redis = Redis::start();
    let backend = Backend::allowing().await;
    let node = node(&redis, "n1", &backend.url, &[]);
    let mut devices = Vec::new();
    for i in 0..5 {
        devices.push(Client::connect(&node, "sam", &format!("d{i}")).await);
    }
    backend.hold();
    let join = json!({"type": "join", "room": "p:shared", "state": {}});
    devices[0].send(join.clone()).await;
    wait_until("the first question out", DEADLINE, || async {
        backend.in_flight() == 1
    })
    .await;
    for d in devices.iter_mut().skip(1) {
        d.send(join.clone()).await;
    }
    wait_until("four questions waiting for it", DEADLINE, || async {
        metric(&node, "presence_room_join_shared_total").await == 4.0
    })
    .await;
    backend.release();
    for d in devices.iter_mut() {
        assert_eq!(next_of(d, "room").await["room"], "p:shared");
    }
    assert_eq!(backend.asked().len(), 1);
    assert_eq!(redis_counts(&redis, "p:shared").await, (1, 5, 5));
}
