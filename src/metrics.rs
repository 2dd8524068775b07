//! What this node has done and holds, for `GET /metrics` (Prometheus text)
//! and the counters of `/healthz`.
//!
//! Counters are process-wide statics so that any actor can count without
//! being handed a handle; gauges that the registry already knows (sessions,
//! watches) are read from it at scrape time instead of being kept twice.
//! Redis latency is reported by the store's connection type, which times
//! every command it sends ([`redis_call`]). This module calls no other of
//! the crate: everything else calls it.

use std::sync::LazyLock;
use std::time::Duration;

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts,
    Registry, TextEncoder,
};

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
    /// What the admission caps refused.
    pub admission: AdmissionSeries,
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
    /// HTTP heartbeats (devices without a WebSocket) this node answered.
    pub http_heartbeats: IntCounter,
    /// Statuses whose `until` came, reset by this node's deadline pass.
    pub statuses_ended: IntCounter,
    /// Departure steps (Lua) this node ran, by what asked for them: a
    /// clean `close`, an `expired` event, or the deadline `pass`.
    pub departure_steps: IntCounterVec,
    /// Users repaired by the reconciliation pass.
    pub reconcile_repairs: IntCounter,
    /// Stale `presence-online` entries dropped by the reconciliation pass:
    /// always 0 since key schema 4, which has no such index (kept so that
    /// dashboards and `/healthz` readers do not break).
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
    /// What the alerts watch: Redis reachable, refreshes taken, open files.
    pub health: HealthSeries,
    /// The webhook queue's series.
    pub webhooks: WebhookSeries,
    /// The rooms' series.
    pub rooms: RoomSeries,
    /// What the `proxy` room policy asked the app's backend.
    pub room_join: RoomJoinSeries,
}

