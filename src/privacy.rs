//! Who sees what: the one place that turns a user's true presence into what
//! a given viewer may see. Every surface (events, snapshots, the HTTP API,
//! the online list, device details) goes through [`view`].

use crate::model::{Audience, Presence, Record};

/// How a viewer stands to the user being looked at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Relation {
    /// The user itself: sees the whole truth, `invisible` included.
    Owner,
    /// Listed in the user's contacts.
    Contact,
    /// Anyone else, anonymous readers included.
    Other,
    /// A watcher the watch policy keeps out: sees nothing but `offline`.
    Blocked,
}

impl Relation {
    /// Every relation, in the order of [`Relation::index`].
    pub const ALL: [Relation; 4] = [
        Relation::Owner,
        Relation::Contact,
        Relation::Other,
        Relation::Blocked,
    ];

    /// Position in [`Relation::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// The relation of `viewer` to `user`.
    pub fn of(viewer: Option<&str>, user: &str, is_contact: bool, contacts_only: bool) -> Self {
        match viewer {
            Some(v) if v == user => Relation::Owner,
            _ if is_contact => Relation::Contact,
            _ if contacts_only => Relation::Blocked,
            _ => Relation::Other,
        }
    }

    /// How anyone not in a user's contacts (but the user itself) stands
    /// to it.
    pub fn stranger(contacts_only: bool) -> Self {
        Self::of(None, "", false, contacts_only)
    }

    fn admits(self, audience: Audience) -> bool {
        match (self, audience) {
            (Relation::Owner, _) => true,
            (Relation::Blocked, _) | (_, Audience::Nobody) => false,
            (_, Audience::Everyone) => true,
            (Relation::Contact, Audience::Contacts) => true,
            (Relation::Other, Audience::Contacts) => false,
        }
    }
}

/// What `relation` may see of `p`.
///
/// - The owner sees the truth, `invisible` included.
/// - Others see the user online only if it has a device, did not choose
///   `invisible`, and `show_online` admits them. Otherwise they see
///   `offline` with no devices and no text, exactly like a user who left.
/// - `last_seen` is shown when `show_last_seen` admits them. For a user
///   who chose `invisible` it is the moment it did, so that going invisible
///   looks like leaving and nothing reveals when it really left later.
pub fn view(p: &Presence, relation: Relation) -> Record {
    if relation == Relation::Owner {
        return Record {
            user: p.user.clone(),
            status: p.status.clone(),
            devices: p.devices,
            last_seen: if p.devices > 0 { None } else { p.last_seen },
            text: p.text.clone(),
            until: p.until,
            kinds: if p.devices > 0 {
                p.kinds.clone()
            } else {
                Vec::new()
            },
            idle: p.devices > 0 && p.idle,
        };
    }
    let invisible = p.chosen == "invisible";
    if p.devices > 0 && !invisible && relation.admits(p.show_online) {
        return Record {
            user: p.user.clone(),
            status: p.status.clone(),
            devices: p.devices,
            last_seen: None,
            text: p.text.clone(),
            until: p.until,
            kinds: p.kinds.clone(),
            idle: p.idle,
        };
    }
    let last_seen = if !relation.admits(p.show_last_seen) {
        None
    } else if invisible && p.since > 0 {
        Some(p.since)
    } else {
        p.last_seen
    };
    Record {
        user: p.user.clone(),
        status: "offline".into(),
        devices: 0,
        last_seen,
        text: None,
        until: None,
        kinds: Vec::new(),
        idle: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(status: &str, devices: u32, chosen: &str) -> Presence {
        Presence {
            user: "bob".into(),
            status: status.into(),
            devices,
            last_seen: Some(100),
            text: Some("hi".into()),
            chosen: chosen.into(),
            since: 50,
            show_online: Audience::Everyone,
            show_last_seen: Audience::Everyone,
            until: Some(900),
            kinds: vec!["mobile".into()],
            idle: true,
        }
    }

    #[test]
    fn invisible_is_offline_to_everyone_else() {
        let bob = p("invisible", 2, "invisible");
        assert_eq!(view(&bob, Relation::Owner).status, "invisible");
        for r in [Relation::Contact, Relation::Other, Relation::Blocked] {
            let v = view(&bob, r);
            assert_eq!((v.status.as_str(), v.devices, v.text), ("offline", 0, None));
            assert_eq!((v.until, v.kinds.len(), v.idle), (None, 0, false));
        }
        assert_eq!(view(&bob, Relation::Other).last_seen, Some(50));
        // Really gone later: still the moment it went invisible.
        let gone = p("offline", 0, "invisible");
        assert_eq!(view(&gone, Relation::Other), view(&bob, Relation::Other));
    }

    #[test]
    fn audiences_apply_per_relation() {
        let mut bob = p("away", 1, "away");
        bob.show_online = Audience::Contacts;
        bob.show_last_seen = Audience::Nobody;
        assert_eq!(view(&bob, Relation::Contact).status, "away");
        assert_eq!(view(&bob, Relation::Other).status, "offline");
        assert_eq!(view(&bob, Relation::Other).last_seen, None);
        // Until and kinds go with the status.
        assert_eq!(view(&bob, Relation::Contact).until, Some(900));
        assert_eq!(view(&bob, Relation::Contact).kinds, vec!["mobile"]);
        assert_eq!(view(&bob, Relation::Other).until, None);
        assert!(view(&bob, Relation::Other).kinds.is_empty());
        // So does the idle mark.
        assert!(view(&bob, Relation::Contact).idle);
        assert!(!view(&bob, Relation::Other).idle);
        let mut gone = p("offline", 0, "online");
        gone.show_last_seen = Audience::Contacts;
        assert_eq!(view(&gone, Relation::Contact).last_seen, Some(100));
        assert_eq!(view(&gone, Relation::Other).last_seen, None);
        assert_eq!(view(&gone, Relation::Blocked).last_seen, None);
        assert_eq!(view(&gone, Relation::Owner).last_seen, Some(100));
    }
}
