//! Starting a node: Redis checks, the three kinds of actors, the HTTP server.

use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use actix::Actor;
use actix_web::{web, App, HttpResponse, HttpServer};
use anyhow::Context as _;
use tokio::sync::oneshot;

use crate::auth::{Auth, Origins};
use crate::config::Config;
use crate::expiry::ExpiryListener;
use crate::http::{self, AppState};
use crate::lease::{Claimer, Refresher};
use crate::redis::RedisOptions;
use crate::registry::{Registry, Shutdown};
use crate::store::Store;
use crate::webhooks::Webhooks;

/// Longest time an HTTP request may take before it is answered 503: the
/// docs/operations.md promises REST errors within 2 s when Redis is unreachable or
/// hangs. (A WebSocket's life is its response body, not bounded by this.)
const REQUEST_DEADLINE: Duration = Duration::from_millis(1_500);

/// How long start-up waits for the pub/sub subscriptions.
const SUBSCRIBE_TIMEOUT: Duration = Duration::from_secs(10);
/// After a resubscription the registry re-reads watched users one heartbeat
/// plus this much later, once live sessions have re-asserted their leases.
const RESYNC_MARGIN: Duration = Duration::from_millis(500);

/// After SIGTERM/SIGINT, how long connections get to finish before they are
/// cut and the process exits (deploy/presence.service waits a little longer).
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// Who may connect and administer.
pub struct Security {
    /// How clients prove who they are.
    pub auth: Auth,
    /// Browser origins allowed to open a WebSocket besides the server's own.
    pub origins: Origins,
    /// Bearer key of the admin API; `None` turns it off.
    pub admin_key: Option<String>,
    /// Host names besides loopback that `/ws` and `/api/*` answer to under
    /// development auth (`--allowed-host`).
    pub allowed_hosts: Vec<String>,
    /// Bearer key that reads the REST API as the truth, like the admin key
    /// but with nothing else (`--service-key`); `None` turns it off.
    pub service_key: Option<String>,
    /// Where to POST this node's transitions (`--webhook-url`), if anywhere.
    pub webhooks: Option<crate::webhooks::WebhookConfig>,
    /// `/metrics` on the public listener without a key (`--public-metrics`).
    pub public_metrics: bool,
    /// Where to ask about joins to `proxy` rooms (`--room-join-url`), if
    /// any room has that policy.
    pub room_join: Option<crate::rooms::proxy::RoomJoinConfig>,
}

