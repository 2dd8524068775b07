//! Joining a room: the `join` frame checked against the limits and the
//! room's policy (`--room-policy`, first match wins), then the join step
//! in turn with the session's other requests; and a removal by the app's
//! backend, which ends a membership from outside the connection.

use std::sync::Arc;

use actix::prelude::*;
use actix_web_actors::ws;

use super::requests::{Request, RoomRequest};
use super::Session;
use crate::config::Policy;
use crate::protocol::{ErrorCode, ProtocolError, Token};
use crate::registry::JoinRoom;
use crate::rooms::Held;
use crate::store::rooms::{JoinAccess, Joined};

use super::room_proxy::Granted;

impl Session {
    /// The app's backend removed this device's user from `room`
    /// (`DELETE /api/rooms/{room}/members/{user}`; its leave event, or a
    /// rejoin refused for it): out of the room, and told so.
    pub(super) fn removed_from(&mut self, room: &Arc<str>, ctx: &mut ws::WebsocketContext<Self>) {
        if self.take_room(room).is_none() {
            return;
        }
        log::debug!(
            "{}/{}: removed from {room} by the app's backend",
            self.me.user,
            self.me.device
        );
        let err = ProtocolError::new(
            ErrorCode::Removed,
            format!("removed from {room:?} by the app"),
        );
        self.send_error(ctx, &err.in_room(room));
    }

    /// A `join` frame: checked, then queued.
    pub(super) fn join_room(
        &mut self,
        room: String,
        state: Option<serde_json::Value>,
        token: Option<Token>,
        batch: bool,
        ctx: &mut ws::WebsocketContext<Self>,
    ) {
        let limits = self.node.config.rooms.clone();
        let Ok(token) = self.join_token(&room, token, ctx) else {
            return;
        };
        if !self.granted(&room) {
            let err = ProtocolError::new(
                ErrorCode::Forbidden,
                format!("the token's rooms claim does not include {room:?}"),
            );
            return self.send_error(ctx, &err.in_room(&room));
        }
        let state = state.unwrap_or_else(|| serde_json::json!({}));
        let state = match Self::serialized(&state, "state", limits.max_state_bytes, &room) {
            Ok(s) => s,
            Err(e) => return self.send_error(ctx, &e),
        };
        let room: Arc<str> = Arc::from(room);
        let changed = self
            .rooms
            .as_ref()
            .and_then(|r| r.joined.get(&room))
            .is_some_and(|h| h.state != state);
        // A join again that changes the state is a state change: it takes
        // from the same budget as `room_state`.
        if changed && !self.take_room_message(&room, ctx) {
            return;
        }
        let rooms = self.rooms_mut();
        let count = rooms.joined.len();
        match rooms.joined.get_mut(&room) {
            Some(held) => {
                // A join again: a fresh `room` frame follows; events wait
                // for it.
                held.state = state.clone();
                held.unsent = false;
                held.seq = None;
                held.batch = batch;
            }
            None if count >= limits.max_rooms_per_device => {
                let err = ProtocolError::new(
                    ErrorCode::TooManyRooms,
                    format!(
                        "a device may be in at most {} rooms",
                        limits.max_rooms_per_device
                    ),
                );
                return self.send_error(ctx, &err.in_room(&room));
            }
            None => {
                rooms.joined.insert(
                    room.clone(),
                    Held {
                        state: state.clone(),
                        batch,
                        ..Held::default()
                    },
                );
            }
        }
        if let Some(token) = token {
            self.rooms_mut().tokens_mut().offer(room.clone(), token);
        }
        self.request(
            Request::Room(RoomRequest::Join {
                room,
                state,
                rejoin: false,
            }),
            ctx,
        );
    }

