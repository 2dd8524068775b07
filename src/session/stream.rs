//! The WebSocket stream: frames in (text, fragments, binary, pings,
//! pongs, close), each client frame routed to the feature it belongs to.

use actix::prelude::*;
use actix_web_actors::ws;

use super::requests::Request;
use super::*;
use crate::frames::Assembled;
use crate::model::Status;
use crate::protocol::{self, ClientFrame, ErrorCode, ProtocolError};
use crate::registry::{self};

impl Session {
    pub(super) fn send_error(&mut self, ctx: &mut ws::WebsocketContext<Self>, err: &ProtocolError) {
        self.send(ctx, err.to_frame());
    }

    pub(super) fn handle_frame(
        &mut self,
        frame: ClientFrame,
        ctx: &mut ws::WebsocketContext<Self>,
    ) {
        // Paused: the session is closing, and its lease and rooms are the
        // device's next connection's.
        if self.lease.state.leaving() {
            return;
        }
        match frame {
            ClientFrame::Watch { users, devices } => self.watch(users, devices, ctx),
            ClientFrame::Unwatch { users } => {
                self.watches.forget_all(&users);
                self.node.registry.do_send(registry::Unwatch {
                    session: self.me.id,
                    users,
                });
            }
            ClientFrame::Status {
                status,
                text,
                until,
            } => {
                // Already validated by the parser.
                let Ok(status) = Status::parse(&status) else {
                    return;
                };
                self.request(
                    Request::Status {
                        status,
                        text,
                        until,
                    },
                    ctx,
                );
            }
            ClientFrame::Heartbeat => {}
            ClientFrame::Pause { grace_ms } => self.pause(grace_ms, ctx),
            ClientFrame::Join {
                room,
                state,
                token,
                batch,
            } => self.join_room(room, state, token, batch, ctx),
            ClientFrame::RoomToken { room, token } => self.room_token(room, token, ctx),
            ClientFrame::Leave { room } => self.leave_room(room, ctx),
            ClientFrame::RoomState { room, state } => self.set_room_state(room, state, ctx),
            ClientFrame::Signal { room, data } => self.signal(room, data, ctx),
            ClientFrame::Auth { token } => self.authenticate(token.0, ctx),
            ClientFrame::Privacy { online, last_seen } => {
                // Already validated by the parser.
                let Ok((online, last_seen)) =
                    protocol::parse_privacy(online.as_deref(), last_seen.as_deref())
                else {
                    return;
                };
                self.request(Request::Privacy { online, last_seen }, ctx);
            }
        }
    }
}

impl StreamHandler<Result<ws::Message, ws::ProtocolError>> for Session {
    fn handle(&mut self, msg: Result<ws::Message, ws::ProtocolError>, ctx: &mut Self::Context) {
        let msg = match msg {
            Ok(msg) => msg,
            Err(e) => {
                let max = self.frame_limit();
                let (code, mut reason) = crate::frames::close_for(&e, max);
                if self.pre_auth() && matches!(e, ws::ProtocolError::Overflow) {
                    // A token larger than that: say which setting decides.
                    reason.push_str(" before auth (--max-auth-frame-bytes)");
                }
                log::debug!(
                    "{}/{}: closing with {code:?}: {e}",
                    self.me.user,
                    self.me.device
                );
                close(ctx, code, &reason);
                return;
            }
        };
        match msg {
            ws::Message::Pong(_) => {
                self.touch(ctx);
                // The answer to our own ping is free; unsolicited pongs
                // are frames like any other (a pong flood kept a core busy).
                if !std::mem::take(&mut self.liveness.awaiting_pong) {
                    self.admit(ctx);
                }
            }
            ws::Message::Ping(payload) => {
                self.touch(ctx);
                if self.admit(ctx) {
                    ctx.pong(&payload);
                }
            }
            ws::Message::Text(text) => {
                self.touch(ctx);
                if self.admit(ctx) {
                    self.handle_text(&text, ctx);
                }
            }
            ws::Message::Continuation(_) if self.pre_auth() => {
                close(
                    ctx,
                    ws::CloseCode::Policy,
                    "no fragmented messages before the auth frame",
                );
            }
            ws::Message::Continuation(item) => {
                self.touch(ctx);
                let admitted = self.admit(ctx);
                let max = self.node.config.max_frame_bytes;
                match self.fragments.push(item, admitted, max) {
                    Ok(Assembled::Text(text)) => self.handle_text(&text, ctx),
                    Ok(Assembled::Binary) => self.refuse_binary(ctx),
                    Ok(Assembled::Pending | Assembled::Dropped) => {}
                    Err(refused) => {
                        let (code, reason) = refused.close(max);
                        close(ctx, code, &reason);
                    }
                }
            }
            ws::Message::Binary(_) => {
                self.touch(ctx);
                if self.admit(ctx) {
                    self.refuse_binary(ctx);
                }
            }
            ws::Message::Close(reason) => {
                ctx.close(reason);
                ctx.stop();
            }
            ws::Message::Nop => {}
        }
    }
}

impl Session {
    /// The largest frame accepted now: `--max-auth-frame-bytes` until the
    /// connection has authenticated, then `--max-frame-bytes`.
    fn frame_limit(&self) -> usize {
        if self.pre_auth() {
            self.node.config.admission.max_auth_frame_bytes
        } else {
            self.node.config.max_frame_bytes
        }
    }

    /// One whole text message (a frame, or assembled fragments).
    pub(super) fn handle_text(&mut self, text: &str, ctx: &mut ws::WebsocketContext<Self>) {
        if self.awaiting_auth() {
            self.first_frame(text, ctx);
            return;
        }
        match protocol::parse_client_frame(text) {
            Ok(frame) => self.handle_frame(frame, ctx),
            Err(e) => self.send_error(ctx, &e),
        }
    }

    /// Answers a binary message: the protocol is JSON text.
    pub(super) fn refuse_binary(&mut self, ctx: &mut ws::WebsocketContext<Self>) {
        self.send_error(
            ctx,
            &ProtocolError::new(
                ErrorCode::Unsupported,
                "only text frames holding one JSON object are accepted",
            ),
        );
    }
}