/// What the registry holds now, read at scrape time rather than kept twice.
#[derive(Debug, Clone, Copy, Default)]
pub struct NodeGauges {
    /// Open sessions on this node.
    pub sessions: usize,
    /// Sessions watching at least one user.
    pub watching_sessions: usize,
    /// Distinct users watched on this node.
    pub watched_users: usize,
    /// Rooms with a member on this node.
    pub rooms: usize,
    /// Room memberships of this node's sessions.
    pub room_memberships: usize,
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

/// Counts `n` lease refreshes Redis did not take.
pub fn refreshes_failed(n: usize) {
    METRICS.health.refreshes_failed.inc_by(n as u64);
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

/// `presence_redis_command_duration_seconds`: its name and help.
const REDIS_LATENCY: (&str, &str) = (
    "presence_redis_command_duration_seconds",
    "Time per Redis command or pipeline, by command (Lua steps by script name).",
);
/// `presence_refresh_batch_size`: its name and help.
const REFRESH_BATCH: (&str, &str) = (
    "presence_refresh_batch_size",
    "Lease refreshes per batch sent to Redis (count: batches, sum: refreshes).",
);

/// A histogram's options from its name, help and buckets.
fn histogram_opts((name, help): (&str, &str), buckets: &[f64]) -> HistogramOpts {
    HistogramOpts::new(name, help).buckets(buckets.to_vec())
}

/// Creates each series and registers it at once, so that no series can be
/// made and left out of `/metrics`. The names are distinct constants, so
/// neither step can fail.
struct Series(Registry);

impl Series {
    fn add<M: prometheus::core::Collector + Clone + 'static>(&self, m: M) -> M {
        self.0
            .register(Box::new(m.clone()))
            .expect("distinct metric names");
        m
    }

    fn counter(&self, name: &str, help: &str) -> IntCounter {
        self.add(IntCounter::new(name, help).expect("valid metric name"))
    }

    fn gauge(&self, name: &str, help: &str) -> IntGauge {
        self.add(IntGauge::new(name, help).expect("valid metric name"))
    }

    fn counters(&self, name: &str, help: &str, label: &str) -> IntCounterVec {
        self.add(IntCounterVec::new(Opts::new(name, help), &[label]).expect("valid metric"))
    }
}

/// What the webhook queues did and hold.
pub struct WebhookSeries {
    /// Webhook events queued (once per URL).
    pub events: IntCounter,
    /// Webhook events a receiver took (2xx).
    pub delivered: IntCounter,
    /// Webhook events that will not be sent: replaced by a newer status
    /// event of the same user, or dropped from a full queue (room events
    /// first, then status events) or beyond one user's share.
    pub dropped: IntCounter,
    /// Webhook POSTs that failed (no answer or not 2xx) and will be retried.
    pub failures: IntCounter,
    /// Webhook events waiting, over every URL.
    pub queued: IntGauge,
}

impl WebhookSeries {
    fn new(s: &Series) -> Self {
        Self {
            events: s.counter(
                "presence_webhook_events_total",
                "Webhook events queued by this node (once per URL).",
            ),
            delivered: s.counter(
                "presence_webhook_delivered_total",
                "Webhook events a receiver answered 2xx to.",
            ),
            dropped: s.counter(
                "presence_webhook_dropped_total",
                "Webhook events not sent: replaced by a newer status event of their user, or dropped from a full queue (room events first, then status events) or beyond one user's share.",
            ),
            failures: s.counter(
                "presence_webhook_failures_total",
                "Webhook POSTs that failed (no answer or not 2xx) and are retried.",
            ),
            queued: s.gauge(
                "presence_webhook_queued",
                "Webhook events waiting to be delivered, over every URL.",
            ),
        }
    }
}

/// What the alerts watch (deploy/prometheus/alerts.yml) beside the rest.
pub struct HealthSeries {
    /// Lease refreshes that Redis did not take (an error for the batch or
    /// for the refresh).
    pub refreshes_failed: IntCounter,
    /// 1 while Redis answered the last health check (every 0.5 s), else 0.
    pub redis_up: IntGauge,
    /// Users with a device, fleet-wide, as the last reconciliation pass
    /// counted them.
    pub online_users: IntGauge,
    /// File descriptors this process has open (read at scrape time).
    open_fds: IntGauge,
    /// This process's open-file limit (the soft `RLIMIT_NOFILE`).
    max_fds: IntGauge,
}

impl HealthSeries {
    fn new(s: &Series) -> Self {
        Self {
            refreshes_failed: s.counter(
                "presence_refreshes_failed_total",
                "Lease refreshes Redis did not take (the batch or the refresh failed).",
            ),
            redis_up: s.gauge(
                "presence_redis_up",
                "1 while Redis answered the node's last health check (every 0.5 s), else 0.",
            ),
            online_users: s.gauge(
                "presence_online_users",
                "Users with at least one device (invisible ones included), fleet-wide, as the last reconciliation pass counted them (the same on every node).",
            ),
            open_fds: s.gauge("process_open_fds", "Number of open file descriptors."),
            max_fds: s.gauge(
                "process_max_fds",
                "Maximum number of open file descriptors (the soft RLIMIT_NOFILE).",
            ),
        }
    }
}

/// What the admission caps ([`crate::admission`]) refused.
pub struct AdmissionSeries {
    /// WebSocket upgrades refused by a connection cap (per address, pending auth).
    pub connections_refused: IntCounter,
    /// HTTP reads refused by the read budget (429).
    pub http_rate_limited: IntCounter,
    /// Sessions closed with 1013 before their claim (--max-pending-claims).
    pub connections_shed: IntCounter,
    /// The wait a session shed now would be asked for, ms (as of the last
    /// session the setup gate let in or shed; 0 without a cap).
    pub shed_retry_after: IntGauge,
}

impl AdmissionSeries {
    fn new(s: &Series) -> Self {
        Self {
            connections_refused: s.counter(
                "presence_connections_refused_total",
                "WebSocket upgrades refused by --max-connections-per-ip or --max-pending-auth.",
            ),
            http_rate_limited: s.counter(
                "presence_http_rate_limited_total",
                "HTTP reads refused with 429 by the read budget.",
            ),
            connections_shed: s.counter(
                "presence_connections_shed_total",
                "Sessions closed with 1013 and a retry hint before their lease claim: the node had --max-pending-claims sessions setting up.",
            ),
            shed_retry_after: s.gauge(
                "presence_shed_retry_after_ms",
                "The wait (retry_after_ms) a session shed now would be asked for, as of the last connection: 1000, more while more than four are shed for each one let in; 0 with --max-pending-claims 0.",
            ),
        }
    }
}

/// What this node's rooms did and hold.
pub struct RoomSeries {
    /// Room memberships removed by the room deadline pass.
    pub memberships_lapsed: IntCounter,
    /// Room events received from Redis (joins, leaves, updates, signals).
    pub events: IntCounter,
    /// Room event frames sent to member devices.
    pub frames_sent: IntCounter,
    /// Signals this node relayed for its sessions.
    pub signals_relayed: IntCounter,
    /// Rooms this node read once for all its members (back from counts
    /// mode, or after events were missed).
    pub shared_reads: IntCounter,
    /// Rooms with a member on this node.
    pub rooms: IntGauge,
    /// Room memberships of this node's sessions.
    pub memberships: IntGauge,
}

impl RoomSeries {
    fn new(s: &Series) -> Self {
        Self {
            memberships_lapsed: s.counter(
                "presence_room_memberships_lapsed_total",
                "Room memberships removed by the room deadline pass (their device vanished).",
            ),
            events: s.counter(
                "presence_room_events_total",
                "Room events received on the rooms' channels (joins, leaves, updates, signals).",
            ),
            frames_sent: s.counter(
                "presence_room_frames_sent_total",
                "Room event frames sent to member devices.",
            ),
            signals_relayed: s.counter(
                "presence_signals_relayed_total",
                "Signals this node's sessions sent to their rooms.",
            ),
            shared_reads: s.counter(
                "presence_room_shared_reads_total",
                "Rooms this node read once for all its members there (back from counts mode, or after missed events).",
            ),
            rooms: s.gauge("presence_rooms", "Rooms with a member on this node."),
            memberships: s.gauge(
                "presence_room_memberships",
                "Room memberships of this node's sessions.",
            ),
        }
    }
}

/// Bucket bounds of the room-join backend's latency, in seconds: a backend
/// on the same network answers in milliseconds; the default timeout is 2 s.
const ROOM_JOIN_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0,
];

