//! The local sessions watching one user, kept small: most users on a node
//! are watched by one session, and a `HashSet` of one costs a 64 B
//! allocation besides its 48 B of table (issue 29, memory per watch).
//! It also says whether Redis confirmed the node's subscription to the
//! user's events: in the padding beside the enum's tag, where a set of
//! subscribed users cost 34 B a watched user.

use std::collections::HashSet;

use super::SessionId;

/// The sessions of this node watching one user; never empty while held.
#[derive(Debug)]
pub(super) enum Watching {
    /// One session (the common case): no allocation. The flag: the
    /// subscription is confirmed (only `Registry::by_user` keeps it).
    One(SessionId, bool),
    /// Several. Boxed so that the enum is 16 B, not the 48 of a set:
    /// every watched user's entry holds one.
    #[allow(clippy::box_collection)]
    Many(Box<HashSet<SessionId>>, bool),
}

impl Watching {
    /// `session` alone, the subscription confirmed or not.
    pub(super) fn one(session: SessionId, subscribed: bool) -> Self {
        Watching::One(session, subscribed)
    }

    /// Whether Redis confirmed the subscription to the user's events.
    pub(super) fn subscribed(&self) -> bool {
        match self {
            Watching::One(_, s) | Watching::Many(_, s) => *s,
        }
    }

    /// Redis confirmed the subscription.
    pub(super) fn set_subscribed(&mut self) {
        match self {
            Watching::One(_, s) | Watching::Many(_, s) => *s = true,
        }
    }

    /// Adds `session`.
    pub(super) fn insert(&mut self, session: SessionId) {
        match self {
            Watching::One(s, _) if *s == session => {}
            Watching::One(s, subscribed) => {
                let set: HashSet<SessionId> = [*s, session].into_iter().collect();
                *self = Watching::Many(Box::new(set), *subscribed);
            }
            Watching::Many(set, _) => {
                set.insert(session);
            }
        }
    }

    /// Removes `session`; true when none is left (the caller drops the entry).
    pub(super) fn remove(&mut self, session: SessionId) -> bool {
        match self {
            Watching::One(s, _) => *s == session,
            Watching::Many(set, subscribed) => {
                set.remove(&session);
                match set.len() {
                    0 => true,
                    1 => {
                        let last = *set.iter().next().expect("one left");
                        *self = Watching::One(last, *subscribed);
                        false
                    }
                    n => {
                        if set.capacity() > 64 && n * 4 < set.capacity() {
                            set.shrink_to_fit();
                        }
                        false
                    }
                }
            }
        }
    }

    /// The sessions.
    pub(super) fn iter(&self) -> impl Iterator<Item = SessionId> + '_ {
        let (one, many) = match self {
            Watching::One(s, _) => (Some(*s), None),
            Watching::Many(set, _) => (None, Some(set.iter().copied())),
        };
        one.into_iter().chain(many.into_iter().flatten())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_and_shrinks_back_to_one() {
        let mut w = Watching::one(1, false);
        w.insert(1);
        assert!(matches!(w, Watching::One(1, false)));
        w.insert(2);
        w.set_subscribed();
        w.insert(3);
        let mut all: Vec<_> = w.iter().collect();
        all.sort();
        assert_eq!(all, [1, 2, 3]);
        assert!(!w.remove(2));
        assert!(!w.remove(1));
        assert!(matches!(w, Watching::One(3, true)));
        assert!(!w.remove(7));
        assert!(w.remove(3));
        assert_eq!(std::mem::size_of::<Watching>(), 16);
    }
}
