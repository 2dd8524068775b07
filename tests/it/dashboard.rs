//! The monitoring the repository ships queries what a node exports: every
//! metric named by a PromQL expression of deploy/grafana/presence.json or of
//! deploy/prometheus/alerts.yml is in a real node's `/metrics`. And every
//! alert has a runbook heading in docs/operations.md and a promtool unit
//! test that fires it (deploy/prometheus/alerts_test.yml; `.ci/run` runs
//! `promtool test rules`).

use std::collections::BTreeSet;
use std::path::PathBuf;

use serde_json::json;

use crate::common::*;

const DASHBOARD: &str = "deploy/grafana/presence.json";
const ALERTS: &str = "deploy/prometheus/alerts.yml";
const ALERT_TESTS: &str = "deploy/prometheus/alerts_test.yml";

fn read(rel: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rel);
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The `expr` of every panel target of the dashboard (rows' panels too).
fn dashboard_exprs(dashboard: &serde_json::Value) -> Vec<String> {
    let mut out = Vec::new();
    let mut panels: Vec<&serde_json::Value> = Vec::new();
    panels.extend(dashboard["panels"].as_array().into_iter().flatten());
    while let Some(panel) = panels.pop() {
        panels.extend(panel["panels"].as_array().into_iter().flatten());
        for target in panel["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = target["expr"].as_str() {
                out.push(expr.to_string());
            }
        }
    }
    out
}

/// The `expr:` of every rule of a rules file: on its line, or the block
/// scalar (`expr: |`) indented below it.
fn rule_exprs(yaml: &str) -> Vec<String> {
    let lines: Vec<&str> = yaml.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(rest) = line.trim_start().strip_prefix("expr:") else {
            continue;
        };
        let rest = rest.trim();
        if rest != "|" && rest != ">" {
            out.push(rest.trim_matches(|c| c == '"' || c == '\'').to_string());
            continue;
        }
        let indent = line.len() - line.trim_start().len();
        let block: Vec<&str> = lines[i + 1..]
            .iter()
            .take_while(|l| l.trim().is_empty() || l.len() - l.trim_start().len() > indent)
            .copied()
            .collect();
        out.push(block.join("\n"));
    }
    out
}

/// PromQL words that are not metric names: operators, modifiers, and the
/// aggregations, which may be followed by `by (...)` rather than `(`.
const KEYWORDS: &str = "and or unless bool offset inf nan sum min max avg group stddev stdvar \
                        count count_values bottomk topk quantile";
/// Keywords followed by a list of label names.
const LABEL_LISTS: &str = "by without on ignoring group_left group_right";

fn is_one_of(word: &str, words: &str) -> bool {
    words.split_whitespace().any(|w| w == word)
}

/// `text` without its string literals and the insides of `{...}` (label
/// matchers) and `[...]` (ranges): what is left names metrics, functions,
/// keywords and numbers.
fn strip_matchers_and_ranges(text: &str) -> String {
    let mut out = String::new();
    let (mut quote, mut escaped, mut depth) = (None, false, 0);
    for c in text.chars() {
        if let Some(q) = quote {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == q {
                quote = None;
            }
            continue;
        }
        match c {
            '"' | '\'' | '`' => quote = Some(c),
            '{' | '[' => {
                depth += 1;
                out.push(c);
            }
            '}' | ']' => {
                depth -= 1;
                out.push(c);
            }
            _ if depth == 0 => out.push(c),
            _ => {}
        }
    }
    out
}

/// The metric names a PromQL expression queries: identifiers that are not
/// functions (followed by `(`), keywords, label lists (`by (...)`), numbers
/// or durations, or Grafana variables (`$__rate_interval`).
fn metric_names(expr: &str) -> BTreeSet<String> {
    let text: Vec<char> = strip_matchers_and_ranges(expr).chars().collect();
    let mut names = BTreeSet::new();
    let mut i = 0;
    while i < text.len() {
        let c = text[i];
        if !(c.is_alphanumeric() || c == '_' || c == ':' || c == '$') {
            i += 1;
            continue;
        }
        let start = i;
        while i < text.len() && (text[i].is_alphanumeric() || matches!(text[i], '_' | ':' | '$')) {
            i += 1;
        }
        let word: String = text[start..i].iter().collect();
        let mut next = i;
        while next < text.len() && text[next].is_whitespace() {
            next += 1;
        }
        let call = text.get(next) == Some(&'(');
        if is_one_of(&word, LABEL_LISTS) && call {
            while i < text.len() && text[i] != ')' {
                i += 1;
            }
            continue;
        }
        let number = word.starts_with(|c: char| c.is_ascii_digit());
        if !call
            && !number
            && !word.starts_with('$')
            && !is_one_of(&word, KEYWORDS)
            && !is_one_of(&word, LABEL_LISTS)
        {
            names.insert(word);
        }
    }
    names
}

