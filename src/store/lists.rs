//! Lists over many users: who is online now (the buckets of
//! `presence-leases`, merged newest first and paged with bounded work), and
//! the retention of last-seen times (`presence-lastseen`).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use super::claims::is_taken;
use super::cursor::Cursor;
use super::reply::int;
use super::scripts::parse_read;
use super::{now_ms, Reader, Store, StoreError, StoreResult};
use crate::keys;
use crate::model::Record;

/// One page of `GET /api/online`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct OnlinePage {
    /// Users online now, most recently active first.
    pub users: Vec<OnlineUser>,
    /// Pass back as `cursor` for the next page; `None` on the last one.
    pub next_cursor: Option<String>,
}

/// One entry of [`OnlinePage`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct OnlineUser {
    /// The user's record.
    #[serde(flatten)]
    pub record: Record,
    /// Last refresh of the user's most recently refreshed device, epoch
    /// ms (its lease deadline less the lease TTL).
    pub active_at: i64,
}

/// Entries one request of the online list may examine, as a multiple of
/// its `limit`: a viewer who may see few of the online users gets a short
/// page and a cursor rather than an unbounded scan.
pub(super) const EXAMINE_PER_LIMIT: usize = 4;
/// Entries one request may examine at most, whatever its limit.
pub(super) const MAX_EXAMINED: usize = 2_000;

/// Where a walk over the merged buckets stands.
pub(super) struct Walk {
    /// Score reached; `None` before the first entry (`+inf`).
    pub(super) at: Option<f64>,
    /// Per bucket, entries at `at` examined.
    pub(super) ties: Vec<u32>,
}

impl Walk {
    /// Steps past one entry of `bucket` with `score` (entries come in
    /// descending order).
    pub(super) fn pass(&mut self, bucket: usize, score: f64) {
        if self.at != Some(score) {
            self.at = Some(score);
            self.ties.iter_mut().for_each(|t| *t = 0);
        }
        self.ties[bucket] += 1;
    }
}

/// The walk's order: score, then member, both descending (the buckets'
/// own `REV` order).
fn before(a: (f64, &str), b: (f64, &str)) -> bool {
    a.0.total_cmp(&b.0).then_with(|| a.1.cmp(b.1)) == std::cmp::Ordering::Greater
}

/// One candidate entry of the walk: score, member, bucket.
pub(super) type Entry = (f64, String, usize);

impl Walk {
    /// A walk from `cursor`'s position, or from the newest entry.
    fn from(cursor: Option<&Cursor>, buckets: usize) -> Self {
        match cursor {
            Some(c) => Self {
                at: Some(c.score),
                ties: c.ties.clone(),
            },
            None => Self {
                at: None,
                ties: vec![0; buckets],
            },
        }
    }

    /// The cursor of the next page, which starts where this walk stopped.
    fn cursor(self) -> Option<Cursor> {
        let score = self.at?;
        Some(Cursor {
            score,
            ties: self.ties,
        })
    }
}

/// What the online list reads of one user: what the reader may see of it,
/// and its counted devices with the current score of each one's entry
/// (`None`: no unclaimed entry).
struct Candidate {
    /// The reader's view of the user.
    record: Record,
    /// Counted devices, each with its entry's score when it has an
    /// unclaimed one.
    devices: Vec<(String, Option<f64>)>,
}

impl Candidate {
    /// Whether the entry `(score, member)` of `user`'s `device` lists the
    /// user. Entries of devices no longer counted (the index is repaired
    /// lazily), entries after the user's first and users hidden from this
    /// reader list no one.
    fn listed_at(&self, user: &str, device: &str, score: f64, member: &str) -> bool {
        let counted = self.devices.iter().any(|(d, _)| d == device);
        let first_of_user = self.devices.iter().all(|(d, s)| {
            d == device
                || s.is_none_or(|s| {
                    let other = keys::lease_member(user, d);
                    !before((s, other.as_str()), (score, member))
                })
        });
        counted && first_of_user && self.record.devices != 0
    }
}

