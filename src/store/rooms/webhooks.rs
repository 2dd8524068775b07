//! The webhooks of the events a room step published: a user's first
//! device joining (and the room's first user) or its last leaving (and the
//! room's last user). Only the node that ran the step queues them, so each
//! is sent once per fleet.

use redis::Value;

use super::super::{now_ms, Store};
use crate::keys;
use crate::webhooks::{RoomKind, RoomWebhookEvent};

/// What the webhooks need of one published room event.
#[derive(serde::Deserialize, Clone)]
struct Emitted {
    e: String,
    room: String,
    user: String,
    seq: u64,
    users: u64,
    devices: u64,
    #[serde(default)]
    first: bool,
    #[serde(default)]
    last: bool,
    #[serde(default)]
    to: Option<String>,
}

/// The webhook events of one published room event: a user's first device
/// joining (and the room's first user) or its last leaving (and the last
/// user); nothing for a hidden member's own events.
fn room_webhooks(e: Emitted, at: i64) -> Vec<RoomWebhookEvent> {
    if e.to.as_deref() == Some("user") {
        return Vec::new();
    }
    let (kind, whole, happened) = match e.e.as_str() {
        "join" => (RoomKind::RoomJoined, RoomKind::RoomOccupied, e.first),
        "leave" => (RoomKind::RoomLeft, RoomKind::RoomVacated, e.last),
        _ => return Vec::new(),
    };
    if !happened {
        return Vec::new();
    }
    let event = |kind, id: String, user| RoomWebhookEvent {
        id,
        kind,
        at,
        room: e.room.clone(),
        user,
        users: e.users,
        devices: e.devices,
        seq: e.seq,
    };
    let mut out = vec![event(
        kind,
        format!("{}:{}", e.room, e.seq),
        Some(e.user.clone()),
    )];
    let edge = if kind == RoomKind::RoomJoined {
        e.users == 1
    } else {
        e.users == 0
    };
    if edge {
        let suffix = if kind == RoomKind::RoomJoined {
            "occupied"
        } else {
            "vacated"
        };
        out.push(event(whole, format!("{}:{}:{suffix}", e.room, e.seq), None));
    }
    out
}

impl Store {
    /// Queues the webhooks of the events a room step published (the last
    /// element of its reply).
    pub(super) fn announce(&self, emitted: Option<&Value>) {
        let Some(Value::Array(items)) = emitted else {
            return;
        };
        if self.feed.is_some() {
            // The step may have recorded in the room's feed: move it now.
            let room = items.iter().find_map(|item| match item {
                Value::BulkString(p) => serde_json::from_slice::<Emitted>(p)
                    .ok()
                    .filter(|e| !room_webhooks(e.clone(), 0).is_empty()),
                _ => None,
            });
            if let Some(e) = room {
                self.feed_recorded(&keys::room_feed(&e.room));
            }
        }
        let Some(webhooks) = &self.webhooks else {
            return;
        };
        let at = now_ms();
        for item in items {
            let Value::BulkString(payload) = item else {
                continue;
            };
            match serde_json::from_slice::<Emitted>(payload) {
                Ok(e) => {
                    // The member's user causes all of them (occupied and
                    // vacated too), and answers for them in the queue.
                    let by = e.user.clone();
                    for event in room_webhooks(e, at) {
                        webhooks.room(&event, &by);
                    }
                }
                Err(e) => log::warn!("webhook: unreadable room event ({e})"),
            }
        }
    }
}
