//! A device arriving (connect, refresh: `arrive.lua`) and departing
//! (`depart.lua`), with the bucketed indexes written beside the scripts:
//! `presence-leases:{b<k>}` (deadlines, which also list who is online) and
//! `presence-lastseen:{b<k>}`.

use std::borrow::Borrow;
use std::collections::BTreeMap;

use redis::Pipeline;

use super::scripts::{parse_arrival, parse_departure, parse_taken};
use super::step_types::{Arrival, ArriveMode, Departure, Lease};
use super::{now_ms, Store, StoreError, StoreResult};
use crate::keys::{self, Buckets};
use crate::model::ChosenStatus;

impl Store {
    /// Claims (connect) or refreshes (refresh) a device lease, counting the
    /// device if it is new; publishes `online` for the user's first device.
    /// `owner` is the connection's lease value; `known` the user's status
    /// as this connection last saw it, restored if Redis lost it. Sessions
    /// refresh through the node's refresher (`src/lease/refresh.rs`) instead,
    /// which batches.
    pub async fn arrive(
        &self,
        user: &str,
        device: &str,
        owner: &str,
        mode: ArriveMode,
        known: Option<&ChosenStatus>,
        kind: Option<crate::model::DeviceKind>,
    ) -> StoreResult<Arrival> {
        let lease = Lease {
            user: user.to_string(),
            device: device.to_string(),
            owner: owner.to_string(),
            known: known.cloned(),
            rooms: Vec::new(),
            kind,
        };
        self.arrive_batch(mode, std::slice::from_ref(&lease))
            .await?
            .pop()
            .unwrap_or_else(|| Err(StoreError::reply(&keys::lease(user, device), "empty reply")))
    }

    /// The arrival step for many leases at once, in two round trips
    /// whatever their number: one pipeline of `arrive.lua` calls, then, for
    /// the leases still held, per bucket one `ZADD GT` of their deadlines
    /// into `presence-leases:{b<k>}`, with their memberships' deadlines.
    /// Returns one outcome per lease, in order; `Err` when the first round
    /// trip failed as a whole. A second round trip that failed as a whole
    /// fails the leases that were held (as one refresh on its own would);
    /// one not answered within a quarter of the TTL is not waited for
    /// (see `beside_wait`).
    pub async fn arrive_batch<L: Borrow<Lease>>(
        &self,
        mode: ArriveMode,
        leases: &[L],
    ) -> StoreResult<Vec<StoreResult<Arrival>>> {
        let now = now_ms();
        let deadline = now + self.ttl_ms as i64;
        let mut pipe = redis::Pipeline::with_capacity(leases.len());
        // One bad reply fails its own lease, not the batch.
        pipe.ignore_errors();
        let mut pre = redis::pipe();
        for lease in leases {
            let lease = lease.borrow();
            let feed = self.feed_of(&lease.user);
            // A connect may record `online`; a refresh only when Redis lost
            // the user, rare enough to leave to the node that ran it.
            if let (Some(feed), ArriveMode::Connect) = (&feed, mode) {
                self.feed_due_before(&mut pre, feed);
            }
            self.scripts.arrive(
                &mut pipe,
                lease,
                mode,
                self.ttl_ms,
                now,
                self.max_devices,
                self.run,
                feed.as_ref(),
            );
        }
        self.send_due(pre);
        let reply = self.query(&pipe).await?;
        if reply.len() != leases.len() {
            return Err(StoreError::reply(
                "arrive",
                format!("{} replies to {} arrivals", reply.len(), leases.len()),
            ));
        }
        // Only a holder writes the indexes: a replaced connection's deadline
        // must not stand for the new owner's lease. GT keeps the latest
        // deadline when two writes cross.
        let mut by_bucket: BTreeMap<u32, redis::Cmd> = BTreeMap::new();
        // Users who come online stay in the last-seen index, at the last
        // seen they had: a viewer they hide from is shown exactly that, so
        // the recently-seen list must find them there as it finds the
        // others (their next `offline` raises the entry).
        let mut back = redis::pipe();
        let mut out = Vec::with_capacity(leases.len());
        // (lease, room) of each membership pushed on, in the order of the
        // replies the pipeline keeps.
        let mut memberships: Vec<(usize, &std::sync::Arc<str>)> = Vec::new();
        for (lease, value) in leases.iter().zip(&reply) {
            let lease = lease.borrow();
            let arrival = parse_arrival(&self.report(value, false), &lease.user, deadline);
            if let Ok(Arrival::Held { status, .. }) = &arrival {
                let bucket = self.buckets.of(&lease.user);
                // A status that ends is in the due index: an arrival that
                // put it back (Redis lost it) puts its entry back at once,
                // not at the next reconciliation. NX: a later one stays.
                if let Some(until) = status.as_ref().map(|s| s.until).filter(|u| *u > 0) {
                    back.cmd("ZADD")
                        .arg(keys::status_until(bucket))
                        .arg("NX")
                        .arg(until)
                        .arg(&lease.user)
                        .ignore();
                }
                let member = keys::lease_member(&lease.user, &lease.device);
                for room in &lease.rooms {
                    self.push_membership(&mut back, room, &member, deadline);
                    memberships.push((out.len(), room));
                }
                by_bucket
                    .entry(bucket)
                    .or_insert_with(|| deadline_writes(bucket))
                    .arg(deadline)
                    .arg(member);
            }
            out.push(arrival);
        }
        if !by_bucket.is_empty() {
            let mut pipe = back;
            for deadlines in by_bucket.into_values() {
                pipe.add_command(deadlines).ignore();
            }
            self.send_beside(pipe, &memberships, &mut out).await;
        }
        Ok(out)
    }