impl Store {
    /// One page of users online now, most recently active first, merged
    /// from the buckets of `presence-leases`. `cursor` is the
    /// `next_cursor` of the previous page. Only users `viewer` may see
    /// online are listed, and one request examines at most
    /// 4 x `limit` entries (2,000 at most): a page may be short, or empty,
    /// with a `next_cursor` to go on from. Scores move as devices refresh,
    /// so the list is a view of "now", not a snapshot.
    pub async fn online(
        &self,
        limit: usize,
        cursor: Option<&Cursor>,
        viewer: Option<&str>,
        contacts_only: bool,
    ) -> StoreResult<OnlinePage> {
        self.online_as(limit, cursor, Reader::Viewer(viewer), contacts_only)
            .await
    }

    /// A `next_cursor` this fleet handed out, read back; `None` when it is
    /// not one (made up or changed).
    pub fn open_cursor(&self, s: &str) -> Option<Cursor> {
        self.cursor_key.open(s, self.buckets)
    }

    /// [`Store::online`] for any reader; the service sees invisible users too.
    ///
    /// The index holds one entry per device (`<user>:<device>`, its lease
    /// deadline), so a user with several devices has several: the user is
    /// listed at the first of its counted devices' unclaimed entries in the
    /// walk's order, the newest, and every other entry of it is passed over,
    /// on this page and on the pages after it. Claimed entries (lapsed
    /// leases on their way out) and entries of devices no longer counted
    /// list no one.
    pub async fn online_as(
        &self,
        limit: usize,
        cursor: Option<&Cursor>,
        reader: Reader<'_>,
        contacts_only: bool,
    ) -> StoreResult<OnlinePage> {
        let limit = limit.max(1);
        let budget = (EXAMINE_PER_LIMIT * limit).min(MAX_EXAMINED).max(limit);
        let buckets = self.buckets.count() as usize;
        let mut walk = Walk::from(cursor, buckets);
        let mut users: Vec<OnlineUser> = Vec::with_capacity(limit);
        let mut listed: HashSet<String> = HashSet::new();
        let mut examined = 0;
        let mut exhausted = false;
        while users.len() < limit && examined < budget {
            let want = budget - examined;
            // From each bucket, its next `per` entries after the walk's
            // position: everything up to its score, less the entries at
            // that score already examined. About twice each bucket's share
            // of what is wanted, so one round trip usually covers it.
            let per = (want.div_ceil(buckets) * 2 + 2).min(want);
            let (candidates, mut more) = self
                .next_round(&walk, per, want, (keys::leases, "-inf"))
                .await?;
            // Read them in chunks: first what could fill the page, then the
            // rest of the budget at once (a viewer who sees few users).
            let mut rest = candidates.into_iter().peekable();
            let mut first = true;
            while users.len() < limit && rest.peek().is_some() {
                let room = limit - users.len();
                let chunk: Vec<Entry> = if first {
                    rest.by_ref().take(room).collect()
                } else {
                    rest.by_ref().collect()
                };
                first = false;
                let mut names: Vec<&str> = Vec::new();
                let mut named: HashSet<&str> = HashSet::new();
                for (score, member, _) in &chunk {
                    if let Some((user, _)) = keys::parse_lease_member(member) {
                        if !is_taken(*score) && !listed.contains(user) && named.insert(user) {
                            names.push(user);
                        }
                    }
                }
                let read = self
                    .online_candidates(&names, reader, contacts_only)
                    .await?;
                let mut entries = chunk.iter();
                // Examined one by one, so that a page that fills up stops
                // the walk right after its last user: what follows is the
                // next page's.
                for (score, member, b) in entries.by_ref() {
                    examined += 1;
                    walk.pass(*b, *score);
                    let Some((user, device)) = keys::parse_lease_member(member) else {
                        continue;
                    };
                    if is_taken(*score) || listed.contains(user) {
                        continue;
                    }
                    let Some(c) = read.get(user) else { continue };
                    if !c.listed_at(user, device, *score, member) {
                        continue;
                    }
                    listed.insert(user.to_string());
                    users.push(OnlineUser {
                        record: c.record.clone(),
                        active_at: *score as i64 - self.ttl_ms as i64,
                    });
                    if users.len() == limit {
                        break;
                    }
                }
                if entries.next().is_some() {
                    more = true;
                }
            }
            if rest.peek().is_some() {
                more = true;
            }
            if !more {
                exhausted = true;
                break;
            }
        }
        let next_cursor = if exhausted {
            None
        } else {
            walk.cursor().map(|c| self.cursor_key.seal(&c))
        };
        Ok(OnlinePage { users, next_cursor })
    }

