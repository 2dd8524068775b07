//! Keeping the device alive: the frame budget, the heartbeat (pings, and
//! cutting a client that went silent), lease refreshes through the node's
//! refresher, and the outcome of the connect claim.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::time::Instant;

use actix::prelude::*;
use actix_web_actors::ws;

use super::*;
use crate::lease::{Busy, Refreshed};
use crate::protocol::{self, ErrorCode, ProtocolError};
use crate::store::{now_ms, Arrival, Lease, StoreResult};

/// The budget of client frames: a [`TokenBucket`] of `rate` frames per
/// second with bursts of twice that, and the run of refusals that tells a
/// flood from a burst.
pub(super) struct FrameLimiter {
    /// The frames this session may send.
    bucket: TokenBucket,
    /// Frames refused since the bucket last had a token.
    refused: u32,
}

/// What [`FrameLimiter::take`] decided about one frame.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Admission {
    /// Go ahead.
    Admitted,
    /// Refused; the first refusal of a run, worth telling the client.
    RefusedFirst,
    /// Refused again.
    Refused,
    /// A sustained flood: close the session.
    Flood,
}

impl FrameLimiter {
    /// A full bucket for `rate` frames per second (bursts of twice that).
    pub(super) fn new(rate: u32, now: Instant) -> Self {
        Self {
            bucket: TokenBucket::new_at(rate, rate.saturating_mul(2), now),
            refused: 0,
        }
    }

    /// Takes a token for one frame.
    pub(super) fn take(&mut self, now: Instant) -> Admission {
        if self.bucket.take_at(1, now).is_ok() {
            self.refused = 0;
            return Admission::Admitted;
        }
        self.refused += 1;
        if self.refused == 1 {
            Admission::RefusedFirst
        } else if self.refused > self.bucket.rate().saturating_mul(FLOOD_CLOSE_FACTOR) {
            Admission::Flood
        } else {
            Admission::Refused
        }
    }
}

impl Session {
    /// Takes a token for one client frame (and notes that the client spoke).
    /// Returns false when the frame is to be refused; a sustained flood
    /// closes the session with 1008.
    pub(super) fn admit(&mut self, ctx: &mut ws::WebsocketContext<Self>) -> bool {
        self.liveness.spoke = true;
        let rate = self.node.config.max_frames_per_sec;
        match self.limiter.take(Instant::now()) {
            Admission::Admitted => return true,
            Admission::RefusedFirst => {
                let err = ProtocolError::new(
                    ErrorCode::RateLimited,
                    format!(
                        "more than {rate} frames per second; frames are refused until the rate drops"
                    ),
                );
                self.send_error(ctx, &err);
            }
            Admission::Refused => {}
            Admission::Flood => {
                log::warn!("{}/{}: flooding, closing", self.me.user, self.me.device);
                crate::metrics::METRICS.floods.inc();
                close(ctx, ws::CloseCode::Policy, "too many frames");
            }
        }
        false
    }

    /// Pings the client every heartbeat (every other one while the client
    /// sends frames of its own); stops a client that went silent.
    /// After a freeze of the node (its clock jumped), the client gets a
    /// fresh timeout: the silence was the node's, not the client's.
    pub(super) fn hb(&self, ctx: &mut ws::WebsocketContext<Self>) {
        let mut ticks = crate::clock::Ticks::new(self.node.config.heartbeat);
        ctx.run_interval(self.node.config.heartbeat, move |act, ctx| {
            if ticks.jumped() {
                // Every session sees the same freeze: the registry says it
                // once for the node, a line per session would be a storm.
                log::debug!(
                    "{}/{}: the node was frozen; judging the client from now on",
                    act.me.user,
                    act.me.device
                );
                act.liveness.last_activity = Instant::now();
                act.liveness.alive.store(now_ms(), Ordering::Relaxed);
            }
            let timeout = act.node.config.client_timeout();
            if act.liveness.last_activity.elapsed() > timeout {
                log::debug!(
                    "{}/{}: silent for {timeout:?}, disconnecting",
                    act.me.user,
                    act.me.device,
                );
                ctx.stop();
                return;
            }
            // A client that sent frames of its own since the last tick, and
            // was heard from within the last half heartbeat, is alive without
            // a ping, and its frames refresh the lease: the ping and its pong
            // would cost a write and a read for nothing. (The pong answering
            // our ping does not count: a quiet client is pinged every
            // heartbeat, as before.) The half heartbeat keeps the margin of
            // the silence check above: at the next tick the client has been
            // silent for at most 1.5 heartbeats, and is pinged then. Every
            // other tick pings anyway, so that the node writes at least every
            // two heartbeats: a proxy in between (nginx's proxy_read_timeout)
            // cuts a connection its upstream left silent.
            let spoke = std::mem::take(&mut act.liveness.spoke);
            let recent = act.liveness.last_activity.elapsed() <= act.node.config.heartbeat / 2;
            if spoke && recent && !act.liveness.skipped_ping {
                act.liveness.skipped_ping = true;
                return;
            }
            act.liveness.skipped_ping = false;
            ctx.ping(b"");
            act.liveness.awaiting_pong = true;
        });
    }

