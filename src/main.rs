//! `presence-server`: flags, logging, an optional private Redis, then [`server::run`].

mod args;
mod check_config;

use std::net::{TcpListener, ToSocketAddrs};
use std::process::ExitCode;
use std::time::Duration;

use args::{parse_args, Args, AuthMode, WatchPolicy};
use presence_server::auth::{Auth, Jwks, JwtRules, JwtVerifier, Origins};
use presence_server::config::StaticFiles;
use presence_server::config::{self, Config};
use presence_server::logging::{self};
use presence_server::redis::RedisOptions;
use presence_server::rooms::proxy::RoomJoinConfig;
use presence_server::server::Security;
use presence_server::webhooks::WebhookConfig;
use presence_server::{ids, server};

/// jemalloc rather than glibc's malloc: with tens of thousands of long-lived
/// connections whose small buffers are touched by traffic, glibc's arenas
/// kept about 3 KiB more per connection resident (BENCHMARKS.md).
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc options, read before `main`. Without them memory freed by
/// sessions that left stayed resident: jemalloc returns unused pages only
/// while the arena that freed them keeps allocating, and an idle node does
/// not. A background thread purges them instead; freed pages are released
/// within about a second (`dirty_decay_ms`), with `MADV_DONTNEED` at once
/// (`muzzy_decay_ms:0`; lazily freed pages would still count as resident).
/// 300 sessions x 1,000 watches gave back 8% of their memory within 20 s
/// before (`watch_memory_is_given_back` in tests/it/edge.rs).
#[allow(non_upper_case_globals)]
#[export_name = "_rjem_malloc_conf"]
static malloc_conf: &[u8; 60] = b"background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0\0";

fn main() -> ExitCode {
    let mut args = match parse_args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("presence-server: {e:#}");
            return ExitCode::from(2);
        }
    };
    // Chosen before logging starts, so that every line names its node.
    let node_id = args
        .node_id
        .get_or_insert_with(|| format!("presence-{:08x}", rand::random::<u32>()));
    logging::init(node_id, args.log_format);
    for var in check_config::unread_env() {
        log::warn!(
            "{var} is set, but no flag reads it (a typo?); `presence-server --help` lists them"
        );
    }
    if args.check_config {
        return check_config::run(&args, settings(&args));
    }
    match start(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Once: the log goes to stderr already.
            log::error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}

/// What a node starts with, validated: everything but the ports and Redis.
struct Settings {
    config: Config,
    security: Security,
    redis: RedisOptions,
}

fn start(args: Args) -> anyhow::Result<()> {
    let Settings {
        config,
        security,
        redis,
    } = settings(&args)?;
    raise_fd_limit();
    let listener = TcpListener::bind(&args.listen)
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", args.listen))?;
    let internal = match &args.internal_listen {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .map_err(|e| anyhow::anyhow!("cannot listen on {addr} (--internal-listen): {e}"))?,
        ),
        None => None,
    };
    actix_web::rt::System::new().block_on(server::run(config, security, &redis, listener, internal))
}

