//! What a session keeps of each user it watches: what it last told its
//! client (one [`Seen`] per watch, kept small: a node holds a million), and
//! the few extras only some watches need.

use std::collections::{HashMap, HashSet};

use crate::ids::UserId;
use crate::model::Record;
use crate::privacy::Relation;
use crate::registry::{self, Deliver, View};

/// The users this client watches.
#[derive(Default)]
pub(super) struct Watches {
    /// Watched users -> what this client was last told about them.
    pub(super) seen: SeenMap,
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
    pub(super) strangers: HashMap<UserId, View>,
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

    /// Forgets everything about each of `users`, in one pass.
    pub(super) fn forget_all(&mut self, users: &[String]) {
        let gone: HashSet<&str> = users.iter().map(String::as_str).collect();
        self.seen.retain(|user| !gone.contains(user));
        for user in users {
            self.rare.take_early(user);
            self.rare.take_stranger(user);
        }
    }

    /// Keys the entries of `users` by the registry's copies of their ids,
    /// so that a user watched by many sessions has one copy on the node.
    pub(super) fn share(&mut self, users: Vec<UserId>) {
        for user in users {
            if let Ok(i) = self.seen.find(&user) {
                self.seen.0[i].0 = user;
            }
        }
    }
}

/// Watched users -> what this client was last told about them, sorted by
/// user and without spare room: 32 B a watch, where a hash map's table
/// (between half and seven eighths full, with a control byte a slot) took
/// 46 to 82 B (issue 29, memory per watch). Found by binary search.
#[derive(Default)]
pub(super) struct SeenMap(Vec<(UserId, Seen)>);

impl SeenMap {
    /// Where `user` is, or would go.
    fn find(&self, user: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(k, _)| (**k).cmp(user))
    }

    /// Watched users.
    pub(super) fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether `user` is watched.
    pub(super) fn contains_key(&self, user: &str) -> bool {
        self.find(user).is_ok()
    }

    /// What this client was told about `user`.
    pub(super) fn get(&self, user: &str) -> Option<&Seen> {
        self.find(user).ok().map(|i| &self.0[i].1)
    }

    /// The same, to change.
    pub(super) fn get_mut(&mut self, user: &str) -> Option<&mut Seen> {
        self.find(user).ok().map(|i| &mut self.0[i].1)
    }

    /// The held id of `user`, and what this client was told about it.
    pub(super) fn get_key_value(&self, user: &str) -> Option<(&UserId, &Seen)> {
        self.find(user).ok().map(|i| (&self.0[i].0, &self.0[i].1))
    }

    /// Adds users not watched yet (one sort for the lot, not a shift each).
    pub(super) fn insert_new(&mut self, new: impl IntoIterator<Item = (UserId, Seen)>) {
        self.0.extend(new);
        self.0.sort_by(|a, b| a.0.cmp(&b.0));
        self.0.dedup_by(|a, b| a.0 == b.0);
        self.0.shrink_to_fit();
    }

    /// Stops watching `user`.
    pub(super) fn remove(&mut self, user: &str) -> Option<Seen> {
        let i = self.find(user).ok()?;
        let (_, seen) = self.0.remove(i);
        self.tidy();
        Some(seen)
    }

    /// Keeps the users `keep` says yes to.
    fn retain(&mut self, mut keep: impl FnMut(&str) -> bool) {
        self.0.retain(|(user, _)| keep(user));
        self.tidy();
    }

    /// Gives the room back once half of it is spare.
    fn tidy(&mut self) {
        if self.0.capacity() > 2 * self.0.len() {
            self.0.shrink_to_fit();
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

#[cfg(test)]
mod tests {
    use super::*;

    fn watching(users: &[&str]) -> Watches {
        let mut w = Watches::default();
        let entries = users.iter().map(|u| (UserId::from(*u), Seen::default()));
        w.seen.insert_new(entries);
        w
    }

    #[test]
    fn the_map_stays_sorted_and_tight() {
        let mut w = watching(&["carol", "alice", "bob"]);
        w.seen.insert_new([
            ("alice".into(), Seen::default()),
            ("dave".into(), Seen::default()),
        ]);
        assert_eq!(w.seen.len(), 4);
        assert!(["alice", "bob", "carol", "dave"]
            .iter()
            .all(|u| w.seen.contains_key(u)));
        assert!(w.seen.get("eve").is_none());
        w.seen.get_mut("bob").unwrap().seq = 7;
        assert_eq!(w.seen.remove("bob").map(|s| s.seq), Some(7));
        w.forget_all(&["alice".into(), "zed".into()]);
        assert!(!w.seen.contains_key("alice") && w.seen.contains_key("carol"));
        assert!(w.seen.0.capacity() <= 2 * w.seen.len());
    }

    #[test]
    fn shared_ids_replace_the_sessions_own() {
        let mut w = watching(&["alice", "bob"]);
        let registry: UserId = UserId::from("bob");
        w.share(vec![registry.clone(), UserId::from("nobody")]);
        let (held, _) = w.seen.get_key_value("bob").unwrap();
        assert!(UserId::ptr_eq(held, &registry));
        assert_eq!(w.seen.len(), 2);
    }
}