/// The names a Prometheus text exposition has: its samples' (with a
/// histogram's `_bucket`, `_sum` and `_count`) and its families' (`# TYPE`).
fn exported_names(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|line| match line.strip_prefix("# TYPE ") {
            Some(family) => family.split_whitespace().next(),
            None if line.starts_with('#') => None,
            None => line.split(['{', ' ']).next(),
        })
        .filter(|name| !name.is_empty())
        .map(str::to_string)
        .collect()
}

/// Which of `queries` (source, expression) name a metric not in `exported`.
fn missing_metrics(queries: &[(String, String)], exported: &BTreeSet<String>) -> Vec<String> {
    let mut missing = Vec::new();
    for (source, expr) in queries {
        for name in metric_names(expr) {
            if !exported.contains(&name) {
                missing.push(format!("{source}: {name} (in `{}`)", expr.trim()));
            }
        }
    }
    missing
}

/// Every expression of the dashboard and of the alert rules, with its file.
fn shipped_queries() -> Vec<(String, String)> {
    let dashboard: serde_json::Value =
        serde_json::from_str(&read(DASHBOARD)).expect("the dashboard is JSON");
    let panels = dashboard_exprs(&dashboard);
    let rules = rule_exprs(&read(ALERTS));
    assert!(panels.len() >= 20, "{DASHBOARD}: {} queries", panels.len());
    assert!(rules.len() >= 8, "{ALERTS}: {} expressions", rules.len());
    let panels = panels.into_iter().map(|e| (DASHBOARD.to_string(), e));
    let rules = rules.into_iter().map(|e| (ALERTS.to_string(), e));
    panels.chain(rules).collect()
}

async fn scrape(node: &Node) -> String {
    let r = reqwest::get(format!("{}/metrics", node.http()))
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.text().await.unwrap()
}

/// A node that served a watch and a room, and lived through a Redis
/// outage (its `presence_redis_errors_total{command}` series exist only
/// once a command failed), exports every metric the dashboard and the
/// alerts query; and its `presence_redis_up` and failed refreshes followed
/// the outage.
#[tokio::test]
async fn every_metric_the_dashboard_and_the_alerts_query_is_exported() {
    let queries = shipped_queries();
    let mut redis = Redis::start();
    let node = Node::start(&redis, "dash");
    let mut alice = Client::connect(&node, "alice", "phone").await;
    alice.watch(&["bob"]).await;
    let mut bob = Client::connect(&node, "bob", "laptop").await;
    alice.expect_presence("bob", "online").await;
    crate::rooms::join(&mut bob, "lobby", json!({})).await;

    redis.kill();
    wait_until("presence_redis_up to be 0", DEADLINE, || async {
        metric(&node, "presence_redis_up").await == 0.0
    })
    .await;
    // The sessions' refreshes (one a heartbeat) fail meanwhile.
    wait_until("a refresh to fail", DEADLINE, || async {
        metric(&node, "presence_refreshes_failed_total").await >= 1.0
    })
    .await;
    redis.restart_empty();
    wait_until("presence_redis_up to be 1 again", DEADLINE, || async {
        metric(&node, "presence_redis_up").await == 1.0
    })
    .await;

    let text = scrape(&node).await;
    let exported = exported_names(&text);
    assert!(metric(&node, "process_open_fds").await > 0.0);
    let missing = missing_metrics(&queries, &exported);
    assert!(
        missing.is_empty(),
        "queried but not exported by a node:\n{}\n\n/metrics:\n{text}",
        missing.join("\n")
    );
}

