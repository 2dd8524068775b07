//! The processes under test: a private redis-server and presence-server
//! nodes started as separate processes (so that RSS is theirs alone and a
//! node can be SIGKILLed), or ones the user already runs, given by URL.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// How long a process gets to start listening.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// Log lines kept per node, for error messages.
const LOG_LINES: usize = 200;

/// A redis-server on a random loopback port with the repository's
/// redis.conf, in a temp dir; killed on drop.
pub struct LocalRedis {
    child: Child,
    /// Holds the data and log; removed on drop.
    dir: tempfile::TempDir,
    /// `redis://127.0.0.1:<port>/0`.
    pub url: String,
}

/// The repository's redis.conf (the bench lives in `<repo>/bench`).
pub fn redis_conf() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../redis.conf")
}

fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl LocalRedis {
    /// Starts redis-server; retries on another port if the chosen one is
    /// taken before Redis binds it.
    pub fn start() -> anyhow::Result<Self> {
        let conf = redis_conf();
        anyhow::ensure!(conf.exists(), "redis.conf not found at {}", conf.display());
        for _ in 0..5 {
            let dir = tempfile::Builder::new()
                .prefix("presence-bench-redis")
                .tempdir()?;
            let port = free_port()?;
            let mut cmd = redis_server(port, dir.path(), &[])?;
            own_session(&mut cmd);
            let child = cmd
                .spawn()
                .context("cannot run redis-server (apt-get install -y redis-server)")?;
            let mut redis = Self {
                child,
                dir,
                url: format!("redis://127.0.0.1:{port}/0"),
            };
            if redis.wait_ready()? {
                return Ok(redis);
            }
        }
        bail!("redis-server did not start on any of 5 ports")
    }

    fn wait_ready(&mut self) -> anyhow::Result<bool> {
        let deadline = Instant::now() + START_TIMEOUT;
        let client = redis::Client::open(self.url.as_str())?;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return Ok(false);
            }
            if let Ok(mut c) = client.get_connection_with_timeout(Duration::from_millis(200)) {
                if redis::cmd("PING").query::<String>(&mut c).is_ok() {
                    return Ok(true);
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        bail!(
            "redis-server did not answer within {START_TIMEOUT:?}; log:\n{}",
            std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default()
        )
    }

    /// The process id, for RSS.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

/// Starts `cmd` in a session of its own, as Redis on a host of its own would
/// be scheduled. With the kernel's autogroup scheduling (on in most
/// distributions' kernels), the processes of one session share the CPU as
/// one group: in the bench's session Redis's one thread competes with the
/// load generator's and the node's threads one for one, and in `refresh`
/// it got about half a core while a backlog of refreshes waited for it,
/// against a whole core in the ceiling's phase of the same run.
///
/// Out of the bench's session, a Ctrl-C at the terminal no longer reaches
/// it, so it is killed when the thread that started it ends, however it
/// ends: start it from the thread that runs the scenario (every caller runs
/// it inside the future given to `block_on`), not from a pool thread.
fn own_session(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    let bench = std::process::id() as libc::pid_t;
    // SAFETY: runs in the child between fork and exec, and calls only
    // setsid(2), prctl(2) and getppid(2), which are async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setsid() == -1
                || libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) == -1
            {
                return Err(std::io::Error::last_os_error());
            }
            // The bench died before the prctl took effect.
            if libc::getppid() != bench {
                libc::_exit(1);
            }
            Ok(())
        });
    }
}

impl Drop for LocalRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `cluster-node-timeout` of the bench's clusters, ms.
const CLUSTER_NODE_TIMEOUT_MS: u64 = 2_000;

/// The command that runs a redis-server on loopback `port` with the
/// repository's redis.conf, its data and its log (`redis.log`) in `dir`,
/// no persistence (it would measure the disk, not the server), then
/// `extra`; its stdout and stderr go nowhere. Every redis-server of the
/// bench and of the tests is started with it.
///
/// Redis gets a copy of redis.conf in `dir`: a `CONFIG REWRITE` (a Sentinel
/// promoting a replica does one) rewrites the file Redis was started with,
/// which must not be the repository's.
pub fn redis_server(port: u16, dir: &Path, extra: &[&str]) -> std::io::Result<Command> {
    let conf = dir.join("redis.conf");
    std::fs::copy(redis_conf(), &conf)?;
    let mut cmd = Command::new("redis-server");
    cmd.arg(conf)
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .arg("--dir")
        .arg(dir)
        .arg("--logfile")
        .arg(dir.join("redis.log"))
        .args(["--appendonly", "no"])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    Ok(cmd)
}

