//! Arbitrary input to the HTTP API and to a live session: never a 5xx, never
//! a panic, always a typed error, and the node keeps working.

use crate::common::*;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, TestRunner};
use serde_json::Value;
use tokio_tungstenite::tungstenite::Message;

fn percent_encode(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("%{b:02X}")).collect()
}

/// Sends `req` and returns the status and body.
fn fetch(rt: &tokio::runtime::Runtime, req: reqwest::RequestBuilder) -> (u16, String) {
    rt.block_on(async {
        let r = req.send().await.unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    })
}

/// A 4xx must carry `{code, message}`; anything else must be a 2xx.
fn assert_typed(what: &str, status: u16, body: &str) {
    assert!(status < 500, "{what}: {status} {body}");
    if status >= 400 {
        let v: Value = serde_json::from_str(body)
            .unwrap_or_else(|_| panic!("{what}: {status} non-JSON error {body:?}"));
        assert!(
            v["code"].is_string() && v["message"].is_string(),
            "{what}: {status} {body}"
        );
    }
}

#[test]
fn http_handlers_answer_arbitrary_input_with_typed_errors() {
    let redis = Redis::start();
    let node = Node::start(&redis, "n1");
    let base = node.http();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let http = reqwest::Client::new();
    let mut runner = TestRunner::new(Config {
        cases: 300,
        ..Config::default()
    });

    runner
        .run(&prop::collection::vec(any::<u8>(), 0..80), |bytes| {
            let url = format!("{base}/api/presence/{}", percent_encode(&bytes));
            let (status, body) = fetch(&rt, http.get(&url));
            assert_typed(&url, status, &body);
            Ok(())
        })
        .unwrap();

    runner
        .run(&prop::collection::vec(any::<u8>(), 0..300), |bytes| {
            let (status, body) = fetch(
                &rt,
                http.post(format!("{base}/api/presence/query"))
                    .header("content-type", "application/json")
                    .body(bytes.clone()),
            );
            assert_typed(&format!("query {bytes:?}"), status, &body);
            Ok(())
        })
        .unwrap();

    let users = prop::collection::vec(prop_oneof![".{0,10}", Just("bob".to_string())], 0..20);
    runner
        .run(&users, |users| {
            let (status, body) = fetch(
                &rt,
                http.post(format!("{base}/api/presence/query"))
                    .json(&serde_json::json!({ "users": users })),
            );
            assert_typed(&format!("query {users:?}"), status, &body);
            Ok(())
        })
        .unwrap();

    runner
        .run(
            &(
                prop::collection::vec(any::<u8>(), 0..40),
                prop::collection::vec(any::<u8>(), 0..40),
            ),
            |(a, b)| {
                for url in [
                    format!(
                        "{base}/api/online?limit={}&cursor={}",
                        percent_encode(&a),
                        percent_encode(&b)
                    ),
                    format!(
                        "{base}/ws?user={}&device={}",
                        percent_encode(&a),
                        percent_encode(&b)
                    ),
                ] {
                    let (status, body) = fetch(&rt, http.get(&url));
                    assert_typed(&url, status, &body);
                }
                Ok(())
            },
        )
        .unwrap();

    let (status, _) = rt.block_on(get(&format!("{base}/healthz")));
    assert_eq!(status, 200, "node log:\n{}", node.logs());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_survives_arbitrary_frames() {
    let redis = Redis::start();
    let node = Node::start_with(&redis, "n1", &["--max-frames-per-sec", "100000"]);
    let mut c = Client::connect(&node, "alice", "phone").await;
    let mut runner = TestRunner::new(Config {
        cases: 300,
        ..Config::default()
    });
    let kind = prop_oneof![
        Just("watch".to_string()),
        Just("unwatch".to_string()),
        Just("status".to_string()),
        Just("heartbeat".to_string()),
        ".{0,6}",
    ];
    let strategy = prop_oneof![
        ".{0,100}".prop_map(|s| Message::Text(s.into())),
        prop::collection::vec(any::<u8>(), 0..100).prop_map(|b| Message::Binary(b.into())),
        (kind, ".{0,40}")
            .prop_map(|(t, rest)| Message::Text(format!(r#"{{"type":"{t}",{rest}}}"#).into())),
    ];
    let frames: Vec<Message> = (0..300)
        .map(|_| strategy.new_tree(&mut runner).unwrap().current())
        .collect();
    for frame in frames {
        c.send_raw(frame).await;
    }
    // Every frame gets at most one answer; then a valid watch still works.
    c.send(serde_json::json!({"type":"watch","users":["alice"]}))
        .await;
    loop {
        let v = c.recv().await;
        match v["type"].as_str() {
            Some("snapshot") => {
                if v["presence"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|r| r["user"] == "alice")
                {
                    assert_eq!(v["presence"][0]["user"], "alice");
                    break;
                }
            }
            Some("error") => assert!(v["code"].is_string() && v["message"].is_string(), "{v}"),
            Some("presence") => {}
            other => panic!("unexpected frame {other:?}: {v}"),
        }
    }
    assert_eq!(count(&redis, "alice").await, 1);
}
