//! Connecting to the Redis that teams actually have: managed services and
//! Sentinel-managed pairs, with TLS, ACL users and no `CONFIG`.
//!
//! - [`RedisOptions`] is what the flags say (`--redis-url` with `redis://`,
//!   `rediss://`, `redis+sentinel://` or `rediss+sentinel://`, or
//!   `--redis-sentinel` with `--redis-sentinel-master`, and the TLS files);
//!   [`RedisSource`] turns it into clients for the current primary, asking
//!   the sentinels again each time when there are sentinels.
//! - [`PrimaryConn`] is the command connection behind the store's
//!   `RedisConn`: a `ConnectionManager`, and behind Sentinel one that is
//!   replaced by a connection to the new primary when the old one stops
//!   answering.
//! - [`connect`] runs the start-up checks (reachable, version, eviction
//!   policy, expired-key events) with errors that name the host and never
//!   the password, and starts the health checker behind `/healthz`.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures_util::StreamExt;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{
    ClientTlsConfig, Cmd, IntoConnectionInfo, Pipeline, RedisError, RedisFuture, RedisResult,
    TlsCertificates, TlsMode, Value,
};

use crate::keys;

/// How long connecting to Redis (TCP, TLS, AUTH) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// How long one Redis command may take before it fails.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long start-up may spend reaching Redis before it gives up: the
/// README promises an exit within 5 s.
const START_TIMEOUT: Duration = Duration::from_millis(4_000);
/// How long asking the sentinels for the primary may take.
const SENTINEL_TIMEOUT: Duration = Duration::from_secs(2);
/// Period of the health check whose result `/healthz` serves.
const HEALTH_INTERVAL: Duration = Duration::from_millis(500);
/// Longest wait for one health check's PING.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(1);
/// The eviction policy is read again this often (a console change).
const POLICY_INTERVAL: Duration = Duration::from_secs(30);
/// How long start-up waits for the probe key's `expired` event.
const PROBE_TIMEOUT: Duration = Duration::from_millis(1_500);
/// Oldest Redis the server runs on (sharded pub/sub, `ZRANGE BYSCORE`).
const MIN_VERSION: (u32, u32) = (7, 0);

/// Where Redis is, as the flags say.
#[derive(Debug, Clone, Default)]
pub struct RedisOptions {
    /// `--redis-url`.
    pub url: Option<String>,
    /// `--redis-sentinel`: `host:port` of each sentinel.
    pub sentinels: Vec<String>,
    /// `--redis-sentinel-master`: the name the sentinels monitor.
    pub sentinel_master: Option<String>,
    /// `--redis-tls-ca-file`: a private CA instead of the system roots.
    pub tls_ca_file: Option<PathBuf>,
    /// `--redis-tls-cert-file`: client certificate for mutual TLS.
    pub tls_cert_file: Option<PathBuf>,
    /// `--redis-tls-key-file`: its private key.
    pub tls_key_file: Option<PathBuf>,
}

/// `url` with any password replaced by `***`, for logs and errors.
pub fn redact(url: &str) -> String {
    // Without a scheme (a mistake, reported with this) the same holds.
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (format!("{scheme}://"), rest),
        None => (String::new(), url),
    };
    // The userinfo ends at the last '@' before the path.
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return url.to_string();
    };
    let userinfo = &rest[..at];
    let masked = match userinfo.split_once(':') {
        Some((user, _)) => format!("{user}:***"),
        // `redis://secret@host` is read as a password by some clients.
        None if !userinfo.is_empty() => "***".to_string(),
        None => String::new(),
    };
    format!("{scheme}{masked}{}", &rest[at..])
}

/// The forms `--redis-url` accepts, for error messages.
const URL_FORMS: &str = "redis://[user:password@]host:port[/db], rediss://... for TLS, or redis+sentinel://[user:password@]host:port[,host:port...]/<master>[/db]";

/// Reads a PEM file named by a flag.
fn read_pem(flag: &str, path: &PathBuf) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| anyhow::anyhow!("cannot read {flag} {}: {e}", path.display()))
}

