//! The session actor, one per WebSocket: one device of one user.
//!
//! It owns the device's lease: claims it on connect, refreshes it on client
//! frames and pongs (throttled), pings the client every heartbeat and closes
//! a client that stops answering, and on close releases the device through
//! the atomic departure step, which leaves a lease alone that a newer
//! connection of the same device has taken over.
//!
//! A session never pauses its mailbox on Redis. Client requests that need a
//! Redis round trip (watch, status, privacy, and the registry's re-reads)
//! wait in [`Requests`] and run one at a time, in order, while events,
//! pings and pongs keep flowing; a slow Redis slows the answers, not the
//! delivery of everything else.

mod close;
mod liveness;
mod pause;
mod requests;
mod room_join;
mod room_proxy;
mod room_token;
mod rooms;
mod seen;
mod stream;
mod token;
mod watches;

use crate::rooms::Rooms;
use close::close;
pub use close::{Refused, CLOSE_REPLACED, CLOSE_TOKEN_EXPIRED, CLOSE_UNAVAILABLE};
use liveness::FrameLimiter;
use seen::Watches;
use std::sync::atomic::{AtomicI64, AtomicUsize};
use std::sync::Arc;
use std::time::Instant;
use watches::Requests;

use actix::prelude::*;
use actix_web_actors::ws;

use crate::admission::{ConnGuard, PendingGuard};
use crate::auth::Auth;
use bytestring::ByteString;

use crate::bucket::TokenBucket;
use crate::conn::ConnHandle;
use crate::frames::Fragments;
use crate::lease::{release, release_with, Busy, LeaseState};
use crate::model::{ChosenStatus, DeviceKind, Status};
use crate::node::Node;
use crate::protocol::{
    try_again_reason, ErrorCode, ProtocolError, CLOSE_TRY_AGAIN, TRY_AGAIN_AFTER_MS,
};
use crate::registry::fanout;
use crate::registry::{self, End, SessionId};
use crate::store::{now_ms, Arrival, StoreResult};

/// Sustained flooding this many times the allowed rate, within one refill
/// of the bucket, closes the session instead of refusing frame by frame.
const FLOOD_CLOSE_FACTOR: u32 = 5;
/// Requests that may wait for Redis behind the one in flight; past this a
/// client gets `rate_limited` (the frame limiter bounds the rate, this
/// bounds what a stalled Redis lets pile up).
const MAX_PENDING_REQUESTS: usize = 32;

/// One WebSocket connection, its state grouped by what it is for.
pub struct Session {
    /// Who this connection is; fixed for its life.
    me: Me,
    /// The node's shared parts this session talks to (one copy per node:
    /// a copy per session cost every connection about 180 B).
    node: Arc<Node>,
    /// The device lease this connection holds.
    lease: LeaseHold,
    /// When the client was last heard from.
    liveness: Liveness,
    /// The watched users and what the client was last told of each.
    watches: Watches,
    /// Requests waiting for Redis, answered in order.
    requests: Requests,
    /// Token bucket over client frames.
    limiter: FrameLimiter,
    /// Token bucket over the users this session's watches read from Redis.
    reads: TokenBucket,
    /// A message arriving in fragments.
    fragments: Fragments,
    /// Handle on the TCP connection, handed to the registry (at start) to
    /// cut it when this session falls too far behind.
    conn: Option<ConnHandle>,
    /// With JWT auth: the token's state and the timers of its expiry
    /// (boxed: most deployments, and every idle session, never use it).
    token: Option<Box<TokenClock>>,
    /// The rooms this device is in (boxed, made on the first join: most
    /// sessions are in none).
    rooms: Option<Box<Rooms>>,
    /// Its place in its client address's count of open WebSockets, given
    /// back when the session ends.
    _admitted: Option<ConnGuard>,
}

/// Where a session stands with its token (JWT auth only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenState {
    /// The handshake carried no token: the first frame must be `auth`, with
    /// a token for `asked` (the handshake's `user=`) if that was given.
    Awaited {
        /// The user the handshake asked for, if any.
        asked: Option<String>,
    },
    /// The first frame's token is being verified; frames that come
    /// meanwhile are taken in as usual (requests wait for the claim).
    Verifying,
    /// Verified; the token's `exp`, epoch seconds.
    Valid(u64),
}

