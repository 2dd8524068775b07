//! How a session ends from the server's side, in one place: the close
//! codes clients act on, and [`close`], which sends the close frame and
//! stops the actor (the connection closes once the frame is flushed).

use actix::ActorContext;
use actix_web_actors::ws;

use super::Session;

/// Close code sent when another connection of the same device took the lease.
pub const CLOSE_REPLACED: u16 = 4001;
/// Close code sent when the lease cannot be claimed (Redis unreachable).
pub const CLOSE_UNAVAILABLE: u16 = 1011;
/// Close code sent when the session's token expired (JWT auth).
pub const CLOSE_TOKEN_EXPIRED: u16 = 4401;

/// Most bytes of a close frame's reason (125 bytes of payload, less the code).
const MAX_REASON: usize = 123;

/// Sends a close frame with `code` and `reason` (cut to what a close frame
/// can carry, on a character boundary) and ends the session.
pub(super) fn close(ctx: &mut ws::WebsocketContext<Session>, code: ws::CloseCode, reason: &str) {
    let mut end = reason.len().min(MAX_REASON);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    ctx.close(Some(ws::CloseReason {
        code,
        description: Some(reason[..end].to_string()),
    }));
    ctx.stop();
}
