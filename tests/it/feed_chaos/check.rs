//! The checks of the feed chaos run: the receiver against the recorded
//! feed, and what the watchers and the room members were told against it.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{json, Value};

use super::world::{PresenceSeen, RoomSeen, World};

/// Every event of the feed read over the run, by id.
#[derive(Default)]
pub(super) struct Recorded {
    by_id: BTreeMap<String, Value>,
}

impl Recorded {
    /// Adds a read of the feed; an event read before must be read alike.
    pub fn add(&mut self, events: &[Value]) {
        for e in events {
            let id = e["id"].as_str().unwrap().to_string();
            if let Some(before) = self.by_id.get(&id) {
                assert_eq!(before, e, "the feed changed event {id}");
            } else {
                self.by_id.insert(id, e.clone());
            }
        }
    }

    /// The events of `owner` (a user, or `r:<room>`), in its order.
    fn of(&self, owner_id: &str) -> Vec<&Value> {
        let mut out: Vec<&Value> = self
            .by_id
            .values()
            .filter(|e| owner(e) == owner_id)
            .collect();
        out.sort_by_key(|e| rank(e));
        out
    }
}

/// The ids of `events`.
pub(super) fn ids(events: &[Value]) -> BTreeSet<String> {
    events
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_string())
        .collect()
}

/// The user, or `r:<room>`, whose event `e` is.
fn owner(e: &Value) -> String {
    match e.get("room") {
        Some(room) => format!("r:{}", room.as_str().unwrap()),
        None => e["user"].as_str().unwrap().to_string(),
    }
}

/// Where `e` stands among its owner's events: by `seq`, and a room's
/// occupied (vacated) after the join (leave) of the same `seq`.
fn rank(e: &Value) -> (u64, bool) {
    let whole = matches!(e["type"].as_str(), Some("room_occupied" | "room_vacated"));
    (e["seq"].as_u64().unwrap(), whole)
}

/// Each owner's events come in `events` in their order.
pub(super) fn assert_in_order(events: &[Value], what: &str) {
    let mut last: BTreeMap<String, (u64, bool, &str)> = BTreeMap::new();
    for e in events {
        let (seq, whole) = rank(e);
        let id = e["id"].as_str().unwrap();
        if let Some(&(s, w, before)) = last.get(&owner(e)) {
            assert!((s, w) < (seq, whole), "{what}: {id} after {before}");
        }
        last.insert(owner(e), (seq, whole, id));
    }
}

/// What the checks counted.
pub(super) struct Tally {
    user_events: usize,
    room_events: usize,
    ghost_events: usize,
    posts: usize,
    failed: usize,
    unanswered: usize,
    duplicates: usize,
    presence_frames: usize,
    room_frames: usize,
}

impl std::fmt::Display for Tally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "events: {} of users ({} of ghosts), {} of rooms; POSTs: {}, {} answered 500, \
             {} unanswered (down); {} events delivered twice or more; checked {} presence \
             frames of watchers, {} room events of members",
            self.user_events,
            self.ghost_events,
            self.room_events,
            self.posts,
            self.failed,
            self.unanswered,
            self.duplicates,
            self.presence_frames,
            self.room_frames
        )
    }
}

/// Every check of the run.
pub(super) fn all(world: &World, recorded: &Recorded) -> Tally {
    let duplicates = receiver_is_the_feed(&world.receiver.events(), recorded);
    let ghost_events = ghosts_unseen(world, recorded);
    watchers_saw_the_feed(&world.presence_seen, recorded);
    members_saw_the_feed(&world.room_seen, recorded);
    let deliveries = world.receiver.deliveries();
    let rooms = recorded.by_id.values().filter(|e| e.get("room").is_some());
    let room_events = rooms.count();
    Tally {
        user_events: recorded.by_id.len() - room_events,
        room_events,
        ghost_events,
        posts: deliveries.len(),
        failed: deliveries.iter().filter(|d| d.answered == 500).count(),
        unanswered: deliveries.iter().filter(|d| d.answered == 0).count(),
        duplicates,
        presence_frames: world.presence_seen.len(),
        room_frames: world.room_seen.len(),
    }
}

/// The receiver's events, deduplicated by id, are the recorded feed, event
/// for event; each owner's first deliveries come in its order. How many
/// deliveries were repeats.
fn receiver_is_the_feed(received: &[Value], recorded: &Recorded) -> usize {
    let mut first = Vec::new();
    let mut seen = BTreeSet::new();
    for e in received {
        let mut e = e.clone();
        e.as_object_mut().unwrap().remove("_node");
        if seen.insert(e["id"].as_str().unwrap().to_string()) {
            first.push(e);
        }
    }
    let want: BTreeSet<String> = recorded.by_id.keys().cloned().collect();
    let missing: Vec<&String> = want.difference(&seen).collect();
    let extra: Vec<&String> = seen.difference(&want).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "the receiver against the feed: {} missing {missing:?}, {} not in the feed {extra:?}",
        missing.len(),
        extra.len()
    );
    for e in &first {
        assert_eq!(&recorded.by_id[e["id"].as_str().unwrap()], e, "delivered");
    }
    assert_in_order(&first, "the receiver");
    received.len() - first.len()
}

