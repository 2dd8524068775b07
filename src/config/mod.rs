//! Runtime settings shared by every actor, with the timings derived from one
//! heartbeat so that no second magic number can disagree with it.

pub mod room_policy;

use std::path::{Path, PathBuf};

pub use room_policy::{Policies, Policy};
use std::time::Duration;

/// Default interval between server pings (and expected client activity).
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_millis(15_000);
/// Lease TTL as a multiple of the heartbeat: two pongs may be lost in a row
/// before a live device lapses.
pub const TTL_HEARTBEATS: u32 = 3;
/// Default number of users one session may watch at once.
pub const DEFAULT_MAX_WATCHES: usize = 1_000;
/// Default largest WebSocket frame accepted from a client, in bytes.
pub const DEFAULT_MAX_FRAME_BYTES: usize = 64 * 1024;
/// Default events a session may have waiting for a slow client before it is
/// disconnected. Room for a burst of every watched user changing at once.
pub const DEFAULT_MAX_QUEUED_EVENTS: usize = 4 * DEFAULT_MAX_WATCHES;
/// Default client frames per second a session may send (sustained; twice as
/// many in a burst).
pub const DEFAULT_MAX_FRAMES_PER_SEC: u32 = 30;
/// Default users one session may add to its watches per second, each read
/// from Redis and subscribed to (sustained; a burst of
/// `max(this, 2 x max_watches)` passes, so that a new session can watch its
/// fill at once and swap it for another once). Lower than a client ever
/// needs for long: a session swapping 1,000 users a second made 32 such
/// sessions cost a node a quarter of its CPU and other users' events 40 to
/// 110 ms (issue 30, item 10; BENCHMARKS.md, `churn`).
pub const DEFAULT_MAX_USER_READS_PER_SEC: u32 = 100;
/// Default devices one user may have connected at once.
pub const DEFAULT_MAX_DEVICES_PER_USER: u32 = 32;
/// Most users one bulk query (`POST /api/presence/query`) may name.
pub const MAX_QUERY_USERS: usize = 1_000;
/// Longest status text accepted, in characters.
pub const MAX_STATUS_TEXT: usize = 256;
/// Default time an offline user's last-seen entry is kept.
pub const DEFAULT_LAST_SEEN_RETENTION: Duration = Duration::from_secs(90 * 24 * 3600);

/// Default time a connection without a token on its handshake (JWT auth)
/// has to send `{"type":"auth","token":...}` before it is closed with 1008.
pub const DEFAULT_AUTH_TIMEOUT: Duration = Duration::from_secs(5);
/// Default time before a token's expiry at which the session is told
/// (`auth_expiring`) to send a fresh one.
/// Default most events the feed keeps of one user or room per retention.
pub const DEFAULT_EVENT_MAX_PER_USER: u64 = 10_000;

/// Default time the event feed keeps an event: a day.
pub const DEFAULT_EVENT_RETENTION: Duration = Duration::from_secs(86_400);

pub const DEFAULT_AUTH_EXPIRING: Duration = Duration::from_secs(60);
/// Default time before a room token's expiry at which the device is told
/// (`room_token_expiring`) to send a fresh one.
pub const DEFAULT_ROOM_TOKEN_EXPIRING: Duration = Duration::from_secs(60);

/// Default rooms one device may be in at once.
pub const DEFAULT_MAX_ROOMS_PER_DEVICE: usize = 100;
/// Default devices one room may hold.
pub const DEFAULT_MAX_ROOM_DEVICES: u32 = 10_000;
/// Default largest room state, serialized, in bytes.
pub const DEFAULT_MAX_ROOM_STATE_BYTES: usize = 1_024;
/// Largest signal `data`, serialized, in bytes.
pub const MAX_SIGNAL_BYTES: usize = 1_024;
/// Default signal frames (and joins that change the state) per second one
/// device may send.
pub const DEFAULT_MAX_ROOM_MESSAGES_PER_SEC: u32 = 20;
/// Default most room state updates per device per second that the node
/// writes and forwards (and batch frames per member per second): a device
/// may send more, the latest wins.
pub const DEFAULT_ROOM_STATE_HZ: u32 = 20;
/// Default most users of a room whose members get one frame per join,
/// leave and update; above it they get `occupancy` counts.
pub const DEFAULT_ROOM_ANNOUNCE_MAX: u32 = 100;
/// Default most devices of a room whose members get one frame per join,
/// leave and update (and whose `room` frame lists them): a list of 100
/// users with several devices each, and 1 KiB states, is already a large
/// frame for every member.
pub const DEFAULT_ROOM_ANNOUNCE_MAX_DEVICES: u32 = 500;
/// Default shortest time between two `occupancy` frames of a large room.
pub const DEFAULT_ROOM_OCCUPANCY: Duration = Duration::from_millis(2_000);

