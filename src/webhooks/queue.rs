//! One receiver's queue of webhook events, and what gives way when one
//! user is over its share or the queue is full (see the module above).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use tokio::time::Instant;

use super::MAX_QUEUED_PER_USER;

/// Events waiting for one receiver, oldest first, each with a number that
/// tells the sender which ones its last POST carried (numbers increase
/// from front to back).
#[derive(Default)]
pub(super) struct Queue {
    /// The events, oldest first.
    pub(super) events: VecDeque<Queued>,
    /// The number of the next event queued.
    next: u64,
    /// The number of each user's status event waiting.
    status_of: HashMap<Arc<str>, u64>,
    /// The status events waiting: number -> user, oldest first.
    statuses: BTreeMap<u64, Arc<str>>,
    /// How many events each user has waiting.
    per_user: HashMap<Arc<str>, usize>,
}

/// One event waiting.
pub(super) struct Queued {
    /// Its place in the queue: numbers increase from front to back.
    pub(super) number: u64,
    /// When it was queued.
    pub(super) since: Instant,
    /// What is POSTed.
    pub(super) json: Arc<str>,
    /// Whose it is, and whether a status change.
    owner: Owner,
}

/// Whose event it is, and whether it is a status change (which a newer
/// one of the same user replaces, and which goes first when full).
#[derive(Clone)]
pub(super) struct Owner {
    /// The user (or room) it is of.
    pub(super) key: Arc<str>,
    /// Whether it is a status change.
    pub(super) status: bool,
}

impl Queue {
    /// Removes the event numbered `number`, if still there.
    fn remove(&mut self, number: u64) -> bool {
        let Ok(at) = self.events.binary_search_by_key(&number, |e| e.number) else {
            return false;
        };
        let gone = self.events.remove(at).expect("found just now");
        self.forget(&gone);
        true
    }

    /// Removes the oldest event, returning whether there was one.
    pub(super) fn pop_front(&mut self) -> bool {
        let Some(gone) = self.events.pop_front() else {
            return false;
        };
        self.forget(&gone);
        true
    }

    fn forget(&mut self, gone: &Queued) {
        if gone.owner.status {
            self.statuses.remove(&gone.number);
            self.status_of.remove(&gone.owner.key);
        }
        if let Some(n) = self.per_user.get_mut(&gone.owner.key) {
            *n -= 1;
            if *n == 0 {
                self.per_user.remove(&gone.owner.key);
            }
        }
    }

    /// Makes room for one more event of `owner`: the events it may replace
    /// or crowd out, and what a full queue gives up. Returns how many went.
    pub(super) fn make_room(&mut self, owner: &Owner, limit: usize) -> u64 {
        let mut dropped = 0;
        if owner.status {
            if let Some(old) = self.status_of.get(&owner.key).copied() {
                dropped += u64::from(self.remove(old));
            }
        }
        let cap = (limit / 2).clamp(1, MAX_QUEUED_PER_USER);
        if self.per_user.get(&owner.key).is_some_and(|n| *n >= cap) {
            let own = self.events.iter().find(|e| e.owner.key == owner.key);
            if let Some(number) = own.map(|e| e.number) {
                dropped += u64::from(self.remove(number));
            }
        }
        if self.events.len() >= limit {
            let removed = match self.statuses.keys().next().copied() {
                Some(number) => self.remove(number),
                None => self.pop_front(),
            };
            dropped += u64::from(removed);
        }
        dropped
    }

    /// Queues `json` of `owner` at the back.
    pub(super) fn push_back(&mut self, json: Arc<str>, owner: Owner) {
        let number = self.next;
        self.next += 1;
        if owner.status {
            self.status_of.insert(owner.key.clone(), number);
            self.statuses.insert(number, owner.key.clone());
        }
        *self.per_user.entry(owner.key.clone()).or_default() += 1;
        self.events.push_back(Queued {
            number,
            since: Instant::now(),
            json,
            owner,
        });
    }
}
