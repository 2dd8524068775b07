//! Behind a proxy, as a service (issue 16, item 7): the shipped
//! deploy/nginx.conf in front of two real nodes, `--trust-proxy`, and the
//! shipped systemd unit's stop timing.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;
use serde_json::json;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::MaybeTlsStream;

fn repo_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// `text` with `from` replaced by `to`; panics when `from` is not there, so
/// that an edit of the shipped file cannot make the test run something else.
fn must_replace(text: &str, from: &str, to: &str) -> String {
    assert!(
        text.contains(from),
        "deploy/nginx.conf no longer contains {from:?}; update tests/it/proxy.rs with it"
    );
    text.replace(from, to)
}

/// nginx running the shipped deploy/nginx.conf, with test ports, in a
/// private prefix directory.
struct Nginx {
    child: Child,
    dir: tempfile::TempDir,
    addr: SocketAddr,
}

impl Nginx {
    /// Renders deploy/nginx.conf with `port` and the two `nodes`, and starts
    /// nginx in the foreground; waits until it accepts.
    async fn start(port: u16, nodes: [&Node; 2]) -> Self {
        let shipped = std::fs::read_to_string(repo_file("deploy/nginx.conf")).unwrap();
        let mut conf = must_replace(&shipped, "listen 80;", &format!("listen 127.0.0.1:{port};"));
        conf = must_replace(
            &conf,
            "server 127.0.0.1:8080 ",
            &format!("server {} ", nodes[0].addr),
        );
        conf = must_replace(
            &conf,
            "server 127.0.0.1:8081 ",
            &format!("server {} ", nodes[1].addr),
        );
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display();
        std::fs::write(dir.path().join("presence.conf"), conf).unwrap();
        // What a distribution's /etc/nginx/nginx.conf provides around it.
        let main = format!(
            "daemon off;\nworker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/error.log info;\n\
             events {{ worker_connections 256; }}\n\
             http {{\n  access_log {d}/access.log;\n  client_body_temp_path {d}/body;\n  \
             proxy_temp_path {d}/proxy;\n  fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  \
             scgi_temp_path {d}/scgi;\n  include {d}/presence.conf;\n}}\n"
        );
        std::fs::write(dir.path().join("nginx.conf"), main).unwrap();
        let child = Command::new(nginx_binary())
            .arg("-p")
            .arg(dir.path())
            .arg("-e")
            .arg(dir.path().join("error.log"))
            .arg("-c")
            .arg(dir.path().join("nginx.conf"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn nginx (install it: apt-get install nginx)");
        let nginx = Self {
            child,
            dir,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
        };
        let deadline = Instant::now() + DEADLINE;
        while tokio::net::TcpStream::connect(nginx.addr).await.is_err() {
            assert!(
                Instant::now() < deadline,
                "nginx did not start; error.log:\n{}",
                nginx.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        nginx
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("error.log")).unwrap_or_default()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn nginx_binary() -> PathBuf {
    ["/usr/sbin/nginx", "/usr/bin/nginx"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("nginx"))
}

/// Opens a WebSocket to `to` from the loopback address `from` (all of
/// 127/8 is local, so each client can have an address of its own), with an
/// `X-Forwarded-For` of its own if `forged`; waits for `hello`.
async fn connect_from(
    from: [u8; 4],
    to: SocketAddr,
    user: &str,
    device: &str,
    forged: Option<&str>,
) -> Client {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket
        .bind(SocketAddr::from((from, 0)))
        .expect("bind a 127/8 source address");
    let stream = socket.connect(to).await.unwrap();
    let url = format!("ws://{to}/ws?user={user}&device={device}");
    let mut request = url.into_client_request().unwrap();
    if let Some(forged) = forged {
        request
            .headers_mut()
            .insert("x-forwarded-for", forged.parse().unwrap());
    }
    let (ws, _) = tokio_tungstenite::client_async(request, MaybeTlsStream::Plain(stream))
        .await
        .unwrap_or_else(|e| panic!("{user}/{device} via {to}: {e}"));
    let mut client = Client::from_stream(ws, user, device);
    let hello = client.expect("hello").await;
    assert_eq!(hello["user"], user);
    client
}

/// Which of `nodes` logged `needle` (deadline-bounded).
async fn node_that_logged(nodes: &[&Node], needle: &str) -> usize {
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Some(i) = nodes.iter().position(|n| n.logs().contains(needle)) {
            return i;
        }
        if Instant::now() > deadline {
            let logs: Vec<String> = nodes.iter().map(|n| n.logs()).collect();
            panic!(
                "no node logged {needle:?}; logs:\n{}",
                logs.join("\n----\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Two nodes behind the shipped nginx config: a watch through the proxy,
/// the client IP in the node's log (not nginx's, not a forged one), a node
/// SIGKILLed behind the proxy, and its client reconnecting through the
/// proxy to the other node, seen by the watcher.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_behind_the_shipped_nginx_config() {
    let redis = Redis::start();
    let trust = ["--trust-proxy", "127.0.0.1"];
    let mut nodes = vec![
        Node::start_with(&redis, "proxied-a", &trust),
        Node::start_with(&redis, "proxied-b", &trust),
    ];
    let nginx = Nginx::start(free_port(), [&nodes[0], &nodes[1]]).await;

    // bob watches alice through the proxy, forging an X-Forwarded-For.
    let mut bob = connect_from(
        [127, 0, 0, 2],
        nginx.addr,
        "bob",
        "laptop",
        Some("198.51.100.9"),
    )
    .await;
    let snapshot = bob.watch(&["alice"]).await;
    assert_eq!(snapshot[0]["status"], "offline", "{snapshot:?}");
    let bob_node = node_that_logged(
        &[&nodes[0], &nodes[1]],
        "bob/laptop: websocket from 127.0.0.2",
    )
    .await;

    let alice = connect_from([127, 0, 0, 3], nginx.addr, "alice", "phone", None).await;
    bob.expect_presence("alice", "online").await;
    let alice_node = node_that_logged(
        &[&nodes[0], &nodes[1]],
        "alice/phone: websocket from 127.0.0.3",
    )
    .await;
    for n in &nodes {
        let logs = n.logs();
        assert!(
            !logs.contains("198.51.100.9"),
            "a forged address was believed:\n{logs}"
        );
        assert!(
            !logs.contains("websocket from 127.0.0.1"),
            "nginx's address was taken for the client's:\n{logs}"
        );
    }

    // The node holding alice dies; she comes back through the proxy, which
    // must send her to the other node.
    nodes[alice_node].kill();
    let mut alice = alice;
    alice.expect_closed().await;
    if bob_node == alice_node {
        bob.expect_closed().await;
        bob = connect_from([127, 0, 0, 2], nginx.addr, "bob", "laptop", None).await;
        bob.watch(&["alice"]).await;
    }
    let other = 1 - alice_node;
    let before = nodes[other]
        .logs()
        .matches("alice/phone: websocket from 127.0.0.3")
        .count();
    let mut alice = connect_from([127, 0, 0, 3], nginx.addr, "alice", "phone", None).await;
    wait_until(
        "alice's reconnection on the surviving node",
        DEADLINE,
        || {
            let n = nodes[other]
                .logs()
                .matches("alice/phone: websocket from 127.0.0.3")
                .count();
            async move { n > before }
        },
    )
    .await;
    // And her session works end to end through the proxy.
    alice
        .send(json!({"type":"status","status":"busy","text":"behind nginx"}))
        .await;
    let seen = bob.expect_presence("alice", "busy").await;
    assert_eq!(seen["text"], "behind nginx", "{seen}");
    drop(nginx);
}

/// `X-Forwarded-For` is believed only from a `--trust-proxy` peer: without
/// the flag, and with a flag naming another address, the node logs the
/// peer's own address; from a listed peer (CIDR), the forwarded one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_for_is_read_only_from_trusted_proxies() {
    let redis = Redis::start();
    let cases: [(&str, &[&str], &str); 3] = [
        ("plain", &[], "127.0.0.4"),
        (
            "other-proxy",
            &["--trust-proxy", "10.0.0.1,192.168.0.0/16"],
            "127.0.0.4",
        ),
        (
            "trusting",
            &["--trust-proxy", "10.0.0.1,127.0.0.0/29"],
            "203.0.113.9",
        ),
    ];
    for (id, flags, expected) in cases {
        let node = Node::start_with(&redis, id, flags);
        let _c = connect_from([127, 0, 0, 4], node.addr, "carol", id, Some("203.0.113.9")).await;
        node.wait_log(&format!("carol/{id}: websocket from {expected}"))
            .await;
        if expected != "203.0.113.9" {
            assert!(
                !node.logs().contains("203.0.113.9"),
                "{id}: the header was read from an untrusted peer:\n{}",
                node.logs()
            );
        }
    }
    // A bad value is refused at start with a clear message.
    let err = Node::spawn(
        "bad-proxy",
        &[
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--redis-url".into(),
            redis.url.clone(),
            "--trust-proxy".into(),
            "nginx.internal".into(),
        ],
        &[],
    )
    .err()
    .expect("a node with --trust-proxy nginx.internal must not start");
    assert!(
        err.contains("--trust-proxy") && err.contains("CIDR"),
        "unclear error: {err}"
    );
}

/// The value of `key=` (systemd) or `key value;` (nginx) in `text`.
fn setting<'a>(text: &'a str, key: &str) -> Vec<&'a str> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let rest = l.strip_prefix(key)?;
            // `key=` or `key value`, not a longer key that starts the same.
            let rest = rest.strip_prefix('=').or_else(|| rest.strip_prefix(' '))?;
            Some(rest.trim().trim_end_matches(';'))
        })
        .collect()
}

fn seconds(v: &str) -> u64 {
    v.trim_end_matches('s')
        .parse()
        .unwrap_or_else(|_| panic!("not a number of seconds: {v}"))
}

/// The shipped files agree with the server: nginx does not cut a session
/// that is idle between heartbeats, and systemd waits for the SIGTERM drain
/// before it SIGKILLs. A real node, SIGTERMed, drains within that time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shipped_timeouts_match_the_server() {
    let nginx = std::fs::read_to_string(repo_file("deploy/nginx.conf")).unwrap();
    let heartbeat = presence_server::config::DEFAULT_HEARTBEAT.as_secs();
    for key in ["proxy_read_timeout", "proxy_send_timeout"] {
        let v = setting(&nginx, key);
        assert_eq!(v.len(), 1, "{key}: {v:?}");
        assert!(
            seconds(v[0]) > 2 * heartbeat,
            "{key} {} must exceed two heartbeats ({heartbeat} s each)",
            v[0]
        );
    }
    for needle in [
        "proxy_set_header Upgrade $http_upgrade",
        "proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for",
        "proxy_http_version 1.1",
    ] {
        assert!(nginx.contains(needle), "deploy/nginx.conf lacks {needle}");
    }

    let unit = std::fs::read_to_string(repo_file("deploy/presence.service")).unwrap();
    let drain = presence_server::server::SHUTDOWN_TIMEOUT.as_secs();
    let stop = seconds(setting(&unit, "TimeoutStopSec")[0]);
    assert!(
        stop > drain && stop <= drain + 10,
        "TimeoutStopSec={stop} should be a little above the node's {drain} s drain"
    );
    assert_eq!(setting(&unit, "KillSignal"), ["SIGTERM"]);
    assert_eq!(setting(&unit, "User"), ["presence"]);
    assert!(!setting(&unit, "LimitNOFILE").is_empty());
    assert_eq!(setting(&unit, "Restart"), ["on-failure"]);
    // Every variable the unit sets is one the server reads.
    let help = Command::new(binary()).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for var in setting(&unit, "Environment") {
        let name = var.split('=').next().unwrap();
        if name.starts_with("PRESENCE_") {
            assert!(
                help.contains(name),
                "the unit sets {name}, which no flag reads"
            );
        }
    }

    // systemd itself accepts the unit, where it is installed (not in CI's
    // containers, usually).
    if let Ok(out) = Command::new("systemd-analyze").arg("--version").output() {
        if out.status.success() {
            let dir = tempfile::tempdir().unwrap();
            let rendered = unit
                .replace("/usr/local/bin/presence-server", binary().to_str().unwrap())
                .replace("EnvironmentFile=/", "EnvironmentFile=-/");
            let path = dir.path().join("presence.service");
            std::fs::write(&path, rendered).unwrap();
            let verify = Command::new("systemd-analyze")
                .arg("verify")
                .arg(&path)
                .output()
                .unwrap();
            let said = String::from_utf8_lossy(&verify.stderr);
            assert!(
                verify.status.success() && !said.contains("presence.service"),
                "systemd-analyze verify deploy/presence.service:\n{said}"
            );
        }
    }

    // SIGTERM, as systemd sends it: clients get 1001 and the node is gone
    // well within TimeoutStopSec.
    let redis = Redis::start();
    let mut node = Node::start(&redis, "stopping");
    let mut client = Client::connect(&node, "dave", "desk").await;
    let started = Instant::now();
    let status = node
        .signal_and_wait(libc::SIGTERM, Duration::from_secs(stop))
        .await
        .expect("node still running after TimeoutStopSec");
    let closed = client.expect_closed().await;
    assert_eq!(closed.map(|c| c.0), Some(1001));
    assert!(status.success(), "exit status {status:?}");
    assert!(started.elapsed() < Duration::from_secs(stop));
}
