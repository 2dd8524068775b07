//! How a session ends from the server's side, in one place: the close
//! codes clients act on, and [`close`], which sends the close frame and
//! stops the actor (the connection closes once the frame is flushed).

use actix::{Actor, ActorContext, StreamHandler};
use actix_web_actors::ws;

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
pub(super) fn close<A>(ctx: &mut ws::WebsocketContext<A>, code: ws::CloseCode, reason: &str)
where
    A: Actor<Context = ws::WebsocketContext<A>>,
{
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

/// A connection refused before any session exists, told why in a close
/// frame rather than by an HTTP status: a browser shows a refused upgrade
/// only as `1006`, with no reason, and its client would retry it forever.
/// Sends `1008` with the reason as soon as it starts, reads nothing, and
/// touches neither Redis nor the registry.
pub struct Refused {
    reason: String,
}

impl Refused {
    /// A refusal that closes with `1008` and `reason`.
    pub fn new(reason: String) -> Self {
        Self { reason }
    }
}

impl Actor for Refused {
    type Context = ws::WebsocketContext<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        close(ctx, ws::CloseCode::Policy, &self.reason);
    }
}

impl StreamHandler<Result<ws::Message, ws::ProtocolError>> for Refused {
    fn handle(&mut self, _: Result<ws::Message, ws::ProtocolError>, _: &mut Self::Context) {}
}