/// Default most WebSockets one client address (an IPv6 address's /64) may
/// hold open on a node. Behind a proxy, give `--trust-proxy` so that the
/// address is the client's and not the proxy's.
pub const DEFAULT_MAX_CONNECTIONS_PER_IP: u32 = 1_000;
/// Default most sockets a node holds that still wait for their `auth` frame.
pub const DEFAULT_MAX_PENDING_AUTH: u32 = 2_000;
/// Default most new sessions a node may have setting up at once (a lease
/// claim, then the first request); a session beyond it is closed with
/// `1013` and a retry hint before any Redis work (a reconnect storm is
/// shed, not answered late).
pub const DEFAULT_MAX_PENDING_CLAIMS: u32 = 128;
/// Default largest message a socket may send before it has authenticated,
/// in bytes: an `auth` frame with a typical token needs far less. A token
/// with a long rooms claim or an identity provider's group claims may need
/// `--max-auth-frame-bytes` raised (or go in `Sec-WebSocket-Protocol`).
pub const DEFAULT_MAX_AUTH_FRAME_BYTES: usize = 4 * 1024;
/// Default users (or rooms) the HTTP API reads per second for one client
/// address or one token (a burst of twice as many passes).
pub const DEFAULT_HTTP_READS_PER_SEC: u32 = 2_000;
/// Default HTTP reads one client address (or one token's user) may have in
/// flight at once on a node: a browser opens at most 6 connections to a
/// host, and a backend reading for many users uses the service key, which
/// has no cap.
pub const DEFAULT_HTTP_READS_IN_FLIGHT: u32 = 16;
/// Default users (or rooms) the HTTP API reads per second, node-wide, for
/// the admin and service keys (a burst of twice as many passes).
pub const DEFAULT_SERVICE_READS_PER_SEC: u32 = 20_000;

/// Default period of the reconciliation pass.
pub const DEFAULT_RECONCILE_INTERVAL: Duration = Duration::from_secs(60);

/// Settings of one node.
#[derive(Debug, Clone)]
pub struct Config {
    /// Names this node in lease values, logs and `/healthz`.
    pub node_id: String,
    /// Interval between server pings; clients answer with pongs.
    pub heartbeat: Duration,
    /// Lease TTL: how long a silent device stays online.
    pub ttl: Duration,
    /// Longest a paused device stays present (`--pause-grace-ms`); zero:
    /// the TTL. See [`Config::pause_grace`].
    pub pause_grace: Duration,
    /// After SIGTERM, how long the node keeps serving with `/readyz` at 503
    /// before it closes its sessions (`--drain-delay-ms`).
    pub drain_delay: Duration,
    /// Users one session may watch at once.
    pub max_watches: usize,
    /// Largest client frame accepted, in bytes.
    pub max_frame_bytes: usize,
    /// How long last-seen entries of offline users are kept.
    pub last_seen_retention: Duration,
    /// Period of the reconciliation pass over all device sets.
    pub reconcile_interval: Duration,
    /// Events a session may have waiting for its client; a client that
    /// reads slower than its events arrive is disconnected beyond this.
    pub max_queued_events: usize,
    /// Client frames per second a session may send, sustained.
    pub max_frames_per_sec: u32,
    /// Devices one user may have connected at once.
    pub max_devices_per_user: u32,
    /// Users one session's watches may read from Redis per second.
    pub max_user_reads_per_sec: u32,
    /// Watch policy `contacts`: a watch on a user who does not list the
    /// watcher as a contact shows only `offline`, with no last seen.
    pub contacts_only: bool,
    /// JWT auth: how long a connection may take to send its `auth` frame
    /// when its handshake carried no token.
    pub auth_timeout: Duration,
    /// JWT auth: how long before a session's token expires it gets an
    /// `auth_expiring` frame.
    pub auth_expiring: Duration,
    /// `--room-policy token`: how long before a room token expires its
    /// device gets a `room_token_expiring` frame.
    pub room_token_expiring: Duration,
    /// How long the event feed keeps an event (`--event-retention-secs`);
    /// zero: the feed is off.
    pub event_retention: Duration,
    /// Most events the feed keeps of one user or room per retention
    /// (`--event-max-per-user`).
    pub event_max_per_user: u64,
    /// `--trust-proxy`: peers whose `X-Forwarded-For` names the client
    /// (the HTTP layer's `client_ip`).
    pub trust_proxy: crate::proxy::TrustedProxies,
    /// What `/` and other non-API paths serve (`--no-demo`, `--static-dir`).
    pub static_files: StaticFiles,
    /// Rooms: their limits and who may join which.
    pub rooms: RoomLimits,
    /// What one client may hold and cost: connections, pending auth, reads.
    pub admission: AdmissionLimits,
}

