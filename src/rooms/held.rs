//! The rooms one session is in, and what it told its client of each: the
//! room's clock as of the last `room` frame, so that an event the frame
//! already showed is not sent again, and the events that arrived before
//! that frame, held until it is out; and the device's own state changes
//! not written yet (at most one write per tick, the latest state wins).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use bytestring::ByteString;

use super::events::{batch_frame, Kind, RoomEvent, To};
use super::token::RoomTokens;
use crate::bucket::TokenBucket;

/// One room a session is in.
#[derive(Debug, Default)]
pub struct Held {
    /// This device's state, as the client last set it (JSON text).
    pub state: String,
    /// The room's clock as of the `room` frame sent; `None` until sent.
    pub seq: Option<u64>,
    /// Events that arrived before the `room` frame.
    pub pending: Vec<Arc<RoomEvent>>,
    /// A `room` frame went out once: the membership exists, and its
    /// deadline rides on the lease's refreshes.
    pub confirmed: bool,
    /// The room must be read again once its `room` frame is out (a resync
    /// came while that frame was on its way).
    pub resync: bool,
    /// The client joined with `"batch":true`: state updates come as one
    /// `room_updates` frame per tick.
    pub batch: bool,
    /// The room's clock as of the last `room` frame sent: a batched update
    /// it showed already is dropped (a batch's updates may be older than
    /// a join or leave delivered before it, but never older than this).
    pub framed: u64,
    /// [`Held::state`] changed since it was last written.
    pub unsent: bool,
    /// A write of the state is queued or timed: the next `room_state` frame
    /// only replaces the state it will write.
    pub armed: bool,
    /// The earliest time the next write of the state may start (one tick
    /// after the last one started).
    pub next_write: Option<Instant>,
}

/// The rooms of one session.
#[derive(Debug)]
pub struct Rooms {
    /// The rooms the device is in or joining, by id.
    pub joined: HashMap<Arc<str>, Held>,
    /// Room state and signal frames this device may send.
    pub messages: TokenBucket,
    /// The room tokens of its rooms under `--room-policy token` (boxed,
    /// made on first use: most rooms take none).
    pub tokens: Option<Box<RoomTokens>>,
}

impl Rooms {
    /// No rooms yet; `rate` room messages per second (bursts of twice that).
    pub fn new(rate: u32) -> Self {
        Self {
            joined: HashMap::new(),
            messages: TokenBucket::new_at(rate, rate.saturating_mul(2), Instant::now()),
            tokens: None,
        }
    }

    /// The rooms whose memberships ride on the lease's refreshes: those
    /// joined, not those whose first join is still on its way (their
    /// membership may not exist yet, and would look lost).
    pub fn names(&self) -> Vec<Arc<str>> {
        self.joined
            .iter()
            .filter(|(_, held)| held.confirmed)
            .map(|(room, _)| room.clone())
            .collect()
    }

    /// The frame to send for `event`, if any: none for this device's own
    /// events, for a room it is not in, or for what its `room` frame showed
    /// already; an event that comes before that frame waits for it.
    pub fn deliver(
        &mut self,
        event: Arc<RoomEvent>,
        user: &str,
        device: &str,
    ) -> Option<ByteString> {
        if event.user == user && event.device == device {
            return None;
        }
        let own = event.user == user;
        match event.to {
            To::User if !own => return None,
            To::Others if own => return None,
            _ => {}
        }
        let held = self.joined.get_mut(&event.room)?;
        if event.kind == Kind::Batch {
            return batched(held, event, user, device);
        }
        match (held.seq, event.seq) {
            (None, _) => {
                held.pending.push(event);
                None
            }
            (Some(shown), Some(seq)) if seq <= shown => None,
            (Some(_), seq) => {
                if seq.is_some() {
                    held.seq = seq;
                }
                Some(event.frame.clone())
            }
        }
    }

    /// The `room` frame of `room` went out showing its clock at `seq`: the
    /// events held for it, to deliver now (those it showed already are
    /// dropped as they are delivered).
    pub fn synced(&mut self, room: &str, seq: u64) -> Vec<Arc<RoomEvent>> {
        let Some(held) = self.joined.get_mut(room) else {
            return Vec::new();
        };
        held.seq = Some(seq);
        held.framed = seq;
        held.confirmed = true;
        std::mem::take(&mut held.pending)
    }

    /// The session's room tokens, made on first use (most sessions have
    /// none).
    pub fn tokens_mut(&mut self) -> &mut RoomTokens {
        self.tokens.get_or_insert_with(Box::default)
    }

    /// Forgets the token of a room the device is out of.
    pub fn drop_token(&mut self, room: &str) {
        if let Some(tokens) = &mut self.tokens {
            tokens.remove(room);
        }
    }
}