/// The flags checked and turned into a node's settings; the checks of
/// `--check-config` are these.
fn settings(args: &Args) -> anyhow::Result<Settings> {
    let node_id = args
        .node_id
        .clone()
        .unwrap_or_else(|| format!("presence-{:08x}", rand::random::<u32>()));
    ids::validate("node", &node_id)?;
    let heartbeat = Duration::from_millis(args.heartbeat_ms);
    let mut config = Config::new(node_id);
    config.heartbeat = heartbeat;
    config.drain_delay = Duration::from_millis(args.drain_delay_ms);
    config.ttl = args
        .ttl_ms
        .map_or(heartbeat * config::TTL_HEARTBEATS, Duration::from_millis);
    if config.ttl <= heartbeat {
        anyhow::bail!(
            "--ttl-ms ({:?}) must be longer than --heartbeat-ms ({heartbeat:?}), or every device would lapse between pings",
            config.ttl
        );
    }
    config.max_watches = args.max_watches;
    config.max_frame_bytes = args.max_frame_bytes;
    config.last_seen_retention = Duration::from_secs(args.last_seen_retention_days * 24 * 3600);
    config.reconcile_interval = Duration::from_millis(args.reconcile_interval_ms);
    config.max_queued_events = args.max_queued_events as usize;
    config.max_frames_per_sec = args.max_frames_per_sec;
    config.max_devices_per_user = args.max_devices_per_user;
    config.max_user_reads_per_sec = args.max_user_reads_per_sec;
    config.contacts_only = matches!(args.watch_policy, WatchPolicy::Contacts);
    config.auth_timeout = Duration::from_millis(args.auth_timeout_ms);
    config.auth_expiring = Duration::from_millis(args.auth_expiring_ms);
    config.room_token_expiring = Duration::from_millis(args.room_token_expiring_ms);
    config.pause_grace = Duration::from_millis(args.pause_grace_ms);
    config.event_retention = Duration::from_secs(args.event_retention_secs);
    config.event_max_per_user = args.event_max_per_user;
    config.rooms = config::RoomLimits {
        max_rooms_per_device: args.max_rooms_per_device as usize,
        max_room_devices: args.max_room_devices,
        max_state_bytes: args.max_room_state_bytes as usize,
        max_messages_per_sec: args.max_room_messages_per_sec,
        state_hz: args.room_state_hz,
        announce_max: args.room_announce_max,
        announce_max_devices: args.room_announce_max_devices,
        occupancy_interval: Duration::from_millis(args.room_occupancy_ms),
        policies: room_policies(args)?,
    };
    log::info!("room policies: {}", config.rooms.policies.describe());
    config.admission = config::AdmissionLimits {
        max_connections_per_ip: args.max_connections_per_ip,
        max_pending_auth: args.max_pending_auth,
        max_pending_claims: args.max_pending_claims,
        max_auth_frame_bytes: args.max_auth_frame_bytes as usize,
        http_reads_per_sec: args.http_reads_per_sec,
        service_reads_per_sec: args.service_reads_per_sec,
        http_reads_in_flight: args.http_reads_in_flight,
    };
    config.trust_proxy = presence_server::proxy::TrustedProxies::parse(&args.trust_proxy)?;
    config.static_files = match (&args.static_dir, args.no_demo) {
        (Some(dir), _) => StaticFiles::dir(dir)?,
        (None, true) => StaticFiles::Off,
        (None, false) => StaticFiles::Demo,
    };
    let mut security = security(args)?;
    security.room_join = room_join_config(args, &config.rooms.policies)?;
    let redis = RedisOptions {
        url: args.redis_url.clone(),
        sentinels: args.redis_sentinel.clone(),
        sentinel_master: args.redis_sentinel_master.clone(),
        tls_ca_file: args.redis_tls_ca_file.clone(),
        tls_cert_file: args.redis_tls_cert_file.clone(),
        tls_key_file: args.redis_tls_key_file.clone(),
        local_dir: Some(args.local_redis_dir.clone()),
    };
    check_shared_redis(args)?;
    presence_server::redis::check_options(&redis)?;
    check_listeners(args)?;
    Ok(Settings {
        config,
        security,
        redis,
    })
}

/// `--listen` and `--internal-listen` must be two sockets: the second bind
/// would fail, after Redis was reached.
fn check_listeners(args: &Args) -> anyhow::Result<()> {
    let Some(internal) = &args.internal_listen else {
        return Ok(());
    };
    let resolve = |addr: &str| -> Vec<std::net::SocketAddr> {
        addr.to_socket_addrs()
            .map(|a| a.filter(|a| a.port() != 0).collect())
            .unwrap_or_default()
    };
    let public = resolve(&args.listen);
    if resolve(internal).iter().any(|a| public.contains(a)) {
        anyhow::bail!(
            "--internal-listen {internal} is the same address as --listen {}: give it another port",
            args.listen
        );
    }
    Ok(())
}