    /// Subscribes the node to the room (the registry answers once it
    /// hears the room's events), then runs the join step, whose reply is
    /// the room right after it; in a `proxy` room, once the app's backend
    /// let the device in (`room_proxy.rs`).
    pub(super) fn start_join(
        &mut self,
        room: Arc<str>,
        state: String,
        rejoin: bool,
        ctx: &mut ws::WebsocketContext<Self>,
    ) {
        if !self.in_room(&room) {
            // Left while this waited its turn.
            return self.request_done(ctx);
        }
        match self.node.config.rooms.policies.of(&room) {
            // The backend first: a refused join leaves nothing in Redis.
            Policy::Proxy => self.ask_backend(room, state, rejoin, false, ctx),
            Policy::Token => self.token_join(room, state, rejoin, ctx),
            _ => self.join_step(room, state, rejoin, None, ctx),
        }
    }

    /// Whether this device asked for `room`'s state changes in batches.
    fn batched(&self, room: &str) -> bool {
        self.rooms
            .as_ref()
            .and_then(|r| r.joined.get(room))
            .is_some_and(|h| h.batch)
    }

    /// The join step proper, once the room's policy let the device try:
    /// subscribed, then the store's join step, whose reply is the room
    /// frame (or why the device is not in). `granted`: the app's backend
    /// let the device in (`proxy`).
    pub(super) fn join_step(
        &mut self,
        room: Arc<str>,
        state: String,
        rejoin: bool,
        granted: Option<Granted>,
        ctx: &mut ws::WebsocketContext<Self>,
    ) {
        let limits = self.node.config.rooms.clone();
        let registry = self.node.registry.clone();
        let store = self.node.store.clone();
        let (user, device, owner) = self.me_parts();
        let access = JoinAccess {
            listed: limits.policies.of(&room) == Policy::Members,
            rejoin,
            granted_at: granted.map(|g| g.asked_at),
        };
        // Kept for asking the backend again, should its grant be void.
        let again = granted.map(|_| state.clone());
        let batch = self.batched(&room);
        let subscribe = registry.send(JoinRoom {
            session: self.me.id,
            room: room.clone(),
            member: Arc::from(format!("{user}:{device}")),
            batch,
        });
        let join = async move {
            match subscribe.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err((room, e)),
                Err(e) => return Err((room, e.to_string())),
            }
            store
                .join_room(
                    &room,
                    &user,
                    &device,
                    &state,
                    &owner,
                    limits.max_room_devices,
                    access,
                )
                .await
                .map(|joined| (room.clone(), joined))
                .map_err(|e| (room, e.to_string()))
        };
        ctx.spawn(join.into_actor(self).map(move |res, act, ctx| {
            match res {
                Ok((room, Joined::Revoked)) => {
                    let state = again.unwrap_or_default();
                    return act.grant_revoked(room, state, rejoin, granted, ctx);
                }
                Ok((room, Joined::Joined { room: snapshot, .. }))
                | Ok((room, Joined::Updated { room: snapshot })) => {
                    act.show_room(&room, &snapshot, ctx)
                }
                Ok((room, Joined::Taken)) => {
                    // This connection was taken over and will be closed.
                    log::debug!(
                        "{}/{}: {room} is held by a newer connection",
                        act.me.user,
                        act.me.device
                    );
                    act.forget_room(&room);
                }
                Ok((room, Joined::NotListed)) => {
                    act.forget_room(&room);
                    let err = ProtocolError::new(
                        ErrorCode::Forbidden,
                        format!("{:?} is not on the room's member list", act.me.user),
                    );
                    act.send_error(ctx, &err.in_room(&room));
                }
                Ok((room, Joined::Removed)) => act.removed_from(&room, ctx),
                Ok((room, Joined::Full)) => {
                    act.forget_room(&room);
                    let err = ProtocolError::new(
                        ErrorCode::RoomFull,
                        format!(
                            "the room holds {} devices, the most allowed",
                            act.node.config.rooms.max_room_devices
                        ),
                    );
                    act.send_error(ctx, &err.in_room(&room));
                }
                Err((room, e)) => {
                    // Out of the room, for the client to try again: had the
                    // step itself gone through, the membership lapses with
                    // nothing refreshing it.
                    log::debug!("{}/{}: join failed: {e}", act.me.user, act.me.device);
                    act.forget_room(&room);
                    act.send_error(ctx, &super::unavailable().in_room(&room));
                }
            }
            act.request_done(ctx);
        }));
    }
}
