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
//!
//! On a Redis Cluster the events come from every primary, each primary's
//! stream owned by one node at a time (`streams.rs`).

mod streams;

use std::sync::Arc;
use std::time::Instant;

use actix::prelude::*;

use crate::config::Config;
use crate::keys;
use crate::metrics::METRICS;
use crate::redis::Source;
use crate::store::{Store, StoreError};

/// A deadline-pass lock is held for this many ticks of the pass; its holder
/// renews it once half of that has gone, and a node that found it taken
/// asks again after as long. So a dead holder's buckets are taken over
/// within one hold (4 ticks, at most 1 s), and a fleet's lock traffic is a
/// few commands per bucket and second, not one per bucket and tick.
const LOCK_HOLD_TICKS: u32 = 4;

/// How often each node reads the fleet's online users for its metrics.
const ONLINE_USERS_READ: std::time::Duration = std::time::Duration::from_secs(10);

/// What a node knows of one bucket's deadline-pass lock.
#[derive(Debug, Clone, Copy, Default)]
struct LockView {
    /// This node holds it until then (as of its last take or renewal).
    held_until: Option<Instant>,
    /// Another node held it: ask again no sooner than then.
    next_ask: Option<Instant>,
}

/// What one tick does about one bucket's lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LockStep {
    /// Held with time to spare: run the bucket without asking Redis.
    Held,
    /// Take it, or renew it: held by nobody, or by us but half spent.
    Ask,
    /// Another node holds it: leave the bucket to it.
    Wait,
}

impl LockView {
    fn step(&self, now: Instant, hold: std::time::Duration) -> LockStep {
        match (self.held_until, self.next_ask) {
            (Some(until), _) if until > now + hold / 2 => LockStep::Held,
            (Some(_), _) => LockStep::Ask,
            (None, Some(at)) if at > now => LockStep::Wait,
            _ => LockStep::Ask,
        }
    }

    /// Takes in the outcome of a tick that started at `started`.
    fn settle(&mut self, step: LockStep, held: bool, started: Instant, hold: std::time::Duration) {
        match (step, held) {
            (LockStep::Ask, true) => {
                *self = Self {
                    held_until: Some(started + hold),
                    next_ask: None,
                }
            }
            (LockStep::Ask, false) => {
                *self = Self {
                    held_until: None,
                    next_ask: Some(started + hold / 2),
                }
            }
            _ => {}
        }
    }
}

/// Buckets of `store`'s indexes, as a count.
fn store_buckets(store: &Store) -> usize {
    store.buckets().count() as usize
}

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
    /// Source of the dedicated pub/sub connection(s).
    client: Source,
    /// Shared Redis handle for the departure step.
    store: Store,
    /// Node id (lock holder name) and timings.
    config: Arc<Config>,
    /// A deadline pass is in flight; the next tick skips.
    reaping: bool,
    /// The last deadline pass failed (said once, not every tick).
    reap_failing: bool,
    /// A reconciliation pass is in flight.
    reconciling: bool,
    /// Told of every tick, for `/readyz`.
    readiness: Option<Arc<crate::readiness::Readiness>>,
    /// When the last reconciliation pass started.
    last_reconcile: Instant,
    /// When the last-seen retention trim last ran.
    last_trim: Instant,
    /// Per bucket, what this node knows of the bucket's deadline-pass lock.
    locks: Vec<LockView>,
    /// Told once the first subscription is in place.
    ready: Option<tokio::sync::oneshot::Sender<()>>,
}

impl ExpiryListener {
    /// A listener that subscribes through `client` and signals `ready`
    /// once its first round of stream ownership is settled.
    pub fn new(
        client: impl Into<Source>,
        store: Store,
        config: Arc<Config>,
        ready: tokio::sync::oneshot::Sender<()>,
    ) -> Self {
        let buckets = store_buckets(&store);
        Self {
            client: client.into(),
            store,
            config,
            reaping: false,
            reap_failing: false,
            readiness: None,
            reconciling: false,
            last_reconcile: Instant::now(),
            last_trim: Instant::now(),
            locks: vec![LockView::default(); buckets],
            ready: Some(ready),
        }
    }

