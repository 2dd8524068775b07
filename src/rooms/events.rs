//! Room events: what the room steps publish on a room's channel (one JSON
//! object each, `e` naming the kind), and the frames a member gets.
//!
//! Server frames (to every member device of the room but the one that
//! caused the event, the causing user's other devices included):
//! - `{"type":"room","room":..,"users":N,"devices":M,"members":[..]}`, the
//!   answer to a join: members sorted by user, each with its devices.
//! - `{"type":"room_join","room":..,"user":..,"device":..,"state":{..},"joined_at":..,"first":true}`
//! - `{"type":"room_leave","room":..,"user":..,"device":..,"last":true}`
//! - `{"type":"room_update","room":..,"user":..,"device":..,"state":{..}}`
//! - `{"type":"signal","room":..,"user":..,"device":..,"data":..}`
//! - `{"type":"room_updates","room":..,"updates":[{"user":..,"device":..,"state":{..}},..]}`,
//!   for a member that joined with `"batch":true`: every state that
//!   changed since its last one, at most one per device, once per tick.

use std::sync::Arc;

use actix::Message;
use bytestring::ByteString;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::protocol::{self, Tagged};
use crate::store::rooms::{RoomMember, RoomSnapshot};

/// The kind of a room event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// A device joined.
    Join,
    /// A device left (or its membership lapsed).
    Leave,
    /// A device replaced its state.
    Update,
    /// A device relayed a signal.
    Signal,
    /// A large room's counts (made by the node, never published).
    Occupancy,
    /// A `room` frame read once by the node for all its members (made by
    /// the node, never published): the room switched mode, or events were
    /// missed.
    Room,
    /// The room's state updates of one tick, for its batched members (made
    /// by the node, never published).
    Batch,
}

/// Which member devices an event is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum To {
    /// Every member device but the one that caused it.
    #[default]
    All,
    /// Only the devices of the user it is about: a hidden (invisible)
    /// member's events.
    User,
    /// Every member device but those of the user it is about: a member
    /// turning invisible or visible again, which its own devices saw all
    /// along.
    Others,
}

/// A room event as published.
#[derive(Debug, Deserialize)]
struct Wire<'a> {
    /// Its kind.
    e: Kind,
    /// The room.
    room: String,
    /// The member's user.
    user: String,
    /// The member's device.
    device: String,
    /// The room's event clock after the step (not on signals).
    #[serde(default)]
    seq: Option<u64>,
    /// Users in the room after the step.
    #[serde(default)]
    users: Option<u64>,
    /// Devices in the room after the step.
    #[serde(default)]
    devices: Option<u64>,
    /// The member's state (joins and updates).
    #[serde(default, borrow)]
    state: Option<&'a RawValue>,
    /// When the member joined, epoch ms (joins).
    #[serde(default)]
    joined_at: Option<i64>,
    /// The user's first device in the room (joins).
    #[serde(default)]
    first: Option<bool>,
    /// The user's last device in the room (leaves).
    #[serde(default)]
    last: Option<bool>,
    /// A signal's data.
    #[serde(default, borrow)]
    data: Option<&'a RawValue>,
    /// Who it is for.
    #[serde(default)]
    to: To,
    /// The room is in counts mode after the step.
    #[serde(default)]
    large: bool,
    /// The step switched the room's mode.
    #[serde(default)]
    switched: bool,
    /// A leave the app's backend made (`DELETE /api/rooms/{room}/members/{user}`).
    #[serde(default)]
    removed: bool,
}

/// One room event, parsed once per node and shared by the local members.
#[derive(Debug)]
pub struct RoomEvent {
    /// The room.
    pub room: Arc<str>,
    /// Its kind.
    pub kind: Kind,
    /// Which member devices it is for.
    pub to: To,
    /// The member it is about.
    pub user: String,
    /// Its device.
    pub device: String,
    /// The room's event clock after it; `None` for signals, which are not
    /// ordered against the room frame.
    pub seq: Option<u64>,
    /// The room's counts after it (0 for signals).
    pub users: u64,
    /// Devices, likewise.
    pub devices: u64,
    /// The room is in counts mode after it.
    pub large: bool,
    /// It switched the room's mode (to counts when `large`, else back to
    /// the list).
    pub switched: bool,
    /// A leave the app's backend made: the device it names is out of the
    /// room, and its own session drops it.
    pub removed: bool,
    /// For a [`Kind::Room`] event with a list, the room as read, so that
    /// a member whose own entry differs can make its own frame.
    pub snapshot: Option<Arc<RoomSnapshot>>,
    /// The frame a member gets, serialized once.
    pub frame: ByteString,
    /// For an update, its entry in a `room_updates` frame
    /// (`{"user":..,"device":..,"state":..}`), serialized once; empty
    /// otherwise.
    pub entry: String,
    /// For a [`Kind::Batch`] event, the updates of its tick, at most one
    /// per device, each of a newer state than the last one sent.
    pub updates: Vec<Arc<RoomEvent>>,
}

