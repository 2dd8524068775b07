//! Device state written straight into Redis, the way a node writes it, for
//! runs and tests that need many live leases without many connections.

/// Buckets of the indexes in a deployment the bench starts (the server's
/// default).
pub const BUCKETS: u32 = 16;

/// The bucket of `user`, as the server computes it (`keys::Buckets::of`:
/// FNV-1a of the id modulo B); `tests/it/bench_smoke.rs` checks they agree.
pub fn bucket_of(user: &str, buckets: u32) -> u32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in user.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (h % u64::from(buckets)) as u32
}

/// The bucket of `index` (`presence-leases`, `presence-lastseen`) holding
/// `user`'s entries.
pub fn index_key(index: &str, user: &str) -> String {
    format!("{index}:{{b{:02}}}", bucket_of(user, BUCKETS))
}

/// Entries of `index` across all its buckets.
pub async fn index_len(
    conn: &mut redis::aio::MultiplexedConnection,
    index: &str,
) -> redis::RedisResult<u64> {
    let mut pipe = redis::pipe();
    for b in 0..BUCKETS {
        pipe.cmd("ZCARD").arg(format!("{index}:{{b{b:02}}}"));
    }
    let cards: Vec<u64> = pipe.query_async(conn).await?;
    Ok(cards.iter().sum())
}

/// The lease value the bench writes for devices of no node: a lease value
/// of key schema 5 is one integer (what the node writes, see the server's
/// `LeaseOwner`), which Redis keeps inside the key's value object; this one
/// is of run [`LEASE_RUN`], as the device fields say.
pub const LEASE_VALUE: &str = "788529152000000001";
/// The run number in [`LEASE_VALUE`] and in the device fields the bench
/// writes.
pub const LEASE_RUN: u64 = 1;

/// Writes a live lease for device `d` of users `<prefix>0` .. `<prefix>{n-1}`
/// (lease owned by `owner`, device field of the user's hash, counter and, with `index`, the
/// deadline in its bucket of `presence-leases`), with a TTL of ten minutes.
pub async fn live_leases(
    conn: &mut impl redis::aio::ConnectionLike,
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
            pipe.cmd("HSET")
                .arg(format!("presence-status:{{{user}}}"))
                .arg("d:d")
                .arg(LEASE_RUN)
                .ignore();
            pipe.cmd("SET")
                .arg(format!("presence-count:{{{user}}}"))
                .arg(1)
                .ignore();
            if index {
                pipe.cmd("ZADD")
                    .arg(index_key("presence-leases", &user))
                    .arg(deadline)
                    .arg(format!("{user}:d"))
                    .ignore();
            }
        }
        pipe.query_async::<()>(conn).await?;
    }
    Ok(())
}

/// Writes the deadline of device `d` of users `<prefix>0` ..
/// `<prefix>{n-1}` (leases written by [`live_leases`] without `index`) into
/// their buckets of `presence-leases`, which list who is online: newest
/// first in order, each with its own deadline, all within the leases' ten
/// minutes; with `show_online`, each user's privacy setting (e.g.
/// `contacts`: hidden from non-contacts).
pub async fn staggered_deadlines(
    conn: &mut redis::aio::MultiplexedConnection,
    prefix: &str,
    n: usize,
    show_online: Option<&str>,
) -> redis::RedisResult<()> {
    let top = crate::now_ms() + 600_000;
    for start in (0..n).step_by(10_000) {
        let mut pipe = redis::pipe();
        for i in start..(start + 10_000).min(n) {
            let user = format!("{prefix}{i}");
            pipe.cmd("ZADD")
                .arg(index_key("presence-leases", &user))
                .arg(top - i as i64)
                .arg(format!("{user}:d"))
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
