//! Every Redis read and write of the server: the atomic per-user steps (Lua
//! scripts beside this file) and the global sorted sets updated beside them.
//!
//! One [`RedisConn`] (a `ConnectionManager` that follows the primary behind
//! Sentinel) is created at start and cloned into every actor;
//! it multiplexes all commands over one connection and reconnects by itself.

use std::borrow::Borrow;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::metrics::TimedConnection;
use crate::redis_setup::RedisConn;
use redis::{Pipeline, RedisError, Script, Value};

use crate::keys;
use crate::privacy::{view, Audience, Presence, Relation};
use crate::protocol::{Record, Status};
use crate::refresh::Refresher;

/// A failed Redis operation.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// Redis refused the command or could not be reached.
    #[error("redis: {0}")]
    Redis(#[from] RedisError),
    /// Redis answered with a shape the caller did not expect.
    #[error("unexpected reply from redis: {0}")]
    Parse(#[from] redis::ParsingError),
    /// Redis answered something the scripts never return.
    #[error("unexpected reply from redis: {0}")]
    Reply(String),
    /// The node's lease refresher is gone (the node is stopping).
    #[error("the lease refresher has stopped")]
    RefresherStopped,
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

/// One device's lease to claim or refresh, for [`Store::arrive_batch`].
#[derive(Debug, Clone)]
pub struct Lease {
    /// The user.
    pub user: String,
    /// The device.
    pub device: String,
    /// The connection's lease value.
    pub owner: String,
    /// The user's status as this connection last saw it, restored if Redis
    /// lost it.
    pub known: Option<ChosenStatus>,
}

/// A user's chosen status and privacy settings as stored in Redis; what a
/// session re-asserts if Redis loses them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ChosenStatus {
    /// online, away, busy or invisible ("" for none chosen).
    pub status: String,
    /// Free text, "" for none.
    pub text: String,
    /// When the status was chosen, epoch ms.
    pub since: i64,
    /// Who may see the user online ("" when unset).
    pub show_online: String,
    /// Who may see the user's last seen ("" when unset).
    pub show_last_seen: String,
}

/// Outcome of [`Store::arrive`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Arrival {
    /// The lease belongs to this connection.
    Held {
        /// This call made the user's first device arrive (and published
        /// `online`).
        came_online: bool,
        /// The user's chosen status and privacy settings now; `None` when
        /// they are exactly what the call sent as known (a refresh only).
        status: Option<ChosenStatus>,
        /// The deadline written to `presence-leases`, epoch ms.
        deadline: i64,
    },
    /// Another connection took this device over; this one should close.
    Replaced,
    /// The user has the most devices allowed (connect only); nothing changed.
    TooManyDevices,
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

/// A script that publishes transitions, with the shared event code
/// (`lua/event.lua`) in front of it.
macro_rules! with_events {
    ($file:literal) => {
        concat!(include_str!("lua/event.lua"), "\n", include_str!($file))
    };
}

/// One user as read for a viewer: the truth, its sequence number, and
/// whether the viewer is one of the user's contacts.
#[derive(Debug, Clone)]
pub struct Observed {
    /// The user's true presence.
    pub presence: Presence,
    /// Its transition sequence number.
    pub seq: u64,
    /// The viewer is in the user's contacts.
    pub is_contact: bool,
}

impl Observed {
    /// How `viewer` stands to this user.
    pub fn relation(&self, viewer: Option<&str>, contacts_only: bool) -> Relation {
        Relation::of(viewer, &self.presence.user, self.is_contact, contacts_only)
    }
}

/// The scripts, loaded once; invoked by SHA inside pipelines.
struct Scripts {
    arrive: Script,
    depart: Script,
    status: Script,
    read: Script,
    reconcile: Script,
    privacy: Script,
    zrem_if: Script,
}

/// Keys asked for per SCAN step of the reconciliation.
const RECONCILE_SCAN_COUNT: usize = 500;

/// Handle on the shared Redis state; cheap to clone.
#[derive(Clone)]
pub struct Store {
    conn: TimedConnection<RedisConn>,
    scripts: Arc<Scripts>,
    ttl_ms: u64,
    /// Devices one user may have at once.
    max_devices: u32,
    /// Batches the lease refreshes of every session of the node; `None`
    /// sends each refresh on its own.
    refresher: Option<Refresher>,
}

/// Now, in epoch ms (the unit of every timestamp in Redis and on the wire).
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Adds an EVALSHA of `script` to `pipe`; chain the script's arguments with
/// `.arg()`.
fn eval<'p>(pipe: &'p mut Pipeline, script: &Script, keys: &[&str]) -> &'p mut Pipeline {
    pipe.cmd("EVALSHA")
        .arg(script.get_hash())
        .arg(keys.len())
        .arg(keys)
}

