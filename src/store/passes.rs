//! The node's periodic passes over Redis: the deadline pass that makes
//! expiry timely (per bucket, each under its own short lock, so that the
//! nodes of a fleet share the buckets and no two run the same one), the
//! reconciliation that repairs devices and counters after missed events.

use std::time::Duration;

use super::claims::claim;
use super::leases::record_offline;
use super::reply::int;
use super::scripts::{parse_departure, parse_reconciled};
use super::{now_ms, Departure, Store, StoreError, StoreResult};
use crate::keys;

/// Keys asked for per SCAN step of the reconciliation.
const RECONCILE_SCAN_COUNT: usize = 500;

/// What one step of the deadline pass did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reaped {
    /// Due leases looked at.
    pub looked_at: usize,
    /// Devices the step removed.
    pub removed: usize,
}

/// What one step of the reconciliation scan did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reconciliation {
    /// SCAN cursor to continue from; 0 when the pass is over.
    pub next_cursor: u64,
    /// Users looked at.
    pub looked_at: usize,
    /// Users repaired.
    pub repaired: usize,
    /// Users left with at least one device (invisible ones included).
    pub online: usize,
}

impl Store {
    /// Records the users online fleet-wide, as the reconciliation pass that
    /// just ended counted them, for every node's `presence_online_users`.
    pub async fn record_online_users(&self, users: usize) -> StoreResult<()> {
        let mut conn = self.conn();
        redis::cmd("HSET")
            .arg(keys::STATS)
            .arg("online_users")
            .arg(users)
            .arg("counted_at")
            .arg(now_ms())
            .query_async::<()>(&mut conn)
            .await?;
        Ok(())
    }

    /// The users online fleet-wide as the last reconciliation pass counted
    /// them; `None` before any pass ended.
    pub async fn online_users(&self) -> StoreResult<Option<u64>> {
        let mut conn = self.conn();
        Ok(redis::cmd("HGET")
            .arg(keys::STATS)
            .arg("online_users")
            .query_async(&mut conn)
            .await?)
    }

    /// Takes or keeps the deadline-pass lock of `bucket` for `hold`; true
    /// when this node holds it.
    pub async fn hold_reaper_lock(
        &self,
        bucket: u32,
        node: &str,
        hold: Duration,
    ) -> StoreResult<bool> {
        self.hold_lock(&keys::reaper_lock(bucket), node, hold).await
    }

    /// Takes or keeps the short lock `lock` for `hold` in the name of
    /// `node`; true when this node holds it.
    pub async fn hold_lock(&self, lock: &str, node: &str, hold: Duration) -> StoreResult<bool> {
        let mut conn = self.conn();
        let ms = hold.as_millis() as u64;
        let taken: Option<String> = redis::cmd("SET")
            .arg(lock)
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
        let mut pipe = redis::pipe();
        self.scripts.lock_keep(&mut pipe, lock, node, ms);
        let reply = self.query(&pipe).await?;
        let kept = reply
            .first()
            .ok_or_else(|| StoreError::reply(lock, "lock_keep: empty reply"))?;
        Ok(int(kept, lock)? == 1)
    }

    /// One step of the deadline pass over `bucket`: departs up to `max`
    /// leases whose deadline in `presence-leases:{b<k>}` has passed.
    ///
    /// Each entry is first claimed (see [`super::claims::claim_score`]), and only the
    /// entries this call claimed are departed. Reading a lapsed lease makes
    /// Redis delete it and announce it; the node that owns those `expired`
    /// events claims the same way, so that whichever comes first departs
    /// the lease and the other leaves it: an expired lease costs one
    /// departure step in the fleet. The pass is correct without any
    /// listener, and an entry whose claimant failed comes due again.
    pub async fn reap_due(&self, bucket: u32, max: usize) -> StoreResult<Reaped> {
        let now = now_ms();
        let index = keys::leases(bucket);
        let due = self.scored_up_to(&index, now, max).await?;
        if due.is_empty() {
            return Ok(Reaped {
                looked_at: 0,
                removed: 0,
            });
        }
        let mut claims = redis::pipe();
        let mut asked = Vec::with_capacity(due.len());
        for (member, score) in &due {
            let Ok(score) = score.parse::<f64>() else {
                log::warn!("dropping {member:?} from {index}: score {score:?}");
                claims.zrem(&index, member).ignore();
                continue;
            };
            claim(&mut claims, &index, member, score);
            asked.push(member);
        }
        let replies = self.query(&claims).await?;
        let claimed: Vec<String> = asked
            .into_iter()
            .zip(replies)
            .filter(|(_, won)| matches!(won, redis::Value::Int(1)))
            .map(|(member, _)| member.clone())
            .collect();
        let removed = self.depart_due(&index, &claimed, now, "pass").await?;
        Ok(Reaped {
            looked_at: due.len(),
            removed,
        })
    }