/// The command that runs one Redis Cluster node on loopback `port` (bus
/// port `bus`) as [`redis_server`] does, with `cluster-node-timeout` of
/// `node_timeout_ms`. The tests' cluster harness starts its nodes with it
/// too.
pub fn cluster_server(
    port: u16,
    bus: u16,
    dir: &Path,
    node_timeout_ms: u64,
) -> std::io::Result<Command> {
    redis_server(
        port,
        dir,
        &[
            "--cluster-port",
            &bus.to_string(),
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            &node_timeout_ms.to_string(),
        ],
    )
}

/// A Redis Cluster of `n` primaries, each with `replicas` replicas (none
/// by default), on random loopback ports, with the repository's
/// redis.conf, joined by `redis-cli --cluster create`; killed on drop.
pub struct LocalCluster {
    /// The servers (their temp dirs go with them).
    servers: Vec<(Child, tempfile::TempDir)>,
    /// `redis://127.0.0.1:<port>` of each primary.
    pub urls: Vec<String>,
    /// `redis://127.0.0.1:<port>` of each replica.
    pub replica_urls: Vec<String>,
}

impl LocalCluster {
    /// Starts `n` (at least 3, as Redis Cluster wants) primaries and waits
    /// until each says `cluster_state:ok`.
    pub fn start(n: usize) -> anyhow::Result<Self> {
        Self::start_with_replicas(n, 0)
    }

    /// Like [`LocalCluster::start`], with `replicas` replicas per primary
    /// (`--cluster-replicas`); [`LocalCluster::urls`] are then the servers
    /// that say `ROLE` master once the cluster is up.
    pub fn start_with_replicas(n: usize, replicas: usize) -> anyhow::Result<Self> {
        anyhow::ensure!(n >= 3, "a Redis Cluster needs at least 3 primaries");
        let mut cluster = Self {
            servers: Vec::new(),
            urls: Vec::new(),
            replica_urls: Vec::new(),
        };
        while cluster.servers.len() < n * (1 + replicas) {
            let (port, bus) = (free_port()?, free_port()?);
            if port == bus {
                continue;
            }
            let dir = tempfile::Builder::new()
                .prefix("presence-bench-cluster")
                .tempdir()?;
            let child = cluster_server(port, bus, dir.path(), CLUSTER_NODE_TIMEOUT_MS)?
                .spawn()
                .context("cannot run redis-server (apt-get install -y redis-server)")?;
            let url = format!("redis://127.0.0.1:{port}");
            cluster.servers.push((child, dir));
            if !cluster.wait_until(&url, |c| redis::cmd("PING").query::<String>(c).is_ok())? {
                // The port was taken before Redis bound it: try another.
                let (mut child, _) = cluster.servers.pop().context("just pushed")?;
                let _ = child.kill();
                let _ = child.wait();
                continue;
            }
            cluster.urls.push(url);
        }
        let addrs: Vec<String> = cluster
            .urls
            .iter()
            .map(|u| u.trim_start_matches("redis://").to_string())
            .collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .context("cannot run redis-cli (apt-get install -y redis-tools)")?;
        anyhow::ensure!(
            out.status.success(),
            "redis-cli --cluster create failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        for url in cluster.urls.clone() {
            let ok = cluster.wait_until(&url, |c| {
                redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query::<String>(c)
                    .is_ok_and(|info| info.contains("cluster_state:ok"))
            })?;
            anyhow::ensure!(ok, "{url} left the cluster");
        }
        if replicas > 0 {
            cluster.split_roles()?;
        }
        Ok(cluster)
    }

    /// Moves the servers that are replicas from [`LocalCluster::urls`] to
    /// [`LocalCluster::replica_urls`], by their `ROLE`.
    fn split_roles(&mut self) -> anyhow::Result<()> {
        let mut primaries = Vec::new();
        for url in std::mem::take(&mut self.urls) {
            let mut c = redis::Client::open(url.as_str())?.get_connection()?;
            let role: Vec<redis::Value> = redis::cmd("ROLE").query(&mut c)?;
            match role.first() {
                Some(redis::Value::BulkString(b)) if b.as_slice() == b"master" => {
                    primaries.push(url)
                }
                _ => self.replica_urls.push(url),
            }
        }
        self.urls = primaries;
        Ok(())
    }

