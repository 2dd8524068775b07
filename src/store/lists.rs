//! Lists over many users: who is online now (the buckets of
//! `presence-online`, merged newest first and paged with bounded work), and
//! the retention of last-seen times (`presence-lastseen`).

use std::time::Duration;

use super::reply::int;
use super::{now_ms, Reader, Store, StoreError, StoreResult};
use crate::keys::{self, Buckets};
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
    /// Last refresh of any of the user's devices, epoch ms.
    pub active_at: i64,
}

/// Position in `GET /api/online`: the score reached (last refresh, epoch
/// ms) and, per bucket, how many entries with exactly that score were
/// already examined. Scores are shared (a batch of refreshes writes one
/// time), so a score alone cannot say where a page ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    /// The score reached.
    pub active_at: i64,
    /// Per bucket, the entries at `active_at` already examined.
    pub ties: Vec<u32>,
}

impl Cursor {
    /// The opaque string handed to clients: `<active_at>~<t0>,<t1>,...`.
    pub fn encode(&self) -> String {
        let ties: Vec<String> = self.ties.iter().map(u32::to_string).collect();
        format!("{}~{}", self.active_at, ties.join(","))
    }

    /// Reads a cursor back for `buckets`; `None` when it is not one of ours.
    pub fn decode(s: &str, buckets: Buckets) -> Option<Self> {
        let (at, ties) = s.split_once('~')?;
        let ties: Vec<u32> = ties
            .split(',')
            .map(|t| t.parse().ok())
            .collect::<Option<_>>()?;
        if ties.len() != buckets.count() as usize {
            return None;
        }
        Some(Self {
            active_at: at.parse().ok()?,
            ties,
        })
    }
}

/// Entries one request of the online list may examine, as a multiple of
/// its `limit`: a viewer who may see few of the online users gets a short
/// page and a cursor rather than an unbounded scan.
const EXAMINE_PER_LIMIT: usize = 4;
/// Entries one request may examine at most, whatever its limit.
const MAX_EXAMINED: usize = 2_000;

/// Where a walk over the merged buckets stands.
struct Walk {
    /// Score reached; `None` before the first entry (`+inf`).
    at: Option<i64>,
    /// Per bucket, entries at `at` examined.
    ties: Vec<u32>,
}

impl Walk {
    /// Steps past one entry of `bucket` with `score` (entries come in
    /// descending order).
    fn pass(&mut self, bucket: usize, score: i64) {
        if self.at != Some(score) {
            self.at = Some(score);
            self.ties.iter_mut().for_each(|t| *t = 0);
        }
        self.ties[bucket] += 1;
    }
}

impl Store {
    /// One page of users online now, most recently active first, merged
    /// from the buckets of `presence-online`. `cursor` is the
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

