//! Rooms inside a session: the room frames (`join`, `leave`, `room_state`,
//! `signal`) checked against the limits and the room policy, then handed
//! to the store in turn with the session's other requests; the room
//! events the registry delivers; and leaving every room when the session
//! ends with its lease released.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use actix_web_actors::ws;

use super::requests::{Request, RoomRequest};
use super::Session;
use crate::config::MAX_SIGNAL_BYTES;
use crate::protocol::{ErrorCode, ProtocolError};
use crate::registry::{LeaveRoom, RoomResync};
use crate::rooms::events::room_frame;
use crate::rooms::events::{Kind, To};
use crate::rooms::{RoomEvent, Rooms};
use crate::store::rooms::{Relayed, RoomSnapshot};
use crate::store::StoreResult;

impl Session {
    /// The session's rooms, made on first use (most sessions have none).
    pub(super) fn rooms_mut(&mut self) -> &mut Rooms {
        let rate = self.node.config.rooms.max_messages_per_sec;
        self.rooms.get_or_insert_with(|| Box::new(Rooms::new(rate)))
    }

    /// Whether this session is in (or joining) `room`.
    pub(super) fn in_room(&self, room: &str) -> bool {
        self.rooms
            .as_ref()
            .is_some_and(|r| r.joined.contains_key(room))
    }

    /// Whether the user is invisible, as this connection last saw its
    /// status. Redis decides who sees a membership (the status sweep hides
    /// every membership of the user at once); this is for noticing that
    /// the status changed.
    pub(super) fn hidden(&self) -> bool {
        self.lease
            .known_status
            .as_ref()
            .is_some_and(|k| k.status == "invisible")
    }

    /// A refresh found the user turned invisible, or visible again: the
    /// node that made the change swept every room of the user's devices;
    /// should it have died half way, this device's rooms are settled here.
    pub(super) fn visibility_changed(&mut self) {
        let rooms = self.room_names();
        if rooms.is_empty() {
            return;
        }
        let store = self.node.store.clone();
        let user = self.me.user.clone();
        actix::spawn(async move {
            let rooms: Vec<&str> = rooms.iter().map(|r| &**r).collect();
            if let Err(e) = store.settle_rooms(&user, &rooms).await {
                log::debug!("{user}: rooms not settled after a status change: {e}");
            }
        });
    }

    /// Joins `lost` again, with this device's state in each: their
    /// memberships were gone when the lease was refreshed (Redis lost its
    /// data, or the membership lapsed while the node was frozen).
    pub(super) fn rejoin_rooms(&mut self, lost: &[Arc<str>], ctx: &mut ws::WebsocketContext<Self>) {
        let Some(rooms) = self.rooms.as_mut() else {
            return;
        };
        let mut again = Vec::new();
        for room in lost {
            if let Some(held) = rooms.joined.get_mut(room) {
                log::info!(
                    "{}/{}: membership of {room} was gone; joining again",
                    self.me.user,
                    self.me.device
                );
                held.seq = None;
                again.push((room.clone(), held.state.clone()));
            }
        }
        for (room, state) in again {
            self.request_always(
                Request::Room(RoomRequest::Join {
                    room,
                    state,
                    rejoin: true,
                }),
                ctx,
            );
        }
    }

    /// A step found this session's membership of `room` gone: joined
    /// again, unless a join of it is on its way already.
    fn membership_gone(&mut self, room: &str, ctx: &mut ws::WebsocketContext<Self>) {
        let shown = self
            .rooms
            .as_ref()
            .and_then(|r| r.joined.get_key_value(room))
            .filter(|(_, held)| held.seq.is_some())
            .map(|(room, _)| room.clone());
        if let Some(room) = shown {
            self.rejoin_rooms(std::slice::from_ref(&room), ctx);
        }
    }

