//! Every Redis read and write of the server: the atomic per-user steps (Lua
//! scripts beside this file) and the global sorted sets updated beside them.
//!
//! One [`ConnectionManager`] is created at start and cloned into every actor;
//! it multiplexes all commands over one connection and reconnects by itself.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::aio::ConnectionManager;
use redis::{Pipeline, RedisError, Script, Value};

use crate::keys;
use crate::protocol::{Record, Status};

/// A failed Redis operation.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Redis refused the command or could not be reached.
    #[error("redis: {0}")]
    Redis(#[from] RedisError),
    /// Redis answered something the scripts never return.
    #[error("unexpected reply from redis: {0}")]
    Parse(#[from] redis::ParsingError),
    /// Redis answered something the scripts never return.
    #[error("unexpected reply from redis: {0}")]
    Reply(String),
}

/// Result of a Redis operation.
pub type StoreResult<T> = Result<T, StoreError>;

/// How [`Store::arrive`] treats a lease held by another connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArriveMode {
    /// A new connection: take the lease over from any older one.
    Connect,
    /// A live connection: keep the lease only while it is still ours.
    Refresh,
}

/// Outcome of [`Store::arrive`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// The lease belongs to this connection; `came_online` when this call
    /// made the user's first device arrive (and published `online`).
    Held {
        /// The user was offline before.
        came_online: bool,
    },
    /// Another connection took this device over; this one should close.
    Replaced,
}

/// Outcome of the departure step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Departure {
    /// A lease still exists (not lapsed, or another connection's); it has
    /// this many ms left (`None`: no TTL).
    Leased {
        /// Remaining TTL in ms.
        ttl_ms: Option<u64>,
    },
    /// This call removed the device; `last_seen` is set when it was the
    /// user's last device (and `offline` was published).
    Removed {
        /// Last-seen time published with `offline`, epoch ms.
        last_seen: Option<i64>,
    },
    /// The device had already been removed.
    AlreadyGone,
}

/// One live device of a user, as shown by `GET /api/presence/{user}`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DeviceInfo {
    /// Device id.
    pub device: String,
    /// Node holding the connection.
    pub node: Option<String>,
    /// When the connection was made, epoch ms.
    pub connected_at: Option<i64>,
    /// Remaining lease TTL in ms.
    pub expires_in_ms: Option<i64>,
}

/// One page of `GET /api/online`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct OnlinePage {
    /// Users online now, most recently active first.
    pub users: Vec<OnlineUser>,
    /// Pass back as `cursor` for the next page; `None` on the last one.
    pub next_cursor: Option<String>,
}

/// One entry of [`OnlinePage`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct OnlineUser {
    /// The user's record.
    #[serde(flatten)]
    pub record: Record,
    /// Last refresh of any of the user's devices, epoch ms.
    pub active_at: i64,
}

/// The scripts, loaded once; invoked by SHA inside pipelines.
struct Scripts {
    arrive: Script,
    depart: Script,
    status: Script,
    zrem_if: Script,
}

/// Handle on the shared Redis state; cheap to clone.
#[derive(Clone)]
pub struct Store {
    conn: ConnectionManager,
    scripts: Arc<Scripts>,
    ttl_ms: u64,
}

/// Now, in epoch ms (the unit of every timestamp in Redis and on the wire).
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Adds an EVALSHA of `script` to `pipe`.
/// Chain the script's arguments with `.arg()`.
fn eval<'p>(pipe: &'p mut Pipeline, script: &Script, keys: &[&str]) -> &'p mut Pipeline {
    pipe.cmd("EVALSHA")
        .arg(script.get_hash())
        .arg(keys.len())
        .arg(keys)
}

fn int(v: &Value) -> StoreResult<i64> {
    redis::from_redis_value_ref(v).map_err(|_| StoreError::Reply(format!("{v:?}")))
}