    /// Waits until `ready` holds on `url`; false when the newest server
    /// exited first.
    fn wait_until(
        &mut self,
        url: &str,
        ready: impl Fn(&mut redis::Connection) -> bool,
    ) -> anyhow::Result<bool> {
        let deadline = Instant::now() + START_TIMEOUT;
        let client = redis::Client::open(url)?;
        while Instant::now() < deadline {
            if let Some((child, _)) = self.servers.last_mut() {
                if let Ok(Some(_)) = child.try_wait() {
                    return Ok(false);
                }
            }
            if let Ok(mut c) = client.get_connection_with_timeout(Duration::from_millis(200)) {
                if ready(&mut c) {
                    return Ok(true);
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        bail!("{url} not ready within {START_TIMEOUT:?}")
    }

    /// The seed list a node takes as `--redis-url`.
    pub fn seeds(&self) -> String {
        self.urls.join(",")
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        for (child, _) in &mut self.servers {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A presence-server node: spawned by the bench, or given by URL.
pub struct Node {
    /// The process, when the bench started it.
    child: Option<Child>,
    /// Where it serves HTTP and WebSockets.
    pub addr: SocketAddr,
    /// The last lines it logged (spawned nodes only).
    logs: Arc<Mutex<VecDeque<String>>>,
}

impl Node {
    /// Spawns `bin` against `redis_url` on a random loopback port with
    /// `--heartbeat-ms heartbeat_ms`, the frame-rate limit lifted and the
    /// scenario's `extra` flags, and waits until it listens.
    pub fn spawn(
        bin: &Path,
        redis_url: &str,
        id: &str,
        heartbeat_ms: Option<u64>,
        extra: &[String],
    ) -> anyhow::Result<Self> {
        Self::spawn_shedding(bin, redis_url, id, heartbeat_ms, extra, false)
    }

    /// [`Self::spawn`]; with `shedding`, the node keeps its default
    /// `--max-pending-claims` (the `storm` measures it), which the other
    /// scenarios lift: their clients connect as fast as they can and do not
    /// come back after a `1013`.
    pub fn spawn_shedding(
        bin: &Path,
        redis_url: &str,
        id: &str,
        heartbeat_ms: Option<u64>,
        extra: &[String],
        shedding: bool,
    ) -> anyhow::Result<Self> {
        let mut cmd = Command::new(bin);
        cmd.args(["--listen", "127.0.0.1:0", "--redis-url", redis_url])
            .args(["--node-id", id])
            // The bench measures throughput: `refresh` sends heartbeats as
            // fast as the node reads them, which the per-connection flood
            // limit (tested in tests/it/limits.rs) would close.
            .args(["--max-frames-per-sec", "1000000"])
            // The bench reads `/metrics` without a key.
            .arg("--public-metrics");
        if let Some(hb) = heartbeat_ms {
            cmd.args(["--heartbeat-ms", &hb.to_string()]);
        }
        cmd.args(extra);
        if !shedding {
            cmd.env("PRESENCE_MAX_PENDING_CLAIMS", "0");
        }
        let mut child = cmd
            .env("RUST_LOG", "info")
            // The bench's clients come from a few loopback addresses, and
            // it measures the server, not its per-client caps (tested in
            // tests/it/admission.rs). Environment variables, which older
            // binaries compared against ignore.
            .env("PRESENCE_MAX_CONNECTIONS_PER_IP", "0")
            .env("PRESENCE_HTTP_READS_PER_SEC", "1000000000")
            .env_remove("REDIS_URL")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("cannot run {}", bin.display()))?;
        let stderr = child.stderr.take().context("node stderr")?;
        let logs = Arc::new(Mutex::new(VecDeque::new()));
        // PRESENCE_BENCH_NODE_LOGS=<dir>: each node's whole log in
        // <dir>/<node id>.log, to see why a run went as it did.
        let mut keep = std::env::var_os("PRESENCE_BENCH_NODE_LOGS")
            .and_then(|dir| std::fs::File::create(Path::new(&dir).join(format!("{id}.log"))).ok());
        let (tx, rx) = std::sync::mpsc::channel();
        {
            let logs = logs.clone();
            // Drains the node's stderr for its whole life, so that it never
            // blocks on a full pipe.
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    if let Some(file) = keep.as_mut() {
                        use std::io::Write;
                        let _ = writeln!(file, "{line}");
                    }
                    if let Some(rest) = line.split("listening on http://").nth(1) {
                        let addr = rest.split_whitespace().next().unwrap_or("").to_string();
                        let _ = tx.send(addr);
                    }
                    let mut logs = logs.lock().unwrap_or_else(|e| e.into_inner());
                    if logs.len() == LOG_LINES {
                        logs.pop_front();
                    }
                    logs.push_back(line);
                }
            });
        }
        match rx.recv_timeout(START_TIMEOUT) {
            Ok(addr) => Ok(Self {
                child: Some(child),
                addr: addr.parse().context("node listen address")?,
                logs,
            }),
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                std::thread::sleep(Duration::from_millis(100));
                let logs = logs.lock().unwrap_or_else(|e| e.into_inner());
                bail!(
                    "node {id} did not start; log:\n{}",
                    Vec::from(logs.clone()).join("\n")
                )
            }
        }
    }

    /// A node the user runs, e.g. `http://127.0.0.1:8080`.
    pub fn remote(url: &str) -> anyhow::Result<Self> {
        let hostport = url
            .trim_start_matches("http://")
            .trim_start_matches("ws://")
            .trim_end_matches('/');
        let addr = hostport
            .parse()
            .with_context(|| format!("--node-url {url:?}: expected http://<ip>:<port>"))?;
        Ok(Self {
            child: None,
            addr,
            logs: Arc::default(),
        })
    }

    /// The process id, when the bench started the node.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills the node with SIGKILL (a crash: no goodbyes).
    pub fn kill(&mut self) -> anyhow::Result<()> {
        let Some(child) = self.child.as_mut() else {
            bail!("cannot kill a node given by --node-url");
        };
        child.kill()?;
        child.wait()?;
        Ok(())
    }

    /// The node's last log lines.
    pub fn logs(&self) -> String {
        let logs = self.logs.lock().unwrap_or_else(|e| e.into_inner());
        Vec::from(logs.clone()).join("\n")
    }

    /// The node's last log lines at WARN or ERROR.
    pub fn warnings(&self) -> Vec<String> {
        let logs = self.logs.lock().unwrap_or_else(|e| e.into_inner());
        let odd = |l: &&String| l.contains(" WARN ") || l.contains(" ERROR ");
        logs.iter().filter(odd).cloned().collect()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The release-built server: `--server-bin`, else `target/release/presence-server`
/// of this workspace (or of `CARGO_TARGET_DIR`).
pub fn server_bin(given: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(p) = given {
        anyhow::ensure!(p.exists(), "--server-bin {} does not exist", p.display());
        return Ok(p.to_path_buf());
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let bin = target.join("release/presence-server");
    anyhow::ensure!(
        bin.exists(),
        "{} not found: run `cargo build --release` first, or pass --server-bin",
        bin.display()
    );
    Ok(bin)
}

/// One sample of a node's `/metrics` (Prometheus text), e.g.
/// `presence_refresh_batch_size_sum`; 0 when the node does not have it yet.
pub async fn node_metric(node: SocketAddr, name: &str) -> anyhow::Result<f64> {
    Ok(node_metrics(node, &[name]).await?[0])
}

/// Several unlabelled metrics from one read of a node's `/metrics`, so that
/// they are of the same moment; 0 for one it does not have.
pub async fn node_metrics(node: SocketAddr, names: &[&str]) -> anyhow::Result<Vec<f64>> {
    let body = scrape(node).await?;
    Ok(names
        .iter()
        .map(|name| {
            let prefix = format!("{name} ");
            body.lines()
                .find_map(|l| l.strip_prefix(prefix.as_str()))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0.0)
        })
        .collect())
}

/// A node's `/metrics` text.
async fn scrape(node: SocketAddr) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(node).await?;
    tcp.write_all(b"GET /metrics HTTP/1.0\r\nHost: bench\r\n\r\n")
        .await?;
    let mut body = String::new();
    tcp.read_to_string(&mut body).await?;
    anyhow::ensure!(
        body.starts_with("HTTP/1.0 200") || body.starts_with("HTTP/1.1 200"),
        "GET /metrics from {node}: {}",
        body.lines().next().unwrap_or("no answer")
    );
    Ok(body)
}

/// The sum of every series of one metric of a node's `/metrics` (e.g.
/// `presence_transitions_published_total` over its status labels, or one
/// series when `name` carries its labels); 0 when the node has none yet.
pub async fn node_metric_sum(node: SocketAddr, name: &str) -> anyhow::Result<f64> {
    let body = scrape(node).await?;
    Ok(body
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            // The name itself, not one it is a prefix of.
            let value = match rest.as_bytes().first()? {
                b' ' => rest,
                b'{' => &rest[rest.find('}')? + 1..],
                _ => return None,
            };
            value.trim().parse::<f64>().ok()
        })
        .sum())
}