    /// A client's room request refused by the queue's cap: a join that
    /// did not happen is out of the room again. The error, about the room.
    pub(super) fn refused_room(
        &mut self,
        request: &RoomRequest,
        err: ProtocolError,
    ) -> ProtocolError {
        let room = match request {
            RoomRequest::Join { room, .. } => {
                self.forget_room(room);
                room
            }
            RoomRequest::Leave { room } | RoomRequest::State { room, .. } => room,
        };
        err.in_room(room)
    }

    /// The rooms whose memberships ride on the lease's refreshes.
    pub(super) fn room_names(&self) -> Vec<Arc<str>> {
        self.rooms.as_ref().map(|r| r.names()).unwrap_or_default()
    }

    /// A state or a signal's data, serialized and checked against `max`.
    pub(super) fn serialized(
        value: &serde_json::Value,
        what: &str,
        max: usize,
        room: &str,
    ) -> Result<String, ProtocolError> {
        let text = value.to_string();
        if text.len() > max {
            return Err(ProtocolError::new(
                ErrorCode::StateTooLarge,
                format!("{what} is {} bytes; at most {max} are allowed", text.len()),
            )
            .in_room(room));
        }
        Ok(text)
    }

    /// A `leave` frame: out of the room now, in Redis in turn.
    pub(super) fn leave_room(&mut self, room: String, ctx: &mut ws::WebsocketContext<Self>) {
        let Some(room) = self.take_room(&room) else {
            return self.send_error(ctx, &not_in_room(&room));
        };
        self.request(Request::Room(RoomRequest::Leave { room }), ctx);
    }

    /// Out of `room` in this session (no more of its events, its frames
    /// `not_in_room`), for a leave step to follow; `None` when not in it.
    pub(super) fn take_room(&mut self, room: &str) -> Option<Arc<str>> {
        let rooms = self.rooms.as_mut()?;
        let (room, _) = rooms.joined.remove_entry(room)?;
        rooms.drop_token(&room);
        self.node.registry.do_send(LeaveRoom {
            session: self.me.id,
            room: room.clone(),
        });
        Some(room)
    }

    /// A signal frame for `room`: the device must be in it, and it takes
    /// one room message from the device's budget.
    fn room_message(&mut self, room: &str, ctx: &mut ws::WebsocketContext<Self>) -> bool {
        if !self.in_room(room) {
            self.send_error(ctx, &not_in_room(room));
            return false;
        }
        self.take_room_message(room, ctx)
    }

    /// Takes one room message (a signal, or a join that changes the state)
    /// from the device's budget; false, with `rate_limited` sent, when it is spent.
    pub(super) fn take_room_message(
        &mut self,
        room: &str,
        ctx: &mut ws::WebsocketContext<Self>,
    ) -> bool {
        let rate = self.node.config.rooms.max_messages_per_sec;
        if self.rooms_mut().messages.take(1).is_ok() {
            return true;
        }
        let err = ProtocolError::new(
            ErrorCode::RateLimited,
            format!("more than {rate} signal frames (and joins that change the state) per second"),
        );
        self.send_error(ctx, &err.in_room(room));
        false
    }

    /// A `room_state` frame: never refused for its rate. The state
    /// replaces the device's unsent one (the latest wins) and is written at
    /// once when the last write started a tick ago or more, else at the
    /// next tick: at most `--room-state-hz` writes (and so updates to the
    /// others) per device per second.
    pub(super) fn set_room_state(
        &mut self,
        room: String,
        state: serde_json::Value,
        ctx: &mut ws::WebsocketContext<Self>,
    ) {
        if !self.in_room(&room) {
            return self.send_error(ctx, &not_in_room(&room));
        }
        let max = self.node.config.rooms.max_state_bytes;
        let state = match Self::serialized(&state, "state", max, &room) {
            Ok(s) => s,
            Err(e) => return self.send_error(ctx, &e),
        };
        let Some(rooms) = self.rooms.as_mut() else {
            return;
        };
        // The map's own `Arc` for the room, not a second allocation.
        let Some(room) = rooms
            .joined
            .get_key_value(room.as_str())
            .map(|(k, _)| k.clone())
        else {
            return;
        };
        let Some(held) = rooms.joined.get_mut(&room) else {
            return;
        };
        held.state = state;
        held.unsent = true;
        if held.armed {
            return;
        }
        held.armed = true;
        let wait = held.next_write.map_or(Duration::ZERO, |at| {
            at.saturating_duration_since(Instant::now())
        });
        if wait.is_zero() {
            return self.request_always(Request::Room(RoomRequest::State { room }), ctx);
        }
        ctx.run_later(wait, move |act, ctx| {
            let armed = act
                .rooms
                .as_ref()
                .and_then(|r| r.joined.get(&room))
                .is_some_and(|h| h.armed);
            // Left (and maybe joined again) meanwhile: nothing to write.
            if armed {
                act.request_always(Request::Room(RoomRequest::State { room }), ctx);
            }
        });
    }