impl Store {
    /// Wraps a connection; `ttl` is the device lease TTL.
    pub fn new(conn: ConnectionManager, ttl: Duration) -> Self {
        let scripts = Scripts {
            arrive: Script::new(include_str!("lua/arrive.lua")),
            depart: Script::new(include_str!("lua/depart.lua")),
            status: Script::new(include_str!("lua/status.lua")),
            zrem_if: Script::new(include_str!("lua/zrem_if.lua")),
        };
        Self {
            conn,
            scripts: Arc::new(scripts),
            ttl_ms: ttl.as_millis() as u64,
        }
    }

    /// The lease TTL in ms.
    pub fn ttl_ms(&self) -> u64 {
        self.ttl_ms
    }

    /// A clone of the shared connection, for one-off commands.
    pub fn conn(&self) -> ConnectionManager {
        self.conn.clone()
    }

    /// Runs `pipe`; when Redis has forgotten the scripts (restart, SCRIPT
    /// FLUSH) loads them and runs it once more. Every script is idempotent
    /// in the step that failed, because NOSCRIPT means it did not run.
    async fn query(&self, pipe: &Pipeline) -> StoreResult<Vec<Value>> {
        let mut conn = self.conn.clone();
        match pipe.query_async::<Vec<Value>>(&mut conn).await {
            Err(e) if e.code() == Some("NOSCRIPT") => {
                self.load_scripts().await?;
                Ok(pipe.query_async(&mut conn).await?)
            }
            other => Ok(other?),
        }
    }

    /// Loads every script into Redis's script cache.
    pub async fn load_scripts(&self) -> StoreResult<()> {
        let mut conn = self.conn.clone();
        let s = &self.scripts;
        for script in [&s.arrive, &s.depart, &s.status, &s.zrem_if] {
            script.prepare_invoke().load_async(&mut conn).await?;
        }
        Ok(())
    }

    /// Claims (connect) or refreshes (refresh) a device lease, counting the
    /// device if it is new; publishes `online` for the user's first device.
    /// `owner` is the connection's lease value.
    pub async fn arrive(
        &self,
        user: &str,
        device: &str,
        owner: &str,
        mode: ArriveMode,
    ) -> StoreResult<(Arrival, i64)> {
        let now = now_ms();
        let deadline = now + self.ttl_ms as i64;
        let [lease, count, devices, status] = keys::device_keys(user, device);
        let mode_arg = match mode {
            ArriveMode::Connect => "connect",
            ArriveMode::Refresh => "refresh",
        };
        let mut pipe = redis::pipe();
        eval(
            &mut pipe,
            &self.scripts.arrive,
            &[&lease, &count, &devices, &status],
        )
        .arg(owner)
        .arg(self.ttl_ms)
        .arg(device)
        .arg(now)
        .arg(mode_arg)
        .arg(user)
        .arg(keys::EVENTS);
        pipe.zadd(keys::LEASES, keys::lease_member(user, device), deadline)
            .ignore();
        pipe.cmd("ZADD")
            .arg(keys::ONLINE)
            .arg("GT")
            .arg(now)
            .arg(user)
            .ignore();
        let reply = self.query(&pipe).await?;
        let (held, came_online) = match reply.first() {
            Some(Value::Array(v)) if v.len() == 2 => (int(&v[0])?, int(&v[1])?),
            other => return Err(StoreError::Reply(format!("arrive: {other:?}"))),
        };
        let arrival = if held == 1 {
            Arrival::Held {
                came_online: came_online == 1,
            }
        } else {
            Arrival::Replaced
        };
        Ok((arrival, deadline))
    }

