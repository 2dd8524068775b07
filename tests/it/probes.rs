//! The probes a Kubernetes deployment uses (`/livez`, `/readyz`), the drain
//! after SIGTERM, `--check-config`, and a jwt node that refuses a private
//! Redis unless told.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::*;

async fn probe(node: &Node, path: &str) -> (u16, Value) {
    get(&format!("{}{path}", node.http())).await
}

#[tokio::test]
async fn livez_never_depends_on_redis_and_readyz_does() {
    let mut redis = Redis::start();
    let node = Node::start(&redis, "probed");
    let (status, body) = probe(&node, "/livez").await;
    assert_eq!(
        (status, body["node"].as_str()),
        (200, Some("probed")),
        "{body}"
    );
    let (status, body) = probe(&node, "/readyz").await;
    assert_eq!(
        (status, body["status"].as_str()),
        (200, Some("ready")),
        "{body}"
    );

    redis.kill();
    wait_until("/readyz to say Redis is unreachable", DEADLINE, || async {
        let (status, body) = probe(&node, "/readyz").await;
        status == 503 && body["reasons"].to_string().contains("redis unreachable")
    })
    .await;
    let (status, body) = probe(&node, "/livez").await;
    assert_eq!(status, 200, "/livez followed Redis down: {body}");

    redis.restart_empty();
    wait_until("/readyz to be 200 again", DEADLINE, || async {
        probe(&node, "/readyz").await.0 == 200
    })
    .await;
}

/// A Redis that answers PING but refuses writes (out of memory under
/// `noeviction`) departs no lapsed device: the deadline pass fails, and
/// `/readyz` says so; it is ready again once Redis takes writes.
#[tokio::test]
async fn readyz_follows_a_deadline_pass_that_fails() {
    let redis = Redis::start();
    let node = Node::start(&redis, "refused");
    assert_eq!(probe(&node, "/readyz").await.0, 200);
    let mut conn = redis.conn();
    let set = |conn: &mut redis::Connection, k: &str, v: &str| {
        redis::cmd("CONFIG")
            .arg("SET")
            .arg(k)
            .arg(v)
            .query::<()>(conn)
            .unwrap()
    };
    set(&mut conn, "maxmemory-policy", "noeviction");
    set(&mut conn, "maxmemory", "1");
    wait_until(
        "/readyz to say the deadline pass fails",
        DEADLINE,
        || async {
            let (status, body) = probe(&node, "/readyz").await;
            status == 503 && body["reasons"].to_string().contains("deadline pass")
        },
    )
    .await;
    let (status, body) = probe(&node, "/healthz").await;
    assert_eq!(status, 200, "Redis answers PING: {body}");
    set(&mut conn, "maxmemory", "0");
    wait_until("/readyz to be 200 again", DEADLINE, || async {
        probe(&node, "/readyz").await.0 == 200
    })
    .await;
}

/// SIGTERM: `/readyz` is 503 at once while sessions stay open and new
/// clients are still served for `--drain-delay-ms`; then every session is
/// closed with 1001 and the node exits cleanly.
#[tokio::test]
async fn sigterm_turns_readyz_away_before_the_drain() {
    let redis = Redis::start();
    let mut node = Node::start_with(&redis, "drains", &["--drain-delay-ms", "3000"]);
    let mut alice = Client::connect(&node, "alice", "phone").await;
    let signalled = Instant::now();
    unsafe {
        libc::kill(node.pid() as i32, libc::SIGTERM);
    }
    wait_until("/readyz to turn 503 on SIGTERM", DEADLINE, || async {
        let (status, body) = probe(&node, "/readyz").await;
        status == 503 && body["draining"] == true
    })
    .await;
    let turned = signalled.elapsed();
    assert!(
        turned < Duration::from_millis(2000),
        "/readyz took {turned:?} to turn 503"
    );
    assert_eq!(probe(&node, "/livez").await.0, 200);
    let (status, body) = probe(&node, "/healthz").await;
    assert_eq!(
        (status, body["status"].as_str()),
        (503, Some("draining")),
        "{body}"
    );
    // Still serving during the delay: the open session and a newcomer.
    let (waiting, closed) = alice.waiting();
    assert!(!closed, "closed before the drain delay: {waiting:?}");
    let bob = Client::try_connect(&node, "bob", "laptop").await;
    assert!(bob.is_some(), "a client was refused during the drain delay");

    let (code, _) = alice.expect_closed().await.expect("a close frame");
    assert_eq!(code, 1001);
    assert!(
        signalled.elapsed() >= Duration::from_millis(3000),
        "closed after {:?}, before the 3 s delay",
        signalled.elapsed()
    );
    let status = node.wait_exit(DEADLINE).await.expect("the node exits");
    assert!(status.success(), "{status:?}\n{}", node.logs());
    assert!(node.logs().contains("--drain-delay-ms"), "{}", node.logs());
}

fn spawn_without_redis(id: &str, extra: &[&str]) -> Result<Node, String> {
    let mut args: Vec<String> = ["--listen", "127.0.0.1:0", "--node-id", id]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    Node::spawn(id, &args, &[])
}