/// Runs a node on an already bound `listener` until SIGINT or SIGTERM;
/// with `internal`, metrics, health and the admin API are served there
/// only. Must be called inside an actix system (`#[actix_web::main]`).
pub async fn run(
    config: Config,
    security: Security,
    redis: &RedisOptions,
    listener: TcpListener,
    internal: Option<TcpListener>,
) -> anyhow::Result<()> {
    let config = Arc::new(config);
    if let Auth::Jwt(verifier) = &security.auth {
        verifier.start().await?;
    }
    let redis = crate::redis::connect(redis, &config.node_id).await?;
    let (client, conn, redis_health) = (redis.source, redis.conn, redis.health);
    // Dropping it stops the private Redis: kept until the node has stopped.
    let _local = redis.local;
    let webhooks = node_webhooks(&config, &security)?;
    let (feed_tx, feed_rx) = crate::feed::channel();
    let store = open_store_patiently(conn, &config, webhooks.clone(), feed_tx).await?;
    start_feed(&store, &config, &security, feed_rx).await?;
    // Every session's lease refreshes go through one refresher task, which
    // sends them to Redis in batches.
    let refresher = Refresher::spawn(store.clone());
    // And every new session's claim through one claimer task, which batches
    // them too and sheds those beyond --max-pending-claims.
    let claimer = Claimer::spawn(
        store.clone(),
        config.admission.max_pending_claims,
        config.ttl,
    );

    let readiness = Arc::new(crate::readiness::Readiness::new());
    let registry = start_actors(&client, &store, &config, &readiness).await?;
    let room_proxy = match security.room_join.clone() {
        Some(join) => Some(crate::rooms::proxy::RoomProxy::new(
            join,
            config.rooms.max_state_bytes,
        )?),
        None => None,
    };

    let dev_hosts = matches!(security.auth, Auth::Dev)
        .then(|| crate::auth::DevHosts::new(security.allowed_hosts.iter().cloned()));
    let node = Arc::new(crate::node::Node {
        store,
        claimer,
        refresher,
        registry: registry.clone(),
        config: config.clone(),
        conns: crate::admission::ConnLimits::new(
            config.admission.max_connections_per_ip,
            config.admission.max_pending_auth,
        ),
        room_proxy,
    });
    let state = web::Data::new(AppState {
        node,
        auth: Arc::new(security.auth),
        origins: security.origins,
        budgets: budgets(&config),
        in_flight: crate::admission::InFlight::new(config.admission.http_reads_in_flight),
        admin_key: security.admin_key,
        service_key: security.service_key,
        public_metrics: security.public_metrics,
        dev_hosts,
        redis_health,
        readiness: readiness.clone(),
    });
    let addr = listener.local_addr()?;
    let (server, internal) = serve(state, listener, internal, &config.node_id)?;
    actix::spawn(shutdown_on_signal(
        server.handle(),
        internal.as_ref().map(|s| s.handle()),
        registry,
        readiness,
        config.drain_delay,
    ));
    log::info!(
        "node {} listening on http://{addr} (heartbeat {:?}, lease ttl {:?})",
        config.node_id,
        config.heartbeat,
        config.ttl
    );
    match internal {
        Some(internal) => {
            futures_util::future::try_join(server, internal).await?;
        }
        None => server.await?,
    }
    if let Some(webhooks) = webhooks {
        // Stopping is a transition-free drain (leases lapse), but what was
        // queued before it still belongs to the receivers.
        webhooks.drain(SHUTDOWN_TIMEOUT).await;
    }
    log::info!("node {} stopped", config.node_id);
    Ok(())
}

/// How long a node keeps trying to open its store at start while Redis
/// answers that it cannot yet (a cluster shard failing over, a primary
/// being promoted): longer than a failover takes, shorter than a
/// supervisor's patience.
const OPEN_PATIENCE: Duration = Duration::from_secs(30);

