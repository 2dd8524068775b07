//! What a session keeps of each user it watches: what it last told its
//! client (one [`Seen`] per watch, kept small: a node holds a million), and
//! the few extras only some watches need.

use std::collections::HashMap;
use std::sync::Arc;

use crate::model::Record;
use crate::privacy::Relation;
use crate::registry::{self, Deliver, View};

/// The users this client watches.
#[derive(Default)]
pub(super) struct Watches {
    /// Watched users -> what this client was last told about them.
    pub(super) seen: HashMap<Arc<str>, Seen>,
    /// What only some watches need, for some of the time.
    pub(super) rare: Rare,
}

/// What only some watches need: boxed, and there only while not empty, so
/// that a session holds 8 B for it (a session stays small, see
/// `a_session_stays_small`).
#[derive(Default)]
pub(super) struct Rare(Option<Box<RareMaps>>);

/// The maps of [`Rare`].
#[derive(Default)]
pub(super) struct RareMaps {
    /// Events that arrived for a user whose snapshot read is still in
    /// flight, the newest per user; delivered after the snapshot, which
    /// drops those it already covers.
    pub(super) early: HashMap<String, Deliver>,
    /// While this viewer is a contact of a watched user: what a non-contact
    /// would be told of the user now, to fall back to at once when its
    /// contacts change. Beside [`Watches::seen`] rather than in [`Seen`],
    /// which every watch holds: few watches need it.
    pub(super) strangers: HashMap<Arc<str>, View>,
}

impl Rare {
    /// The maps, made if there are none.
    pub(super) fn maps(&mut self) -> &mut RareMaps {
        self.0.get_or_insert_with(Default::default)
    }

    /// Takes the event held for `user`.
    pub(super) fn take_early(&mut self, user: &str) -> Option<Deliver> {
        let taken = self.0.as_mut()?.early.remove(user);
        self.tidy();
        taken
    }

    /// Takes the non-contact view held for `user`.
    pub(super) fn take_stranger(&mut self, user: &str) -> Option<View> {
        let taken = self.0.as_mut()?.strangers.remove(user);
        self.tidy();
        taken
    }

    /// Drops the maps once both are empty.
    fn tidy(&mut self) {
        if let Some(maps) = &self.0 {
            if maps.early.is_empty() && maps.strangers.is_empty() {
                self.0 = None;
            }
        }
    }
}

impl Watches {
    /// Forgets everything about `user`.
    pub(super) fn forget(&mut self, user: &str) {
        self.seen.remove(user);
        self.rare.take_early(user);
        self.rare.take_stranger(user);
    }

    /// Keys the entries of `users` by the registry's copies of their ids,
    /// so that a user watched by many sessions has one copy on the node.
    pub(super) fn share(&mut self, users: Vec<Arc<str>>) {
        for user in users {
            match self.seen.get_key_value(&*user) {
                Some((held, _)) if !Arc::ptr_eq(held, &user) => {}
                _ => continue,
            }
            if let Some(seen) = self.seen.remove(&*user) {
                self.seen.insert(user, seen);
            }
        }
    }
}

/// What a session last told its client about one watched user.
#[derive(Debug, Clone)]
pub(super) struct Seen {
    /// Highest transition sequence number reflected: older events (ones a
    /// snapshot already covered) are dropped.
    pub(super) seq: u64,
    /// Fingerprint of the last record sent: a record that looks the same
    /// (e.g. `online` re-announced after a Redis restart) is not sent again.
    pub(super) fingerprint: u64,
    /// How this session's user stands to the watched one: which view of
    /// each transition it gets.
    pub(super) relation: Relation,
    /// Asked for, but its snapshot has not been read yet: events for it
    /// are held in [`Watches::early`] until it has.
    pub(super) pending: bool,
    /// The client asked for this user's device counts (`"devices":true`):
    /// a change of the count alone is news to it.
    pub(super) devices: bool,
    /// How many contacts changes of the user reached this session: a
    /// re-read that started before the latest one is stale.
    pub(super) marker: u32,
}

impl Seen {
    /// What this client can tell apart in `record`.
    pub(super) fn fingerprint_of(&self, record: &Record) -> u64 {
        if self.devices {
            registry::devices_fingerprint(record)
        } else {
            registry::fingerprint(record)
        }
    }
}

impl Default for Seen {
    fn default() -> Self {
        Self {
            seq: 0,
            fingerprint: 0,
            relation: Relation::Other,
            pending: false,
            devices: false,
            marker: 0,
        }
    }
}