#[tokio::test]
async fn a_jwt_node_needs_a_shared_redis_unless_told() {
    let secret = "0123456789abcdef0123456789abcdef";
    let jwt = ["--auth", "jwt", "--jwt-secret", secret];
    let Err(logs) = spawn_without_redis("no-redis", &jwt) else {
        panic!("a jwt node started without a Redis URL");
    };
    assert!(
        logs.contains("--redis-url") && logs.contains("--local-redis"),
        "the refusal names neither flag: {logs}"
    );

    let with_local: Vec<&str> = jwt.iter().copied().chain(["--local-redis"]).collect();
    let node = spawn_without_redis("local", &with_local).expect("--local-redis starts");
    assert_eq!(probe(&node, "/readyz").await.0, 200);
    drop(node);

    let dev = spawn_without_redis("dev", &[]).expect("a dev node starts its own Redis");
    dev.wait_log("WARN").await;
    assert!(
        dev.logs().contains("private redis-server"),
        "{}",
        dev.logs()
    );
}

/// `presence-server --check-config` with `args` and `env`: exit code,
/// stdout, stderr.
fn check_config(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = Command::new(binary());
    cmd.arg("--check-config").args(args).env_remove("REDIS_URL");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run presence-server --check-config");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn check_config_prints_the_effective_settings_with_secrets_masked() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("presence.toml");
    std::fs::write(&file, "heartbeat-ms = 12000\nmax-watches = 77\n").unwrap();
    let secret = "0123456789abcdef0123456789abcdef";
    let (code, out, err) = check_config(
        &[
            "--auth",
            "jwt",
            "--max-watches",
            "88",
            "--config",
            file.to_str().unwrap(),
        ],
        &[
            ("REDIS_URL", "redis://app:hunter2hunter2@10.0.0.6:6379/0"),
            ("PRESENCE_JWT_SECRET", secret),
        ],
    );
    assert_eq!(code, 0, "{out}\n{err}");
    for line in [
        "--auth = jwt  # flag",
        "--max-watches = 88  # flag",
        "--heartbeat-ms = 12000  # config file",
        "--redis-url = redis://app:***@10.0.0.6:6379/0  # env REDIS_URL",
        "--jwt-secret = ***  # env PRESENCE_JWT_SECRET",
        "--max-frame-bytes = 65536  # default",
        "# lease ttl 36000 ms, heartbeat 12000 ms",
        "# configuration ok",
    ] {
        assert!(out.lines().any(|l| l == line), "no {line:?} in:\n{out}");
    }
    assert!(!out.contains(secret) && !out.contains("hunter2"), "{out}");
}

/// A secret in a webhook URL (user info, a token in the query) is not
/// printed, and a `PRESENCE_*` variable no flag reads is named.
#[test]
fn check_config_masks_urls_and_names_unread_variables() {
    let (code, out, err) = check_config(
        &["--webhook-url", "https://u:hookpw@hook.example/x?token=qq"],
        &[
            ("PRESENCE_ALLOWED_ORIGIN", "https://app.example"),
            ("PRESENCE_WEBHOOK_SECRET", "0123456789abcdef0123"),
        ],
    );
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.lines()
            .any(|l| l == "--webhook-url = https://u:***@hook.example/x?***  # flag"),
        "{out}"
    );
    assert!(!out.contains("hookpw") && !out.contains("qq"), "{out}");
    assert!(
        out.contains("# warning: PRESENCE_ALLOWED_ORIGIN is set, but no flag reads it"),
        "{out}"
    );
}

#[test]
fn check_config_refuses_what_a_start_would_refuse() {
    let secret = "0123456789abcdef0123456789abcdef";
    for (args, needle) in [
        (
            vec!["--auth", "jwt", "--jwt-secret", secret],
            "--local-redis",
        ),
        (
            vec!["--room-policy", "token"],
            "--room-policy token needs --auth jwt",
        ),
        (
            vec!["--heartbeat-ms", "1000", "--ttl-ms", "500"],
            "--ttl-ms",
        ),
        (
            vec!["--listen", "0.0.0.0:8080"],
            "--allow-insecure-dev-auth",
        ),
        (
            vec!["--internal-listen", "no-such-host.invalid:x"],
            "--internal-listen",
        ),
        (
            vec![
                "--jwt-secret-file",
                "/nonexistent/secret",
                "--auth",
                "jwt",
                "--local-redis",
            ],
            "/nonexistent/secret",
        ),
        (vec!["--redis-url", "notaurl"], "has no scheme"),
        (
            vec!["--redis-url", "redis://h:1,foo://h:2"],
            "unknown scheme \"foo\"",
        ),
        (
            vec!["--redis-sentinel", "h:26379"],
            "--redis-sentinel-master",
        ),
        (
            vec![
                "--redis-url",
                "rediss://h:6380",
                "--redis-tls-ca-file",
                "/nonexistent/ca.pem",
            ],
            "/nonexistent/ca.pem",
        ),
        (
            vec![
                "--redis-url",
                "redis://h:6379",
                "--redis-tls-ca-file",
                "/etc/hostname",
            ],
            "TLS URL",
        ),
        (
            vec!["--internal-listen", "127.0.0.1:8080"],
            "same address as --listen",
        ),
    ] {
        let (code, out, err) = check_config(&args, &[]);
        assert_eq!(code, 1, "{args:?} passed:\n{out}");
        assert!(err.contains(needle), "{args:?}: {needle:?} not in: {err}");
        assert!(!out.contains("configuration ok"), "{out}");
    }
    let (code, _, err) = check_config(&["--no-such-flag"], &[]);
    assert_eq!(code, 2, "{err}");
}