/// What a request to the room-join backend came to (the `outcome` label).
pub const ROOM_JOIN_OUTCOMES: [&str; 6] = [
    "allowed",
    "refused",
    "failed",
    "invalid",
    "timeout",
    "unreachable",
];

/// What the `proxy` room policy asked the app's backend (`--room-join-url`).
pub struct RoomJoinSeries {
    /// Requests to the backend, by outcome ([`ROOM_JOIN_OUTCOMES`]).
    pub requests: IntCounterVec,
    /// Time from sending a request to its answer (or its timeout).
    pub latency: Histogram,
    /// Questions answered from the cache, by answer (`allowed`, `refused`).
    pub cache_hits: IntCounterVec,
    /// Questions that waited for the same (user, room)'s request in flight.
    pub shared: IntCounter,
    /// Questions refused `unavailable` at once: `--room-join-max-in-flight`
    /// requests were out.
    pub shed: IntCounter,
    /// A member's own rejoin let through on an expired grant because the
    /// backend did not answer.
    pub stale: IntCounter,
    /// Requests to the backend in flight now.
    pub in_flight: IntGauge,
}

impl RoomJoinSeries {
    fn new(s: &Series) -> Self {
        let series = Self {
            requests: s.counters(
                "presence_room_join_requests_total",
                "Requests to the room-join backend (--room-join-url), by outcome: allowed, refused (200 with allow false, or a 4xx), failed (another status), invalid (a 200 that does not parse), timeout, unreachable.",
                "outcome",
            ),
            latency: s.add(
                Histogram::with_opts(histogram_opts(
                    (
                        "presence_room_join_request_duration_seconds",
                        "Time from a request to the room-join backend to its answer, or to its timeout.",
                    ),
                    ROOM_JOIN_BUCKETS,
                ))
                .expect("valid metric"),
            ),
            cache_hits: s.counters(
                "presence_room_join_cache_hits_total",
                "Proxy-policy questions answered from this node's cache, by answer (allowed, refused).",
                "answer",
            ),
            shared: s.counter(
                "presence_room_join_shared_total",
                "Proxy-policy questions that waited for the request already in flight for the same user and room.",
            ),
            shed: s.counter(
                "presence_room_join_shed_total",
                "Proxy-policy questions refused unavailable at once: --room-join-max-in-flight requests were out.",
            ),
            stale: s.counter(
                "presence_room_join_stale_total",
                "Members' own rejoins let through on an expired grant while the room-join backend did not answer.",
            ),
            in_flight: s.gauge(
                "presence_room_join_in_flight",
                "Requests to the room-join backend in flight now.",
            ),
        };
        for outcome in ROOM_JOIN_OUTCOMES {
            series.requests.with_label_values(&[outcome]);
        }
        for answer in ["allowed", "refused"] {
            series.cache_hits.with_label_values(&[answer]);
        }
        series
    }
}

