//! Rooms under `--room-policy token` inside a session: the room token of a
//! join, verified at the join's turn before anything reaches Redis; fresh
//! ones (`room_token`); `room_token_expiring`; and leaving the room, with
//! `token_expired`, when a token lapses with no fresh one sent. The way
//! `token.rs` treats the connection's own token, per room.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use actix_web_actors::ws;

use super::requests::{Request, RoomRequest};
use super::Session;
use crate::auth::Auth;
use crate::clock::now_ms;
use crate::config::Policy;
use crate::protocol::{ErrorCode, ProtocolError, Token};
use crate::rooms::token::{room_token_expiring_frame, Due};

impl Session {
    /// Whether `room` is under `--room-policy token`.
    fn takes_token(&self, room: &str) -> bool {
        self.node.config.rooms.policies.of(room) == Policy::Token
    }

    /// The verifier of room tokens: the connection's own (JWT auth; a
    /// node with token rooms does not start under development auth).
    fn room_token_auth(&self) -> Option<Arc<Auth>> {
        self.token.as_ref().map(|clock| clock.auth.clone())
    }

    /// The token of a `join` frame. `Err` when the join is refused (a
    /// token room joined without one; the error is sent). `Ok(Some)`: the
    /// token of a first join, to hold until its turn. A join again of a
    /// room the device is in may bring a fresh token, taken as a
    /// `room_token` frame; tokens for rooms of other policies are ignored.
    pub(super) fn join_token(
        &mut self,
        room: &str,
        token: Option<Token>,
        ctx: &mut ws::WebsocketContext<Self>,
    ) -> Result<Option<Box<str>>, ()> {
        if !self.takes_token(room) {
            return Ok(None);
        }
        match token {
            Some(token) if self.in_room(room) => {
                self.room_token(room.to_string(), token, ctx);
                Ok(None)
            }
            Some(token) => Ok(Some(token.0.into_boxed_str())),
            None if self.in_room(room) => Ok(None),
            None => {
                let err = ProtocolError::new(
                    ErrorCode::Forbidden,
                    format!(
                        "{room:?} takes a room token from the app: {{\"type\":\"join\",\"room\":{room:?},\"token\":\"<JWT>\"}}"
                    ),
                );
                self.send_error(ctx, &err.in_room(room));
                Err(())
            }
        }
    }

    /// The turn of a join of a token room: the join frame's token is
    /// verified first, and only a valid one lets the join step run. A join
    /// again, and the session's own rejoin, go on the token it holds, if
    /// that has not lapsed.
    pub(super) fn token_join(
        &mut self,
        room: Arc<str>,
        state: String,
        rejoin: bool,
        ctx: &mut ws::WebsocketContext<Self>,
    ) {
        let pending = self
            .rooms
            .as_mut()
            .and_then(|r| r.tokens.as_mut())
            .and_then(|t| t.take_pending(&room));
        let Some(token) = pending else {
            let held = self
                .rooms
                .as_ref()
                .and_then(|r| r.tokens.as_ref())
                .and_then(|t| t.deadline(&room));
            return match held {
                Some(deadline) if deadline > now_ms() => {
                    self.join_step(room, state, rejoin, None, ctx)
                }
                Some(_) => {
                    self.room_token_expired(&room, ctx);
                    self.request_done(ctx)
                }
                None => self.token_refused(&room, "no room token is held for it".into(), ctx),
            };
        };
        let Some(auth) = self.room_token_auth() else {
            return self.token_refused(&room, "room tokens need --auth jwt".into(), ctx);
        };
        let user = self.me.user.clone();
        let name = room.clone();
        let verify = async move { auth.verify_room_token(&token, &user, &name).await };
        ctx.spawn(verify.into_actor(self).map(move |res, act, ctx| {
            if !act.in_room(&room) {
                // Left while its token was being verified.
                return act.request_done(ctx);
            }
            match res {
                Ok(exp) => {
                    act.grant_room_token(&room, exp, ctx);
                    act.join_step(room, state, rejoin, None, ctx);
                }
                Err(e) => act.token_refused(&room, e.to_string(), ctx),
            }
        }));
    }

    /// A first join refused for its token: out of the room, nothing
    /// written to Redis, and told why.
    fn token_refused(
        &mut self,
        room: &Arc<str>,
        why: String,
        ctx: &mut ws::WebsocketContext<Self>,
    ) {
        log::debug!(
            "{}/{}: join of {room} refused: {why}",
            self.me.user,
            self.me.device
        );
        self.forget_room(room);
        let err = ProtocolError::new(ErrorCode::Forbidden, why);
        self.send_error(ctx, &err.in_room(room));
        self.request_done(ctx);
    }