/// [`open_store`], tried again (every half second, for up to
/// [`OPEN_PATIENCE`]) while it fails: a node started during a failover
/// (one shard of a cluster without its primary) waits for it instead of
/// exiting at once.
async fn open_store_patiently(
    conn: crate::redis::RedisConn,
    config: &Config,
    webhooks: Option<Webhooks>,
    feed: crate::feed::Sender,
) -> anyhow::Result<Store> {
    let until = tokio::time::Instant::now() + OPEN_PATIENCE;
    loop {
        match open_store(conn.clone(), config, webhooks.clone(), feed.clone()).await {
            Ok(store) => return Ok(store),
            Err(e) if tokio::time::Instant::now() < until => {
                log::warn!("{e:#}; trying again");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// With the feed on, the webhooks are sent from its log (`feed::deliver`),
/// not from this node's queue: none here. With it off, each node queues
/// and sends the transitions it makes.
fn node_webhooks(config: &Config, security: &Security) -> anyhow::Result<Option<Webhooks>> {
    Ok(match &security.webhooks {
        Some(hooks) if config.event_retention.is_zero() => {
            Some(Webhooks::start(hooks.clone(), &config.node_id)?)
        }
        Some(hooks) => {
            hooks.validate()?;
            None
        }
        None => None,
    })
}

/// Starts the event feed's mover, pass and webhook senders when the feed
/// is on; each webhook URL first gets its place at the end of the log.
async fn start_feed(
    store: &Store,
    config: &Config,
    security: &Security,
    feed_rx: tokio::sync::mpsc::Receiver<String>,
) -> anyhow::Result<()> {
    if config.event_retention.is_zero() {
        return Ok(());
    }
    if let Some(hooks) = &security.webhooks {
        // Before any client: every transition from now on is sent.
        store
            .start_feed_sent(&hooks.urls)
            .await
            .context("cannot start the webhooks' places in the event feed")?;
    }
    crate::feed::spawn(
        store.clone(),
        config.node_id.clone(),
        feed_rx,
        security.webhooks.clone(),
    );
    Ok(())
}

/// The store on `conn`: scripts loaded, the deployment's constants read (or
/// written) and this node's run recorded.
async fn open_store(
    conn: crate::redis::RedisConn,
    config: &Config,
    webhooks: Option<Webhooks>,
    feed: crate::feed::Sender,
) -> anyhow::Result<Store> {
    let mut store = Store::with_limits(conn, config.ttl, config.max_devices_per_user)
        .with_webhooks(webhooks)
        .with_room_lists(crate::store::rooms::RoomLists {
            users: config.rooms.announce_max,
            devices: config.rooms.announce_max_devices,
        });
    if !config.event_retention.is_zero() {
        let settings = crate::store::feed::FeedSettings {
            retention: config.event_retention,
            max_per_owner: config.event_max_per_user,
        };
        store = store.with_feed(settings, Some(feed));
        let direct = store.feed_can_write_log().await;
        store = store.with_feed_direct(direct);
    }
    store.load_scripts().await.context("cannot load scripts")?;
    store
        .load_deployment()
        .await
        .context("cannot read the deployment's settings (presence-meta)")?
        .begin_run(&config.node_id, config.run_hold())
        .await
        .context("cannot record this node's run (presence-meta, presence-run)")
}

/// Starts the registry and the expiry listener, and waits until both are
/// subscribed: an event published before would be lost for this node's
/// watchers.
async fn start_actors(
    client: &crate::redis::Source,
    store: &Store,
    config: &Arc<Config>,
    readiness: &Arc<crate::readiness::Readiness>,
) -> anyhow::Result<actix::Addr<Registry>> {
    let (registry_ready, registry_subscribed) = oneshot::channel();
    let (expiry_ready, expiry_subscribed) = oneshot::channel();
    let registry = Registry::new(
        client.clone(),
        store.clone(),
        config.heartbeat + RESYNC_MARGIN,
        config.contacts_only,
        config.client_timeout() + config.heartbeat,
        registry_ready,
    )
    .with_rooms(config.rooms.occupancy_interval, config.rooms.state_tick())
    .start();
    ExpiryListener::new(client.clone(), store.clone(), config.clone(), expiry_ready)
        .with_readiness(readiness.clone())
        .start();
    tokio::time::timeout(SUBSCRIBE_TIMEOUT, async {
        let _ = registry_subscribed.await;
        let _ = expiry_subscribed.await;
    })
    .await
    .with_context(|| {
        format!("could not subscribe to redis pub/sub within {SUBSCRIBE_TIMEOUT:?}")
    })?;
    Ok(registry)
}

/// The HTTP servers: the public listener, and the internal one when given.
type Servers = (actix_web::dev::Server, Option<actix_web::dev::Server>);

/// Starts serving `state` on `listener` and, with `internal`, metrics,
/// health and the admin API on that listener only.
fn serve(
    state: web::Data<AppState>,
    listener: TcpListener,
    internal: Option<TcpListener>,
    node_id: &str,
) -> anyhow::Result<Servers> {
    let split = internal.is_some();
    let public_state = state.clone();
    let server = HttpServer::new(move || {
        App::new()
            .app_data(public_state.clone())
            .wrap(actix_web::middleware::from_fn(http::dev_host_guard))
            .configure(if split {
                http::public_routes
            } else {
                http::routes
            })
            .wrap(actix_web::middleware::from_fn(within_deadline))
    })
    .on_connect(crate::conn::on_connect)
    .disable_signals()
    .shutdown_timeout(SHUTDOWN_TIMEOUT.as_secs())
    .listen(listener)?
    .run();
    let internal = match internal {
        Some(listener) => {
            let internal_addr = listener.local_addr()?;
            let server = HttpServer::new(move || {
                App::new()
                    .app_data(state.clone())
                    // Its privacy route changes users' settings: the same
                    // Host rule as the public listener's (DNS rebinding).
                    .wrap(actix_web::middleware::from_fn(http::dev_host_guard))
                    .configure(http::internal_routes)
                    .wrap(actix_web::middleware::from_fn(within_deadline))
            })
            // Scrapes and health checks: one worker is plenty.
            .workers(1)
            .disable_signals()
            .shutdown_timeout(SHUTDOWN_TIMEOUT.as_secs())
            .listen(listener)?
            .run();
            log::info!(
                "node {node_id}: metrics, health and admin API on http://{internal_addr} only"
            );
            Some(server)
        }
        None => None,
    };
    Ok((server, internal))
}

/// A request that outran [`REQUEST_DEADLINE`]: Redis is slow or away, so it
/// is answered like any other `unavailable`.
#[derive(Debug, thiserror::Error)]
#[error("request took longer than {REQUEST_DEADLINE:?}")]
struct TooSlow;

impl actix_web::ResponseError for TooSlow {
    fn status_code(&self) -> actix_web::http::StatusCode {
        actix_web::http::StatusCode::SERVICE_UNAVAILABLE
    }

    fn error_response(&self) -> HttpResponse {
        HttpResponse::ServiceUnavailable().json(crate::protocol::ProtocolError::new(
            crate::protocol::ErrorCode::Unavailable,
            "presence store unavailable, try again",
        ))
    }
}

/// Middleware of both listeners: a request not answered within
/// [`REQUEST_DEADLINE`] gets 503 ([`TooSlow`]).
async fn within_deadline(
    req: actix_web::dev::ServiceRequest,
    next: actix_web::middleware::Next<impl actix_web::body::MessageBody>,
) -> Result<actix_web::dev::ServiceResponse<impl actix_web::body::MessageBody>, actix_web::Error> {
    match tokio::time::timeout(REQUEST_DEADLINE, next.call(req)).await {
        Ok(res) => res,
        Err(_) => Err(TooSlow.into()),
    }
}

/// Waits for SIGTERM or SIGINT.
async fn signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        log::error!("cannot install signal handlers; stop the node with SIGKILL");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

/// Rolling deploys without flicker: on the first SIGTERM or SIGINT the node
/// answers `/readyz` with 503 at once and keeps serving for `drain_delay`
/// (`--drain-delay-ms`), so that a load balancer stops sending it clients;
/// then it stops accepting, closes every WebSocket with 1001 (going away)
/// so that clients reconnect to another node, and leaves their leases to
/// lapse instead of announcing departures. A second signal cuts the delay
/// short, and one during the close, or [`SHUTDOWN_TIMEOUT`], cuts what is
/// left.
async fn shutdown_on_signal(
    server: actix_web::dev::ServerHandle,
    internal: Option<actix_web::dev::ServerHandle>,
    registry: actix::Addr<Registry>,
    readiness: Arc<crate::readiness::Readiness>,
    drain_delay: Duration,
) {
    signal().await;
    readiness.drain();
    if !drain_delay.is_zero() {
        log::info!(
            "draining: /readyz answers 503; closing sessions in {} ms (--drain-delay-ms)",
            drain_delay.as_millis()
        );
        tokio::select! {
            _ = tokio::time::sleep(drain_delay) => {}
            _ = signal() => log::warn!("second signal: closing sessions now"),
        }
    }
    if let Some(internal) = internal {
        // Scrapes and health checks need no grace period.
        actix::spawn(async move { internal.stop(true).await });
    }
    let closed = registry.send(Shutdown).await.unwrap_or(0);
    log::info!("shutting down: closed {closed} sessions with 1001; their leases lapse unless they reconnect");
    tokio::select! {
        _ = server.stop(true) => {}
        _ = signal() => {
            log::warn!("second signal: exiting now");
            server.stop(false).await;
        }
    }
}

/// The HTTP API's read budgets from `config`.
fn budgets(config: &Config) -> crate::admission::Budgets {
    use crate::admission::budget::Rate;
    use crate::config::AdmissionLimits;
    let rate = |per_sec| Rate {
        per_sec,
        burst: AdmissionLimits::burst(per_sec),
    };
    crate::admission::Budgets::new(
        rate(config.admission.http_reads_per_sec),
        rate(config.admission.service_reads_per_sec),
    )
}
