//! Device state written straight into Redis, the way a node writes it, for
//! runs and tests that need many live leases without many connections.

/// Writes a live lease for device `d` of users `<prefix>0` .. `<prefix>{n-1}`
/// (lease owned by `owner`, device set, counter and, with `index`, the
/// deadline in `presence-leases`), with a TTL of ten minutes.
pub async fn live_leases(
    conn: &mut redis::aio::MultiplexedConnection,
    prefix: &str,
    n: usize,
    owner: &str,
    index: bool,
) -> redis::RedisResult<()> {
    const TTL_MS: i64 = 600_000;
    let deadline = crate::now_ms() + TTL_MS;
    for start in (0..n).step_by(10_000) {
        let mut pipe = redis::pipe();
        for i in start..(start + 10_000).min(n) {
            let user = format!("{prefix}{i}");
            pipe.cmd("SET")
                .arg(format!("presence:{{{user}}}:d"))
                .arg(owner)
                .arg("PX")
                .arg(TTL_MS)
                .ignore();
            pipe.cmd("SADD")
                .arg(format!("presence-devices:{{{user}}}"))
                .arg("d")
                .ignore();
            pipe.cmd("SET")
                .arg(format!("presence-count:{{{user}}}"))
                .arg(1)
                .ignore();
            if index {
                pipe.cmd("ZADD")
                    .arg("presence-leases")
                    .arg(deadline)
                    .arg(format!("{user}:d"))
                    .ignore();
            }
        }
        pipe.query_async::<()>(conn).await?;
    }
    Ok(())
}

/// Adds users `<prefix>0` .. `<prefix>{n-1}` to `presence-online`, newest
/// first in order, each with its own score; with `show_online`, each
/// user's privacy setting (e.g. `contacts`: hidden from non-contacts).
pub async fn online_index(
    conn: &mut redis::aio::MultiplexedConnection,
    prefix: &str,
    n: usize,
    show_online: Option<&str>,
) -> redis::RedisResult<()> {
    let now = crate::now_ms();
    for start in (0..n).step_by(10_000) {
        let mut pipe = redis::pipe();
        for i in start..(start + 10_000).min(n) {
            let user = format!("{prefix}{i}");
            pipe.cmd("ZADD")
                .arg("presence-online")
                .arg(now - i as i64)
                .arg(&user)
                .ignore();
            if let Some(show) = show_online {
                pipe.cmd("HSET")
                    .arg(format!("presence-status:{{{user}}}"))
                    .arg("show_online")
                    .arg(show)
                    .ignore();
            }
        }
        pipe.query_async::<()>(conn).await?;
    }
    Ok(())
}