    /// The departure step for one device. `owner` is the closing
    /// connection's lease value with the deadline it last wrote to
    /// `presence-leases`; `None` when the lease lapsed (expired event or
    /// deadline pass).
    pub async fn depart(
        &self,
        user: &str,
        device: &str,
        owner: Option<(&str, i64)>,
    ) -> StoreResult<Departure> {
        let [lease, count, devices, status] = keys::device_keys(user, device);
        let mut pipe = redis::pipe();
        eval(
            &mut pipe,
            &self.scripts.depart,
            &[&lease, &count, &devices, &status],
        )
        .arg(owner.map_or("", |(o, _)| o))
        .arg(device)
        .arg(now_ms())
        .arg(user)
        .arg(keys::EVENTS);
        if let Some((_, deadline)) = owner {
            // Our own deadline only: a newer connection's entry stays.
            eval(&mut pipe, &self.scripts.zrem_if, &[keys::LEASES])
                .arg(keys::lease_member(user, device))
                .arg(deadline)
                .ignore();
        }
        let reply = self.query(&pipe).await?;
        let departure = parse_departure(reply.first())?;
        if let Departure::Removed {
            last_seen: Some(ts),
        } = departure
        {
            self.record_offline(user, ts).await?;
        }
        Ok(departure)
    }

    /// Updates the global sets after a user's last device left.
    async fn record_offline(&self, user: &str, last_seen: i64) -> StoreResult<()> {
        let mut pipe = redis::pipe();
        pipe.cmd("ZADD")
            .arg(keys::LAST_SEEN)
            .arg("GT")
            .arg(last_seen)
            .arg(user)
            .ignore();
        pipe.zrem(keys::ONLINE, user).ignore();
        self.query(&pipe).await?;
        Ok(())
    }

    /// Sets a user's status and text; publishes it when the user is online.
    pub async fn set_status(
        &self,
        user: &str,
        status: Status,
        text: Option<&str>,
    ) -> StoreResult<bool> {
        let mut pipe = redis::pipe();
        eval(
            &mut pipe,
            &self.scripts.status,
            &[&keys::status(user), &keys::count(user)],
        )
        .arg(status.as_str())
        .arg(text.unwrap_or(""))
        .arg(now_ms())
        .arg(user)
        .arg(keys::EVENTS);
        let reply = self.query(&pipe).await?;
        Ok(int(reply.first().unwrap_or(&Value::Nil))? == 1)
    }

    /// The records of `users`, in order, each with its transition sequence
    /// number (for dropping events a snapshot already reflects).
    pub async fn records(&self, users: &[String]) -> StoreResult<Vec<(Record, u64)>> {
        if users.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for user in users {
            pipe.get(keys::count(user));
            pipe.cmd("HMGET")
                .arg(keys::status(user))
                .arg(&["status", "text", "seq"]);
            pipe.zscore(keys::LAST_SEEN, user);
        }
        let reply = self.query(&pipe).await?;
        let mut out = Vec::with_capacity(users.len());
        for (user, chunk) in users.iter().zip(reply.chunks(3)) {
            let count: Option<i64> = redis::from_redis_value_ref(&chunk[0])?;
            let (status, text, seq): (Option<String>, Option<String>, Option<u64>) =
                redis::from_redis_value_ref(&chunk[1])?;
            let last_seen: Option<f64> = redis::from_redis_value_ref(&chunk[2])?;
            let devices = count.unwrap_or(0).max(0) as u32;
            let record = if devices > 0 {
                Record {
                    user: user.clone(),
                    status: status.unwrap_or_else(|| "online".into()),
                    devices,
                    last_seen: None,
                    text,
                }
            } else {
                Record {
                    user: user.clone(),
                    status: "offline".into(),
                    devices: 0,
                    last_seen: last_seen.map(|s| s as i64),
                    text,
                }
            };
            out.push((record, seq.unwrap_or(0)));
        }
        Ok(out)
    }

