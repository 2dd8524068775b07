//! Lease refreshes of every session of a node, batched.
//!
//! A session's refresh is small (one `arrive.lua` call and two index
//! writes); sent on its own it costs more in futures, wakeups and reply
//! parsing on the node than in Redis. So one refresher task per node takes
//! the refreshes of all sessions from a channel and sends whatever is
//! queued, up to [`MAX_BATCH`], as one batch ([`Store::arrive_batch`]: two
//! round trips however many refreshes it holds). Each session gets its own
//! outcome; the common one (still ours, nothing changed) is written into the
//! session's [`LeaseState`] without waking the session at all, which saves
//! a cross-thread wakeup and an actor poll per refresh.
//!
//! Two batches may be out at once. With one, Redis idles while the node
//! parses a batch's replies and sends its index writes: driving
//! [`Store::arrive_batch`] alone against a local Redis, one batch in flight
//! reached 72,000-79,000 refreshes/s, two reached 101,000-104,000 (Redis's
//! own limit there), and four no more than two.
//!
//! Bounds: each session has at most one refresh in flight, so the queue
//! holds at most one request per session, and at most [`MAX_IN_FLIGHT`]
//! batches of [`MAX_BATCH`] are out. When a batch fails as a whole
//! (Redis unreachable or not answering), every request queued behind it
//! fails at once too instead of waiting its turn for the same error; the
//! sessions try again on their next due frame.

use std::borrow::Borrow;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU8, Ordering};
use std::sync::Arc;

use actix::{Message, Recipient};
use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::mpsc;

use crate::store::{Arrival, ArriveMode, Lease, Store, StoreError, StoreResult};

/// Most refreshes sent in one batch.
pub const MAX_BATCH: usize = 512;
/// Batches in flight at once: while Redis runs one batch's scripts, the
/// node parses the other's replies and writes its index entries.
pub const MAX_IN_FLIGHT: usize = 2;

/// What a session shares with the refresher about its lease: where its
/// refresh stands, and the deadline last written to `presence-leases`. The
/// refresher settles the common outcome (the lease is still ours, nothing
/// else changed) here alone, without waking the session.
///
/// It also orders a closing session's release after its refresh: a refresh
/// that reaches Redis after the release would find the lease gone and claim
/// it again (as it must after Redis lost its data), and the user would come
/// back online for a lease TTL after going offline. So a session that stops
/// while its refresh is out leaves the release to the refresher, which
/// sends it once that refresh is answered ([`LeaseState::close`]).
#[derive(Debug, Default)]
pub struct LeaseState {
    phase: AtomicU8,
    /// The node is going away: the lease is left to lapse, not released.
    leaving: AtomicBool,
    deadline: AtomicI64,
}

/// No refresh out.
const IDLE: u8 = 0;
/// A refresh is with the refresher, or in Redis.
const OUT: u8 = 1;
/// Its outcome is on its way to the session (Redis is done with it).
const HANDED: u8 = 2;
/// The session stopped while its refresh was out: the refresher releases
/// the device once that refresh is answered.
const CLOSING: u8 = 3;

impl LeaseState {
    /// A refresh is in flight (or its outcome not yet acted on).
    pub fn refreshing(&self) -> bool {
        self.phase.load(Ordering::Acquire) != IDLE
    }

    /// A refresh is on its way.
    pub fn start(&self) {
        self.phase.store(OUT, Ordering::Release);
    }

    /// The node is going away: nothing releases this lease any more.
    pub fn leave(&self) {
        self.leaving.store(true, Ordering::Release);
    }

    /// See [`LeaseState::leave`].
    pub fn leaving(&self) -> bool {
        self.leaving.load(Ordering::Acquire)
    }

    /// The session acted on the outcome it was handed.
    pub fn finish(&self) {
        self.phase.store(IDLE, Ordering::Release);
    }