    /// [`Store::online`] for any reader; the service sees invisible users too.
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
        let mut walk = match cursor {
            Some(c) => Walk {
                at: Some(c.active_at),
                ties: c.ties.clone(),
            },
            None => Walk {
                at: None,
                ties: vec![0; buckets],
            },
        };
        let mut users: Vec<OnlineUser> = Vec::with_capacity(limit);
        let mut examined = 0;
        let mut exhausted = false;
        while users.len() < limit && examined < budget {
            let want = budget - examined;
            // From each bucket, its next `per` entries after the walk's
            // position: everything up to its score, less the entries at
            // that score already examined. About twice each bucket's share
            // of what is wanted, so one round trip usually covers it.
            let per = (want.div_ceil(buckets) * 2 + 2).min(want);
            let mut pipe = redis::pipe();
            let max = walk.at.map_or("+inf".to_string(), |s| s.to_string());
            for b in self.buckets.all() {
                pipe.cmd("ZRANGE")
                    .arg(keys::online(b))
                    .arg(&max)
                    .arg("-inf")
                    .arg("BYSCORE")
                    .arg("REV")
                    .arg("LIMIT")
                    .arg(walk.ties[b as usize])
                    .arg(per)
                    .arg("WITHSCORES");
            }
            let reply = self.query(&pipe).await?;
            let mut candidates: Vec<(i64, String, usize)> = Vec::new();
            // The highest of the last entries of the buckets that may hold
            // more: every entry not fetched is below it, so the candidates
            // down to it are the true head of the merged order.
            let mut frontier: Option<(i64, String)> = None;
            for (b, value) in reply.iter().enumerate() {
                let entries: Vec<(String, f64)> = redis::from_redis_value_ref(value)?;
                if entries.len() == per {
                    if let Some((u, s)) = entries.last() {
                        let last = (*s as i64, u.clone());
                        if frontier.as_ref().is_none_or(|f| last > *f) {
                            frontier = Some(last);
                        }
                    }
                }
                candidates.extend(entries.into_iter().map(|(u, s)| (s as i64, u, b)));
            }
            // The buckets' own order: score, then member, descending.
            candidates.sort_unstable_by(|x, y| (y.0, &y.1).cmp(&(x.0, &x.1)));
            let safe = match &frontier {
                Some((fs, fu)) => candidates
                    .iter()
                    .take_while(|(s, u, _)| (*s, u) >= (*fs, fu))
                    .count(),
                None => candidates.len(),
            };
            let mut more = frontier.is_some() || safe > want;
            candidates.truncate(safe.min(want));
            // Read them in chunks: first what could fill the page, then the
            // rest of the budget at once (a viewer who sees few users).
            let mut rest = candidates.into_iter().peekable();
            let mut first = true;
            while users.len() < limit && rest.peek().is_some() {
                let room = limit - users.len();
                let chunk: Vec<(i64, String, usize)> = if first {
                    rest.by_ref().take(room).collect()
                } else {
                    rest.by_ref().collect()
                };
                first = false;
                let names: Vec<String> = chunk.iter().map(|(_, u, _)| u.clone()).collect();
                let records = self.records_as(&names, reader, contacts_only).await?;
                let mut entries = chunk.into_iter().zip(records);
                // Examined one by one, so that a page that fills up stops
                // the walk right after its last user: what follows is the
                // next page's.
                for ((score, _, b), record) in entries.by_ref() {
                    examined += 1;
                    walk.pass(b, score);
                    // Entries of users no longer online (the index is
                    // repaired lazily) and users hidden from this viewer
                    // are skipped.
                    if record.devices > 0 {
                        users.push(OnlineUser {
                            record,
                            active_at: score,
                        });
                        if users.len() == limit {
                            break;
                        }
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
        let next_cursor = match (exhausted, walk.at) {
            (false, Some(active_at)) => Some(
                Cursor {
                    active_at,
                    ties: walk.ties,
                }
                .encode(),
            ),
            _ => None,
        };
        Ok(OnlinePage { users, next_cursor })
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
    fn cursor_round_trips_and_refuses_junk() {
        let b = Buckets::new(3).unwrap();
        let c = Cursor {
            active_at: 17,
            ties: vec![0, 2, 1],
        };
        assert_eq!(Cursor::decode(&c.encode(), b), Some(c));
        assert_eq!(Cursor::decode("17~0,2", b), None);
        assert_eq!(Cursor::decode("x~0,0,0", b), None);
        assert_eq!(Cursor::decode("17~0,-1,0", b), None);
        assert_eq!(Cursor::decode("nodot", b), None);
    }

    #[test]
    fn a_walk_counts_ties_per_bucket() {
        let mut w = Walk {
            at: None,
            ties: vec![0; 2],
        };
        w.pass(0, 10);
        w.pass(1, 10);
        w.pass(1, 10);
        assert_eq!((w.at, w.ties.clone()), (Some(10), vec![1, 2]));
        w.pass(0, 9);
        assert_eq!((w.at, w.ties), (Some(9), vec![1, 0]));
    }
}
