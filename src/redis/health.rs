//! Redis's health as `/healthz` reports it: a checker that PINGs every
//! [`HEALTH_INTERVAL`] and re-reads the eviction policy, and the start-up
//! check that expired-key events arrive (turned on with CONFIG where it is
//! allowed, probed for where it is not).

use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures_util::StreamExt;
use redis::aio::ConnectionLike;
use redis::RedisResult;

use crate::keys;

/// Period of the health check whose result `/healthz` serves.
const HEALTH_INTERVAL: Duration = Duration::from_millis(500);
/// Longest wait for one health check's PING.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(1);
/// The eviction policy is read again this often (a console change).
const POLICY_INTERVAL: Duration = Duration::from_secs(30);
/// How long start-up waits for the probe key's `expired` event.
const PROBE_TIMEOUT: Duration = Duration::from_millis(1_500);
use super::*;

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
    pub(super) fn describe(self) -> &'static str {
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
    pub(super) fn watch_with_policy(
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
        crate::metrics::METRICS.health.redis_up.set(1);
        tokio::spawn(check_health(conn, health.clone()));
        health
    }
}

/// A `/healthz` answer.
pub struct HealthReport {
    /// Redis answered the last check.
    pub up: bool,
    /// How long ago that check finished.
    pub checked_ago: std::time::Duration,
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
        let checked_ago = s.checked_at.elapsed();
        HealthReport {
            up: s.up,
            checked_ago,
            details: serde_json::json!({
                "target": self.target,
                "version": self.version,
                "checked_ms_ago": checked_ago.as_millis() as u64,
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
pub(super) fn eviction_warning(policy: &str) -> Option<String> {
    (policy.starts_with("allkeys-") || policy.starts_with("volatile-")).then(|| {
        format!(
            "maxmemory-policy is {policy}: Redis may evict a live lease (a false offline) or the last-seen index (lost data) when memory is full; set it to noeviction"
        )
    })
}

/// The value of `field` in an `INFO` reply.
pub(super) fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .map(str::trim)
}

/// `(major, minor)` of a `redis_version` string.
pub(super) fn parse_version(v: &str) -> Option<(u32, u32)> {
    let mut parts = v.split('.');
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// `maxmemory_policy` from `INFO memory` (no CONFIG needed).
pub(super) async fn read_policy(conn: &mut (impl ConnectionLike + Send)) -> RedisResult<String> {
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
        crate::metrics::METRICS
            .health
            .redis_up
            .set(i64::from(result.is_ok()));
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
    use crate::redis::MIN_VERSION;

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