/// An invisible user's comings and goings show nowhere: its events in the
/// feed say `invisible` or `offline`, it has no room event, and no watcher
/// or member was told of it. Its events.
fn ghosts_unseen(world: &World, recorded: &Recorded) -> usize {
    let mut events = 0;
    for ghost in &world.ghosts {
        let own = recorded.of(ghost);
        for e in &own {
            let status = e["status"].as_str().unwrap();
            assert!(status == "invisible" || status == "offline", "{e}");
        }
        events += own.len();
        let in_rooms = recorded
            .by_id
            .values()
            .find(|e| e.get("room").is_some() && e["user"] == ghost.as_str());
        assert!(in_rooms.is_none(), "a ghost in a room's feed: {in_rooms:?}");
        if let Some(seen) = world.presence_seen.iter().find(|s| s.user == *ghost) {
            panic!("{} was shown a ghost: {}", seen.watcher, seen.frame);
        }
        if let Some(seen) = world.room_seen.iter().find(|s| s.user == *ghost) {
            panic!(
                "{} was shown {} {} {}",
                seen.member, seen.kind, seen.room, ghost
            );
        }
    }
    assert!(events > 0, "the ghosts never came");
    events
}

/// What a watcher (a stranger: the privacy settings are the defaults)
/// sees of a user: the fields of a `presence` frame but `devices` (a
/// device coming or going alone is no event of the feed, and a watcher
/// told the user's record afresh gets the count of then).
fn view_of_frame(f: &Value) -> Value {
    json!({"status": f["status"], "text": f["text"], "last_seen": f["last_seen"],
        "until": f["until"], "kinds": f["kinds"]})
}

/// What a watcher sees of the user after each of its events `events` (in
/// order), with the event's id and `at`: as `privacy::view` makes it, the
/// status the user chose being that of its last event with a device.
fn views_of(events: &[&Value]) -> Vec<(Value, String, i64)> {
    let mut chosen = String::from("online");
    let mut out = Vec::new();
    for e in events {
        let online = e["devices"].as_u64().unwrap() > 0;
        if online {
            chosen = e["status"].as_str().unwrap().to_string();
        }
        let view = if online && chosen != "invisible" {
            json!({"status": e["status"], "text": e["text"], "last_seen": null,
                "until": e["until"], "kinds": e["kinds"]})
        } else {
            let since = e["since"].as_i64().unwrap();
            let last_seen = if chosen == "invisible" && since > 0 {
                json!(since)
            } else {
                e["last_seen"].clone()
            };
            json!({"status": "offline", "text": null, "last_seen": last_seen,
                "until": null, "kinds": []})
        };
        let id = e["id"].as_str().unwrap().to_string();
        out.push((view, id, e["at"].as_i64().unwrap()));
    }
    out
}

/// Each watcher connection's frames about each user are, in order, views
/// of distinct events of the user in the feed, each made before the frame
/// was read; no two frames in a row alike.
fn watchers_saw_the_feed(seen: &[PresenceSeen], recorded: &Recorded) {
    let mut frames: BTreeMap<(&str, &str), Vec<&PresenceSeen>> = BTreeMap::new();
    for s in seen {
        frames.entry((&s.watcher, &s.user)).or_default().push(s);
    }
    let mut views: BTreeMap<&str, Vec<(Value, String, i64)>> = BTreeMap::new();
    for ((watcher, user), frames) in frames {
        let views = views
            .entry(user)
            .or_insert_with(|| views_of(&recorded.of(user)));
        let mut next = 0;
        let mut before: Option<Value> = None;
        for s in frames {
            let view = view_of_frame(&s.frame);
            assert_ne!(
                before.as_ref(),
                Some(&view),
                "{watcher}: {user} twice alike"
            );
            let Some(k) = views[next..]
                .iter()
                .position(|(v, _, at)| *v == view && *at <= s.at)
            else {
                let feed: Vec<String> =
                    views.iter().map(|(v, id, _)| format!("{id} {v}")).collect();
                panic!(
                    "{watcher} was shown {} (read at {}), no event of the feed after {}:\n{}",
                    s.frame,
                    s.at,
                    next.checked_sub(1)
                        .map_or("the start", |k| views[k].1.as_str()),
                    feed.join("\n")
                );
            };
            next += k + 1;
            before = Some(view);
        }
    }
}

/// Each member connection's `room_join` (first) and `room_leave` (last)
/// frames about each user in each room are, in order, distinct
/// `room_joined` and `room_left` events of the feed, each made before the
/// frame was read.
fn members_saw_the_feed(seen: &[RoomSeen], recorded: &Recorded) {
    let mut frames: BTreeMap<(&str, &str, &str), Vec<&RoomSeen>> = BTreeMap::new();
    for s in seen {
        frames
            .entry((&s.member, &s.room, &s.user))
            .or_default()
            .push(s);
    }
    for ((member, room, user), frames) in frames {
        let events: Vec<&Value> = recorded
            .of(&format!("r:{room}"))
            .into_iter()
            .filter(|e| e["user"] == user)
            .collect();
        let mut next = 0;
        for s in frames {
            let Some(k) = events[next..]
                .iter()
                .position(|e| e["type"] == s.kind && e["at"].as_i64().unwrap() <= s.at)
            else {
                let feed: Vec<String> = events.iter().map(|e| e.to_string()).collect();
                panic!(
                    "{member} was shown {} of {user} in {room} (read at {}), no event of \
                     the feed after the {next} first:\n{}",
                    s.kind,
                    s.at,
                    feed.join("\n")
                );
            };
            next += k + 1;
        }
    }
}