/// The TLS files of the flags, if any was given.
fn certificates(opts: &RedisOptions) -> anyhow::Result<Option<TlsCertificates>> {
    let root_cert = match &opts.tls_ca_file {
        Some(path) => Some(read_pem("--redis-tls-ca-file", path)?),
        None => None,
    };
    let client_tls = match (&opts.tls_cert_file, &opts.tls_key_file) {
        (Some(cert), Some(key)) => Some(ClientTlsConfig {
            client_cert: read_pem("--redis-tls-cert-file", cert)?,
            client_key: read_pem("--redis-tls-key-file", key)?,
        }),
        (None, None) => None,
        _ => anyhow::bail!("--redis-tls-cert-file and --redis-tls-key-file go together"),
    };
    Ok(
        (root_cert.is_some() || client_tls.is_some()).then_some(TlsCertificates {
            client_tls,
            root_cert,
        }),
    )
}

/// How the source reaches the primary.
enum Kind {
    /// One address (which may fail over behind a DNS name).
    Direct(redis::Client),
    /// Ask the sentinels for the primary of `master`.
    Sentinel {
        /// The sentinels and the node credentials.
        client: tokio::sync::Mutex<SentinelClient>,
    },
}

/// Clients for the current primary; cheap to clone.
#[derive(Clone)]
pub struct RedisSource {
    inner: Arc<SourceInner>,
}

struct SourceInner {
    kind: Kind,
    /// The target without its password, e.g. `rediss://app:***@host:6380/0`.
    display: String,
    /// The database number (selects the keyspace-event channel).
    db: i64,
    /// Whether connections use TLS (for error hints).
    tls: bool,
}

impl RedisSource {
    /// Builds the source from the flags; checks their form, not the network.
    pub fn new(opts: &RedisOptions) -> anyhow::Result<Self> {
        let certs = certificates(opts)?;
        let url = match (&opts.url, opts.sentinels.is_empty()) {
            (Some(_), false) => anyhow::bail!(
                "give either --redis-url or --redis-sentinel, not both (credentials and TLS behind Sentinel: redis+sentinel://user:password@host:port,.../<master> or rediss+sentinel://...)"
            ),
            (None, false) => {
                let master = opts.sentinel_master.as_deref().ok_or_else(|| {
                    anyhow::anyhow!("--redis-sentinel needs --redis-sentinel-master NAME")
                })?;
                let scheme = if certs.is_some() {
                    "rediss+sentinel"
                } else {
                    "redis+sentinel"
                };
                format!("{scheme}://{}/{master}", opts.sentinels.join(","))
            }
            (Some(url), true) => {
                if opts.sentinel_master.is_some() {
                    anyhow::bail!("--redis-sentinel-master needs --redis-sentinel");
                }
                url.trim().to_string()
            }
            (None, true) => anyhow::bail!("no Redis given: pass --redis-url ({URL_FORMS})"),
        };
        let display = redact(&url);
        let Some((scheme, rest)) = url.split_once("://") else {
            anyhow::bail!("--redis-url {display:?} has no scheme; use {URL_FORMS}");
        };
        let tls = matches!(scheme, "rediss" | "rediss+sentinel" | "valkeys");
        if certs.is_some() && !tls {
            anyhow::bail!(
                "--redis-tls-* files need a TLS URL: rediss:// (or rediss+sentinel://) instead of {scheme}://"
            );
        }
        if tls {
            // The redis crate's rustls takes the process-wide provider; an
            // error means one is installed already, which is as good.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let (kind, db) = match scheme {
            "redis" | "rediss" | "valkey" | "valkeys" | "unix" | "redis+unix" => {
                let info = url.as_str().into_connection_info().map_err(|e| {
                    anyhow::anyhow!("invalid --redis-url {display:?}: {e}; use {URL_FORMS}")
                })?;
                let db = info.redis_settings().db();
                let client = match certs {
                    Some(certs) => redis::Client::build_with_tls(info, certs),
                    None => redis::Client::open(info),
                }
                .map_err(|e| anyhow::anyhow!("invalid --redis-url {display:?}: {e}"))?;
                (Kind::Direct(client), db)
            }
            "redis+sentinel" | "rediss+sentinel" => {
                let (client, db) = sentinel_client(rest, tls, certs)
                    .map_err(|e| anyhow::anyhow!("invalid Sentinel target {display:?}: {e}"))?;
                (
                    Kind::Sentinel {
                        client: tokio::sync::Mutex::new(client),
                    },
                    db,
                )
            }
            other => {
                anyhow::bail!("--redis-url {display:?}: unknown scheme {other:?}; use {URL_FORMS}")
            }
        };
        Ok(Self {
            inner: Arc::new(SourceInner {
                kind,
                display,
                db,
                tls,
            }),
        })
    }

