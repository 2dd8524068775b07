//! Starting a node: Redis checks, the three kinds of actors, the HTTP server.

use std::net::TcpListener;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use actix::Actor;
use actix_web::{web, App, HttpServer};
use anyhow::Context as _;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::config::Config;
use crate::expiry::ExpiryListener;
use crate::http::{self, AppState};
use crate::registry::Registry;
use crate::store::{self, Store};

/// How long one Redis command may take before it fails.
const REDIS_RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long connecting to Redis may take.
const REDIS_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// On SIGTERM/SIGINT, how long open connections get before they are cut;
/// leases of cut connections lapse after their TTL.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs a node on an already bound `listener` until SIGINT or SIGTERM.
/// Must be called inside an actix system (`#[actix_web::main]`).
pub async fn run(config: Config, redis_url: &str, listener: TcpListener) -> anyhow::Result<()> {
    let config = Arc::new(config);
    let client = redis::Client::open(redis_url)
        .with_context(|| format!("invalid redis url {redis_url:?}"))?;
    let manager_config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(REDIS_CONNECT_TIMEOUT))
        .set_response_timeout(Some(REDIS_RESPONSE_TIMEOUT));
    let mut conn = ConnectionManager::new_with_config(client.clone(), manager_config)
        .await
        .with_context(|| format!("cannot connect to redis at {redis_url}"))?;
    store::ensure_expired_events(&mut conn).await?;
    let store = Store::new(conn, config.ttl);
    store.load_scripts().await.context("cannot load scripts")?;

    let registry = Registry::new(client.clone()).start();
    ExpiryListener::new(client.clone(), store.clone(), config.clone()).start();

    let state = web::Data::new(AppState {
        store,
        registry,
        config: config.clone(),
        next_session: AtomicU64::new(1),
    });
    let addr = listener.local_addr()?;
    let server =
        HttpServer::new(move || App::new().app_data(state.clone()).configure(http::routes))
            .shutdown_timeout(SHUTDOWN_TIMEOUT.as_secs())
            .listen(listener)?
            .run();
    log::info!(
        "node {} listening on http://{addr} (heartbeat {:?}, lease ttl {:?})",
        config.node_id,
        config.heartbeat,
        config.ttl
    );
    server.await?;
    log::info!("node {} stopped", config.node_id);
    Ok(())
}
