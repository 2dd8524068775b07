//! `presence-bench`: a load generator for presence-server.
//!
//! # Layout
//! - [`procs`]: the private redis-server and the server nodes (separate
//!   processes), RSS, the open-file limit.
//! - [`client`]: WebSocket clients spread over loopback source addresses.
//! - [`report`]: figures as JSON lines and a table; [`plot`]: SVG plots.
//! - [`scenario`]: one module per subcommand.
//!
//! [`run`] parses the flags and runs one scenario; `src/main.rs` only calls
//! it, and the smoke test calls it with tiny sizes.

pub mod client;
pub mod fixture;
pub mod floor;
pub mod http_sink;
pub mod plot;
pub mod procs;
pub mod report;
pub mod scenario;

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};

use client::Sources;
use procs::{LocalRedis, Node};

/// Load generator for presence-server: starts its own redis-server and
/// release-built nodes (or uses the ones given), drives WebSocket clients
/// from several loopback addresses, and prints each figure as a JSON line
/// plus a table.
#[derive(Parser, Debug)]
#[command(version, about)]
pub struct Cli {
    #[command(flatten)]
    pub common: Common,
    #[command(subcommand)]
    pub scenario: Scenario,
}

/// Flags every scenario takes.
#[derive(Args, Debug, Clone)]
pub struct Common {
    /// Use this Redis instead of starting a private one (the bench writes
    /// `presence*` keys into it).
    #[arg(long, global = true)]
    pub redis_url: Option<String>,

    /// Use this running node (http://<ip>:<port>) instead of spawning one;
    /// repeat for scenarios with two nodes. Needs --redis-url.
    #[arg(long = "node-url", global = true)]
    pub node_urls: Vec<String>,

    /// The presence-server binary to spawn [default: target/release/presence-server].
    #[arg(long, global = true)]
    pub server_bin: Option<PathBuf>,

    /// --heartbeat-ms for spawned nodes [default: per scenario].
    #[arg(long, global = true)]
    pub heartbeat_ms: Option<u64>,

    /// Loopback source addresses to spread clients over (127.0.0.2 onwards).
    #[arg(long, global = true, default_value_t = 8)]
    pub sources: usize,

    /// Write SVG plots of the run into this directory.
    #[arg(long, global = true)]
    pub svg: Option<PathBuf>,
}

/// The scenarios.
#[derive(Subcommand, Debug)]
pub enum Scenario {
    /// Ramp to N idle devices on one node: connect rate, server RSS per
    /// connection, Redis memory per device.
    Connections(scenario::connections::ConnectionsArgs),
    /// Devices sending heartbeats just above the node's refresh throttle:
    /// lease refreshes per second reaching Redis, against the same commands
    /// sent straight to Redis pipelined.
    Refresh(scenario::refresh::RefreshArgs),
    /// Devices arriving and leaving at a set rate on node A, watched from
    /// node B: connect/close to watcher event latency.
    Transitions(scenario::transitions::TransitionsArgs),
    /// Many live leases plus devices on a node that is SIGKILLed: lease
    /// deadline to the watcher's offline event.
    Expiry(scenario::expiry::ExpiryArgs),
    /// One user watched by many sessions on one node: transition to each
    /// watcher's receipt.
    Fanout(scenario::fanout::FanoutArgs),
    /// Sessions watching many users: node RSS per watch at peak, and how
    /// much comes back after they leave.
    Watches(scenario::watches::WatchesArgs),
    /// Devices swapping the users they watch, and a probe's event latency
    /// meanwhile: node and Redis CPU, sharded channels, accepted changes.
    Churn(scenario::churn::ChurnArgs),
    /// Many users online, none visible to the viewer: latency of each
    /// `GET /api/online` page while following the cursor.
    Online(scenario::online::OnlineArgs),
    /// N nodes on a Redis Cluster of P primaries (or one Redis): events
    /// each node receives per event it needs, departure steps per expired
    /// lease, commands per primary, cross-node latency.
    Fleet(scenario::fleet::FleetArgs),
    /// Rooms: a signal to each of 1,000 members on two nodes against the
    /// raw-write floor, join/leave churn to the members, Redis memory per
    /// membership.
    Rooms(scenario::rooms::RoomsArgs),
    /// Live cursors (issue 42): devices of one room each sending their
    /// state at 60 Hz, batched: staleness, frames per member per second,
    /// node CPU per member update, Redis commands per second.
    Cursors(scenario::cursors::CursorsArgs),
    /// The event feed: Redis CPU per transition with it off and on, Redis
    /// bytes per retained event.
    Feed(scenario::feed::FeedArgs),
    /// The event feed delivered: events per second a fleet sends one
    /// webhook receiver, from a backlog and live, and the delivery lag.
    FeedDeliver(scenario::feed_deliver::FeedDeliverArgs),
    /// Rooms under attack (issue 37): one address at its read limits (room
    /// pages, counts of a hidden room, churn across the list limit) while a
    /// probe on another reads presence and `/healthz`: its latency, Redis
    /// memory and CPU, stale member views.
    RoomsAttack(scenario::attack::AttackArgs),
    /// A fleet on one box (issue 29): N nodes on a Redis Cluster, devices
    /// spread over worker processes, one node SIGKILLed: memory per device,
    /// time until its devices are back, spurious offline events, watcher
    /// latency and Redis's peak ops meanwhile.
    Storm(scenario::storm::StormArgs),
    /// One worker process of `storm` (started by it).
    #[command(hide = true)]
    StormWorker(scenario::storm::WorkerArgs),
}

