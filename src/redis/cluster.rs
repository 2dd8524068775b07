//! Running on a Redis Cluster: telling a cluster from one server, and the
//! cluster connection.
//!
//! `--redis-url` takes one URL or a comma-separated list of seed URLs. The
//! server asks the first seed that answers (`INFO cluster`) whether it is a
//! cluster node, so one seed is enough; the cluster connection then learns
//! every node from it.
//!
//! Which node hears which primary's expired-key events is the expiry
//! listener's business (its `streams`).

use std::time::Duration;

use anyhow::Context as _;
use redis::cluster::ClusterClientBuilder;
use redis::{AsyncConnectionConfig, ConnectionAddr, ConnectionInfo, IntoConnectionInfo};

use std::sync::Arc;

use super::conn::{NodeAddr, RedisConn, Shard};
use super::{redact, ExpiredEvents, RedisHealth, RedisOptions, RedisSource};

/// Retries of one cluster command while its slot has no reachable primary
/// (a failover takes the cluster's node timeout plus an election).
const RETRIES: u32 = 16;
/// Shortest and longest wait between those retries, ms.
const RETRY_WAIT_MIN_MS: u64 = 50;
const RETRY_WAIT_MAX_MS: u64 = 500;
/// Oldest Redis this server runs on: sharded pub/sub came in 7.0.
const MIN_REDIS_MAJOR: u32 = 7;
/// How long connecting to a node may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long one command may take.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the node's dedicated pub/sub connections come from: one Redis
/// server, or the seeds of a cluster.
#[derive(Clone)]
pub enum Source {
    /// One Redis server (behind Sentinel, the current primary).
    Single(RedisSource),
    /// A Redis Cluster.
    Cluster(Seeds),
}

impl From<RedisSource> for Source {
    fn from(source: RedisSource) -> Self {
        Self::Single(source)
    }
}

/// The seed URLs of a cluster, and the nodes it was last seen to have.
///
/// A new connection (after its predecessor broke or got stuck) starts from
/// the nodes last read from `CLUSTER SHARDS`, then the given seeds: the
/// seeds alone may all be gone by then (one seed URL naming a primary that
/// died and was replaced).
#[derive(Clone, Debug)]
pub struct Seeds {
    /// The URLs of `--redis-url`.
    infos: Vec<ConnectionInfo>,
    /// Every node of the cluster as last read, with the seeds' credentials.
    learned: Arc<std::sync::RwLock<Vec<ConnectionInfo>>>,
}

impl Seeds {
    /// A cluster client builder over the known nodes (see the type's
    /// docs), with the server's retry policy and timeouts.
    pub fn builder(
        &self,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> ClusterClientBuilder {
        let mut nodes = self
            .learned
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        nodes.extend(self.infos.iter().cloned());
        ClusterClientBuilder::new(nodes)
            .connection_timeout(connect_timeout)
            .response_timeout(response_timeout)
            .retries(RETRIES)
            .min_retry_wait(RETRY_WAIT_MIN_MS)
            .max_retry_wait(RETRY_WAIT_MAX_MS)
            .retry_wait_formula(RETRY_WAIT_MIN_MS, 2)
    }

    /// Remembers every node of `shards` as a starting point for new
    /// connections.
    pub fn learn(&self, shards: &[Shard]) {
        let nodes: Vec<ConnectionInfo> = shards
            .iter()
            .flat_map(|s| &s.nodes)
            .filter_map(|node| self.info_for(node).ok())
            .collect();
        if !nodes.is_empty() {
            *self.learned.write().unwrap_or_else(|e| e.into_inner()) = nodes;
        }
    }

    /// A client for one node of the cluster, with the seeds' credentials.
    pub fn client_for(&self, node: &NodeAddr) -> redis::RedisResult<redis::Client> {
        redis::Client::open(self.info_for(node)?)
    }

    /// How to reach one node of the cluster, with the seeds' credentials.
    fn info_for(&self, node: &NodeAddr) -> redis::RedisResult<ConnectionInfo> {
        let seed = self.infos[0].clone();
        let Some((host, port)) = node.host_port() else {
            return Ok(seed);
        };
        let addr = match seed.addr() {
            ConnectionAddr::TcpTls {
                insecure,
                tls_params,
                ..
            } => ConnectionAddr::TcpTls {
                host: host.to_string(),
                port,
                insecure: *insecure,
                tls_params: tls_params.clone(),
            },
            _ => ConnectionAddr::Tcp(host.to_string(), port),
        };
        Ok(seed.set_addr(addr))
    }
}

/// The URLs of `--redis-url`: one, or several separated by commas.
pub fn parse_urls(redis_url: &str) -> anyhow::Result<Vec<ConnectionInfo>> {
    let urls: Vec<&str> = redis_url
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .collect();
    if urls.is_empty() {
        anyhow::bail!("--redis-url is empty");
    }
    urls.iter()
        .map(|u| {
            u.into_connection_info()
                .with_context(|| format!("invalid redis url {u:?}"))
        })
        .collect()
}

/// One `field:value` line of an INFO reply.
fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines().find_map(|line| {
        line.strip_prefix(field)
            .and_then(|rest| rest.strip_prefix(':'))
            .map(str::trim)
    })
}

