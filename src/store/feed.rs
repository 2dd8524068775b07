//! The event feed in Redis: each transition recorded by the step that made
//! it, and kept in its bucket's log, a stream every node reads: the
//! webhooks and `GET /api/events`.
//!
//! - On one Redis (no cluster, and no proxy that refuses a script two hash
//!   tags: [`Store::feed_can_write_log`]) the step writes the log itself
//!   (`feed_direct.lua`): nothing is left to move.
//! - On a cluster no step spans two slots: the step records the event in
//!   the feed of its user or room (same slot: `event.lua`,
//!   `room_common.lua`), and a node moves it into the log, as follows.
//!
//! - A node that records an event moves it at once ([`Store::move_feed`]).
//!   A node that dies first leaves it to the feed pass: before each step
//!   that may record, the feed key is put in the bucket's due index
//!   ([`keys::feed_due`]) a little in the future, and whichever node holds
//!   the bucket's pass moves it then ([`Store::feed_pass`]).
//! - A move is idempotent and ordered (`feed_append.lua` keeps the last
//!   seq moved per feed), so nodes need not agree on who moves what.
//! - The log keeps `--event-retention-secs`; a feed holds at most 256
//!   events not yet moved. Whatever goes before a reader had it leaves a
//!   gap in the log's ordinal (`n`), which the reader counts as lost.

use std::time::Duration;

use redis::{Pipeline, Value};

use super::reply::{at, int};
use super::{now_ms, Store, StoreResult};
use crate::keys;

/// Most events a feed holds before a node moves them (`event.lua`,
/// `room_common.lua`): beyond, the oldest go, counted as lost.
pub const FEED_HELD: usize = 256;

/// The key counting what `feed` lost: `presence-feed-lost:{<tag>}`.
fn lost_key(feed: &str) -> String {
    format!("presence-feed-lost:{}", &feed["presence-feed:".len()..])
}

/// The seq of an entry, `<seq>|...`.
fn entry_seq(entry: &str) -> Option<i64> {
    entry.split_once('|')?.0.parse().ok()
}

/// How far in the future a step puts its feed in the due index: the node
/// that made the event moves it well before then, and the pass finds it
/// only if that node died.
pub const DUE_GRACE_MS: i64 = 5_000;

/// The feed's settings (`--event-retention-secs`); none: the feed is off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FeedSettings {
    /// How long the log keeps an event.
    pub retention: Duration,
    /// Most events one user or room adds to the log per `retention`
    /// (`--event-max-per-user`); beyond, they are dropped, counted as lost.
    pub max_per_owner: u64,
}

/// One event of a bucket's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEntry {
    /// The bucket.
    pub bucket: u32,
    /// Its stream id (`<ms>-<n>`): its place in the log.
    pub id: String,
    /// The log's ordinal: one more than the event before it, unless events
    /// were lost between them.
    pub n: u64,
    /// The user, or `r:<room>`.
    pub owner: String,
    /// The recorded entry, `<seq>|<kind>|<at>|<record>`.
    pub entry: String,
}

/// The user of a published event (its JSON).
pub(super) fn user_of(event: &str) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct User {
        user: String,
    }
    serde_json::from_str::<User>(event).ok().map(|u| u.user)
}

/// The keys a step that may record passes last (see `event.lua`): its
/// feed's, and where the steps write the log themselves, its bucket's log
/// and marks after it.
#[derive(Debug, Clone)]
pub(crate) struct FeedKeys {
    /// The feed, `presence-feed:{<owner>}`.
    pub(super) feed: String,
    /// The bucket's log and marks, where the step writes the log.
    direct: Option<[String; 2]>,
}

impl FeedKeys {
    /// The keys, in the order the step takes them.
    pub(super) fn keys(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.feed.as_str()).chain(self.direct.iter().flatten().map(String::as_str))
    }
}

impl Store {
    /// The keys a step passes for `feed`.
    fn feed_keys(&self, feed: String) -> FeedKeys {
        let direct = self
            .feed_direct
            .then(|| keys::feed_owner(&feed).map(|o| self.buckets.of(o)))
            .flatten()
            .map(|b| [keys::feed_log(b), keys::feed_moved(b)]);
        FeedKeys { feed, direct }
    }

    /// The feed keys of `user` when the feed is on.
    pub(super) fn feed_of(&self, user: &str) -> Option<FeedKeys> {
        self.feed.map(|_| self.feed_keys(keys::feed(user)))
    }