/// A session's token and what hangs on its expiry.
struct TokenClock {
    /// Verifies the fresh tokens the client sends.
    auth: Arc<Auth>,
    /// Awaited, or valid until when.
    state: TokenState,
    /// The pending `auth_expiring` notice and expiry close.
    timers: Vec<SpawnHandle>,
    /// The rooms the token's rooms claim lists (`--room-policy claim`).
    rooms: Vec<String>,
    /// Until the first token is verified: the connection's place among
    /// those awaiting auth, and its smaller frame limit.
    pre_auth: Option<PreAuth>,
}

/// A connection that has not authenticated yet (its handshake carried no
/// token): it holds a place among the node's sockets awaiting auth, and its
/// codec refuses frames over `--max-auth-frame-bytes` until the token is
/// verified, when the limit becomes `--max-frame-bytes`.
pub struct PreAuth {
    /// Its place among the sockets awaiting auth (dropped once verified).
    pub pending: PendingGuard,
    /// The frame limit its codec reads at every frame.
    pub frame_limit: Arc<AtomicUsize>,
}

/// Who a session is: the registry's key, the user and device, and the
/// value that marks the lease as this connection's.
struct Me {
    /// Unique within this node; the registry's key for this session.
    id: SessionId,
    /// The connected user; with a first-frame token, empty until that
    /// token is verified, then fixed.
    user: String,
    /// The connected device.
    device: String,
    /// Lease value naming this connection (`<node> <conn> <since>`).
    owner: String,
    /// The device's kind (`&kind=` on connect).
    kind: DeviceKind,
}

/// The lease this connection holds, and what a refresh sends with it.
struct LeaseHold {
    /// Whether a lease refresh is in flight, and the deadline last written
    /// to `presence-leases` (epoch ms), which lets the departure remove
    /// exactly our entry and not a newer connection's. Shared with the
    /// node's refresher.
    state: Arc<LeaseState>,
    /// The lease belongs to this connection and must be released on close.
    claimed: bool,
    /// When the last lease refresh started (throttling).
    last_refresh: Instant,
    /// The user's chosen status as last seen in Redis, re-asserted if Redis
    /// comes back without it (boxed: none is stored for most users).
    known_status: Option<Box<ChosenStatus>>,
}

/// When the client was last heard from: a silent client is disconnected.
struct Liveness {
    /// Last client frame or pong.
    last_activity: Instant,
    /// The same, in epoch ms, shared with the registry, which cuts off a
    /// session frozen by a client that stopped reading.
    alive: Arc<AtomicI64>,
    /// A ping is out: the next pong answers it and is free; any other pong
    /// counts against the frame rate like any frame.
    awaiting_pong: bool,
    /// The client sent a frame of its own (anything but the pong answering
    /// our ping) since the last heartbeat tick.
    spoke: bool,
    /// The last heartbeat tick sent no ping, the client having spoken. The
    /// next tick pings whatever the client did.
    skipped_ping: bool,
}

/// Who a new session is.
pub struct Identity {
    /// Unique within this node.
    pub id: SessionId,
    /// The connected user.
    pub user: String,
    /// The connected device.
    pub device: String,
    /// Its lease value (`<node> <conn> <since>`).
    pub owner: String,
    /// The status to arrive with when none is stored yet.
    pub status: Option<Status>,
    /// The device's kind.
    pub kind: DeviceKind,
    /// With JWT auth: the verifier, and the token's state at the handshake.
    pub token: Option<(Arc<Auth>, TokenState)>,
    /// The rooms its token's rooms claim lists.
    pub rooms: Vec<String>,
    /// Its place in its address's count of open WebSockets.
    pub admitted: Option<ConnGuard>,
    /// Without a token on the handshake: what it holds until its `auth` frame.
    pub pre_auth: Option<PreAuth>,
}

impl Session {
    /// A session for `who` on connection `conn`.
    pub fn new(who: Identity, node: Arc<Node>, conn: Option<ConnHandle>) -> Self {
        let now = Instant::now();
        Self {
            me: Me {
                id: who.id,
                user: who.user,
                device: who.device,
                owner: who.owner,
                kind: who.kind,
            },
            lease: LeaseHold {
                state: Arc::default(),
                claimed: false,
                last_refresh: now,
                // Since 0: applied only where no status is stored at all.
                known_status: who.status.map(|s| {
                    Box::new(ChosenStatus {
                        status: s.as_str().to_string(),
                        ..ChosenStatus::default()
                    })
                }),
            },
            liveness: Liveness {
                last_activity: now,
                alive: Arc::new(AtomicI64::new(now_ms())),
                awaiting_pong: false,
                spoke: false,
                skipped_ping: false,
            },
            watches: Watches::default(),
            requests: Requests::default(),
            limiter: FrameLimiter::new(node.config.max_frames_per_sec, now),
            reads: TokenBucket::new(
                node.config.max_user_reads_per_sec,
                node.config.user_reads_burst(),
            ),
            fragments: Fragments::default(),
            node,
            conn,
            token: who.token.map(|(auth, state)| {
                Box::new(TokenClock {
                    auth,
                    state,
                    timers: Vec::new(),
                    rooms: who.rooms.clone(),
                    pre_auth: who.pre_auth,
                })
            }),
            rooms: None,
            _admitted: who.admitted,
        }
    }