    /// The live devices of `user`, sorted by device id.
    pub async fn devices(&self, user: &str) -> StoreResult<Vec<DeviceInfo>> {
        let mut conn = self.conn.clone();
        let mut ids: Vec<String> = redis::cmd("SMEMBERS")
            .arg(keys::devices(user))
            .query_async(&mut conn)
            .await?;
        ids.sort();
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for device in &ids {
            pipe.get(keys::lease(user, device));
            pipe.pttl(keys::lease(user, device));
        }
        let reply = self.query(&pipe).await?;
        let mut out = Vec::with_capacity(ids.len());
        for (device, chunk) in ids.into_iter().zip(reply.chunks(2)) {
            let owner: Option<String> = redis::from_redis_value_ref(&chunk[0])?;
            let pttl: i64 = redis::from_redis_value_ref(&chunk[1])?;
            let lease = owner.as_deref().map(LeaseOwner::parse);
            out.push(DeviceInfo {
                device,
                node: lease.as_ref().map(|l| l.node.to_string()),
                connected_at: lease.and_then(|l| l.connected_at),
                expires_in_ms: (pttl >= 0).then_some(pttl),
            });
        }
        Ok(out)
    }

    /// One page of users online now, most recently active first. `cursor` is
    /// the `next_cursor` of the previous page.
    pub async fn online(&self, limit: usize, cursor: Option<&Cursor>) -> StoreResult<OnlinePage> {
        let mut conn = self.conn.clone();
        let mut users: Vec<(String, i64)> = Vec::with_capacity(limit);
        let max = cursor.map_or("+inf".to_string(), |c| c.active_at.to_string());
        let mut offset = 0usize;
        let batch = limit + 1;
        let mut exhausted = false;
        // Entries tied with the cursor's score that come before it in the
        // (descending) order are skipped; stale entries of users no longer
        // online are dropped by the record check below.
        while users.len() <= limit && !exhausted {
            let page: Vec<(String, f64)> = redis::cmd("ZRANGE")
                .arg(keys::ONLINE)
                .arg(&max)
                .arg("-inf")
                .arg("BYSCORE")
                .arg("REV")
                .arg("LIMIT")
                .arg(offset)
                .arg(batch)
                .arg("WITHSCORES")
                .query_async(&mut conn)
                .await?;
            exhausted = page.len() < batch;
            offset += page.len();
            let candidates: Vec<(String, i64)> = page
                .into_iter()
                .map(|(u, s)| (u, s as i64))
                .filter(|(u, s)| match cursor {
                    Some(c) => *s < c.active_at || (*s == c.active_at && *u < c.user),
                    None => true,
                })
                .collect();
            let names: Vec<String> = candidates.iter().map(|(u, _)| u.clone()).collect();
            let records = self.records(&names).await?;
            for ((user, score), (record, _)) in candidates.into_iter().zip(records) {
                if record.devices > 0 {
                    users.push((user, score));
                }
            }
        }
        let next_cursor = if users.len() > limit {
            users.truncate(limit);
            users.last().map(|(u, s)| {
                Cursor {
                    active_at: *s,
                    user: u.clone(),
                }
                .encode()
            })
        } else {
            None
        };
        let names: Vec<String> = users.iter().map(|(u, _)| u.clone()).collect();
        let records = self.records(&names).await?;
        let users = records
            .into_iter()
            .zip(users)
            .map(|((record, _), (_, active_at))| OnlineUser { record, active_at })
            .collect();
        Ok(OnlinePage { users, next_cursor })
    }

    /// Takes or keeps the deadline-pass lock for `hold`; true when this
    /// node holds it.
    pub async fn hold_reaper_lock(&self, node: &str, hold: Duration) -> StoreResult<bool> {
        let mut conn = self.conn.clone();
        let ms = hold.as_millis() as u64;
        let taken: Option<String> = redis::cmd("SET")
            .arg(keys::REAPER_LOCK)
            .arg(node)
            .arg("NX")
            .arg("PX")
            .arg(ms)
            .query_async(&mut conn)
            .await?;
        if taken.is_some() {
            return Ok(true);
        }
        let holder: Option<String> = redis::cmd("GET")
            .arg(keys::REAPER_LOCK)
            .query_async(&mut conn)
            .await?;
        if holder.as_deref() == Some(node) {
            let _: i64 = redis::cmd("PEXPIRE")
                .arg(keys::REAPER_LOCK)
                .arg(ms)
                .query_async(&mut conn)
                .await?;
            return Ok(true);
        }
        Ok(false)
    }

