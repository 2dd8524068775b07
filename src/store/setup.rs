//! What start-up checks in Redis before the node serves.

use redis::aio::ConnectionManager;

/// Makes sure Redis announces expired keys (`notify-keyspace-events` with
/// `E` and `x`), enabling them when it can. A Redis that forbids CONFIG and
/// has them off cannot run this server: the error says what to set.
pub async fn ensure_expired_events(conn: &mut ConnectionManager) -> anyhow::Result<()> {
    let current: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("notify-keyspace-events")
        .query_async(conn)
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "cannot read notify-keyspace-events ({e}); set `notify-keyspace-events Ex` in the Redis configuration"
            )
        })?;
    let flags = current.get(1).cloned().unwrap_or_default();
    let has_x = flags.contains('x') || flags.contains('A');
    if flags.contains('E') && has_x {
        return Ok(());
    }
    let mut wanted = flags.clone();
    for f in ['E', 'x'] {
        if !wanted.contains(f) {
            wanted.push(f);
        }
    }
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("notify-keyspace-events")
        .arg(&wanted)
        .query_async::<()>(conn)
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "notify-keyspace-events is {flags:?} and cannot be changed ({e}); set `notify-keyspace-events Ex` in the Redis configuration"
            )
        })?;
    log::warn!("redis had notify-keyspace-events {flags:?}; set it to {wanted:?} so that lapsed leases are announced");
    Ok(())
}
