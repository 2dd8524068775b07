//! Devices ended from outside their connection: `DELETE
//! /api/users/{user}/devices/{device}` takes a device away whoever holds it.

use super::{Departure, Store, StoreResult};
use crate::keys;

impl Store {
    /// Makes `user`'s `device` leave at once, whoever holds its lease: the
    /// same departure step as a close, with the lease left as a tombstone
    /// until its TTL, so that a socket holding it finds it replaced (and
    /// closes with 4001) rather than claiming it again. True when the
    /// device was counted.
    pub async fn take_device(&self, user: &str, device: &str) -> StoreResult<bool> {
        let (departure, mut follow) = self.depart_step(user, device, "*").await?;
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
