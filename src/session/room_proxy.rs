//! Joining a `proxy` room: the app's backend is asked first (or its
//! cached answer used), in turn with the session's other requests, and
//! only an allowed join reaches Redis. A device that was in the room
//! already (its own rejoin after Redis lost the membership, or a join
//! again) and is now refused leaves it at once, for the others too.
//!
//! A grant is void once the user is removed from the room (`DELETE
//! /api/rooms/{room}/members/{user}`) after its question was asked: the
//! join step refuses it, and the backend is asked again, once.

use std::sync::Arc;

use actix::prelude::*;
use actix_web_actors::ws;
use serde_json::value::RawValue;

use super::requests::{Request, RoomRequest};
use super::Session;
use crate::protocol::{ErrorCode, ProtocolError};
use crate::rooms::proxy::{Question, Verdict};

/// The backend let the device in: when it was asked, and whether this is
/// the second question of one join (the first grant was void).
#[derive(Debug, Clone, Copy)]
pub(super) struct Granted {
    /// When the question was sent, epoch ms.
    pub asked_at: i64,
    /// The join asked again after a void grant.
    pub retried: bool,
}

impl Session {
    /// Asks the backend whether this device may join `room` with `state`,
    /// then joins or says why not. A request still out holds the session's
    /// later requests (at most `--room-join-timeout-ms`); events keep
    /// flowing meanwhile.
    pub(super) fn ask_backend(
        &mut self,
        room: Arc<str>,
        state: String,
        rejoin: bool,
        retried: bool,
        ctx: &mut ws::WebsocketContext<Self>,
    ) {
        let Some(proxy) = self.node.room_proxy.clone() else {
            // The node does not start with a proxy rule and no
            // --room-join-url; should it, the join fails closed.
            log::error!("{room} is under --room-policy proxy, and no --room-join-url is set");
            return self.decided(room, state, (rejoin, retried), false, no_backend(), ctx);
        };
        let member = rejoin || self.confirmed_in(&room);
        // The state was serialized from a JSON object: it parses.
        let Ok(raw) = RawValue::from_string(state.clone()) else {
            return self.decided(room, state, (rejoin, retried), member, no_backend(), ctx);
        };
        let question = Question {
            user: &self.me.user,
            device: &self.me.device,
            room: &room,
            state: &raw,
        };
        match proxy.decide(&question, member) {
            Ok(verdict) => self.decided(room, state, (rejoin, retried), member, verdict, ctx),
            Err(waiting) => {
                // Waiting for the backend is no Redis work: the session no
                // longer counts among those setting up, which a slow
                // backend would otherwise keep every new session out of.
                self.first_request_done();
                ctx.spawn(
                    waiting
                        .answer()
                        .into_actor(self)
                        .map(move |verdict, act, ctx| {
                            act.decided(room, state, (rejoin, retried), member, verdict, ctx)
                        }),
                );
            }
        }
    }

    /// The backend's `verdict` on this device joining `room` with `state`
    /// (`rejoin`: the session's own; `retried`: asked again after a void
    /// grant).
    fn decided(
        &mut self,
        room: Arc<str>,
        state: String,
        (rejoin, retried): (bool, bool),
        member: bool,
        verdict: Verdict,
        ctx: &mut ws::WebsocketContext<Self>,
    ) {
        if !self.in_room(&room) {
            // Left while the backend was asked.
            return self.request_done(ctx);
        }
        match verdict {
            Verdict::Allow(grant) => {
                let granted = Granted {
                    asked_at: grant.asked_at,
                    retried,
                };
                // The backend's state replaces the one the client joined
                // with; a rejoin keeps the state the device holds now.
                let state = match grant.state.filter(|_| !rejoin) {
                    Some(given) => {
                        let given = given.to_string();
                        if let Some(held) =
                            self.rooms.as_mut().and_then(|r| r.joined.get_mut(&room))
                        {
                            held.state.clone_from(&given);
                        }
                        given
                    }
                    None => state,
                };
                self.join_step(room, state, rejoin, Some(granted), ctx);
            }
            Verdict::Refuse(why) => {
                let message = format!(
                    "the app's backend does not let {:?} into {room:?} ({why})",
                    self.me.user
                );
                self.shut_out(room, member, ErrorCode::Forbidden, message, ctx);
            }
            Verdict::Unavailable(why) => {
                let message =
                    format!("the app's backend did not answer about {room:?} ({why}); try again");
                self.shut_out(room, member, ErrorCode::Unavailable, message, ctx);
            }
        }
    }

    /// The join step refused the grant: the user was removed from the room
    /// after the backend was asked. The cached answer goes, and the
    /// backend is asked again, once; a second void grant (removed again
    /// meanwhile) is the removal's `removed`.
    pub(super) fn grant_revoked(
        &mut self,
        room: Arc<str>,
        state: String,
        rejoin: bool,
        granted: Option<Granted>,
        ctx: &mut ws::WebsocketContext<Self>,
    ) {
        if let Some(proxy) = &self.node.room_proxy {
            proxy.forget(&self.me.user, &room);
        }
        if granted.is_some_and(|g| !g.retried) && self.in_room(&room) {
            return self.ask_backend(room, state, rejoin, true, ctx);
        }
        let member = rejoin || self.confirmed_in(&room);
        let message = format!(
            "{:?} was removed from {room:?} by the app's backend",
            self.me.user
        );
        self.shut_out(room, member, ErrorCode::Removed, message, ctx);
    }

    /// Out of `room`, told why: a member leaves it at once (the others get
    /// `room_leave`); a joiner never was in it, and nothing was written.
    fn shut_out(
        &mut self,
        room: Arc<str>,
        member: bool,
        code: ErrorCode,
        message: String,
        ctx: &mut ws::WebsocketContext<Self>,
    ) {
        log::debug!("{}/{}: {message}", self.me.user, self.me.device);
        if member {
            if let Some(room) = self.take_room(&room) {
                self.request_always(Request::Room(RoomRequest::Leave { room }), ctx);
            }
        } else {
            self.forget_room(&room);
        }
        self.send_error(ctx, &ProtocolError::new(code, message).in_room(&room));
        self.request_done(ctx);
    }
}

impl Session {
    /// Whether the device is in `room` already, as far as its client
    /// knows (its `room` frame was sent).
    fn confirmed_in(&self, room: &str) -> bool {
        self.rooms
            .as_ref()
            .and_then(|r| r.joined.get(room))
            .is_some_and(|held| held.confirmed)
    }
}

/// The verdict when no backend can be asked.
fn no_backend() -> Verdict {
    Verdict::Unavailable("no --room-join-url is set".into())
}
