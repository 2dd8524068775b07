//! `GET /metrics`: after real activity the Prometheus text shows non-zero
//! counters for sessions, transitions and expired events.

use std::collections::HashMap;
use std::time::Instant;

use crate::common::*;
use serde_json::json;

/// Samples of a Prometheus text exposition: `name{labels}` -> value.
fn parse(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            Some((name.to_string(), value.parse().ok()?))
        })
        .collect()
}

async fn scrape(node: &Node) -> (String, HashMap<String, f64>) {
    let r = reqwest::get(format!("{}/metrics", node.http()))
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let ctype = r.headers()["content-type"].to_str().unwrap().to_string();
    assert!(ctype.starts_with("text/plain"), "content-type {ctype}");
    let text = r.text().await.unwrap();
    let samples = parse(&text);
    (text, samples)
}

fn value(samples: &HashMap<String, f64>, name: &str, text: &str) -> f64 {
    *samples
        .get(name)
        .unwrap_or_else(|| panic!("{name} missing from /metrics:\n{text}"))
}

/// Bob connects on node 2, changes status and vanishes with his node
/// (SIGKILL, so only the lease expiry can tell); alice on node 1 sees it all.
#[tokio::test]
async fn metrics_count_sessions_transitions_and_expiries() {
    let redis = Redis::start();
    let n1 = Node::start(&redis, "m1");
    let mut n2 = Node::start(&redis, "m2");

    let mut alice = Client::connect(&n1, "alice", "phone").await;
    alice.watch(&["bob"]).await;
    let mut bob = Client::connect(&n2, "bob", "laptop").await;
    assert_eq!(alice.expect("presence").await["status"], "online");

    let (text, s) = scrape(&n1).await;
    assert_eq!(value(&s, "presence_sessions", &text), 1.0, "{text}");
    assert_eq!(value(&s, "presence_devices", &text), 1.0, "{text}");
    assert_eq!(value(&s, "presence_watched_users", &text), 1.0, "{text}");

    bob.send(json!({"type": "status", "status": "busy"})).await;
    assert_eq!(alice.expect("presence").await["status"], "busy");
    n2.kill();
    drop(bob);
    assert_eq!(alice.expect("presence").await["status"], "offline");

    let (text, s) = scrape(&n1).await;
    assert!(value(&s, "presence_sessions_opened_total", &text) >= 1.0);
    for status in ["online", "busy", "offline"] {
        let name = format!("presence_transitions_published_total{{status=\"{status}\"}}");
        assert!(value(&s, &name, &text) >= 1.0, "{name}:\n{text}");
    }
    assert_eq!(
        value(&s, "presence_transitions_delivered_total", &text),
        3.0,
        "online, busy and offline were delivered to alice:\n{text}"
    );
    // n1 is the only node left, so whichever path departed bob's lapsed
    // lease (its expired event, or the deadline pass) ran on n1.
    wait_until("bob's departure counted", DEADLINE, || async {
        let (text, s) = scrape(&n1).await;
        value(&s, "presence_departure_steps_total{path=\"event\"}", &text)
            + value(&s, "presence_departure_steps_total{path=\"pass\"}", &text)
            >= 1.0
    })
    .await;
    let (text, s) = scrape(&n1).await;
    assert!(
        value(
            &s,
            "presence_redis_command_duration_seconds_count{command=\"arrive\"}",
            &text
        ) >= 1.0,
        "{text}"
    );
    assert!(
        text.contains("presence_slow_consumers_dropped_total 0"),
        "{text}"
    );
    assert!(text.contains("presence_reconcile_repairs_total"), "{text}");

    // /healthz still shows the counters it showed before.
    let (status, health) = get(&format!("{}/healthz", n1.http())).await;
    assert_eq!(status, 200);
    for key in [
        "expired_events",
        "devices_reaped",
        "reconcile_repairs",
        "online_pruned",
    ] {
        assert!(health["counters"][key].is_u64(), "{health}");
    }
}

/// Departure steps `node` ran for lapsed leases (expired events and the
/// deadline pass).
async fn lapsed_departures(node: &Node) -> f64 {
    let (text, s) = scrape(node).await;
    value(&s, "presence_departure_steps_total{path=\"event\"}", &text)
        + value(&s, "presence_departure_steps_total{path=\"pass\"}", &text)
}

/// Two nodes stay while a third one dies with 20 devices: each lapsed lease
/// is departed once in the fleet (one node owns the expired events; the
/// deadline pass only touches lapsed keys), not once per node plus once by
/// the pass.
#[tokio::test]
async fn an_expired_lease_costs_one_departure_step_in_the_fleet() {
    const DEVICES: usize = 20;
    let redis = Redis::start();
    let a = Node::start(&redis, "once-a");
    let b = Node::start(&redis, "once-b");
    let mut victim = Node::start(&redis, "once-v");
    let users: Vec<String> = (0..DEVICES).map(|i| format!("lapse{i}")).collect();
    let names: Vec<&str> = users.iter().map(String::as_str).collect();
    let mut watcher = Client::connect(&a, "watcher", "w").await;
    watcher.watch(&names).await;
    let mut devices = Vec::new();
    for user in &names {
        devices.push(Client::connect(&victim, user, "d").await);
        watcher.expect_presence(user, "online").await;
    }
    let before = lapsed_departures(&a).await + lapsed_departures(&b).await;

    victim.kill();
    drop(devices);
    last_of_offlines(&mut watcher, DEVICES, Instant::now(), TTL).await;
    // Once the deadline entries are gone, nothing can depart them again.
    wait_until(
        "the lapsed leases' deadline entries removed",
        DEADLINE,
        || async {
            let members = index_members(&redis, "presence-leases").await;
            !members.iter().any(|m| m.starts_with("lapse"))
        },
    )
    .await;
    let steps = lapsed_departures(&a).await + lapsed_departures(&b).await - before;
    // One per lease; a node slow to handle an event may let the pass race
    // it once or twice (harmless: the step is idempotent). Before, every
    // node ran the step for every event: 2 x DEVICES at least.
    assert!(
        (DEVICES as f64..=DEVICES as f64 + 2.0).contains(&steps),
        "{steps} departure steps for {DEVICES} lapsed leases"
    );
}

/// `presence_online_users`: the users with a device, fleet-wide, counted by
/// the reconciliation pass on one node and shown by every node; a user on
/// two devices counts once, an invisible one counts, one gone does not.
#[tokio::test]
async fn online_users_is_the_fleets_count_on_every_node() {
    let redis = Redis::start();
    let fast = ["--reconcile-interval-ms", "300"];
    let a = Node::start_with(&redis, "users-a", &fast);
    let b = Node::start_with(&redis, "users-b", &fast);
    let _alice_phone = Client::connect(&a, "alice", "phone").await;
    let _alice_laptop = Client::connect(&b, "alice", "laptop").await;
    let _bob = Client::connect(&b, "bob", "phone").await;
    let mut carol = Client::connect(&a, "carol", "phone").await;
    carol
        .send(json!({"type": "status", "status": "invisible"}))
        .await;
    let dave = Client::connect(&a, "dave", "phone").await;
    dave.close().await;
    for node in [&a, &b] {
        wait_until("presence_online_users to be 3", DEADLINE, || async {
            metric(node, "presence_online_users").await == 3.0
        })
        .await;
    }
}