    /// The feed keys of `room` when the feed is on.
    pub(super) fn room_feed_of(&self, room: &str) -> Option<FeedKeys> {
        self.feed.map(|_| self.feed_keys(keys::room_feed(room)))
    }

    /// Whether a step may write its bucket's log itself: Redis is no
    /// cluster, and a script may touch keys of two hash tags (a proxy in
    /// front of shards refuses that). Otherwise steps record in their own
    /// slot and nodes move the records (see the module docs).
    pub async fn feed_can_write_log(&self) -> bool {
        if self.conn.is_cluster() {
            return false;
        }
        let mut conn = self.conn();
        let probe: Result<Value, _> = redis::cmd("EVAL")
            .arg("redis.call('EXISTS', KEYS[1]) return redis.call('EXISTS', KEYS[2])")
            .arg(2)
            .arg(keys::feed("probe"))
            .arg(keys::feed_log(0))
            .query_async(&mut conn)
            .await;
        if let Err(e) = &probe {
            log::info!("event feed: steps record in their own slot ({e})");
        }
        probe.is_ok()
    }

    /// Adds to `pre`, for a step that may record in `feed`, its entry in the
    /// bucket's due index a little in the future (`GT`: one already due is
    /// pushed back, so that a pass that found it empty just before does not
    /// take it out). `pre` goes with [`Store::send_due`], apart from the
    /// step: the bucket may be on another shard, whose failover must not
    /// fail the step. A step that writes the log itself needs none.
    pub(super) fn feed_due_before(&self, pipe: &mut Pipeline, feed: &FeedKeys) {
        let Some(owner) = keys::feed_owner(&feed.feed).filter(|_| feed.direct.is_none()) else {
            return;
        };
        pipe.cmd("ZADD")
            .arg(keys::feed_due(self.buckets.of(owner)))
            .arg("GT")
            .arg(now_ms() + DUE_GRACE_MS)
            .arg(&feed.feed)
            .ignore();
    }

    /// Sends `pre` (see [`Store::feed_due_before`]) on its own, without
    /// waiting: sent before the step, it is in Redis by the time the step
    /// runs, unless the bucket's shard is failing (then the pass could not
    /// run there either).
    pub(super) fn send_due(&self, pre: Pipeline) {
        if pre.cmd_iter().next().is_none() {
            return;
        }
        let mut conn = self.conn();
        tokio::spawn(async move {
            if let Err(e) = pre.query_async::<()>(&mut conn).await {
                log::debug!("feed: due index not written: {e}");
            }
        });
    }

    /// [`Store::feed_due_before`] and [`Store::send_due`] for one step.
    pub(super) fn send_due_for(&self, feed: &FeedKeys) {
        let mut pre = redis::pipe();
        self.feed_due_before(&mut pre, feed);
        self.send_due(pre);
    }

    /// Tells this node's feed mover that a step recorded in `feed`.
    pub(super) fn feed_recorded(&self, feed: &str) {
        if self.feed_direct {
            return;
        }
        if let Some(tx) = &self.feed_tx {
            // A full channel: the pass moves it.
            let _ = tx.try_send(feed.to_string());
        }
    }

    /// Moves what `feed` holds into its bucket's log; the entries it still
    /// holds after (recorded meanwhile).
    pub async fn move_feed(&self, feed: &str) -> StoreResult<usize> {
        let left = self.move_feeds(&[feed.to_string()]).await?;
        Ok(left.first().copied().unwrap_or(0))
    }

