//! Running against managed Redis: TLS with a private CA, an ACL user with
//! the documented least privileges, CONFIG denied with expired events on and
//! off, an evicting policy, and failures that are fast, clear and free of
//! passwords.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

/// Runs openssl in `dir`; panics with its output on failure.
fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("openssl must be installed (apt-get install -y openssl)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A self-signed CA `<name>.crt` / `<name>.key` in `dir`.
fn make_ca(dir: &Path, name: &str) -> PathBuf {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "2",
            "-subj",
            &format!("/CN={name}"),
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.crt"),
        ],
    );
    dir.join(format!("{name}.crt"))
}

/// A certificate `<name>.crt` / `<name>.key` for 127.0.0.1 and localhost,
/// signed by the CA `<ca>`.
fn make_cert(dir: &Path, ca: &str, name: &str) -> (PathBuf, PathBuf) {
    std::fs::write(
        dir.join(format!("{name}.ext")),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n",
    )
    .unwrap();
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-subj",
            &format!("/CN={name}"),
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.csr"),
        ],
    );
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            &format!("{ca}.crt"),
            "-CAkey",
            &format!("{ca}.key"),
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &format!("{name}.ext"),
            "-out",
            &format!("{name}.crt"),
        ],
    );
    (
        dir.join(format!("{name}.crt")),
        dir.join(format!("{name}.key")),
    )
}