    /// One round of the walk: from each bucket, its next `per` entries
    /// after the walk's position (everything up to its score, less the
    /// entries at that score already examined), merged in the walk's order
    /// and cut where an entry not fetched could come first, and at `want`.
    /// Also whether entries may follow them. `(index, min)`: the buckets
    /// walked (`presence-leases`, or `presence-lastseen` for the recently
    /// seen) and the lowest score wanted.
    pub(super) async fn next_round(
        &self,
        walk: &Walk,
        per: usize,
        want: usize,
        (index, min): (fn(u32) -> String, &str),
    ) -> StoreResult<(Vec<Entry>, bool)> {
        let mut pipe = redis::pipe();
        let max = walk.at.map_or("+inf".to_string(), |s| s.to_string());
        for b in self.buckets.all() {
            pipe.cmd("ZRANGE")
                .arg(index(b))
                .arg(&max)
                .arg(min)
                .arg("BYSCORE")
                .arg("REV")
                .arg("LIMIT")
                .arg(walk.ties[b as usize])
                .arg(per)
                .arg("WITHSCORES");
        }
        let reply = self.query(&pipe).await?;
        let mut candidates: Vec<Entry> = Vec::new();
        // The first in the walk's order of the last entries of the
        // buckets that may hold more: every entry not fetched comes
        // after it, so the candidates down to it are the true head of
        // the merged order.
        let mut frontier: Option<(f64, String)> = None;
        for (b, value) in reply.iter().enumerate() {
            let entries: Vec<(String, f64)> = redis::from_redis_value_ref(value)?;
            if entries.len() == per {
                if let Some((m, s)) = entries.last() {
                    if frontier
                        .as_ref()
                        .is_none_or(|(fs, fm)| before((*s, m.as_str()), (*fs, fm.as_str())))
                    {
                        frontier = Some((*s, m.clone()));
                    }
                }
            }
            candidates.extend(entries.into_iter().map(|(m, s)| (s, m, b)));
        }
        candidates.sort_unstable_by(|x, y| y.0.total_cmp(&x.0).then_with(|| y.1.cmp(&x.1)));
        let safe = match &frontier {
            Some((fs, fm)) => candidates
                .iter()
                .take_while(|(s, m, _)| !before((*fs, fm.as_str()), (*s, m.as_str())))
                .count(),
            None => candidates.len(),
        };
        let more = frontier.is_some() || safe > want;
        candidates.truncate(safe.min(want));
        Ok((candidates, more))
    }