fn int(v: &Value) -> StoreResult<i64> {
    redis::from_redis_value_ref(v).map_err(|_| StoreError::Reply(format!("{v:?}")))
}

fn is_noscript(v: &Value) -> bool {
    matches!(v, Value::ServerError(e) if e.code() == "NOSCRIPT")
}

impl Store {
    /// Wraps a connection; `ttl` is the device lease TTL.
    pub fn new(conn: impl Into<RedisConn>, ttl: Duration) -> Self {
        Self::with_limits(conn, ttl, crate::config::DEFAULT_MAX_DEVICES_PER_USER)
    }

    /// Wraps a connection; `ttl` is the device lease TTL, `max_devices` the
    /// devices one user may have at once.
    pub fn with_limits(conn: impl Into<RedisConn>, ttl: Duration, max_devices: u32) -> Self {
        let scripts = Scripts {
            arrive: Script::new(with_events!("lua/arrive.lua")),
            depart: Script::new(with_events!("lua/depart.lua")),
            status: Script::new(with_events!("lua/status.lua")),
            read: Script::new(include_str!("lua/read.lua")),
            reconcile: Script::new(with_events!("lua/reconcile.lua")),
            privacy: Script::new(with_events!("lua/privacy.lua")),
            zrem_if: Script::new(include_str!("lua/zrem_if.lua")),
        };
        let s = &scripts;
        crate::metrics::name_scripts([
            (&s.arrive, "arrive"),
            (&s.depart, "depart"),
            (&s.status, "status"),
            (&s.read, "read"),
            (&s.reconcile, "reconcile"),
            (&s.privacy, "privacy"),
            (&s.zrem_if, "zrem_if"),
        ]);
        Self {
            conn: TimedConnection::new(conn.into()),
            scripts: Arc::new(scripts),
            ttl_ms: ttl.as_millis() as u64,
            max_devices,
            refresher: None,
        }
    }

    /// This store, with the lease refreshes of all its clones batched by
    /// one refresher task (see [`crate::refresh`]). Call inside a tokio
    /// runtime; the task ends when the last clone is dropped.
    pub fn with_batched_refreshes(self) -> Self {
        let refresher = Refresher::spawn(self.clone());
        Self {
            refresher: Some(refresher),
            ..self
        }
    }

    /// The refresher batching this store's refreshes, if any.
    pub(crate) fn refresher(&self) -> Option<&Refresher> {
        self.refresher.as_ref()
    }

    /// The lease TTL in ms.
    pub fn ttl_ms(&self) -> u64 {
        self.ttl_ms
    }

    /// Runs `pipe`; when Redis has forgotten the scripts (restart, SCRIPT
    /// FLUSH) loads them and runs it once more. That is safe because a
    /// NOSCRIPT step did not run. With `ignore_errors`, per-command errors
    /// come back as `Value::ServerError` for the caller to look at.
    async fn query(&self, pipe: &Pipeline) -> StoreResult<Vec<Value>> {
        let mut conn = self.conn.clone();
        let noscript = match pipe.query_async::<Vec<Value>>(&mut conn).await {
            Err(e) if e.code() == Some("NOSCRIPT") => true,
            Ok(values) if values.iter().any(is_noscript) => true,
            other => return Ok(other?),
        };
        debug_assert!(noscript);
        self.load_scripts().await?;
        Ok(pipe.query_async(&mut conn).await?)
    }

    /// Loads every script into Redis's script cache.
    pub async fn load_scripts(&self) -> StoreResult<()> {
        let mut conn = self.conn.clone();
        let s = &self.scripts;
        for script in [
            &s.arrive,
            &s.depart,
            &s.status,
            &s.read,
            &s.reconcile,
            &s.privacy,
            &s.zrem_if,
        ] {
            script.prepare_invoke().load_async(&mut conn).await?;
        }
        Ok(())
    }