    /// A source for one known server (one primary of a cluster).
    pub fn direct(client: redis::Client) -> Self {
        let info = client.get_connection_info();
        let tls = matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. });
        let (display, db) = (info.addr().to_string(), info.redis_settings().db());
        Self {
            inner: Arc::new(SourceInner {
                kind: Kind::Direct(client),
                display,
                db,
                tls,
            }),
        }
    }

    /// The target without its password.
    pub fn display(&self) -> &str {
        &self.inner.display
    }

    /// The database number.
    pub fn db(&self) -> i64 {
        self.inner.db
    }

    /// True behind Sentinel: the primary can move.
    pub fn follows_failover(&self) -> bool {
        matches!(self.inner.kind, Kind::Sentinel { .. })
    }

    /// A client for the current primary. Behind Sentinel this asks the
    /// sentinels (and checks that the node they name is a primary).
    pub async fn client(&self) -> RedisResult<redis::Client> {
        match &self.inner.kind {
            Kind::Direct(client) => Ok(client.clone()),
            Kind::Sentinel { client } => {
                let ask = async { client.lock().await.async_get_client().await };
                match tokio::time::timeout(SENTINEL_TIMEOUT, ask).await {
                    Ok(result) => result,
                    Err(_) => Err(RedisError::from((
                        redis::ErrorKind::Io,
                        "the sentinels did not name a reachable primary in time",
                    ))),
                }
            }
        }
    }

    /// A connection manager on the current primary; fails fast (one try
    /// with [`CONNECT_TIMEOUT`]) so that a caller can decide what next.
    async fn manager(&self) -> RedisResult<ConnectionManager> {
        let client = self.client().await?;
        ConnectionManager::new_with_config(client, manager_config()).await
    }
}

/// Settings of every command connection. No retries inside a command: with
/// Redis down a request fails at once (REST answers 503 in well under 2 s)
/// and the next command tries to reconnect.
fn manager_config() -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(CONNECT_TIMEOUT))
        .set_response_timeout(Some(RESPONSE_TIMEOUT))
        .set_number_of_retries(0)
}

/// Parses the part of a `redis+sentinel://` URL after the scheme:
/// `[user:password@]host:port[,host:port...]/<master>[/db]`.
fn sentinel_client(
    rest: &str,
    tls: bool,
    certs: Option<TlsCertificates>,
) -> anyhow::Result<(SentinelClient, i64)> {
    let (userinfo, rest) = match rest.rsplit_once('@') {
        Some((user, rest)) if !rest.contains('@') => (Some(user), rest),
        _ => (None, rest),
    };
    let (hosts, path) = rest
        .split_once('/')
        .ok_or_else(|| anyhow::anyhow!("it names no master (…/<master>)"))?;
    let mut path = path.trim_end_matches('/').split('/');
    let master = path.next().filter(|m| !m.is_empty());
    let master = master.ok_or_else(|| anyhow::anyhow!("it names no master (…/<master>)"))?;
    let db: i64 = match path.next() {
        Some(db) => db
            .parse()
            .map_err(|_| anyhow::anyhow!("{db:?} is not a database number"))?,
        None => 0,
    };
    let mut addrs = Vec::new();
    for host in hosts.split(',').filter(|h| !h.is_empty()) {
        let scheme = if tls { "rediss" } else { "redis" };
        let info = format!("{scheme}://{host}")
            .into_connection_info()
            .map_err(|e| anyhow::anyhow!("sentinel {host:?}: {e}"))?;
        addrs.push(info.addr().clone());
    }
    if addrs.is_empty() {
        anyhow::bail!("it names no sentinel");
    }
    // The redis crate decodes the credentials of a plain URL; borrow that.
    let creds = match userinfo {
        Some(user) => format!("redis://{user}@localhost/{db}")
            .into_connection_info()
            .map_err(|e| anyhow::anyhow!("credentials: {e}"))?,
        None => format!("redis://localhost/{db}").into_connection_info()?,
    };
    let creds = creds.redis_settings();
    let mut builder = SentinelClientBuilder::new(addrs, master, SentinelServerType::Master)?
        .set_client_to_redis_db(db);
    if let Some(user) = creds.username() {
        builder = builder.set_client_to_redis_username(user);
    }
    if let Some(password) = creds.password() {
        builder = builder.set_client_to_redis_password(password);
    }
    if tls {
        builder = builder
            .set_client_to_redis_tls_mode(TlsMode::Secure)
            .set_client_to_sentinel_tls_mode(TlsMode::Secure);
        if let Some(certs) = certs {
            builder = builder
                .set_client_to_redis_certificates(certs.clone())
                .set_client_to_sentinel_certificates(certs);
        }
    }
    Ok((builder.build()?, db))
}