    /// Moves what each of `feeds` holds into its bucket's log, in a few
    /// round trips for all of them (one script call per bucket); the
    /// entries each still holds after (recorded meanwhile).
    pub async fn move_feeds(&self, feeds: &[String]) -> StoreResult<Vec<usize>> {
        let Some(settings) = self.feed else {
            return Ok(vec![0; feeds.len()]);
        };
        let feeds: Vec<(&str, u32)> = feeds
            .iter()
            .filter_map(|f| keys::feed_owner(f).map(|o| (f.as_str(), self.buckets.of(o))))
            .collect();
        // 1. What each holds.
        let mut read = redis::pipe();
        for (feed, _) in &feeds {
            read.cmd("LRANGE").arg(*feed).arg(0).arg(-1);
        }
        let reply = self.query(&read).await?;
        let mut held: Vec<Vec<String>> = Vec::with_capacity(feeds.len());
        for (i, (feed, _)) in feeds.iter().enumerate() {
            held.push(redis::from_redis_value_ref(at(&reply, i, feed)?)?);
        }
        // 2. What the full ones lost (a feed loses only when full).
        let full: Vec<usize> = (0..feeds.len())
            .filter(|&i| held[i].len() >= FEED_HELD)
            .collect();
        let mut lost = vec![0u64; feeds.len()];
        if !full.is_empty() {
            let mut take = redis::pipe();
            for &i in &full {
                take.cmd("GETDEL").arg(lost_key(feeds[i].0));
            }
            let reply = self.query(&take).await?;
            for (k, &i) in full.iter().enumerate() {
                let n: Option<u64> = redis::from_redis_value_ref(at(&reply, k, feeds[i].0)?)?;
                lost[i] = n.unwrap_or(0);
            }
        }
        // 3. Into each bucket's log, one script call per bucket.
        let keep_from = format!(
            "{}-0",
            (now_ms() - settings.retention.as_millis() as i64).max(0)
        );
        let mut by_bucket: std::collections::BTreeMap<u32, Vec<usize>> = Default::default();
        for (i, (_, bucket)) in feeds.iter().enumerate() {
            if !held[i].is_empty() || lost[i] > 0 {
                by_bucket.entry(*bucket).or_default().push(i);
            }
        }
        if by_bucket.is_empty() {
            return Ok(vec![0; feeds.len()]);
        }
        let mut append = redis::pipe();
        for (bucket, members) in &by_bucket {
            let groups: Vec<(&str, u64, &[String])> = members
                .iter()
                .map(|&i| (feeds[i].0, lost[i], held[i].as_slice()))
                .collect();
            self.scripts.feed_append(
                &mut append,
                &keys::feed_log(*bucket),
                &keys::feed_moved(*bucket),
                &keep_from,
                (
                    settings.max_per_owner,
                    settings.retention.as_millis() as u64,
                    now_ms(),
                ),
                &groups,
            );
        }
        let reply = self.query(&append).await?;
        let mut last = vec![0i64; feeds.len()];
        for (k, members) in by_bucket.values().enumerate() {
            let log = "feed_append";
            let lasts: Vec<i64> = redis::from_redis_value_ref(at(&reply, k, log)?)?;
            for (&i, l) in members.iter().zip(lasts) {
                last[i] = l;
            }
        }
        // 4. Out of each feed: the entries read, from its oldest end.
        self.trim_feeds(&feeds, &held, &last).await
    }

    /// Pops from each feed the entries that were read from it (a prefix: a
    /// step only appends), then puts back any popped that is newer than
    /// what was moved (another node's move took some meanwhile, so these
    /// were not the ones read); how many each holds after.
    async fn trim_feeds(
        &self,
        feeds: &[(&str, u32)],
        held: &[Vec<String>],
        last: &[i64],
    ) -> StoreResult<Vec<usize>> {
        let popped: Vec<usize> = (0..feeds.len()).filter(|&i| !held[i].is_empty()).collect();
        let mut left = vec![0usize; feeds.len()];
        if popped.is_empty() {
            return Ok(left);
        }
        let mut pop = redis::pipe();
        for &i in &popped {
            pop.cmd("LPOP").arg(feeds[i].0).arg(held[i].len());
            pop.cmd("LLEN").arg(feeds[i].0);
        }
        let reply = self.query(&pop).await?;
        let mut back = redis::pipe();
        for (k, &i) in popped.iter().enumerate() {
            let feed = feeds[i].0;
            let out: Option<Vec<String>> = redis::from_redis_value_ref(at(&reply, 2 * k, feed)?)?;
            left[i] = int(at(&reply, 2 * k + 1, feed)?, feed)? as usize;
            let newer: Vec<String> = out
                .unwrap_or_default()
                .into_iter()
                .filter(|e| entry_seq(e).is_some_and(|seq| seq > last[i]))
                .collect();
            if !newer.is_empty() {
                left[i] += newer.len();
                back.cmd("LPUSH")
                    .arg(feed)
                    .arg(newer.iter().rev().collect::<Vec<_>>())
                    .ignore();
            }
        }
        if back.cmd_iter().next().is_some() {
            self.query(&back).await?;
        }
        Ok(left)
    }