    /// This connection's claim of its lease, through the node's claimer,
    /// as a future; [`Busy`] when the node has its most sessions setting up.
    pub(super) fn claim(
        &self,
    ) -> Result<impl Future<Output = StoreResult<Arrival>> + 'static, Busy> {
        let me = &self.me;
        self.node.claimer.claim(Lease {
            user: me.user.clone(),
            device: me.device.clone(),
            owner: me.owner.clone(),
            known: self.lease.known_status.as_deref().cloned(),
            rooms: Vec::new(),
            kind: Some(me.kind),
        })
    }

    /// The client is alive: note it and refresh the lease if due. A refresh
    /// that finds the lease gone (Redis restarted empty, or it lapsed while
    /// Redis was unreachable) claims it again with the user's status. The
    /// node's refresher batches it with other sessions' refreshes and
    /// settles the lease state; anything else comes back as [`Refreshed`].
    pub(super) fn touch(&mut self, ctx: &mut ws::WebsocketContext<Self>) {
        self.liveness.last_activity = Instant::now();
        self.liveness.alive.store(now_ms(), Ordering::Relaxed);
        let lease = &mut self.lease;
        if !lease.claimed
            || lease.state.refreshing()
            || lease.last_refresh.elapsed() < self.node.config.refresh_interval()
        {
            return;
        }
        lease.state.start();
        // Stamped when it starts: under load a slow round trip must not
        // make every frame meanwhile count as due.
        lease.last_refresh = Instant::now();
        let known = lease.known_status.as_deref().cloned();
        let state = lease.state.clone();
        let request = Lease {
            user: self.me.user.clone(),
            device: self.me.device.clone(),
            owner: self.me.owner.clone(),
            known,
            rooms: self.room_names(),
            kind: Some(self.me.kind),
        };
        self.node
            .refresher
            .refresh(request, state, ctx.address().recipient());
    }
}

impl Handler<Refreshed> for Session {
    type Result = ();

    /// A refresh came back with something to act on: the lease was lost,
    /// re-asserted or found with another status, or the refresh failed.
    fn handle(&mut self, Refreshed(res): Refreshed, ctx: &mut Self::Context) {
        self.lease.state.finish();
        let Me { user, device, .. } = &self.me;
        match res {
            Ok(Arrival::Held {
                came_online,
                status,
                lost_rooms,
                ..
            }) => {
                // A pausing session joins nothing again: its rooms are the
                // device's next connection's.
                if !lost_rooms.is_empty() && !self.lease.state.leaving() {
                    self.rejoin_rooms(&lost_rooms, ctx);
                }
                if status.is_some() {
                    let was_hidden = self.hidden();
                    self.lease.known_status = status.map(Box::new);
                    // Another device of the user changed its status.
                    if self.hidden() != was_hidden {
                        self.visibility_changed();
                    }
                }
                if came_online {
                    log::info!("{}/{}: lease re-asserted", self.me.user, self.me.device);
                }
            }
            Ok(Arrival::Replaced | Arrival::TooManyDevices) => {
                log::debug!("{user}/{device}: replaced by a newer connection");
                self.lease.claimed = false;
                close(
                    ctx,
                    ws::CloseCode::Other(CLOSE_REPLACED),
                    "device connected elsewhere",
                );
            }
            Err(e) => log::warn!("{user}/{device}: lease refresh failed: {e}"),
        }
    }
}

