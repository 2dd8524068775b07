//! Test harness: a real redis-server with the project's redis.conf on a
//! random port, real server nodes as separate processes (so that a test can
//! SIGKILL one), and real WebSocket clients.
#![allow(dead_code)]

pub mod jwt;
pub mod raw;

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub mod cluster;

use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;

/// Heartbeat the test nodes run with; the lease TTL is three of them.
pub const HEARTBEAT_MS: u64 = 500;
/// The lease TTL of the test nodes.
pub const TTL: Duration = Duration::from_millis(3 * HEARTBEAT_MS);
/// How long a test waits for an event that should come.
pub const DEADLINE: Duration = Duration::from_secs(10);
/// The `--admin-key` of the test nodes that have one.
pub const ADMIN: &str = "admin-key-for-tests-0123";

/// A port free on loopback right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The status of a WebSocket handshake to the `ws://` `url` with extra
/// request `headers` (101 when it upgrades).
pub async fn handshake(url: &str, headers: &[(&str, &str)]) -> u16 {
    let rest = url
        .strip_prefix("ws://")
        .unwrap_or_else(|| panic!("not a ws:// URL: {url}"));
    let (host, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let addr = host
        .parse()
        .unwrap_or_else(|e| panic!("{url}: not an address: {e}"));
    raw::handshake(addr, path, headers).await.0
}

/// Polls `cond` until it holds or `timeout` passes; panics with `what`.
pub async fn wait_until<F, Fut>(what: &str, timeout: Duration, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if cond().await {
            return;
        }
        if Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A whole number from the environment (`CHAOS_SECS` and the like), or
/// `default` when it is unset or not a number.
pub fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// Lifts the open-file soft limit to the hard one, for tests holding
/// thousands of sockets.
pub fn raise_fd_limit() {
    rlimit::increase_nofile_limit(u64::MAX).expect("the open-file limit");
}

/// A blocking connection to what speaks Redis on loopback `port` (a
/// redis-server or a sentinel).
pub fn conn_at(port: u16) -> redis::RedisResult<redis::Connection> {
    redis::Client::open(format!("redis://127.0.0.1:{port}"))?
        .get_connection_with_timeout(Duration::from_millis(500))
}

/// A child process, killed on drop.
pub struct Proc(pub Child);

impl Proc {
    /// Kills it (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A redis-server on a random port, killed on drop.
pub struct Redis {
    child: Child,
    dir: tempfile::TempDir,
    pub port: u16,
    pub url: String,
}

impl Redis {
    /// Starts redis-server with the project's redis.conf.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts redis-server with the project's redis.conf and extra arguments.
    pub fn start_with(extra: &[&str]) -> Self {
        // The free port may be taken by a parallel test before redis binds
        // it: try a few.
        for _ in 0..5 {
            let dir = tempfile::tempdir().unwrap();
            let port = free_port();
            let child = Self::spawn(dir.path(), port, extra);
            let mut redis = Self {
                child,
                dir,
                port,
                url: format!("redis://127.0.0.1:{port}/0"),
            };
            if redis.wait_ready() {
                return redis;
            }
        }
        panic!("redis-server did not start on any of 5 ports");
    }

    fn spawn(dir: &Path, port: u16, extra: &[&str]) -> Child {
        presence_bench::procs::redis_server(port, dir, extra)
            .expect("a copy of redis.conf")
            .spawn()
            .expect("redis-server must be installed (apt-get install -y redis-server)")
    }

    /// False when the server exited (e.g. its port was taken).
    fn wait_ready(&mut self) -> bool {
        let deadline = Instant::now() + DEADLINE;
        loop {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            if let Ok(mut c) = self.try_conn() {
                if redis::cmd("PING").query::<String>(&mut c).is_ok() {
                    return true;
                }
            }
            assert!(
                Instant::now() < deadline,
                "redis-server did not start; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The server's process id (e.g. to SIGSTOP it: a hung Redis).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills the server (SIGKILL) and leaves the port closed.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts a new, empty server on the same port: a restart without
    /// persistence, or a failover to an empty replica.
    pub fn restart_empty(&mut self) {
        self.kill();
        self.dir = tempfile::tempdir().unwrap();
        self.child = Self::spawn(self.dir.path(), self.port, &[]);
        assert!(
            self.wait_ready(),
            "redis did not restart on port {}",
            self.port
        );
    }

    fn try_conn(&self) -> redis::RedisResult<redis::Connection> {
        conn_at(self.port)
    }

    /// A blocking connection for assertions.
    pub fn conn(&self) -> redis::Connection {
        self.try_conn().expect("redis reachable")
    }

    /// An async connection for assertions inside async tests. Its replies
    /// may take up to [`DEADLINE`]: redis-rs gives up after 500 ms by
    /// default, which a 40,000-command fixture pipeline exceeds on a loaded
    /// machine.
    pub async fn aconn(&self) -> redis::aio::MultiplexedConnection {
        let config = redis::AsyncConnectionConfig::new().set_response_timeout(Some(DEADLINE));
        redis::Client::open(self.url.as_str())
            .unwrap()
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .unwrap()
    }

    /// The server's log file.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default()
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let log = self.log();
            let lines: Vec<&str> = log.lines().collect();
            let skip = lines.len().saturating_sub(40);
            eprintln!(
                "--- redis :{} log (last {} lines) ---\n{}\n--- end of redis log ---",
                self.port,
                lines.len() - skip,
                lines[skip..].join("\n")
            );
        }
    }
}

/// A presence-server process.
pub struct Node {
    child: Child,
    pub addr: SocketAddr,
    pub id: String,
    logs: Arc<Mutex<Vec<String>>>,
}

impl Node {
    /// Starts a node on a random port against `redis`.
    pub fn start(redis: &Redis, id: &str) -> Self {
        Self::start_with(redis, id, &[])
    }

    /// Starts a node with extra flags.
    pub fn start_with(redis: &Redis, id: &str, extra: &[&str]) -> Self {
        let mut args = vec![
            "--listen".to_string(),
            "127.0.0.1:0".into(),
            "--redis-url".into(),
            redis.url.clone(),
            "--node-id".into(),
            id.into(),
        ];
        if !extra.contains(&"--heartbeat-ms") {
            args.extend(["--heartbeat-ms".to_string(), HEARTBEAT_MS.to_string()]);
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        // The tests scrape `/metrics` without a key (`hostile.rs` checks
        // that a node without it refuses that), and read the HTTP API from
        // one address far faster than a client would (`admission.rs` tests
        // the read budget with its flag, which beats the environment). They
        // connect hundreds of clients at once, which do not come back after
        // a `1013` (`refresh.rs` tests the shedding with its flag).
        let env = [
            ("PRESENCE_PUBLIC_METRICS", "true"),
            ("PRESENCE_HTTP_READS_PER_SEC", "10000000"),
            ("PRESENCE_MAX_PENDING_CLAIMS", "0"),
        ];
        Self::spawn(id, &args, &env)
            .unwrap_or_else(|logs| panic!("node {id} did not start:\n{logs}"))
    }

    /// Spawns the binary with `args` and env overrides; waits for its
    /// "listening on" line. Err carries its output when it exits first.
    pub fn spawn(id: &str, args: &[String], env: &[(&str, &str)]) -> Result<Self, String> {
        let mut cmd = Command::new(binary());
        cmd.args(args)
            .env("RUST_LOG", "presence_server=debug,info")
            .env_remove("REDIS_URL")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn presence-server");
        let stderr = child.stderr.take().unwrap();
        let logs = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        {
            let logs = logs.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    if let Some(rest) = line.split("listening on http://").nth(1) {
                        let addr = rest.split_whitespace().next().unwrap_or("").to_string();
                        let _ = tx.send(addr);
                    }
                    logs.lock().unwrap().push(line);
                }
            });
        }
        match rx.recv_timeout(DEADLINE) {
            Ok(addr) => Ok(Self {
                child,
                addr: addr.parse().expect("listen address"),
                id: id.to_string(),
                logs,
            }),
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                std::thread::sleep(Duration::from_millis(100));
                Err(logs.lock().unwrap().join("\n"))
            }
        }
    }

    /// `http://<addr>`.
    pub fn http(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The WebSocket URL for a user and device.
    pub fn ws_url(&self, user: &str, device: &str) -> String {
        format!("ws://{}/ws?user={user}&device={device}", self.addr)
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills the node with SIGKILL: a crash, no goodbyes.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends a signal and waits up to `timeout` for the exit status.
    pub async fn signal_and_wait(
        &mut self,
        sig: i32,
        timeout: Duration,
    ) -> Option<std::process::ExitStatus> {
        unsafe {
            libc::kill(self.child.id() as i32, sig);
        }
        self.wait_exit(timeout).await
    }

    /// Waits up to `timeout` for the process to exit.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }

    /// Everything the node logged so far.
    pub fn logs(&self) -> String {
        self.logs.lock().unwrap().join("\n")
    }

    /// Waits until a log line contains `needle`.
    pub async fn wait_log(&self, needle: &str) {
        let logs = self.logs.clone();
        let deadline = Instant::now() + DEADLINE;
        loop {
            if logs.lock().unwrap().iter().any(|l| l.contains(needle)) {
                return;
            }
            if Instant::now() > deadline {
                panic!(
                    "node {} never logged {needle:?}; log:\n{}",
                    self.id,
                    self.logs()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // A failed test shows what each of its nodes did: the panic alone
        // rarely says why an event never came.
        if std::thread::panicking() {
            let logs = self.logs.lock().map(|l| l.clone()).unwrap_or_default();
            let skip = logs.len().saturating_sub(NODE_LOG_TAIL);
            eprintln!(
                "--- node {} log ({} lines, last {}) ---\n{}\n--- end of node {} log ---",
                self.id,
                logs.len(),
                logs.len() - skip,
                logs[skip..].join("\n"),
                self.id
            );
        }
    }
}

/// Lines of a node's log a failed test prints.
const NODE_LOG_TAIL: usize = 400;

/// The server binary built by cargo for these tests; `PRESENCE_SERVER_BIN`
/// names another one (e.g. an older build, to see a new test fail on it).
pub fn binary() -> PathBuf {
    std::env::var_os("PRESENCE_SERVER_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_presence-server")))
}

/// What the reader task hands to the test.
#[derive(Debug)]
pub enum Incoming {
    /// A text frame, parsed as JSON.
    Frame(Value),
    /// The server closed the connection (code, reason), or it dropped.
    Closed(Option<(u16, String)>),
}

type Sink = futures_util::stream::SplitSink<
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>,
    Message,
>;

/// A WebSocket client. A background task reads the socket all the time, so
/// that pings are answered however long the test looks elsewhere.
pub struct Client {
    sink: Sink,
    rx: mpsc::UnboundedReceiver<Incoming>,
    reader: tokio::task::JoinHandle<()>,
    pub user: String,
    pub device: String,
    /// Port of the node this client is connected to.
    port: u16,
}

impl Client {
    /// Port of the node this client is connected to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Connects and waits for the `hello` frame.
    pub async fn connect(node: &Node, user: &str, device: &str) -> Self {
        let mut c = Self::connect_raw(&node.ws_url(user, device), user, device)
            .await
            .unwrap_or_else(|e| panic!("connect {user}/{device}: {e}; node log:\n{}", node.logs()));
        let hello = c.recv().await;
        assert_eq!(hello["type"], "hello", "first frame: {hello}");
        assert_eq!(hello["user"], user);
        assert_eq!(hello["device"], device);
        c
    }

    /// Connects without waiting for anything.
    pub async fn connect_raw(url: &str, user: &str, device: &str) -> Result<Self, String> {
        let (ws, _) = tokio_tungstenite::connect_async(url)
            .await
            .map_err(|e| e.to_string())?;
        let mut client = Self::from_stream(ws, user, device);
        client.port = url
            .split("://")
            .nth(1)
            .and_then(|rest| rest.split('/').next())
            .and_then(|host| host.rsplit(':').next())
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        Ok(client)
    }

    /// A client on an already opened WebSocket (e.g. one whose handshake
    /// carried extra headers).
    pub fn from_stream(
        ws: tokio_tungstenite::WebSocketStream<
            tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
        >,
        user: &str,
        device: &str,
    ) -> Self {
        let (sink, mut stream) = ws.split();
        let (tx, rx) = mpsc::unbounded_channel();
        let reader = tokio::spawn(async move {
            while let Some(msg) = stream.next().await {
                match msg {
                    Ok(Message::Text(t)) => {
                        let v = serde_json::from_str(&t).unwrap_or(Value::String(t.to_string()));
                        if tx.send(Incoming::Frame(v)).is_err() {
                            return;
                        }
                    }
                    Ok(Message::Close(frame)) => {
                        let _ = tx.send(Incoming::Closed(
                            frame.map(|f| (u16::from(f.code), f.reason.to_string())),
                        ));
                        return;
                    }
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
            let _ = tx.send(Incoming::Closed(None));
        });
        Self {
            sink,
            rx,
            reader,
            user: user.to_string(),
            device: device.to_string(),
            port: 0,
        }
    }

    /// Sends a JSON frame.
    pub async fn send(&mut self, v: Value) {
        self.sink
            .send(Message::Text(v.to_string().into()))
            .await
            .unwrap();
    }

    /// Sends a raw message.
    pub async fn send_raw(&mut self, m: Message) {
        self.sink.send(m).await.unwrap();
    }

    /// Sends a raw message; an error when the connection is gone.
    pub async fn sink_send(&mut self, m: Message) -> Result<(), String> {
        self.sink.send(m).await.map_err(|e| e.to_string())
    }

    /// The next incoming item if one is waiting.
    pub fn try_next(&mut self) -> Option<Incoming> {
        self.rx.try_recv().ok()
    }

    /// Every frame waiting, in order, and whether the connection closed
    /// after them.
    pub fn waiting(&mut self) -> (Vec<Value>, bool) {
        let mut frames = Vec::new();
        while let Some(item) = self.try_next() {
            match item {
                Incoming::Frame(v) => frames.push(v),
                Incoming::Closed(_) => return (frames, true),
            }
        }
        (frames, false)
    }

    /// Connects and waits for `hello`; None if the server refused or
    /// closed instead (e.g. while Redis is away).
    pub async fn try_connect(node: &Node, user: &str, device: &str) -> Option<Self> {
        let mut c = Self::connect_raw(&node.ws_url(user, device), user, device)
            .await
            .ok()?;
        match c.next_within(DEADLINE).await {
            Some(Incoming::Frame(v)) if v["type"] == "hello" => Some(c),
            _ => None,
        }
    }

    /// The next incoming item, within `timeout`.
    pub async fn next_within(&mut self, timeout: Duration) -> Option<Incoming> {
        tokio::time::timeout(timeout, self.rx.recv())
            .await
            .ok()
            .flatten()
    }

    /// The next text frame; panics on close or after [`DEADLINE`].
    pub async fn recv(&mut self) -> Value {
        match self.next_within(DEADLINE).await {
            Some(Incoming::Frame(v)) => v,
            other => panic!(
                "{}/{}: expected a frame, got {other:?}",
                self.user, self.device
            ),
        }
    }

    /// The next frame, which must be of `kind`.
    pub async fn expect(&mut self, kind: &str) -> Value {
        let v = self.recv().await;
        assert_eq!(
            v["type"], kind,
            "{}/{}: unexpected frame {v}",
            self.user, self.device
        );
        v
    }

    /// The next frame, which must be a `presence` event of `user` with
    /// `status`; returns it.
    pub async fn expect_presence(&mut self, user: &str, status: &str) -> Value {
        let ev = self.expect("presence").await;
        assert_eq!(
            (ev["user"].as_str(), ev["status"].as_str()),
            (Some(user), Some(status)),
            "{}/{}: {ev}",
            self.user,
            self.device
        );
        ev
    }

    /// Watches `users` and returns the snapshot's records.
    pub async fn watch(&mut self, users: &[&str]) -> Vec<Value> {
        self.send(serde_json::json!({"type": "watch", "users": users}))
            .await;
        let snap = self.expect("snapshot").await;
        snap["presence"].as_array().unwrap().clone()
    }

    /// Waits for the close frame and returns (code, reason).
    pub async fn expect_closed(&mut self) -> Option<(u16, String)> {
        loop {
            match self.next_within(DEADLINE).await {
                Some(Incoming::Closed(c)) => return c,
                Some(Incoming::Frame(_)) => continue,
                None => panic!(
                    "{}/{}: not closed within {DEADLINE:?}",
                    self.user, self.device
                ),
            }
        }
    }

    /// A clean close: close frame, then wait for the server's answer.
    pub async fn close(mut self) {
        let _ = self
            .sink
            .send(Message::Close(Some(CloseFrame {
                code: CloseCode::Normal,
                reason: "bye".into(),
            })))
            .await;
        let _ = tokio::time::timeout(DEADLINE, &mut self.reader).await;
    }

    /// Drops the TCP connection without a close frame.
    pub fn drop_tcp(self) {
        drop(self);
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        // The reader holds the socket's read half: stop it to close the socket.
        self.reader.abort();
    }
}

/// GET with an optional bearer.
pub async fn get_as(url: &str, bearer: Option<&str>) -> (u16, Value) {
    let mut req = reqwest::Client::new().get(url);
    if let Some(b) = bearer {
        req = req.bearer_auth(b);
    }
    let r = req.send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

/// POST JSON with an optional bearer.
pub async fn post_as(url: &str, body: &Value, bearer: Option<&str>) -> (u16, Value) {
    let mut req = reqwest::Client::new().post(url).json(body);
    if let Some(b) = bearer {
        req = req.bearer_auth(b);
    }
    let r = req.send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

/// Fetches JSON with status.
pub async fn get(url: &str) -> (u16, Value) {
    let r = reqwest::get(url).await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// Posts JSON, returns status and JSON body.
pub async fn post(url: &str, body: &Value) -> (u16, Value) {
    let r = reqwest::Client::new()
        .post(url)
        .json(body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// Current value of a user's device counter (0 when the key is absent).
pub async fn count(redis: &Redis, user: &str) -> i64 {
    let mut c = redis.aconn().await;
    let v: Option<i64> = redis::cmd("GET")
        .arg(format!("presence-count:{{{user}}}"))
        .query_async(&mut c)
        .await
        .unwrap();
    v.unwrap_or(0)
}

/// The node holding `user`'s `device`, as its lease tells (`None`: no
/// lease): the lease value (key schema 5) ends in the node's run number
/// (13 bits), which must be the run in the device's field of the user's
/// hash, whose node `presence-run:<run>` names.
pub async fn lease_node(redis: &Redis, user: &str, device: &str) -> Option<String> {
    let mut c = redis.aconn().await;
    let (lease, run): (Option<u64>, Option<u64>) = redis::pipe()
        .get(format!("presence:{{{user}}}:{device}"))
        .hget(format!("presence-status:{{{user}}}"), format!("d:{device}"))
        .query_async(&mut c)
        .await
        .unwrap();
    let lease = lease?;
    let run = run.unwrap_or_else(|| panic!("{user}/{device}: a lease and no field"));
    assert_eq!(
        lease & 0x1fff,
        run,
        "{user}/{device}: the lease {lease} is not of the run {run} its field names"
    );
    redis::cmd("GET")
        .arg(format!("presence-run:{run}"))
        .query_async(&mut c)
        .await
        .unwrap()
}

/// The bucket of `index` (`presence-leases`, `presence-online` or
/// `presence-lastseen`) that holds `user`'s entries, in a deployment with
/// the default number of buckets.
pub fn index_key(index: &str, user: &str) -> String {
    let bucket = presence_server::keys::Buckets::default().of(user);
    format!("{index}:{{b{bucket:02}}}")
}

/// Every member of `index` across its buckets, sorted.
pub async fn index_members(redis: &Redis, index: &str) -> Vec<String> {
    let mut c = redis.aconn().await;
    let mut out = Vec::new();
    for bucket in presence_server::keys::Buckets::default().all() {
        let members: Vec<String> = redis::cmd("ZRANGE")
            .arg(format!("{index}:{{b{bucket:02}}}"))
            .arg(0)
            .arg(-1)
            .query_async(&mut c)
            .await
            .unwrap();
        out.extend(members);
    }
    out.sort();
    out
}

/// Collects one `offline` event per user from `watcher` until `n` users
/// went offline, each once, and returns how long after `since` the last
/// one came. Waits a little past any bound (5 s beyond `ttl`) so that a
/// miss reports by how much; panics on anything else.
pub async fn last_of_offlines(
    watcher: &mut Client,
    n: usize,
    since: Instant,
    ttl: Duration,
) -> Duration {
    let mut offline = std::collections::HashSet::new();
    let give_up = since + ttl + Duration::from_secs(5);
    let mut latest = Duration::ZERO;
    while offline.len() < n {
        let left = give_up.saturating_duration_since(Instant::now());
        let ev = match watcher.next_within(left).await {
            Some(Incoming::Frame(ev)) => ev,
            other => panic!(
                "only {} of {n} offline {:?} after SIGKILL (then {other:?})",
                offline.len(),
                since.elapsed()
            ),
        };
        assert_eq!(ev["status"], "offline", "{ev}");
        assert!(
            offline.insert(ev["user"].as_str().unwrap().to_string()),
            "duplicate {ev}"
        );
        latest = since.elapsed();
    }
    latest
}

/// A metric's value from a node's `/metrics` (the first series of `name`).
pub async fn metric(node: &Node, name: &str) -> f64 {
    let text = reqwest::get(format!("{}/metrics", node.http()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{name} not in /metrics:\n{text}"))
}

/// The `--internal-listen` address a node logged, as `http://host:port`.
pub fn internal_addr(node: &Node) -> String {
    let logs = node.logs();
    let line = logs
        .lines()
        .find(|l| l.contains("admin API on http://"))
        .unwrap_or_else(|| panic!("no internal address logged:\n{logs}"));
    let rest = line.split("admin API on http://").nth(1).unwrap();
    format!("http://{}", rest.split_whitespace().next().unwrap())
}

/// Status of `method path` sent to `addr` (`host:port`) with `Host: host`
/// and the JSON `body`, over a plain connection (so that the Host is
/// exactly this one).
pub async fn status_with_host(addr: &str, method: &str, path: &str, host: &str, body: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    tokio::time::timeout(DEADLINE, s.read_to_end(&mut head))
        .await
        .unwrap()
        .unwrap();
    let head = String::from_utf8_lossy(&head);
    head.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}