    /// The second round trip of [`Store::arrive_batch`]: `pipe`, the index
    /// writes and the pushes of `memberships` (lease in `out`, room), whose
    /// replies tell which memberships were gone.
    async fn send_beside(
        &self,
        mut pipe: Pipeline,
        memberships: &[(usize, &std::sync::Arc<str>)],
        out: &mut [StoreResult<Arrival>],
    ) {
        // One shard's failure fails its own writes, not the replies of the
        // others.
        pipe.ignore_errors();
        match self.query_within(pipe, self.beside_wait()).await {
            Some(Ok(pushed)) => {
                for ((i, room), pushed) in memberships.iter().zip(pushed) {
                    if let (redis::Value::Int(0), Ok(Arrival::Held { lost_rooms, .. })) =
                        (pushed, &mut out[*i])
                    {
                        lost_rooms.push((*room).clone());
                    }
                }
            }
            Some(Err(e)) => {
                for arrival in out.iter_mut() {
                    if let Ok(Arrival::Held { .. }) = arrival {
                        *arrival = Err(e.clone());
                    }
                }
            }
            // The leases are refreshed; which memberships were gone is
            // learnt at the next refresh.
            None => log::debug!(
                "a refresh batch's index and membership writes are still out after {:?}; answered without them",
                self.beside_wait()
            ),
        }
    }