    /// Claims (connect) or refreshes (refresh) a device lease, counting the
    /// device if it is new; publishes `online` for the user's first device.
    /// `owner` is the connection's lease value; `known` the user's status
    /// as this connection last saw it, restored if Redis lost it. Sessions
    /// refresh through [`Store::refresh`] instead, which batches.
    pub async fn arrive(
        &self,
        user: &str,
        device: &str,
        owner: &str,
        mode: ArriveMode,
        known: Option<&ChosenStatus>,
    ) -> StoreResult<Arrival> {
        let lease = Lease {
            user: user.to_string(),
            device: device.to_string(),
            owner: owner.to_string(),
            known: known.cloned(),
        };
        self.arrive_batch(mode, std::slice::from_ref(&lease))
            .await?
            .pop()
            .unwrap_or_else(|| Err(StoreError::Reply("arrive: empty reply".into())))
    }

    /// The arrival step for many leases at once, in two round trips
    /// whatever their number: one pipeline of `arrive.lua` calls, then, for
    /// the leases still held, one `ZADD GT` of all their deadlines into
    /// `presence-leases` and one of their users into `presence-online`.
    /// Returns one outcome per lease, in order; `Err` when the first round
    /// trip failed as a whole. A failed second round trip fails the leases
    /// that were held (as one refresh on its own would).
    pub async fn arrive_batch<L: Borrow<Lease>>(
        &self,
        mode: ArriveMode,
        leases: &[L],
    ) -> StoreResult<Vec<StoreResult<Arrival>>> {
        let now = now_ms();
        let deadline = now + self.ttl_ms as i64;
        let mode_arg = match mode {
            ArriveMode::Connect => "connect",
            ArriveMode::Refresh => "refresh",
        };
        let mut pipe = redis::pipe();
        // One bad reply fails its own lease, not the batch.
        pipe.ignore_errors();
        let default = ChosenStatus::default();
        for lease in leases {
            let lease = lease.borrow();
            let known = lease.known.as_ref().unwrap_or(&default);
            let [key, count, devices, status] = keys::device_keys(&lease.user, &lease.device);
            eval(
                &mut pipe,
                &self.scripts.arrive,
                &[&key, &count, &devices, &status],
            )
            .arg(&lease.owner)
            .arg(self.ttl_ms)
            .arg(&lease.device)
            .arg(now)
            .arg(mode_arg)
            .arg(&lease.user)
            .arg(keys::EVENTS)
            .arg(&known.status)
            .arg(&known.text)
            .arg(known.since)
            .arg(self.max_devices)
            .arg(&known.show_online)
            .arg(&known.show_last_seen);
        }
        let reply = self.query(&pipe).await?;
        if reply.len() != leases.len() {
            return Err(StoreError::Reply(format!(
                "arrive: {} replies for {} leases",
                reply.len(),
                leases.len()
            )));
        }
        // Only a holder writes the indexes: a replaced connection's deadline
        // must not stand for the new owner's lease. GT keeps the latest
        // deadline when two writes cross.
        let mut deadlines = redis::cmd("ZADD");
        deadlines.arg(keys::LEASES).arg("GT");
        let mut online = redis::cmd("ZADD");
        online.arg(keys::ONLINE).arg("GT");
        let mut held = 0;
        let mut out = Vec::with_capacity(leases.len());
        for (lease, value) in leases.iter().zip(reply) {
            let lease = lease.borrow();
            let arrival = parse_arrival(value, deadline);
            if let Ok(Arrival::Held { .. }) = arrival {
                held += 1;
                deadlines
                    .arg(deadline)
                    .arg(keys::lease_member(&lease.user, &lease.device));
                online.arg(now).arg(&lease.user);
            }
            out.push(arrival);
        }
        if held > 0 {
            let mut pipe = redis::pipe();
            pipe.add_command(deadlines).ignore();
            pipe.add_command(online).ignore();
            if let Err(e) = self.query(&pipe).await {
                for arrival in &mut out {
                    if let Ok(Arrival::Held { .. }) = arrival {
                        *arrival = Err(e.clone());
                    }
                }
            }
        }
        Ok(out)
    }

