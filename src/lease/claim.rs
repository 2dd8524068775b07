//! Connect claims of every session of a node, batched and bounded.
//!
//! A reconnect storm (a node of the fleet died and its devices come back on
//! the others) brings thousands of claims to a node within seconds. Sent
//! one by one, each is two round trips of its own, and behind a slow Redis
//! they queue until they time out: the device gets `unavailable` after
//! waiting seconds, retries, and adds to the queue it met. So:
//!
//! - one claimer task per node sends whatever claims are queued as one
//!   [`Store::arrive_batch`] (two round trips however many, one `ZADD` per
//!   bucket for their deadlines), like the refresher does for refreshes;
//! - at most `--max-pending-claims` sessions may be setting up at once: a
//!   claim queued or in Redis, or a session's first request (its watch's
//!   subscription and snapshot, the heavier part of a reconnect) until it
//!   is answered. A new session beyond it is refused at once, before any
//!   Redis work, and closes with `1013` and a retry hint: the node sheds
//!   what it cannot answer in time instead of answering it late, and the
//!   sessions it holds keep their refreshes timely. The wait grows when
//!   many are shed for each one let in ([`super::shed`]). A first request is
//!   never refused (its session is online already): it counts, and keeps
//!   new sessions out until the backlog is answered. A session that asks
//!   nothing holds no place once claimed.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::{mpsc, oneshot};

use super::refresh::{take_batch, MAX_IN_FLIGHT};
use super::shed::{max_wait_ms, ShedWait};
use crate::store::{Arrival, ArriveMode, Lease, Store, StoreError, StoreResult};

/// The node has `--max-pending-claims` sessions setting up already: the
/// session should come back after `retry_after_ms` ([`super::shed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Busy {
    pub retry_after_ms: u64,
}

/// One claim waiting for its batch.
struct Request {
    lease: Lease,
    reply: oneshot::Sender<StoreResult<Arrival>>,
}

impl std::borrow::Borrow<Lease> for Request {
    fn borrow(&self) -> &Lease {
        &self.lease
    }
}

/// Places for at most `max` claims out at once (0: no cap), and the wait
/// those it refuses are asked for.
#[derive(Debug, Clone)]
struct Gate {
    pending: Arc<AtomicU32>,
    max: u32,
    wait: Arc<Mutex<ShedWait>>,
}

impl Gate {
    fn new(max: u32, ttl: Duration) -> Self {
        let wait = ShedWait::new(Instant::now(), max_wait_ms(ttl.as_millis() as u64));
        if max > 0 {
            show_wait(wait.wait_ms());
        }
        Self {
            pending: Arc::new(AtomicU32::new(0)),
            max,
            wait: Arc::new(Mutex::new(wait)),
        }
    }

    /// A place whatever the count (which may then exceed `max`), given
    /// back by [`Self::leave`].
    fn force(&self) {
        self.pending.fetch_add(1, Ordering::AcqRel);
    }

    /// Gives back a place taken by [`Self::force`].
    fn leave(&self) {
        self.pending.fetch_sub(1, Ordering::AcqRel);
    }

    /// A place, or [`Busy`] when all are taken.
    fn enter(&self) -> Result<Slot, Busy> {
        let max = self.max;
        let entered = self
            .pending
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (max == 0 || n < max).then_some(n + 1)
            })
            .is_ok();
        if max == 0 {
            return Ok(Slot(self.pending.clone()));
        }
        let mut wait = self.wait.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if !entered {
            let retry_after_ms = wait.shed(now);
            show_wait(retry_after_ms);
            return Err(Busy { retry_after_ms });
        }
        wait.admitted(now);
        show_wait(wait.wait_ms());
        Ok(Slot(self.pending.clone()))
    }
}

/// Shows the wait a session shed now would be asked for
/// (`presence_shed_retry_after_ms`).
fn show_wait(ms: u64) {
    crate::metrics::METRICS
        .admission
        .shed_retry_after
        .set(i64::try_from(ms).unwrap_or(i64::MAX));
}

