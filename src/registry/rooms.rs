//! Rooms in the registry: which local sessions are in which room, and the
//! node's subscription to a room's channel exactly while one of them is:
//! subscribed before the joining session's step runs, so that no event
//! falls between its `room` frame and the subscription; unsubscribed when
//! the last local member leaves.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;

use super::subscriptions::Channel;
use super::{Registry, SessionId};
use crate::keys;
use crate::rooms::events::{Kind, To};
use crate::rooms::{RoomDeliver, RoomEvent};

/// A session enters a room; answered once the node hears the room's
/// events.
#[derive(Message)]
#[rtype(result = "Result<(), String>")]
pub struct JoinRoom {
    /// The session.
    pub session: SessionId,
    /// The room.
    pub room: Arc<str>,
    /// Where its room events go.
    pub addr: Recipient<RoomDeliver>,
    /// Where a resync goes.
    pub resync: Recipient<RoomResync>,
}

/// A session is out of a room.
#[derive(Message)]
#[rtype(result = "()")]
pub struct LeaveRoom {
    /// The session.
    pub session: SessionId,
    /// The room.
    pub room: Arc<str>,
}

/// The room events missed while a subscription was down: the session
/// reads the room again and sends a fresh `room` frame.
#[derive(Message, Clone)]
#[rtype(result = "()")]
pub struct RoomResync {
    /// The room.
    pub room: Arc<str>,
}

/// Where one member session's room events and resyncs go.
type Member = (Recipient<RoomDeliver>, Recipient<RoomResync>);

/// A room above `--room-announce-max` users: its members get its counts,
/// at most every `--room-occupancy-ms`, instead of every join, leave and
/// update.
struct Large {
    /// The counts last heard.
    users: u64,
    /// Devices, likewise.
    devices: u64,
    /// The counts changed since the last `occupancy` frame.
    changed: bool,
    /// When the last `occupancy` frame went out.
    sent: Instant,
}

/// Which local sessions are in which room.
#[derive(Default)]
pub(super) struct RoomInterest {
    /// Most users of a room whose members get every event.
    announce_max: u64,
    /// Shortest time between two `occupancy` frames of a room.
    occupancy: Duration,
    /// The large rooms with local members.
    large: HashMap<Arc<str>, Large>,
    /// The local member sessions of each room, with where their events go
    /// and where a resync goes.
    members: HashMap<Arc<str>, HashMap<SessionId, Member>>,
    /// The rooms of each local session, so that a disconnect undoes all.
    of_session: HashMap<SessionId, HashSet<Arc<str>>>,
    /// The rooms whose channel the node holds.
    subscribed: HashSet<Arc<str>>,
}

impl RoomInterest {
    /// Rooms above `announce_max` users get `occupancy` frames at most
    /// every `occupancy`.
    pub(super) fn new(announce_max: u32, occupancy: Duration) -> Self {
        Self {
            announce_max: u64::from(announce_max),
            occupancy,
            ..Self::default()
        }
    }

    /// How often [`RoomInterest::flush`] should run.
    pub(super) fn tick(&self) -> Duration {
        (self.occupancy / 4).max(Duration::from_millis(25))
    }

    /// Removes `session` from `room`; the room's channel when it was the
    /// last local member, to unsubscribe.
    fn leave(&mut self, session: SessionId, room: &str) -> Option<String> {
        let sessions = self.members.get_mut(room)?;
        sessions.remove(&session);
        if let Some(rooms) = self.of_session.get_mut(&session) {
            rooms.remove(room);
            if rooms.is_empty() {
                self.of_session.remove(&session);
            }
        }
        if !sessions.is_empty() {
            return None;
        }
        self.members.remove(room);
        self.large.remove(room);
        self.subscribed
            .remove(room)
            .then(|| keys::room_events(room))
    }

    /// Removes a closed session from all its rooms; the channels to
    /// unsubscribe.
    pub(super) fn disconnect(&mut self, session: SessionId) -> Vec<String> {
        let rooms = self.of_session.remove(&session).unwrap_or_default();
        rooms
            .iter()
            .filter_map(|room| self.leave(session, room))
            .collect()
    }