impl Metrics {
    fn new() -> Self {
        let s = Series(Registry::new());
        let m = Self {
            sessions_opened: s.counter(
                "presence_sessions_opened_total",
                "WebSocket sessions opened since start, counting those then shed with 1013.",
            ),
            admission: AdmissionSeries::new(&s),
            sessions: s.gauge("presence_sessions", "Open WebSocket sessions."),
            watching_sessions: s.gauge(
                "presence_watching_sessions",
                "Sessions watching at least one user.",
            ),
            watched_users: s.gauge(
                "presence_watched_users",
                "Distinct users watched by this node's sessions.",
            ),
            devices: s.gauge(
                "presence_devices",
                "Device leases held by this node's sessions.",
            ),
            transitions_published: s.counters(
                "presence_transitions_published_total",
                "Transitions seen on presence-events (from every node), by announced status.",
                "status",
            ),
            transitions_delivered: s.counter(
                "presence_transitions_delivered_total",
                "presence frames sent to watching clients.",
            ),
            expired_events: s.counter(
                "presence_expired_events_total",
                "Expired-lease events received from Redis and handled.",
            ),
            devices_reaped: s.counter(
                "presence_devices_reaped_total",
                "Devices removed by the deadline pass.",
            ),
            http_heartbeats: s.counter(
                "presence_http_heartbeats_total",
                "HTTP heartbeats of devices without a WebSocket answered.",
            ),
            statuses_ended: s.counter(
                "presence_statuses_ended_total",
                "Statuses reset to online at their until by this node's deadline pass.",
            ),
            departure_steps: s.counters(
                "presence_departure_steps_total",
                "Departure steps run against Redis, by path (close, event, pass).",
                "path",
            ),
            reconcile_repairs: s.counter(
                "presence_reconcile_repairs_total",
                "Users repaired by the reconciliation pass.",
            ),
            online_pruned: s.counter(
                "presence_online_pruned_total",
                "Stale presence-online entries dropped (always 0 since key schema 4, which has no such index).",
            ),
            slow_consumers_dropped: s.counter(
                "presence_slow_consumers_dropped_total",
                "Sessions disconnected because they could not keep up with their events.",
            ),
            floods: s.counter(
                "presence_floods_total",
                "Sessions closed for sending too many frames.",
            ),
            registry_resyncs: s.counter(
                "presence_registry_resyncs_total",
                "Re-reads of the watched users after resubscribing to presence-events.",
            ),
            registry_resync_records: s.counter(
                "presence_registry_resync_records_total",
                "Records re-sent to sessions by those re-reads.",
            ),
            redis_latency: s.add(
                HistogramVec::new(histogram_opts(REDIS_LATENCY, REDIS_BUCKETS), &["command"])
                    .expect("valid metric"),
            ),
            redis_errors: s.counters(
                "presence_redis_errors_total",
                "Redis commands or pipelines that failed, by command.",
                "command",
            ),
            refresh_batch_size: s.add(
                Histogram::with_opts(histogram_opts(REFRESH_BATCH, BATCH_BUCKETS))
                    .expect("valid metric"),
            ),
            health: HealthSeries::new(&s),
            webhooks: WebhookSeries::new(&s),
            rooms: RoomSeries::new(&s),
            room_join: RoomJoinSeries::new(&s),
            registry: s.0,
        };
        m.zeroed();
        m
    }

