//! Where Redis is: [`RedisOptions`] is what the flags say (`--redis-url`
//! with `redis://`, `rediss://`, `redis+sentinel://` or
//! `rediss+sentinel://`, or `--redis-sentinel` with
//! `--redis-sentinel-master`, and the TLS files); [`RedisSource`] turns it
//! into clients for the current primary, asking the sentinels again each
//! time when there are sentinels.

use std::path::PathBuf;
use std::sync::Arc;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{
    ClientTlsConfig, IntoConnectionInfo, RedisError, RedisResult, TlsCertificates, TlsMode,
};

use super::*;

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
    /// `--local-redis-dir`: where a private `redis-server` is started when
    /// neither a URL nor sentinels are given; `None` makes that an error.
    pub local_dir: Option<PathBuf>,
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
    pub(super) inner: Arc<SourceInner>,
}

pub(super) struct SourceInner {
    kind: Kind,
    /// The target without its password, e.g. `rediss://app:***@host:6380/0`.
    display: String,
    /// The database number (selects the keyspace-event channel).
    db: i64,
    /// Whether connections use TLS (for error hints).
    pub(super) tls: bool,
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
    pub(super) async fn manager(&self) -> RedisResult<ConnectionManager> {
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
pub(super) fn primary_may_have_moved(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || matches!(e.code(), Some("READONLY" | "MASTERDOWN" | "LOADING"))
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
}