/// An error after which the primary may be elsewhere: the connection broke,
/// or the node was demoted to a replica.
fn primary_may_have_moved(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || matches!(e.code(), Some("READONLY" | "MASTERDOWN" | "LOADING"))
}

/// The command connection to the current primary; cheap to clone,
/// reconnects by itself (and behind Sentinel, follows a failover).
#[derive(Clone)]
pub struct PrimaryConn {
    inner: ConnKind,
}

#[derive(Clone)]
enum ConnKind {
    /// One address: the manager reconnects to it.
    Direct(ConnectionManager),
    /// Behind Sentinel: replaced when the primary moves.
    Following(Arc<Following>),
}

/// A connection that follows the primary named by the sentinels.
struct Following {
    /// The connection to the primary as last named.
    current: RwLock<ConnectionManager>,
    /// Where to ask for the next one.
    source: RedisSource,
    /// A search for the new primary is running.
    searching: AtomicBool,
}

impl From<ConnectionManager> for PrimaryConn {
    fn from(manager: ConnectionManager) -> Self {
        Self {
            inner: ConnKind::Direct(manager),
        }
    }
}

impl PrimaryConn {
    /// Wraps `manager`, made from `source`; behind Sentinel it is replaced
    /// when the primary moves.
    fn new(manager: ConnectionManager, source: &RedisSource) -> Self {
        if !source.follows_failover() {
            return manager.into();
        }
        Self {
            inner: ConnKind::Following(Arc::new(Following {
                current: RwLock::new(manager),
                source: source.clone(),
                searching: AtomicBool::new(false),
            })),
        }
    }

    fn manager(&self) -> ConnectionManager {
        match &self.inner {
            ConnKind::Direct(m) => m.clone(),
            ConnKind::Following(f) => f
                .current
                .read()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .clone(),
        }
    }

    /// After a failed command behind Sentinel: looks for the primary in the
    /// background (one search at a time) and swaps the connection for one to
    /// it. Commands meanwhile fail fast and their callers retry as usual.
    fn after<T>(&self, result: &RedisResult<T>) {
        let ConnKind::Following(f) = &self.inner else {
            return;
        };
        match result {
            Err(e) if primary_may_have_moved(e) => {}
            _ => return,
        }
        if f.searching.swap(true, Ordering::AcqRel) {
            return;
        }
        let f = f.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let mut backoff = Duration::from_millis(100);
            let mut said = false;
            loop {
                match f.source.manager().await {
                    Ok(manager) => {
                        *f.current
                            .write()
                            .unwrap_or_else(|poisoned| poisoned.into_inner()) = manager;
                        log::info!(
                            "connected to the primary of {} after {:?}",
                            f.source.display(),
                            started.elapsed()
                        );
                        break;
                    }
                    Err(e) => {
                        if !said {
                            log::warn!(
                                "lost the primary of {}; asking the sentinels until they name a new one: {e}",
                                f.source.display()
                            );
                            said = true;
                        }
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(1));
                    }
                }
            }
            f.searching.store(false, Ordering::Release);
        });
    }
}

impl ConnectionLike for PrimaryConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let result = self.manager().req_packed_command(cmd).await;
            self.after(&result);
            result
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let result = self
                .manager()
                .req_packed_commands(pipeline, offset, count)
                .await;
            self.after(&result);
            result
        })
    }

    fn get_db(&self) -> i64 {
        match &self.inner {
            ConnKind::Direct(m) => m.get_db(),
            ConnKind::Following(f) => f.source.db(),
        }
    }
}