    /// The state write of `room` whose turn has come: the device's latest
    /// state, unless it left the room, or a join wrote it meanwhile.
    fn start_state_write(&mut self, room: Arc<str>, ctx: &mut ws::WebsocketContext<Self>) {
        let tick = self.node.config.rooms.state_tick();
        let Some(held) = self.rooms.as_mut().and_then(|r| r.joined.get_mut(&room)) else {
            return self.request_done(ctx);
        };
        held.armed = false;
        if !std::mem::take(&mut held.unsent) {
            return self.request_done(ctx);
        }
        held.next_write = Some(Instant::now() + tick);
        let state = held.state.clone();
        let store = self.node.store.clone();
        let (user, device, owner) = self.me_parts();
        self.run_room_step(room, "room state", ctx, async move |room: Arc<str>| {
            store
                .set_room_state(&room, &user, &device, &state, &owner)
                .await
        });
    }

    /// A `signal` frame: relayed at once, never stored.
    pub(super) fn signal(
        &mut self,
        room: String,
        data: serde_json::Value,
        ctx: &mut ws::WebsocketContext<Self>,
    ) {
        if !self.room_message(&room, ctx) {
            return;
        }
        let data = match Self::serialized(&data, "data", MAX_SIGNAL_BYTES, &room) {
            Ok(d) => d,
            Err(e) => return self.send_error(ctx, &e),
        };
        let store = self.node.store.clone();
        let (user, device, owner) = self.me_parts();
        let send = async move {
            let res = store
                .signal_room(&room, &user, &device, &owner, &data)
                .await;
            (room, res)
        };
        ctx.spawn(
            send.into_actor(self)
                .map(|(room, res), act, ctx| match res {
                    Ok(Relayed::Everyone) => crate::metrics::METRICS.rooms.signals_relayed.inc(),
                    // A hidden member's signals are nobody else's business, on a
                    // public /metrics too.
                    Ok(Relayed::OwnDevices | Relayed::Taken) => {}
                    // The membership is gone from Redis while this session
                    // holds the room (Redis lost it, or it lapsed while the
                    // node was frozen): nothing was relayed, and the room is
                    // joined again as a refresh would (a device deleted over
                    // HTTP is closed meanwhile).
                    Ok(Relayed::Absent) => act.membership_gone(&room, ctx),
                    Err(e) => {
                        log::debug!("{}/{}: signal not relayed: {e}", act.me.user, act.me.device);
                        act.send_error(ctx, &super::unavailable().in_room(&room));
                    }
                }),
        );
    }

    /// Runs a room request whose turn has come.
    pub(super) fn start_room(
        &mut self,
        request: RoomRequest,
        ctx: &mut ws::WebsocketContext<Self>,
    ) {
        match request {
            RoomRequest::Join {
                room,
                state,
                rejoin,
            } => self.start_join(room, state, rejoin, ctx),
            RoomRequest::Leave { room } => {
                let store = self.node.store.clone();
                let (user, device, owner) = self.me_parts();
                // A leave that fails lapses by itself: nothing refreshes it.
                self.run_room_step(room, "leave", ctx, async move |room: Arc<str>| {
                    store.leave_room(&room, &user, &device, &owner).await
                });
            }
            RoomRequest::State { room } => self.start_state_write(room, ctx),
        }
    }