    /// One step of the feed pass over `bucket`: moves up to `max` feeds
    /// whose entry in the due index is due, and takes out those left empty.
    /// The feeds visited.
    pub async fn feed_pass(&self, bucket: u32, max: usize) -> StoreResult<usize> {
        let index = keys::feed_due(bucket);
        let due = self.scored_up_to(&index, now_ms(), max).await?;
        if due.is_empty() {
            return Ok(0);
        }
        let feeds: Vec<String> = due.iter().map(|(f, _)| f.clone()).collect();
        let left = self.move_feeds(&feeds).await?;
        let mut done = Vec::new();
        let mut after = redis::pipe();
        for ((feed, score), left) in due.iter().zip(&left) {
            if *left == 0 {
                done.push((feed.as_str(), score.as_str()));
            } else {
                after
                    .cmd("ZADD")
                    .arg(&index)
                    .arg(now_ms() + DUE_GRACE_MS)
                    .arg(feed)
                    .ignore();
            }
        }
        if !done.is_empty() {
            self.scripts.feed_done(&mut after, &index, &done);
        }
        self.query(&after).await?;
        Ok(due.len())
    }

    /// Trims `bucket`'s log to the retention, and forgets the moved marks
    /// of feeds that recorded nothing within it (a seq is never below the
    /// time it was made, so a new event is past any mark forgotten).
    pub async fn feed_trim_bucket(&self, bucket: u32, scan: u64) -> StoreResult<u64> {
        let Some(settings) = self.feed else {
            return Ok(0);
        };
        let keep_from = (now_ms() - settings.retention.as_millis() as i64).max(0);
        let mut conn = self.conn();
        let _: Value = redis::cmd("XTRIM")
            .arg(keys::feed_log(bucket))
            .arg("MINID")
            .arg(format!("{keep_from}-0"))
            .query_async(&mut conn)
            .await?;
        let moved = keys::feed_moved(bucket);
        let (next, fields): (u64, Vec<(String, String)>) = redis::cmd("HSCAN")
            .arg(&moved)
            .arg(scan)
            .arg("COUNT")
            .arg(200)
            .query_async(&mut conn)
            .await?;
        let old: Vec<&str> = fields
            .iter()
            .filter(|(k, v)| {
                let seq = v.split('|').next().and_then(|s| s.parse::<i64>().ok());
                !k.starts_with('#') && seq.is_some_and(|seq| seq < keep_from)
            })
            .map(|(k, _)| k.as_str())
            .collect();
        if !old.is_empty() {
            let _: Value = redis::cmd("HDEL")
                .arg(&moved)
                .arg(&old)
                .query_async(&mut conn)
                .await?;
        }
        Ok(next)
    }

    /// Up to `limit` events of each bucket's log after `after` (one stream
    /// id per bucket, `0-0` for the start), each bucket's oldest first.
    pub async fn feed_read(&self, after: &[String], limit: usize) -> StoreResult<Vec<LogEntry>> {
        let mut pipe = redis::pipe();
        for (bucket, id) in after.iter().enumerate() {
            pipe.cmd("XRANGE")
                .arg(keys::feed_log(bucket as u32))
                .arg(format!("({id}"))
                .arg("+")
                .arg("COUNT")
                .arg(limit);
        }
        let reply = self.query(&pipe).await?;
        let mut out = Vec::new();
        for (bucket, value) in reply.iter().enumerate() {
            let items: Vec<(String, Vec<(String, String)>)> = redis::from_redis_value_ref(value)?;
            out.extend(
                items
                    .into_iter()
                    .map(|(id, fields)| log_entry(bucket as u32, id, &fields)),
            );
        }
        Ok(out)
    }

    /// The newest id of each bucket's log (`0-0` for an empty one), and the
    /// log's ordinal so far: where a reader that starts now starts.
    pub async fn feed_heads(&self) -> StoreResult<Vec<(String, u64)>> {
        let mut pipe = redis::pipe();
        for bucket in self.buckets.all() {
            pipe.cmd("XREVRANGE")
                .arg(keys::feed_log(bucket))
                .arg("+")
                .arg("-")
                .arg("COUNT")
                .arg(1);
            pipe.cmd("HGET").arg(keys::feed_moved(bucket)).arg("#n");
        }
        let reply = self.query(&pipe).await?;
        let mut out = Vec::new();
        for pair in reply.chunks(2) {
            let items: Vec<(String, Vec<(String, String)>)> =
                redis::from_redis_value_ref(&pair[0])?;
            let n: Option<u64> = redis::from_redis_value_ref(&pair[1])?;
            let id = items
                .into_iter()
                .next()
                .map_or_else(|| "0-0".to_string(), |(id, _)| id);
            out.push((id, n.unwrap_or(0)));
        }
        Ok(out)
    }