/// A node without a Redis URL starts a private redis-server, which in a
/// fleet splits the nodes apart without a word: under `--auth jwt`
/// (production) that needs `--local-redis`; under dev auth it is said.
fn check_shared_redis(args: &Args) -> anyhow::Result<()> {
    if args.redis_url.is_some() || !args.redis_sentinel.is_empty() || args.local_redis {
        return Ok(());
    }
    match args.auth {
        AuthMode::Jwt => anyhow::bail!(
            "--auth jwt needs a shared Redis: give --redis-url (REDIS_URL) or --redis-sentinel; \
             --local-redis starts a private redis-server instead, whose node sees only its own clients"
        ),
        AuthMode::Dev => log::warn!(
            "no --redis-url (REDIS_URL): starting a private redis-server; a node started \
             this way shares no state with any other (a fleet needs one Redis)"
        ),
    }
    Ok(())
}

/// Authentication, origins and the admin key from the flags.
/// `--room-policy`: claim by default under JWT auth, open under
/// development auth (where there is no rooms claim, so claim reads as open).
fn room_policies(args: &Args) -> anyhow::Result<config::Policies> {
    let fallback = match args.auth {
        AuthMode::Jwt => config::Policy::Claim,
        AuthMode::Dev => config::Policy::Open,
    };
    let policies =
        config::Policies::parse(&args.room_policy, fallback).map_err(anyhow::Error::msg)?;
    // Room tokens are verified with the keys of connection tokens, which
    // development auth does not have.
    anyhow::ensure!(
        matches!(args.auth, AuthMode::Jwt) || !policies.uses(config::Policy::Token),
        "--room-policy token needs --auth jwt: room tokens are verified with the keys of connection tokens (--jwt-secret, --jwt-public-key-file or --jwt-jwks-url)"
    );
    let policies = match args.auth {
        AuthMode::Jwt => policies,
        AuthMode::Dev => policies.claim_as_open(),
    };
    Ok(policies)
}

fn security(args: &Args) -> anyhow::Result<Security> {
    let auth = match args.auth {
        AuthMode::Dev => {
            let loopback = args
                .listen
                .to_socket_addrs()
                .map(|mut a| a.all(|a| a.ip().is_loopback()))
                .unwrap_or(false);
            if !loopback && !args.allow_insecure_dev_auth {
                anyhow::bail!(
                    "--auth dev lets anyone connect as anyone; it is refused on {} (not loopback). Use --auth jwt, or --allow-insecure-dev-auth if you really mean it",
                    args.listen
                );
            }
            log::warn!(
                "*** --auth dev: anyone can connect as any user. Use --auth jwt in production. ***"
            );
            Auth::Dev
        }
        AuthMode::Jwt => Auth::Jwt(jwt_verifier(args)?),
    };
    if let Some(key) = &args.admin_key {
        if key.len() < 16 {
            anyhow::bail!("--admin-key must be at least 16 characters");
        }
    }
    if let Some(key) = &args.service_key {
        if key.len() < 16 {
            anyhow::bail!("--service-key must be at least 16 characters");
        }
    }
    let webhooks = webhook_config(args)?;
    Ok(Security {
        service_key: args.service_key.clone(),
        webhooks,
        auth,
        origins: Origins::new(args.allowed_origins.iter().cloned()),
        admin_key: args.admin_key.clone(),
        allowed_hosts: args.allowed_host.clone(),
        public_metrics: args.public_metrics,
        room_join: None,
    })
}