    /// One step of the deadline pass: runs the departure step for up to
    /// `max` leases whose deadline in `presence-leases` has passed. Reading
    /// each lapsed lease makes Redis delete it and fire `expired` at once;
    /// the step itself removes the device, so the pass is correct even when
    /// no listener hears the event. Returns (leases looked at, devices removed).
    pub async fn reap_due(&self, max: usize) -> StoreResult<(usize, usize)> {
        let mut conn = self.conn.clone();
        let now = now_ms();
        let due: Vec<(String, String)> = redis::cmd("ZRANGE")
            .arg(keys::LEASES)
            .arg("-inf")
            .arg(now)
            .arg("BYSCORE")
            .arg("LIMIT")
            .arg(0)
            .arg(max)
            .arg("WITHSCORES")
            .query_async(&mut conn)
            .await?;
        if due.is_empty() {
            return Ok((0, 0));
        }
        let mut pipe = redis::pipe();
        for (member, _) in &due {
            match keys::parse_lease_member(member) {
                Some((user, device)) => {
                    let [lease, count, devices, status] = keys::device_keys(user, device);
                    eval(
                        &mut pipe,
                        &self.scripts.depart,
                        &[&lease, &count, &devices, &status],
                    )
                    .arg("")
                    .arg(device)
                    .arg(now)
                    .arg(user)
                    .arg(keys::EVENTS);
                }
                // Not ours to interpret: drop it from the index below.
                None => {
                    pipe.cmd("ECHO").arg("unparsable");
                }
            }
        }
        let reply = self.query(&pipe).await?;
        let mut removed = 0;
        let mut follow = redis::pipe();
        for ((member, score), value) in due.iter().zip(&reply) {
            let departure = match keys::parse_lease_member(member) {
                Some(_) => parse_departure(Some(value))?,
                None => Departure::AlreadyGone,
            };
            match departure {
                Departure::Leased { ttl_ms } => {
                    let left = ttl_ms.unwrap_or(self.ttl_ms) as i64;
                    follow
                        .cmd("ZADD")
                        .arg(keys::LEASES)
                        .arg("XX")
                        .arg(now + left)
                        .arg(member)
                        .ignore();
                }
                Departure::Removed { last_seen } => {
                    removed += 1;
                    if let (Some(ts), Some((user, _))) =
                        (last_seen, keys::parse_lease_member(member))
                    {
                        follow
                            .cmd("ZADD")
                            .arg(keys::LAST_SEEN)
                            .arg("GT")
                            .arg(ts)
                            .arg(user)
                            .ignore();
                        follow.zrem(keys::ONLINE, user).ignore();
                    }
                    eval(&mut follow, &self.scripts.zrem_if, &[keys::LEASES])
                        .arg(member)
                        .arg(score)
                        .ignore();
                }
                Departure::AlreadyGone => {
                    eval(&mut follow, &self.scripts.zrem_if, &[keys::LEASES])
                        .arg(member)
                        .arg(score)
                        .ignore();
                }
            }
        }
        self.query(&follow).await?;
        Ok((due.len(), removed))
    }

    /// Forgets users offline for longer than `retention`: their last-seen
    /// entry, and their status hash when no device came back. Returns how
    /// many were forgotten (at most `max` per call).
    pub async fn trim_last_seen(&self, retention: Duration, max: usize) -> StoreResult<usize> {
        let mut conn = self.conn.clone();
        let cutoff = now_ms() - retention.as_millis() as i64;
        let old: Vec<(String, String)> = redis::cmd("ZRANGE")
            .arg(keys::LAST_SEEN)
            .arg("-inf")
            .arg(cutoff)
            .arg("BYSCORE")
            .arg("LIMIT")
            .arg(0)
            .arg(max)
            .arg("WITHSCORES")
            .query_async(&mut conn)
            .await?;
        if old.is_empty() {
            return Ok(0);
        }
        let mut pipe = redis::pipe();
        for (user, score) in &old {
            eval(&mut pipe, &self.scripts.zrem_if, &[keys::LAST_SEEN])
                .arg(user)
                .arg(score);
        }
        let reply = self.query(&pipe).await?;
        let mut forget = redis::pipe();
        let mut forgotten = 0;
        for ((user, _), removed) in old.iter().zip(&reply) {
            if int(removed)? == 1 {
                forgotten += 1;
                // Only when offline: a user online again keeps its status.
                forget
                    .cmd("EVAL")
                    .arg("if redis.call('EXISTS', KEYS[2]) == 0 then return redis.call('DEL', KEYS[1]) end return 0")
                    .arg(2)
                    .arg(keys::status(user))
                    .arg(keys::count(user))
                    .ignore();
            }
        }
        self.query(&forget).await?;
        Ok(forgotten)
    }

