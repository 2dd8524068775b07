//! What this node has done and holds, for `GET /metrics` (Prometheus text)
//! and the counters of `/healthz`.
//!
//! Counters are process-wide statics so that any actor can count without
//! being handed a handle; gauges that the registry already knows (sessions,
//! watches) are read from it at scrape time instead of being kept twice.
//! Redis latency is measured by [`TimedConnection`], which wraps the one
//! shared connection, so every command the store sends is timed.

use std::collections::HashMap;
use std::sync::{LazyLock, RwLock};
use std::time::Instant;

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts,
    Registry, TextEncoder,
};
use redis::aio::ConnectionLike;
use redis::{Arg, Cmd, Pipeline, RedisFuture, Value};

use crate::registry::RegistryStats;

/// Bucket bounds of the Redis latency histogram, in seconds: a local Redis
/// answers in well under a millisecond, a loaded or remote one in a few.
const REDIS_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

/// Bucket bounds of the refresh batch sizes (the refresher sends at most 512).
const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0];

/// Every metric of this node.
pub struct Metrics {
    /// Where every metric below is registered, for the text exposition.
    registry: Registry,
    /// WebSocket sessions accepted since start.
    pub sessions_opened: IntCounter,
    /// Open sessions (from the registry, at scrape time).
    sessions: IntGauge,
    /// Sessions watching at least one user (from the registry).
    watching_sessions: IntGauge,
    /// Distinct users watched on this node (from the registry).
    watched_users: IntGauge,
    /// Device leases held by this node's sessions.
    pub devices: IntGauge,
    /// Transitions seen on `presence-events` (from every node), by the
    /// status they announce.
    pub transitions_published: IntCounterVec,
    /// `presence` frames sent to watching clients.
    pub transitions_delivered: IntCounter,
    /// Expired-lease events received from Redis.
    pub expired_events: IntCounter,
    /// Devices removed by the deadline pass.
    pub devices_reaped: IntCounter,
    /// Users repaired by the reconciliation pass.
    pub reconcile_repairs: IntCounter,
    /// Stale `presence-online` entries dropped by the reconciliation pass.
    pub online_pruned: IntCounter,
    /// Sessions disconnected because they could not keep up with their events.
    pub slow_consumers_dropped: IntCounter,
    /// Sessions closed for sending too many frames.
    pub floods: IntCounter,
    /// Re-reads of the watched users after a resubscription.
    pub registry_resyncs: IntCounter,
    /// Records re-sent to sessions by those re-reads.
    pub registry_resync_records: IntCounter,
    /// Time per Redis command (or pipeline), by command or script name.
    pub redis_latency: HistogramVec,
    /// Redis commands that failed (connection or server error), by command.
    pub redis_errors: IntCounterVec,
    /// Lease refreshes per batch sent by the refresher.
    pub refresh_batch_size: Histogram,
}

/// The node's metrics.
pub static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

/// Counts a session dropped because its outbound queue overflowed.
pub fn slow_consumer_dropped() {
    METRICS.slow_consumers_dropped.inc();
}

/// Counts one batch of `size` lease refreshes.
pub fn refresh_batch(size: usize) {
    METRICS.refresh_batch_size.observe(size as f64);
}

/// Counts one re-read of the watched users that re-sent `records` records.
pub fn registry_resynced(records: u64) {
    METRICS.registry_resyncs.inc();
    METRICS.registry_resync_records.inc_by(records);
}

/// Counts a transition seen on `presence-events`.
pub fn transition_published(status: &str) {
    // Only the statuses of the protocol become label values, so that a
    // malformed event cannot grow the number of series. Invisible users are
    // counted as online: a separate series would tell a scraper when someone
    // hidden comes and goes.
    let status = match status {
        "online" | "away" | "busy" | "offline" => status,
        "invisible" => "online",
        _ => "other",
    };
    METRICS
        .transitions_published
        .with_label_values(&[status])
        .inc();
}

fn counter(name: &str, help: &str) -> IntCounter {
    IntCounter::new(name, help).expect("valid metric name")
}

fn gauge(name: &str, help: &str) -> IntGauge {
    IntGauge::new(name, help).expect("valid metric name")
}

