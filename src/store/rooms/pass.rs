//! The room deadline pass: each room whose earliest membership deadline
//! may have passed loses its lapsed memberships whose lease is gone
//! (`leased.rs` asks the leases; `room_expire.lua` removes them, and checks
//! and repairs the room's counts and indexes), and its entry in the
//! bucket's index follows its next deadline.

use redis::Value;

use super::super::reply::{at, int, text};
use super::super::{now_ms, Store, StoreResult};
use crate::keys;

impl Store {
    /// The room deadline pass over one bucket: each room whose earliest
    /// membership deadline may have passed loses its lapsed memberships
    /// whose lease is gone (at most `max` per room), and its index entry
    /// follows its next deadline. Returns the rooms looked at and the visible memberships
    /// removed.
    pub async fn reap_rooms(&self, bucket: u32, max: usize) -> StoreResult<(usize, usize)> {
        let now = now_ms();
        let index = keys::room_due(bucket);
        let due = self.scored_up_to(&index, now, max).await?;
        // A lapsed membership whose lease holds is kept (its room's shard
        // was away): the step removes only those whose lease is gone.
        let limits = self.keep_leased(&due, now, max).await?;
        let mut removed = 0;
        for ((room, score), max) in due.iter().zip(limits) {
            // One room that fails (logged) does not hold up the others.
            match self.expire_room(&index, room, score, max).await {
                Ok(n) => removed += n,
                Err(e) => log::warn!("room deadline pass: {room}: {e}"),
            }
        }
        Ok((due.len(), removed))
    }

    /// Removes `room`'s memberships lapsed by now, then moves its entry
    /// in `index` (read with `score`) to its next deadline, or takes it out
    /// when the room is empty.
    async fn expire_room(
        &self,
        index: &str,
        room: &str,
        score: &str,
        max: usize,
    ) -> StoreResult<usize> {
        let k2 = keys::room_deadlines(room);
        let items = self
            .room_change(&self.scripts.room_expire, room, |pipe| {
                pipe.arg(max).arg(self.ttl_ms);
            })
            .await?;
        let items = &items[..];
        let gone: Vec<String> = redis::from_redis_value_ref(at(items, 0, &k2)?)?;
        // The visible ones: a hidden member lapsing is nobody's business,
        // on a public /metrics too.
        let visible = match items.get(3) {
            Some(Value::Array(events)) => events
                .iter()
                .filter(|e| match e {
                    Value::BulkString(b) => !b.windows(11).any(|w| w == br#""to":"user""#),
                    _ => false,
                })
                .count(),
            _ => 0,
        };
        let next = text(at(items, 1, &k2)?, &k2)?;
        let repaired = int(at(items, 2, &k2)?, &k2)?;
        if repaired > 0 {
            log::warn!("room {room}: reconciliation repaired {repaired} entries of its counts and deadlines");
            crate::metrics::METRICS
                .reconcile_repairs
                .inc_by(repaired as u64);
        }
        let mut beside = redis::pipe();
        for member in &gone {
            if let Some((user, device)) = keys::parse_lease_member(member) {
                beside
                    .hdel(keys::user_rooms(user), keys::user_room(device, room))
                    .ignore();
            }
        }
        if next.is_empty() {
            self.scripts.zrem_if(&mut beside, index, room, score);
            beside.zcard(&k2);
            let reply = self.query(&beside).await?;
            // A join may have come between the step and the removal: its
            // own index write may have landed before the removal, so the
            // room is read once more and put back when it has members.
            if let Some(Value::Int(n)) = reply.last() {
                if *n > 0 {
                    let first: Vec<(String, f64)> = redis::cmd("ZRANGE")
                        .arg(&k2)
                        .arg(0)
                        .arg(0)
                        .arg("WITHSCORES")
                        .query_async(&mut self.conn())
                        .await?;
                    if let Some((_, deadline)) = first.first() {
                        redis::cmd("ZADD")
                            .arg(index)
                            .arg("LT")
                            .arg(*deadline)
                            .arg(room)
                            .query_async::<()>(&mut self.conn())
                            .await?;
                    }
                }
            }
        } else {
            beside
                .cmd("ZADD")
                .arg(index)
                .arg("XX")
                .arg(&next)
                .arg(room)
                .ignore();
            self.query(&beside).await?;
        }
        Ok(visible)
    }
}
