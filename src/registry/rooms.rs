//! Rooms in the registry: which local sessions are in which room, the
//! node's subscription to a room's channel exactly while one of them is
//! (subscribed before the joining session's step runs, so that no event
//! falls between its `room` frame and the subscription; unsubscribed when
//! the last local member leaves), and what the members are shown.
//!
//! A room is listed (every join, leave and update goes to every member)
//! or in counts mode (`occupancy` frames, at most every
//! `--room-occupancy-ms`, and only when the counts changed); the room
//! steps decide which in Redis and mark the event that switched it, so
//! every node agrees. Going to counts needs no read: the members get a
//! `room` frame of the counts. Coming back to the list, or having missed
//! events, needs the list again: the node reads the room once for all its
//! members (at most once per room every `--room-occupancy-ms`) and shares
//! the frame, holding the room's events until it is out.
//!
//! State updates go at once to the members that did not ask for batches;
//! for those that did (`"batch":true` on `join`), the room keeps the
//! latest update of each device, and every tick (`--room-state-hz`) sends
//! them all in one `room_updates` frame. A join or leave of a device drops
//! its pending update: the join carries a newer state, and no update may
//! follow a leave.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;

use super::fanout::Inbound;
use super::subscriptions::Channel;
use super::{Registry, SessionId};
use crate::keys;
use crate::rooms::events::{Kind, RoomView, To};
use crate::rooms::{RoomDeliver, RoomEvent};
use crate::store::StoreResult;

/// A session enters a room; answered once the node hears the room's
/// events.
#[derive(Message)]
#[rtype(result = "Result<(), String>")]
pub struct JoinRoom {
    /// The session.
    pub session: SessionId,
    /// The room.
    pub room: Arc<str>,
    /// Its member, `<user>:<device>`. Its room events go through its
    /// worker's delivery lists ([`super::fanout`]).
    pub member: Arc<str>,
    /// Its client asked for state updates in batches, once per tick.
    pub batch: bool,
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

/// The session must read the room itself and send a fresh `room` frame:
/// its own view differs from the node's shared one (its user is hidden).
#[derive(Message, Clone)]
#[rtype(result = "()")]
pub struct RoomResync {
    /// The room.
    pub room: Arc<str>,
}

/// One member session's `<user>:<device>`.
type Member = Arc<str>;

/// The counts of a room in counts mode.
#[derive(Debug, Clone, Copy)]
struct Counts {
    /// Users last heard.
    users: u64,
    /// Devices, likewise.
    devices: u64,
    /// The counts the last `occupancy` (or `room`) frame showed.
    shown: (u64, u64),
    /// When the last `occupancy` frame went out.
    sent: Instant,
}

impl Counts {
    fn new(users: u64, devices: u64) -> Self {
        Self {
            users,
            devices,
            shown: (users, devices),
            sent: Instant::now(),
        }
    }
}

/// What the node's members of a room are shown.
enum View {
    /// Every event.
    Listed,
    /// `occupancy` frames.
    Counts(Counts),
    /// The list is to be read again at `at` (not sooner than a read's
    /// interval after the last); counts meanwhile.
    ReadAt {
        /// When.
        at: Instant,
        /// The counts meanwhile.
        counts: Counts,
    },
    /// The shared read is on its way; the room's events wait for it.
    Reading {
        /// The events, in order.
        held: Vec<Arc<RoomEvent>>,
    },
}

/// One room with local members.
struct Room {
    /// The local member sessions, with where their events go and where a
    /// resync goes.
    members: HashMap<SessionId, Member>,
    /// The node holds the room's channel.
    subscribed: bool,
    /// What the members are shown.
    view: View,
    /// When the node last read the room for its members.
    last_read: Option<Instant>,
    /// The local members that are hidden (their user is invisible), as
    /// the room's events tell: not counted in the public series.
    hidden: HashSet<Arc<str>>,
    /// The local members that get state updates in batches.
    batched: HashSet<SessionId>,
    /// The updates of this tick for the batched members: the latest of
    /// each device, in the order the devices first changed.
    batch: Vec<Arc<RoomEvent>>,
}

impl Room {
    /// Keeps [`Room::hidden`] as `event` says: a hidden member's own
    /// events, and a member going hidden (a leave for the others alone),
    /// mark it; any other event about it unmarks it.
    fn track_hidden(&mut self, event: &RoomEvent) {
        let is = |m: &str| {
            m.strip_prefix(event.user.as_str())
                .and_then(|rest| rest.strip_prefix(':'))
                == Some(event.device.as_str())
        };
        let hidden = match (event.kind, event.to) {
            (Kind::Signal | Kind::Occupancy | Kind::Room, _) => return,
            (Kind::Join | Kind::Update, To::User) | (Kind::Leave, To::Others) => true,
            _ => false,
        };
        if hidden {
            let local = self.members.values().find(|m| is(m));
            if let Some(member) = local {
                self.hidden.insert(member.clone());
            }
        } else if !self.hidden.is_empty() {
            self.hidden.retain(|m| !is(m));
        }
    }
}

/// Most events a room holds while its shared read is on its way; past it
/// they are dropped, and the read (newer than all of them) shows where
/// they led.
const MAX_HELD: usize = 10_000;

/// Which local sessions are in which room.
#[derive(Default)]
pub(super) struct RoomInterest {
    /// Shortest time between two `occupancy` frames of a room, and
    /// between two shared reads of it.
    occupancy: Duration,
    /// Time between two batches of a room's state updates.
    state_tick: Duration,
    /// The rooms with local members.
    rooms: HashMap<Arc<str>, Room>,
    /// The rooms of each local session, so that a disconnect undoes all.
    of_session: HashMap<SessionId, HashSet<Arc<str>>>,
    /// Rooms whose shared read should start now.
    to_read: Vec<Arc<str>>,
    /// Events to hand to local members, each with its sessions: the
    /// registry sends them through the workers' delivery lists
    /// ([`RoomInterest::take_outbox`]).
    outbox: Outbox,
    /// Rooms with updates waiting for the next tick's batch.
    to_batch: HashSet<Arc<str>>,
}

impl RoomInterest {
    /// Rooms in counts mode get `occupancy` frames at most every
    /// `occupancy`, and are read again at most that often; batched members
    /// get a room's state updates every `state_tick`.
    pub(super) fn new(occupancy: Duration, state_tick: Duration) -> Self {
        Self {
            occupancy,
            state_tick,
            ..Self::default()
        }
    }

