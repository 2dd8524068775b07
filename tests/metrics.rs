//! `GET /metrics`: after real activity the Prometheus text shows non-zero
//! counters for sessions, transitions and expired events.

mod common;

use std::collections::HashMap;

use common::*;
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
    // Every node's listener sees the expired event, whichever node departs it.
    wait_until("an expired event counted", DEADLINE, || async {
        let (text, s) = scrape(&n1).await;
        value(&s, "presence_expired_events_total", &text) >= 1.0
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
    assert!(
        health["counters"]["expired_events"].as_u64().unwrap() >= 1,
        "{health}"
    );
    for key in ["devices_reaped", "reconcile_repairs", "online_pruned"] {
        assert!(health["counters"][key].is_u64(), "{health}");
    }
}