    /// How long [`Store::arrive_batch`] waits for its second round trip (the
    /// indexes and the membership deadlines, which touch the slots of every
    /// shard) before it answers without it: a quarter of the TTL.
    ///
    /// A shard in failover holds its commands until its replica takes over
    /// (the cluster client retries them meanwhile), and a session refreshes
    /// again only once its refresh is answered. Had the refresh waited for
    /// that, no lease of the node would be refreshed for the failover's
    /// length, even on the shards that stayed up: a lease shorter than the
    /// failover lapsed, and its device left every room. Answered after a
    /// quarter of the TTL, a session refreshes again at its next pong (a
    /// third of the TTL with the derived TTL); the writes still land once
    /// the shard is back.
    fn beside_wait(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.ttl_ms / 4)
    }

    /// Sends `pipe` and waits at most `wait` for its replies; `None` when
    /// they did not come in time. The pipeline goes on by itself then, so
    /// that its writes land and only their replies are lost.
    async fn query_within(
        &self,
        pipe: Pipeline,
        wait: std::time::Duration,
    ) -> Option<StoreResult<Vec<redis::Value>>> {
        let store = self.clone();
        let sent = tokio::spawn(async move { store.query(&pipe).await });
        match tokio::time::timeout(wait, sent).await {
            Ok(Ok(reply)) => Some(reply),
            Ok(Err(e)) => Some(Err(StoreError::reply(
                "arrive",
                format!("index writes: {e}"),
            ))),
            Err(_) => None,
        }
    }

    /// Adds to `back` the push of one membership's deadline (its reply
    /// says whether the membership was there) and the room's place in the
    /// pass's index.
    fn push_membership(&self, back: &mut redis::Pipeline, room: &str, member: &str, deadline: i64) {
        // XX: a membership that lapsed or was left stays gone; CH tells
        // which were there (a later deadline is a change).
        back.cmd("ZADD")
            .arg(keys::room_deadlines(room))
            .arg("XX")
            .arg("GT")
            .arg("CH")
            .arg(deadline)
            .arg(member);
        // The room stays in the pass's index whatever happened to its
        // entry (a crash between a join's writes, a shard's failover): NX
        // leaves a live entry alone.
        back.cmd("ZADD")
            .arg(keys::room_due(self.buckets.of(room)))
            .arg("NX")
            .arg(deadline)
            .arg(room)
            .ignore();
    }

    /// A pause: extends (or cuts) the lease to `grace_ms` from now while
    /// this connection still holds it (`arrive.lua` in refresh mode, the
    /// grace as its TTL), then writes that deadline into
    /// `presence-leases` and into the memberships of `lease.rooms`, down as
    /// well as up, so that the deadline passes depart the device at the end
    /// of the grace, as they do a lapse. Answered once both are written.
    pub async fn pause(&self, lease: &Lease, grace_ms: u64) -> StoreResult<Arrival> {
        let now = now_ms();
        let deadline = now + grace_ms as i64;
        let mut pipe = redis::pipe();
        let feed = self.feed_of(&lease.user);
        let mode = ArriveMode::Pause;
        let (max, run) = (self.max_devices, self.run);
        (self.scripts).arrive(
            &mut pipe,
            lease,
            mode,
            grace_ms,
            now,
            max,
            run,
            feed.as_ref(),
        );
        let reply = self.query(&pipe).await?;
        let key = keys::lease(&lease.user, &lease.device);
        let first = reply
            .first()
            .ok_or_else(|| StoreError::reply(&key, "pause: empty reply"))?;
        let arrival = parse_arrival(&self.report(first, false), &lease.user, deadline)?;
        if !matches!(arrival, Arrival::Held { .. }) {
            return Ok(arrival);
        }
        let member = keys::lease_member(&lease.user, &lease.device);
        let mut back = redis::pipe();
        // No GT: a grace shorter than what is left of the TTL moves the
        // deadline down. (A newer connection's GT write that this one
        // overtook is put back by the pass, which finds its lease.)
        back.cmd("ZADD")
            .arg(keys::leases(self.buckets.of(&lease.user)))
            .arg(deadline)
            .arg(&member)
            .ignore();
        for room in &lease.rooms {
            back.cmd("ZADD")
                .arg(keys::room_deadlines(room))
                .arg("XX")
                .arg(deadline)
                .arg(&member)
                .ignore();
            // The pass's index holds a lower bound of the room's deadlines.
            back.cmd("ZADD")
                .arg(keys::room_due(self.buckets.of(room)))
                .arg("LT")
                .arg(deadline)
                .arg(room.as_ref())
                .ignore();
        }
        self.query(&back).await?;
        Ok(arrival)
    }

    /// The departure step for a lease Redis announced as expired, if this
    /// node claims its entry in `presence-leases` (see
    /// [`super::claims::claim_score`]): not when the deadline pass (or
    /// another owner) claimed it first or already departed it (no entry).
    /// The devices it removed (0 or 1); `None` when left alone.
    pub async fn depart_lapsed(&self, user: &str, device: &str) -> StoreResult<Option<usize>> {
        let mut conn = self.conn();
        let index = keys::leases(self.buckets.of(user));
        let member = keys::lease_member(user, device);
        let score: Option<f64> = redis::cmd("ZSCORE")
            .arg(&index)
            .arg(&member)
            .query_async(&mut conn)
            .await?;
        let Some(score) = score.filter(|s| !super::claims::is_taken(*s)) else {
            return Ok(None);
        };
        let mut claim = redis::pipe();
        super::claims::claim(&mut claim, &index, &member, score);
        let won: Vec<i64> = claim.query_async(&mut conn).await?;
        if won.first() != Some(&1) {
            return Ok(None);
        }
        // Settled as the pass settles what it claimed.
        self.depart_due(&index, &[member], now_ms(), "event")
            .await
            .map(Some)
    }

    /// The departure step for a device whose connection closed. `owner` is
    /// its lease value with the deadline it last wrote to
    /// `presence-leases`. (A lapsed lease is departed by
    /// [`Store::depart_lapsed`] or the deadline pass.)
    pub async fn depart(
        &self,
        user: &str,
        device: &str,
        (owner, deadline): (&str, i64),
    ) -> StoreResult<Departure> {
        let (departure, _, mut follow) = self.depart_step(user, device, owner).await?;
        if !matches!(departure, Departure::Leased { .. }) {
            // Our own deadline only: a newer connection's entry stays.
            self.scripts
                .zrem_if(
                    &mut follow,
                    &keys::leases(self.buckets.of(user)),
                    &keys::lease_member(user, device),
                    deadline,
                )
                .ignore();
        }
        if !follow.is_empty() {
            // The departure itself is done; the indexes are repaired by the
            // reconciliation pass if this fails.
            if let Err(e) = self.query(&follow).await {
                log::warn!("{user}/{device}: departed, but updating the indexes failed: {e}");
            }
        }
        Ok(departure)
    }
}