/// The token verifier of `--auth jwt`, from the JWT flags.
fn jwt_verifier(args: &Args) -> anyhow::Result<JwtVerifier> {
    let secret = match (&args.jwt_secret, &args.jwt_secret_file) {
        (Some(s), _) => Some(s.trim().as_bytes().to_vec()),
        (None, Some(path)) => Some(
            std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?
                .trim()
                .as_bytes()
                .to_vec(),
        ),
        (None, None) => None,
    };
    let public = match &args.jwt_public_key_file {
        Some(path) => Some(
            std::fs::read(path)
                .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?,
        ),
        None => None,
    };
    let jwks = match &args.jwt_jwks_url {
        Some(url) => Some(Jwks::new(
            url,
            Duration::from_secs(args.jwt_jwks_refresh_secs),
            Duration::from_millis(args.jwt_jwks_refetch_min_ms),
        )?),
        None => None,
    };
    let rules = JwtRules {
        audience: args
            .jwt_audience
            .iter()
            .map(|a| a.trim().to_string())
            .filter(|a| !a.is_empty())
            .collect(),
        issuer: args.jwt_issuer.clone().filter(|i| !i.is_empty()),
        user_claim: args.jwt_user_claim.clone(),
        leeway_secs: args.jwt_leeway_secs,
        rooms_claim: args.jwt_rooms_claim.clone(),
        room_tokens: room_policies(args)?.uses(config::Policy::Token),
    };
    JwtVerifier::new(secret.as_deref(), public.as_deref(), jwks, rules)
}

/// An HMAC key given as a flag, or in a file (trimmed); empty when neither.
fn secret_of(value: &Option<String>, file: &Option<std::path::PathBuf>) -> anyhow::Result<Vec<u8>> {
    Ok(match (value, file) {
        (Some(s), _) => s.trim().as_bytes().to_vec(),
        (None, Some(path)) => std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?
            .trim()
            .as_bytes()
            .to_vec(),
        (None, None) => Vec::new(),
    })
}

/// Where to POST transitions (`--webhook-url`), if anywhere.
fn webhook_config(args: &Args) -> anyhow::Result<Option<WebhookConfig>> {
    Ok(if args.webhook_url.is_empty() {
        if args.webhook_secret.is_some() || args.webhook_secret_file.is_some() {
            log::warn!("--webhook-secret without --webhook-url: no webhooks are sent");
        }
        None
    } else {
        let secret = secret_of(&args.webhook_secret, &args.webhook_secret_file)?;
        let config = WebhookConfig {
            urls: args.webhook_url.clone(),
            secret,
            batch_size: args.webhook_batch_size as usize,
            batch_interval: Duration::from_millis(args.webhook_batch_ms),
            queue_limit: args.webhook_queue_limit as usize,
        };
        config.validate()?;
        Some(config)
    })
}

/// Where `proxy` rooms ask (`--room-join-*`): required when a rule uses
/// that policy, and of no use otherwise.
fn room_join_config(
    args: &Args,
    policies: &config::Policies,
) -> anyhow::Result<Option<RoomJoinConfig>> {
    let Some(url) = &args.room_join_url else {
        anyhow::ensure!(
            !policies.uses(config::Policy::Proxy),
            "--room-policy proxy needs --room-join-url (and --room-join-secret): the app's backend that decides each join"
        );
        return Ok(None);
    };
    if !policies.uses(config::Policy::Proxy) {
        log::warn!(
            "--room-join-url without a --room-policy rule that uses proxy: it is never asked"
        );
        return Ok(None);
    }
    let secret = secret_of(&args.room_join_secret, &args.room_join_secret_file)?;
    let config = RoomJoinConfig {
        url: url.clone(),
        secret,
        timeout: Duration::from_millis(args.room_join_timeout_ms),
        cache: Duration::from_millis(args.room_join_cache_ms),
        max_in_flight: args.room_join_max_in_flight,
    };
    config.validate()?;
    Ok(Some(config))
}

/// Every connection is a file descriptor: lift the soft limit to the hard one.
fn raise_fd_limit() {
    if let Err(e) = rlimit::increase_nofile_limit(u64::MAX) {
        log::warn!("could not raise the open-file limit: {e}");
    }
}
