//! One Redis server (or a Sentinel group's primary): connecting within
//! [`START_TIMEOUT`], and the start-up checks (version, eviction policy,
//! expired-key events) with errors that name the host and never the
//! password.

use std::sync::Arc;

use anyhow::Context as _;
use redis::RedisError;

use super::health::{
    ensure_expired_events, eviction_warning, info_field, parse_version, read_policy,
};
use super::{PrimaryConn, RedisHealth, RedisOptions, RedisSource, MIN_VERSION, START_TIMEOUT};

pub struct Redis {
    /// Clients for the pub/sub connections.
    pub source: RedisSource,
    /// The command connection, for the store's `RedisConn`.
    pub conn: PrimaryConn,
    /// The cached state behind `/healthz`.
    pub health: Arc<RedisHealth>,
}

/// Connects and runs the start-up checks, within [`START_TIMEOUT`] for the
/// connection; then starts the health checker. Errors name the target
/// without its password.
pub async fn connect(opts: &RedisOptions, node: &str) -> anyhow::Result<Redis> {
    let source = RedisSource::new(opts)?;
    let target = source.display().to_string();
    let manager = match tokio::time::timeout(START_TIMEOUT, source.manager()).await {
        Ok(Ok(manager)) => manager,
        Ok(Err(e)) => return Err(connect_error(&source, &e)),
        Err(_) => {
            anyhow::bail!("cannot connect to Redis at {target}: no answer within {START_TIMEOUT:?}")
        }
    };
    let mut conn = PrimaryConn::new(manager, &source);

    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut conn)
        .await
        .with_context(|| format!("Redis at {target} refused INFO (the ACL user needs +info)"))?;
    let version = info_field(&info, "redis_version")
        .unwrap_or("unknown")
        .to_string();
    match parse_version(&version) {
        Some(v) if v >= MIN_VERSION => {}
        _ => anyhow::bail!(
            "Redis at {target} is version {version}; this server needs Redis {}.{} or newer",
            MIN_VERSION.0,
            MIN_VERSION.1
        ),
    }
    let policy = read_policy(&mut conn).await.unwrap_or_else(|e| {
        log::warn!("cannot read maxmemory-policy from INFO memory: {e}");
        "unknown".to_string()
    });
    if let Some(warning) = eviction_warning(&policy) {
        log::warn!("{warning}");
    }
    let events = ensure_expired_events(&source, &mut conn, node).await?;
    log::info!(
        "redis {version} at {target}: maxmemory-policy {policy}, expired-key events {}",
        events.describe()
    );
    let health = RedisHealth::watch_with_policy(target, version, events, policy, conn.clone());
    Ok(Redis {
        source,
        conn,
        health,
    })
}

/// A start-up connection error that says what kind of problem it is and
/// names the target (without its password).
fn connect_error(source: &RedisSource, e: &RedisError) -> anyhow::Error {
    let target = source.display();
    let text = e.to_string();
    let lower = text.to_ascii_lowercase();
    if source.inner.tls
        && [
            "certificate",
            "unknownissuer",
            "notvalidforname",
            "handshake",
            "tls",
            "alert",
        ]
        .iter()
        .any(|w| lower.contains(w))
    {
        anyhow::anyhow!(
            "cannot connect to Redis at {target}: TLS certificate problem ({text}); check that the server's certificate is signed by a CA you trust (--redis-tls-ca-file for a private CA) and names the host you connect to"
        )
    } else if e.kind() == redis::ErrorKind::AuthenticationFailed
        || matches!(e.code(), Some("WRONGPASS" | "NOAUTH" | "NOPERM"))
    {
        anyhow::anyhow!("Redis at {target} refused the credentials: {text}")
    } else {
        anyhow::anyhow!("cannot connect to Redis at {target}: {text}")
    }
}