impl Metrics {
    fn new() -> Self {
        let m = Self {
            registry: Registry::new(),
            sessions_opened: counter(
                "presence_sessions_opened_total",
                "WebSocket sessions accepted since start.",
            ),
            sessions: gauge("presence_sessions", "Open WebSocket sessions."),
            watching_sessions: gauge(
                "presence_watching_sessions",
                "Sessions watching at least one user.",
            ),
            watched_users: gauge(
                "presence_watched_users",
                "Distinct users watched by this node's sessions.",
            ),
            devices: gauge(
                "presence_devices",
                "Device leases held by this node's sessions.",
            ),
            transitions_published: IntCounterVec::new(
                Opts::new(
                    "presence_transitions_published_total",
                    "Transitions seen on presence-events (from every node), by announced status.",
                ),
                &["status"],
            )
            .expect("valid metric"),
            transitions_delivered: counter(
                "presence_transitions_delivered_total",
                "presence frames sent to watching clients.",
            ),
            expired_events: counter(
                "presence_expired_events_total",
                "Expired-lease events received from Redis and handled.",
            ),
            devices_reaped: counter(
                "presence_devices_reaped_total",
                "Devices removed by the deadline pass.",
            ),
            reconcile_repairs: counter(
                "presence_reconcile_repairs_total",
                "Users repaired by the reconciliation pass.",
            ),
            online_pruned: counter(
                "presence_online_pruned_total",
                "Stale presence-online entries dropped by the reconciliation pass.",
            ),
            slow_consumers_dropped: counter(
                "presence_slow_consumers_dropped_total",
                "Sessions disconnected because they could not keep up with their events.",
            ),
            floods: counter(
                "presence_floods_total",
                "Sessions closed for sending too many frames.",
            ),
            registry_resyncs: counter(
                "presence_registry_resyncs_total",
                "Re-reads of the watched users after resubscribing to presence-events.",
            ),
            registry_resync_records: counter(
                "presence_registry_resync_records_total",
                "Records re-sent to sessions by those re-reads.",
            ),
            redis_latency: HistogramVec::new(
                HistogramOpts::new(
                    "presence_redis_command_duration_seconds",
                    "Time per Redis command or pipeline, by command (Lua steps by script name).",
                )
                .buckets(REDIS_BUCKETS.to_vec()),
                &["command"],
            )
            .expect("valid metric"),
            redis_errors: IntCounterVec::new(
                Opts::new(
                    "presence_redis_errors_total",
                    "Redis commands or pipelines that failed, by command.",
                ),
                &["command"],
            )
            .expect("valid metric"),
            refresh_batch_size: Histogram::with_opts(
                HistogramOpts::new(
                    "presence_refresh_batch_size",
                    "Lease refreshes per batch sent to Redis (count: batches, sum: refreshes).",
                )
                .buckets(BATCH_BUCKETS.to_vec()),
            )
            .expect("valid metric"),
        };
        let r = &m.registry;
        // Registering distinct names cannot fail.
        r.register(Box::new(m.sessions_opened.clone())).unwrap();
        r.register(Box::new(m.sessions.clone())).unwrap();
        r.register(Box::new(m.watching_sessions.clone())).unwrap();
        r.register(Box::new(m.watched_users.clone())).unwrap();
        r.register(Box::new(m.devices.clone())).unwrap();
        r.register(Box::new(m.transitions_published.clone()))
            .unwrap();
        r.register(Box::new(m.transitions_delivered.clone()))
            .unwrap();
        r.register(Box::new(m.expired_events.clone())).unwrap();
        r.register(Box::new(m.devices_reaped.clone())).unwrap();
        r.register(Box::new(m.reconcile_repairs.clone())).unwrap();
        r.register(Box::new(m.online_pruned.clone())).unwrap();
        r.register(Box::new(m.slow_consumers_dropped.clone()))
            .unwrap();
        r.register(Box::new(m.floods.clone())).unwrap();
        r.register(Box::new(m.registry_resyncs.clone())).unwrap();
        r.register(Box::new(m.registry_resync_records.clone()))
            .unwrap();
        r.register(Box::new(m.redis_latency.clone())).unwrap();
        r.register(Box::new(m.redis_errors.clone())).unwrap();
        r.register(Box::new(m.refresh_batch_size.clone())).unwrap();
        // Series that should read 0 rather than be missing before the first event.
        for status in ["online", "away", "busy", "offline"] {
            m.transitions_published.with_label_values(&[status]);
        }
        m
    }

    /// Everything in the Prometheus text format, with the registry's
    /// current numbers.
    pub fn render(&self, registry: RegistryStats) -> String {
        self.sessions.set(registry.sessions as i64);
        self.watching_sessions
            .set(registry.watching_sessions as i64);
        self.watched_users.set(registry.watched_users as i64);
        let mut out = Vec::new();
        // Encoding into a Vec cannot fail for the text format.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }

    /// The counters `/healthz` shows.
    pub fn health_counters(&self) -> serde_json::Value {
        serde_json::json!({
            "expired_events": self.expired_events.get(),
            "devices_reaped": self.devices_reaped.get(),
            "reconcile_repairs": self.reconcile_repairs.get(),
            "online_pruned": self.online_pruned.get(),
            "slow_consumers": self.slow_consumers_dropped.get(),
            "floods": self.floods.get(),
            "sessions_opened": self.sessions_opened.get(),
            "transitions_delivered": self.transitions_delivered.get(),
        })
    }
}

/// Names of the store's Lua scripts by SHA1, so that an EVALSHA is timed
/// under the step it runs rather than under one opaque label.
static SCRIPT_NAMES: LazyLock<RwLock<HashMap<String, &'static str>>> =
    LazyLock::new(Default::default);

/// Tells the latency histogram the names of `scripts` (the store calls this
/// as it creates them).
pub fn name_scripts<'a>(scripts: impl IntoIterator<Item = (&'a redis::Script, &'static str)>) {
    let mut names = SCRIPT_NAMES.write().unwrap_or_else(|e| e.into_inner());
    for (script, name) in scripts {
        names.insert(script.get_hash().to_string(), name);
    }
}