    /// The departure step for one device. `owner` is the closing
    /// connection's lease value with the deadline it last wrote to
    /// `presence-leases`; `None` when the lease lapsed (expired event).
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
        let reply = self.query(&pipe).await?;
        let departure = parse_departure(reply.first())?;
        let mut follow = redis::pipe();
        if let Departure::Removed {
            last_seen: Some(ts),
        } = departure
        {
            record_offline(&mut follow, user, ts);
        }
        if let (Some((_, deadline)), Departure::Removed { .. } | Departure::AlreadyGone) =
            (owner, departure)
        {
            // Our own deadline only: a newer connection's entry stays.
            eval(&mut follow, &self.scripts.zrem_if, &[keys::LEASES])
                .arg(keys::lease_member(user, device))
                .arg(deadline)
                .ignore();
        }
        if !follow.is_empty() {
            // The departure itself is done; the indexes are repaired by the
            // reconciliation pass if this fails.
            if let Err(e) = self.query(&follow).await {
                log::warn!("{user}/{device}: departed, but updating the indexes failed: {e}");
            }
        }
        Ok(departure)
    }

    /// Sets a user's status and text; publishes it when the user is online.
    /// Returns when the status was chosen (a change of text alone keeps it).
    pub async fn set_status(
        &self,
        user: &str,
        status: Status,
        text: Option<&str>,
    ) -> StoreResult<i64> {
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
        let (_, since): (i64, String) = match reply.first() {
            Some(v) => redis::from_redis_value_ref(v)?,
            None => return Err(StoreError::Reply("status: empty reply".into())),
        };
        Ok(since.parse().unwrap_or(0))
    }

    /// The true presence of `users`, in order, each with its transition
    /// sequence number (for dropping events a snapshot already reflects)
    /// and whether `viewer` is one of the user's contacts. Each user is read
    /// atomically, so state and sequence number belong together.
    pub async fn presences(
        &self,
        users: &[String],
        viewer: Option<&str>,
    ) -> StoreResult<Vec<Observed>> {
        if users.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for user in users {
            eval(
                &mut pipe,
                &self.scripts.read,
                &[
                    &keys::count(user),
                    &keys::status(user),
                    &keys::contacts(user),
                ],
            )
            .arg(viewer.unwrap_or(""));
        }
        let reply = self.query(&pipe).await?;
        let mut out = Vec::with_capacity(users.len());
        for (user, value) in users.iter().zip(&reply) {
            type Row = (
                i64,
                String,
                String,
                String,
                String,
                String,
                String,
                String,
                i64,
            );
            let (count, status, text, seq, last_seen, since, show_online, show_last_seen, contact): Row =
                redis::from_redis_value_ref(value)?;
            let devices = count.max(0) as u32;
            let chosen = if status.is_empty() {
                "online".to_string()
            } else {
                status
            };
            let presence = Presence {
                user: user.clone(),
                status: if devices > 0 {
                    chosen.clone()
                } else {
                    "offline".into()
                },
                devices,
                last_seen: last_seen.parse().ok(),
                text: (!text.is_empty()).then_some(text),
                chosen,
                since: since.parse().unwrap_or(0),
                show_online: Audience::parse(&show_online).unwrap_or_default(),
                show_last_seen: Audience::parse(&show_last_seen).unwrap_or_default(),
            };
            out.push(Observed {
                presence,
                seq: seq.parse().unwrap_or(0),
                is_contact: contact == 1,
            });
        }
        Ok(out)
    }

    /// What `viewer` may see of `users`, in order (see [`crate::privacy`]).
    pub async fn records(
        &self,
        users: &[String],
        viewer: Option<&str>,
        contacts_only: bool,
    ) -> StoreResult<Vec<Record>> {
        Ok(self
            .presences(users, viewer)
            .await?
            .iter()
            .map(|o| view(&o.presence, o.relation(viewer, contacts_only)))
            .collect())
    }

    /// Changes who may see `user` online and its last seen; publishes the
    /// record when something changed.
    pub async fn set_privacy(
        &self,
        user: &str,
        show_online: Option<Audience>,
        show_last_seen: Option<Audience>,
    ) -> StoreResult<bool> {
        let mut pipe = redis::pipe();
        eval(
            &mut pipe,
            &self.scripts.privacy,
            &[&keys::status(user), &keys::count(user)],
        )
        .arg(show_online.map_or("", Audience::as_str))
        .arg(show_last_seen.map_or("", Audience::as_str))
        .arg(now_ms())
        .arg(user)
        .arg(keys::EVENTS);
        let reply = self.query(&pipe).await?;
        Ok(int(reply.first().unwrap_or(&Value::Nil))? == 1)
    }

    /// Replaces `user`'s contacts and tells every node, so that watchers'
    /// views follow at once.
    pub async fn set_contacts(&self, user: &str, contacts: &[String]) -> StoreResult<()> {
        let mut pipe = redis::pipe();
        pipe.atomic();
        pipe.del(keys::contacts(user)).ignore();
        if !contacts.is_empty() {
            pipe.sadd(keys::contacts(user), contacts).ignore();
        }
        pipe.publish(
            keys::EVENTS,
            serde_json::json!({"user": user, "contacts_changed": true}).to_string(),
        )
        .ignore();
        self.query(&pipe).await?;
        Ok(())
    }

    /// `user`'s contacts, sorted.
    pub async fn contacts(&self, user: &str) -> StoreResult<Vec<String>> {
        self.sorted_members(&keys::contacts(user)).await
    }

    /// The members of a set, sorted.
    async fn sorted_members(&self, key: &str) -> StoreResult<Vec<String>> {
        let mut conn = self.conn.clone();
        let mut out: Vec<String> = redis::cmd("SMEMBERS")
            .arg(key)
            .query_async(&mut conn)
            .await?;
        out.sort();
        Ok(out)
    }

    /// The live devices of `user`, sorted by device id.
    pub async fn devices(&self, user: &str) -> StoreResult<Vec<DeviceInfo>> {
        let ids = self.sorted_members(&keys::devices(user)).await?;
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
            let Some(owner) = owner else {
                // Counted but lapsed a moment ago: on its way out.
                continue;
            };
            let lease = LeaseOwner::parse(&owner);
            out.push(DeviceInfo {
                device,
                node: Some(lease.node.to_string()),
                connected_at: lease.connected_at,
                expires_in_ms: (pttl >= 0).then_some(pttl),
            });
        }
        Ok(out)
    }

    /// One page of users online now, most recently active first. `cursor` is
    /// the `next_cursor` of the previous page. Scores move as devices
    /// refresh, so a user who becomes active while a client pages may show
    /// up on an earlier page than the one being read: the list is a view of
    /// "now", not a snapshot.
    /// Only users `viewer` may see online are listed.
    pub async fn online(
        &self,
        limit: usize,
        cursor: Option<&Cursor>,
        viewer: Option<&str>,
        contacts_only: bool,
    ) -> StoreResult<OnlinePage> {
        let mut conn = self.conn.clone();
        let mut users: Vec<(Record, i64)> = Vec::with_capacity(limit + 1);
        let max = cursor.map_or("+inf".to_string(), |c| c.active_at.to_string());
        let mut offset = 0usize;
        let batch = limit + 1;
        // Entries tied with the cursor's score that come before it in the
        // (descending) order are skipped; entries of users no longer online
        // (the index is repaired lazily) are dropped by the record check.
        loop {
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
            let exhausted = page.len() < batch;
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
            let records = self.records(&names, viewer, contacts_only).await?;
            for ((_, score), record) in candidates.into_iter().zip(records) {
                if record.devices > 0 {
                    users.push((record, score));
                }
            }
            if users.len() > limit || exhausted {
                break;
            }
        }
        let next_cursor = if users.len() > limit {
            users.truncate(limit);
            users.last().map(|(r, s)| {
                Cursor {
                    active_at: *s,
                    user: r.user.clone(),
                }
                .encode()
            })
        } else {
            None
        };
        let users = users
            .into_iter()
            .map(|(record, active_at)| OnlineUser { record, active_at })
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
        // Keep it only if it is still ours (it may have lapsed meanwhile).
        let kept: i64 = redis::cmd("EVAL")
            .arg("if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0")
            .arg(1)
            .arg(keys::REAPER_LOCK)
            .arg(node)
            .arg(ms)
            .query_async(&mut conn)
            .await?;
        Ok(kept == 1)
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
        // One bad entry must not stall the pass for everyone.
        pipe.ignore_errors();
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
                None => {
                    pipe.cmd("ECHO").arg("not a lease member");
                }
            }
        }
        let reply = self.query(&pipe).await?;
        let mut removed = 0;
        let mut follow = redis::pipe();
        for ((member, score), value) in due.iter().zip(&reply) {
            let parsed = keys::parse_lease_member(member);
            let departure = match (parsed, parse_departure(Some(value))) {
                (Some(_), Ok(d)) => d,
                (None, _) => {
                    log::warn!(
                        "dropping {member:?} from {}: not <user>:<device>",
                        keys::LEASES
                    );
                    Departure::AlreadyGone
                }
                (Some(_), Err(e)) => {
                    log::warn!("dropping {member:?} from {}: {e}", keys::LEASES);
                    Departure::AlreadyGone
                }
            };
            match departure {
                Departure::Leased { ttl_ms } => {
                    let left = ttl_ms.unwrap_or(self.ttl_ms) as i64;
                    follow
                        .cmd("ZADD")
                        .arg(keys::LEASES)
                        .arg("XX")
                        .arg("GT")
                        .arg(now + left)
                        .arg(member)
                        .ignore();
                }
                Departure::Removed { .. } | Departure::AlreadyGone => {
                    if let Departure::Removed { last_seen } = departure {
                        removed += 1;
                        if let (Some(ts), Some((user, _))) = (last_seen, parsed) {
                            record_offline(&mut follow, user, ts);
                        }
                    }
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

    /// Forgets users offline for longer than `retention`: their last seen
    /// (index entry and field) and status text, when no device came back. Returns how
    /// many were forgotten (at most `max` per call).
    pub async fn trim_last_seen(&self, retention: Duration, max: usize) -> StoreResult<usize> {
        let mut conn = self.conn.clone();
        let retention_ms = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
        let cutoff = now_ms().saturating_sub(retention_ms);
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
                // Only when offline: a user online again keeps all of it. The
                // chosen status and the privacy settings stay: forgetting
                // them would show an invisible or hidden user online.
                forget
                    .cmd("EVAL")
                    .arg("if redis.call('EXISTS', KEYS[2]) == 0 then return redis.call('HDEL', KEYS[1], 'last_seen', 'text', 'active') end return 0")
                    .arg(2)
                    .arg(keys::status(user))
                    .arg(keys::count(user))
                    .ignore();
            }
        }
        self.query(&forget).await?;
        Ok(forgotten)
    }

    /// One step of the reconciliation scan over the device sets: repairs
    /// each user whose devices or counter disagree with the live leases and
    /// publishes the transition that follows, once. `cursor` is the SCAN
    /// cursor (0 starts a pass; a returned 0 ends it). Returns (next cursor,
    /// users looked at, users repaired).
    pub async fn reconcile_step(&self, cursor: u64) -> StoreResult<(u64, usize, usize)> {
        let mut conn = self.conn.clone();
        let (next, found): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(keys::DEVICES_PATTERN)
            .arg("COUNT")
            .arg(RECONCILE_SCAN_COUNT)
            .query_async(&mut conn)
            .await?;
        let users: Vec<&str> = found
            .iter()
            .filter_map(|k| keys::parse_devices(k))
            .collect();
        if users.is_empty() {
            return Ok((next, 0, 0));
        }
        let mut pipe = redis::pipe();
        for user in &users {
            pipe.smembers(keys::devices(user));
        }
        let members: Vec<Vec<String>> = pipe.query_async(&mut conn).await?;
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        let now = now_ms();
        for (user, devices) in users.iter().zip(&members) {
            let mut keys = vec![keys::count(user), keys::devices(user), keys::status(user)];
            keys.extend(devices.iter().map(|d| keys::lease(user, d)));
            let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
            eval(&mut pipe, &self.scripts.reconcile, &keys)
                .arg(user)
                .arg(now)
                .arg(keys::EVENTS)
                .arg(devices);
        }
        let reply = self.query(&pipe).await?;
        let mut repaired = 0;
        let mut follow = redis::pipe();
        for (user, value) in users.iter().zip(&reply) {
            let (removed, old, new, transition): (i64, i64, i64, i64) =
                match redis::from_redis_value_ref(value) {
                    Ok(v) => v,
                    Err(e) => {
                        log::warn!("reconciliation of {user} failed: {e}");
                        continue;
                    }
                };
            if removed == 0 && old == new {
                continue;
            }
            repaired += 1;
            log::info!(
                "reconciliation repaired {user}: {removed} device(s) without a lease removed, counter {old} -> {new}{}",
                if transition == 1 { ", transition published" } else { "" }
            );
            if new == 0 {
                follow.zrem(keys::ONLINE, *user).ignore();
            }
        }
        if !follow.is_empty() {
            self.query(&follow).await?;
        }
        Ok((next, users.len(), repaired))
    }

    /// One step of the scan over `presence-online` that drops users no
    /// longer online (an index entry left behind by a crash or a race).
    /// Returns (next cursor, entries dropped).
    pub async fn prune_online_step(&self, cursor: u64) -> StoreResult<(u64, usize)> {
        let mut conn = self.conn.clone();
        let (next, flat): (u64, Vec<String>) = redis::cmd("ZSCAN")
            .arg(keys::ONLINE)
            .arg(cursor)
            .arg("COUNT")
            .arg(RECONCILE_SCAN_COUNT)
            .query_async(&mut conn)
            .await?;
        let entries: Vec<(&String, &String)> = flat
            .chunks(2)
            .filter_map(|c| Some((c.first()?, c.get(1)?)))
            .collect();
        if entries.is_empty() {
            return Ok((next, 0));
        }
        let mut pipe = redis::pipe();
        for (user, _) in &entries {
            pipe.exists(keys::count(user));
        }
        let online: Vec<bool> = pipe.query_async(&mut conn).await?;
        let mut pipe = redis::pipe();
        let mut dropped = 0;
        for ((user, score), online) in entries.iter().zip(online) {
            if !online {
                dropped += 1;
                // A user who came back meanwhile has a newer score and stays.
                eval(&mut pipe, &self.scripts.zrem_if, &[keys::ONLINE])
                    .arg(*user)
                    .arg(*score)
                    .ignore();
            }
        }
        if dropped > 0 {
            self.query(&pipe).await?;
        }
        Ok((next, dropped))
    }

    /// PING, for `/healthz`.
    pub async fn ping(&self) -> StoreResult<()> {
        let mut conn = self.conn.clone();
        let _: String = redis::cmd("PING").query_async(&mut conn).await?;
        Ok(())
    }
}