/// Resident set size of a process in bytes (VmRSS of /proc/<pid>/status).
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// CPU time (user + system) a process has used so far, in µs: a cost per
/// operation that, unlike latency, other load on a shared box barely moves.
pub fn cpu_us(pid: u32) -> Option<u64> {
    stat_cpu_us(&format!("/proc/{pid}/stat"))
}

/// User-space and system CPU time a process has used so far, in µs, from
/// one read: the user-space part is the server's own code, without the
/// kernel's network path that the floors measure.
pub fn cpu_split_us(pid: u32) -> Option<(u64, u64)> {
    stat_cpu_split_us(&format!("/proc/{pid}/stat"))
}

/// CPU time (user + system) one thread of this process has used, in µs.
pub fn thread_cpu_us(tid: i32) -> Option<u64> {
    stat_cpu_us(&format!("/proc/self/task/{tid}/stat"))
}

/// CPU time (user + system) from a `/proc/.../stat` file, in µs.
fn stat_cpu_us(path: &str) -> Option<u64> {
    let (user, system) = stat_cpu_split_us(path)?;
    Some(user + system)
}

/// User and system CPU time from a `/proc/.../stat` file, in µs.
fn stat_cpu_split_us(path: &str) -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string(path).ok()?;
    // Fields after the command name, which may hold spaces: ") S ppid ...".
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 here.
    let user: u64 = fields.get(11)?.parse().ok()?;
    let system: u64 = fields.get(12)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Some((user * 1_000_000 / hz, system * 1_000_000 / hz))
}