/// The latency label of a command: its name in upper case, or for EVALSHA
/// the script's name; anything unexpected becomes "OTHER" so that the number
/// of series stays small.
fn label(cmd: Option<&Cmd>) -> &'static str {
    let Some(cmd) = cmd else {
        return "EMPTY";
    };
    let mut args = cmd.args_iter();
    let name = match args.next() {
        Some(Arg::Simple(name)) => name,
        _ => return "OTHER",
    };
    if name.eq_ignore_ascii_case(b"EVALSHA") {
        if let Some(Arg::Simple(sha)) = args.next() {
            let names = SCRIPT_NAMES.read().unwrap_or_else(|e| e.into_inner());
            if let Some(script) = std::str::from_utf8(sha).ok().and_then(|sha| names.get(sha)) {
                return script;
            }
        }
        return "EVALSHA";
    }
    const KNOWN: &[&str] = &[
        "PING",
        "GET",
        "SET",
        "DEL",
        "EXPIRE",
        "EXISTS",
        "MGET",
        "SCAN",
        "SSCAN",
        "SMEMBERS",
        "HGETALL",
        "HMGET",
        "ZADD",
        "ZREM",
        "ZRANGE",
        "ZRANGEBYSCORE",
        "ZREVRANGEBYSCORE",
        "ZSCORE",
        "ZMSCORE",
        "ZCARD",
        "CONFIG",
        "SCRIPT",
        "EVAL",
        "PUBLISH",
        "INFO",
        "CLIENT",
    ];
    KNOWN
        .iter()
        .find(|k| name.eq_ignore_ascii_case(k.as_bytes()))
        .copied()
        .unwrap_or("OTHER")
}

/// A connection that times every command and pipeline it sends.
#[derive(Clone)]
pub struct TimedConnection<C> {
    /// The connection doing the work.
    inner: C,
}

impl<C> TimedConnection<C> {
    /// Wraps `inner`.
    pub fn new(inner: C) -> Self {
        Self { inner }
    }
}

fn observe<T>(label: &'static str, started: Instant, result: &redis::RedisResult<T>) {
    METRICS
        .redis_latency
        .with_label_values(&[label])
        .observe(started.elapsed().as_secs_f64());
    if result.is_err() {
        METRICS.redis_errors.with_label_values(&[label]).inc();
    }
}

impl<C: ConnectionLike + Send> ConnectionLike for TimedConnection<C> {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let started = Instant::now();
            let result = self.inner.req_packed_command(cmd).await;
            observe(label(Some(cmd)), started, &result);
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
            let started = Instant::now();
            let result = self
                .inner
                .req_packed_commands(pipeline, offset, count)
                .await;
            observe(label(pipeline.cmd_iter().next()), started, &result);
            result
        })
    }

    fn get_db(&self) -> i64 {
        self.inner.get_db()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_name_commands_and_scripts() {
        assert_eq!(label(Some(&redis::cmd("ping"))), "PING");
        assert_eq!(label(Some(&redis::cmd("FLUSHALL"))), "OTHER");
        let arrive = redis::Script::new("return 1");
        name_scripts([(&arrive, "arrive")]);
        let mut evalsha = redis::cmd("EVALSHA");
        evalsha.arg(arrive.get_hash()).arg(0);
        assert_eq!(label(Some(&evalsha)), "arrive");
        let mut unknown = redis::cmd("EVALSHA");
        unknown.arg("0123").arg(0);
        assert_eq!(label(Some(&unknown)), "EVALSHA");
    }

    #[test]
    fn text_exposition_has_every_metric() {
        slow_consumer_dropped();
        let text = METRICS.render(RegistryStats::default());
        for name in [
            "presence_sessions_opened_total",
            "presence_sessions ",
            "presence_devices ",
            "presence_watched_users",
            "presence_transitions_published_total{status=\"online\"}",
            "presence_transitions_delivered_total",
            "presence_expired_events_total",
            "presence_devices_reaped_total",
            "presence_reconcile_repairs_total",
            "presence_slow_consumers_dropped_total 1",
            "presence_registry_resyncs_total",
        ] {
            assert!(text.contains(name), "{name} missing from:\n{text}");
        }
    }
}