/// The `room_updates` frame of a batch for one member: the updates it
/// should see (not its own device's, not those its last `room` frame
/// showed); none when no update is left. Held like any event while the
/// room's `room` frame is on its way.
fn batched(held: &mut Held, event: Arc<RoomEvent>, user: &str, device: &str) -> Option<ByteString> {
    if held.seq.is_none() {
        held.pending.push(event);
        return None;
    }
    let framed = held.framed;
    let seen = |u: &&Arc<RoomEvent>| {
        let own = u.user == user;
        !(own && u.device == device)
            && match u.to {
                To::User => own,
                To::Others => !own,
                To::All => true,
            }
            && u.seq.is_some_and(|s| s > framed)
    };
    let mut updates = event.updates.iter().filter(seen).peekable();
    updates.peek()?;
    let frame = batch_frame(&event.room, updates.map(|u| u.entry.as_str()));
    held.seq = held.seq.max(event.seq);
    Some(ByteString::from(frame))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(user: &str, seq: Option<u64>) -> Arc<RoomEvent> {
        let payload = match seq {
            Some(s) => format!(
                r#"{{"e":"update","room":"r","user":"{user}","device":"d","seq":{s},"users":1,"devices":1,"state":{{}}}}"#
            ),
            None => format!(r#"{{"e":"signal","room":"r","user":"{user}","device":"d","data":1}}"#),
        };
        Arc::new(RoomEvent::parse("r", &payload).unwrap())
    }

    #[test]
    fn events_wait_for_the_room_frame_and_old_ones_are_dropped() {
        let mut rooms = Rooms::new(20);
        rooms.joined.insert(Arc::from("r"), Held::default());
        assert_eq!(rooms.deliver(event("bob", Some(4)), "me", "d"), None);
        assert_eq!(rooms.deliver(event("bob", Some(6)), "me", "d"), None);
        assert_eq!(rooms.deliver(event("bob", None), "me", "d"), None);
        // The room frame showed the room at 5: the event at 4 was in it.
        let sent: Vec<_> = rooms
            .synced("r", 5)
            .into_iter()
            .filter_map(|e| rooms.deliver(e, "me", "d"))
            .collect();
        assert_eq!(sent.len(), 2);
        assert!(sent[0].contains("room_update"));
        assert!(sent[1].contains("signal"));
        // Live now; the clock moved to 6.
        assert_eq!(rooms.deliver(event("bob", Some(6)), "me", "d"), None);
        assert!(rooms.deliver(event("bob", Some(7)), "me", "d").is_some());
        // Its own events never come back to a device.
        assert_eq!(rooms.deliver(event("me", Some(8)), "me", "d"), None);
        // Another device of the same user gets them.
        assert!(rooms.deliver(event("me", Some(9)), "me", "other").is_some());
        assert!(rooms.deliver(event("bob", Some(10)), "me", "d").is_some());
        let mut elsewhere = Rooms::new(20);
        assert_eq!(elsewhere.deliver(event("bob", Some(1)), "me", "d"), None);
    }

    #[test]
    fn a_batch_leaves_out_the_own_device_and_what_the_room_frame_showed() {
        let mut rooms = Rooms::new(20);
        rooms.joined.insert(Arc::from("r"), Held::default());
        let update = |user: &str, seq: u64| {
            let payload = format!(
                r#"{{"e":"update","room":"r","user":"{user}","device":"d","seq":{seq},"users":1,"devices":1,"state":{{"s":{seq}}}}}"#
            );
            Arc::new(RoomEvent::parse("r", &payload).unwrap())
        };
        let room: Arc<str> = Arc::from("r");
        let batch = |u: Vec<Arc<RoomEvent>>| Arc::new(RoomEvent::batch(&room, u));
        // Held until the room frame (at 5) is out.
        let first = batch(vec![update("bob", 4), update("carol", 6), update("me", 7)]);
        assert_eq!(rooms.deliver(first, "me", "d"), None);
        let sent: Vec<_> = rooms
            .synced("r", 5)
            .into_iter()
            .filter_map(|e| rooms.deliver(e, "me", "d"))
            .collect();
        assert_eq!(
            &*sent[0],
            r#"{"type":"room_updates","room":"r","updates":[{"user":"carol","device":"d","state":{"s":6}}]}"#
        );
        // A batch older than a join delivered since still goes: only the
        // room frame's clock drops updates.
        rooms.joined.get_mut("r").unwrap().seq = Some(20);
        assert!(rooms
            .deliver(batch(vec![update("bob", 9)]), "me", "d")
            .is_some());
        // Nothing left for this device: no frame.
        assert_eq!(
            rooms.deliver(batch(vec![update("me", 21)]), "me", "d"),
            None
        );
    }
}
