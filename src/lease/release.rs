//! Releasing a device whose connection closed: the atomic departure step,
//! which leaves alone a lease that a newer connection of the same device
//! has taken over, retried through a Redis outage until the lease would
//! have lapsed anyway.

use std::time::{Duration, Instant};

use crate::store::{Departure, Store};

/// First wait before retrying a release that Redis refused.
const RELEASE_RETRY_MIN: Duration = Duration::from_millis(100);
/// Longest wait between release retries.
const RELEASE_RETRY_MAX: Duration = Duration::from_secs(2);

/// Releases a device after its connection closed. While Redis is
/// unreachable it retries until the lease would have lapsed anyway; after
/// that the expiry path owns the departure.
pub async fn release(store: Store, user: String, device: String, owner: String, deadline: i64) {
    release_with(store, user, device, owner, deadline, true).await;
}

/// [`release`], retrying or not: a failed claim's release is tried once.
/// A claim that never reached Redis left nothing to release, and one that
/// is still in Redis is ahead of the release on the same connection; were
/// every failed connect retried for a TTL, clients reconnecting through a
/// Redis outage would pile up one retrying task per attempt.
pub async fn release_with(
    store: Store,
    user: String,
    device: String,
    owner: String,
    deadline: i64,
    retry: bool,
) {
    let give_up = Instant::now() + Duration::from_millis(store.ttl_ms());
    let mut wait = RELEASE_RETRY_MIN;
    loop {
        match store.depart(&user, &device, (&owner, deadline)).await {
            Ok(Departure::Removed { last_seen }) => {
                let offline = if last_seen.is_some() {
                    ", user offline"
                } else {
                    ""
                };
                log::debug!("{user}/{device}: closed, device released{offline}");
            }
            Ok(Departure::Leased { .. }) => {
                log::debug!("{user}/{device}: closed, lease kept by a newer connection")
            }
            Ok(Departure::AlreadyGone) => {
                log::debug!("{user}/{device}: closed, device was already released")
            }
            Err(e) if retry && Instant::now() + wait < give_up => {
                log::debug!("{user}/{device}: release failed ({e}); retrying in {wait:?}");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(RELEASE_RETRY_MAX);
                continue;
            }
            // Expected through an outage for a claim that failed.
            Err(e) if !retry => log::debug!("{user}/{device}: release failed ({e})"),
            Err(e) => log::warn!("{user}/{device}: release failed ({e}); the lease will lapse"),
        }
        return;
    }
}