/// Adds the global-set updates that follow a user's last device leaving.
fn record_offline(pipe: &mut Pipeline, user: &str, last_seen: i64) {
    pipe.cmd("ZADD")
        .arg(keys::LAST_SEEN)
        .arg("GT")
        .arg(last_seen)
        .arg(user)
        .ignore();
    pipe.zrem(keys::ONLINE, user).ignore();
}

/// One reply of `arrive.lua`. A short one (`{1, came_online}`) confirms the
/// status the call sent as known: `status: None`.
fn parse_arrival(value: Value, deadline: i64) -> StoreResult<Arrival> {
    let v = match value {
        Value::Array(v) => v,
        Value::ServerError(e) => return Err(RedisError::from(e).into()),
        other => return Err(StoreError::Reply(format!("arrive: {other:?}"))),
    };
    let held = v.first().map(int).transpose()?;
    let came_online = v.get(1).map(int).transpose()?;
    let status = match v.len() {
        2 => None,
        7 => {
            let s = |i: usize| redis::from_redis_value_ref::<String>(&v[i]);
            Some(ChosenStatus {
                status: s(2)?,
                text: s(3)?,
                since: s(4)?.parse().unwrap_or(0),
                show_online: s(5)?,
                show_last_seen: s(6)?,
            })
        }
        _ => return Err(StoreError::Reply(format!("arrive: {v:?}"))),
    };
    Ok(match held {
        Some(1) => Arrival::Held {
            came_online: came_online == Some(1),
            status,
            deadline,
        },
        Some(-1) => Arrival::TooManyDevices,
        _ => Arrival::Replaced,
    })
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
