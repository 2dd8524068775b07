//! The event feed (issue 39): every transition is recorded by the step that
//! makes it, in its user's or room's feed (`store::feed`), and moved by a
//! node into its bucket's log, which `GET /api/events` pages.
//!
//! This node's part: a mover that moves at once each feed a step of this
//! node recorded in (told by the store), and the feed pass, which, for the
//! buckets whose lock this node holds, moves the feeds a dead node left
//! behind (the due index), trims the log to the retention and forgets old
//! moved marks.
//!
//! - [`events`]: the log's entries made back into the webhook payloads.
//! - [`deliver`]: the webhooks, sent from the log by whichever node holds
//!   each bucket.

pub mod deliver;
pub mod events;

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::keys;
use crate::store::Store;

/// What the store tells the mover: a feed key a step recorded in.
pub type Sender = mpsc::Sender<String>;

/// Feeds waiting for the mover at most; beyond, the pass moves them (a
/// little later).
const WAITING: usize = 10_000;
/// Most feeds one move takes.
const BATCH: usize = 500;
/// How often the pass visits the buckets.
const PASS_EVERY: Duration = Duration::from_millis(500);
/// How long a pass lock holds: a node that dies leaves its buckets to the
/// others after this.
const LOCK_HOLD: Duration = Duration::from_secs(3);
/// Feeds one pass step visits in a bucket.
const PASS_MAX: usize = 500;
/// Passes between two trims of a bucket's log.
const TRIM_EVERY: u32 = 20;

/// The mover's channel.
pub fn channel() -> (Sender, mpsc::Receiver<String>) {
    mpsc::channel(WAITING)
}

/// Starts this node's mover and feed pass, and with `webhooks` its
/// senders of the buckets it holds.
pub fn spawn(
    store: Store,
    node: String,
    rx: mpsc::Receiver<String>,
    webhooks: Option<crate::webhooks::WebhookConfig>,
) {
    let held: Arc<Vec<AtomicBool>> = Arc::new(
        (0..store.bucket_count())
            .map(|_| AtomicBool::new(false))
            .collect(),
    );
    if let Some(config) = webhooks {
        deliver::spawn(store.clone(), node.clone(), config, held.clone());
    }
    tokio::spawn(mover(store.clone(), rx));
    tokio::spawn(pass(store, node, held));
}

/// Moves each feed it is told of, a batch at a time: a feed told of
/// twice in a batch moves once, and a batch costs a few round trips and
/// one script call per bucket, however many feeds it holds.
async fn mover(store: Store, mut rx: mpsc::Receiver<String>) {
    while let Some(first) = rx.recv().await {
        let mut batch = BTreeSet::from([first]);
        while batch.len() < BATCH {
            match rx.try_recv() {
                Ok(feed) => {
                    batch.insert(feed);
                }
                Err(_) => break,
            }
        }
        let feeds: Vec<String> = batch.into_iter().collect();
        if let Err(e) = store.move_feeds(&feeds).await {
            // The due index has them: the pass moves them.
            log::debug!("feed: moving {} feeds failed: {e}", feeds.len());
        }
    }
}

/// The feed pass: every [`PASS_EVERY`], each bucket whose lock this node
/// takes or holds.
async fn pass(store: Store, node: String, held: Arc<Vec<AtomicBool>>) {
    let mut tick = tokio::time::interval(PASS_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut rounds: u32 = 0;
    let mut scans: HashMap<u32, u64> = HashMap::new();
    loop {
        tick.tick().await;
        rounds = rounds.wrapping_add(1);
        for bucket in 0..store.bucket_count() {
            let mine = match store
                .hold_lock(&keys::feed_lock(bucket), &node, LOCK_HOLD)
                .await
            {
                Ok(mine) => mine,
                Err(e) => {
                    log::debug!("feed pass: lock of bucket {bucket}: {e}");
                    false
                }
            };
            // The webhook senders send the buckets this node holds.
            held[bucket as usize].store(mine, Ordering::Relaxed);
            if !mine {
                continue;
            }
            if let Err(e) = store.feed_pass(bucket, PASS_MAX).await {
                log::debug!("feed pass: bucket {bucket}: {e}");
            }
            if rounds % TRIM_EVERY == bucket % TRIM_EVERY {
                let scan = scans.get(&bucket).copied().unwrap_or(0);
                match store.feed_trim_bucket(bucket, scan).await {
                    Ok(next) => {
                        scans.insert(bucket, next);
                    }
                    Err(e) => log::debug!("feed pass: trimming bucket {bucket}: {e}"),
                }
            }
        }
    }
}