/// What a node-made `room` frame shows.
pub enum RoomView {
    /// The room as read.
    Read(Arc<RoomSnapshot>),
    /// Only its counts (it is in counts mode).
    Counts {
        /// Users.
        users: u64,
        /// Devices.
        devices: u64,
    },
}

/// A room event for one local member session.
#[derive(Message, Clone)]
#[rtype(result = "()")]
pub struct RoomDeliver {
    /// The event.
    pub event: Arc<RoomEvent>,
}

/// The fields every event frame carries.
#[derive(Serialize)]
struct EventBody<'a> {
    room: &'a str,
    user: &'a str,
    device: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    state: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    joined_at: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    first: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    last: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    data: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    removed: bool,
}

fn to_json<T: Serialize>(kind: &'static str, body: &T) -> String {
    protocol::to_json(&Tagged { kind, body })
}

/// An empty object, for a state that does not parse (Redis holds only
/// what the steps wrote, which was checked JSON).
fn empty_object() -> &'static RawValue {
    static EMPTY: std::sync::LazyLock<Box<RawValue>> =
        std::sync::LazyLock::new(|| RawValue::from_string("{}".to_string()).expect("{} is JSON"));
    &EMPTY
}

/// One update in a `room_updates` frame.
#[derive(Serialize)]
struct UpdateEntry<'a> {
    user: &'a str,
    device: &'a str,
    state: &'a RawValue,
}

