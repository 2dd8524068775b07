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

impl super::Store {
    /// Reads the deployment's constants from `presence-meta`, writing the
    /// defaults on the first start of a deployment, and moves the
    /// unbucketed indexes of schema 1 into their buckets. Returns this
    /// store with the deployment's buckets.
    pub async fn load_deployment(self) -> super::StoreResult<Self> {
        use super::StoreError;
        use crate::keys::{self, Buckets};
        let mut conn = self.conn();
        let mut pipe = redis::pipe();
        pipe.cmd("HSETNX")
            .arg(keys::META)
            .arg("buckets")
            .arg(keys::DEFAULT_BUCKETS)
            .ignore();
        pipe.cmd("HGET").arg(keys::META).arg("buckets");
        pipe.cmd("HGET").arg(keys::META).arg("schema");
        let (buckets, schema): (String, Option<u32>) = pipe.query_async(&mut conn).await?;
        let buckets = buckets.parse().ok().and_then(Buckets::new).ok_or_else(|| {
            StoreError::reply(
                keys::META,
                format!("buckets = {buckets:?}, not 1 to {}", keys::MAX_BUCKETS),
            )
        })?;
        let store = self.with_buckets(buckets);
        match schema {
            Some(v) if v == keys::SCHEMA_VERSION => {}
            Some(v) if v > keys::SCHEMA_VERSION => {
                return Err(StoreError::reply(
                    keys::META,
                    format!(
                        "schema {v} is newer than this server's {}; upgrade the server",
                        keys::SCHEMA_VERSION
                    ),
                ))
            }
            _ => {
                store.move_v1_indexes().await?;
                redis::cmd("HSET")
                    .arg(keys::META)
                    .arg("schema")
                    .arg(keys::SCHEMA_VERSION)
                    .query_async::<()>(&mut conn)
                    .await?;
            }
        }
        Ok(store)
    }

    /// Moves every entry of the schema-1 indexes (`presence-online`,
    /// `presence-lastseen`, `presence-leases`, one key each) into the
    /// buckets, keeping the newer score where both have one, then deletes
    /// them. Safe to run on several nodes at once.
    async fn move_v1_indexes(&self) -> super::StoreResult<()> {
        use crate::keys;
        let mut conn = self.conn();
        for old in keys::V1_INDEXES {
            let mut cursor = 0u64;
            let mut moved = 0usize;
            loop {
                let (next, flat): (u64, Vec<String>) = redis::cmd("ZSCAN")
                    .arg(old)
                    .arg(cursor)
                    .arg("COUNT")
                    .arg(1000)
                    .query_async(&mut conn)
                    .await?;
                let mut pipe = redis::pipe();
                for pair in flat.chunks(2) {
                    let [member, score] = pair else { continue };
                    let user = match old {
                        "presence-leases" => keys::parse_lease_member(member).map(|(u, _)| u),
                        _ => Some(member.as_str()),
                    };
                    let Some(user) = user else { continue };
                    let bucket = self.buckets.of(user);
                    let key = match old {
                        "presence-online" => keys::online(bucket),
                        "presence-lastseen" => keys::last_seen(bucket),
                        _ => keys::leases(bucket),
                    };
                    pipe.cmd("ZADD")
                        .arg(key)
                        .arg("GT")
                        .arg(score)
                        .arg(member)
                        .ignore();
                    moved += 1;
                }
                if !pipe.is_empty() {
                    self.query(&pipe).await?;
                }
                cursor = next;
                if cursor == 0 {
                    break;
                }
            }
            if moved > 0 {
                log::info!(
                    "moved {moved} entries of {old} into {} buckets",
                    self.buckets.count()
                );
            }
            redis::cmd("DEL")
                .arg(old)
                .query_async::<()>(&mut conn)
                .await?;
        }
        Ok(())
    }
}