    /// Runs one room step in turn with the session's other requests; a
    /// failure is `unavailable`, naming the room, and the next request
    /// starts when it is answered.
    fn run_room_step<T, F>(
        &mut self,
        room: Arc<str>,
        what: &'static str,
        ctx: &mut ws::WebsocketContext<Self>,
        step: impl FnOnce(Arc<str>) -> F,
    ) where
        F: std::future::Future<Output = StoreResult<T>> + 'static,
    {
        let run = step(room.clone());
        ctx.spawn(run.into_actor(self).map(move |res, act, ctx| {
            if let Err(e) = res {
                log::debug!("{}/{}: {what} failed: {e}", act.me.user, act.me.device);
                act.send_error(ctx, &super::unavailable().in_room(&room));
            }
            act.request_done(ctx);
        }));
    }

    /// User, device and lease value, for a room step.
    pub(super) fn me_parts(&self) -> (String, String, String) {
        (
            self.me.user.clone(),
            self.me.device.clone(),
            self.me.owner.clone(),
        )
    }

    /// Sends the `room` frame of `snapshot`, then the events held for it.
    pub(super) fn show_room(
        &mut self,
        room: &str,
        snapshot: &RoomSnapshot,
        ctx: &mut ws::WebsocketContext<Self>,
    ) {
        let Some(state) = self
            .rooms
            .as_ref()
            .and_then(|r| r.joined.get(room))
            .map(|held| held.state.clone())
        else {
            return;
        };
        // The device's own entry shows the state it last set: a read made
        // while a change of it was on its way shows the one before, and the
        // device is never told of its own changes.
        let mut snapshot = snapshot.clone();
        let me = (&self.me.user, &self.me.device);
        for m in snapshot
            .members
            .iter_mut()
            .flatten()
            .chain(&mut snapshot.hidden)
        {
            if (&m.user, &m.device) == me {
                m.state.clone_from(&state);
            }
        }
        self.send(ctx, room_frame(room, &snapshot));
        for event in self.rooms_mut().synced(room, snapshot.seq) {
            self.room_event(event, ctx);
        }
        let again = self
            .rooms
            .as_mut()
            .and_then(|r| r.joined.get_mut(room))
            .is_some_and(|held| std::mem::take(&mut held.resync));
        if again {
            ctx.address().do_send(RoomResync {
                room: Arc::from(room),
            });
        }
    }

    /// Out of a room this session could not join.
    pub(super) fn forget_room(&mut self, room: &Arc<str>) {
        if let Some(rooms) = &mut self.rooms {
            rooms.joined.remove(room);
            rooms.drop_token(room);
        }
        self.node.registry.do_send(LeaveRoom {
            session: self.me.id,
            room: room.clone(),
        });
    }

    /// Leaves every room at once: the session ends with its lease released
    /// (a clean close), so its memberships go with it rather than lapse.
    pub(super) fn leave_rooms_on_stop(&mut self) {
        let Some(rooms) = self.rooms.take() else {
            return;
        };
        let store = self.node.store.clone();
        let (user, device, owner) = self.me_parts();
        actix::spawn(async move {
            for room in rooms.joined.keys() {
                if let Err(e) = store.leave_room(room, &user, &device, &owner).await {
                    log::debug!("{user}/{device}: leaving {room} failed ({e}); it will lapse");
                }
            }
        });
    }
}

/// The error for a room frame naming a room the device is not in.
fn not_in_room(room: &str) -> ProtocolError {
    ProtocolError::new(
        ErrorCode::NotInRoom,
        format!("not in room {room:?}: join it first"),
    )
    .in_room(room)
}