/// A `room_updates` frame of `room` made of `entries` (each an update's
/// [`RoomEvent::entry`]).
pub fn batch_frame<'a>(room: &str, entries: impl Iterator<Item = &'a str>) -> String {
    let mut frame = String::with_capacity(64 + room.len());
    frame.push_str(r#"{"type":"room_updates","room":"#);
    frame.push_str(&protocol::to_json(&room));
    frame.push_str(r#","updates":["#);
    for (i, entry) in entries.enumerate() {
        if i > 0 {
            frame.push(',');
        }
        frame.push_str(entry);
    }
    frame.push_str("]}");
    frame
}

/// The `occupancy` frame's body.
#[derive(Serialize)]
struct OccupancyBody<'a> {
    room: &'a str,
    users: u64,
    devices: u64,
}

/// The `occupancy` frame: a large room's counts.
pub fn occupancy_frame(room: &str, users: u64, devices: u64) -> String {
    to_json(
        "occupancy",
        &OccupancyBody {
            room,
            users,
            devices,
        },
    )
}

impl RoomEvent {
    /// A large room's counts, for its local members.
    pub fn occupancy(room: &Arc<str>, users: u64, devices: u64) -> Self {
        Self {
            room: room.clone(),
            kind: Kind::Occupancy,
            to: To::All,
            user: String::new(),
            device: String::new(),
            seq: None,
            users,
            devices,
            large: true,
            switched: false,
            removed: false,
            snapshot: None,
            frame: ByteString::from(occupancy_frame(room, users, devices)),
            entry: String::new(),
            updates: Vec::new(),
        }
    }

    /// A `room` frame the node made once for all its members of `room`:
    /// the room as read (`snapshot`, read for nobody in particular), or
    /// only its counts at `seq` (the room went to counts mode: no read).
    pub fn room(room: &Arc<str>, seq: u64, view: RoomView) -> Self {
        let (users, devices, snapshot, frame) = match view {
            RoomView::Read(snapshot) => {
                let frame = room_frame(room, &snapshot);
                (snapshot.users, snapshot.devices, Some(snapshot), frame)
            }
            RoomView::Counts { users, devices } => {
                let counts = RoomSnapshot {
                    seq,
                    users,
                    devices,
                    members: None,
                    hidden: Vec::new(),
                };
                (users, devices, None, room_frame(room, &counts))
            }
        };
        Self {
            room: room.clone(),
            kind: Kind::Room,
            to: To::All,
            user: String::new(),
            device: String::new(),
            seq: Some(seq),
            users,
            devices,
            large: snapshot.as_ref().is_none_or(|s| s.members.is_none()),
            switched: false,
            removed: false,
            snapshot,
            frame: ByteString::from(frame),
            entry: String::new(),
            updates: Vec::new(),
        }
    }

    /// The state updates of one tick in `room`, for its batched members;
    /// each member's `room_updates` frame is made of their entries
    /// ([`batch_frame`]).
    pub fn batch(room: &Arc<str>, updates: Vec<Arc<RoomEvent>>) -> Self {
        Self {
            room: room.clone(),
            kind: Kind::Batch,
            to: To::All,
            user: String::new(),
            device: String::new(),
            seq: updates.iter().filter_map(|u| u.seq).max(),
            users: 0,
            devices: 0,
            large: false,
            switched: false,
            removed: false,
            snapshot: None,
            frame: ByteString::new(),
            entry: String::new(),
            updates,
        }
    }

    /// Parses a payload of `channel_room`'s channel; `None` (logged) for
    /// one that is not a room event of that room.
    pub fn parse(channel_room: &str, payload: &str) -> Option<Self> {
        let wire: Wire = match serde_json::from_str(payload) {
            Ok(w) => w,
            Err(e) => {
                log::warn!("ignoring a malformed room event ({e}): {payload}");
                return None;
            }
        };
        if wire.room != channel_room {
            log::warn!(
                "ignoring an event of room {} on {channel_room}'s channel",
                wire.room
            );
            return None;
        }
        let (kind, first, last, state, data) = match wire.e {
            Kind::Join => ("room_join", wire.first, None, wire.state, None),
            Kind::Leave => ("room_leave", None, wire.last, None, None),
            Kind::Update => ("room_update", None, None, wire.state, None),
            Kind::Signal => ("signal", None, None, None, wire.data),
            Kind::Occupancy | Kind::Room | Kind::Batch => {
                log::warn!("ignoring a published node-made event on {channel_room}'s channel");
                return None;
            }
        };
        let state = match (wire.e, state) {
            (Kind::Join | Kind::Update, None) => Some(empty_object()),
            (_, state) => state,
        };
        let frame = to_json(
            kind,
            &EventBody {
                room: &wire.room,
                user: &wire.user,
                device: &wire.device,
                state,
                joined_at: wire.joined_at.filter(|_| wire.e == Kind::Join),
                first: first.or((wire.e == Kind::Join).then_some(false)),
                last: last.or((wire.e == Kind::Leave).then_some(false)),
                data,
                removed: wire.removed && wire.e == Kind::Leave,
            },
        );
        let entry = match wire.e {
            Kind::Update => protocol::to_json(&UpdateEntry {
                user: &wire.user,
                device: &wire.device,
                state: match state {
                    Some(state) => state,
                    None => empty_object(),
                },
            }),
            _ => String::new(),
        };
        Some(Self {
            entry,
            updates: Vec::new(),
            room: Arc::from(wire.room.as_str()),
            kind: wire.e,
            to: wire.to,
            user: wire.user,
            device: wire.device,
            seq: wire.seq,
            users: wire.users.unwrap_or(0),
            devices: wire.devices.unwrap_or(0),
            large: wire.large,
            switched: wire.switched,
            removed: wire.removed && wire.e == Kind::Leave,
            snapshot: None,
            frame: ByteString::from(frame),
        })
    }
}

/// One device of a member, as a `room` frame lists it.
#[derive(Serialize)]
struct DeviceBody<'a> {
    device: &'a str,
    state: &'a RawValue,
    joined_at: i64,
}

/// One user of a room, with its devices.
#[derive(Serialize)]
struct MemberBody<'a> {
    user: &'a str,
    devices: Vec<DeviceBody<'a>>,
}

/// The `room` frame's body.
#[derive(Serialize)]
struct RoomBody<'a> {
    room: &'a str,
    users: u64,
    devices: u64,
    members: Option<Vec<MemberBody<'a>>>,
}

/// The members of a snapshot grouped by user (the snapshot is sorted by
/// user and device).
fn grouped<'a>(members: &'a [RoomMember], states: &'a [Box<RawValue>]) -> Vec<MemberBody<'a>> {
    let mut out: Vec<MemberBody> = Vec::new();
    for (m, state) in members.iter().zip(states) {
        let device = DeviceBody {
            device: &m.device,
            state,
            joined_at: m.joined_at,
        };
        match out.last_mut() {
            Some(last) if last.user == m.user => last.devices.push(device),
            _ => out.push(MemberBody {
                user: &m.user,
                devices: vec![device],
            }),
        }
    }
    out
}