    /// Makes the labelled series that should read 0 rather than be missing
    /// before their first event.
    fn zeroed(&self) {
        for status in ["online", "away", "busy", "offline"] {
            self.transitions_published.with_label_values(&[status]);
        }
        for path in DEPARTURE_PATHS {
            self.departure_steps.with_label_values(&[path]);
        }
    }

    /// Everything in the Prometheus text format, with the registry's
    /// current numbers.
    pub fn render(&self, registry: NodeGauges) -> String {
        self.sessions.set(registry.sessions as i64);
        self.watching_sessions
            .set(registry.watching_sessions as i64);
        self.watched_users.set(registry.watched_users as i64);
        self.rooms.rooms.set(registry.rooms as i64);
        self.rooms.memberships.set(registry.room_memberships as i64);
        let (open, max) = fd_counts();
        self.health.open_fds.set(open);
        self.health.max_fds.set(max);
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

/// This process's open file descriptors and its soft open-file limit:
/// one directory listing and one system call, cheap at scrape time. -1
/// for what cannot be read (no `/proc`).
fn fd_counts() -> (i64, i64) {
    let open = std::fs::read_dir("/proc/self/fd").map_or(-1, |dir| dir.count() as i64);
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct it is handed and nothing else.
    let max = match unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } {
        0 if limit.rlim_cur == libc::RLIM_INFINITY => i64::MAX,
        0 => i64::try_from(limit.rlim_cur).unwrap_or(i64::MAX),
        _ => -1,
    };
    (open, max)
}

/// What may ask for a departure step: a clean close, an expired-key event,
/// the deadline pass.
pub const DEPARTURE_PATHS: [&str; 3] = ["close", "event", "pass"];

/// Counts `n` departure steps asked for by `path`, one of
/// [`DEPARTURE_PATHS`].
pub fn departure_steps(path: &'static str, n: usize) {
    METRICS
        .departure_steps
        .with_label_values(&[path])
        .inc_by(n as u64);
}

/// Times one Redis command or pipeline under `label` (a command's name or
/// a script step's), counting it as an error when it `failed`.
pub fn redis_call(label: &'static str, elapsed: Duration, failed: bool) {
    METRICS
        .redis_latency
        .with_label_values(&[label])
        .observe(elapsed.as_secs_f64());
    if failed {
        METRICS.redis_errors.with_label_values(&[label]).inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_exposition_has_every_metric() {
        slow_consumer_dropped();
        let text = METRICS.render(NodeGauges::default());
        for name in [
            "presence_sessions_opened_total",
            "presence_sessions ",
            "presence_devices ",
            "presence_watched_users",
            "presence_transitions_published_total{status=\"online\"}",
            "presence_transitions_delivered_total",
            "presence_expired_events_total",
            "presence_devices_reaped_total",
            "presence_http_heartbeats_total",
            "presence_statuses_ended_total",
            "presence_reconcile_repairs_total",
            "presence_slow_consumers_dropped_total 1",
            "presence_registry_resyncs_total",
            "presence_departure_steps_total{path=\"pass\"}",
            "presence_refreshes_failed_total",
            "presence_redis_up",
        ] {
            assert!(text.contains(name), "{name} missing from:\n{text}");
        }
    }

    /// The open-file gauges follow the process: a file opened shows in
    /// `process_open_fds`, and the limit is the soft `RLIMIT_NOFILE`.
    #[test]
    fn open_files_are_counted_at_scrape_time() {
        let value = |text: &str, name: &str| -> i64 {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
                .unwrap_or_else(|| panic!("{name} missing from:\n{text}"))
        };
        let before = value(&METRICS.render(NodeGauges::default()), "process_open_fds");
        let files: Vec<_> = (0..20)
            .map(|_| std::fs::File::open("/proc/self/stat").unwrap())
            .collect();
        let text = METRICS.render(NodeGauges::default());
        // Other tests of this binary open and close files meanwhile.
        assert!(value(&text, "process_open_fds") >= before + 10, "{text}");
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        assert_eq!(
            unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) },
            0
        );
        assert_eq!(value(&text, "process_max_fds"), limit.rlim_cur as i64);
        drop(files);
    }
}