    /// How often [`RoomInterest::flush_batches`] should run.
    pub(super) fn state_tick(&self) -> Duration {
        if self.state_tick.is_zero() {
            crate::config::RoomLimits::default().state_tick()
        } else {
            self.state_tick
        }
    }

    /// How often [`RoomInterest::flush`] should run.
    pub(super) fn tick(&self) -> Duration {
        (self.occupancy / 4).max(Duration::from_millis(25))
    }

    /// Removes `session` from `room`; the room's channel when it was the
    /// last local member, to unsubscribe.
    fn leave(&mut self, session: SessionId, room: &str) -> Option<String> {
        let local = self.rooms.get_mut(room)?;
        if let Some(member) = local.members.remove(&session) {
            local.hidden.remove(&member);
        }
        local.batched.remove(&session);
        if let Some(rooms) = self.of_session.get_mut(&session) {
            rooms.remove(room);
            if rooms.is_empty() {
                self.of_session.remove(&session);
            }
        }
        if !local.members.is_empty() {
            return None;
        }
        let local = self.rooms.remove(room)?;
        local.subscribed.then(|| keys::room_events(room))
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

    /// Hands `event` to the room's local members, as the room's view
    /// wants: every event while listed; in counts mode only its counts
    /// (and signals, and a hidden member's own events); held while the
    /// room is read.
    pub(super) fn deliver(&mut self, event: Arc<RoomEvent>) {
        let occupancy = self.occupancy;
        let Some(local) = self.rooms.get_mut(&event.room) else {
            return;
        };
        local.track_hidden(&event);
        if let View::Reading { held } = &mut local.view {
            if held.len() < MAX_HELD {
                held.push(event);
            }
            return;
        }
        if event.kind != Kind::Signal {
            match (&mut local.view, event.large) {
                (View::Listed, false) => {}
                (View::Listed, true) => {
                    let counts = Counts::new(event.users, event.devices);
                    local.view = View::Counts(counts);
                    if event.switched {
                        // To counts: the counts are all the members need.
                        if let Some(seq) = event.seq {
                            let view = RoomView::Counts {
                                users: event.users,
                                devices: event.devices,
                            };
                            let event = Arc::new(RoomEvent::room(&event.room, seq, view));
                            send(&mut self.outbox, local, &event);
                        }
                        return;
                    }
                }
                (View::Counts(counts) | View::ReadAt { counts, .. }, true) => {
                    counts.users = event.users;
                    counts.devices = event.devices;
                }
                (View::Counts(counts), false) => {
                    if event.switched {
                        // Back to the list: read once for every member,
                        // not sooner than the interval after the last.
                        let at = local.last_read.map_or_else(Instant::now, |t| t + occupancy);
                        counts.users = event.users;
                        counts.devices = event.devices;
                        local.view = View::ReadAt {
                            at,
                            counts: *counts,
                        };
                    } else {
                        local.view = View::Listed;
                    }
                }
                (View::ReadAt { counts, .. }, false) => {
                    counts.users = event.users;
                    counts.devices = event.devices;
                }
                (View::Reading { .. }, _) => unreachable!("held above"),
            }
            if !matches!(local.view, View::Listed) && event.to != To::User {
                return;
            }
        }
        if send(&mut self.outbox, local, &event) {
            self.to_batch.insert(event.room.clone());
        }
    }

    /// Sends each room in counts mode whose counts changed its `occupancy`
    /// frame, unless one went out within the interval; and queues the
    /// shared reads that are due.
    pub(super) fn flush(&mut self) {
        let now = Instant::now();
        for (room, local) in &mut self.rooms {
            let counts = match &mut local.view {
                View::ReadAt { at, .. } if *at <= now => {
                    self.to_read.push(room.clone());
                    continue;
                }
                View::Counts(counts) | View::ReadAt { counts, .. } => counts,
                _ => continue,
            };
            let current = (counts.users, counts.devices);
            if current == counts.shown || now.duration_since(counts.sent) < self.occupancy {
                continue;
            }
            counts.shown = current;
            counts.sent = now;
            let event = Arc::new(RoomEvent::occupancy(room, current.0, current.1));
            send(&mut self.outbox, local, &event);
        }
    }

    /// Queues every room's pending updates for its batched members: once
    /// per tick (`--room-state-hz`).
    pub(super) fn flush_batches(&mut self) {
        for room in self.to_batch.drain() {
            if let Some(local) = self.rooms.get_mut(&room) {
                send_batch(&mut self.outbox, &room, local);
            }
        }
    }

    /// Every room is to be read again (after the subscriptions were down,
    /// when events may have been missed).
    pub(super) fn resync(&mut self) {
        let now = Instant::now();
        for local in self.rooms.values_mut() {
            let counts = match &local.view {
                View::Counts(counts) | View::ReadAt { counts, .. } => *counts,
                _ => Counts::new(0, 0),
            };
            if !matches!(local.view, View::Reading { .. }) {
                local.view = View::ReadAt { at: now, counts };
            }
        }
        self.flush();
    }

    /// The events queued for local members since the last call, each with
    /// its sessions.
    pub(super) fn take_outbox(&mut self) -> Outbox {
        std::mem::take(&mut self.outbox)
    }

    /// Whether `session` is in a room here.
    pub(super) fn has_member(&self, session: SessionId) -> bool {
        self.of_session.contains_key(&session)
    }

    /// The rooms whose shared read starts now; each holds its events from
    /// here on.
    pub(super) fn take_reads(&mut self) -> Vec<Arc<str>> {
        let rooms = std::mem::take(&mut self.to_read);
        let now = Instant::now();
        rooms
            .into_iter()
            .filter(|room| match self.rooms.get_mut(room) {
                Some(local) if !matches!(local.view, View::Reading { .. }) => {
                    local.view = View::Reading { held: Vec::new() };
                    local.last_read = Some(now);
                    true
                }
                _ => false,
            })
            .collect()
    }

    /// The shared read of `room` is back: the frame goes to every local
    /// member (a member whose own view differs makes its own), then the
    /// events held meanwhile.
    fn read_done(&mut self, room: &Arc<str>, read: StoreResult<crate::store::rooms::RoomSnapshot>) {
        let Some(local) = self.rooms.get_mut(room) else {
            return;
        };
        let held = match std::mem::replace(&mut local.view, View::Listed) {
            View::Reading { held } => held,
            other => {
                local.view = other;
                return;
            }
        };
        match read {
            Ok(snapshot) => {
                crate::metrics::METRICS.rooms.shared_reads.inc();
                local.view = match snapshot.members {
                    Some(_) => View::Listed,
                    None => View::Counts(Counts::new(snapshot.users, snapshot.devices)),
                };
                let seq = snapshot.seq;
                let frame = RoomEvent::room(room, seq, RoomView::Read(Arc::new(snapshot)));
                send(&mut self.outbox, local, &Arc::new(frame));
            }
            Err(e) => {
                // Tried again after the interval; the members keep what
                // they have, and the held events follow it.
                log::warn!("room {room}: shared read failed ({e}); trying again");
                local.view = View::ReadAt {
                    at: Instant::now() + self.occupancy,
                    counts: Counts::new(0, 0),
                };
            }
        }
        for event in held {
            self.deliver(event);
        }
    }

    /// Local rooms and memberships, for the metrics: the hidden ones are
    /// nobody's business, on a public `/metrics` too.
    pub(super) fn counts(&self) -> (usize, usize) {
        let visible = |r: &Room| r.members.len() - r.hidden.len();
        (
            self.rooms.values().filter(|r| visible(r) > 0).count(),
            self.rooms.values().map(visible).sum(),
        )
    }
}

/// Events for local members, each with its sessions.
type Outbox = Vec<(Arc<RoomEvent>, Vec<SessionId>)>;

/// Queues `event` for every local member of the room; a state update goes
/// into the tick's batch for the batched members instead (the latest of
/// each device wins), and a join or leave drops its device's pending one.
/// True when the room's batch was empty and is not any more.
fn send(outbox: &mut Outbox, local: &mut Room, event: &Arc<RoomEvent>) -> bool {
    let same = |e: &Arc<RoomEvent>| e.device == event.device && e.user == event.user;
    let batching = event.kind == Kind::Update && !local.batched.is_empty();
    match event.kind {
        Kind::Join | Kind::Leave => local.batch.retain(|e| !same(e)),
        Kind::Room => local.batch.retain(|e| e.seq > event.seq),
        _ => {}
    }
    let sessions = local.members.keys().copied();
    let sessions = match batching {
        true => sessions.filter(|s| !local.batched.contains(s)).collect(),
        false => sessions.collect(),
    };
    outbox.push((event.clone(), sessions));
    if !batching {
        return false;
    }
    let first = local.batch.is_empty();
    match local.batch.iter_mut().find(|e| same(e)) {
        Some(older) => *older = event.clone(),
        None => local.batch.push(event.clone()),
    }
    first
}

/// Queues the room's pending updates in one batch for its batched members.
fn send_batch(outbox: &mut Outbox, room: &Arc<str>, local: &mut Room) {
    let updates = std::mem::take(&mut local.batch);
    if updates.is_empty() || local.batched.is_empty() {
        return;
    }
    let event = Arc::new(RoomEvent::batch(room, updates));
    outbox.push((event, local.batched.iter().copied().collect()));
}

impl Registry {
    /// Hands the room events queued since the last call to their members:
    /// one delivery list per worker per event, as presence events go.
    pub(super) fn send_room_events(&mut self) {
        for (event, sessions) in self.rooms.take_outbox() {
            self.hand_out(&Inbound::Room(RoomDeliver { event }), sessions);
        }
    }