    /// Queues a text frame for the client.
    fn send(&mut self, ctx: &mut ws::WebsocketContext<Self>, frame: impl Into<ByteString>) {
        ctx.text(frame.into());
    }
}

fn unavailable() -> ProtocolError {
    ProtocolError::new(
        ErrorCode::Unavailable,
        "presence store unavailable, try again",
    )
}

impl Actor for Session {
    type Context = ws::WebsocketContext<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        // Bounded, so that a client that stops reading cannot grow the
        // server's memory: the registry cuts it off when this fills up.
        ctx.set_mailbox_capacity(self.node.config.max_queued_events);
        if self.awaiting_auth() {
            self.await_auth(ctx);
            return;
        }
        self.begin(ctx);
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        self.release_on_stop();
    }
}

impl Session {
    /// Closes a session the node sheds before its claim: it comes back
    /// after the wait the close names.
    fn shed(&mut self, busy: Busy, ctx: &mut ws::WebsocketContext<Self>) {
        crate::metrics::METRICS.admission.connections_shed.inc();
        let Me { user, device, .. } = &self.me;
        log::debug!(
            "{user}/{device}: shed, the node has its most sessions setting up (--max-pending-claims); asked to wait {} ms",
            busy.retry_after_ms
        );
        close(
            ctx,
            ws::CloseCode::Other(CLOSE_TRY_AGAIN),
            &try_again_reason("server busy", busy.retry_after_ms),
        );
    }

    /// The session proper, once the user is known: join the registry,
    /// ping, claim the lease (then greet, and watch the token's expiry).
    fn begin(&mut self, ctx: &mut ws::WebsocketContext<Self>) {
        // A node with its most claims out sheds the session before any
        // Redis work: it comes back after the wait the close names.
        let claim = match self.claim() {
            Ok(claim) => claim,
            Err(busy) => return self.shed(busy, ctx),
        };
        // Events come through this worker's delivery lists.
        fanout::register(self.me.id, ctx.address().recipient());
        self.node.registry.do_send(registry::Join {
            session: self.me.id,
            addr: ctx.address().recipient(),
            conn: self.conn.take(),
            alive: self.liveness.alive.clone(),
            home: fanout::Home::current(),
        });
        self.hb(ctx);
        // Frames that come meanwhile are taken in; requests among them wait
        // for the claim (see [`Requests`]).
        // The claim outlives the session: one that closes while its claim
        // is in Redis has the lease the claim took released after it, not
        // left online for a TTL. (Unless the node is going away: leases
        // then lapse, see [`End::GoingAway`].)
        let addr = ctx.address();
        let store = self.node.store.clone();
        let state = self.lease.state.clone();
        let Me {
            user,
            device,
            owner,
            ..
        } = &self.me;
        let (user, device, owner) = (user.clone(), device.clone(), owner.clone());
        log::debug!("{user}/{device}: claiming the lease");
        actix::spawn(async move {
            let res = claim.await;
            // Nothing was written by a refused claim; an error leaves it
            // unknown, and the release is safe either way. A failed claim
            // is released here even when the session took the outcome: it
            // closes with 1011 holding no lease, yet the claim may still be
            // in Redis (timed out in the node, not in Redis) and take the
            // lease after, announcing a device that has no connection.
            let (deadline, failed) = match &res {
                Ok(Arrival::Held { deadline, .. }) => (Some(*deadline), false),
                Ok(_) => (None, false),
                // Except one that timed out: its session closes with 1013,
                // which asks the client to come back within seconds, and
                // its next connection takes the lease over with no
                // transition. Released, a device that was online (its old
                // connection's lease still held, as after a node died)
                // would flap offline and online for its watchers. A client
                // that never comes back lapses after the TTL, as after a
                // node died.
                Err(e) if e.is_timeout() => (None, false),
                Err(_) => (Some(0), true),
            };
            let taken = addr.send(Claimed(res)).await.is_ok();
            if let Some(deadline) = deadline.filter(|_| (failed || !taken) && !state.leaving()) {
                log::debug!("{user}/{device}: closed while claiming; releasing after the claim");
                release_with(store, user, device, owner, deadline, !failed).await;
            }
        });
    }

