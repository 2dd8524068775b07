//! Lease refreshes of every session of a node, batched.
//!
//! A session's refresh is small (one `arrive.lua` call and two index
//! writes); sent on its own it costs more in futures, wakeups and reply
//! parsing on the node than in Redis. So one refresher task per node takes
//! the refreshes of all sessions from a channel and sends whatever is
//! queued, up to [`MAX_BATCH`], as one batch ([`Store::arrive_batch`]: two
//! round trips however many refreshes it holds). Each session gets its own
//! outcome back.
//!
//! One batch is out at a time: the refreshes that arrive meanwhile make the
//! next one. Letting a second batch's scripts overlap the first one's index
//! writes was tried and made no measurable difference to the node's CPU per
//! refresh or to the refresh rate in `presence-bench refresh`; up to 512
//! refreshes per two round trips is far from being the limit, so the simpler
//! loop stayed.
//!
//! Bounds: each session has at most one refresh in flight, so the queue
//! holds at most one request per session. When a batch fails as a whole
//! (Redis unreachable or not answering), every request queued behind it
//! fails at once too instead of waiting its turn for the same error; the
//! sessions try again on their next due frame.

use tokio::sync::{mpsc, oneshot};

use crate::store::{Arrival, ArriveMode, Lease, Store, StoreError, StoreResult};

/// Most refreshes sent in one batch.
pub const MAX_BATCH: usize = 512;

/// One refresh waiting for its batch.
struct Request {
    lease: Lease,
    reply: oneshot::Sender<StoreResult<Arrival>>,
}

/// Handle on the node's refresher task; cheap to clone. The task ends when
/// the last handle is dropped.
#[derive(Clone)]
pub struct Refresher {
    tx: mpsc::UnboundedSender<Request>,
}

impl Refresher {
    /// Starts the refresher task on the current tokio runtime; it sends
    /// through `store` (whose own refreshes must not be batched).
    pub fn spawn(store: Store) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(store, rx));
        Self { tx }
    }

    /// Refreshes one lease in the next batch.
    pub async fn refresh(&self, lease: Lease) -> StoreResult<Arrival> {
        let (reply, outcome) = oneshot::channel();
        self.tx
            .send(Request { lease, reply })
            .map_err(|_| StoreError::RefresherStopped)?;
        outcome.await.map_err(|_| StoreError::RefresherStopped)?
    }
}

/// The refresher: one batch at a time, of whatever queued meanwhile.
async fn run(store: Store, mut rx: mpsc::UnboundedReceiver<Request>) {
    while let Some(batch) = take_batch(&mut rx).await {
        if let Err(e) = send_batch(&store, batch).await {
            fail_queued(&mut rx, &e);
        }
    }
}

/// Waits for at least one request, then takes what else is queued, up to
/// [`MAX_BATCH`]. `None` once every sender is gone.
async fn take_batch(rx: &mut mpsc::UnboundedReceiver<Request>) -> Option<Vec<Request>> {
    let mut batch = Vec::new();
    match rx.recv_many(&mut batch, MAX_BATCH).await {
        0 => None,
        _ => Some(batch),
    }
}

/// Sends one batch and answers each of its requests. Returns the error
/// that failed the batch as a whole, if one did.
async fn send_batch(store: &Store, batch: Vec<Request>) -> Result<(), StoreError> {
    let (leases, replies): (Vec<Lease>, Vec<_>) =
        batch.into_iter().map(|r| (r.lease, r.reply)).unzip();
    crate::metrics::refresh_batch(leases.len());
    match store.arrive_batch(ArriveMode::Refresh, &leases).await {
        Ok(outcomes) => {
            for (reply, outcome) in replies.into_iter().zip(outcomes) {
                // A session that stopped meanwhile no longer listens.
                let _ = reply.send(outcome);
            }
            Ok(())
        }
        Err(e) => {
            for reply in replies {
                let _ = reply.send(Err(e.clone()));
            }
            Err(e)
        }
    }
}

/// Fails every request queued now with `e`, the error that just failed a
/// whole batch: they would wait their turn only to meet it again.
fn fail_queued(rx: &mut mpsc::UnboundedReceiver<Request>, e: &StoreError) {
    while let Ok(request) = rx.try_recv() {
        let _ = request.reply.send(Err(e.clone()));
    }
}
