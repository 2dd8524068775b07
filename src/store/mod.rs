//! Every Redis read and write of the server.
//!
//! # Layout
//! - [`scripts`]: the atomic per-user steps (Lua files in `src/lua/`), each
//!   called through one function, each reply parsed into a named type.
//! - [`leases`]: a device arriving (connect, batched refresh) and departing.
//! - `devices`: a device taken away or over from outside its connection
//!   (HTTP), and the word to the node whose socket held it.
//! - [`records`]: reading users: one, a snapshot or a bulk query, and the
//!   device detail.
//! - [`lists`]: the online list and the last-seen retention.
//! - [`seen`]: the recently seen, which the online list goes on with.
//! - [`status`]: chosen status, privacy settings and contacts.
//! - `until`: statuses that end (the due index and the status-end pass).
//! - [`passes`]: the node's periodic passes: deadline (timely expiry),
//!   reconciliation.
//! - `step_types`: what the steps take and give back (a lease, an arrival,
//!   a departure, a user as read); `lease_value`: a lease's value and the
//!   clock that stamps it; [`claims`]: the claim of a due entry of
//!   `presence-leases`. Below the steps and their callers, which import
//!   them, so that those do not import each other.
//! - [`setup`]: the deployment's constants, read (or written) at start.
//!
//! How the node connects, and what it checks of Redis itself at start, is
//! [`crate::redis`].
//!
//! A reply that does not have the shape a step promises is a
//! [`StoreError::Reply`] naming the key it came from; it never becomes a
//! silent 0 or empty string.

pub mod claims;
pub mod cursor;
mod devices;
pub mod feed;
mod lease_value;
pub mod leases;
pub mod lists;
pub mod passes;
pub mod records;
mod reply;
pub mod rooms;
mod scripts;
pub mod seen;
pub mod setup;
pub mod status;
mod step_types;
mod until;

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use redis::{Pipeline, RedisError, Value};

pub use crate::redis::RedisConn;
pub use cursor::Cursor;
pub use devices::{NodeNotice, TakenWhy};
pub use lease_value::{LeaseClock, LeaseOwner};
pub use lists::{OnlinePage, OnlineUser};
pub use records::{DeviceInfo, Reader};
pub use step_types::{Arrival, ArriveMode, Departure, Lease, Observed};

use crate::keys::Buckets;
use crate::webhooks::Webhooks;
use scripts::Scripts;

