//! A Sentinel-managed Redis: a primary, a replica and three sentinels on
//! loopback ports; the primary is killed with SIGKILL and the nodes must
//! follow the promoted replica.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;
use serde_json::Value;

/// The master name the sentinels monitor.
const MASTER: &str = "mymaster";

/// Polls `cond` until it holds; Err after 3 x [`DEADLINE`].
fn try_wait_for(mut cond: impl FnMut() -> bool) -> Result<(), ()> {
    let deadline = Instant::now() + DEADLINE * 3;
    while !cond() {
        if Instant::now() > deadline {
            return Err(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// Polls `cond` until it holds; panics with `what` after 3 x [`DEADLINE`].
fn wait_for(what: &str, cond: impl FnMut() -> bool) {
    try_wait_for(cond).unwrap_or_else(|()| panic!("timed out waiting for {what}"));
}

/// A redis-server with the project's redis.conf on `port`.
fn data_node(dir: &Path, port: u16, extra: &[&str]) -> Proc {
    let dir = dir.join(port.to_string());
    std::fs::create_dir_all(&dir).unwrap();
    let child = presence_bench::procs::redis_server(port, &dir, extra)
        .expect("a copy of redis.conf")
        .spawn()
        .expect("redis-server");
    Proc(child)
}

/// A redis-sentinel on `port` monitoring the primary on `primary`.
fn sentinel(dir: &Path, port: u16, primary: u16) -> Proc {
    let conf = dir.join(format!("sentinel-{port}.conf"));
    std::fs::write(
        &conf,
        format!(
            "port {port}\nbind 127.0.0.1\ndir {}\n\
             sentinel monitor {MASTER} 127.0.0.1 {primary} 2\n\
             sentinel down-after-milliseconds {MASTER} 1000\n\
             sentinel failover-timeout {MASTER} 10000\n\
             sentinel parallel-syncs {MASTER} 1\n",
            dir.display()
        ),
    )
    .unwrap();
    let child = Command::new("redis-sentinel")
        .arg(&conf)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-sentinel must be installed (apt-get install -y redis-sentinel)");
    Proc(child)
}

/// The port of the primary a sentinel names now.
fn named_primary(sentinel: u16) -> Option<u16> {
    let mut c = conn_at(sentinel).ok()?;
    let addr: Option<(String, String)> = redis::cmd("SENTINEL")
        .arg("get-master-addr-by-name")
        .arg(MASTER)
        .query(&mut c)
        .ok()?;
    addr?.1.parse().ok()
}

/// A field of `SENTINEL master <name>` on one sentinel.
fn master_field(sentinel: u16, field: &str) -> Option<String> {
    let mut c = conn_at(sentinel).ok()?;
    let v: Vec<String> = redis::cmd("SENTINEL")
        .arg("master")
        .arg(MASTER)
        .query(&mut c)
        .ok()?;
    v.chunks(2)
        .find(|kv| kv[0] == field)
        .map(|kv| kv[1].clone())
}

/// Waits for the next `presence` frame of `user`, skipping others.
async fn next_presence_of(c: &mut Client, node: &Node, user: &str, within: Duration) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match c.next_within(left).await {
            Some(Incoming::Frame(v)) if v["type"] == "presence" && v["user"] == user => return v,
            Some(Incoming::Frame(_)) => {}
            other => panic!(
                "waiting for {user}'s presence within {within:?}: got {other:?}; node log:\n{}",
                node.logs()
            ),
        }
    }
}

// Several threads: the sentinel polls below block, and the clients must keep
// answering pings meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_follow_a_sentinel_failover() {
    let dir = tempfile::tempdir().unwrap();
    let (p, r) = (free_port(), free_port());
    let mut primary = data_node(dir.path(), p, &[]);
    let _replica = data_node(dir.path(), r, &["--replicaof", "127.0.0.1", &p.to_string()]);
    try_wait_for(|| {
        conn_at(r)
            .and_then(|mut c| {
                redis::cmd("INFO")
                    .arg("replication")
                    .query::<String>(&mut c)
            })
            .is_ok_and(|info| info.contains("master_link_status:up"))
    })
    .unwrap_or_else(|()| {
        let log = std::fs::read_to_string(dir.path().join(r.to_string()).join("redis.log"));
        panic!("the replica did not sync:\n{}", log.unwrap_or_default())
    });
    let ports = [free_port(), free_port(), free_port()];
    let _sentinels: Vec<Proc> = ports.iter().map(|&s| sentinel(dir.path(), s, p)).collect();
    for &s in &ports {
        wait_for("each sentinel to know the others and the replica", || {
            master_field(s, "num-other-sentinels").as_deref() == Some("2")
                && master_field(s, "num-slaves").as_deref() == Some("1")
        });
    }

    let url = format!(
        "redis+sentinel://{}/{MASTER}",
        ports.map(|s| format!("127.0.0.1:{s}")).join(",")
    );
    let start = |id: &str| {
        let args: Vec<String> = [
            "--listen",
            "127.0.0.1:0",
            "--heartbeat-ms",
            "500",
            "--node-id",
            id,
            "--redis-url",
            &url,
            "--reconcile-interval-ms",
            "1000",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        Node::spawn(id, &args, &[])
            .unwrap_or_else(|logs| panic!("node {id} did not start:\n{logs}"))
    };
    let mut a = start("a");
    let b = start("b");
    let mut watcher = Client::connect(&b, "watcher", "w").await;
    watcher.watch(&["alice", "carol", "dave"]).await;
    let mut carol = Client::connect(&b, "carol", "laptop").await;
    next_presence_of(&mut watcher, &b, "carol", DEADLINE).await;
    let _alice = Client::connect(&a, "alice", "phone").await;
    next_presence_of(&mut watcher, &b, "alice", DEADLINE).await;
    // Everything so far is on the replica before the primary dies.
    let acked: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(2000)
        .query(&mut conn_at(p).unwrap())
        .unwrap();
    assert_eq!(acked, 1);

    // The primary dies, and with node a alice's device vanishes unannounced.
    primary.kill();
    a.kill();
    let killed = Instant::now();
    wait_for("the sentinels to promote the replica", || {
        named_primary(ports[0]) == Some(r)
    });
    let failover = killed.elapsed();
    eprintln!("failover took {failover:?}");

    // A silently dropped device goes offline within TTL + failover + 1.5 s.
    let bound = TTL + failover + Duration::from_millis(1500);
    let ev = next_presence_of(&mut watcher, &b, "alice", bound + DEADLINE).await;
    let took = killed.elapsed();
    assert_eq!(ev["status"], "offline", "{ev}");
    assert!(
        took <= bound,
        "alice offline after {took:?}, bound {bound:?}"
    );
    eprintln!("alice offline {took:?} after the kill (bound {bound:?})");

    // New arrivals are announced (through the new primary).
    let mut dave = None;
    let deadline = Instant::now() + DEADLINE;
    while dave.is_none() {
        dave = Client::try_connect(&b, "dave", "tab").await;
        assert!(
            Instant::now() < deadline,
            "dave never connected after the failover"
        );
    }
    let ev = next_presence_of(&mut watcher, &b, "dave", DEADLINE).await;
    assert_eq!(ev["status"], "online", "{ev}");

    // Sessions opened before the failover are still open and online.
    carol.send(serde_json::json!({"type": "heartbeat"})).await;
    while let Some(item) = carol.try_next() {
        assert!(
            !matches!(item, Incoming::Closed(_)),
            "carol was closed: {item:?}"
        );
    }
    // A failover longer than the TTL (1.5 s here) lapses carol's lease
    // while Redis is away; her next refresh on the new primary claims it
    // again, within a heartbeat or two.
    let presence = format!("{}/api/presence/carol", b.http());
    wait_until(
        "carol online through the new primary",
        Duration::from_secs(3),
        || async {
            let (status, body) = get(&presence).await;
            status == 200 && body["status"] == "online"
        },
    )
    .await;
    // /healthz answers from a check made every 0.5 s: it catches up.
    wait_until(
        "/healthz to see the new primary",
        Duration::from_secs(2),
        || async { get(&format!("{}/healthz", b.http())).await.0 == 200 },
    )
    .await;

    // What a stale replica lost or kept wrong is repaired by reconciliation
    // on the new primary. Simulated: a replica that missed the last writes
    // cannot be made here without a network partition (a stopped replica
    // still gets them from its socket buffer), so the counter is set wrong
    // on the promoted replica, as a lost DECR would leave it.
    let mut np = conn_at(r).unwrap();
    let () = redis::cmd("SET")
        .arg("presence-count:{carol}")
        .arg(7)
        .query(&mut np)
        .unwrap();
    wait_for("reconciliation to repair carol's counter", || {
        redis::cmd("GET")
            .arg("presence-count:{carol}")
            .query::<Option<i64>>(&mut np)
            .is_ok_and(|v| v == Some(1))
    });
    assert!(
        b.logs().contains("connected to the primary of"),
        "{}",
        b.logs()
    );
    assert!(!b.logs().contains("panicked"), "{}", b.logs());
}