/// A place among the sessions setting up, given back when dropped.
struct Slot(Arc<AtomicU32>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Handle on the node's claimer task; cheap to clone. The task ends when
/// the last handle is dropped.
#[derive(Clone)]
pub struct Claimer {
    tx: mpsc::UnboundedSender<Request>,
    gate: Gate,
}

impl Claimer {
    /// Starts the claimer task on the current tokio runtime; it sends
    /// through `store`, with at most `max_pending` claims out (0: no cap),
    /// for leases of `ttl` (which caps the wait of those it sheds).
    pub fn spawn(store: Store, max_pending: u32, ttl: Duration) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(store, rx));
        Self {
            tx,
            gate: Gate::new(max_pending, ttl),
        }
    }

    /// Claims `lease` (connect mode) in the next batch, or [`Busy`] at once
    /// when the node has its most sessions setting up. The place is held
    /// until the outcome is in (or the future is dropped).
    pub fn claim(
        &self,
        lease: Lease,
    ) -> Result<impl std::future::Future<Output = StoreResult<Arrival>> + 'static, Busy> {
        let slot = self.gate.enter()?;
        let (reply, answer) = oneshot::channel();
        let sent = self.tx.send(Request { lease, reply }).is_ok();
        Ok(async move {
            let _slot = slot;
            if !sent {
                return Err(StoreError::RefresherStopped);
            }
            answer.await.unwrap_or(Err(StoreError::RefresherStopped))
        })
    }

    /// A claimed session's first request starts: it takes a place, never
    /// refused, which keeps new sessions out until
    /// [`Self::first_request_done`] gives it back.
    pub fn first_request(&self) {
        self.gate.force();
    }

    /// The first request [`Self::first_request`] counted is answered, or
    /// its session stopped.
    pub fn first_request_done(&self) {
        self.gate.leave();
    }
}

/// The claimer: takes what is queued, up to [`super::refresh::MAX_BATCH`], whenever fewer
/// than [`MAX_IN_FLIGHT`] batches are out.
async fn run(store: Store, mut rx: mpsc::UnboundedReceiver<Request>) {
    let mut in_flight = FuturesUnordered::new();
    let mut open = true;
    while open || !in_flight.is_empty() {
        tokio::select! {
            _ = in_flight.next(), if !in_flight.is_empty() => {}
            batch = take_batch(&mut rx), if open && in_flight.len() < MAX_IN_FLIGHT => {
                match batch {
                    Some(batch) => in_flight.push(send_batch(&store, batch)),
                    None => open = false,
                }
            }
        }
    }
}

/// Sends one batch and answers each of its claims.
async fn send_batch(store: &Store, batch: Vec<Request>) {
    // A session that went away while its claim waited needs no claim.
    let batch: Vec<Request> = batch.into_iter().filter(|r| !r.reply.is_closed()).collect();
    if batch.is_empty() {
        return;
    }
    match store.arrive_batch(ArriveMode::Connect, &batch).await {
        Ok(outcomes) => {
            for (request, outcome) in batch.into_iter().zip(outcomes) {
                let _ = request.reply.send(outcome);
            }
        }
        Err(e) => {
            for request in batch {
                let _ = request.reply.send(Err(e.clone()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(max: u32) -> Gate {
        Gate::new(max, Duration::from_secs(45))
    }

    const BUSY: Busy = Busy {
        retry_after_ms: crate::protocol::SHED_RETRY_AFTER_MS,
    };

    #[test]
    fn the_gate_refuses_past_its_places_and_takes_them_back() {
        let gate = gate(2);
        let (a, b) = (gate.enter().unwrap(), gate.enter().unwrap());
        assert_eq!(gate.enter().err(), Some(BUSY));
        drop(a);
        let c = gate.enter().unwrap();
        assert_eq!(gate.enter().err(), Some(BUSY));
        drop((b, c));
        assert_eq!(gate.pending.load(Ordering::Acquire), 0);
    }

    #[test]
    fn a_forced_place_counts_and_keeps_others_out() {
        let gate = gate(1);
        gate.force();
        assert_eq!(gate.enter().err(), Some(BUSY));
        gate.force();
        assert_eq!(gate.pending.load(Ordering::Acquire), 2);
        gate.leave();
        gate.leave();
        assert!(gate.enter().is_ok());
    }

    #[test]
    fn a_gate_of_zero_has_no_cap() {
        let gate = gate(0);
        let slots: Vec<_> = (0..10_000).map(|_| gate.enter().unwrap()).collect();
        assert_eq!(gate.pending.load(Ordering::Acquire), 10_000);
        drop(slots);
    }
}