/// Whether Redis announces expired keys, as found at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpiredEvents {
    /// They were on (read with CONFIG GET, or seen arriving for a probe key).
    On,
    /// They were off and this node turned them on with CONFIG SET.
    Enabled,
    /// Off and CONFIG is denied: the deadline pass departs lapsed leases.
    Off,
}

impl ExpiredEvents {
    fn describe(self) -> &'static str {
        match self {
            Self::On => "on",
            Self::Enabled => "enabled by this node with CONFIG SET",
            Self::Off => "off: the deadline pass departs lapsed leases itself; set notify-keyspace-events to Ex",
        }
    }
}

/// What `/healthz` reports, refreshed by the health checker.
#[derive(Debug, Clone)]
struct HealthState {
    /// The last PING answered.
    up: bool,
    /// Why the last PING failed.
    error: Option<String>,
    /// When the last check finished.
    checked_at: Instant,
    /// `maxmemory-policy` from `INFO memory`.
    policy: String,
}

/// Redis's state as last checked; `/healthz` answers from it at once.
pub struct RedisHealth {
    /// The target without its password.
    target: String,
    /// `redis_version` from `INFO server`.
    version: String,
    /// Expired-key events as found at start.
    events: ExpiredEvents,
    state: RwLock<HealthState>,
}

impl RedisHealth {
    /// The health of a Redis reached some other way (a cluster), checked
    /// from now on through `conn` like the one server's.
    pub fn watch(
        target: String,
        version: String,
        events: ExpiredEvents,
        conn: impl ConnectionLike + Send + 'static,
    ) -> Arc<Self> {
        Self::watch_with_policy(target, version, events, "unknown".to_string(), conn)
    }

    /// The health of the Redis at `target`, as found at start (`policy` from
    /// `INFO memory`), checked from now on in the background through `conn`.
    fn watch_with_policy(
        target: String,
        version: String,
        events: ExpiredEvents,
        policy: String,
        conn: impl ConnectionLike + Send + 'static,
    ) -> Arc<Self> {
        let health = Arc::new(Self {
            target,
            version,
            events,
            state: RwLock::new(HealthState {
                up: true,
                error: None,
                checked_at: Instant::now(),
                policy,
            }),
        });
        tokio::spawn(check_health(conn, health.clone()));
        health
    }
}

/// A `/healthz` answer.
pub struct HealthReport {
    /// Redis answered the last check.
    pub up: bool,
    /// The details for the JSON body.
    pub details: serde_json::Value,
}

impl RedisHealth {
    /// The cached state, as `/healthz` shows it.
    pub fn report(&self) -> HealthReport {
        let s = self
            .state
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone();
        HealthReport {
            up: s.up,
            details: serde_json::json!({
                "target": self.target,
                "version": self.version,
                "checked_ms_ago": s.checked_at.elapsed().as_millis() as u64,
                "error": s.error,
                "maxmemory_policy": s.policy,
                "eviction_warning": eviction_warning(&s.policy),
                "expired_events": self.events.describe(),
            }),
        }
    }

    fn update(&self, f: impl FnOnce(&mut HealthState)) {
        let mut state = self
            .state
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        f(&mut state);
    }
}

/// The warning for an eviction policy that can delete live keys, if it can.
fn eviction_warning(policy: &str) -> Option<String> {
    (policy.starts_with("allkeys-") || policy.starts_with("volatile-")).then(|| {
        format!(
            "maxmemory-policy is {policy}: Redis may evict a live lease (a false offline) or the last-seen index (lost data) when memory is full; set it to noeviction"
        )
    })
}

/// The value of `field` in an `INFO` reply.
fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .map(str::trim)
}

