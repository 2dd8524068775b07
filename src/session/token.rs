//! Token lifetime under JWT auth: the first-frame deadline, the
//! `auth` frame, `auth_expiring`, the expiry close and fresh tokens.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use actix::prelude::*;
use actix_web_actors::ws;

use crate::auth::{Auth, AuthError};
use crate::config::Policy;
use crate::rooms::allows;

use super::requests::{Request, RoomRequest};

use super::*;
use crate::protocol::{self, ClientFrame, ErrorCode, ProtocolError};

/// Token lifetime (JWT auth): the first-frame deadline, `auth_expiring`,
/// the expiry close, and fresh tokens.
impl Session {
    /// True while the first frame must still bring the token.
    pub(super) fn awaiting_auth(&self) -> bool {
        matches!(
            self.token.as_deref(),
            Some(TokenClock {
                state: TokenState::Awaited { .. },
                ..
            })
        )
    }

    /// True until the first token is verified (awaited or being verified):
    /// no fragments, and the small frame limit.
    pub(super) fn pre_auth(&self) -> bool {
        self.token.as_ref().is_some_and(|c| c.pre_auth.is_some())
    }

    /// The first token is verified: the connection leaves the sockets
    /// awaiting auth, and its frame limit becomes `--max-frame-bytes`.
    fn authenticated(&mut self) {
        if let Some(pre) = self.token.as_mut().and_then(|c| c.pre_auth.take()) {
            pre.frame_limit.store(
                self.node.config.max_frame_bytes,
                std::sync::atomic::Ordering::Relaxed,
            );
        }
    }

    /// Closes the connection with 1008 unless its `auth` frame is in by
    /// the deadline.
    pub(super) fn await_auth(&mut self, ctx: &mut ws::WebsocketContext<Self>) {
        ctx.run_later(self.node.config.auth_timeout, |act, ctx| {
            if act.awaiting_auth() {
                log::debug!("device {}: no auth frame in time, closing", act.me.device);
                close(ctx, ws::CloseCode::Policy, "no auth frame in time");
            }
        });
    }

    /// The first frame of a connection that carried no token: it must be
    /// `{"type":"auth","token":...}`; anything else closes with 1008.
    pub(super) fn first_frame(&mut self, text: &str, ctx: &mut ws::WebsocketContext<Self>) {
        self.liveness.last_activity = Instant::now();
        match protocol::parse_client_frame(text) {
            Ok(ClientFrame::Auth { token }) => self.authenticate(token.0, ctx),
            _ => close(
                ctx,
                ws::CloseCode::Policy,
                "the first frame must be {\"type\":\"auth\",\"token\":...}",
            ),
        }
    }

    /// Verifies `token`: the first one starts the session; a later one must
    /// be for the same user and replaces the expiry. Verification may fetch
    /// the provider's keys, so it runs beside the mailbox; frames that come
    /// meanwhile are taken in, and their requests wait for the claim.
    pub(super) fn authenticate(&mut self, token: String, ctx: &mut ws::WebsocketContext<Self>) {
        let Some(clock) = &mut self.token else {
            self.send_error(
                ctx,
                &ProtocolError::new(
                    ErrorCode::BadRequest,
                    "auth frames are only used with --auth jwt",
                ),
            );
            return;
        };
        let (first, asked) = match &clock.state {
            TokenState::Awaited { asked } => (true, asked.clone()),
            TokenState::Verifying => {
                // A second token before the first one is known: one at a time.
                let err = ProtocolError::new(ErrorCode::BadRequest, "authentication in progress");
                self.send_error(ctx, &err);
                return;
            }
            TokenState::Valid(_) => (false, Some(self.me.user.clone())),
        };
        if first {
            clock.state = TokenState::Verifying;
        }
        let auth = clock.auth.clone();
        let verify = async move {
            match &*auth {
                Auth::Jwt(v) => v.verify_as(&token, asked.as_deref()).await,
                Auth::Dev => Err(AuthError::Invalid("no JWT auth".into())),
            }
        };
        ctx.spawn(verify.into_actor(self).map(move |res, act, ctx| match res {
            Ok(verified) => {
                if let Some(clock) = &mut act.token {
                    clock.state = TokenState::Valid(verified.exp);
                    // The rooms claim of the newest token decides: later
                    // joins, and the rooms the device may stay in.
                    clock.rooms = verified.rooms;
                }
                if first {
                    act.me.user = verified.user;
                    act.authenticated();
                    act.begin(ctx);
                } else {
                    log::debug!("{}/{}: token refreshed", act.me.user, act.me.device);
                    act.schedule_expiry(ctx);
                }
                act.leave_ungranted_rooms(ctx);
            }
            Err(e) if first => {
                log::debug!("device {}: auth frame refused: {e}", act.me.device);
                close(ctx, ws::CloseCode::Policy, &e.to_string());
            }
            Err(e) => {
                let code = match e {
                    AuthError::Mismatch { .. } => ErrorCode::Forbidden,
                    _ => ErrorCode::Unauthorized,
                };
                act.send_error(ctx, &ProtocolError::new(code, e.to_string()));
            }
        }));
    }