    /// The connection closed: leave the registry and release the lease.
    fn release_on_stop(&mut self) {
        self.first_request_done();
        fanout::unregister(self.me.id);
        // The deadline is set once the lease was claimed (`claimed` may be
        // cleared since, by a shutdown or a takeover).
        if self.lease.state.deadline() != 0 {
            crate::metrics::METRICS.devices.dec();
        }
        self.node.registry.do_send(registry::Disconnect {
            session: self.me.id,
        });
        let Me { user, device, .. } = &self.me;
        if !self.lease.claimed {
            log::debug!("{user}/{device}: closed without a lease to release");
            return;
        }
        self.leave_rooms_on_stop();
        let Me {
            user,
            device,
            owner,
            ..
        } = &mut self.me;
        if !self.lease.state.close() {
            log::debug!("{user}/{device}: closed; released once its refresh is answered");
            return;
        }
        actix::spawn(release(
            self.node.store.clone(),
            std::mem::take(user),
            std::mem::take(device),
            std::mem::take(owner),
            self.lease.state.deadline(),
        ));
    }
}

/// The outcome of this connection's claim of its lease.
#[derive(Message)]
#[rtype(result = "()")]
struct Claimed(StoreResult<Arrival>);

impl Handler<Claimed> for Session {
    type Result = ();

    fn handle(&mut self, Claimed(res): Claimed, ctx: &mut Self::Context) {
        self.claimed(res, ctx);
    }
}

impl Handler<End> for Session {
    type Result = ();

    fn handle(&mut self, end: End, ctx: &mut Self::Context) {
        match end {
            // The node is shutting down for a deploy: tell the client to
            // reconnect elsewhere and leave the lease to lapse, so that a
            // device that is back on another node within its TTL shows no
            // transition at all.
            End::GoingAway => {
                self.lease.claimed = false;
                self.lease.state.leave();
                close(ctx, ws::CloseCode::Away, "server shutting down, reconnect");
            }
            End::Taken { user, device, why } => self.taken(&user, &device, why, ctx),
        }
    }
}

impl Session {
    /// The device's lease was taken from this connection from outside it
    /// (a `DELETE`, or an HTTP heartbeat), as a refresh would have found
    /// out later: close with 4001 at once. Nothing is released: the lease
    /// is no longer ours, and the memberships are either gone already
    /// (`DELETE` took the device out of its rooms) or left to the device's
    /// next connection, as after any takeover.
    fn taken(
        &mut self,
        user: &str,
        device: &str,
        why: crate::store::TakenWhy,
        ctx: &mut ws::WebsocketContext<Self>,
    ) {
        // The word names the lease value, this session's id; the user and
        // device must agree too (a value of an earlier node of the same run).
        if (user, device) != (self.me.user.as_str(), self.me.device.as_str()) {
            log::debug!(
                "{}/{}: word that {user}/{device} was taken is not about this session",
                self.me.user,
                self.me.device
            );
            return;
        }
        log::debug!("{user}/{device}: taken from this connection ({why:?})");
        self.lease.claimed = false;
        let reason = match why {
            crate::store::TakenWhy::Removed => "device removed",
            crate::store::TakenWhy::Replaced => "device connected elsewhere",
        };
        close(ctx, ws::CloseCode::Other(CLOSE_REPLACED), reason);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every WebSocket holds one `Session` inside actix's context for its
    /// whole life, in one allocation with about 416 B of actix's own (the
    /// context future, its codec and buffer): at 680 B the whole came to
    /// 1,096 B, jemalloc's 1,280 B class. Cold parts are boxed and the
    /// node's parts shared so that it fits the 896 B class; this keeps it
    /// there (BENCHMARKS.md, memory per connection).
    #[test]
    fn a_session_stays_small() {
        let size = std::mem::size_of::<Session>();
        assert!(size <= 448, "Session is {size} B");
        let whole =
            std::mem::size_of::<actix::dev::ContextFut<Session, ws::WebsocketContext<Session>>>();
        assert!(whole <= 840, "the session's context future is {whole} B");
    }

    /// Every watch holds a `Seen` in its session's table (issue 29, memory
    /// per watch): 24 B, with the key 32 B a slot; it was 32 B while it
    /// held the rarely used non-contact view (now [`seen::Watches`]'s
    /// `strangers`).
    #[test]
    fn a_watch_stays_small() {
        assert_eq!(std::mem::size_of::<seen::Seen>(), 24);
    }
}