impl Session {
    /// One room event for this session: a frame for its client, unless it
    /// is not for this device or was shown already; held while the room's
    /// own `room` frame is on its way.
    pub(super) fn room_event(
        &mut self,
        event: Arc<RoomEvent>,
        ctx: &mut ws::WebsocketContext<Self>,
    ) {
        if event.kind == Kind::Room {
            return self.shared_room(event, ctx);
        }
        if event.removed && event.user == self.me.user && event.device == self.me.device {
            let room = event.room.clone();
            return self.removed_from(&room, ctx);
        }
        let counted = event.to != To::User;
        let (user, device) = (&self.me.user, &self.me.device);
        let frame = self
            .rooms
            .as_mut()
            .and_then(|r| r.deliver(event, user, device));
        if let Some(frame) = frame {
            // A hidden member's own events are nobody else's business, on a
            // public /metrics too.
            if counted {
                crate::metrics::METRICS.rooms.frames_sent.inc();
            }
            self.send(ctx, frame);
        }
    }

    /// A `room` frame the node read once for all its members there. It
    /// was read for nobody in particular: a member whose own device is not
    /// listed (its user is hidden) reads its own view instead, and one
    /// whose state change is on its way shows its own state in it.
    fn shared_room(&mut self, event: Arc<RoomEvent>, ctx: &mut ws::WebsocketContext<Self>) {
        let Some(held) = self
            .rooms
            .as_mut()
            .and_then(|r| r.joined.get_mut(&event.room))
        else {
            return;
        };
        let seq = event.seq.unwrap_or(0);
        match held.seq {
            // Its own room frame is on its way: this follows it if newer.
            None => return held.pending.push(event),
            Some(shown) if seq <= shown => return,
            Some(_) => {}
        }
        let listed = event.snapshot.as_ref().and_then(|s| {
            let members = s.members.as_ref()?;
            Some(
                members
                    .iter()
                    .find(|m| m.user == self.me.user && m.device == self.me.device)
                    .map(|m| m.state == held.state),
            )
        });
        match (listed, &event.snapshot) {
            (Some(None), _) => {
                ctx.address().do_send(RoomResync {
                    room: event.room.clone(),
                });
            }
            (Some(Some(false)), Some(snapshot)) => {
                let snapshot = snapshot.clone();
                self.show_room(&event.room, &snapshot, ctx);
            }
            _ => {
                held.seq = Some(seq);
                crate::metrics::METRICS.rooms.frames_sent.inc();
                self.send(ctx, event.frame.clone());
            }
        }
    }
}

impl Handler<RoomResync> for Session {
    type Result = ();

    /// Events of the room may have been missed: read it again and send a
    /// fresh `room` frame, holding events until it is out.
    fn handle(&mut self, msg: RoomResync, ctx: &mut Self::Context) {
        let Some(held) = self
            .rooms
            .as_mut()
            .and_then(|r| r.joined.get_mut(&msg.room))
        else {
            return;
        };
        if held.seq.is_none() {
            // Its room frame is on its way, read maybe before what this
            // resync is for (a threshold crossing, missed events): read
            // again once it is out.
            held.resync = true;
            return;
        }
        held.seq = None;
        let store = self.node.store.clone();
        let room = msg.room;
        let user = self.me.user.clone();
        let read = async move {
            let snapshot: StoreResult<RoomSnapshot> = store.read_room(&room, &user).await;
            (room, snapshot)
        };
        ctx.spawn(
            read.into_actor(self)
                .map(|(room, res), act, ctx| match res {
                    Ok(snapshot) => act.show_room(&room, &snapshot, ctx),
                    Err(e) => {
                        log::debug!(
                            "{}/{}: room {room} not re-read: {e}",
                            act.me.user,
                            act.me.device
                        );
                        // Keep delivering live events rather than hold them forever.
                        let held = act.rooms.as_mut().map(|r| r.synced(&room, 0));
                        for event in held.into_iter().flatten() {
                            act.room_event(event, ctx);
                        }
                    }
                }),
        );
    }
}
