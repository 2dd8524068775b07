//! The node's memory of the backend's answers, per (user, room): bounded
//! in entries, so that a flood of distinct users and rooms cannot grow it
//! without limit, and oldest first out when full.
//!
//! An allowed answer is kept past its freshness for a grace as long again:
//! not to let anyone in, but so that a member whose membership Redis lost
//! is not thrown out of the room because the backend is down at that
//! moment (see [`Lookup::Stale`]).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most answers one node keeps. At the default 1 KiB room state an entry
/// holds at most about 1.3 KiB (user, room, state), so the cache stays
/// under about 130 MiB however the node is used; typical entries, with a
/// small state or none, take a tenth of that.
pub const MAX_ENTRIES: usize = 100_000;

/// The backend let a user into a room.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The state that replaces the device's own, if any.
    pub state: Option<Arc<str>>,
    /// When the question was sent, epoch ms: a removal of the user from
    /// the room since then voids the grant (the join step checks).
    pub asked_at: i64,
}

/// An answer worth keeping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kept {
    /// Let in.
    Allowed(Grant),
    /// Refused, and why.
    Refused(Arc<str>),
}

/// What the cache knows of a (user, room).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// An answer within its freshness: it decides.
    Fresh(Kept),
    /// An allowed answer past its freshness but within its grace: it lets
    /// a member back in only when the backend cannot be asked.
    Stale(Grant),
    /// Nothing that counts.
    Missing,
}

/// One kept answer.
#[derive(Debug)]
struct Entry {
    /// The answer.
    kept: Kept,
    /// Until when it decides.
    fresh_until: Instant,
    /// Until when it is kept at all (its grace, for an allowed answer).
    keep_until: Instant,
    /// Its place in [`Cache::order`]: an older record of the same key
    /// there is obsolete.
    generation: u64,
}

/// The answers, and the order they came in.
#[derive(Debug)]
pub struct Cache {
    /// By key ([`key`]).
    entries: HashMap<Arc<str>, Entry>,
    /// Keys in the order their answers came, with the generation of each:
    /// the oldest go first when the cache is full.
    order: VecDeque<(Arc<str>, u64)>,
    /// The generation of the next answer.
    next: u64,
    /// Most entries.
    max: usize,
}

/// The key of a (user, room): a user id has no `:`, so the first `:`
/// parts them.
pub fn key(user: &str, room: &str) -> Arc<str> {
    Arc::from(format!("{user}:{room}"))
}

impl Cache {
    /// An empty cache of at most `max` entries (at least one).
    pub fn new(max: usize) -> Self {
        Self {
            entries: HashMap::new(),
            order: VecDeque::new(),
            next: 0,
            max: max.max(1),
        }
    }

    /// Forgets what it knows of `key`.
    pub fn forget(&mut self, key: &str) {
        self.entries.remove(key);
    }

    /// Entries held now.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// What the cache knows of `key` at `now`; an entry past its grace is
    /// dropped on the way.
    pub fn lookup(&mut self, key: &str, now: Instant) -> Lookup {
        let Some(entry) = self.entries.get(key) else {
            return Lookup::Missing;
        };
        if now < entry.fresh_until {
            return Lookup::Fresh(entry.kept.clone());
        }
        match &entry.kept {
            Kept::Allowed(state) if now < entry.keep_until => Lookup::Stale(state.clone()),
            _ => {
                self.entries.remove(key);
                Lookup::Missing
            }
        }
    }

    /// Keeps `kept` for `key`: fresh for `fresh`, an allowed answer then
    /// kept for `grace` more. An answer not to be kept (`fresh` zero)
    /// still replaces what was there: a refusal ends an earlier grant, its
    /// grace included.
    pub fn store(
        &mut self,
        key: Arc<str>,
        kept: Kept,
        fresh: Duration,
        grace: Duration,
        now: Instant,
    ) {
        if fresh.is_zero() {
            self.entries.remove(&key);
            return;
        }
        let grace = match kept {
            Kept::Allowed(_) => grace,
            Kept::Refused(_) => Duration::ZERO,
        };
        let generation = self.next;
        self.next += 1;
        let entry = Entry {
            kept,
            fresh_until: now + fresh,
            keep_until: now + fresh + grace,
            generation,
        };
        self.entries.insert(key.clone(), entry);
        self.order.push_back((key, generation));
        self.trim(now);
    }