/// What one client may hold and cost ([`crate::admission`]).
#[derive(Debug, Clone)]
pub struct AdmissionLimits {
    /// Most WebSockets per client address; 0: no cap.
    pub max_connections_per_ip: u32,
    /// Most sockets waiting for their `auth` frame; 0: no cap.
    pub max_pending_auth: u32,
    /// Most sessions setting up (claim, first request) at once; 0: no cap.
    pub max_pending_claims: u32,
    /// Largest message before authentication, in bytes.
    pub max_auth_frame_bytes: usize,
    /// HTTP reads per second per address and per token.
    pub http_reads_per_sec: u32,
    /// HTTP reads per second for the admin and service keys, node-wide.
    pub service_reads_per_sec: u32,
    /// HTTP reads one address or user may have in flight; 0: no cap.
    pub http_reads_in_flight: u32,
}

impl Default for AdmissionLimits {
    fn default() -> Self {
        Self {
            max_connections_per_ip: DEFAULT_MAX_CONNECTIONS_PER_IP,
            max_pending_auth: DEFAULT_MAX_PENDING_AUTH,
            max_pending_claims: DEFAULT_MAX_PENDING_CLAIMS,
            max_auth_frame_bytes: DEFAULT_MAX_AUTH_FRAME_BYTES,
            http_reads_per_sec: DEFAULT_HTTP_READS_PER_SEC,
            service_reads_per_sec: DEFAULT_SERVICE_READS_PER_SEC,
            http_reads_in_flight: DEFAULT_HTTP_READS_IN_FLIGHT,
        }
    }
}

impl AdmissionLimits {
    /// The burst of a read rate: twice the rate, and never less than the
    /// largest single read (a bulk query of [`MAX_QUERY_USERS`]), which
    /// would otherwise never pass.
    pub fn burst(per_sec: u32) -> u32 {
        per_sec.saturating_mul(2).max(MAX_QUERY_USERS as u32)
    }
}

/// The rooms' limits and policy.
#[derive(Debug, Clone)]
pub struct RoomLimits {
    /// Rooms one device may be in at once.
    pub max_rooms_per_device: usize,
    /// Devices one room may hold.
    pub max_room_devices: u32,
    /// Largest room state, serialized, in bytes.
    pub max_state_bytes: usize,
    /// Signal frames (and joins that change the state) per second one
    /// device may send.
    pub max_messages_per_sec: u32,
    /// Room state updates per device per second written and forwarded, and
    /// `room_updates` batches per member per second: `room_state` frames
    /// beyond it are coalesced, the latest wins.
    pub state_hz: u32,
    /// Most users of a room whose members get every join, leave and
    /// update; above it, `occupancy` counts.
    pub announce_max: u32,
    /// Most devices, likewise: above either, the room is in counts mode.
    pub announce_max_devices: u32,
    /// Shortest time between two `occupancy` frames.
    pub occupancy_interval: Duration,
    /// Who may join which room (`--room-policy`).
    pub policies: Policies,
}

impl RoomLimits {
    /// The shortest time between two state writes of one device, and
    /// between two `room_updates` batches of a room: one tick.
    pub fn state_tick(&self) -> Duration {
        Duration::from_secs(1) / self.state_hz.max(1)
    }
}

impl Default for RoomLimits {
    fn default() -> Self {
        Self {
            max_rooms_per_device: DEFAULT_MAX_ROOMS_PER_DEVICE,
            max_room_devices: DEFAULT_MAX_ROOM_DEVICES,
            max_state_bytes: DEFAULT_MAX_ROOM_STATE_BYTES,
            max_messages_per_sec: DEFAULT_MAX_ROOM_MESSAGES_PER_SEC,
            state_hz: DEFAULT_ROOM_STATE_HZ,
            announce_max: DEFAULT_ROOM_ANNOUNCE_MAX,
            announce_max_devices: DEFAULT_ROOM_ANNOUNCE_MAX_DEVICES,
            occupancy_interval: DEFAULT_ROOM_OCCUPANCY,
            policies: Policies::default(),
        }
    }
}