/// Waits until something accepts TCP connections on `port`.
fn wait_port(port: u16) {
    let deadline = Instant::now() + DEADLINE;
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nothing listens on {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A redis-server with the project's redis.conf that speaks only TLS, with
/// the certificate `server` of the CA `ca`, requiring client certificates.
fn tls_redis(dir: &Path) -> (Proc, u16) {
    let port = free_port();
    let child = presence_bench::procs::redis_server(
        0,
        dir,
        &[
            "--tls-port",
            &port.to_string(),
            "--tls-cert-file",
            "server.crt",
            "--tls-key-file",
            "server.key",
            "--tls-ca-cert-file",
            "ca.crt",
            "--tls-auth-clients",
            "yes",
            "--requirepass",
            "tls-secret-pw",
        ],
    )
    .expect("a copy of redis.conf")
    .current_dir(dir)
    .spawn()
    .expect("redis-server");
    let proc = Proc(child);
    wait_port(port);
    (proc, port)
}

/// Runs the server binary to its exit (or kills it after `limit`); returns
/// whether it exited, its stderr and how long it ran.
fn run_to_exit(args: &[&str], limit: Duration) -> (Option<i32>, String, Duration) {
    let started = Instant::now();
    let mut child = Command::new(binary())
        .args(["--listen", "127.0.0.1:0", "--heartbeat-ms", "500"])
        .args(args)
        .env("RUST_LOG", "presence_server=debug,info")
        .env_remove("REDIS_URL")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut code = None;
    while started.elapsed() < limit {
        if let Some(status) = child.try_wait().unwrap() {
            code = Some(status.code().unwrap_or(-1));
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let elapsed = started.elapsed();
    if code.is_none() {
        let _ = child.kill();
    }
    let out = child.wait_with_output().unwrap();
    (code, String::from_utf8_lossy(&out.stderr).into(), elapsed)
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

/// Over `rediss://` with a private CA and a client certificate, the server
/// works: a device goes online and offline for its watcher.
#[tokio::test]
async fn tls_with_a_private_ca_and_client_certificate_works() {
    let dir = tempfile::tempdir().unwrap();
    let ca = make_ca(dir.path(), "ca");
    make_cert(dir.path(), "ca", "server");
    let (cert, key) = make_cert(dir.path(), "ca", "client");
    let (_redis, port) = tls_redis(dir.path());
    let url = format!("rediss://:tls-secret-pw@127.0.0.1:{port}/0");
    let args = [
        "--listen",
        "127.0.0.1:0",
        "--heartbeat-ms",
        "500",
        "--node-id",
        "tls1",
        "--redis-url",
        &url,
        "--redis-tls-ca-file",
        ca.to_str().unwrap(),
        "--redis-tls-cert-file",
        cert.to_str().unwrap(),
        "--redis-tls-key-file",
        key.to_str().unwrap(),
    ];
    let node = Node::spawn("tls1", &strings(&args), &[])
        .unwrap_or_else(|logs| panic!("node did not start over TLS:\n{logs}"));
    let mut watcher = Client::connect(&node, "watcher", "w").await;
    watcher.watch(&["alice"]).await;
    let phone = Client::connect(&node, "alice", "phone").await;
    watcher.expect_presence("alice", "online").await;
    phone.close().await;
    watcher.expect_presence("alice", "offline").await;
    let (status, body) = get(&format!("{}/healthz", node.http())).await;
    assert_eq!(status, 200, "{body}");
    assert!(!node.logs().contains("tls-secret-pw"), "{}", node.logs());
}

/// A server certificate from another CA is refused at start: a non-zero
/// exit within 15 s saying it is a TLS certificate problem, naming the host,
/// without the password.
#[test]
fn tls_with_the_wrong_ca_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    make_ca(dir.path(), "ca");
    make_cert(dir.path(), "ca", "server");
    let (cert, key) = make_cert(dir.path(), "ca", "client");
    let other = make_ca(dir.path(), "other-ca");
    let (_redis, port) = tls_redis(dir.path());
    let url = format!("rediss://:tls-secret-pw@127.0.0.1:{port}/0");
    let (code, err, elapsed) = run_to_exit(
        &[
            "--redis-url",
            &url,
            "--redis-tls-ca-file",
            other.to_str().unwrap(),
            "--redis-tls-cert-file",
            cert.to_str().unwrap(),
            "--redis-tls-key-file",
            key.to_str().unwrap(),
        ],
        Duration::from_secs(15),
    );
    assert!(
        matches!(code, Some(c) if c != 0),
        "exit {code:?} after {elapsed:?}:\n{err}"
    );
    eprintln!(
        "refused after {elapsed:?}: {}",
        err.lines().last().unwrap_or("")
    );
    assert!(err.contains("TLS certificate problem"), "{err}");
    assert!(err.contains(&format!("127.0.0.1:{port}")), "{err}");
    assert!(!err.contains("tls-secret-pw"), "{err}");
}

/// The least-privilege ACL line documented in docs/operations.md, as written there.
fn documented_acl_line(password: &str) -> Vec<String> {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/operations.md"))
            .unwrap();
    let line = readme
        .lines()
        .find(|l| l.trim_start().starts_with("ACL SETUSER presence "))
        .expect("docs/operations.md documents `ACL SETUSER presence ...`");
    line.split_whitespace()
        .map(|w| {
            if w == ">CHANGE-ME" {
                format!(">{password}")
            } else {
                w.to_string()
            }
        })
        .collect()
}

/// With exactly the documented ACL user and the default user disabled, the
/// server starts (no CONFIG) and presence works, including an expired lease.
#[tokio::test]
async fn runs_as_the_documented_least_privilege_acl_user() {
    let redis = Redis::start();
    {
        let mut c = redis.conn();
        let mut setuser = redis::cmd("ACL");
        for w in &documented_acl_line("acl-pw-123")[1..] {
            setuser.arg(w);
        }
        let () = setuser
            .query(&mut c)
            .expect("the documented ACL line is valid");
        let () = redis::cmd("ACL")
            .arg("SETUSER")
            .arg("default")
            .arg("off")
            .query(&mut c)
            .unwrap();
    }
    let url = format!("redis://presence:acl-pw-123@127.0.0.1:{}/0", redis.port);
    let start = |id: &str| {
        let args = [
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
        ];
        Node::spawn(id, &strings(&args), &[])
            .unwrap_or_else(|logs| panic!("node {id} did not start as the ACL user:\n{logs}"))
    };
    let mut a = start("acl-a");
    let b = start("acl-b");
    let mut watcher = Client::connect(&b, "watcher", "w").await;
    watcher.watch(&["alice"]).await;
    let mut phone = Client::connect(&a, "alice", "phone").await;
    watcher.expect_presence("alice", "online").await;
    let (status, body) = get(&format!("{}/api/presence/alice", b.http())).await;
    assert_eq!((status, &body["status"]), (200, &"online".into()), "{body}");
    // Rooms too: their channels are among the ACL's.
    for c in [&mut watcher, &mut phone] {
        c.send(serde_json::json!({"type": "join", "room": "doc:1"}))
            .await;
        assert_eq!(c.expect("room").await["room"], "doc:1");
    }
    let joined = watcher.expect("room_join").await;
    assert_eq!(joined["user"], "alice", "{joined}");
    phone
        .send(serde_json::json!({"type": "signal", "room": "doc:1", "data": "hi"}))
        .await;
    assert_eq!(watcher.expect("signal").await["data"], "hi");
    a.kill();
    let killed = Instant::now();
    // Both, in either order.
    let (mut offline, mut left) = (false, false);
    while !(offline && left) {
        let v = watcher.recv().await;
        match v["type"].as_str() {
            Some("presence") if v["user"] == "alice" && v["status"] == "offline" => offline = true,
            Some("room_leave") if v["user"] == "alice" => left = true,
            _ => panic!("unexpected {v}"),
        }
    }
    assert!(
        killed.elapsed() <= TTL + Duration::from_millis(1500),
        "{:?}",
        killed.elapsed()
    );
    for node in [&a, &b] {
        assert!(!node.logs().contains("NOPERM"), "{}", node.logs());
    }
}

/// Two nodes on `redis` (with `url`); a device on the first, a watcher on
/// the second; the first is killed (its device vanishes without a goodbye)
/// and the watcher must see `offline` within TTL + 1.5 s.
async fn vanished_device_goes_offline_in_time(url: &str) -> (Node, Node) {
    let start = |id: &str| {
        let args = [
            "--listen",
            "127.0.0.1:0",
            "--heartbeat-ms",
            "500",
            "--node-id",
            id,
            "--redis-url",
            url,
        ];
        Node::spawn(id, &strings(&args), &[])
            .unwrap_or_else(|logs| panic!("node {id} did not start:\n{logs}"))
    };
    let mut a = start("a");
    let b = start("b");
    let mut watcher = Client::connect(&b, "watcher", "w").await;
    watcher.watch(&["alice"]).await;
    let _phone = Client::connect(&a, "alice", "phone").await;
    watcher.expect_presence("alice", "online").await;
    a.kill();
    let killed = Instant::now();
    watcher.expect_presence("alice", "offline").await;
    let took = killed.elapsed();
    assert!(
        took <= TTL + Duration::from_millis(1500),
        "offline after {took:?}"
    );
    (a, b)
}

/// CONFIG denied but expired events on (the usual managed service): the
/// node starts (the probe key's event arrives) and a vanished device goes
/// offline in time.
#[tokio::test]
async fn config_denied_with_expired_events_on_starts() {
    let redis = Redis::start_with(&["--rename-command", "CONFIG", ""]);
    let (_a, b) = vanished_device_goes_offline_in_time(&redis.url).await;
    assert!(
        b.logs().contains("expired-key events arrive"),
        "{}",
        b.logs()
    );
    let (_, body) = get(&format!("{}/healthz", b.http())).await;
    assert_eq!(body["redis_details"]["expired_events"], "on", "{body}");
}

/// CONFIG denied and expired events off: the node starts with a warning
/// naming the setting, and the deadline pass alone departs the vanished
/// device in time.
#[tokio::test]
async fn config_denied_with_expired_events_off_still_goes_offline_in_time() {
    let redis = Redis::start_with(&[
        "--notify-keyspace-events",
        "",
        "--rename-command",
        "CONFIG",
        "",
    ]);
    let (_a, b) = vanished_device_goes_offline_in_time(&redis.url).await;
    let logs = b.logs();
    assert!(
        logs.contains("set `notify-keyspace-events` to `Ex` in your provider's console"),
        "{logs}"
    );
    let (_, body) = get(&format!("{}/healthz", b.http())).await;
    assert!(
        body["redis_details"]["expired_events"]
            .as_str()
            .unwrap()
            .starts_with("off"),
        "{body}"
    );
}

/// An evicting policy is warned about at start and shown by /healthz.
#[tokio::test]
async fn an_evicting_policy_is_warned_about() {
    let redis = Redis::start_with(&["--maxmemory-policy", "allkeys-lru"]);
    let node = Node::start(&redis, "n1");
    assert!(
        node.logs().contains("maxmemory-policy is allkeys-lru"),
        "{}",
        node.logs()
    );
    let (status, body) = get(&format!("{}/healthz", node.http())).await;
    assert_eq!(status, 200);
    assert_eq!(body["redis_details"]["maxmemory_policy"], "allkeys-lru");
    assert!(
        body["redis_details"]["eviction_warning"]
            .as_str()
            .is_some_and(|w| w.contains("noeviction")),
        "{body}"
    );
}

/// With Redis gone, /healthz answers from cached state within 100 ms and
/// REST answers 503 within 2 s; the loss is logged once.
#[tokio::test]
async fn failures_are_fast_when_redis_goes_away() {
    let mut redis = Redis::start();
    let node = Node::start(&redis, "n1");
    let _phone = Client::connect(&node, "alice", "phone").await;
    let (status, _) = get(&format!("{}/healthz", node.http())).await;
    assert_eq!(status, 200);
    redis.kill();

    let http = reqwest::Client::new();
    let started = Instant::now();
    loop {
        let asked = Instant::now();
        let r = http
            .get(format!("{}/healthz", node.http()))
            .send()
            .await
            .unwrap();
        let took = asked.elapsed();
        assert!(took < Duration::from_millis(100), "/healthz took {took:?}");
        if r.status() == 503 {
            let body: serde_json::Value = r.json().await.unwrap();
            assert_eq!(body["redis"], "down", "{body}");
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "/healthz never said 503"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for _ in 0..3 {
        let asked = Instant::now();
        let r = http
            .get(format!("{}/api/presence/alice", node.http()))
            .send()
            .await
            .unwrap();
        let took = asked.elapsed();
        assert_eq!(r.status(), 503);
        assert!(
            took < Duration::from_secs(2),
            "REST answered after {took:?}"
        );
    }
    let logs = node.logs();
    let said = logs.matches(" unreachable: ").count();
    assert_eq!(said, 1, "the loss should be logged once:\n{logs}");
}

/// With Redis hanging (every command paused), REST still answers 503 within
/// 2 s and /healthz within 100 ms.
#[tokio::test]
async fn rest_answers_503_within_2_s_when_redis_hangs() {
    let redis = Redis::start();
    let node = Node::start(&redis, "n1");
    let (status, _) = get(&format!("{}/api/presence/alice", node.http())).await;
    assert_eq!(status, 200);
    let () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(6000)
        .arg("ALL")
        .query(&mut redis.conn())
        .unwrap();
    let http = reqwest::Client::new();
    for _ in 0..2 {
        let asked = Instant::now();
        let r = http
            .get(format!("{}/api/presence/alice", node.http()))
            .send()
            .await
            .unwrap();
        let took = asked.elapsed();
        assert_eq!(r.status(), 503, "after {took:?}");
        assert!(
            took < Duration::from_secs(2),
            "REST answered after {took:?}"
        );
        let asked = Instant::now();
        let r = http
            .get(format!("{}/healthz", node.http()))
            .send()
            .await
            .unwrap();
        let took = asked.elapsed();
        assert!(
            took < Duration::from_millis(100),
            "/healthz took {took:?} ({})",
            r.status()
        );
    }
}

/// Start-up against a Redis nobody answers exits within 5 s naming it.
#[test]
fn start_against_an_unreachable_redis_exits_within_5_s_naming_the_host() {
    let port = free_port();
    // A closed port, and an address that drops packets (or has no route).
    for host in [format!("127.0.0.1:{port}"), "10.255.255.1:6379".to_string()] {
        let url = format!("redis://:pw-not-shown@{host}/0");
        let (code, err, elapsed) = run_to_exit(&["--redis-url", &url], Duration::from_secs(5));
        assert!(
            matches!(code, Some(c) if c != 0),
            "{host}: {code:?} after {elapsed:?}:\n{err}"
        );
        assert!(err.contains(&host), "{err}");
        assert!(!err.contains("pw-not-shown"), "{err}");
        assert_eq!(
            err.matches("cannot connect to Redis").count(),
            1,
            "said once:\n{err}"
        );
    }
}

/// A wrong password is refused without the password in the output.
#[test]
fn a_wrong_password_is_never_logged() {
    let redis = Redis::start();
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg("the-right-one")
        .query(&mut redis.conn())
        .unwrap();
    let url = format!("redis://:wrong-pw-9876@127.0.0.1:{}/0", redis.port);
    let (code, err, _) = run_to_exit(&["--redis-url", &url], Duration::from_secs(5));
    assert!(matches!(code, Some(c) if c != 0), "{code:?}:\n{err}");
    assert!(err.contains("refused the credentials"), "{err}");
    assert!(err.contains(&format!("127.0.0.1:{}", redis.port)), "{err}");
    assert!(!err.contains("wrong-pw-9876"), "{err}");
}

/// A URL without a scheme gets one line that shows the right form.
#[test]
fn a_url_without_a_scheme_gets_one_line_with_the_right_form() {
    let (code, err, _) = run_to_exit(
        &["--redis-url", "app:secret-1@10.0.0.5:6379"],
        Duration::from_secs(5),
    );
    assert!(matches!(code, Some(c) if c != 0), "{code:?}:\n{err}");
    let lines: Vec<&str> = err.lines().filter(|l| l.contains("no scheme")).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].contains("redis://[user:password@]host:port"),
        "{err}"
    );
    assert!(!err.contains("secret-1"), "{err}");
}