/// Parses `args` (the first one is the program name) and runs the scenario.
pub async fn run<I, T>(args: I) -> anyhow::Result<()>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            // --help, --version
            print!("{e}");
            return Ok(());
        }
        Err(e) => anyhow::bail!("{e}"),
    };
    let fds = procs::raise_fd_limit();
    if !matches!(cli.scenario, Scenario::StormWorker(_)) {
        eprintln!("presence-bench: open-file limit {fds}");
    }
    if let Some(dir) = &cli.common.svg {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    }
    let c = &cli.common;
    match &cli.scenario {
        Scenario::Connections(a) => scenario::connections::run(c, a).await,
        Scenario::Refresh(a) => scenario::refresh::run(c, a).await,
        Scenario::Transitions(a) => scenario::transitions::run(c, a).await,
        Scenario::Expiry(a) => scenario::expiry::run(c, a).await,
        Scenario::Fanout(a) => scenario::fanout::run(c, a).await,
        Scenario::Online(a) => scenario::online::run(c, a).await,
        Scenario::Churn(a) => scenario::churn::run(c, a).await,
        Scenario::Watches(a) => scenario::watches::run(c, a).await,
        Scenario::Fleet(a) => scenario::fleet::run(c, a).await,
        Scenario::Rooms(a) => scenario::rooms::run(c, a).await,
        Scenario::Cursors(a) => scenario::cursors::run(c, a).await,
        Scenario::Feed(a) => scenario::feed::run(c, a).await,
        Scenario::FeedDeliver(a) => scenario::feed_deliver::run(c, a).await,
        Scenario::RoomsAttack(a) => scenario::attack::run(c, a).await,
        Scenario::Storm(a) => scenario::storm::run(c, a).await,
        Scenario::StormWorker(a) => scenario::storm::run_worker(a).await,
    }
}

/// What a scenario runs against.
pub struct Setup {
    /// The nodes, spawned or given (declared first: killed before Redis).
    pub nodes: Vec<Node>,
    /// The private Redis, when the bench started it.
    pub local_redis: Option<LocalRedis>,
    /// The Redis every node uses.
    pub redis_url: String,
    /// Client source addresses, shared by every connecting task.
    pub sources: Arc<Sources>,
    /// Flags of the scenario's own for the nodes it spawns next.
    pub node_args: Vec<String>,
}

impl Setup {
    /// Starts (or connects to) Redis; no nodes yet.
    pub fn redis(common: &Common) -> anyhow::Result<Self> {
        let (local_redis, redis_url) = match &common.redis_url {
            Some(url) => (None, url.clone()),
            None => {
                anyhow::ensure!(
                    common.node_urls.is_empty(),
                    "--node-url needs the --redis-url those nodes use"
                );
                let r = LocalRedis::start()?;
                let url = r.url.clone();
                (Some(r), url)
            }
        };
        Ok(Self {
            local_redis,
            redis_url,
            nodes: Vec::new(),
            sources: Arc::new(Sources::new(common.sources)),
            node_args: Vec::new(),
        })
    }

    /// Adds `n` nodes: the given --node-url ones (the last reused when
    /// fewer are given), else spawned with the heartbeat flag or
    /// `default_hb` and [`Setup::node_args`].
    pub fn start_nodes(
        &mut self,
        common: &Common,
        n: usize,
        default_hb: Option<u64>,
    ) -> anyhow::Result<()> {
        if !common.node_urls.is_empty() {
            for i in 0..n {
                let url = &common.node_urls[i.min(common.node_urls.len() - 1)];
                self.nodes.push(Node::remote(url)?);
            }
            return Ok(());
        }
        let bin = procs::server_bin(common.server_bin.as_deref())?;
        let hb = common.heartbeat_ms.or(default_hb);
        for i in 0..n {
            let id = format!("bench-{}", (b'a' + i as u8) as char);
            self.nodes.push(Node::spawn(
                &bin,
                &self.redis_url,
                &id,
                hb,
                &self.node_args,
            )?);
        }
        Ok(())
    }

    /// A multiplexed connection to the Redis under test.
    pub async fn redis_conn(&self) -> anyhow::Result<redis::aio::MultiplexedConnection> {
        // redis-rs gives up on a reply after 500 ms by default; a loaded
        // shared box, a big pipeline or INFO under load can take longer.
        let config = redis::AsyncConnectionConfig::new()
            .set_response_timeout(Some(std::time::Duration::from_secs(30)));
        Ok(redis::Client::open(self.redis_url.as_str())?
            .get_multiplexed_async_connection_with_config(&config)
            .await?)
    }
}

/// One field of `INFO <section>`.
pub async fn redis_info(
    conn: &mut redis::aio::MultiplexedConnection,
    section: &str,
    field: &str,
) -> anyhow::Result<String> {
    let info: String = redis::cmd("INFO").arg(section).query_async(conn).await?;
    let prefix = format!("{field}:");
    info.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .map(|s| s.trim().to_string())
        .with_context(|| format!("INFO {section} has no {field}"))
}

/// `used_memory` in bytes.
pub async fn redis_used_memory(
    conn: &mut redis::aio::MultiplexedConnection,
) -> anyhow::Result<u64> {
    Ok(redis_info(conn, "memory", "used_memory").await?.parse()?)
}

/// Calls of one command so far (`INFO commandstats`), e.g. `evalsha`.
pub async fn redis_calls(
    conn: &mut redis::aio::MultiplexedConnection,
    command: &str,
) -> anyhow::Result<u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await?;
    let prefix = format!("cmdstat_{command}:");
    let Some(v) = info.lines().find_map(|l| l.strip_prefix(prefix.as_str())) else {
        // Never called yet.
        return Ok(0);
    };
    v.split(',')
        .find_map(|kv| kv.strip_prefix("calls="))
        .and_then(|n| n.parse().ok())
        .context("cmdstat without calls=")
}

/// Epoch milliseconds (the unit of lease deadlines in Redis).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