/// Asks the first seed that answers whether it is a cluster node, and its
/// version; an error when no seed answered.
async fn is_cluster(
    seeds: &[ConnectionInfo],
    connect_timeout: Duration,
    response_timeout: Duration,
) -> anyhow::Result<(bool, String)> {
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(connect_timeout))
        .set_response_timeout(Some(response_timeout));
    let mut last_error = None;
    for seed in seeds {
        let addr = seed.addr().to_string();
        let answer = async {
            let mut conn = redis::Client::open(seed.clone())?
                .get_multiplexed_async_connection_with_config(&config)
                .await?;
            let server: String = redis::cmd("INFO")
                .arg("server")
                .query_async(&mut conn)
                .await?;
            let cluster: String = redis::cmd("INFO")
                .arg("cluster")
                .query_async(&mut conn)
                .await?;
            Ok::<_, redis::RedisError>((server, cluster))
        };
        match answer.await {
            Ok((server, cluster)) => {
                let version = info_field(&server, "redis_version").unwrap_or("unknown");
                return Ok((
                    info_field(&cluster, "cluster_enabled") == Some("1"),
                    version.to_string(),
                ));
            }
            Err(e) => last_error = Some(anyhow::anyhow!("cannot reach redis at {addr}: {e}")),
        }
    }
    Err(last_error.unwrap_or_else(|| anyhow::anyhow!("no redis url given")))
}

/// Turns on expired-key events on one node where `CONFIG` allows.
async fn enable_expired_events(
    conn: &mut impl redis::aio::ConnectionLike,
) -> redis::RedisResult<ExpiredEvents> {
    let current: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("notify-keyspace-events")
        .query_async(conn)
        .await?;
    let flags = current.get(1).cloned().unwrap_or_default();
    if flags.contains('E') && (flags.contains('x') || flags.contains('A')) {
        return Ok(ExpiredEvents::On);
    }
    let mut wanted = flags.clone();
    for f in ['E', 'x'] {
        if !wanted.contains(f) {
            wanted.push(f);
        }
    }
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("notify-keyspace-events")
        .arg(&wanted)
        .query_async::<()>(conn)
        .await?;
    Ok(ExpiredEvents::Enabled)
}