impl Session {
    /// The connect claim came back.
    pub(super) fn claimed(
        &mut self,
        res: StoreResult<Arrival>,
        ctx: &mut ws::WebsocketContext<Self>,
    ) {
        let Me { user, device, .. } = &self.me;
        match res {
            Ok(Arrival::Held {
                status, deadline, ..
            }) => {
                self.lease.claimed = true;
                crate::metrics::METRICS.devices.inc();
                self.lease.state.set_deadline(deadline);
                self.lease.known_status = status.map(Box::new);
                self.lease.last_refresh = Instant::now();
                log::debug!("{user}/{device}: connected");
                self.greet(ctx);
            }
            Ok(Arrival::TooManyDevices) => {
                let limit = self.node.config.max_devices_per_user;
                log::debug!("{user}/{device}: refused, {limit} devices already");
                self.send_error(
                    ctx,
                    &ProtocolError::new(
                        ErrorCode::TooManyDevices,
                        format!("a user may have at most {limit} devices connected"),
                    ),
                );
                close(ctx, ws::CloseCode::Policy, "too many devices");
            }
            other => {
                log::warn!("{user}/{device}: cannot claim lease: {other:?}");
                self.send_error(ctx, &unavailable());
                // Redis answered too late: the node is behind, and its
                // clients come back after the wait the close names.
                let (code, reason) = match &other {
                    Err(e) if e.is_timeout() => (
                        CLOSE_TRY_AGAIN,
                        try_again_reason("presence store slow", TRY_AGAIN_AFTER_MS),
                    ),
                    _ => (CLOSE_UNAVAILABLE, "presence store unavailable".to_string()),
                };
                close(ctx, ws::CloseCode::Other(code), &reason);
            }
        }
    }
}

impl Session {
    /// Sends `hello` with the user's own record as the user sees it (a
    /// status set earlier on another device is this device's too, so a
    /// fresh client knows it at once), then takes requests.
    fn greet(&mut self, ctx: &mut ws::WebsocketContext<Self>) {
        let store = self.node.store.clone();
        let user = self.me.user.clone();
        let read = async move {
            store
                .presences(std::slice::from_ref(&user), Some(&user))
                .await
        };
        ctx.spawn(read.into_actor(self).map(|own, act, ctx| {
            let own = match own {
                Ok(own) => own.first().map(|o| act.observe(o)),
                Err(e) => {
                    log::warn!(
                        "{}/{}: reading the own record for hello failed: {e}",
                        act.me.user,
                        act.me.device
                    );
                    None
                }
            };
            let config = &act.node.config;
            let hello = protocol::hello_frame(
                &act.me.user,
                &act.me.device,
                config.heartbeat.as_millis() as u64,
                config.ttl.as_millis() as u64,
                own.as_ref(),
            );
            act.send(ctx, hello);
            // After `hello`, so that a token already close to its
            // expiry is warned about after the greeting, not before.
            act.schedule_expiry(ctx);
            act.requests.ready = true;
            act.next_request(ctx);
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn limiter_refuses_past_the_burst_then_calls_a_flood() {
        let start = Instant::now();
        let mut limiter = FrameLimiter::new(2, start);
        // A burst of twice the rate passes.
        for _ in 0..4 {
            assert_eq!(limiter.take(start), Admission::Admitted);
        }
        assert_eq!(limiter.take(start), Admission::RefusedFirst);
        for _ in 0..(2 * FLOOD_CLOSE_FACTOR - 1) {
            assert_eq!(limiter.take(start), Admission::Refused);
        }
        assert_eq!(limiter.take(start), Admission::Flood);
        // Half a second refills one token.
        let later = start + Duration::from_millis(500);
        assert_eq!(limiter.take(later), Admission::Admitted);
    }
}