    /// Runs the departure step for each of `due`, lapsed leases this node
    /// claimed in `index`, and settles each entry (counted under `path`,
    /// one of [`crate::metrics::DEPARTURE_PATHS`]); returns how many
    /// devices it removed.
    pub(super) async fn depart_due(
        &self,
        index: &str,
        due: &[String],
        now: i64,
        path: &'static str,
    ) -> StoreResult<usize> {
        if due.is_empty() {
            return Ok(0);
        }
        let mut pipe = redis::pipe();
        // One bad entry must not stall the pass for everyone.
        pipe.ignore_errors();
        let mut pre = redis::pipe();
        let mut steps = 0;
        for member in due {
            match keys::parse_lease_member(member) {
                Some((user, device)) => {
                    let feed = self.feed_of(user);
                    if let Some(feed) = &feed {
                        self.feed_due_before(&mut pre, feed);
                    }
                    self.scripts
                        .depart(&mut pipe, user, device, "", now, feed.as_ref());
                    steps += 1;
                }
                None => {
                    pipe.cmd("ECHO").arg("not a lease member");
                }
            }
        }
        crate::metrics::departure_steps(path, steps);
        self.send_due(pre);
        let reply = self.query(&pipe).await?;
        if reply.len() != due.len() {
            return Err(StoreError::reply(
                index,
                format!("{} replies to {} departures", reply.len(), due.len()),
            ));
        }
        let mut removed = 0;
        let mut follow = redis::pipe();
        for (member, value) in due.iter().zip(&reply) {
            let parsed = keys::parse_lease_member(member);
            let departure =
                match parsed.map(|(user, _)| parse_departure(&self.report(value, false), user)) {
                    Some(Ok(d)) => d,
                    None => {
                        log::warn!("dropping {member:?} from {index}: not <user>:<device>");
                        Departure::AlreadyGone
                    }
                    Some(Err(e)) => {
                        log::warn!("dropping {member:?} from {index}: {e}");
                        Departure::AlreadyGone
                    }
                };
            match departure {
                Departure::Leased { ttl_ms } => {
                    let left = ttl_ms.unwrap_or(self.ttl_ms) as i64;
                    // The deadline moves up, never down, and a removed
                    // entry is not brought back.
                    follow
                        .cmd("ZADD")
                        .arg(index)
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
                            record_offline(&mut follow, self.buckets, user, ts);
                        }
                    }
                    // Should the device have come back meanwhile, its next
                    // refresh (ZADD GT) puts its entry back.
                    follow.zrem(index, member).ignore();
                }
            }
        }
        self.query(&follow).await?;
        Ok(removed)
    }

    /// One step of the reconciliation scan over the users' hashes: repairs
    /// each user whose devices or counter disagree with the live leases and
    /// publishes the transition that follows, once. `cursor` is the SCAN
    /// cursor (0 starts a pass) on `node`, one of [`Store::data_nodes`]:
    /// on a cluster each primary is walked on its own.
    pub async fn reconcile_step(
        &self,
        node: &crate::redis::conn::NodeAddr,
        cursor: u64,
    ) -> StoreResult<Reconciliation> {
        let mut conn = self.conn();
        let (next, found) = self
            .scan_users(
                node,
                cursor,
                keys::STATUS_PATTERN,
                RECONCILE_SCAN_COUNT,
                keys::parse_status,
            )
            .await?;
        let found: Vec<&str> = found.iter().map(String::as_str).collect();
        // Statuses that end, whether or not their user is online.
        self.reindex_until(&found).await?;
        let mut pipe = redis::pipe();
        for user in &found {
            pipe.hkeys(keys::status(user));
        }
        let fields: Vec<Vec<String>> = if found.is_empty() {
            Vec::new()
        } else {
            pipe.query_async(&mut conn).await?
        };
        // Users with counted devices; the hash of a user offline for good
        // holds none and needs no look.
        let (users, members): (Vec<&str>, Vec<Vec<String>>) = found
            .into_iter()
            .zip(fields)
            .map(|(user, fields)| {
                let devices: Vec<String> = fields
                    .iter()
                    .filter_map(|f| keys::parse_device_field(f))
                    .map(str::to_string)
                    .collect();
                (user, devices)
            })
            .filter(|(_, devices)| !devices.is_empty())
            .unzip();
        if users.is_empty() {
            return Ok(Reconciliation {
                next_cursor: next,
                looked_at: 0,
                repaired: 0,
                online: 0,
            });
        }
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        let now = now_ms();
        for (user, devices) in users.iter().zip(&members) {
            let feed = self.feed_of(user);
            self.scripts
                .reconcile(&mut pipe, user, devices, now, feed.as_ref());
        }
        let reply = self.query(&pipe).await?;
        let (mut repaired, mut online) = (0, users.len());
        for (user, value) in users.iter().zip(&reply) {
            let r = match parse_reconciled(&self.report(value, false), user) {
                Ok(r) => r,
                Err(e) => {
                    log::warn!("reconciliation of {user} failed: {e}");
                    continue;
                }
            };
            if r.new_count == 0 {
                online -= 1;
            }
            if r.removed == 0 && r.old_count == r.new_count {
                continue;
            }
            repaired += 1;
            log::info!(
                "reconciliation repaired {user}: {} device(s) without a lease removed, counter {} -> {}{}",
                r.removed,
                r.old_count,
                r.new_count,
                if r.transition { ", transition published" } else { "" }
            );
        }
        Ok(Reconciliation {
            next_cursor: next,
            looked_at: users.len(),
            repaired,
            online,
        })
    }
}
