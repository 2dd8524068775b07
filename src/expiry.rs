//! The expiry listener actor, one per node: turns lapsed leases into
//! departures.
//!
//! Two paths lead here, both running the same idempotent departure step, so
//! that any number of nodes may handle the same lease and exactly one
//! transition comes out:
//! - Redis's `expired` keyspace events, on a dedicated pub/sub connection;
//! - the deadline pass: Redis only fires `expired` when it deletes a key,
//!   and beside many live leases its sampler finds the dead ones late, so
//!   every few hundred ms the due members of each bucket of
//!   `presence-leases` are read and departed, which also makes Redis delete
//!   and announce each lapsed key. Each bucket has its own short lock: one
//!   node at a time runs a bucket, and the nodes of a fleet share them.

use std::sync::Arc;
use std::time::Instant;

use actix::prelude::*;

use crate::config::Config;
use crate::keys;
use crate::metrics::METRICS;
use crate::store::{Departure, Store, StoreError};

/// Most due leases one round trip of the deadline pass handles.
const REAP_BATCH: usize = 1_000;
/// Most offline users forgotten per retention round trip.
const TRIM_BATCH: usize = 1_000;

/// A key that Redis announced as expired.
#[derive(Message)]
#[rtype(result = "()")]
struct Expired {
    /// The key name.
    key: String,
}

/// The expiry listener actor.
pub struct ExpiryListener {
    /// Source of the dedicated pub/sub connection.
    client: redis::Client,
    /// Shared Redis handle for the departure step.
    store: Store,
    /// Node id (lock holder name) and timings.
    config: Arc<Config>,
    /// A deadline pass is in flight; the next tick skips.
    reaping: bool,
    /// A reconciliation pass is in flight.
    reconciling: bool,
    /// When the last reconciliation pass started.
    last_reconcile: Instant,
    /// When the last-seen retention trim last ran.
    last_trim: Instant,
    /// Told once the first subscription is in place.
    ready: Option<tokio::sync::oneshot::Sender<()>>,
}

impl ExpiryListener {
    /// A listener that subscribes through `client` and signals `ready`
    /// once first subscribed.
    pub fn new(
        client: redis::Client,
        store: Store,
        config: Arc<Config>,
        ready: tokio::sync::oneshot::Sender<()>,
    ) -> Self {
        Self {
            client,
            store,
            config,
            reaping: false,
            reconciling: false,
            last_reconcile: Instant::now(),
            last_trim: Instant::now(),
            ready: Some(ready),
        }
    }

    /// Starts one deadline pass (and, when due, the retention trim) unless
    /// one is still running; on the node holding the lock, also starts the
    /// reconciliation pass when due.
    fn tick(&mut self, ctx: &mut Context<Self>) {
        if self.reaping {
            return;
        }
        self.reaping = true;
        let store = self.store.clone();
        let node = self.config.node_id.clone();
        let interval = self.config.reaper_interval();
        let trim = (self.last_trim.elapsed() >= self.config.retention_interval())
            .then_some(self.config.last_seen_retention);
        if trim.is_some() {
            self.last_trim = Instant::now();
        }
        let buckets = store.buckets();
        let pass = async move {
            // The buckets side by side, each under its own lock; the node
            // holding bucket 0 also runs the reconciliation when due.
            let passes = buckets.all().map(|bucket| {
                let (store, node) = (&store, &node);
                async move {
                    if !store.hold_reaper_lock(bucket, node, interval * 4).await? {
                        return Ok::<_, StoreError>(false);
                    }
                    let started = Instant::now();
                    loop {
                        let reaped = store.reap_due(bucket, REAP_BATCH).await?;
                        let (seen, removed) = (reaped.looked_at, reaped.removed);
                        if removed > 0 {
                            METRICS.devices_reaped.inc_by(removed as u64);
                            log::debug!("deadline pass removed {removed} lapsed devices");
                        }
                        if seen < REAP_BATCH || started.elapsed() > interval {
                            break;
                        }
                    }
                    if let Some(retention) = trim {
                        let forgotten = store
                            .trim_last_seen_bucket(bucket, retention, TRIM_BATCH)
                            .await?;
                        if forgotten > 0 {
                            log::info!(
                                "forgot {forgotten} users offline for longer than the retention"
                            );
                        }
                    }
                    Ok(true)
                }
            });
            let held = futures_util::future::join_all(passes).await;
            let mut first_error = None;
            let mut holds_first = false;
            for (bucket, result) in held.into_iter().enumerate() {
                match result {
                    Ok(held) => holds_first |= held && bucket == 0,
                    Err(e) => first_error = first_error.or(Some(e)),
                }
            }
            match first_error {
                Some(e) => Err(e),
                None => Ok(holds_first),
            }
        };
        ctx.spawn(pass.into_actor(self).map(|res, act, ctx| {
            act.reaping = false;
            match res {
                Ok(true) => act.maybe_reconcile(ctx),
                Ok(false) => {}
                Err(e) => log::warn!("deadline pass failed: {e}"),
            }
        }));
    }

