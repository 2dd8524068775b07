//! Configuration: the TOML file (`--config`, `PRESENCE_CONFIG`), its
//! precedence (flag > env > file > default), and log lines naming the node.

use crate::common::*;

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn config_file(dir: &tempfile::TempDir, text: &str) -> String {
    let path = dir.path().join("presence.toml");
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

/// The heartbeat, TTL and node id a running node reports.
async fn settings(node: &Node) -> (u64, u64, String) {
    let mut c = Client::connect_raw(&node.ws_url("probe", "d"), "probe", "d")
        .await
        .unwrap();
    let hello = c.expect("hello").await;
    let (_, health) = get(&format!("{}/healthz", node.http())).await;
    (
        hello["heartbeat_ms"].as_u64().unwrap(),
        hello["ttl_ms"].as_u64().unwrap(),
        health["node"].as_str().unwrap().to_string(),
    )
}

#[tokio::test]
async fn file_sets_what_flags_and_env_leave_unset() {
    let redis = Redis::start();
    let dir = tempfile::tempdir().unwrap();
    let file = config_file(
        &dir,
        &format!(
            "# every key is a flag's long name\nredis-url = \"{}\"\nheartbeat-ms = 700\nttl_ms = 5000\nnode-id = \"from-file\"\n",
            redis.url
        ),
    );
    let node = Node::spawn(
        "file",
        &s(&["--listen", "127.0.0.1:0", "--config", &file]),
        &[],
    )
    .unwrap_or_else(|logs| panic!("node did not start:\n{logs}"));
    assert_eq!(settings(&node).await, (700, 5000, "from-file".into()));
}

#[tokio::test]
async fn flag_beats_env_beats_file() {
    let redis = Redis::start();
    let dir = tempfile::tempdir().unwrap();
    let file = config_file(
        &dir,
        &format!(
            "redis-url = \"{}\"\nheartbeat-ms = 700\nttl-ms = 5000\nnode-id = \"from-file\"\n",
            redis.url
        ),
    );
    // The file named by PRESENCE_CONFIG; env overrides its node id and
    // heartbeat, the flag overrides the env's heartbeat.
    let node = Node::spawn(
        "prec",
        &s(&["--listen", "127.0.0.1:0", "--heartbeat-ms", "900"]),
        &[
            ("PRESENCE_CONFIG", file.as_str()),
            ("PRESENCE_NODE_ID", "from-env"),
            ("PRESENCE_HEARTBEAT_MS", "800"),
        ],
    )
    .unwrap_or_else(|logs| panic!("node did not start:\n{logs}"));
    assert_eq!(settings(&node).await, (900, 5000, "from-env".into()));
}

#[test]
fn bad_config_files_are_refused_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    for (text, needle) in [
        ("heartbeat-secs = 5\n", "unknown key \"heartbeat-secs\""),
        (
            "heartbeat-ms = { a = 1 }\n",
            "must be a string, number, boolean or a list",
        ),
        ("heartbeat-ms = \n", "not valid TOML"),
        ("heartbeat-ms = 5\n", "heartbeat"), // out of range, refused by the flag's own check
    ] {
        let file = config_file(&dir, text);
        let out = std::process::Command::new(binary())
            .args(["--listen", "127.0.0.1:0", "--config", &file])
            .env_remove("REDIS_URL")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{text:?} accepted");
        assert!(err.contains(needle), "{text:?}: {err}");
    }
    let out = std::process::Command::new(binary())
        .args(["--config", "/nonexistent/presence.toml"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read config file"));
}

#[tokio::test]
async fn log_lines_name_the_node_in_text_and_json() {
    let redis = Redis::start();
    let text = Node::start(&redis, "text-node");
    let _ = Client::connect(&text, "alice", "d").await;
    text.wait_log("alice/d: connected").await;
    let line = text
        .logs()
        .lines()
        .find(|l| l.contains("alice/d: connected"))
        .unwrap()
        .to_string();
    assert!(line.contains("node=text-node"), "{line}");
    assert!(line.contains("DEBUG"), "{line}");

    let json = Node::start_with(&redis, "json-node", &["--log-format", "json"]);
    let _ = Client::connect(&json, "bob", "d").await;
    json.wait_log("bob/d: connected").await;
    for line in json.logs().lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert_eq!(v["node"], "json-node", "{line}");
        for key in ["ts", "level", "target", "msg"] {
            assert!(v[key].is_string(), "{key} missing: {line}");
        }
    }
}