    /// What the online list needs of `users`, in two round trips at most:
    /// each user's record as `reader` may see it (`read.lua`, the same
    /// view as every other read) and its counted devices (the hash's
    /// fields); then, for the users with more than one, the current score
    /// of each device's entry in `presence-leases` (`ZMSCORE`).
    async fn online_candidates(
        &self,
        users: &[&str],
        reader: Reader<'_>,
        contacts_only: bool,
    ) -> StoreResult<HashMap<String, Candidate>> {
        if users.is_empty() {
            return Ok(HashMap::new());
        }
        let viewer = match reader {
            Reader::Viewer(v) => v,
            Reader::Service => None,
        };
        let mut pipe = redis::pipe();
        for user in users {
            self.scripts.read(&mut pipe, user, viewer);
            pipe.hkeys(keys::status(user));
        }
        let reply = self.query(&pipe).await?;
        if reply.len() != 2 * users.len() {
            return Err(StoreError::reply(
                "read",
                format!("{} replies to {} reads", reply.len(), 2 * users.len()),
            ));
        }
        let mut out = HashMap::with_capacity(users.len());
        let mut scores = redis::pipe();
        let mut asked: Vec<&str> = Vec::new();
        for (user, pair) in users.iter().zip(reply.chunks(2)) {
            let observed = parse_read(&pair[0], user)?;
            let fields: Vec<String> = redis::from_redis_value_ref(&pair[1])?;
            let devices: Vec<(String, Option<f64>)> = fields
                .iter()
                .filter_map(|f| keys::parse_device_field(f))
                .map(|d| (d.to_string(), None))
                .collect();
            if devices.len() > 1 {
                let cmd = scores
                    .cmd("ZMSCORE")
                    .arg(keys::leases(self.buckets.of(user)));
                for (d, _) in &devices {
                    cmd.arg(keys::lease_member(user, d));
                }
                asked.push(user);
            }
            let record = super::records::view_as(&observed, reader, contacts_only);
            out.insert(user.to_string(), Candidate { record, devices });
        }
        if !asked.is_empty() {
            let reply = self.query(&scores).await?;
            for (user, value) in asked.iter().zip(&reply) {
                let found: Vec<Option<f64>> = redis::from_redis_value_ref(value)?;
                if let Some(c) = out.get_mut(*user) {
                    for ((_, slot), s) in c.devices.iter_mut().zip(found) {
                        *slot = s.filter(|s| !is_taken(*s));
                    }
                }
            }
        }
        Ok(out)
    }

    /// Forgets users offline for longer than `retention`: their last seen
    /// (index entry and field) and status text, when no device came back.
    /// Returns how many were forgotten (at most `max` per bucket and call).
    pub async fn trim_last_seen(&self, retention: Duration, max: usize) -> StoreResult<usize> {
        let mut forgotten = 0;
        for bucket in self.buckets.all() {
            forgotten += self.trim_last_seen_bucket(bucket, retention, max).await?;
        }
        Ok(forgotten)
    }

    /// [`Store::trim_last_seen`] for one bucket; at most `max` users.
    pub async fn trim_last_seen_bucket(
        &self,
        bucket: u32,
        retention: Duration,
        max: usize,
    ) -> StoreResult<usize> {
        let index = keys::last_seen(bucket);
        let retention_ms = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
        let cutoff = now_ms().saturating_sub(retention_ms);
        let old = self.scored_up_to(&index, cutoff, max).await?;
        if old.is_empty() {
            return Ok(0);
        }
        let mut pipe = redis::pipe();
        for (user, score) in &old {
            self.scripts.zrem_if(&mut pipe, &index, user, score);
        }
        let reply = self.query(&pipe).await?;
        if reply.len() != old.len() {
            return Err(StoreError::reply(
                &index,
                format!("{} replies to {} removals", reply.len(), old.len()),
            ));
        }
        let mut forget = redis::pipe();
        let mut forgotten = 0;
        for ((user, _), removed) in old.iter().zip(&reply) {
            if int(removed, &index)? == 1 {
                forgotten += 1;
                // Only when offline: a user online again keeps all of it.
                self.scripts.forget_offline(&mut forget, user).ignore();
            }
        }
        self.query(&forget).await?;
        Ok(forgotten)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_walk_counts_ties_per_bucket() {
        let mut w = Walk {
            at: None,
            ties: vec![0; 2],
        };
        w.pass(0, 10.0);
        w.pass(1, 10.0);
        w.pass(1, 10.0);
        assert_eq!((w.at, w.ties.clone()), (Some(10.0), vec![1, 2]));
        w.pass(0, 9.5);
        assert_eq!((w.at, w.ties), (Some(9.5), vec![1, 0]));
    }

    #[test]
    fn the_walk_order_is_score_then_member_descending() {
        assert!(before((10.0, "a:x"), (9.5, "z:z")));
        assert!(before((10.0, "b:x"), (10.0, "a:x")));
        assert!(!before((10.0, "a:x"), (10.0, "a:x")));
    }
}