/// The `room` frame for `snapshot` of `room`, as its reader sees it: the
/// reader's own hidden members are in it and in its counts.
pub fn room_frame(room: &str, snapshot: &RoomSnapshot) -> String {
    let mut users = snapshot.users;
    let mut listed = snapshot.members.clone();
    if let Some(own) = snapshot.hidden.first() {
        let visible = |m: &RoomMember| m.user == own.user;
        if !snapshot.members.iter().flatten().any(visible) {
            users += 1;
        }
        if let Some(members) = &mut listed {
            members.extend(snapshot.hidden.iter().cloned());
            members.sort_unstable_by(|a, b| (&a.user, &a.device).cmp(&(&b.user, &b.device)));
        }
    }
    let devices = snapshot.devices + snapshot.hidden.len() as u64;
    let states: Vec<Box<RawValue>> = listed
        .iter()
        .flatten()
        .map(|m| {
            RawValue::from_string(m.state.clone()).unwrap_or_else(|_| {
                log::warn!(
                    "room {room}: {}/{} has a state that is not JSON",
                    m.user,
                    m.device
                );
                empty_object().to_owned()
            })
        })
        .collect();
    to_json(
        "room",
        &RoomBody {
            room,
            users,
            devices,
            members: listed.as_deref().map(|m| grouped(m, &states)),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_become_frames() {
        let join = RoomEvent::parse(
            "doc:42",
            r#"{"e":"join","room":"doc:42","user":"bob","device":"laptop","seq":3,"users":2,"devices":3,"state":{"page":1},"joined_at":5,"first":true}"#,
        )
        .unwrap();
        assert_eq!(join.seq, Some(3));
        assert_eq!(
            &*join.frame,
            r#"{"type":"room_join","room":"doc:42","user":"bob","device":"laptop","state":{"page":1},"joined_at":5,"first":true}"#
        );
        let leave = RoomEvent::parse(
            "doc:42",
            r#"{"e":"leave","room":"doc:42","user":"bob","device":"laptop","seq":4,"users":1,"devices":1,"last":false}"#,
        )
        .unwrap();
        assert_eq!(
            &*leave.frame,
            r#"{"type":"room_leave","room":"doc:42","user":"bob","device":"laptop","last":false}"#
        );
        let signal = RoomEvent::parse(
            "doc:42",
            r#"{"e":"signal","room":"doc:42","user":"bob","device":"laptop","data":{"typing":true}}"#,
        )
        .unwrap();
        assert_eq!(signal.seq, None);
        assert_eq!(
            &*signal.frame,
            r#"{"type":"signal","room":"doc:42","user":"bob","device":"laptop","data":{"typing":true}}"#
        );
        assert!(RoomEvent::parse(
            "doc:43",
            r#"{"e":"leave","room":"doc:42","user":"b","device":"l"}"#
        )
        .is_none());
        assert!(RoomEvent::parse("doc:42", "not json").is_none());
    }

    #[test]
    fn room_frames_group_devices_by_user() {
        let member = |user: &str, device: &str, state: &str| RoomMember {
            user: user.into(),
            device: device.into(),
            state: state.into(),
            joined_at: 7,
        };
        let snapshot = RoomSnapshot {
            seq: 9,
            users: 2,
            devices: 3,
            members: Some(vec![
                member("alice", "phone", "{}"),
                member("bob", "laptop", r#"{"page":2}"#),
                member("bob", "phone", "{}"),
            ]),
            hidden: Vec::new(),
        };
        assert_eq!(
            room_frame("doc:42", &snapshot),
            r#"{"type":"room","room":"doc:42","users":2,"devices":3,"members":[{"user":"alice","devices":[{"device":"phone","state":{},"joined_at":7}]},{"user":"bob","devices":[{"device":"laptop","state":{"page":2},"joined_at":7},{"device":"phone","state":{},"joined_at":7}]}]}"#
        );
        let large = RoomSnapshot {
            members: None,
            ..snapshot.clone()
        };
        assert_eq!(
            room_frame("doc:42", &large),
            r#"{"type":"room","room":"doc:42","users":2,"devices":3,"members":null}"#
        );
        // A hidden reader sees itself, in the list and the counts.
        let own = RoomSnapshot {
            hidden: vec![member("carol", "tab", "{}")],
            ..snapshot
        };
        let frame: serde_json::Value = serde_json::from_str(&room_frame("doc:42", &own)).unwrap();
        assert_eq!(
            (frame["users"].as_u64(), frame["devices"].as_u64()),
            (Some(3), Some(4))
        );
        assert_eq!(frame["members"][2]["user"], "carol");
    }
}