/// Fails fast, with what to do, when `sockets` connections (one file each
/// in the bench, and one each in a node) would not fit the open-file
/// limit: past it, accept() and socket() fail and connects only time out.
pub fn ensure_fds(sockets: usize) -> anyhow::Result<()> {
    // Room for the runtime, Redis connections, logs and the like.
    const SPARE: u64 = 256;
    let Some((soft, hard)) = nofile() else {
        return Ok(());
    };
    anyhow::ensure!(
        sockets as u64 + SPARE <= soft,
        "{sockets} connections need an open-file limit of at least {} in the bench and in \
         the node, but it is {} (hard limit {}); raise the hard limit (`ulimit -Hn`, \
         LimitNOFILE=, or run as root with CAP_SYS_RESOURCE) or ask for fewer",
        sockets as u64 + SPARE,
        soft,
        hard
    );
    Ok(())
}

/// This process's open-file limit (soft and hard), if it can be read.
fn nofile() -> Option<(u64, u64)> {
    rlimit::getrlimit(rlimit::Resource::NOFILE).ok()
}

/// The open-file limit (soft) of this process.
pub fn fd_limit() -> u64 {
    nofile().map_or(1024, |(soft, _)| soft)
}

/// Lifts the open-file limit as far as the kernel allows: the hard limit
/// too when running as root (up to fs.nr_open), else the soft one to the
/// hard one. Spawned nodes inherit it. Returns the soft limit now.
pub fn raise_fd_limit() -> u64 {
    let Some((_, hard)) = nofile() else {
        return 0;
    };
    let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(hard);
    // Refused without CAP_SYS_RESOURCE: then up to the hard limit.
    if rlimit::setrlimit(rlimit::Resource::NOFILE, nr_open, nr_open.max(hard)).is_err() {
        let _ = rlimit::increase_nofile_limit(u64::MAX);
    }
    fd_limit()
}
