//! The flags of `presence-server` (clap), each with its environment
//! variable and its key in the optional config file.

use std::path::PathBuf;

use clap::{CommandFactory, Parser};
use presence_server::logging::LogFormat;
use presence_server::{auth, config, config_file, rooms, webhooks};

/// Presence server: who is online, on which devices, with which status.
#[derive(Parser, Debug)]
#[command(version, about)]
pub struct Args {
    /// Address to listen on (HTTP and WebSocket).
    #[arg(long, env = "PRESENCE_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: String,

    /// Serve /metrics, the probes (/livez, /readyz, /healthz) and the admin API only on this address
    /// (e.g. 10.0.0.5:9090), and answer 404 for them on --listen. Use it in
    /// production: health, load and the admin key stay off the public port.
    #[arg(long, env = "PRESENCE_INTERNAL_LISTEN")]
    pub internal_listen: Option<String>,

    /// Redis to keep state in: redis://[user:password@]host:port/db,
    /// rediss://... for TLS, or redis+sentinel://[user:password@]host:port,.../<master>[/db]
    /// (rediss+sentinel:// for TLS). Without it (and without
    /// --redis-sentinel) a private redis-server is started from the bundled
    /// redis.conf and stopped on exit.
    #[arg(long, env = "REDIS_URL", hide_env_values = true)]
    pub redis_url: Option<String>,

    /// Sentinels to ask for the primary, host:port,host:port (instead of
    /// --redis-url; needs --redis-sentinel-master).
    #[arg(long, env = "PRESENCE_REDIS_SENTINEL", value_delimiter = ',')]
    pub redis_sentinel: Vec<String>,

    /// The master name the sentinels monitor.
    #[arg(long, env = "PRESENCE_REDIS_SENTINEL_MASTER")]
    pub redis_sentinel_master: Option<String>,

    /// PEM CA certificate(s) to verify Redis's TLS certificate with, instead
    /// of the system roots (rediss:// only).
    #[arg(long, env = "PRESENCE_REDIS_TLS_CA_FILE")]
    pub redis_tls_ca_file: Option<PathBuf>,

    /// PEM client certificate for mutual TLS (with --redis-tls-key-file).
    #[arg(long, env = "PRESENCE_REDIS_TLS_CERT_FILE")]
    pub redis_tls_cert_file: Option<PathBuf>,

    /// PEM private key of --redis-tls-cert-file.
    #[arg(long, env = "PRESENCE_REDIS_TLS_KEY_FILE")]
    pub redis_tls_key_file: Option<PathBuf>,