/// `(major, minor)` of a `redis_version` string.
fn parse_version(v: &str) -> Option<(u32, u32)> {
    let mut parts = v.split('.');
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// Connected to Redis and checked: what the node runs on.
pub struct Redis {
    /// Clients for the pub/sub connections.
    pub source: RedisSource,
    /// The command connection, for the store's `RedisConn`.
    pub conn: PrimaryConn,
    /// The cached state behind `/healthz`.
    pub health: Arc<RedisHealth>,
}

/// Connects and runs the start-up checks, within [`START_TIMEOUT`] for the
/// connection; then starts the health checker. Errors name the target
/// without its password.
pub async fn connect(opts: &RedisOptions, node: &str) -> anyhow::Result<Redis> {
    let source = RedisSource::new(opts)?;
    let target = source.display().to_string();
    let manager = match tokio::time::timeout(START_TIMEOUT, source.manager()).await {
        Ok(Ok(manager)) => manager,
        Ok(Err(e)) => return Err(connect_error(&source, &e)),
        Err(_) => {
            anyhow::bail!("cannot connect to Redis at {target}: no answer within {START_TIMEOUT:?}")
        }
    };
    let mut conn = PrimaryConn::new(manager, &source);

    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut conn)
        .await
        .with_context(|| format!("Redis at {target} refused INFO (the ACL user needs +info)"))?;
    let version = info_field(&info, "redis_version")
        .unwrap_or("unknown")
        .to_string();
    match parse_version(&version) {
        Some(v) if v >= MIN_VERSION => {}
        _ => anyhow::bail!(
            "Redis at {target} is version {version}; this server needs Redis {}.{} or newer",
            MIN_VERSION.0,
            MIN_VERSION.1
        ),
    }
    let policy = read_policy(&mut conn).await.unwrap_or_else(|e| {
        log::warn!("cannot read maxmemory-policy from INFO memory: {e}");
        "unknown".to_string()
    });
    if let Some(warning) = eviction_warning(&policy) {
        log::warn!("{warning}");
    }
    let events = ensure_expired_events(&source, &mut conn, node).await?;
    log::info!(
        "redis {version} at {target}: maxmemory-policy {policy}, expired-key events {}",
        events.describe()
    );
    let health = RedisHealth::watch_with_policy(target, version, events, policy, conn.clone());
    Ok(Redis {
        source,
        conn,
        health,
    })
}

/// A start-up connection error that says what kind of problem it is and
/// names the target (without its password).
fn connect_error(source: &RedisSource, e: &RedisError) -> anyhow::Error {
    let target = source.display();
    let text = e.to_string();
    let lower = text.to_ascii_lowercase();
    if source.inner.tls
        && [
            "certificate",
            "unknownissuer",
            "notvalidforname",
            "handshake",
            "tls",
            "alert",
        ]
        .iter()
        .any(|w| lower.contains(w))
    {
        anyhow::anyhow!(
            "cannot connect to Redis at {target}: TLS certificate problem ({text}); check that the server's certificate is signed by a CA you trust (--redis-tls-ca-file for a private CA) and names the host you connect to"
        )
    } else if e.kind() == redis::ErrorKind::AuthenticationFailed
        || matches!(e.code(), Some("WRONGPASS" | "NOAUTH" | "NOPERM"))
    {
        anyhow::anyhow!("Redis at {target} refused the credentials: {text}")
    } else {
        anyhow::anyhow!("cannot connect to Redis at {target}: {text}")
    }
}

/// `maxmemory_policy` from `INFO memory` (no CONFIG needed).
async fn read_policy(conn: &mut (impl ConnectionLike + Send)) -> RedisResult<String> {
    let info: String = redis::cmd("INFO").arg("memory").query_async(conn).await?;
    Ok(info_field(&info, "maxmemory_policy")
        .unwrap_or("unknown")
        .to_string())
}