    /// A `room_token` frame (or a join again with a token): verified, it
    /// replaces the room's token; refused, the device leaves the room (as
    /// with a fresh connection token whose claim no longer covers it), so
    /// that `forbidden` always means the device is not in the room.
    pub(super) fn room_token(
        &mut self,
        room: String,
        token: Token,
        ctx: &mut ws::WebsocketContext<Self>,
    ) {
        if !self.takes_token(&room) {
            let err = ProtocolError::new(
                ErrorCode::BadRequest,
                format!("{room:?} is not under --room-policy token: it takes no room token"),
            );
            return self.send_error(ctx, &err.in_room(&room));
        }
        if !self.in_room(&room) {
            let err = ProtocolError::new(
                ErrorCode::NotInRoom,
                format!("not in room {room:?}: join it with the token instead"),
            );
            return self.send_error(ctx, &err.in_room(&room));
        }
        let Some(auth) = self.room_token_auth() else {
            return;
        };
        let user = self.me.user.clone();
        let verify = async move {
            let res = auth.verify_room_token(&token.0, &user, &room).await;
            (room, res)
        };
        ctx.spawn(
            verify
                .into_actor(self)
                .map(|(room, res), act, ctx| match res {
                    Ok(exp) => {
                        // The map's own `Arc` for the room, if still in it.
                        let held = act
                            .rooms
                            .as_ref()
                            .and_then(|r| r.joined.get_key_value(room.as_str()))
                            .map(|(k, _)| k.clone());
                        if let Some(room) = held {
                            log::debug!(
                                "{}/{}: room token of {room} refreshed",
                                act.me.user,
                                act.me.device
                            );
                            act.grant_room_token(&room, exp, ctx);
                        }
                    }
                    Err(e) => act.token_revoked(&room, e.to_string(), ctx),
                }),
        );
    }

    /// A verified token for `room`, whose `exp` is `exp` (epoch s): the
    /// device stays until then plus the verifier's leeway, as a session
    /// does on its own token.
    fn grant_room_token(
        &mut self,
        room: &Arc<str>,
        exp: u64,
        ctx: &mut ws::WebsocketContext<Self>,
    ) {
        let leeway = match self.token.as_deref().map(|c| &*c.auth) {
            Some(Auth::Jwt(v)) => v.leeway(),
            _ => Duration::ZERO,
        };
        let deadline = (exp.saturating_add(leeway.as_secs()))
            .saturating_mul(1000)
            .min(i64::MAX as u64) as i64;
        self.rooms_mut().tokens_mut().grant(room.clone(), deadline);
        self.arm_room_tokens(ctx);
    }

    /// Arms the one timer of the room tokens for the earliest warning or
    /// expiry due, replacing the one armed before when that moment moved.
    fn arm_room_tokens(&mut self, ctx: &mut ws::WebsocketContext<Self>) {
        let warn = self.node.config.room_token_expiring.as_millis() as i64;
        let Some(tokens) = self.rooms.as_mut().and_then(|r| r.tokens.as_mut()) else {
            return;
        };
        let next = tokens.next_due(warn);
        if tokens.timer.map(|(_, at)| at) == next {
            return;
        }
        if let Some((timer, _)) = tokens.timer.take() {
            ctx.cancel_future(timer);
        }
        let Some(at) = next else {
            return;
        };
        let wait = Duration::from_millis(at.saturating_sub(now_ms()).max(0) as u64);
        let timer = ctx.run_later(wait, |act, ctx| act.room_tokens_due(ctx));
        tokens.timer = Some((timer, at));
    }

    /// The timer of the room tokens: warnings sent, lapsed rooms left.
    fn room_tokens_due(&mut self, ctx: &mut ws::WebsocketContext<Self>) {
        let warn = self.node.config.room_token_expiring.as_millis() as i64;
        let Some(tokens) = self.rooms.as_mut().and_then(|r| r.tokens.as_mut()) else {
            return;
        };
        tokens.timer = None;
        for due in tokens.due(now_ms(), warn) {
            match due {
                Due::Warn { room, expires_at } => {
                    self.send(ctx, room_token_expiring_frame(&room, expires_at))
                }
                Due::Expired(room) => self.room_token_expired(&room, ctx),
            }
        }
        self.arm_room_tokens(ctx);
    }

    /// A fresh room token for `room` was refused: the device leaves it at
    /// once (the others get `room_leave`), and is told `forbidden` and why.
    fn token_revoked(&mut self, room: &str, why: String, ctx: &mut ws::WebsocketContext<Self>) {
        let message = format!("room token refused, left {room:?}: {why}");
        let err = ProtocolError::new(ErrorCode::Forbidden, message);
        self.send_error(ctx, &err.in_room(room));
        let Some(room) = self.take_room(room) else {
            return;
        };
        self.request_always(Request::Room(RoomRequest::Leave { room }), ctx);
    }

    /// The device's token for `room` lapsed with no fresh one: it leaves
    /// the room as with a leave frame (the others get `room_leave`), and is
    /// told `token_expired`.
    fn room_token_expired(&mut self, room: &Arc<str>, ctx: &mut ws::WebsocketContext<Self>) {
        let Some(room) = self.take_room(room) else {
            return;
        };
        log::debug!(
            "{}/{}: room token of {room} expired; leaving it",
            self.me.user,
            self.me.device
        );
        let err = ProtocolError::new(
            ErrorCode::TokenExpired,
            format!("the room token of {room:?} expired: left it; join again with a fresh one"),
        );
        self.send_error(ctx, &err.in_room(&room));
        // The session's own request: the cap on a client's requests must
        // not keep it in a room its token no longer lets it into.
        self.request_always(Request::Room(RoomRequest::Leave { room }), ctx);
    }
}