impl Store {
    /// The departure step of a close (`owner`: the lease value it must
    /// find, `*` for any): the script, then the last-seen index update of a
    /// user who went offline, in a pipeline the caller completes with its
    /// own index removal and sends. With `*`, also the lease value of the
    /// socket it took the device from, if one held it.
    pub(super) async fn depart_step(
        &self,
        user: &str,
        device: &str,
        owner: &str,
    ) -> StoreResult<(Departure, Option<String>, Pipeline)> {
        let mut pipe = redis::pipe();
        let feed = self.feed_of(user);
        if let Some(feed) = &feed {
            self.send_due_for(feed);
        }
        self.scripts
            .depart(&mut pipe, user, device, owner, now_ms(), feed.as_ref());
        crate::metrics::departure_steps("close", 1);
        let reply = self.query(&pipe).await?;
        let first = reply
            .first()
            .ok_or_else(|| StoreError::reply(&keys::count(user), "depart: empty reply"))?;
        let step = self.report(first, false);
        let departure = parse_departure(&step, user)?;
        let taken = parse_taken(&step, user)?;
        let mut follow = redis::pipe();
        if let Departure::Removed {
            last_seen: Some(ts),
        } = departure
        {
            record_offline(&mut follow, self.buckets, user, ts);
        }
        Ok((departure, taken, follow))
    }
}

/// The `ZADD GT` of one bucket's deadlines, for the caller to add members
/// to.
fn deadline_writes(bucket: u32) -> redis::Cmd {
    let mut deadlines = redis::cmd("ZADD");
    deadlines.arg(keys::leases(bucket)).arg("GT");
    deadlines
}

/// Adds the index update that follows a user's last device leaving.
pub(super) fn record_offline(pipe: &mut Pipeline, buckets: Buckets, user: &str, last_seen: i64) {
    pipe.cmd("ZADD")
        .arg(keys::last_seen(buckets.of(user)))
        .arg("GT")
        .arg(last_seen)
        .arg(user)
        .ignore();
}