    /// The buckets of the deployment.
    pub fn bucket_count(&self) -> u32 {
        self.buckets.count()
    }
}

/// Where a reader of the log is: per bucket, the id of the last event it
/// has (`0-0`: none yet) and that event's ordinal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FeedCursor {
    /// Per bucket: (id, ordinal).
    pub at: Vec<(String, u64)>,
}

/// The ordinal of a cursor that started at the oldest event kept.
pub const UNKNOWN: u64 = u64::MAX;

/// The kind byte of a feed cursor (see `CursorKey::seal_raw`).
const CURSOR_KIND: u8 = b'F';

impl FeedCursor {
    /// The start of every bucket's log: what went before it is no loss
    /// to this reader ([`UNKNOWN`]).
    pub fn start(buckets: u32) -> Self {
        Self {
            at: vec![("0-0".to_string(), UNKNOWN); buckets as usize],
        }
    }
}

impl Store {
    /// `cursor`, opaque and authenticated.
    pub fn seal_feed_cursor(&self, cursor: &FeedCursor) -> String {
        let mut data = Vec::with_capacity(cursor.at.len() * 24);
        for (id, n) in &cursor.at {
            let (ms, seq) = id.split_once('-').unwrap_or(("0", "0"));
            data.extend(ms.parse::<u64>().unwrap_or(0).to_be_bytes());
            data.extend(seq.parse::<u64>().unwrap_or(0).to_be_bytes());
            data.extend(n.to_be_bytes());
        }
        self.cursor_key.seal_raw(CURSOR_KIND, &data)
    }

    /// The cursor `s` stands for, if this fleet handed it out.
    pub fn open_feed_cursor(&self, s: &str) -> Option<FeedCursor> {
        let data = self.cursor_key.open_raw(CURSOR_KIND, s)?;
        if data.len() != self.buckets.count() as usize * 24 {
            return None;
        }
        let word = |c: &[u8]| u64::from_be_bytes(c.try_into().expect("8 bytes"));
        let at = data
            .chunks_exact(24)
            .map(|c| {
                (
                    format!("{}-{}", word(&c[..8]), word(&c[8..16])),
                    word(&c[16..]),
                )
            })
            .collect();
        Some(FeedCursor { at })
    }

    /// One page of the log after `cursor`: at most `limit` events, oldest
    /// first over every bucket, the cursor after them, and how many events
    /// went (retention, bounds) between the cursor and them.
    pub async fn feed_page(
        &self,
        cursor: &FeedCursor,
        limit: usize,
    ) -> StoreResult<(Vec<LogEntry>, FeedCursor, u64)> {
        let after: Vec<String> = cursor.at.iter().map(|(id, _)| id.clone()).collect();
        let mut all = self.feed_read(&after, limit).await?;
        // Oldest first: by the stream ids' time, then bucket.
        all.sort_by_key(|e| (id_key(&e.id), e.bucket));
        all.truncate(limit);
        let mut next = cursor.clone();
        let mut lost = 0;
        for e in &all {
            let (id, n) = &mut next.at[e.bucket as usize];
            // An ordinal more than one past the last: events went between.
            if *n != UNKNOWN && e.n > *n + 1 {
                lost += e.n - *n - 1;
            }
            *id = e.id.clone();
            *n = e.n;
        }
        Ok((all, next, lost))
    }
}

/// A stream id as numbers, for ordering.
fn id_key(id: &str) -> (u64, u64) {
    let (ms, seq) = id.split_once('-').unwrap_or(("0", "0"));
    (ms.parse().unwrap_or(0), seq.parse().unwrap_or(0))
}

impl Store {
    /// Where webhook `url` is in `bucket`'s log: the last event it took
    /// (id, ordinal); `None` before its first delivery.
    pub async fn feed_sent(&self, bucket: u32, url: &str) -> StoreResult<Option<(String, u64)>> {
        let mut conn = self.conn();
        let at: Option<String> = redis::cmd("HGET")
            .arg(keys::feed_sent(bucket))
            .arg(url)
            .query_async(&mut conn)
            .await?;
        Ok(at.and_then(|a| {
            let (id, n) = a.split_once(' ')?;
            Some((id.to_string(), n.parse().ok()?))
        }))
    }