impl Config {
    /// A config with the default timings for `node_id`.
    pub fn new(node_id: impl Into<String>) -> Self {
        Self {
            node_id: node_id.into(),
            heartbeat: DEFAULT_HEARTBEAT,
            drain_delay: Duration::ZERO,
            ttl: DEFAULT_HEARTBEAT * TTL_HEARTBEATS,
            pause_grace: Duration::ZERO,
            max_watches: DEFAULT_MAX_WATCHES,
            max_frame_bytes: DEFAULT_MAX_FRAME_BYTES,
            last_seen_retention: DEFAULT_LAST_SEEN_RETENTION,
            reconcile_interval: DEFAULT_RECONCILE_INTERVAL,
            max_queued_events: DEFAULT_MAX_QUEUED_EVENTS,
            max_frames_per_sec: DEFAULT_MAX_FRAMES_PER_SEC,
            max_devices_per_user: DEFAULT_MAX_DEVICES_PER_USER,
            max_user_reads_per_sec: DEFAULT_MAX_USER_READS_PER_SEC,
            contacts_only: false,
            auth_timeout: DEFAULT_AUTH_TIMEOUT,
            auth_expiring: DEFAULT_AUTH_EXPIRING,
            event_retention: DEFAULT_EVENT_RETENTION,
            event_max_per_user: DEFAULT_EVENT_MAX_PER_USER,
            room_token_expiring: DEFAULT_ROOM_TOKEN_EXPIRING,
            trust_proxy: Default::default(),
            static_files: Default::default(),
            rooms: RoomLimits::default(),
            admission: AdmissionLimits::default(),
        }
    }

    /// A client that has sent nothing (no frame, no pong) for this long is
    /// disconnected: two heartbeats, so one lost pong is forgiven.
    pub fn client_timeout(&self) -> Duration {
        self.heartbeat * 2
    }

    /// The grace of a pause that asked for `asked` ms: at most
    /// `--pause-grace-ms` (the TTL when that is 0), which is also what a
    /// pause that asked nothing gets; at least 1 ms.
    pub fn pause_grace(&self, asked: Option<u64>) -> Duration {
        let bound = if self.pause_grace.is_zero() {
            self.ttl
        } else {
            self.pause_grace
        };
        asked
            .map_or(bound, |ms| Duration::from_millis(ms).min(bound))
            .max(Duration::from_millis(1))
    }

    /// Client frames and pongs refresh the lease at most this often, so that
    /// a chatty client does not write Redis on every frame. A third of the
    /// heartbeat keeps each lease refreshed at least once per ping.
    pub fn refresh_interval(&self) -> Duration {
        self.heartbeat / 3
    }

    /// Period of the deadline pass that makes lapsed leases expire on time: a
    /// tenth of the TTL, between 50 ms and 250 ms.
    pub fn reaper_interval(&self) -> Duration {
        (self.ttl / 10).clamp(Duration::from_millis(50), Duration::from_millis(250))
    }

    /// Burst of the per-session read bucket: a session may always watch
    /// `max_watches` users at once.
    pub fn user_reads_burst(&self) -> u32 {
        let fills = u32::try_from(self.max_watches)
            .unwrap_or(u32::MAX)
            .saturating_mul(2);
        self.max_user_reads_per_sec.max(fills)
    }

    /// Period of the last-seen retention trim.
    pub fn retention_interval(&self) -> Duration {
        Duration::from_secs(60)
    }

    /// How often the node renews its run record (`presence-run:<run>`):
    /// with the reconciliation, at least every minute. After Redis lost its
    /// data, the device detail names this node's devices again within it.
    pub fn run_renew_interval(&self) -> Duration {
        self.reconcile_interval.min(Duration::from_secs(60))
    }

    /// How long the run record holds: three renewals, and at least 30 s,
    /// so that a late renewal (a busy or briefly frozen node) does not free
    /// the number for another node.
    pub fn run_hold(&self) -> Duration {
        (self.run_renew_interval() * 3).max(Duration::from_secs(30))
    }
}

/// What `GET /` and the other non-API paths serve.
#[derive(Debug, Clone, Default)]
pub enum StaticFiles {
    /// The built-in demo page and `presence-client.js`.
    #[default]
    Demo,
    /// Nothing: every such path is 404 (`--no-demo`, for production).
    Off,
    /// The files under this directory, `/` being its `index.html`.
    Dir(PathBuf),
}

impl StaticFiles {
    /// `--static-dir DIR`: checked now, so that a typo fails at start-up
    /// rather than as 404s in production.
    pub fn dir(dir: &Path) -> anyhow::Result<Self> {
        let dir = dir
            .canonicalize()
            .map_err(|e| anyhow::anyhow!("--static-dir {}: {e}", dir.display()))?;
        if !dir.is_dir() {
            anyhow::bail!("--static-dir {}: not a directory", dir.display());
        }
        Ok(Self::Dir(dir))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pause_grace_is_cut_to_the_bound_which_is_the_ttl_by_default() {
        let mut config = Config::new("n");
        let ms = Duration::from_millis;
        assert_eq!(config.pause_grace(None), config.ttl);
        assert_eq!(config.pause_grace(Some(u64::MAX)), config.ttl);
        assert_eq!(config.pause_grace(Some(10)), ms(10));
        assert_eq!(config.pause_grace(Some(0)), ms(1));
        config.pause_grace = ms(120_000);
        assert_eq!(config.pause_grace(None), ms(120_000));
        assert_eq!(config.pause_grace(Some(200_000)), ms(120_000));
    }
}