/// A failed Redis operation.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// Redis refused the command or could not be reached.
    #[error("redis: {0}")]
    Redis(#[from] RedisError),
    /// Redis answered with a shape the caller did not expect.
    #[error("unexpected reply from redis: {0}")]
    Parse(#[from] redis::ParsingError),
    /// A reply, or a field of one, is not what the step promises.
    #[error("unexpected reply from redis for {key}: {detail}")]
    Reply {
        /// The key (or step) the reply came from.
        key: String,
        /// What was wrong with it.
        detail: String,
    },
    /// The node's lease refresher is gone (the node is stopping).
    #[error("the lease refresher has stopped")]
    RefresherStopped,
}

impl StoreError {
    /// Redis did not answer in time: the command timed out, or, in a
    /// pipeline over several shards, its shard did (`shard unreachable:
    /// timed out`). The node or its Redis is behind, not gone.
    pub fn is_timeout(&self) -> bool {
        match self {
            Self::Redis(e) => e.is_timeout() || crate::redis::conn::shard_timed_out(e),
            _ => false,
        }
    }

    /// A reply from `key` that does not parse; logged here, once, with the
    /// key, since it means Redis holds something our scripts never write.
    pub(crate) fn reply(key: &str, detail: impl Into<String>) -> Self {
        let detail = detail.into();
        log::warn!("unexpected reply from redis for {key}: {detail}");
        Self::Reply {
            key: key.to_string(),
            detail,
        }
    }
}

/// Result of a Redis operation.
pub type StoreResult<T> = Result<T, StoreError>;

pub use crate::clock::now_ms;

fn is_noscript(v: &Value) -> bool {
    matches!(v, Value::ServerError(e) if e.code() == "NOSCRIPT")
}

/// Handle on the shared Redis state; cheap to clone.
#[derive(Clone)]
pub struct Store {
    /// The connection every command goes through.
    conn: RedisConn,
    /// The Lua steps, loaded once and called by SHA.
    scripts: Arc<Scripts>,
    /// The device lease TTL in ms.
    ttl_ms: u64,
    /// Devices one user may have at once.
    max_devices: u32,
    /// How the indexes over all users are split (from `presence-meta`).
    buckets: Buckets,
    /// Where the transitions this node's steps make are sent, if anywhere.
    webhooks: Option<Webhooks>,
    /// This node's run number, written into the fields of the devices it
    /// holds and into its lease values (0 until [`Store::begin_run`]: no
    /// node known).
    run: u64,
    /// Stamps this node's lease values.
    lease_clock: Arc<LeaseClock>,
    /// Seals the online list's cursors (the fleet's, from `presence-meta`).
    cursor_key: Arc<cursor::CursorKey>,
    /// The most users and devices of a room whose members get every event.
    room_lists: rooms::RoomLists,
    /// The event feed's settings; `None`: off.
    feed: Option<feed::FeedSettings>,
    /// This node's feed mover, told of each feed a step recorded in.
    feed_tx: Option<tokio::sync::mpsc::Sender<String>>,
    /// This node found Redis without a deployment (new, or it lost its
    /// data) and wrote one (see [`Store::load_deployment`]).
    fresh: bool,
    /// The steps write the log themselves (not a cluster: see
    /// `store::feed`).
    feed_direct: bool,
}

impl Store {
    /// Wraps a connection; `ttl` is the device lease TTL.
    pub fn new(conn: impl Into<RedisConn>, ttl: Duration) -> Self {
        Self::with_limits(conn, ttl, crate::config::DEFAULT_MAX_DEVICES_PER_USER)
    }

    /// Wraps a connection; `ttl` is the device lease TTL, `max_devices` the
    /// devices one user may have at once.
    pub fn with_limits(conn: impl Into<RedisConn>, ttl: Duration, max_devices: u32) -> Self {
        Self {
            conn: conn.into(),
            scripts: Arc::new(Scripts::with_feed_bound(
                crate::config::DEFAULT_EVENT_MAX_PER_USER,
                crate::config::DEFAULT_EVENT_RETENTION.as_millis() as u64,
            )),
            ttl_ms: ttl.as_millis() as u64,
            max_devices,
            buckets: Buckets::default(),
            webhooks: None,
            run: 0,
            lease_clock: Arc::default(),
            cursor_key: Arc::new(cursor::CursorKey::random()),
            room_lists: rooms::RoomLists::default(),
            feed: None,
            feed_tx: None,
            feed_direct: false,
            fresh: false,
        }
    }

    /// This store, recording every transition in the event feed
    /// (`store::feed`), and telling `mover` of each feed a step recorded in.
    pub fn with_feed(
        self,
        settings: feed::FeedSettings,
        mover: Option<tokio::sync::mpsc::Sender<String>>,
    ) -> Self {
        Self {
            feed: Some(settings),
            feed_tx: mover,
            scripts: Arc::new(Scripts::with_feed_bound(
                settings.max_per_owner,
                settings.retention.as_millis() as u64,
            )),
            ..self
        }
    }

    /// This store, its steps writing the bucket's log themselves when
    /// `direct` (see [`Store::feed_can_write_log`]).
    pub fn with_feed_direct(self, direct: bool) -> Self {
        Self {
            feed_direct: direct,
            ..self
        }
    }

    /// This store, sending each transition its steps make to `webhooks`.
    pub fn with_webhooks(self, webhooks: Option<Webhooks>) -> Self {
        Self { webhooks, ..self }
    }

    /// The reply of a reporting step (`arrive`, `depart`, `status`,
    /// `reconcile`) without its event, which goes to the webhooks: this node
    /// made that transition, so this node announces it. `status_step` tells
    /// a status change from an arrival or departure.
    fn report<'v>(&self, value: &'v Value, status_step: bool) -> Cow<'v, Value> {
        let (step, event) = scripts::reported(value);
        if let (Some(_), Some(event), false) = (&self.feed, &event, self.feed_direct) {
            // The step recorded it in the user's feed: move it now.
            if let Some(user) = feed::user_of(event) {
                self.feed_recorded(&crate::keys::feed(&user));
            }
        }
        if let (Some(webhooks), Some(event)) = (&self.webhooks, event) {
            webhooks.transition(status_step, &event);
        }
        step
    }

    /// This store with the deployment's buckets (see
    /// [`Store::load_deployment`]).
    pub fn with_buckets(self, buckets: Buckets) -> Self {
        Self { buckets, ..self }
    }

    /// This node's run number (see [`Store::begin_run`]).
    pub fn run(&self) -> u64 {
        self.run
    }

    /// The lease value of a connection made now: unique in the fleet (see
    /// [`LeaseOwner`]), and the session's id on this node.
    pub fn lease_value(&self) -> u64 {
        LeaseOwner::value(self.lease_clock.next(now_ms()), self.run)
    }

    /// The lease value of an HTTP heartbeat made now: run 0, since no
    /// socket holds it (see [`LeaseOwner`]).
    pub fn http_lease_value(&self) -> String {
        LeaseOwner::format(self.lease_clock.next(now_ms()), 0)
    }

    /// How the indexes over all users are split.
    pub fn buckets(&self) -> Buckets {
        self.buckets
    }

    /// The lease TTL in ms.
    pub fn ttl_ms(&self) -> u64 {
        self.ttl_ms
    }

    /// A clone of the connection, for one command.
    fn conn(&self) -> RedisConn {
        self.conn.clone()
    }

    /// Runs `pipe`; when Redis has forgotten the scripts (restart, SCRIPT
    /// FLUSH) loads them and runs it once more. That is safe because a
    /// NOSCRIPT step did not run. With `ignore_errors`, per-command errors
    /// come back as `Value::ServerError` for the caller to look at.
    ///
    /// On a cluster, a pipeline spans shards and only the shard that lost
    /// its scripts (a replica promoted before they reached it, a restarted
    /// node) answers NOSCRIPT: when each command has its reply, only the
    /// NOSCRIPT ones run again, so that no step runs twice.
    async fn query(&self, pipe: &Pipeline) -> StoreResult<Vec<Value>> {
        let mut conn = self.conn();
        let mut values = match pipe.query_async::<Vec<Value>>(&mut conn).await {
            Err(e) if e.code() == Some("NOSCRIPT") => None,
            Ok(values) if values.iter().any(is_noscript) => Some(values),
            other => return Ok(other?),
        };
        self.load_scripts().await?;
        let cmds: Vec<&redis::Cmd> = pipe.cmd_iter().collect();
        match values.as_mut() {
            Some(values) if values.len() == cmds.len() && !pipe.is_transaction() => {
                let redo: Vec<usize> = (0..values.len())
                    .filter(|&i| is_noscript(&values[i]))
                    .collect();
                let mut again = redis::pipe();
                again.ignore_errors();
                for &i in &redo {
                    again.add_command(cmds[i].clone());
                }
                let replies: Vec<Value> = again.query_async(&mut conn).await?;
                for (i, value) in redo.into_iter().zip(replies) {
                    values[i] = value;
                }
                Ok(std::mem::take(values))
            }
            _ => Ok(pipe.query_async(&mut conn).await?),
        }
    }

    /// The nodes a SCAN must walk: the one server, or every primary.
    pub async fn data_nodes(&self) -> StoreResult<Vec<crate::redis::conn::NodeAddr>> {
        Ok(self.conn.data_nodes().await?)
    }

    /// The connection, for what lives beside the store (the cluster's
    /// expiry streams).
    pub fn redis(&self) -> &RedisConn {
        &self.conn
    }

    /// Loads every script into Redis's script cache (on a cluster, into
    /// every node's: `SCRIPT LOAD` goes to all of them).
    pub async fn load_scripts(&self) -> StoreResult<()> {
        // Side by side on the multiplexed connection: one round trip for
        // all of them rather than one each (a start through a slow link
        // would otherwise wait for every script in turn).
        let loads = self.scripts.all().map(|script| {
            let mut conn = self.conn();
            async move { script.prepare_invoke().load_async(&mut conn).await }
        });
        for loaded in futures_util::future::join_all(loads).await {
            loaded?;
        }
        Ok(())
    }

    /// Up to `limit` members of the sorted set `key` whose score is at most
    /// `max`, lowest first, each with its score as Redis wrote it (for
    /// `zrem_if`, which compares it).
    async fn scored_up_to(
        &self,
        key: &str,
        max: i64,
        limit: usize,
    ) -> StoreResult<Vec<(String, String)>> {
        let mut conn = self.conn();
        Ok(redis::cmd("ZRANGE")
            .arg(key)
            .arg("-inf")
            .arg(max)
            .arg("BYSCORE")
            .arg("LIMIT")
            .arg(0)
            .arg(limit)
            .arg("WITHSCORES")
            .query_async(&mut conn)
            .await?)
    }

    /// PING, for `/healthz`.
    pub async fn ping(&self) -> StoreResult<()> {
        let mut conn = self.conn();
        let _: String = redis::cmd("PING").query_async(&mut conn).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shard_that_timed_out_in_a_pipeline_is_a_timeout() {
        // How a pipeline over several shards reports the one that did not
        // answer (`redis::conn`): an error reply per command, which the
        // steps turn into errors as they do any error reply.
        let error = |reply: &[u8]| match redis::parse_redis_value(reply).unwrap() {
            Value::ServerError(e) => StoreError::from(RedisError::from(e)),
            other => panic!("{other:?}"),
        };
        assert!(error(b"-ERR shard unreachable: timed out\r\n").is_timeout());
        assert!(!error(b"-ERR shard unreachable: connection refused\r\n").is_timeout());
        assert!(!error(b"-NOSCRIPT no such script\r\n").is_timeout());
    }
}
