//! The Redis of a `storm` (one server, or a cluster with replicas), and a
//! sampler of each primary's commands per second.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::procs::{LocalCluster, LocalRedis};

/// The Redis under test.
pub enum Backend {
    One(LocalRedis),
    Cluster(LocalCluster),
}

impl Backend {
    /// One Redis for `primaries` 0, else a cluster.
    pub fn start(primaries: usize, replicas: usize) -> anyhow::Result<Self> {
        Ok(match primaries {
            0 => Self::One(LocalRedis::start()?),
            n => Self::Cluster(LocalCluster::start_with_replicas(n, replicas)?),
        })
    }

    /// What the nodes take as `--redis-url`.
    pub fn url(&self) -> String {
        match self {
            Self::One(r) => r.url.clone(),
            Self::Cluster(c) => c.seeds(),
        }
    }

    /// A URL per primary.
    pub fn primaries(&self) -> Vec<String> {
        match self {
            Self::One(r) => vec![r.url.clone()],
            Self::Cluster(c) => c.urls.clone(),
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Self::One(_) => "one Redis server".into(),
            Self::Cluster(c) => format!(
                "a Redis Cluster of {} primaries and {} replicas",
                c.urls.len(),
                c.replica_urls.len()
            ),
        }
    }
}

/// Connections to each primary.
pub async fn connect_all(
    primaries: &[String],
) -> anyhow::Result<Vec<redis::aio::MultiplexedConnection>> {
    let config =
        redis::AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(30)));
    let mut out = Vec::new();
    for url in primaries {
        out.push(
            redis::Client::open(url.as_str())?
                .get_multiplexed_async_connection_with_config(&config)
                .await?,
        );
    }
    Ok(out)
}

/// `used_memory` summed over the primaries.
pub async fn used_memory(conns: &mut [redis::aio::MultiplexedConnection]) -> anyhow::Result<u64> {
    let mut sum = 0;
    for c in conns {
        sum += crate::redis_used_memory(c).await?;
    }
    Ok(sum)
}

/// Where a run's Redis memory goes, summed over the primaries: the part
/// that does not grow with the fleet, client state (which holds each
/// subscribing connection's own table of its channels) and the sharded
/// channels with how many connections subscribe to each.
#[derive(Debug, Default)]
pub struct MemoryParts {
    /// `startup.allocated` plus `replication.backlog` (`MEMORY STATS`).
    pub fixed: u64,
    /// `clients.normal`.
    pub clients: u64,
    /// Sharded channels with a subscriber.
    pub channels: u64,
    /// (connection, channel) subscriptions.
    pub subscriptions: u64,
}

/// [`MemoryParts`] of each primary, summed.
pub async fn memory_parts(
    conns: &mut [redis::aio::MultiplexedConnection],
) -> anyhow::Result<MemoryParts> {
    let mut parts = MemoryParts::default();
    for c in conns {
        let stats: Vec<redis::Value> = redis::cmd("MEMORY").arg("STATS").query_async(c).await?;
        let field = |name: &str| -> u64 {
            stats
                .chunks(2)
                .find(|kv| matches!(&kv[0], redis::Value::BulkString(k) if k == name.as_bytes()))
                .and_then(|kv| redis::from_redis_value_ref::<u64>(&kv[1]).ok())
                .unwrap_or(0)
        };
        parts.fixed += field("startup.allocated") + field("replication.backlog");
        parts.clients += field("clients.normal");
        let channels: Vec<String> = redis::cmd("PUBSUB")
            .arg("SHARDCHANNELS")
            .query_async(c)
            .await?;
        parts.channels += channels.len() as u64;
        for batch in channels.chunks(1000) {
            let counts: Vec<redis::Value> = redis::cmd("PUBSUB")
                .arg("SHARDNUMSUB")
                .arg(batch)
                .query_async(c)
                .await?;
            for kv in counts.chunks(2) {
                parts.subscriptions += redis::from_redis_value_ref::<u64>(&kv[1]).unwrap_or(0);
            }
        }
    }
    Ok(parts)
}

/// The highest commands per second any primary ran, in the phase before
/// the storm and during it.
#[derive(Default)]
pub struct Peaks {
    pub before: f64,
    pub storm: f64,
}

/// Samples `total_commands_processed` of each primary every second until
/// `done`; a sample goes to the storm's peak once `storming` is set.
pub fn sample_ops(
    mut conns: Vec<redis::aio::MultiplexedConnection>,
    storming: Arc<AtomicBool>,
    done: Arc<AtomicBool>,
    peaks: Arc<Mutex<Peaks>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut last: Vec<Option<(u64, std::time::Instant)>> = vec![None; conns.len()];
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        while !done.load(Ordering::Relaxed) {
            tick.tick().await;
            for (c, last) in conns.iter_mut().zip(&mut last) {
                let Ok(v) = crate::redis_info(c, "stats", "total_commands_processed").await else {
                    continue;
                };
                let Ok(n) = v.parse::<u64>() else { continue };
                let now = std::time::Instant::now();
                if let Some((n0, t0)) = *last {
                    let rate = n.saturating_sub(n0) as f64 / now.duration_since(t0).as_secs_f64();
                    let mut p = peaks.lock().unwrap();
                    let slot = match storming.load(Ordering::Relaxed) {
                        true => &mut p.storm,
                        false => &mut p.before,
                    };
                    *slot = slot.max(rate);
                }
                *last = Some((n, now));
            }
        }
    })
}