/// The check catches a name no node exports, and reads names out of the
/// PromQL forms the files use.
#[test]
fn a_made_up_metric_name_is_caught() {
    let exported = exported_names(
        "# TYPE presence_sessions gauge\npresence_sessions 3\n\
         # TYPE presence_x_seconds histogram\npresence_x_seconds_bucket{le=\"1\"} 0\n",
    );
    let names = metric_names(
        "histogram_quantile(0.99, sum by (le, command) (rate(presence_x_seconds_bucket{job=~\"$job\", command=~\"feed_.*\"}[$__rate_interval])))\n\
         / on (instance) group_left presence_sessions > 0.5 unless presence_made_up_total offset 5m",
    );
    let expected = [
        "presence_made_up_total",
        "presence_sessions",
        "presence_x_seconds_bucket",
    ];
    assert_eq!(names, expected.map(String::from).into());
    let queries = [(
        "test".to_string(),
        "sum(rate(presence_made_up_total[5m])) / sum(presence_sessions)".to_string(),
    )];
    let missing = missing_metrics(&queries, &exported);
    assert_eq!(missing.len(), 1, "{missing:?}");
    assert!(missing[0].contains("presence_made_up_total"), "{missing:?}");
}

/// Every alert links to a heading of docs/operations.md and has a promtool
/// test that expects it to fire.
#[test]
fn every_alert_has_a_runbook_and_a_test_that_fires_it() {
    let alerts = read(ALERTS);
    let tests = read(ALERT_TESTS);
    let headings = crate::docs::anchors(&read("docs/operations.md"));
    let names: Vec<&str> = alerts
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .collect();
    assert!(names.len() >= 8, "{names:?}");
    let runbooks: Vec<&str> = alerts
        .lines()
        .filter_map(|l| l.trim().strip_prefix("runbook_url: docs/operations.md#"))
        .collect();
    assert_eq!(runbooks.len(), names.len(), "one runbook_url per alert");
    for anchor in runbooks {
        assert!(
            headings.iter().any(|h| h == anchor),
            "{ALERTS}: no heading #{anchor} in docs/operations.md"
        );
    }
    for name in names {
        let fired = tests.split("alertname: ").skip(1).any(|check| {
            let (alert, rest) = check.split_once('\n').unwrap_or((check, ""));
            alert.trim() == name && rest.contains("exp_labels:")
        });
        assert!(fired, "{ALERT_TESTS}: no test expects {name} to fire");
    }
}

/// What `PresenceExpiredEventsMissing` compares, on a real fleet: a lease
/// that lapses (its node killed) is heard as an expired event when Redis
/// announces them, and departed by the deadline pass with no event heard
/// when Redis is silent (`notify-keyspace-events` off, CONFIG denied).
#[tokio::test]
async fn a_lapsed_lease_is_heard_as_an_expired_event_unless_redis_is_silent() {
    const PASS: &str = "presence_departure_steps_total{path=\"pass\"}";
    const EVENT: &str = "presence_departure_steps_total{path=\"event\"}";
    const HEARD: &str = "presence_expired_events_total";
    let silent = [
        "--notify-keyspace-events",
        "",
        "--rename-command",
        "CONFIG",
        "",
    ];
    for announced in [true, false] {
        let redis = Redis::start_with(if announced { &[] } else { &silent });
        let survivor = Node::start(&redis, "survivor");
        // The survivor hears the events from before the other node starts.
        survivor.wait_log("owning the expired events").await;
        let mut doomed = Node::start(&redis, "doomed");
        let mut alice = Client::connect(&survivor, "alice", "phone").await;
        alice.watch(&["bob"]).await;
        let bob = Client::connect(&doomed, "bob", "laptop").await;
        alice.expect_presence("bob", "online").await;
        doomed.kill();
        drop(bob);
        alice.expect_presence("bob", "offline").await;
        wait_until("bob's departure counted", DEADLINE, || async {
            metric(&survivor, PASS).await + metric(&survivor, EVENT).await >= 1.0
        })
        .await;
        if announced {
            wait_until("the lapse to be heard", DEADLINE, || async {
                metric(&survivor, HEARD).await >= 1.0
            })
            .await;
        } else {
            assert_eq!(metric(&survivor, PASS).await, 1.0);
            assert_eq!(metric(&survivor, HEARD).await, 0.0);
        }
    }
}