    /// The session stopped. True when its release can go now; false when a
    /// refresh is still out, and the refresher will release the device
    /// after it.
    pub fn close(&self) -> bool {
        self.phase
            .compare_exchange(OUT, CLOSING, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
    }

    /// The session stopped while its refresh was out.
    fn closing(&self) -> bool {
        self.phase.load(Ordering::Acquire) == CLOSING
    }

    /// The refresh was answered: to `next` (IDLE when settled here, HANDED
    /// when the session acts on it). False when the session stopped
    /// meanwhile: the device is then the refresher's to release.
    fn answered(&self, next: u8) -> bool {
        self.phase
            .compare_exchange(OUT, next, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Deadline last written to `presence-leases`, epoch ms (0: none yet).
    pub fn deadline(&self) -> i64 {
        self.deadline.load(Ordering::Acquire)
    }

    /// Records the deadline just written to `presence-leases`.
    pub fn set_deadline(&self, deadline: i64) {
        self.deadline.store(deadline, Ordering::Release);
    }
}

/// A refresh outcome the session has to act on: the lease was lost to
/// another connection, re-asserted, or found with another status, or the
/// refresh failed. The session marks its [`LeaseState`] settled.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Refreshed(pub StoreResult<Arrival>);

/// One refresh waiting for its batch.
struct Request {
    lease: Lease,
    state: Arc<LeaseState>,
    notify: Recipient<Refreshed>,
}

impl Borrow<Lease> for Request {
    fn borrow(&self) -> &Lease {
        &self.lease
    }
}

/// Handle on the node's refresher task; cheap to clone. The task ends when
/// the last handle is dropped. The refresher owns the batching: sessions
/// hand it their refreshes, and it calls the store like any other user.
#[derive(Clone)]
pub struct Refresher {
    tx: mpsc::UnboundedSender<Request>,
}

impl Refresher {
    /// Starts the refresher task on the current tokio runtime; it sends
    /// through `store`.
    pub fn spawn(store: Store) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(store, rx));
        Self { tx }
    }

    /// Refreshes `lease` in the next batch. `state` must be marked
    /// refreshing; the outcome lands there, and goes to `notify` when there
    /// is anything to act on (see [`Refreshed`]).
    pub fn refresh(&self, lease: Lease, state: Arc<LeaseState>, notify: Recipient<Refreshed>) {
        let request = Request {
            lease,
            state,
            notify,
        };
        if let Err(mpsc::error::SendError(request)) = self.tx.send(request) {
            // Sent by a live session, which acts on the error itself.
            let _ = answer(request, Err(StoreError::RefresherStopped));
        }
    }
}

/// The refresher: takes what is queued, up to [`MAX_BATCH`], whenever
/// fewer than [`MAX_IN_FLIGHT`] batches are out.
async fn run(store: Store, mut rx: mpsc::UnboundedReceiver<Request>) {
    let mut in_flight = FuturesUnordered::new();
    let mut open = true;
    while open || !in_flight.is_empty() {
        tokio::select! {
            done = in_flight.next(), if !in_flight.is_empty() => {
                if let Some(Err(e)) = done {
                    fail_queued(&store, &mut rx, &e);
                }
            }
            batch = take_batch(&mut rx), if open && in_flight.len() < MAX_IN_FLIGHT => {
                match batch {
                    Some(batch) => in_flight.push(send_batch(&store, batch)),
                    None => open = false,
                }
            }
        }
    }
}

/// Waits for at least one request, then takes what else is queued, up to
/// [`MAX_BATCH`]. `None` once every sender is gone.
pub(super) async fn take_batch<T>(rx: &mut mpsc::UnboundedReceiver<T>) -> Option<Vec<T>> {
    let mut batch = Vec::new();
    match rx.recv_many(&mut batch, MAX_BATCH).await {
        0 => None,
        _ => Some(batch),
    }
}

/// Sends one batch and answers each of its requests. Returns the error
/// that failed the batch as a whole, if one did.
async fn send_batch(store: &Store, batch: Vec<Request>) -> Result<(), StoreError> {
    // A session that stopped while its refresh waited needs no refresh,
    // only its release, which can go at once: nothing of it is in Redis.
    let (batch, stopped): (Vec<_>, Vec<_>) = batch.into_iter().partition(|r| !r.state.closing());
    for request in stopped {
        release_after(store, Some(request));
    }
    if batch.is_empty() {
        return Ok(());
    }
    crate::metrics::refresh_batch(batch.len());
    match store.arrive_batch(ArriveMode::Refresh, &batch).await {
        Ok(outcomes) => {
            crate::metrics::refreshes_failed(outcomes.iter().filter(|o| o.is_err()).count());
            for (request, outcome) in batch.into_iter().zip(outcomes) {
                release_after(store, answer(request, outcome));
            }
            Ok(())
        }
        Err(e) => {
            crate::metrics::refreshes_failed(batch.len());
            for request in batch {
                release_after(store, answer(request, Err(e.clone())));
            }
            Err(e)
        }
    }
}

/// Hands one outcome to its session: the common one settles the session's
/// [`LeaseState`] directly; anything else is sent to the session. Returns
/// the request when its session stopped meanwhile: its device is then the
/// caller's to release ([`release_after`]).
#[must_use]
fn answer(request: Request, outcome: StoreResult<Arrival>) -> Option<Request> {
    if let Ok(Arrival::Held { deadline, .. }) = outcome {
        request.state.set_deadline(deadline);
    }
    let settled = matches!(
        outcome,
        Ok(Arrival::Held {
            came_online: false,
            status: None,
            ref lost_rooms,
            ..
        }) if lost_rooms.is_empty()
    );
    if !request.state.answered(if settled { IDLE } else { HANDED }) {
        return Some(request);
    }
    if !settled {
        request.notify.do_send(Refreshed(outcome));
    }
    None
}

/// Releases the device of a session that stopped while its refresh was
/// out, now that the refresh is answered: the release comes after it.
fn release_after(store: &Store, request: Option<Request>) {
    let Some(Request { lease, state, .. }) = request else {
        return;
    };
    log::debug!(
        "{}/{}: releasing after the refresh that was out",
        lease.user,
        lease.device
    );
    tokio::spawn(super::release::release(
        store.clone(),
        lease.user,
        lease.device,
        lease.owner,
        state.deadline(),
    ));
}

/// Fails every request queued now with `e`, the error that just failed a
/// whole batch: they would wait their turn only to meet it again.
fn fail_queued(store: &Store, rx: &mut mpsc::UnboundedReceiver<Request>, e: &StoreError) {
    while let Ok(request) = rx.try_recv() {
        release_after(store, answer(request, Err(e.clone())));
    }
}