/// Pings Redis every [`HEALTH_INTERVAL`] and keeps the result for
/// `/healthz`; says once when Redis goes away and once when it is back.
async fn check_health(mut conn: impl ConnectionLike + Send, health: Arc<RedisHealth>) {
    let mut last_policy = Instant::now();
    // Ends with the process; the node holds `health` until then.
    while Arc::strong_count(&health) > 1 {
        tokio::time::sleep(HEALTH_INTERVAL).await;
        let ping = redis::cmd("PING");
        let ping = ping.query_async::<String>(&mut conn);
        let result = match tokio::time::timeout(HEALTH_TIMEOUT, ping).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no answer to PING within {HEALTH_TIMEOUT:?}")),
        };
        let was_up = health.report().up;
        match (&result, was_up) {
            (Err(e), true) => log::warn!("redis at {} unreachable: {e}", health.target),
            (Ok(()), false) => log::info!("redis at {} reachable again", health.target),
            _ => {}
        }
        let policy = if result.is_ok() && last_policy.elapsed() >= POLICY_INTERVAL {
            last_policy = Instant::now();
            read_policy(&mut conn).await.ok()
        } else {
            None
        };
        health.update(|s| {
            s.up = result.is_ok();
            s.error = result.err();
            s.checked_at = Instant::now();
            if let Some(policy) = policy {
                if policy != s.policy {
                    if let Some(warning) = eviction_warning(&policy) {
                        log::warn!("{warning}");
                    }
                    s.policy = policy;
                }
            }
        });
    }
}

/// Makes sure this node learns of expired leases. Reads
/// `notify-keyspace-events` and adds `E` and `x` with CONFIG SET where
/// CONFIG is allowed; where it is not, sets a short-lived probe key and
/// watches the keyevent channel for its `expired` event. When the events
/// are off and cannot be turned on, the node still starts: the deadline
/// pass departs lapsed leases itself, and a warning names the setting.
pub async fn ensure_expired_events(
    source: &RedisSource,
    conn: &mut PrimaryConn,
    node: &str,
) -> anyhow::Result<ExpiredEvents> {
    let current: RedisResult<Vec<String>> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("notify-keyspace-events")
        .query_async(conn)
        .await;
    match current {
        Ok(current) => {
            let flags = current.get(1).cloned().unwrap_or_default();
            let has_x = flags.contains('x') || flags.contains('A');
            if flags.contains('E') && has_x {
                return Ok(ExpiredEvents::On);
            }
            let mut wanted = flags.clone();
            for f in ['E', 'x'] {
                if !wanted.contains(f) {
                    wanted.push(f);
                }
            }
            let set = redis::cmd("CONFIG")
                .arg("SET")
                .arg("notify-keyspace-events")
                .arg(&wanted)
                .query_async::<()>(conn)
                .await;
            match set {
                Ok(()) => {
                    log::warn!("redis had notify-keyspace-events {flags:?}; set it to {wanted:?} so that lapsed leases are announced");
                    return Ok(ExpiredEvents::Enabled);
                }
                Err(e) => {
                    log::info!("CONFIG SET is not allowed ({e}); probing for expired-key events")
                }
            }
        }
        Err(e) => log::info!("CONFIG GET is not allowed ({e}); probing for expired-key events"),
    }
    if probe_expired_events(source, conn, node).await? {
        log::info!("expired-key events arrive (probe key seen); CONFIG is not needed");
        return Ok(ExpiredEvents::On);
    }
    log::warn!(
        "Redis does not announce expired keys and CONFIG is not allowed: set `notify-keyspace-events` to `Ex` in your provider's console (parameter group / configuration). Until then the deadline pass departs lapsed leases itself, so devices still go offline on time, at some extra Redis load"
    );
    Ok(ExpiredEvents::Off)
}

