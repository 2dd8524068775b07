//! One receiver's queue of webhook events, and what gives way when one
//! user is over its share or the queue is full (see the module above).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
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
    /// The room events waiting, oldest first: the first to give way.
    rooms: BTreeSet<u64>,
    /// What each user has waiting.
    per_user: HashMap<Arc<str>, Own>,
}

/// One user's events waiting.
#[derive(Default)]
struct Own {
    /// How many, of every class.
    count: usize,
    /// The numbers of its room events, oldest first.
    rooms: BTreeSet<u64>,
}

/// One event waiting.
pub(super) struct Queued {
    /// Its place in the queue: numbers increase from front to back.
    pub(super) number: u64,
    /// When it was queued.
    pub(super) since: Instant,
    /// What is POSTed.
    pub(super) json: Arc<str>,
    /// Whose it is, and its class.
    owner: Owner,
}

/// What an event is, in the order in which events give way to others
/// (the lowest first): a receiver that missed a room event still has the
/// user's presence right, and one that missed a status change still knows
/// who is online.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Class {
    /// `room_joined`, `room_left`, `room_occupied`, `room_vacated`.
    Room,
    /// A status change: a newer one of the same user replaces it.
    Status,
    /// Online or offline.
    Transition,
}

/// Whose event it is (the user who caused it), and its class.
#[derive(Clone)]
pub(super) struct Owner {
    /// The user who caused it.
    pub(super) key: Arc<str>,
    /// What gives way first.
    pub(super) class: Class,
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
        match gone.owner.class {
            Class::Status => {
                self.statuses.remove(&gone.number);
                self.status_of.remove(&gone.owner.key);
            }
            Class::Room => {
                self.rooms.remove(&gone.number);
            }
            Class::Transition => {}
        }
        if let Some(own) = self.per_user.get_mut(&gone.owner.key) {
            own.count -= 1;
            own.rooms.remove(&gone.number);
            if own.count == 0 {
                self.per_user.remove(&gone.owner.key);
            }
        }
    }

    /// The event that gives way first among `user`'s (or, with `None`,
    /// among all): its class and number.
    fn first_to_go(&self, user: Option<&Arc<str>>) -> Option<(Class, u64)> {
        let (rooms, status) = match user {
            Some(user) => {
                let own = self.per_user.get(user)?;
                (own.rooms.first(), self.status_of.get(user))
            }
            None => (self.rooms.first(), self.statuses.keys().next()),
        };
        if let Some(number) = rooms {
            return Some((Class::Room, *number));
        }
        if let Some(number) = status {
            return Some((Class::Status, *number));
        }
        let mut waiting = self.events.iter();
        let oldest = match user {
            Some(user) => waiting.find(|e| e.owner.key == *user),
            None => waiting.next(),
        }?;
        Some((oldest.owner.class, oldest.number))
    }

    /// Gives way to one new event of class `new`: drops what goes first
    /// among `user`'s events (or among all), unless the new event is of a
    /// class that goes before it, when that is the one dropped. Returns
    /// whether the new event stays, and how many waiting events went.
    fn give_way(&mut self, user: Option<&Arc<str>>, new: Class) -> (bool, u64) {
        match self.first_to_go(user) {
            Some((class, number)) if new >= class => (true, u64::from(self.remove(number))),
            Some(_) => (false, 0),
            None => (true, 0),
        }
    }

    /// Makes room for one more event of `owner`: the status event it
    /// replaces, its own event that gives way when it is over its share,
    /// and what a full queue gives up. Returns whether the new event is to
    /// be queued (it may be the one that gives way), and how many waiting
    /// events went.
    pub(super) fn make_room(&mut self, owner: &Owner, limit: usize) -> (bool, u64) {
        let mut dropped = 0;
        if owner.class == Class::Status {
            if let Some(old) = self.status_of.get(&owner.key).copied() {
                dropped += u64::from(self.remove(old));
            }
        }
        let cap = (limit / 2).clamp(1, MAX_QUEUED_PER_USER);
        if self
            .per_user
            .get(&owner.key)
            .is_some_and(|own| own.count >= cap)
        {
            let (keep, gone) = self.give_way(Some(&owner.key), owner.class);
            dropped += gone;
            if !keep {
                return (false, dropped);
            }
        }
        if self.events.len() >= limit {
            let (keep, gone) = self.give_way(None, owner.class);
            return (keep, dropped + gone);
        }
        (true, dropped)
    }

    /// Queues `json` of `owner` at the back.
    pub(super) fn push_back(&mut self, json: Arc<str>, owner: Owner) {
        let number = self.next;
        self.next += 1;
        let own = self.per_user.entry(owner.key.clone()).or_default();
        own.count += 1;
        match owner.class {
            Class::Status => {
                self.status_of.insert(owner.key.clone(), number);
                self.statuses.insert(number, owner.key.clone());
            }
            Class::Room => {
                own.rooms.insert(number);
                self.rooms.insert(number);
            }
            Class::Transition => {}
        }
        self.events.push_back(Queued {
            number,
            since: Instant::now(),
            json,
            owner,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Queues an event of `user` of `class` the way a sink does; returns
    /// whether it was queued and how many waiting events went.
    fn push(q: &mut Queue, user: &str, class: Class, limit: usize) -> (bool, u64) {
        let owner = Owner {
            key: user.into(),
            class,
        };
        let made = q.make_room(&owner, limit);
        if made.0 {
            q.push_back(user.into(), owner);
        }
        made
    }

    /// The users and classes waiting, oldest first.
    fn waiting(q: &Queue) -> Vec<(String, Class)> {
        q.events
            .iter()
            .map(|e| (e.json.to_string(), e.owner.class))
            .collect()
    }

    #[test]
    fn a_full_queue_gives_up_room_events_then_statuses_then_transitions() {
        use Class::*;
        let mut q = Queue::default();
        for (user, class) in [("a", Transition), ("b", Room), ("c", Status), ("d", Room)] {
            assert_eq!(push(&mut q, user, class, 4), (true, 0));
        }
        // Full: the oldest room event goes, for any class.
        assert_eq!(push(&mut q, "e", Status, 4), (true, 1));
        assert_eq!(push(&mut q, "f", Room, 4), (true, 1));
        let users: Vec<String> = waiting(&q).into_iter().map(|(u, _)| u).collect();
        assert_eq!(users, ["a", "c", "e", "f"]);
        // The last room event makes way for g, then the statuses, oldest
        // first, for h and i ...
        assert_eq!(push(&mut q, "g", Transition, 4), (true, 1));
        assert_eq!(push(&mut q, "h", Transition, 4), (true, 1));
        // ... and a new room event with only those waiting is the one dropped.
        assert_eq!(push(&mut q, "i", Transition, 4), (true, 1));
        assert_eq!(push(&mut q, "j", Room, 4), (false, 0));
        assert_eq!(push(&mut q, "k", Status, 4), (false, 0));
        assert_eq!(
            waiting(&q),
            [
                ("a".into(), Transition),
                ("g".into(), Transition),
                ("h".into(), Transition),
                ("i".into(), Transition)
            ]
        );
        // Only transitions waiting: the oldest of them makes way for one.
        assert_eq!(push(&mut q, "l", Transition, 4), (true, 1));
        assert_eq!(waiting(&q)[0].0, "g");
    }

    #[test]
    fn a_user_over_its_share_gives_up_its_own_room_events_first() {
        use Class::*;
        let limit = 1000;
        let cap = MAX_QUEUED_PER_USER;
        let mut q = Queue::default();
        assert_eq!(push(&mut q, "churner", Transition, limit), (true, 0));
        assert_eq!(push(&mut q, "other", Transition, limit), (true, 0));
        for _ in 1..cap {
            assert_eq!(push(&mut q, "churner", Room, limit), (true, 0));
        }
        // At its share: each new room event takes the place of its oldest.
        for _ in 0..10 {
            assert_eq!(push(&mut q, "churner", Room, limit), (true, 1));
        }
        let own = |q: &Queue| waiting(q).iter().filter(|(u, _)| u == "churner").count();
        assert_eq!(own(&q), cap);
        // Its online stays; so does the other user's.
        assert_eq!(waiting(&q)[0], ("churner".into(), Transition));
        assert_eq!(waiting(&q)[1], ("other".into(), Transition));
        // A transition of its own makes way by a room event of its own.
        assert_eq!(push(&mut q, "churner", Transition, limit), (true, 1));
        assert_eq!(own(&q), cap);
        // With nothing but transitions of its own waiting, a room event is
        // the one dropped.
        let mut q = Queue::default();
        for _ in 0..cap {
            assert_eq!(push(&mut q, "flapper", Transition, limit), (true, 0));
        }
        assert_eq!(push(&mut q, "flapper", Room, limit), (false, 0));
        assert_eq!(push(&mut q, "flapper", Transition, limit), (true, 1));
        assert!(q.per_user["flapper"].rooms.is_empty());
        assert_eq!(q.per_user["flapper"].count, cap);
    }

    #[test]
    fn the_indexes_follow_the_events() {
        use Class::*;
        let mut q = Queue::default();
        push(&mut q, "a", Room, 10);
        push(&mut q, "a", Status, 10);
        push(&mut q, "a", Status, 10);
        push(&mut q, "b", Room, 10);
        assert_eq!(q.events.len(), 3, "the newer status replaced the older");
        while q.pop_front() {}
        assert!(q.per_user.is_empty());
        assert!(q.rooms.is_empty() && q.statuses.is_empty() && q.status_of.is_empty());
    }
}