    /// Records that webhook `url` took `bucket`'s log up to `id` (ordinal
    /// `n`).
    pub async fn set_feed_sent(&self, bucket: u32, url: &str, id: &str, n: u64) -> StoreResult<()> {
        let mut conn = self.conn();
        let _: Value = redis::cmd("HSET")
            .arg(keys::feed_sent(bucket))
            .arg(url)
            .arg(sent_place(id, n))
            .query_async(&mut conn)
            .await?;
        Ok(())
    }

    /// Starts each of `urls` at the end of every bucket's log, unless it
    /// has a place there already (`HSETNX`): a URL's first deliveries are
    /// the events after its first node started with it, not a day's worth.
    ///
    /// On a Redis this node found without a deployment (new, or emptied),
    /// each starts at the log's start instead: nodes that ran before may
    /// have recorded events in it already (repairs of what Redis lost).
    pub async fn start_feed_sent(&self, urls: &[String]) -> StoreResult<()> {
        if self.fresh {
            for bucket in self.buckets.all() {
                for url in urls {
                    self.restart_feed_sent(bucket, url).await?;
                }
            }
            return Ok(());
        }
        let heads = self.feed_heads().await?;
        let mut pipe = redis::pipe();
        for (bucket, (id, n)) in heads.iter().enumerate() {
            for url in urls {
                pipe.cmd("HSETNX")
                    .arg(keys::feed_sent(bucket as u32))
                    .arg(url)
                    .arg(sent_place(id, *n))
                    .ignore();
            }
        }
        self.query(&pipe).await.map(|_| ())
    }

    /// Puts webhook `url` at the start of `bucket`'s log, unless it has a
    /// place there (`HSETNX`): for a place Redis lost, whose log went with
    /// it (same slot), so that every event recorded since is sent. The
    /// place's ordinal is the one before the log's first event (the log's
    /// ordinal when it is empty): what the log dropped before is no loss
    /// of this URL's.
    pub async fn restart_feed_sent(&self, bucket: u32, url: &str) -> StoreResult<()> {
        let log = keys::feed_log(bucket);
        let mut read = redis::pipe();
        read.cmd("XRANGE")
            .arg(&log)
            .arg("-")
            .arg("+")
            .arg("COUNT")
            .arg(1);
        read.cmd("HGET").arg(keys::feed_moved(bucket)).arg("#n");
        let reply = self.query(&read).await?;
        let first: Vec<(String, Vec<(String, String)>)> =
            redis::from_redis_value_ref(at(&reply, 0, &log)?)?;
        let n = match first.into_iter().next() {
            Some((id, fields)) => log_entry(bucket, id, &fields).n.saturating_sub(1),
            None => redis::from_redis_value_ref::<Option<u64>>(at(&reply, 1, &log)?)?.unwrap_or(0),
        };
        let mut conn = self.conn();
        let _: Value = redis::cmd("HSETNX")
            .arg(keys::feed_sent(bucket))
            .arg(url)
            .arg(sent_place("0-0", n))
            .query_async(&mut conn)
            .await?;
        Ok(())
    }

    /// Up to `limit` events of `bucket`'s log after `after`.
    pub async fn feed_read_bucket(
        &self,
        bucket: u32,
        after: &str,
        limit: usize,
    ) -> StoreResult<Vec<LogEntry>> {
        let mut conn = self.conn();
        let items: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
            .arg(keys::feed_log(bucket))
            .arg(format!("({after}"))
            .arg("+")
            .arg("COUNT")
            .arg(limit)
            .query_async(&mut conn)
            .await?;
        Ok(items
            .into_iter()
            .map(|(id, fields)| log_entry(bucket, id, &fields))
            .collect())
    }
}

/// A webhook URL's place in a bucket's log as `presence-feed-sent:{b<k>}`
/// keeps it: the id of the last event it took and that event's ordinal
/// (read back by [`Store::feed_sent`]).
fn sent_place(id: &str, n: u64) -> String {
    format!("{id} {n}")
}

/// A log entry from a stream item's fields.
fn log_entry(bucket: u32, id: String, fields: &[(String, String)]) -> LogEntry {
    let field = |name: &str| {
        fields
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    LogEntry {
        bucket,
        n: field("n").parse().unwrap_or(0),
        owner: field("o"),
        entry: field("e"),
        id,
    }
}
