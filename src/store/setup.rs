//! What start-up reads from Redis before the node serves: the deployment's
//! constants. (How it connects, and what it checks of Redis itself, is
//! [`crate::redis`].)

impl super::Store {
    /// Reads the deployment's constants from `presence-meta`, writing the
    /// defaults on the first start of a deployment, and brings an older
    /// deployment's keys to this schema: the unbucketed indexes of schema 1
    /// into their buckets, the device sets of schemas 1 and 2 into the
    /// users' hashes; the online index of schemas 1 to 3 is deleted (the
    /// deadlines list who is online). Returns this store with the
    /// deployment's buckets.
    ///
    /// Nodes of an older version must be stopped first: they would go on
    /// writing the old keys (and one started afterwards refuses to run on
    /// the newer schema).
    pub async fn load_deployment(self) -> super::StoreResult<Self> {
        use super::StoreError;
        use crate::keys::{self, Buckets};
        let mut conn = self.conn();
        let mut pipe = redis::pipe();
        pipe.cmd("HSETNX")
            .arg(keys::META)
            .arg("buckets")
            .arg(keys::DEFAULT_BUCKETS);
        pipe.cmd("HGET").arg(keys::META).arg("buckets");
        pipe.cmd("HGET").arg(keys::META).arg("schema");
        // The key of the online list's cursors, the same on every node:
        // the first node to start writes it.
        let secret: [u8; 32] = rand::random();
        pipe.cmd("HSETNX")
            .arg(keys::META)
            .arg("cursor-key")
            .arg(&secret[..])
            .ignore();
        pipe.cmd("HGET").arg(keys::META).arg("cursor-key");
        let (created, buckets, schema, secret): (bool, String, Option<u32>, Vec<u8>) =
            pipe.query_async(&mut conn).await?;
        if secret.len() != 32 {
            return Err(StoreError::reply(
                keys::META,
                format!("cursor-key has {} bytes, not 32", secret.len()),
            ));
        }
        let cursor_key = std::sync::Arc::new(super::cursor::CursorKey::new(&secret));
        let buckets = buckets.parse().ok().and_then(Buckets::new).ok_or_else(|| {
            StoreError::reply(
                keys::META,
                format!("buckets = {buckets:?}, not 1 to {}", keys::MAX_BUCKETS),
            )
        })?;
        let store = Self {
            cursor_key,
            fresh: created,
            ..self.with_buckets(buckets)
        };
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
            old => {
                if old.is_none_or(|v| v < 2) {
                    store.move_v1_indexes().await?;
                }
                if old.is_none_or(|v| v < 3) {
                    store.move_v2_device_sets().await?;
                }
                if old.is_none_or(|v| v < 4) {
                    store.drop_v3_online_index().await?;
                    store.fold_v3_active().await?;
                }
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

    /// Starts this node's run: claims a run number no live node holds,
    /// at random among 1 to [`crate::keys::MAX_RUN`], by taking
    /// `presence-run:<run>` for `hold` in the node's name, as a short lock
    /// is taken ([`Self::hold_lock`]); the node renews it
    /// ([`Self::keep_run`]). The devices this node holds carry the number
    /// in their field of the user's hash and in their lease values, so that
    /// any node can tell which node holds a device, and two live nodes'
    /// lease values never meet. Returns this store with it.
    pub async fn begin_run(
        self,
        node: &str,
        hold: std::time::Duration,
    ) -> super::StoreResult<Self> {
        use crate::keys;
        const TRIES: usize = 64;
        for _ in 0..TRIES {
            let run = rand::random_range(1..=keys::MAX_RUN);
            if self.hold_lock(&keys::run(run), node, hold).await? {
                return Ok(Self { run, ..self });
            }
        }
        Err(super::StoreError::reply(
            "presence-run",
            format!(
                "no free run number in {TRIES} tries of 1 to {}",
                keys::MAX_RUN
            ),
        ))
    }

    /// Renews this node's run record for `hold` (see [`Self::begin_run`]),
    /// writing it back if it lapsed or Redis lost it: the short lock's
    /// take-or-keep ([`Self::hold_lock`]). False when another node holds
    /// the number now (this node's record lapsed, e.g. while it was frozen,
    /// and another node claimed it): the record is left to that node.
    pub async fn keep_run(
        &self,
        node: &str,
        hold: std::time::Duration,
    ) -> super::StoreResult<bool> {
        self.hold_lock(&crate::keys::run(self.run), node, hold)
            .await
    }

    /// Deletes the online index of schemas 1 to 3 (`presence-online`, and
    /// its buckets `presence-online:{b<k>}`): since schema 4 the online
    /// list reads `presence-leases:{b<k>}`, which holds the same users.
    /// Idempotent, and safe to run on several nodes at once.
    async fn drop_v3_online_index(&self) -> super::StoreResult<()> {
        use crate::keys;
        let mut pipe = redis::pipe();
        pipe.del(keys::V1_ONLINE);
        for bucket in self.buckets.all() {
            pipe.del(keys::v3_online(bucket));
        }
        let deleted: Vec<i64> = pipe.query_async(&mut self.conn()).await?;
        let deleted: i64 = deleted.iter().sum();
        if deleted > 0 {
            log::info!("deleted {deleted} keys of the online index of schema 3 (schema 4 lists who is online from presence-leases)");
        }
        Ok(())
    }

    /// Folds every user's schema-3 `active` field (its last refresh) into
    /// `seq` (`fold_active.lua`, one user at a time and atomically), on
    /// every data node: since schema 4, `seq` is raised to every refresh
    /// and dates the user's last activity. Safe to run on several nodes at
    /// once.
    async fn fold_v3_active(&self) -> super::StoreResult<()> {
        use crate::keys;
        let (_, folded) = self
            .migrate_each_user(keys::STATUS_PATTERN, keys::parse_status, |pipe, user| {
                self.scripts.fold_active(pipe, user);
            })
            .await?;
        if folded > 0 {
            log::info!("folded the last refresh of {folded} users into their seq (schema 4)");
        }
        Ok(())
    }

    /// Moves every schema-2 device set (`presence-devices:{<user>}`) into
    /// the user's hash as `d:<device>` fields, one user at a time and
    /// atomically for each (`migrate_devices.lua`), on every data node.
    /// Safe to run on several nodes at once.
    async fn move_v2_device_sets(&self) -> super::StoreResult<()> {
        use crate::keys;
        let (users, moved) = self
            .migrate_each_user(
                keys::V2_DEVICES_PATTERN,
                keys::parse_v2_devices,
                |pipe, user| {
                    self.scripts.migrate_devices(pipe, user);
                },
            )
            .await?;
        if users > 0 {
            log::info!("moved {moved} devices of {users} users from their device sets into their hashes (schema 3)");
        }
        Ok(())
    }

    /// Runs one per-user migration script (`step` adds it to a pipeline)
    /// for every user with a key matching `pattern`, on every data node.
    /// Returns how many users it ran for and the sum of the scripts'
    /// integer replies.
    async fn migrate_each_user(
        &self,
        pattern: &str,
        user_of: fn(&str) -> Option<&str>,
        step: impl Fn(&mut redis::Pipeline, &str),
    ) -> super::StoreResult<(usize, i64)> {
        let (mut users, mut sum) = (0usize, 0i64);
        for node in self.data_nodes().await? {
            let mut cursor = 0u64;
            loop {
                let (next, found) = self
                    .scan_users(&node, cursor, pattern, 1000, user_of)
                    .await?;
                let mut pipe = redis::pipe();
                for user in &found {
                    step(&mut pipe, user);
                }
                users += found.len();
                if !pipe.is_empty() {
                    for n in self.query(&pipe).await? {
                        sum += redis::from_redis_value_ref::<i64>(&n)?;
                    }
                }
                cursor = next;
                if cursor == 0 {
                    break;
                }
            }
        }
        Ok((users, sum))
    }

    /// One SCAN step on `node` over the keys matching `pattern` (`count`
    /// as the hint): the next cursor, and the users of the keys found
    /// (`user_of` each key; keys it does not parse are skipped).
    pub(super) async fn scan_users(
        &self,
        node: &crate::redis::conn::NodeAddr,
        cursor: u64,
        pattern: &str,
        count: usize,
        user_of: fn(&str) -> Option<&str>,
    ) -> super::StoreResult<(u64, Vec<String>)> {
        let mut scan = redis::cmd("SCAN");
        scan.arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(count);
        let (next, found): (u64, Vec<String>) =
            redis::from_redis_value(self.conn.query_on(node, &scan).await?)?;
        let users = found
            .iter()
            .filter_map(|k| user_of(k))
            .map(str::to_string)
            .collect();
        Ok((next, users))
    }

    /// Moves every entry of the schema-1 indexes (`presence-lastseen`,
    /// `presence-leases`, one key each) into the buckets, keeping the newer
    /// score where both have one, then deletes them. Safe to run on several
    /// nodes at once.
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
