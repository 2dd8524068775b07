//! The room deadline pass asks the lease before it removes a membership.
//!
//! A membership's deadline lives in its room's slot and is pushed on by its
//! device's refreshes; the device's lease lives in its user's slot. While
//! the room's shard fails over, no refresh reaches the room: a membership
//! whose TTL is shorter than the failover is past its deadline when the
//! shard is back, though its device stayed connected and its lease held all
//! along. Removed then, the others would see it leave, and join again as
//! the device finds it gone.
//!
//! So before the pass removes the memberships past their deadline, it reads
//! their leases, as the lease pass reads a lapsed lease's key before it
//! departs it ([`super::super::passes`]). A membership whose lease is
//! still held by the connection that joined is kept until the lease's
//! deadline, once: the device's next refresh pushes it on, as it pushes
//! every membership its connection holds. One that no refresh pushed on
//! by then is not held by its connection any more (a leave or a join that
//! failed half-way, in a failover), though the connection lives: it goes
//! then, one lease TTL later than its deadline. A membership whose lease
//! lapsed, or went to a newer connection of the device, goes at once, as
//! before.
//!
//! What the pass did is marked in the deadline's fraction (deadlines are
//! whole milliseconds; a refresh or a join writes a whole one over it).

use redis::Value;

use super::super::{Store, StoreResult};
use crate::keys;

/// The fraction of a deadline the pass moved to its lease's deadline: the
/// next time, if no refresh pushed it on meanwhile, it goes.
const KEPT: f64 = 0.25;
/// The fraction of a deadline the pass moved on because its lease could not
/// be read (its user's shard did not answer): asked again, as if new.
const UNREAD: f64 = 0.75;
/// How long a membership whose lease could not be read is kept before the
/// pass asks again.
const UNREAD_RETRY_MS: i64 = 1_000;

/// The connection named in a membership's value, `<joined_at>|<owner>|<state>`.
fn owner_of(value: &Value) -> Option<String> {
    let value: Option<String> = redis::from_redis_value_ref(value).ok()?;
    value?.split('|').nth(1).map(str::to_string)
}

/// Whether `score` carries the fraction `mark`.
fn marked(score: f64, mark: f64) -> bool {
    (score.fract() - mark).abs() < 1e-6
}

/// A membership past its deadline, as the pass found it.
struct Lapsed {
    /// Its room's place in the pass's list of rooms.
    room: usize,
    /// `<user>:<device>`.
    member: String,
    /// Its deadline.
    score: f64,
}

impl Store {
    /// Of the rooms `due` (each with its index score), the memberships past
    /// their deadline at `now`, at most `max` per room (as many as the pass
    /// removes), whose lease the connection that joined still holds are
    /// kept (see the module's docs). Returns, per room, how many
    /// memberships the removal step may take: the lapsed ones looked at and
    /// not kept, which come first by deadline. (One that lapses meanwhile,
    /// before the step's own clock, waits for the next pass, which asks its
    /// lease first; a room whose deadlines could not be read gets 0.)
    pub(super) async fn keep_leased(
        &self,
        due: &[(String, String)],
        now: i64,
        max: usize,
    ) -> StoreResult<Vec<usize>> {
        if due.is_empty() {
            return Ok(Vec::new());
        }
        let (lapsed, looked) = self.lapsed_memberships(due, now, max).await?;
        let kept = self.keep_held(due, &lapsed, now).await?;
        Ok(looked.iter().zip(kept).map(|(l, k)| l - k).collect())
    }

    /// The memberships of `due` past their deadline at `now`, at most `max`
    /// per room, and how many each room has of them.
    async fn lapsed_memberships(
        &self,
        due: &[(String, String)],
        now: i64,
        max: usize,
    ) -> StoreResult<(Vec<Lapsed>, Vec<usize>)> {
        let mut pipe = redis::pipe();
        // A room whose shard does not answer is left for the next pass: the
        // removal step may take none of its memberships (nor would it reach
        // them).
        pipe.ignore_errors();
        for (room, _) in due {
            pipe.cmd("ZRANGE")
                .arg(keys::room_deadlines(room))
                .arg("-inf")
                .arg(now)
                .arg("BYSCORE")
                .arg("LIMIT")
                .arg(0)
                .arg(max)
                .arg("WITHSCORES");
        }
        let replies = self.query(&pipe).await?;
        let mut lapsed = Vec::new();
        let mut looked = vec![0; due.len()];
        for (room, reply) in replies.iter().enumerate().take(due.len()) {
            if let Ok(members) = redis::from_redis_value_ref::<Vec<(String, f64)>>(reply) {
                looked[room] = members.len();
                lapsed.extend(members.into_iter().map(|(member, score)| Lapsed {
                    room,
                    member,
                    score,
                }));
            }
        }
        Ok((lapsed, looked))
    }

