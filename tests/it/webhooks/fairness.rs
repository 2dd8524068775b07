//! Issue 37, item 8: one user's room events cannot push other users'
//! online and offline out of a webhook queue while its receiver is down.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::receiver::{node_with_hooks, Receiver};
use crate::common::*;
use presence_server::webhooks::MAX_QUEUED_PER_USER;
use serde_json::{json, Value};

/// `--webhook-queue-limit` of the test, as in the review.
const LIMIT: usize = 300;
/// Users who each come online and go offline once during the churn.
const OTHERS: usize = 120;
/// The churning user's devices.
const DEVICES: usize = 10;
/// Join-and-leave rounds of the churn after the last offline: each makes
/// four events (`room_joined`, `room_occupied`, `room_left`,
/// `room_vacated`), so these alone are several times the queue.
const ROUNDS_AFTER: usize = 200;
/// Long enough for the sender's backoff (it doubled while the receiver
/// was down) and the delivery of the whole queue.
const DRAIN: Duration = Duration::from_secs(60);

/// One device of `churner` joining and leaving rooms of its own, one after
/// the other, until `stop`; each round counted in `rounds`. It then joins
/// one more room and waits for its `room` frame: the device's steps run in
/// order, so every event of its churn is queued by then.
async fn churn(
    mut c: Client,
    device: usize,
    rounds: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
) -> Client {
    let mut n = 0;
    while !stop.load(Ordering::SeqCst) {
        n += 1;
        let room = format!("churn:{device}:{n}");
        c.send(json!({"type": "join", "room": room})).await;
        assert_eq!(c.expect("room").await["room"], room.as_str());
        c.send(json!({"type": "leave", "room": room})).await;
        rounds.fetch_add(1, Ordering::SeqCst);
    }
    let last = format!("churn:{device}:end");
    c.send(json!({"type": "join", "room": last})).await;
    assert_eq!(c.expect("room").await["room"], last.as_str());
    c
}

/// The review's run: the receiver down, `--webhook-queue-limit 300`, ten
/// devices of one user joining and leaving distinct rooms while 120 other
/// users come online and go offline, and the churn going on long after.
///
/// What must hold, and why it does: every room event counts against the
/// user who caused it (the `room_occupied` and `room_vacated` its joins and
/// leaves cause included), so at most [`MAX_QUEUED_PER_USER`] of the
/// churner's events wait at any time; and a full queue gives up room events
/// before any presence transition. The presence transitions (120 onlines,
/// 120 offlines, the churner's one online) are 241, fewer than the queue
/// holds, so none may be dropped: each arrives exactly once when the
/// receiver is back, and of the churner at most its cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn room_churn_does_not_push_others_transitions_out() {
    let redis = Redis::start();
    let receiver = Receiver::start(usize::MAX).await;
    let limit = LIMIT.to_string();
    let node = node_with_hooks(
        &redis,
        "n1",
        &receiver,
        &[
            "--webhook-queue-limit",
            &limit,
            "--webhook-batch-ms",
            "0",
            "--max-frames-per-sec",
            "1000",
        ],
    );
    let rounds = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut churning = Vec::new();
    for device in 0..DEVICES {
        let c = Client::connect(&node, "churner", &format!("d{device}")).await;
        churning.push(tokio::spawn(churn(c, device, rounds.clone(), stop.clone())));
    }
    for i in 0..OTHERS {
        let user = format!("u{i:03}");
        Client::connect(&node, &user, "phone").await.close().await;
        wait_until(&format!("{user} offline"), DEADLINE, || async {
            count(&redis, &user).await == 0
        })
        .await;
    }
    let after = rounds.load(Ordering::SeqCst) + ROUNDS_AFTER;
    wait_until("the churn after the last offline", DRAIN, || async {
        rounds.load(Ordering::SeqCst) >= after
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    let mut devices = Vec::new();
    for task in churning {
        devices.push(task.await.expect("a churning device failed"));
    }
    // The scenario did overflow the queue, many times over.
    let made = metric(&node, "presence_webhook_events_total").await;
    assert!(made > (3 * LIMIT) as f64, "only {made} events made");
    assert!(metric(&node, "presence_webhook_dropped_total").await > 0.0);

    receiver.fail.store(0, Ordering::SeqCst);
    wait_until("the queue delivered", DRAIN, || async {
        metric(&node, "presence_webhook_queued").await == 0.0
    })
    .await;
    let events = receiver.events();
    let mut transitions: BTreeMap<(String, String), usize> = BTreeMap::new();
    for e in events
        .iter()
        .filter(|e| e["type"] == "online" || e["type"] == "offline")
    {
        let key = (
            e["user"].as_str().unwrap().to_string(),
            e["type"].as_str().unwrap().to_string(),
        );
        *transitions.entry(key).or_default() += 1;
    }
    let mut missing = Vec::new();
    for i in 0..OTHERS {
        for kind in ["online", "offline"] {
            let key = (format!("u{i:03}"), kind.to_string());
            if transitions.get(&key) != Some(&1) {
                missing.push(format!(
                    "{} {kind} x{}",
                    key.0,
                    transitions.get(&key).unwrap_or(&0)
                ));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "{} of the {} other users' online and offline events were not delivered exactly once, as {}, ...",
        missing.len(),
        2 * OTHERS,
        missing[..missing.len().min(6)].join(", ")
    );
    let churner_online = transitions.get(&("churner".to_string(), "online".to_string()));
    assert_eq!(churner_online, Some(&1), "the churner's own online");
    // Every room event of this test is the churner's doing.
    let room_events: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"].as_str().is_some_and(|t| t.starts_with("room_")))
        .collect();
    assert!(
        room_events.len() < MAX_QUEUED_PER_USER,
        "{} of the churner's room events delivered (with its online, at most {MAX_QUEUED_PER_USER} may wait)",
        room_events.len()
    );
    drop(devices);
}