    /// PING, for `/healthz`.
    pub async fn ping(&self) -> StoreResult<()> {
        let mut conn = self.conn.clone();
        let _: String = redis::cmd("PING").query_async(&mut conn).await?;
        Ok(())
    }
}

fn parse_departure(value: Option<&Value>) -> StoreResult<Departure> {
    let v = match value {
        Some(Value::Array(v)) if v.len() == 3 => v,
        other => return Err(StoreError::Reply(format!("depart: {other:?}"))),
    };
    let (outcome, went_offline, value) = (int(&v[0])?, int(&v[1])?, int(&v[2])?);
    Ok(match outcome {
        0 => Departure::Leased {
            ttl_ms: (value >= 0).then_some(value as u64),
        },
        1 => Departure::Removed {
            last_seen: (went_offline == 1).then_some(value),
        },
        _ => Departure::AlreadyGone,
    })
}

/// The value of a lease: which node and connection own it, since when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseOwner<'a> {
    /// Node id.
    pub node: &'a str,
    /// Connection id, unique per node run.
    pub conn: &'a str,
    /// When the connection was made, epoch ms.
    pub connected_at: Option<i64>,
}

impl<'a> LeaseOwner<'a> {
    /// Formats a lease value.
    pub fn format(node: &str, conn: &str, connected_at: i64) -> String {
        format!("{node} {conn} {connected_at}")
    }

    /// Reads a lease value back; unknown shapes give an empty connection.
    pub fn parse(value: &'a str) -> Self {
        let mut parts = value.splitn(3, ' ');
        Self {
            node: parts.next().unwrap_or(""),
            conn: parts.next().unwrap_or(""),
            connected_at: parts.next().and_then(|s| s.parse().ok()),
        }
    }
}

/// Position in `GET /api/online`: the last user of the previous page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    /// That user's score (last refresh, epoch ms).
    pub active_at: i64,
    /// That user.
    pub user: String,
}

impl Cursor {
    /// The opaque string handed to clients: `<active_at>.<user>`.
    pub fn encode(&self) -> String {
        format!("{}.{}", self.active_at, self.user)
    }

    /// Reads a cursor back; `None` when it is not one of ours.
    pub fn decode(s: &str) -> Option<Self> {
        let (at, user) = s.split_once('.')?;
        crate::ids::validate("user", user).ok()?;
        Some(Self {
            active_at: at.parse().ok()?,
            user: user.to_string(),
        })
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_owner_round_trips() {
        let v = LeaseOwner::format("n1", "c42", 1700);
        let o = LeaseOwner::parse(&v);
        assert_eq!((o.node, o.conn, o.connected_at), ("n1", "c42", Some(1700)));
        assert_eq!(LeaseOwner::parse("junk").conn, "");
    }

    #[test]
    fn cursor_round_trips_and_refuses_junk() {
        let c = Cursor {
            active_at: 17,
            user: "a.b@c".into(),
        };
        assert_eq!(Cursor::decode(&c.encode()), Some(c));
        assert_eq!(Cursor::decode("x.y"), None);
        assert_eq!(Cursor::decode("12.b:ad"), None);
        assert_eq!(Cursor::decode("nodot"), None);
    }
}
