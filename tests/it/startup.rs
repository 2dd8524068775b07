//! Starting a node: flags, Redis checks, the private redis-server.

use std::time::Duration;

use crate::common::*;

fn args(redis: &Redis) -> Vec<String> {
    ["--listen", "127.0.0.1:0", "--redis-url", &redis.url]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

#[test]
fn enables_expired_events_when_redis_has_them_off() {
    let redis = Redis::start_with(&["--notify-keyspace-events", ""]);
    let _node = Node::spawn("n1", &args(&redis), &[]).expect("node starts");
    let v: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("notify-keyspace-events")
        .query(&mut redis.conn())
        .unwrap();
    assert!(v[1].contains('E') && v[1].contains('x'), "{v:?}");
}

/// Where CONFIG is denied and the events are off, the node still starts
/// (the deadline pass departs lapsed leases) and says what to set.
#[test]
fn starts_and_says_what_to_set_when_expired_events_cannot_be_enabled() {
    let redis = Redis::start_with(&[
        "--notify-keyspace-events",
        "",
        "--rename-command",
        "CONFIG",
        "",
    ]);
    let node = Node::spawn("n1", &args(&redis), &[])
        .unwrap_or_else(|logs| panic!("node did not start without CONFIG:\n{logs}"));
    assert!(
        node.logs().contains("notify-keyspace-events"),
        "{}",
        node.logs()
    );
}

#[test]
fn says_how_to_install_redis_when_it_is_missing() {
    let out = std::process::Command::new(binary())
        .args(["--listen", "127.0.0.1:0"])
        .env_remove("REDIS_URL")
        .env("PATH", "/nonexistent")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("pass --redis-url (REDIS_URL)"), "{err}");
    assert!(err.contains("apt-get install -y redis-server"), "{err}");
}

#[test]
fn refuses_bad_flags_with_a_clear_message() {
    for (flags, needle) in [
        (
            vec!["--ttl-ms", "500", "--heartbeat-ms", "1000"],
            "must be longer than --heartbeat-ms",
        ),
        (vec!["--node-id", "bad:id"], "node id"),
        (vec!["--heartbeat-ms", "0"], "heartbeat-ms"),
    ] {
        let out = std::process::Command::new(binary())
            .args(&flags)
            .args([
                "--redis-url",
                "redis://127.0.0.1:1/0",
                "--listen",
                "127.0.0.1:0",
            ])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{flags:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{flags:?}: {err}");
    }
}

#[test]
fn help_documents_every_flag() {
    let out = std::process::Command::new(binary())
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--listen",
        "--redis-url",
        "--heartbeat-ms",
        "--ttl-ms",
        "--node-id",
        "REDIS_URL",
        "default: 127.0.0.1:8080",
        "15000",
    ] {
        assert!(help.contains(flag), "--help lacks {flag}:\n{help}");
    }
}

/// Without a Redis URL the node starts its own redis-server and stops it
/// when it exits.
#[tokio::test]
async fn starts_and_stops_a_private_redis() {
    let dir = tempfile::tempdir().unwrap();
    let args: Vec<String> = [
        "--listen",
        "127.0.0.1:0",
        "--local-redis-dir",
        dir.path().to_str().unwrap(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut node = Node::spawn("local", &args, &[]).unwrap_or_else(|l| panic!("{l}"));
    let (status, body) = get(&format!("{}/healthz", node.http())).await;
    assert_eq!(status, 200, "{body}");
    let logs = node.logs();
    let port: u16 = logs
        .split("private redis-server on port ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in log:\n{logs}"));
    let c = Client::connect(&node, "alice", "phone").await;
    drop(c);
    let status = node
        .signal_and_wait(libc::SIGTERM, DEADLINE)
        .await
        .expect("node exits on SIGTERM");
    assert!(status.success(), "{status}");
    wait_until("private redis gone", DEADLINE, || async move {
        std::net::TcpStream::connect_timeout(
            &([127, 0, 0, 1], port).into(),
            Duration::from_millis(100),
        )
        .is_err()
    })
    .await;
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "data dir left behind"
    );
}

/// Each start of a node claims a run number no live node holds (the lease
/// values and device fields of key schema 5 carry it), recorded with the
/// node's id; renewing writes the record back after Redis lost its data,
/// and leaves it to another node that holds the number meanwhile.
#[tokio::test]
async fn each_start_claims_a_run_of_its_own_and_renewing_keeps_it() {
    use presence_server::store::Store;
    let hold = Duration::from_secs(30);
    let mut redis = Redis::start();
    let client = redis::Client::open(redis.url.as_str()).unwrap();
    let manager = client.get_connection_manager().await.unwrap();
    let store = || Store::new(manager.clone(), Duration::from_secs(45));
    store().load_scripts().await.unwrap();
    let a = store().begin_run("a", hold).await.unwrap();
    let b = store().begin_run("b", hold).await.unwrap();
    assert_ne!(a.run(), b.run());
    assert!((1..=8191).contains(&a.run()) && (1..=8191).contains(&b.run()));
    let url = redis.url.clone();
    let record = |run: u64| {
        let url = url.clone();
        async move {
            let mut c = redis::Client::open(url.as_str())
                .unwrap()
                .get_multiplexed_async_connection()
                .await
                .unwrap();
            let (node, pttl): (Option<String>, i64) = redis::pipe()
                .get(format!("presence-run:{run}"))
                .pttl(format!("presence-run:{run}"))
                .query_async(&mut c)
                .await
                .unwrap();
            (node, pttl)
        }
    };
    let (node, pttl) = record(a.run()).await;
    assert_eq!(node.as_deref(), Some("a"));
    assert!(pttl > 20_000 && pttl <= 30_000, "pttl {pttl}");

    redis.restart_empty();
    assert_eq!(record(b.run()).await.0, None);
    // The connection manager reconnects; a command may fail meanwhile.
    wait_until("b renews its run", DEADLINE, || async {
        b.keep_run("b", hold).await.is_ok()
    })
    .await;
    assert_eq!(record(b.run()).await.0.as_deref(), Some("b"));

    // a's number was claimed by another node while a's record was gone:
    // a leaves it to that node.
    let mut c = redis.aconn().await;
    redis::cmd("SET")
        .arg(format!("presence-run:{}", a.run()))
        .arg("c")
        .query_async::<()>(&mut c)
        .await
        .unwrap();
    assert!(!a.keep_run("a", hold).await.unwrap());
    assert_eq!(record(a.run()).await.0.as_deref(), Some("c"));
    assert!(b.keep_run("b", hold).await.unwrap());
}