    /// Interval between server pings to each client, in ms.
    #[arg(long, env = "PRESENCE_HEARTBEAT_MS", default_value_t = config::DEFAULT_HEARTBEAT.as_millis() as u64,
          value_parser = clap::value_parser!(u64).range(100..=3_600_000))]
    pub heartbeat_ms: u64,

    /// Device lease TTL in ms: how long a silent device stays online
    /// [default: 3 x heartbeat].
    #[arg(long, env = "PRESENCE_TTL_MS", value_parser = clap::value_parser!(u64).range(100..=86_400_000))]
    pub ttl_ms: Option<u64>,

    /// After SIGTERM, how long to keep serving with /readyz answering 503
    /// before closing every WebSocket with 1001, in ms: time for a load
    /// balancer (a Kubernetes endpoints controller) to stop sending new
    /// clients. A second SIGTERM cuts it short.
    #[arg(long, env = "PRESENCE_DRAIN_DELAY_MS", default_value_t = 0,
          value_parser = clap::value_parser!(u64).range(0..=600_000))]
    pub drain_delay_ms: u64,

    /// This node's id in lease values and logs [default: presence-<random>].
    #[arg(long, env = "PRESENCE_NODE_ID")]
    pub node_id: Option<String>,

    /// Most users one session may watch.
    #[arg(long, env = "PRESENCE_MAX_WATCHES", default_value_t = config::DEFAULT_MAX_WATCHES)]
    pub max_watches: usize,

    /// Largest WebSocket frame accepted from a client, in bytes.
    #[arg(long, env = "PRESENCE_MAX_FRAME_BYTES", default_value_t = config::DEFAULT_MAX_FRAME_BYTES)]
    pub max_frame_bytes: usize,

    /// Events a session may have waiting for a client that reads too
    /// slowly; one more disconnects it. Keep it above --max-watches.
    #[arg(long, env = "PRESENCE_MAX_QUEUED_EVENTS", default_value_t = config::DEFAULT_MAX_QUEUED_EVENTS as u64,
          value_parser = clap::value_parser!(u64).range(16..=1_000_000))]
    pub max_queued_events: u64,

    /// Client frames per second one session may send (bursts of twice as
    /// many pass); beyond it frames are refused, and a sustained flood is
    /// closed with 1008.
    #[arg(long, env = "PRESENCE_MAX_FRAMES_PER_SEC", default_value_t = config::DEFAULT_MAX_FRAMES_PER_SEC,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_frames_per_sec: u32,

    /// Users one session may add to its watches per second, each read from
    /// Redis and subscribed to (bursts of max(this, 2 x --max-watches)
    /// pass); a watch beyond it is refused with `rate_limited`. Users
    /// already watched cost nothing.
    #[arg(long, env = "PRESENCE_MAX_USER_READS_PER_SEC", default_value_t = config::DEFAULT_MAX_USER_READS_PER_SEC,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_user_reads_per_sec: u32,

    /// Devices one user may have connected at once; one more is closed
    /// with 1008.
    #[arg(long, env = "PRESENCE_MAX_DEVICES_PER_USER", default_value_t = config::DEFAULT_MAX_DEVICES_PER_USER,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_devices_per_user: u32,

    /// Days an offline user's last seen (and status) is kept.
    #[arg(long, env = "PRESENCE_LAST_SEEN_RETENTION_DAYS", default_value_t = 90,
          value_parser = clap::value_parser!(u64).range(1..=36_500))]
    pub last_seen_retention_days: u64,

    /// Period of the reconciliation pass that repairs device sets and
    /// counters disagreeing with the live leases, in ms.
    #[arg(long, env = "PRESENCE_RECONCILE_INTERVAL_MS",
          default_value_t = config::DEFAULT_RECONCILE_INTERVAL.as_millis() as u64,
          value_parser = clap::value_parser!(u64).range(100..=86_400_000))]
    pub reconcile_interval_ms: u64,

    /// How clients prove who they are: `dev` takes ids from the query string
    /// (anyone can be anyone: for the demo and wscat, refused on a
    /// non-loopback address unless --allow-insecure-dev-auth); `jwt` needs a
    /// token whose `sub` is the user.
    #[arg(long, env = "PRESENCE_AUTH", value_enum, default_value = "dev")]
    pub auth: AuthMode,

    /// Serve dev auth on a non-loopback address anyway.
    #[arg(long, env = "PRESENCE_ALLOW_INSECURE_DEV_AUTH")]
    pub allow_insecure_dev_auth: bool,

    /// HS256 secret for --auth jwt (at least 32 bytes). Prefer
    /// --jwt-secret-file or the environment over the command line.
    #[arg(long, env = "PRESENCE_JWT_SECRET", hide_env_values = true)]
    pub jwt_secret: Option<String>,

    /// File holding the HS256 secret for --auth jwt.
    #[arg(long, env = "PRESENCE_JWT_SECRET_FILE")]
    pub jwt_secret_file: Option<PathBuf>,

    /// PEM public key (RSA for RS256, EC P-256 for ES256, Ed25519 for
    /// EdDSA) for --auth jwt.
    #[arg(long, env = "PRESENCE_JWT_PUBLIC_KEY_FILE")]
    pub jwt_public_key_file: Option<PathBuf>,

    /// The identity provider's key set (JWKS) for --auth jwt, e.g.
    /// https://TENANT.auth0.com/.well-known/jwks.json: keys are picked by
    /// `kid`, refreshed in the background and refetched on an unknown `kid`.
    /// HTTPS only (plain http on a loopback host).
    #[arg(long, env = "PRESENCE_JWT_JWKS_URL", hide_env_values = true)]
    pub jwt_jwks_url: Option<String>,

    /// Period of the background JWKS refresh, in seconds.
    #[arg(long, env = "PRESENCE_JWT_JWKS_REFRESH_SECS",
          default_value_t = auth::DEFAULT_JWKS_REFRESH.as_secs(),
          value_parser = clap::value_parser!(u64).range(10..=86_400))]
    pub jwt_jwks_refresh_secs: u64,

    /// Shortest time between two JWKS refetches caused by tokens with an
    /// unknown `kid`, in ms.
    #[arg(long, env = "PRESENCE_JWT_JWKS_REFETCH_MIN_MS",
          default_value_t = auth::DEFAULT_JWKS_REFETCH_MIN.as_millis() as u64,
          value_parser = clap::value_parser!(u64).range(100..=3_600_000))]
    pub jwt_jwks_refetch_min_ms: u64,

    /// Accepted `aud` values, comma-separated; a token must name one of them.
    /// Unset: `aud` is not checked.
    #[arg(long, env = "PRESENCE_JWT_AUDIENCE", value_delimiter = ',')]
    pub jwt_audience: Vec<String>,

    /// Required `iss` (e.g. https://TENANT.auth0.com/). Unset: `iss` is not checked.
    #[arg(long, env = "PRESENCE_JWT_ISSUER")]
    pub jwt_issuer: Option<String>,

    /// Clock skew forgiven on a token's `exp` and `nbf`, in seconds; a
    /// session is closed this long after its token's `exp`.
    #[arg(long, env = "PRESENCE_JWT_LEEWAY_SECS", default_value_t = auth::DEFAULT_LEEWAY_SECS,
          value_parser = clap::value_parser!(u64).range(0..=600))]
    pub jwt_leeway_secs: u64,

    /// With --auth jwt, the claim that lists the rooms a user may join:
    /// room ids, and prefixes ending in * ("team:7:*").
    #[arg(long, env = "PRESENCE_JWT_ROOMS_CLAIM", default_value = "rooms")]
    pub jwt_rooms_claim: String,

    /// Who may join which room, per room-id pattern, first match wins:
    /// `<pattern>=<policy>` (a room id, a prefix ending in *, or *), or a
    /// bare policy for every room; repeat it, or separate with commas.
    /// Policies: claim (the token's rooms claim; the default with --auth
    /// jwt), open (any user; the default with --auth dev, where claim also
    /// reads as open), token (a room token in the join frame), members (a
    /// member list kept with /api/rooms/{room}/members), proxy (the backend
    /// at --room-join-url is asked).
    #[arg(long, env = "PRESENCE_ROOM_POLICY", value_delimiter = ',')]
    pub room_policy: Vec<String>,

    /// With --room-policy proxy: the app's backend, asked with a signed POST
    /// of {"user","device","room","state"} whether a join may go ahead; 200
    /// with {"allow":true} lets it in, any other answer refuses it
    /// (forbidden), none in time refuses it as unavailable. Needs
    /// --room-join-secret.
    #[arg(long, env = "PRESENCE_ROOM_JOIN_URL", hide_env_values = true)]
    pub room_join_url: Option<String>,

    /// HMAC-SHA256 key (at least 16 bytes) of the Presence-Signature header
    /// of each --room-join-url request (the webhooks' scheme, its own key).
    /// Prefer --room-join-secret-file or the environment over the command
    /// line.
    #[arg(long, env = "PRESENCE_ROOM_JOIN_SECRET", hide_env_values = true)]
    pub room_join_secret: Option<String>,

    /// File holding the --room-join-url secret.
    #[arg(long, env = "PRESENCE_ROOM_JOIN_SECRET_FILE")]
    pub room_join_secret_file: Option<PathBuf>,

    /// Longest wait for the --room-join-url backend's answer, in ms; a join
    /// not answered in time is refused with unavailable.
    #[arg(long, env = "PRESENCE_ROOM_JOIN_TIMEOUT_MS",
          default_value_t = rooms::proxy::DEFAULT_TIMEOUT.as_millis() as u64,
          value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub room_join_timeout_ms: u64,

    /// How long this node keeps the backend's allowed answer per user and
    /// room, in ms (less if its Cache-Control says so); a refusal is kept
    /// only as long as its Cache-Control max-age says, and no longer than
    /// this. 0: every join asks.
    #[arg(long, env = "PRESENCE_ROOM_JOIN_CACHE_MS",
          default_value_t = rooms::proxy::DEFAULT_CACHE.as_millis() as u64,
          value_parser = clap::value_parser!(u64).range(0..=86_400_000))]
    pub room_join_cache_ms: u64,

    /// Most requests to the --room-join-url backend this node has in flight
    /// at once; a join that would need one more is refused with unavailable
    /// at once.
    #[arg(long, env = "PRESENCE_ROOM_JOIN_MAX_IN_FLIGHT",
          default_value_t = rooms::proxy::DEFAULT_MAX_IN_FLIGHT,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub room_join_max_in_flight: u32,

    /// Rooms one device may be in at once.
    #[arg(long, env = "PRESENCE_MAX_ROOMS_PER_DEVICE",
          default_value_t = config::DEFAULT_MAX_ROOMS_PER_DEVICE as u32,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub max_rooms_per_device: u32,

    /// Devices one room may hold; a join beyond it gets room_full.
    #[arg(long, env = "PRESENCE_MAX_ROOM_DEVICES",
          default_value_t = config::DEFAULT_MAX_ROOM_DEVICES,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_room_devices: u32,

    /// Largest room state a device may set, serialized, in bytes.
    #[arg(long, env = "PRESENCE_MAX_ROOM_STATE_BYTES",
          default_value_t = config::DEFAULT_MAX_ROOM_STATE_BYTES as u32,
          value_parser = clap::value_parser!(u32).range(2..=65_536))]
    pub max_room_state_bytes: u32,

    /// Signal frames (and joins that change the state) one device may send
    /// per second.
    #[arg(long, env = "PRESENCE_MAX_ROOM_MESSAGES_PER_SEC",
          default_value_t = config::DEFAULT_MAX_ROOM_MESSAGES_PER_SEC,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub max_room_messages_per_sec: u32,

    /// Room state updates per device per second the node writes to Redis
    /// and forwards, and room_updates batches per member per second:
    /// room_state frames beyond it are never refused, the latest wins.
    #[arg(long, env = "PRESENCE_ROOM_STATE_HZ",
          default_value_t = config::DEFAULT_ROOM_STATE_HZ,
          value_parser = clap::value_parser!(u32).range(1..=1_000))]
    pub room_state_hz: u32,

    /// Above this many users, a room's members get occupancy counts instead
    /// of every join, leave and update, and the room frame lists no members.
    /// A room in counts mode lists its members again once it is a tenth
    /// below this (and below --room-announce-max-devices).
    #[arg(long, env = "PRESENCE_ROOM_ANNOUNCE_MAX",
          default_value_t = config::DEFAULT_ROOM_ANNOUNCE_MAX,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub room_announce_max: u32,

    /// Above this many devices, likewise: a room's members get occupancy
    /// counts (a list's size grows with its devices, not its users).
    #[arg(long, env = "PRESENCE_ROOM_ANNOUNCE_MAX_DEVICES",
          default_value_t = config::DEFAULT_ROOM_ANNOUNCE_MAX_DEVICES,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub room_announce_max_devices: u32,

    /// Shortest time between two occupancy frames of a large room, ms.
    #[arg(long, env = "PRESENCE_ROOM_OCCUPANCY_MS",
          default_value_t = config::DEFAULT_ROOM_OCCUPANCY.as_millis() as u64,
          value_parser = clap::value_parser!(u64).range(100..=60_000))]
    pub room_occupancy_ms: u64,

    /// With --auth jwt, a connection whose handshake carried no token must
    /// send {"type":"auth","token":...} within this many ms, or it is closed
    /// with 1008.
    #[arg(long, env = "PRESENCE_AUTH_TIMEOUT_MS",
          default_value_t = config::DEFAULT_AUTH_TIMEOUT.as_millis() as u64,
          value_parser = clap::value_parser!(u64).range(100..=60_000))]
    pub auth_timeout_ms: u64,

    /// With --auth jwt, a session gets {"type":"auth_expiring"} this many ms
    /// before its token expires, to send a fresh one.
    #[arg(long, env = "PRESENCE_AUTH_EXPIRING_MS",
          default_value_t = config::DEFAULT_AUTH_EXPIRING.as_millis() as u64,
          value_parser = clap::value_parser!(u64).range(0..=86_400_000))]
    pub auth_expiring_ms: u64,

    /// Rooms under --room-policy token: a device gets
    /// {"type":"room_token_expiring"} this many ms before its room token
    /// expires, to send a fresh one in a room_token frame.
    #[arg(long, env = "PRESENCE_ROOM_TOKEN_EXPIRING_MS",
          default_value_t = config::DEFAULT_ROOM_TOKEN_EXPIRING.as_millis() as u64,
          value_parser = clap::value_parser!(u64).range(0..=86_400_000))]
    pub room_token_expiring_ms: u64,

    /// Longest a device may stay present after a {"type":"pause"} frame
    /// closed its socket, in ms (a pause may ask for less); 0: the lease TTL.
    #[arg(long, env = "PRESENCE_PAUSE_GRACE_MS", default_value_t = 0,
          value_parser = clap::value_parser!(u64).range(0..=86_400_000))]
    pub pause_grace_ms: u64,

    /// How long the event feed keeps each recorded transition (online,
    /// offline, status, and the rooms' joins and leaves) for GET
    /// /api/events, in seconds; 0 turns the feed off.
    #[arg(long, env = "PRESENCE_EVENT_RETENTION_SECS",
          default_value_t = config::DEFAULT_EVENT_RETENTION.as_secs(),
          value_parser = clap::value_parser!(u64).range(0..=2_592_000))]
    pub event_retention_secs: u64,

    /// Most events the feed keeps of one user (or room) per
    /// --event-retention-secs: beyond, its events are dropped (and counted
    /// as lost), so that one account cannot fill Redis.
    #[arg(long, env = "PRESENCE_EVENT_MAX_PER_USER",
          default_value_t = config::DEFAULT_EVENT_MAX_PER_USER,
          value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub event_max_per_user: u64,

    /// Most WebSockets one client address may hold open on this node (an
    /// IPv6 address counts by its /64); one more is refused with 429 before
    /// the upgrade. 0: no cap. Behind a proxy give --trust-proxy, so that
    /// the address is the client's and not the proxy's.
    #[arg(long, env = "PRESENCE_MAX_CONNECTIONS_PER_IP", default_value_t = config::DEFAULT_MAX_CONNECTIONS_PER_IP)]
    pub max_connections_per_ip: u32,

    /// With --auth jwt, most sockets this node holds that still wait for
    /// their auth frame; one more is refused with 503 and Retry-After before
    /// the upgrade. 0: no cap.
    #[arg(long, env = "PRESENCE_MAX_PENDING_AUTH", default_value_t = config::DEFAULT_MAX_PENDING_AUTH)]
    pub max_pending_auth: u32,

    /// Most new sessions this node may have setting up at once (lease
    /// claims queued or in Redis, and first requests, a watch's snapshot,
    /// until answered); one more is closed with 1013 and a retry hint before
    /// any Redis work, so that a reconnect storm is shed, not answered late.
    /// 0: no cap.
    #[arg(long, env = "PRESENCE_MAX_PENDING_CLAIMS", default_value_t = config::DEFAULT_MAX_PENDING_CLAIMS)]
    pub max_pending_claims: u32,

    /// With --auth jwt, largest message a socket may send before it has
    /// authenticated, in bytes (no fragments either); larger is closed with
    /// 1009.
    #[arg(long, env = "PRESENCE_MAX_AUTH_FRAME_BYTES", default_value_t = config::DEFAULT_MAX_AUTH_FRAME_BYTES as u64,
          value_parser = clap::value_parser!(u64).range(256..=1_048_576))]
    pub max_auth_frame_bytes: u64,

    /// Users (or rooms) the HTTP API reads per second for one client address,
    /// and for one token's user (bursts of twice as many, and at least 1000,
    /// pass); beyond it, 429 with Retry-After.
    #[arg(long, env = "PRESENCE_HTTP_READS_PER_SEC", default_value_t = config::DEFAULT_HTTP_READS_PER_SEC,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub http_reads_per_sec: u32,

    /// HTTP reads one client address, or one token's user, may have in
    /// flight at once (answered or cancelled frees a place); beyond it, 429.
    /// The admin and service keys have no cap. 0: no cap.
    #[arg(long, env = "PRESENCE_HTTP_READS_IN_FLIGHT", default_value_t = config::DEFAULT_HTTP_READS_IN_FLIGHT)]
    pub http_reads_in_flight: u32,

    /// Users (or rooms) the HTTP API reads per second, node-wide, for the
    /// admin and service keys (bursts of twice as many pass).
    #[arg(long, env = "PRESENCE_SERVICE_READS_PER_SEC", default_value_t = config::DEFAULT_SERVICE_READS_PER_SEC,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub service_reads_per_sec: u32,

    /// The token claim that names the user.
    #[arg(long, env = "PRESENCE_JWT_USER_CLAIM", default_value = "sub")]
    pub jwt_user_claim: String,

    /// Browser origins allowed to open a WebSocket besides the server's own,
    /// comma-separated (e.g. https://chat.example.com); `*` allows any.
    #[arg(long, env = "PRESENCE_ALLOWED_ORIGINS", value_delimiter = ',')]
    pub allowed_origins: Vec<String>,

    /// With --auth dev, host names besides localhost, 127.0.0.1 and [::1]
    /// that /ws and /api/* answer to, comma-separated (a name your browser
    /// uses for this machine); any other Host gets 403, which stops DNS
    /// rebinding.
    #[arg(long, env = "PRESENCE_ALLOWED_HOST", value_delimiter = ',')]
    pub allowed_host: Vec<String>,

    /// Bearer key of the admin API (contacts). Without it the admin API is off.
    #[arg(long, env = "PRESENCE_ADMIN_KEY", hide_env_values = true)]
    pub admin_key: Option<String>,

    /// Bearer key that reads the REST API (GET /api/presence/{user}, POST
    /// /api/presence/query, GET /api/online) as the truth, for a backend:
    /// invisible users' real status, exact devices. Read-only; the admin key
    /// reads the same way.
    #[arg(long, env = "PRESENCE_SERVICE_KEY", hide_env_values = true)]
    pub service_key: Option<String>,

    /// Serve /metrics on the public listener to anyone. Without it (and
    /// without --internal-listen, where /metrics stays open) a scrape needs
    /// the admin key or the service key as Authorization: Bearer.
    #[arg(long, env = "PRESENCE_PUBLIC_METRICS")]
    pub public_metrics: bool,

    /// POST every transition this node makes (online, offline, status
    /// change) to this URL, in signed JSON batches; repeat the flag (or
    /// separate with commas) for several receivers. Needs --webhook-secret.
    #[arg(
        long,
        env = "PRESENCE_WEBHOOK_URL",
        hide_env_values = true,
        value_delimiter = ','
    )]
    pub webhook_url: Vec<String>,

    /// HMAC-SHA256 key (at least 16 bytes) of the `Presence-Signature`
    /// header of each webhook POST. Prefer --webhook-secret-file or the
    /// environment over the command line.
    #[arg(long, env = "PRESENCE_WEBHOOK_SECRET", hide_env_values = true)]
    pub webhook_secret: Option<String>,

    /// File holding the webhook secret.
    #[arg(long, env = "PRESENCE_WEBHOOK_SECRET_FILE")]
    pub webhook_secret_file: Option<PathBuf>,

    /// Most events in one webhook POST.
    #[arg(long, env = "PRESENCE_WEBHOOK_BATCH_SIZE", default_value_t = webhooks::DEFAULT_BATCH_SIZE as u64,
          value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub webhook_batch_size: u64,

    /// Longest time, in ms, an event waits for its webhook batch to fill.
    #[arg(long, env = "PRESENCE_WEBHOOK_BATCH_MS",
          default_value_t = webhooks::DEFAULT_BATCH_INTERVAL.as_millis() as u64,
          value_parser = clap::value_parser!(u64).range(0..=60_000))]
    pub webhook_batch_ms: u64,

    /// Most webhook events waiting per URL (a receiver that is down or
    /// slow); when full, the oldest are dropped and counted in
    /// presence_webhook_dropped_total.
    #[arg(long, env = "PRESENCE_WEBHOOK_QUEUE_LIMIT", default_value_t = webhooks::DEFAULT_QUEUE_LIMIT as u64,
          value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub webhook_queue_limit: u64,

    /// `open`: anyone may watch anyone (privacy settings still apply);
    /// `contacts`: a watch on a user who does not list the watcher as a
    /// contact shows only `offline`, without revealing whether it exists.
    #[arg(
        long,
        env = "PRESENCE_WATCH_POLICY",
        value_enum,
        default_value = "open"
    )]
    pub watch_policy: WatchPolicy,

    /// Where the private redis-server keeps its data and log (a fresh
    /// directory is made inside, and removed on exit).
    #[arg(long, env = "PRESENCE_LOCAL_REDIS_DIR", default_value_os_t = std::env::temp_dir())]
    pub local_redis_dir: PathBuf,

    /// Start a private redis-server when neither --redis-url nor
    /// --redis-sentinel is given, under --auth jwt too. Without it a jwt
    /// node refuses to start without a Redis: nodes with private Redis
    /// servers would each see only their own clients.
    #[arg(long, env = "PRESENCE_LOCAL_REDIS")]
    pub local_redis: bool,

    /// Validate the flags, environment and config file, print the
    /// effective settings (secrets masked) and exit: 0 when the node would
    /// start with them, 1 with the reason when not. Binds no port and
    /// connects to nothing.
    #[arg(long)]
    pub check_config: bool,

    /// Reverse proxies (addresses or CIDR blocks, comma-separated, e.g.
    /// 127.0.0.1,10.0.0.0/8) whose X-Forwarded-For names the client in the
    /// logs. From any other peer the header is ignored.
    #[arg(long, env = "PRESENCE_TRUST_PROXY", value_delimiter = ',')]
    pub trust_proxy: Vec<String>,

    /// Serve no demo page or other static file (404): for production.
    #[arg(long, env = "PRESENCE_NO_DEMO", conflicts_with = "static_dir")]
    pub no_demo: bool,

    /// Serve this directory's files instead of the demo page (`/` is its
    /// index.html).
    #[arg(long, env = "PRESENCE_STATIC_DIR")]
    pub static_dir: Option<PathBuf>,

    /// Log format: `text` lines or one JSON object per line; both name the node.
    #[arg(long, env = "PRESENCE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// TOML file whose keys are these flags' long names (`heartbeat-ms = 15000`);
    /// flags and environment variables override it.
    #[arg(long, env = "PRESENCE_CONFIG")]
    pub config: Option<PathBuf>,
}

/// The environment variables the config file set (for `--check-config`).
static FROM_CONFIG_FILE: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();

/// Parses flags, with the config file (if any) under the environment.
pub fn parse_args() -> anyhow::Result<Args> {
    let args = Args::parse();
    let Some(path) = args.config else {
        return Ok(args);
    };
    // The file's values go in as the flags' env vars where those are unset;
    // parsing again then ranks them below flags and env.
    let set = config_file::apply(&path, &Args::command())?;
    let _ = FROM_CONFIG_FILE.set(set);
    Ok(Args::parse())
}

/// The environment variables that came from the config file.
pub fn from_config_file() -> &'static [String] {
    FROM_CONFIG_FILE.get().map_or(&[], |v| v.as_slice())
}

/// `--auth`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum AuthMode {
    /// Ids from the query string.
    Dev,
    /// JSON Web Tokens.
    Jwt,
}

/// `--watch-policy`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum WatchPolicy {
    /// Anyone may watch anyone.
    Open,
    /// Only users who list the watcher as a contact.
    Contacts,
}