    /// Sends the room events queued by the step that called it, then
    /// starts the shared reads that are due, each answered to
    /// [`RoomInterest::read_done`]. Every step of [`RoomInterest`] is
    /// followed by it.
    pub(super) fn start_room_reads(&mut self, ctx: &mut Context<Self>) {
        self.send_room_events();
        for room in self.rooms.take_reads() {
            let store = self.store.clone();
            let read = {
                let room = room.clone();
                async move { store.read_room(&room, "").await }
            };
            ctx.spawn(read.into_actor(self).map(move |res, act, _| {
                act.rooms.read_done(&room, res);
                act.send_room_events();
            }));
        }
    }
}

impl Handler<JoinRoom> for Registry {
    type Result = ResponseActFuture<Self, Result<(), String>>;

    fn handle(&mut self, join: JoinRoom, _: &mut Self::Context) -> Self::Result {
        let interest = &mut self.rooms;
        let local = interest
            .rooms
            .entry(join.room.clone())
            .or_insert_with(|| Room {
                members: HashMap::new(),
                subscribed: false,
                view: View::Listed,
                last_read: None,
                hidden: HashSet::new(),
                batched: HashSet::new(),
                batch: Vec::new(),
            });
        local.members.insert(join.session, join.member);
        if join.batch {
            local.batched.insert(join.session);
        } else {
            local.batched.remove(&join.session);
        }
        let subscribe = (!local.subscribed).then(|| {
            let channel = Channel::Named(keys::room_events(&join.room));
            self.subscriptions.clone().map(|subs| (subs, channel))
        });
        interest
            .of_session
            .entry(join.session)
            .or_default()
            .insert(join.room.clone());
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
                if let Some(local) = act.rooms.rooms.get_mut(&room) {
                    local.subscribed = true;
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
