//! One event to many local watchers: one cross-thread hop per worker, not
//! one per watcher.
//!
//! The registry runs on the node's main thread and the sessions on the HTTP
//! workers. Handing an event to each watcher's mailbox from the registry
//! woke every watcher across threads: a lock on the worker's shared run
//! queue and, while the worker slept, a wakeup of its thread, 10,000 times
//! for one transition to 10,000 watchers. Instead the registry sends each
//! worker one delivery list (the event, shared, and the ids of that worker's
//! watchers), and one task per worker hands the event to each of its
//! sessions' mailboxes from there: same-thread wakeups, no locks.
//!
//! That task yields after every few hundred watchers, so the first ones
//! write while the rest are handed out, and the sessions it woke take their
//! event in before the next list is handed out: a burst of events queued
//! while the worker was busy reaches each mailbox one at a time, instead of
//! filling it at once and getting a session that reads cut off as slow.
//!
//! The mailboxes stay bounded as before: a watcher whose mailbox is full has
//! a client that stopped reading, and the task reports it back to the
//! registry ([`SlowWatchers`]), which cuts it off.
//!
//! Room events (joins, leaves, states, signals: the hottest path in a busy
//! room) take the same lists ([`Inbound::Room`]) to the same mailboxes: one
//! list per worker per event, not one cross-thread send per member; a member
//! that stopped reading is cut off rather than queued for without bound.

use std::cell::RefCell;
use std::collections::HashMap;
use std::thread::ThreadId;

use actix::dev::SendError;
use actix::prelude::*;
use tokio::sync::mpsc;

use super::{Deliver, SessionId};
use crate::rooms::RoomDeliver;

/// What the delivery lists carry to a session: a watched user's record, or
/// an event of a room it is in.
#[derive(Message, Clone)]
#[rtype(result = "()")]
pub enum Inbound {
    /// A watched user's transition (or re-read).
    Presence(Deliver),
    /// A room event.
    Room(RoomDeliver),
}

thread_local! {
    /// The sessions of this worker thread, by id: where the delivery task
    /// finds each watcher's mailbox.
    static LOCAL: RefCell<HashMap<SessionId, Recipient<Inbound>>> = RefCell::new(HashMap::new());
    /// Where this worker's delivery task takes its lists (started by the
    /// worker's first session).
    static LISTS: RefCell<Option<mpsc::UnboundedSender<List>>> = const { RefCell::new(None) };
}

/// One event for some of a worker's sessions.
struct List {
    /// The event, shared by every list of it.
    deliver: Inbound,
    /// Its watchers on this worker.
    sessions: Vec<SessionId>,
    /// Where full mailboxes are reported.
    slow: Recipient<SlowWatchers>,
}

/// The worker thread a session runs on.
#[derive(Clone)]
pub struct Home {
    /// Tells workers apart.
    pub thread: ThreadId,
    /// The worker's delivery task.
    lists: mpsc::UnboundedSender<List>,
}

impl Home {
    /// The worker the caller runs on; starts its delivery task the first
    /// time. Must be called on a worker, inside its actix runtime.
    pub fn current() -> Self {
        let lists = LISTS.with(|l| {
            l.borrow_mut()
                .get_or_insert_with(|| {
                    let (tx, rx) = mpsc::unbounded_channel();
                    actix::spawn(deliver_lists(rx));
                    tx
                })
                .clone()
        });
        Self {
            thread: std::thread::current().id(),
            lists,
        }
    }
}

/// Watchers whose mailbox was full when an event came: their clients
/// stopped reading.
#[derive(Message)]
#[rtype(result = "()")]
pub struct SlowWatchers {
    /// The sessions to cut off.
    pub sessions: Vec<SessionId>,
}

/// Makes a session reachable by its worker's delivery task; called on the
/// session's own thread.
pub fn register(session: SessionId, addr: Recipient<Inbound>) {
    LOCAL.with(|l| l.borrow_mut().insert(session, addr));
}

/// Forgets a session that stopped; called on the session's own thread.
pub fn unregister(session: SessionId) {
    LOCAL.with(|l| {
        let mut l = l.borrow_mut();
        l.remove(&session);
        // A crowd that left gives its map back.
        if l.capacity() > 64 && l.len() * 4 < l.capacity() {
            l.shrink_to_fit();
        }
    });
}

/// Hands `deliver` to each of `sessions` on the worker `home`, from that
/// worker. Full mailboxes are reported to `slow`. False when the worker is
/// gone (the node is stopping).
pub fn send(
    home: &Home,
    deliver: Inbound,
    sessions: Vec<SessionId>,
    slow: Recipient<SlowWatchers>,
) -> bool {
    home.lists
        .send(List {
            deliver,
            sessions,
            slow,
        })
        .is_ok()
}

/// Sessions handed an event before the delivery task lets them run: the
/// first watchers start writing while the rest are still being handed out.
const HAND_OUT_BATCH: usize = 256;

/// A worker's delivery task: hands out each list in batches, letting the
/// sessions it woke run after each batch (and so before the next list).
async fn deliver_lists(mut rx: mpsc::UnboundedReceiver<List>) {
    while let Some(list) = rx.recv().await {
        for batch in list.sessions.chunks(HAND_OUT_BATCH) {
            let full = hand_out(&list.deliver, batch);
            if !full.is_empty() {
                list.slow.do_send(SlowWatchers { sessions: full });
            }
            tokio::task::yield_now().await;
        }
    }
}

/// Puts `deliver` into each session's mailbox; returns those that were full.
fn hand_out(deliver: &Inbound, sessions: &[SessionId]) -> Vec<SessionId> {
    LOCAL.with(|l| {
        let l = l.borrow();
        let mut full = Vec::new();
        for session in sessions {
            // A session that stopped meanwhile is simply skipped.
            if let Some(addr) = l.get(session) {
                if let Err(SendError::Full(_)) = addr.try_send(deliver.clone()) {
                    full.push(*session);
                }
            }
        }
        full
    })
}