/// Sets a probe key that lapses at once and waits for its `expired` event
/// on the keyevent channel. Reading the key after its TTL makes Redis
/// delete it (and announce it) without waiting for its sampler.
async fn probe_expired_events(
    source: &RedisSource,
    conn: &mut PrimaryConn,
    node: &str,
) -> anyhow::Result<bool> {
    let target = source.display();
    let client = source.client().await?;
    let mut pubsub = tokio::time::timeout(START_TIMEOUT, client.get_async_pubsub())
        .await
        .map_err(|_| anyhow::anyhow!("cannot open a pub/sub connection to {target} in time"))?
        .with_context(|| format!("cannot open a pub/sub connection to {target}"))?;
    let channel = keys::expired_channel(source.db());
    pubsub.subscribe(&channel).await.with_context(|| {
        format!("cannot subscribe to {channel} on {target} (the ACL user needs &__keyevent@*__:expired)")
    })?;
    let key = format!("{}{node}:{:08x}", keys::PROBE_PREFIX, rand::random::<u32>());
    redis::cmd("SET")
        .arg(&key)
        .arg(1)
        .arg("PX")
        .arg(1)
        .query_async::<()>(conn)
        .await
        .with_context(|| format!("cannot write the probe key {key} on {target}"))?;
    let mut messages = pubsub.on_message();
    let deadline = tokio::time::Instant::now() + PROBE_TIMEOUT;
    let mut touch = tokio::time::interval(Duration::from_millis(50));
    loop {
        tokio::select! {
            msg = messages.next() => match msg {
                Some(msg) if msg.get_payload::<String>().ok().as_deref() == Some(key.as_str()) => {
                    return Ok(true);
                }
                Some(_) => {}
                None => anyhow::bail!("the pub/sub connection to {target} closed during the probe"),
            },
            _ = touch.tick() => {
                let _: RedisResult<i64> = redis::cmd("EXISTS").arg(&key).query_async(conn).await;
            }
            _ = tokio::time::sleep_until(deadline) => return Ok(false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_passwords_and_keeps_the_rest() {
        assert_eq!(
            redact("redis://app:s3cr3t@host:6379/0"),
            "redis://app:***@host:6379/0"
        );
        assert_eq!(redact("rediss://:pw@h/1"), "rediss://:***@h/1");
        assert_eq!(redact("redis://pw@h"), "redis://***@h");
        assert_eq!(
            redact("redis+sentinel://u:p@a:1,b:2/mymaster"),
            "redis+sentinel://u:***@a:1,b:2/mymaster"
        );
        assert_eq!(redact("redis://h:6379"), "redis://h:6379");
        assert_eq!(redact("h:6379"), "h:6379");
        assert_eq!(redact("u:pw@h:6379"), "u:***@h:6379");
    }

    #[test]
    fn a_url_without_scheme_gets_one_line_showing_the_form() {
        let opts = RedisOptions {
            url: Some("user:secret@10.0.0.5:6379".into()),
            ..Default::default()
        };
        let err = RedisSource::new(&opts).err().unwrap().to_string();
        assert!(!err.contains('\n'), "{err}");
        assert!(err.contains("redis://"), "{err}");
        assert!(!err.contains("secret"), "{err}");
    }

    #[test]
    fn parses_sentinel_urls() {
        let opts = RedisOptions {
            url: Some("redis+sentinel://u:p@127.0.0.1:26379,127.0.0.1:26380/mymaster/2".into()),
            ..Default::default()
        };
        let source = RedisSource::new(&opts).unwrap();
        assert_eq!(source.db(), 2);
        assert!(source.follows_failover());
        for bad in [
            "redis+sentinel://127.0.0.1:26379",
            "redis+sentinel:///mymaster",
            "redis+sentinel://127.0.0.1:26379/m/x",
        ] {
            let opts = RedisOptions {
                url: Some(bad.into()),
                ..Default::default()
            };
            assert!(RedisSource::new(&opts).is_err(), "{bad}");
        }
    }

    #[test]
    fn takes_sentinels_from_flags() {
        let flags = |url: Option<&str>, master: Option<&str>| RedisOptions {
            url: url.map(str::to_string),
            sentinels: vec!["127.0.0.1:26379".into(), "127.0.0.1:26380".into()],
            sentinel_master: master.map(str::to_string),
            ..Default::default()
        };
        let source = RedisSource::new(&flags(None, Some("mymaster"))).unwrap();
        assert!(source.follows_failover());
        assert_eq!(
            source.display(),
            "redis+sentinel://127.0.0.1:26379,127.0.0.1:26380/mymaster"
        );
        assert!(RedisSource::new(&flags(None, None)).is_err());
        assert!(RedisSource::new(&flags(Some("redis://h:1"), Some("m"))).is_err());
    }

    #[test]
    fn reads_info_fields_and_versions() {
        let info = "# Server\r\nredis_version:7.0.15\r\nmaxmemory_policy:allkeys-lru\r\n";
        assert_eq!(info_field(info, "redis_version"), Some("7.0.15"));
        assert_eq!(parse_version("7.0.15"), Some((7, 0)));
        assert!(parse_version("6.2.14").unwrap() < MIN_VERSION);
        assert!(eviction_warning("allkeys-lru").is_some());
        assert!(eviction_warning("volatile-ttl").is_some());
        assert!(eviction_warning("noeviction").is_none());
    }
}