/// Connects to the cluster `--redis-url` names, with expired-key events on
/// every node where `CONFIG` allows, and starts its health check.
/// `Ok(None)` when the flags name one Redis server or Sentinel, which the
/// caller connects to as before (its errors reported there).
pub async fn connect(
    opts: &RedisOptions,
    node_id: &str,
) -> anyhow::Result<Option<(Source, RedisConn, Arc<RedisHealth>)>> {
    let (Some(redis_url), true) = (&opts.url, opts.sentinels.is_empty()) else {
        return Ok(None);
    };
    if redis_url.contains("+sentinel") || redis_url.starts_with("unix") {
        return Ok(None);
    }
    let shown = redact(redis_url);
    let infos = match parse_urls(redis_url) {
        Ok(infos) => infos,
        // One URL: the usual connection says what is wrong with it.
        Err(_) if !redis_url.contains(',') => return Ok(None),
        Err(e) => return Err(e),
    };
    let several = infos.len() > 1;
    let version = match is_cluster(&infos, CONNECT_TIMEOUT, RESPONSE_TIMEOUT).await {
        Ok((true, version)) => version,
        Ok((false, _)) if several => anyhow::bail!(
            "--redis-url lists {} seed URLs, but {} is not a Redis Cluster node (cluster_enabled:0); give one URL for one Redis",
            infos.len(),
            infos[0].addr()
        ),
        Ok((false, _)) => return Ok(None),
        Err(_) if !several => return Ok(None),
        Err(e) => return Err(e.context(format!("no seed of {shown} answered"))),
    };
    let major = version
        .split('.')
        .next()
        .and_then(|m| m.parse::<u32>().ok());
    if major.is_none_or(|m| m < MIN_REDIS_MAJOR) {
        anyhow::bail!(
            "Redis at {shown} is version {version}; this server needs Redis {MIN_REDIS_MAJOR}.0 or newer"
        );
    }
    let seeds = Seeds {
        infos,
        learned: Arc::default(),
    };
    let conn = seeds
        .builder(CONNECT_TIMEOUT, RESPONSE_TIMEOUT)
        .build()
        .context("invalid redis cluster seeds")?
        .get_async_connection()
        .await
        .with_context(|| format!("cannot connect to the redis cluster at {shown}"))?;
    let again = seeds.clone();
    let conn = RedisConn::cluster_from(
        move || again.builder(CONNECT_TIMEOUT, RESPONSE_TIMEOUT).build(),
        conn,
    );
    let shards = conn
        .shards()
        .await
        .context("cannot read the cluster's shards (CLUSTER SHARDS)")?;
    if shards.is_empty() {
        anyhow::bail!("the redis cluster at {shown} serves no slots (CLUSTER SHARDS)");
    }
    seeds.learn(&shards);
    // Every node, replicas too: a promoted replica must announce expiries.
    let mut events = ExpiredEvents::On;
    for node in shards.iter().flat_map(|s| &s.nodes) {
        let result = async {
            let mut c = seeds
                .client_for(node)?
                .get_multiplexed_async_connection()
                .await?;
            enable_expired_events(&mut c).await
        };
        match result.await {
            Ok(ExpiredEvents::Enabled) if events == ExpiredEvents::On => {
                events = ExpiredEvents::Enabled
            }
            Ok(_) => {}
            Err(e) => {
                log::warn!(
                    "redis cluster node {node}: cannot turn on expired-key events ({e}); the deadline pass departs lapsed leases itself; set notify-keyspace-events to Ex"
                );
                events = ExpiredEvents::Off;
            }
        }
    }
    log::info!(
        "redis {version} cluster at {shown} (node {node_id}): {} primaries: {}",
        shards.len(),
        shards
            .iter()
            .map(|s| s.primary.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let health = RedisHealth::watch(shown, version, events, conn.clone());
    Ok(Some((Source::Cluster(seeds), conn, health)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_lists_parse_and_bad_ones_are_refused() {
        let one = parse_urls("redis://127.0.0.1:7000/0").unwrap();
        assert_eq!(one.len(), 1);
        let three =
            parse_urls("redis://127.0.0.1:7000, redis://127.0.0.1:7001,redis://127.0.0.1:7002")
                .unwrap();
        assert_eq!(three.len(), 3);
        assert!(parse_urls(" , ").is_err());
        let err = parse_urls("redis://127.0.0.1:7000,http://x").unwrap_err();
        assert!(format!("{err:#}").contains("http://x"), "{err:#}");
    }

    #[test]
    fn info_fields_are_read_by_name() {
        let info = "# Cluster\r\ncluster_enabled:1\r\n";
        assert_eq!(info_field(info, "cluster_enabled"), Some("1"));
        assert_eq!(info_field(info, "cluster"), None);
    }

    #[test]
    fn a_node_client_keeps_the_seed_credentials() {
        let seeds = Seeds {
            infos: parse_urls("redis://user:pw@127.0.0.1:7000/0").unwrap(),
            learned: Arc::default(),
        };
        let client = seeds.client_for(&NodeAddr::node("10.0.0.2", 7005)).unwrap();
        let info = client.get_connection_info();
        assert_eq!(info.addr().to_string(), "10.0.0.2:7005");
        assert_eq!(info.redis_settings().username(), Some("user"));
    }

    #[test]
    fn new_connections_start_from_the_nodes_last_seen() {
        let seeds = Seeds {
            infos: parse_urls("redis://user:pw@127.0.0.1:7000").unwrap(),
            learned: Arc::default(),
        };
        seeds.learn(&[Shard {
            primary_id: "p".into(),
            primary: NodeAddr::node("10.0.0.3", 7001),
            nodes: vec![
                NodeAddr::node("10.0.0.3", 7001),
                NodeAddr::node("10.0.0.4", 7002),
            ],
        }]);
        let learned = seeds.learned.read().unwrap().clone();
        let addrs: Vec<String> = learned.iter().map(|i| i.addr().to_string()).collect();
        assert_eq!(addrs, ["10.0.0.3:7001", "10.0.0.4:7002"]);
        assert!(learned
            .iter()
            .all(|i| i.redis_settings().username() == Some("user")));
        // A read that found nothing keeps what was known.
        seeds.learn(&[]);
        assert_eq!(seeds.learned.read().unwrap().len(), 2);
    }
}