    /// Reads the lease of each of `lapsed` and keeps those it holds (see
    /// the module's docs); returns how many it kept per room of `due`.
    async fn keep_held(
        &self,
        due: &[(String, String)],
        lapsed: &[Lapsed],
        now: i64,
    ) -> StoreResult<Vec<usize>> {
        let mut kept = vec![0; due.len()];
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        let mut asked = Vec::with_capacity(lapsed.len());
        for lapse in lapsed {
            let Some((user, device)) = keys::parse_lease_member(&lapse.member) else {
                continue;
            };
            let room = &due[lapse.room].0;
            let lease = keys::lease(user, device);
            pipe.hget(keys::room_members(room), &lapse.member)
                .hget(keys::room_hidden(room), &lapse.member)
                .get(&lease)
                .pttl(&lease);
            asked.push(lapse);
        }
        if asked.is_empty() {
            return Ok(kept);
        }
        let replies = self.query(&pipe).await?;
        let mut keep = redis::pipe();
        keep.ignore_errors();
        for (lapse, reply) in asked.into_iter().zip(replies.chunks(4)) {
            let Some(deadline) = self.kept_until(lapse.score, reply, now) else {
                continue;
            };
            // GT: a refresh that pushed it further meanwhile stands; XX: a
            // membership left meanwhile stays gone.
            keep.cmd("ZADD")
                .arg(keys::room_deadlines(&due[lapse.room].0))
                .arg("XX")
                .arg("GT")
                .arg(deadline)
                .arg(&lapse.member)
                .ignore();
            kept[lapse.room] += 1;
        }
        let total: usize = kept.iter().sum();
        if total > 0 {
            self.query(&keep).await?;
            log::debug!("room deadline pass kept {total} lapsed memberships whose lease holds");
        }
        Ok(kept)
    }

    /// The deadline a lapsed membership (deadline `score`) is kept until,
    /// from `reply`: its value (visible or hidden), its lease and the
    /// lease's TTL; `None` when it goes now.
    fn kept_until(&self, score: f64, reply: &[Value], now: i64) -> Option<f64> {
        let [visible, hidden, lease, left] = reply else {
            return None;
        };
        // No value: a deadline without a membership, which the removal
        // step drops.
        let owner = owner_of(visible).or_else(|| owner_of(hidden))?;
        if let Value::ServerError(_) = lease {
            // Not known whether it holds: asked again shortly.
            return Some((now + UNREAD_RETRY_MS) as f64 + UNREAD);
        }
        // Kept once already, and no refresh came: not held by its
        // connection any more.
        if marked(score, KEPT) || owner_of_lease(lease)? != owner {
            return None;
        }
        match redis::from_redis_value_ref::<i64>(left).ok()? {
            left if left > 0 => Some((now + left) as f64 + KEPT),
            // No TTL (never written so): a TTL on.
            -1 => Some((now + self.ttl_ms as i64) as f64 + KEPT),
            // Lapsed between the two reads.
            _ => None,
        }
    }
}

/// A lease's value, as text (`None`: no lease).
fn owner_of_lease(value: &Value) -> Option<String> {
    redis::from_redis_value_ref::<Option<String>>(value).ok()?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_survive_a_deadline_in_epoch_ms() {
        let deadline = 1_795_801_885_848_i64;
        assert!(marked(deadline as f64 + KEPT, KEPT));
        assert!(!marked(deadline as f64 + UNREAD, KEPT));
        assert!(!marked(deadline as f64, KEPT));
        // As Redis gives a score back.
        let text = format!("{}", deadline as f64 + KEPT);
        assert!(marked(text.parse().unwrap(), KEPT), "{text}");
    }

    #[test]
    fn owner_is_the_second_field() {
        let v = Value::BulkString(b"1795801885848|123456|{\"a\":\"|\"}".to_vec());
        assert_eq!(owner_of(&v).as_deref(), Some("123456"));
        assert_eq!(owner_of(&Value::Nil), None);
        assert_eq!(owner_of(&Value::BulkString(b"junk".to_vec())), None);
    }
}
