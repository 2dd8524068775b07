//! A pause (`{"type":"pause"}`): the device steps away without leaving.
//! Its lease is set to the grace (at most `--pause-grace-ms`, the TTL by
//! default) while this connection still holds it, the client is answered
//! `{"type":"paused","grace_ms":G}`, and the session closes with 1000
//! "paused" releasing nothing and leaving no room: like a node going away
//! ([`End::GoingAway`]), the device's next connection within the grace
//! takes the lease and the memberships over with no transition, and with
//! none the device lapses once at the end of the grace, as after a crash.

use std::time::Duration;

use actix::prelude::*;
use actix_web_actors::ws;

use super::*;
use crate::protocol::{self, ErrorCode, ProtocolError};
use crate::store::{Arrival, Lease, StoreResult};

/// How often a pause looks again whether the refresh it waits for is done.
const REFRESH_WAIT: Duration = Duration::from_millis(5);

impl Session {
    /// The client asked for a pause of `asked` ms (the bound when `None`).
    pub(super) fn pause(&mut self, asked: Option<u64>, ctx: &mut ws::WebsocketContext<Self>) {
        if !self.lease.claimed {
            let err = ProtocolError::new(
                ErrorCode::BadRequest,
                "pause: the device holds no lease yet; wait for hello",
            );
            return self.send_error(ctx, &err);
        }
        // From here on the lease is not ours to release, nor the rooms to
        // leave, whatever ends the session; no refresh starts, and further
        // frames are dropped (see `Session::handle_frame`).
        self.lease.claimed = false;
        self.lease.state.leave();
        let grace = self.node.config.pause_grace(asked);
        self.pause_after_refresh(grace.as_millis() as u64, ctx);
    }

    /// Sends the pause once no refresh of this connection is out: a refresh
    /// landing after it would set the lease back to the TTL.
    fn pause_after_refresh(&mut self, grace_ms: u64, ctx: &mut ws::WebsocketContext<Self>) {
        if self.lease.state.refreshing() {
            ctx.run_later(REFRESH_WAIT, move |act, ctx| {
                act.pause_after_refresh(grace_ms, ctx)
            });
            return;
        }
        let lease = Lease {
            user: self.me.user.clone(),
            device: self.me.device.clone(),
            owner: self.me.owner.clone(),
            known: self.lease.known_status.as_deref().cloned(),
            rooms: self.room_names(),
            kind: Some(self.me.kind),
        };
        let store = self.node.store.clone();
        let step = async move { store.pause(&lease, grace_ms).await };
        ctx.spawn(
            step.into_actor(self)
                .map(move |res, act, ctx| act.paused(res, grace_ms, ctx)),
        );
    }

    /// The pause came back from Redis.
    fn paused(
        &mut self,
        res: StoreResult<Arrival>,
        grace_ms: u64,
        ctx: &mut ws::WebsocketContext<Self>,
    ) {
        let Me { user, device, .. } = &self.me;
        match res {
            Ok(Arrival::Held { .. }) => {
                log::debug!("{user}/{device}: paused for {grace_ms} ms");
                self.send(ctx, protocol::paused_frame(grace_ms));
                close(ctx, ws::CloseCode::Normal, "paused");
            }
            // Another connection of the device holds the lease: nothing of
            // it was touched, as a refresh that finds it so.
            Ok(_) => {
                log::debug!("{user}/{device}: pause found the lease replaced");
                close(
                    ctx,
                    ws::CloseCode::Other(CLOSE_REPLACED),
                    "device connected elsewhere",
                );
            }
            // Whether the pause reached Redis is unknown: the lease is left
            // to lapse (at the TTL or the grace), never released.
            Err(e) => {
                log::warn!("{user}/{device}: pause failed: {e}");
                self.send_error(ctx, &unavailable());
                close(
                    ctx,
                    ws::CloseCode::Other(CLOSE_UNAVAILABLE),
                    "presence store unavailable",
                );
            }
        }
    }
}