    /// Drops what is past its grace at the front, then the oldest while
    /// over the bound; compacts the order when obsolete records pile up
    /// (keys answered again).
    fn trim(&mut self, now: Instant) {
        while let Some((key, generation)) = self.order.front() {
            let current = self
                .entries
                .get(key)
                .filter(|e| e.generation == *generation);
            match current {
                None => {}
                Some(e) if e.keep_until <= now || self.entries.len() > self.max => {
                    self.entries.remove(key);
                }
                Some(_) => break,
            }
            self.order.pop_front();
        }
        if self.order.len() > 2 * self.max {
            let entries = &self.entries;
            self.order
                .retain(|(key, g)| entries.get(key).is_some_and(|e| e.generation == *g));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn grant() -> Grant {
        Grant {
            state: None,
            asked_at: 7,
        }
    }

    fn allowed() -> Kept {
        Kept::Allowed(grant())
    }

    #[test]
    fn an_answer_is_fresh_then_stale_then_gone() {
        let t0 = Instant::now();
        let mut c = Cache::new(10);
        c.store(key("u", "r"), allowed(), 10 * S, 10 * S, t0);
        assert_eq!(c.lookup("u:r", t0 + 9 * S), Lookup::Fresh(allowed()));
        assert_eq!(c.lookup("u:r", t0 + 10 * S), Lookup::Stale(grant()));
        assert_eq!(c.lookup("u:r", t0 + 20 * S), Lookup::Missing);
        assert!(c.is_empty(), "dropped once past its grace");
    }

    #[test]
    fn a_refusal_has_no_grace_and_ends_a_grant() {
        let t0 = Instant::now();
        let mut c = Cache::new(10);
        let no = Kept::Refused("no".into());
        c.store(key("u", "r"), no.clone(), 5 * S, 10 * S, t0);
        assert_eq!(c.lookup("u:r", t0 + 4 * S), Lookup::Fresh(no));
        assert_eq!(c.lookup("u:r", t0 + 5 * S), Lookup::Missing);
        c.store(key("u", "r"), allowed(), 5 * S, 10 * S, t0);
        // A refusal not to be kept still ends the grant, grace and all.
        c.store(
            key("u", "r"),
            Kept::Refused("no".into()),
            Duration::ZERO,
            10 * S,
            t0,
        );
        assert_eq!(c.lookup("u:r", t0 + 6 * S), Lookup::Missing);
    }

    #[test]
    fn the_oldest_go_first_when_full() {
        let t0 = Instant::now();
        let mut c = Cache::new(3);
        for i in 0..5 {
            c.store(key("u", &i.to_string()), allowed(), 60 * S, 60 * S, t0);
        }
        assert_eq!(c.len(), 3);
        assert_eq!(c.lookup("u:0", t0), Lookup::Missing);
        assert_eq!(c.lookup("u:1", t0), Lookup::Missing);
        assert_eq!(c.lookup("u:4", t0), Lookup::Fresh(allowed()));
        // One key answered over and over neither grows the cache nor its
        // order, nor pushes the others out.
        for _ in 0..100 {
            c.store(key("u", "4"), allowed(), 60 * S, 60 * S, t0);
        }
        assert_eq!(c.len(), 3);
        assert!(c.order.len() <= 6, "{}", c.order.len());
        assert_eq!(c.lookup("u:2", t0), Lookup::Fresh(allowed()));
    }

    #[test]
    fn expired_entries_go_before_live_ones() {
        let t0 = Instant::now();
        let mut c = Cache::new(2);
        c.store(key("u", "old"), allowed(), S, Duration::ZERO, t0);
        c.store(key("u", "live"), allowed(), 60 * S, 60 * S, t0);
        c.store(key("u", "new"), allowed(), 60 * S, 60 * S, t0 + 2 * S);
        assert_eq!(c.len(), 2);
        assert_eq!(c.lookup("u:live", t0 + 2 * S), Lookup::Fresh(allowed()));
    }
}