    /// Hands `event` to the room's local members. In a large room a join,
    /// leave or update only moves its counts; crossing the threshold, in
    /// either direction, has every member read the room again, so that
    /// each ends with the full list (below) or the counts alone (above).
    pub(super) fn deliver(&mut self, event: RoomEvent) {
        crate::metrics::METRICS.rooms.events.inc();
        let Some(sessions) = self.members.get(&event.room) else {
            return;
        };
        // Signals and a hidden member's own events are not counts.
        if event.kind != Kind::Signal && event.to != To::User {
            let large_now = event.users > self.announce_max;
            match (self.large.get_mut(&event.room), large_now) {
                (Some(large), true) => {
                    large.users = event.users;
                    large.devices = event.devices;
                    large.changed = true;
                    return;
                }
                (None, false) => {}
                (was, _) => {
                    if was.is_some() {
                        self.large.remove(&event.room);
                    } else {
                        self.large.insert(
                            event.room.clone(),
                            Large {
                                users: event.users,
                                devices: event.devices,
                                changed: false,
                                sent: Instant::now(),
                            },
                        );
                    }
                    for (_, resync) in sessions.values() {
                        resync.do_send(RoomResync {
                            room: event.room.clone(),
                        });
                    }
                    return;
                }
            }
        }
        let event = Arc::new(event);
        for (deliver, _) in sessions.values() {
            deliver.do_send(RoomDeliver {
                event: event.clone(),
            });
        }
    }

    /// Sends each large room whose counts changed its `occupancy` frame,
    /// unless one went out within the interval.
    pub(super) fn flush(&mut self) {
        let now = Instant::now();
        for (room, large) in &mut self.large {
            if !large.changed || now.duration_since(large.sent) < self.occupancy {
                continue;
            }
            large.changed = false;
            large.sent = now;
            let Some(sessions) = self.members.get(room) else {
                continue;
            };
            let event = Arc::new(RoomEvent::occupancy(room, large.users, large.devices));
            for (deliver, _) in sessions.values() {
                deliver.do_send(RoomDeliver {
                    event: event.clone(),
                });
            }
        }
    }

    /// Tells every local member to read its rooms again (after the
    /// subscriptions were down, when events may have been missed).
    pub(super) fn resync(&self) {
        for (room, sessions) in &self.members {
            for (_, resync) in sessions.values() {
                resync.do_send(RoomResync { room: room.clone() });
            }
        }
    }

    /// Local rooms and memberships, for the metrics.
    pub(super) fn counts(&self) -> (usize, usize) {
        (
            self.members.len(),
            self.members.values().map(HashMap::len).sum(),
        )
    }
}

impl Handler<JoinRoom> for Registry {
    type Result = ResponseActFuture<Self, Result<(), String>>;

    fn handle(&mut self, join: JoinRoom, _: &mut Self::Context) -> Self::Result {
        let interest = &mut self.rooms;
        interest
            .members
            .entry(join.room.clone())
            .or_default()
            .insert(join.session, (join.addr, join.resync));
        interest
            .of_session
            .entry(join.session)
            .or_default()
            .insert(join.room.clone());
        let subscribe = (!interest.subscribed.contains(&join.room)).then(|| {
            let channel = Channel::Named(keys::room_events(&join.room));
            self.subscriptions.clone().map(|subs| (subs, channel))
        });
        let room = join.room;
        let wait = async move {
            match subscribe {
                None => Ok(()),
                Some(Some((subs, channel))) => subs
                    .subscribe(vec![channel])
                    .await
                    .map_err(|e| e.to_string()),
                Some(None) => Err("the event subscriptions are not running".to_string()),
            }
        };
        Box::pin(wait.into_actor(self).map(move |res, act, _| {
            if res.is_ok() {
                if act.rooms.members.contains_key(&room) {
                    act.rooms.subscribed.insert(room);
                } else if let Some(subs) = &act.subscriptions {
                    // Every local member left while the subscription was
                    // on its way: nobody else will take it back.
                    subs.unsubscribe(vec![Channel::Named(keys::room_events(&room))]);
                }
            }
            res
        }))
    }
}

impl Handler<LeaveRoom> for Registry {
    type Result = ();

    fn handle(&mut self, msg: LeaveRoom, _: &mut Self::Context) {
        if let Some(channel) = self.rooms.leave(msg.session, &msg.room) {
            if let Some(subs) = &self.subscriptions {
                subs.unsubscribe(vec![Channel::Named(channel)]);
            }
        }
    }
}
