//! Connecting to Redis, in one place: one server, a Sentinel-managed
//! primary, a Redis Cluster, or a private `redis-server` started for a
//! quick start. [`connect`] is the one way in; it returns the connection the
//! store uses, where the pub/sub connections come from, what kind of Redis
//! it is, and the health that `/healthz` serves.
//!
//! - [`source`]: what the flags say ([`RedisOptions`]) and clients for the
//!   current primary ([`RedisSource`], asking the sentinels each time).
//! - [`primary`]: [`PrimaryConn`], the command connection to one server
//!   (following a Sentinel failover).
//! - [`cluster`]: telling a cluster from one server; the cluster connection.
//! - [`conn`]: [`RedisConn`], the one connection type the store calls
//!   through, whatever is behind it (timed into the metrics).
//! - [`single`]: the start-up checks of one server (version, eviction
//!   policy, expired-key events), with errors that name the host and never
//!   the password.
//! - [`health`]: the checker behind `/healthz`; expired-key events turned on
//!   or probed for.
//! - [`pubsub`]: a subscription that survives restarts and failovers.
//! - [`local`]: the private `redis-server` of a run without `--redis-url`.

pub mod cluster;
pub mod conn;
pub mod health;
pub mod local;
pub mod primary;
pub mod pubsub;
pub mod single;
pub mod source;

use std::sync::Arc;
use std::time::Duration;

pub use cluster::Source;
pub use conn::RedisConn;
pub use health::{ExpiredEvents, HealthReport, RedisHealth};
pub use local::LocalRedis;
pub use primary::PrimaryConn;
pub use source::{redact, RedisOptions, RedisSource};

/// How long connecting to Redis (TCP, TLS, AUTH) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// How long one Redis command may take before it fails.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long start-up may spend reaching Redis before it gives up: the
/// docs/operations.md promises an exit within 5 s.
const START_TIMEOUT: Duration = Duration::from_millis(4_000);
/// How long asking the sentinels for the primary may take.
const SENTINEL_TIMEOUT: Duration = Duration::from_secs(2);
/// Oldest Redis the server runs on (sharded pub/sub, `ZRANGE BYSCORE`).
const MIN_VERSION: (u32, u32) = (7, 0);

/// What kind of Redis the node runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedisKind {
    /// One server named by `--redis-url`.
    Single,
    /// The primary of a Sentinel group, followed through failovers.
    Sentinel,
    /// A Redis Cluster, one or more seed URLs.
    Cluster,
    /// A private `redis-server` started from the bundled redis.conf.
    Local,
}

/// Connected to Redis and checked: what the node runs on.
pub struct Connected {
    /// What kind of Redis it is.
    pub kind: RedisKind,
    /// Where the pub/sub connections (registry, expiry listener) come from.
    pub source: Source,
    /// The command connection, for the store.
    pub conn: RedisConn,
    /// The cached state behind `/healthz`.
    pub health: Arc<RedisHealth>,
    /// The private server, when one was started; it stops when this drops,
    /// so the node keeps it until it has stopped.
    pub local: Option<LocalRedis>,
}

/// Connects to the Redis the options name, running the start-up checks
/// and starting the health checker. With neither a URL nor sentinels, it
/// first starts a private `redis-server` under `opts.local_dir`.
/// Checks the form of `opts` as [`connect`] would, without the network: the
/// URL (each seed of a cluster's list), Sentinel's master and the TLS
/// files. No URL and no sentinels (a private Redis) passes.
pub fn check_options(opts: &RedisOptions) -> anyhow::Result<()> {
    // A list of seed URLs, each with its scheme; a Sentinel URL has commas
    // of its own (`redis+sentinel://a:1,b:2/master`) and is one target.
    let list = |urls: &str| urls.contains(',') && urls.split(',').all(|u| u.contains("://"));
    match &opts.url {
        Some(urls) if list(urls) => {
            for url in urls.split(',').map(str::trim).filter(|u| !u.is_empty()) {
                let one = RedisOptions {
                    url: Some(url.to_string()),
                    ..opts.clone()
                };
                RedisSource::new(&one)?;
            }
            Ok(())
        }
        None if opts.sentinels.is_empty() => Ok(()),
        _ => RedisSource::new(opts).map(|_| ()),
    }
}

pub async fn connect(opts: &RedisOptions, node: &str) -> anyhow::Result<Connected> {
    let mut opts = opts.clone();
    let mut local = None;
    if opts.url.is_none() && opts.sentinels.is_empty() {
        let Some(dir) = &opts.local_dir else {
            anyhow::bail!("no Redis given: pass --redis-url or --redis-sentinel");
        };
        let started = LocalRedis::start(dir)?;
        opts.url = Some(started.url.clone());
        local = Some(started);
    }
    if let Some((source, conn, health)) = cluster::connect(&opts, node).await? {
        return Ok(Connected {
            kind: RedisKind::Cluster,
            source,
            conn,
            health,
            local,
        });
    }
    let redis = single::connect(&opts, node).await?;
    let kind = match (&local, redis.source.follows_failover()) {
        (Some(_), _) => RedisKind::Local,
        (None, true) => RedisKind::Sentinel,
        (None, false) => RedisKind::Single,
    };
    Ok(Connected {
        kind,
        source: Source::Single(redis.source),
        conn: RedisConn::new(redis.conn),
        health: redis.health,
        local,
    })
}