    /// Starts one deadline pass (and, when due, the retention trim) unless
    /// one is still running; on the node holding the lock, also starts the
    /// reconciliation pass when due.
    /// Tells `readiness` of every deadline pass that goes through.
    pub fn with_readiness(mut self, readiness: Arc<crate::readiness::Readiness>) -> Self {
        self.readiness = Some(readiness);
        self
    }

    fn tick(&mut self, ctx: &mut Context<Self>) {
        if self.reaping {
            return;
        }
        self.reaping = true;
        let store = self.store.clone();
        let node = self.config.node_id.clone();
        let interval = self.config.reaper_interval();
        let hold = interval * LOCK_HOLD_TICKS;
        let trim = (self.last_trim.elapsed() >= self.config.retention_interval())
            .then_some(self.config.last_seen_retention);
        if trim.is_some() {
            self.last_trim = Instant::now();
        }
        let now = Instant::now();
        let plan: Vec<LockStep> = self.locks.iter().map(|l| l.step(now, hold)).collect();
        let pass = async move {
            // The buckets side by side, each under its own lock; the node
            // holding bucket 0 also runs the reconciliation when due.
            let passes = plan.into_iter().enumerate().map(|(bucket, step)| {
                let (store, node) = (&store, &node);
                let bucket = bucket as u32;
                async move {
                    let held = match step {
                        LockStep::Held => true,
                        LockStep::Wait => false,
                        LockStep::Ask => store.hold_reaper_lock(bucket, node, hold).await?,
                    };
                    if !held {
                        return Ok::<_, StoreError>((step, false));
                    }
                    run_bucket(store, bucket, interval, trim).await?;
                    Ok((step, true))
                }
            });
            futures_util::future::join_all(passes).await
        };
        ctx.spawn(pass.into_actor(self).map(move |results, act, ctx| {
            act.reaping = false;
            let mut first_error = None;
            for (lock, result) in act.locks.iter_mut().zip(results) {
                match result {
                    Ok((step, held)) => lock.settle(step, held, now, hold),
                    Err(e) => {
                        // Unknown: ask again next tick.
                        *lock = LockView::default();
                        first_error = first_error.or(Some(e));
                    }
                }
            }
            match first_error {
                Some(e) if act.reap_failing => log::debug!("deadline pass failed: {e}"),
                Some(e) => {
                    act.reap_failing = true;
                    log::warn!("deadline pass failed (said once until it runs again): {e}");
                }
                None => {
                    // Told only of a pass that went through: one that fails
                    // every tick (Redis answering PING but refusing
                    // writes) departs no lapsed device.
                    if let Some(readiness) = &act.readiness {
                        readiness.expiry_ticked();
                    }
                    if act.reap_failing {
                        act.reap_failing = false;
                        log::info!("deadline pass running again");
                    }
                    if act.locks.first().is_some_and(|l| l.held_until.is_some()) {
                        act.maybe_reconcile(ctx)
                    }
                }
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
            let (mut cursor, mut users, mut repaired, mut online) = (0, 0, 0, 0);
            // Each primary of a cluster holds its own keys.
            for node in store.data_nodes().await? {
                loop {
                    let step = store.reconcile_step(&node, cursor).await?;
                    let (next, seen, fixed) = (step.next_cursor, step.looked_at, step.repaired);
                    users += seen;
                    repaired += fixed;
                    online += step.online;
                    METRICS.reconcile_repairs.inc_by(fixed as u64);
                    cursor = next;
                    if cursor == 0 {
                        break;
                    }
                }
            }
            store.record_online_users(online).await?;
            METRICS.health.online_users.set(online as i64);
            Ok::<_, StoreError>((users, repaired))
        };
        ctx.spawn(pass.into_actor(self).map(|res, act, _| {
            act.reconciling = false;
            match res {
                Ok((users, 0)) => log::debug!("reconciliation: {users} users consistent"),
                Ok((users, repaired)) => {
                    log::info!("reconciliation: {users} users checked, {repaired} repaired")
                }
                Err(e) => log::warn!("reconciliation failed: {e}"),
            }
        }));
    }
}

/// One tick's work on a bucket whose lock this node holds: the lapsed
/// leases, the lapsed room memberships, the statuses whose `until` came
/// and, when due, the last-seen retention.
async fn run_bucket(
    store: &Store,
    bucket: u32,
    interval: std::time::Duration,
    trim: Option<std::time::Duration>,
) -> Result<(), StoreError> {
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
    // The rooms of the same bucket under the same lock:
    // memberships whose device's node died lapse here.
    let (_, left) = store.reap_rooms(bucket, REAP_BATCH).await?;
    if left > 0 {
        METRICS.rooms.memberships_lapsed.inc_by(left as u64);
        log::debug!("room deadline pass removed {left} lapsed memberships");
    }
    // Statuses whose `until` came, under the same lock.
    let ended = store.end_statuses(bucket, REAP_BATCH).await?;
    if ended > 0 {
        METRICS.statuses_ended.inc_by(ended as u64);
        log::debug!("status-end pass reset {ended} statuses");
    }
    if let Some(retention) = trim {
        let forgotten = store
            .trim_last_seen_bucket(bucket, retention, TRIM_BATCH)
            .await?;
        if forgotten > 0 {
            log::info!("forgot {forgotten} users offline for longer than the retention");
        }
    }
    Ok(())
}

impl Actor for ExpiryListener {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        let addr = ctx.address();
        let alive = addr.clone();
        let mut ready = self.ready.take();
        // Events missed while unsubscribed are covered by the deadline pass,
        // which does not depend on them.
        let on_subscribed = move || {
            if let Some(ready) = ready.take() {
                let _ = ready.send(());
            }
        };
        let on_key = move |key| {
            if !addr.connected() {
                return false;
            }
            addr.do_send(Expired { key });
            true
        };
        // Each primary's events, owned by one node of the fleet at a time.
        actix::spawn(streams::expiry_streams(
            self.store.clone(),
            self.client.clone(),
            self.config.node_id.clone(),
            on_subscribed,
            move || alive.connected(),
            on_key,
        ));
        ctx.run_interval(self.config.reaper_interval(), |act, ctx| act.tick(ctx));
        // The fleet's online users, as the last reconciliation pass (on
        // whichever node ran it) counted them.
        ctx.run_interval(ONLINE_USERS_READ, |act, _| {
            let store = act.store.clone();
            actix::spawn(async move {
                if let Ok(Some(users)) = store.online_users().await {
                    METRICS.health.online_users.set(users as i64);
                }
            });
        });
        // The record of this node's run, which names it for the devices it
        // holds: one short script per renewal.
        ctx.run_interval(self.config.run_renew_interval(), |act, _| {
            let (store, node, hold) = (
                act.store.clone(),
                act.config.node_id.clone(),
                act.config.run_hold(),
            );
            actix::spawn(async move {
                match store.keep_run(&node, hold).await {
                    Ok(true) => {}
                    Ok(false) => log::error!(
                        "run {} is now held by another node (this node's record lapsed, \
                         e.g. while it was frozen): the device detail may name that node \
                         for this node's devices until they reconnect",
                        store.run()
                    ),
                    Err(e) => log::warn!("could not renew this node's run record: {e}"),
                }
            });
        });
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
            match store.depart_lapsed(&user, &device).await {
                Ok(Some(removed)) if removed > 0 => {
                    log::debug!("lease of {user}/{device} expired; device removed")
                }
                Ok(_) => {}
                Err(e) => log::warn!("departure of expired {user}/{device} failed: {e}"),
            }
        };
        ctx.spawn(step.into_actor(self));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_lock_is_asked_for_only_to_take_or_renew_it() {
        let hold = Duration::from_millis(1000);
        let t0 = Instant::now();
        let mut lock = LockView::default();
        assert_eq!(lock.step(t0, hold), LockStep::Ask);
        lock.settle(LockStep::Ask, true, t0, hold);
        // Held with more than half its hold left: no round trip.
        assert_eq!(lock.step(t0 + hold / 4, hold), LockStep::Held);
        // Half spent: renew.
        assert_eq!(lock.step(t0 + hold * 3 / 4, hold), LockStep::Ask);
        // Lost to another node: wait half a hold before asking again.
        let t1 = t0 + hold;
        lock.settle(LockStep::Ask, false, t1, hold);
        assert_eq!(lock.step(t1 + hold / 4, hold), LockStep::Wait);
        assert_eq!(lock.step(t1 + hold, hold), LockStep::Ask);
    }
}