    /// Whether the session may be in `room`: always, unless the room
    /// policy is `claim` and the current token's rooms claim (none before
    /// the first token is verified) does not cover it.
    pub(super) fn granted(&self, room: &str) -> bool {
        if self.node.config.rooms.policies.of(room) != Policy::Claim {
            return true;
        }
        let grants = self.token.as_ref().map(|t| t.rooms.as_slice());
        allows(grants.unwrap_or(&[]), room)
    }

    /// A fresh token was verified: the device leaves every room its rooms
    /// claim no longer covers, as with a leave frame (the others get
    /// `room_leave`), and is told `forbidden` about each. A revoked grant
    /// must end the access it gave, not only refuse the next join.
    fn leave_ungranted_rooms(&mut self, ctx: &mut ws::WebsocketContext<Self>) {
        let revoked: Vec<Arc<str>> = self
            .rooms
            .iter()
            .flat_map(|r| r.joined.keys())
            .filter(|room| !self.granted(room))
            .cloned()
            .collect();
        for room in revoked {
            let Some(room) = self.take_room(&room) else {
                continue;
            };
            log::debug!(
                "{}/{}: the fresh token's rooms claim leaves out {room}; leaving it",
                self.me.user,
                self.me.device
            );
            let err = ProtocolError::new(
                ErrorCode::Forbidden,
                format!("the fresh token's rooms claim does not include {room:?}: left it"),
            );
            self.send_error(ctx, &err.in_room(&room));
            // The session's own request: the cap on a client's requests
            // must not keep it in a room it may no longer be in.
            self.request_always(Request::Room(RoomRequest::Leave { room }), ctx);
        }
    }

    /// Arms the `auth_expiring` notice and the expiry close for the current
    /// token, replacing those of an earlier one.
    pub(super) fn schedule_expiry(&mut self, ctx: &mut ws::WebsocketContext<Self>) {
        let Some(clock) = &mut self.token else {
            return;
        };
        for timer in clock.timers.drain(..) {
            ctx.cancel_future(timer);
        }
        let Some(left) = self.token_left() else {
            return;
        };
        let notice = ctx.run_later(
            left.saturating_sub(self.node.config.auth_expiring),
            |act, ctx| {
                let in_ms = act.token_left().unwrap_or_default().as_millis() as u64;
                act.send(ctx, protocol::auth_expiring_frame(in_ms));
            },
        );
        let close = ctx.run_later(left, |act, ctx| {
            log::debug!("{}/{}: token expired, closing", act.me.user, act.me.device);
            close(
                ctx,
                ws::CloseCode::Other(CLOSE_TOKEN_EXPIRED),
                "token expired",
            );
        });
        if let Some(clock) = &mut self.token {
            clock.timers = vec![notice, close];
        }
    }

    /// Time until the session is closed for its token's expiry: `exp` plus
    /// the verifier's leeway, from now. `None` without a valid token.
    pub(super) fn token_left(&self) -> Option<Duration> {
        let clock = self.token.as_ref()?;
        let TokenState::Valid(exp) = clock.state else {
            return None;
        };
        let leeway = match &*clock.auth {
            Auth::Jwt(v) => v.leeway(),
            Auth::Dev => Duration::ZERO,
        };
        let at = UNIX_EPOCH + Duration::from_secs(exp) + leeway;
        Some(at.duration_since(SystemTime::now()).unwrap_or_default())
    }
}