    /// Runs a full reconciliation pass when one is due and none is running.
    fn maybe_reconcile(&mut self, ctx: &mut Context<Self>) {
        if self.reconciling || self.last_reconcile.elapsed() < self.config.reconcile_interval {
            return;
        }
        self.reconciling = true;
        self.last_reconcile = Instant::now();
        let store = self.store.clone();
        let pass = async move {
            let (mut cursor, mut users, mut repaired) = (0, 0, 0);
            loop {
                let step = store.reconcile_step(cursor).await?;
                let (next, seen, fixed) = (step.next_cursor, step.looked_at, step.repaired);
                users += seen;
                repaired += fixed;
                METRICS.reconcile_repairs.inc_by(fixed as u64);
                cursor = next;
                if cursor == 0 {
                    break;
                }
            }
            let mut pruned = 0;
            for bucket in store.buckets().all() {
                loop {
                    let step = store.prune_online_step(bucket, cursor).await?;
                    let (next, dropped) = (step.next_cursor, step.dropped);
                    pruned += dropped;
                    METRICS.online_pruned.inc_by(dropped as u64);
                    cursor = next;
                    if cursor == 0 {
                        break;
                    }
                }
            }
            Ok::<_, StoreError>((users, repaired, pruned))
        };
        ctx.spawn(pass.into_actor(self).map(|res, act, _| {
            act.reconciling = false;
            match res {
                Ok((users, 0, 0)) => log::debug!("reconciliation: {users} users consistent"),
                Ok((users, repaired, pruned)) => log::info!(
                    "reconciliation: {users} users checked, {repaired} repaired, {pruned} stale online entries dropped"
                ),
                Err(e) => log::warn!("reconciliation failed: {e}"),
            }
        }));
    }
}

impl Actor for ExpiryListener {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        let addr = ctx.address();
        let db = self.client.get_connection_info().redis_settings().db();
        let mut ready = self.ready.take();
        actix::spawn(crate::pubsub::run(
            self.client.clone(),
            keys::expired_channel(db),
            // Events missed while unsubscribed are covered by the deadline
            // pass, which does not depend on them.
            move || {
                if let Some(ready) = ready.take() {
                    let _ = ready.send(());
                }
            },
            move |key| {
                if !addr.connected() {
                    return false;
                }
                addr.do_send(Expired { key });
                true
            },
        ));
        ctx.run_interval(self.config.reaper_interval(), |act, ctx| act.tick(ctx));
    }
}

impl Handler<Expired> for ExpiryListener {
    type Result = ();

    fn handle(&mut self, msg: Expired, ctx: &mut Self::Context) {
        let Some((user, device)) = keys::parse_lease(&msg.key) else {
            return;
        };
        METRICS.expired_events.inc();
        let (user, device) = (user.to_string(), device.to_string());
        let store = self.store.clone();
        let step = async move {
            match store.depart(&user, &device, None).await {
                Ok(Departure::Removed { last_seen }) => log::debug!(
                    "lease of {user}/{device} expired; device removed{}",
                    if last_seen.is_some() {
                        ", user offline"
                    } else {
                        ""
                    }
                ),
                Ok(_) => {}
                Err(e) => log::warn!("departure of expired {user}/{device} failed: {e}"),
            }
        };
        ctx.spawn(step.into_actor(self));
    }
}
