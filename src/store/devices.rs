//! Devices ended from outside their connection: `DELETE
//! /api/users/{user}/devices/{device}` takes a device away whoever holds it.

use super::leases::record_offline;
use super::scripts::parse_departure;
use super::{now_ms, Departure, Store, StoreError, StoreResult};
use crate::keys;

impl Store {
    /// Makes `user`'s `device` leave at once, whoever holds its lease: the
    /// same departure step as a close, with the lease left as a tombstone
    /// until its TTL, so that a socket holding it finds it replaced (and
    /// closes with 4001) rather than claiming it again. True when the
    /// device was counted.
    pub async fn take_device(&self, user: &str, device: &str) -> StoreResult<bool> {
        let mut pipe = redis::pipe();
        self.scripts.depart(&mut pipe, user, device, "*", now_ms());
        crate::metrics::departure_steps("close", 1);
        let reply = self.query(&pipe).await?;
        let first = reply
            .first()
            .ok_or_else(|| StoreError::reply(&keys::count(user), "depart: empty reply"))?;
        let departure = parse_departure(&self.report(first, false), user)?;
        let mut follow = redis::pipe();
        if let Departure::Removed {
            last_seen: Some(ts),
        } = departure
        {
            record_offline(&mut follow, self.buckets, user, ts);
        }
        follow
            .zrem(
                keys::leases(self.buckets.of(user)),
                keys::lease_member(user, device),
            )
            .ignore();
        if let Err(e) = self.query(&follow).await {
            log::warn!("{user}/{device}: taken away, but updating the indexes failed: {e}");
        }
        Ok(matches!(departure, Departure::Removed { .. }))
    }
}
