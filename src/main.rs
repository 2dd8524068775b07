//! `presence-server`: flags, logging, an optional private Redis, then [`server::run`].

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use presence_server::config::{self, Config};
use presence_server::local_redis::LocalRedis;
use presence_server::{ids, server};

/// Presence server: who is online, on which devices, with which status.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Address to listen on (HTTP and WebSocket).
    #[arg(long, env = "PRESENCE_LISTEN", default_value = "127.0.0.1:8080")]
    listen: String,

    /// Redis to keep state in, e.g. redis://127.0.0.1:6379/0. Without it a
    /// private redis-server is started from the bundled redis.conf and
    /// stopped on exit.
    #[arg(long, env = "REDIS_URL")]
    redis_url: Option<String>,

    /// Interval between server pings to each client, in ms.
    #[arg(long, env = "PRESENCE_HEARTBEAT_MS", default_value_t = config::DEFAULT_HEARTBEAT.as_millis() as u64,
          value_parser = clap::value_parser!(u64).range(100..=3_600_000))]
    heartbeat_ms: u64,

    /// Device lease TTL in ms: how long a silent device stays online
    /// [default: 3 x heartbeat].
    #[arg(long, env = "PRESENCE_TTL_MS", value_parser = clap::value_parser!(u64).range(100..=86_400_000))]
    ttl_ms: Option<u64>,

    /// This node's id in lease values and logs [default: presence-<random>].
    #[arg(long, env = "PRESENCE_NODE_ID")]
    node_id: Option<String>,

    /// Most users one session may watch.
    #[arg(long, env = "PRESENCE_MAX_WATCHES", default_value_t = config::DEFAULT_MAX_WATCHES)]
    max_watches: usize,

    /// Largest WebSocket frame accepted from a client, in bytes.
    #[arg(long, env = "PRESENCE_MAX_FRAME_BYTES", default_value_t = config::DEFAULT_MAX_FRAME_BYTES)]
    max_frame_bytes: usize,

    /// Events a session may have waiting for a client that reads too
    /// slowly; one more disconnects it. Keep it above --max-watches.
    #[arg(long, env = "PRESENCE_MAX_QUEUED_EVENTS", default_value_t = config::DEFAULT_MAX_QUEUED_EVENTS as u64,
          value_parser = clap::value_parser!(u64).range(16..=1_000_000))]
    max_queued_events: u64,

    /// Client frames per second one session may send (bursts of twice as
    /// many pass); beyond it frames are refused, and a sustained flood is
    /// closed with 1008.
    #[arg(long, env = "PRESENCE_MAX_FRAMES_PER_SEC", default_value_t = config::DEFAULT_MAX_FRAMES_PER_SEC,
          value_parser = clap::value_parser!(u32).range(1..))]
    max_frames_per_sec: u32,

    /// Devices one user may have connected at once; one more is closed
    /// with 1008.
    #[arg(long, env = "PRESENCE_MAX_DEVICES_PER_USER", default_value_t = config::DEFAULT_MAX_DEVICES_PER_USER,
          value_parser = clap::value_parser!(u32).range(1..))]
    max_devices_per_user: u32,

    /// Days an offline user's last seen (and status) is kept.
    #[arg(long, env = "PRESENCE_LAST_SEEN_RETENTION_DAYS", default_value_t = 90,
          value_parser = clap::value_parser!(u64).range(1..=36_500))]
    last_seen_retention_days: u64,

    /// Period of the reconciliation pass that repairs device sets and
    /// counters disagreeing with the live leases, in ms.
    #[arg(long, env = "PRESENCE_RECONCILE_INTERVAL_MS",
          default_value_t = config::DEFAULT_RECONCILE_INTERVAL.as_millis() as u64,
          value_parser = clap::value_parser!(u64).range(100..=86_400_000))]
    reconcile_interval_ms: u64,

    /// Where the private redis-server keeps its data and log (a fresh
    /// directory is made inside, and removed on exit).
    #[arg(long, env = "PRESENCE_LOCAL_REDIS_DIR", default_value_os_t = std::env::temp_dir())]
    local_redis_dir: PathBuf,
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let args = Args::parse();
    match start(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            log::error!("{e:#}");
            eprintln!("presence-server: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn start(args: Args) -> anyhow::Result<()> {
    let node_id = args
        .node_id
        .unwrap_or_else(|| format!("presence-{:08x}", rand::random::<u32>()));
    ids::validate("node", &node_id)?;
    let heartbeat = Duration::from_millis(args.heartbeat_ms);
    let mut config = Config::new(node_id);
    config.heartbeat = heartbeat;
    config.ttl = args
        .ttl_ms
        .map_or(heartbeat * config::TTL_HEARTBEATS, Duration::from_millis);
    if config.ttl <= heartbeat {
        anyhow::bail!(
            "--ttl-ms ({:?}) must be longer than --heartbeat-ms ({heartbeat:?}), or every device would lapse between pings",
            config.ttl
        );
    }
    config.max_watches = args.max_watches;
    config.max_frame_bytes = args.max_frame_bytes;
    config.last_seen_retention = Duration::from_secs(args.last_seen_retention_days * 24 * 3600);
    config.reconcile_interval = Duration::from_millis(args.reconcile_interval_ms);
    config.max_queued_events = args.max_queued_events as usize;
    config.max_frames_per_sec = args.max_frames_per_sec;
    config.max_devices_per_user = args.max_devices_per_user;
    raise_fd_limit();

    let listener = TcpListener::bind(&args.listen)
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", args.listen))?;
    // Kept alive until the server stops; dropping it stops the private Redis.
    let (_local, url) = match args.redis_url {
        Some(url) => (None, url),
        None => {
            let local = LocalRedis::start(&args.local_redis_dir)?;
            let url = local.url.clone();
            (Some(local), url)
        }
    };
    actix_web::rt::System::new().block_on(server::run(config, &url, listener))
}

/// Every connection is a file descriptor: lift the soft limit to the hard one.
fn raise_fd_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain getrlimit/setrlimit on a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                log::warn!("could not raise the open-file limit");
            }
        }
    }
}
