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

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use actix::prelude::*;
use actix_web_actors::ws;

use crate::auth::{Auth, AuthError};
use crate::config::Config;
use bytestring::ByteString;

use crate::bucket::TokenBucket;
use crate::conn::ConnHandle;
use crate::registry::fanout;
use crate::frames::{Assembled, Fragments};
use crate::model::{Audience, ChosenStatus, Record, Status};
use crate::privacy::{self, Relation};
use crate::protocol::{self, ClientFrame, ErrorCode, ProtocolError};
use crate::lease::{release, release_with, LeaseState, Refreshed, Refresher};
use crate::registry::{self, Deliver, GoingAway, Recheck, Registry, SessionId};
use crate::store::{now_ms, Arrival, ArriveMode, Lease, Observed, Store, StoreResult};

/// Close code sent when another connection of the same device took the lease.
pub const CLOSE_REPLACED: u16 = 4001;
/// Close code sent when the lease cannot be claimed (Redis unreachable).
pub const CLOSE_UNAVAILABLE: u16 = 1011;
/// Close code sent when the session's token expired and no fresh one came.
pub const CLOSE_TOKEN_EXPIRED: u16 = 4401;
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
    node: Arc<NodeParts>,
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
}

/// The node-wide parts a session uses, cloned in at start.
pub struct NodeParts {
    /// Redis state.
    pub store: Store,
    /// Batches this node's lease refreshes.
    pub refresher: Refresher,
    /// This node's registry.
    pub registry: Addr<Registry>,
    /// Timings and limits.
    pub config: Arc<Config>,
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

/// The users this client watches.
#[derive(Default)]
struct Watches {
    /// Watched users -> what this client was last told about them.
    seen: HashMap<String, Seen>,
    /// Events that arrived for a user whose snapshot read is still in
    /// flight, the newest per user; delivered after the snapshot, which
    /// drops those it already covers. Empty almost always.
    early: HashMap<String, Deliver>,
}

/// What a session last told its client about one watched user.
#[derive(Debug, Clone, Copy)]
struct Seen {
    /// Highest transition sequence number reflected: older events (ones a
    /// snapshot already covered) are dropped.
    seq: u64,
    /// Fingerprint of the last record sent: a record that looks the same
    /// (e.g. `online` re-announced after a Redis restart) is not sent again.
    fingerprint: u64,
    /// How this session's user stands to the watched one: which view of
    /// each transition it gets.
    relation: Relation,
    /// Asked for, but its snapshot has not been read yet: events for it
    /// are held in [`Watches::early`] until it has.
    pending: bool,
    /// The client asked for this user's device counts (`"devices":true`):
    /// a change of the count alone is news to it.
    devices: bool,
}

impl Seen {
    /// What this client can tell apart in `record`.
    fn fingerprint_of(&self, record: &Record) -> u64 {
        if self.devices {
            registry::devices_fingerprint(record)
        } else {
            registry::fingerprint(record)
        }
    }
}

impl Default for Seen {
    fn default() -> Self {
        Self {
            seq: 0,
            fingerprint: 0,
            relation: Relation::Other,
            pending: false,
            devices: false,
        }
    }
}

/// Client requests that need a Redis round trip. They run one at a time in
/// arrival order, so that answers keep the order of the questions (a watch
/// is answered by its snapshot before the next request's answer), and only
/// once the lease is claimed, so that `hello` comes first.
#[derive(Default)]
struct Requests {
    /// Waiting, oldest first.
    queue: VecDeque<Request>,
    /// One is in flight.
    busy: bool,
    /// The connect claim succeeded; requests may run.
    ready: bool,
}

/// One request waiting for Redis.
enum Request {
    /// Register `new` with the registry, then read and send their
    /// snapshot (users watched before are not read again).
    Watch {
        /// The users not watched before the frame, sorted (and those
        /// watched before whose device counts are now asked for).
        new: Vec<String>,
        /// The frame asked for device counts.
        devices: bool,
    },
    /// Set the user's status.
    Status {
        /// The chosen status.
        status: Status,
        /// Its text.
        text: Option<String>,
    },
    /// Change the user's privacy settings.
    Privacy {
        /// Who may see the user online.
        online: Option<Audience>,
        /// Who may see the user's last seen.
        last_seen: Option<Audience>,
    },
    /// Re-read a watched user whose contacts changed.
    Recheck {
        /// The watched user.
        user: String,
    },
}

/// Token bucket over client frames.
struct FrameLimiter {
    /// Client frames this session may still send now.
    tokens: f64,
    /// When `tokens` was last refilled.
    refilled: Instant,
    /// Frames refused since the bucket last had a token.
    refused: u32,
}

/// What [`FrameLimiter::take`] decided about one frame.
#[derive(Debug, PartialEq, Eq)]
enum Admission {
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
    fn new(rate: u32, now: Instant) -> Self {
        Self {
            tokens: f64::from(rate) * 2.0,
            refilled: now,
            refused: 0,
        }
    }

    /// Takes a token for one frame at `rate` frames per second.
    fn take(&mut self, rate: u32, now: Instant) -> Admission {
        let per_sec = f64::from(rate);
        let elapsed = now.duration_since(self.refilled).as_secs_f64();
        self.refilled = now;
        self.tokens = (self.tokens + elapsed * per_sec).min(per_sec * 2.0);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            self.refused = 0;
            return Admission::Admitted;
        }
        self.refused += 1;
        if self.refused == 1 {
            Admission::RefusedFirst
        } else if self.refused > rate * FLOOD_CLOSE_FACTOR {
            Admission::Flood
        } else {
            Admission::Refused
        }
    }
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
    /// With JWT auth: the verifier, and the token's state at the handshake.
    pub token: Option<(Arc<Auth>, TokenState)>,
}

impl Session {
    /// A session for `who` on connection `conn`.
    pub fn new(who: Identity, node: Arc<NodeParts>, conn: Option<ConnHandle>) -> Self {
        let now = Instant::now();
        Self {
            me: Me {
                id: who.id,
                user: who.user,
                device: who.device,
                owner: who.owner,
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
                })
            }),
        }
    }

    /// Queues a text frame for the client.
    fn send(&mut self, ctx: &mut ws::WebsocketContext<Self>, frame: impl Into<ByteString>) {
        ctx.text(frame.into());
    }

    /// Takes a token for one client frame (and notes that the client spoke).
    /// Returns false when the frame is to be refused; a sustained flood
    /// closes the session with 1008.
    fn admit(&mut self, ctx: &mut ws::WebsocketContext<Self>) -> bool {
        self.liveness.spoke = true;
        let rate = self.node.config.max_frames_per_sec;
        match self.limiter.take(rate, Instant::now()) {
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
                ctx.close(Some(ws::CloseReason {
                    code: ws::CloseCode::Policy,
                    description: Some("too many frames".into()),
                }));
                ctx.stop();
            }
        }
        false
    }

    /// Pings the client every heartbeat (every other one while the client
    /// sends frames of its own); stops a client that went silent.
    /// After a freeze of the node (its clock jumped), the client gets a
    /// fresh timeout: the silence was the node's, not the client's.
    fn hb(&self, ctx: &mut ws::WebsocketContext<Self>) {
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

    /// The arrival step for this connection, as a future.
    fn arrive(&self, mode: ArriveMode) -> impl Future<Output = StoreResult<Arrival>> + 'static {
        let store = self.node.store.clone();
        let me = &self.me;
        let (user, device, owner) = (me.user.clone(), me.device.clone(), me.owner.clone());
        let known = self.lease.known_status.as_deref().cloned();
        async move {
            store
                .arrive(&user, &device, &owner, mode, known.as_ref())
                .await
        }
    }

    /// The client is alive: note it and refresh the lease if due. A refresh
    /// that finds the lease gone (Redis restarted empty, or it lapsed while
    /// Redis was unreachable) claims it again with the user's status. The
    /// node's refresher batches it with other sessions' refreshes and
    /// settles the lease state; anything else comes back as [`Refreshed`].
    fn touch(&mut self, ctx: &mut ws::WebsocketContext<Self>) {
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
        let request = Lease {
            user: self.me.user.clone(),
            device: self.me.device.clone(),
            owner: self.me.owner.clone(),
            known: lease.known_status.as_deref().cloned(),
        };
        self.node
            .refresher
            .refresh(request, lease.state.clone(), ctx.address().recipient());
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
                ..
            }) => {
                if status.is_some() {
                    self.lease.known_status = status.map(Box::new);
                }
                if came_online {
                    log::info!("{user}/{device}: lease re-asserted");
                }
            }
            Ok(Arrival::Replaced | Arrival::TooManyDevices) => {
                log::debug!("{user}/{device}: replaced by a newer connection");
                self.lease.claimed = false;
                ctx.close(Some(ws::CloseReason {
                    code: ws::CloseCode::Other(CLOSE_REPLACED),
                    description: Some("device connected elsewhere".into()),
                }));
                ctx.stop();
            }
            Err(e) => log::warn!("{user}/{device}: lease refresh failed: {e}"),
        }
    }
}

impl Session {
    fn send_error(&mut self, ctx: &mut ws::WebsocketContext<Self>, err: &ProtocolError) {
        self.send(ctx, err.to_frame());
    }

    fn handle_frame(&mut self, frame: ClientFrame, ctx: &mut ws::WebsocketContext<Self>) {
        match frame {
            ClientFrame::Watch { users, devices } => self.watch(users, devices, ctx),
            ClientFrame::Unwatch { users } => {
                for user in &users {
                    self.watches.seen.remove(user);
                    self.watches.early.remove(user);
                }
                self.node.registry.do_send(registry::Unwatch {
                    session: self.me.id,
                    users,
                });
            }
            ClientFrame::Status { status, text } => {
                // Already validated by the parser.
                let Ok(status) = Status::parse(&status) else {
                    return;
                };
                self.request(Request::Status { status, text }, ctx);
            }
            ClientFrame::Heartbeat => {}
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

    /// Checks a watch against the limit, marks its new users pending and
    /// queues it; the snapshot follows when its turn comes.
    fn watch(
        &mut self,
        mut users: Vec<String>,
        devices: bool,
        ctx: &mut ws::WebsocketContext<Self>,
    ) {
        users.sort();
        users.dedup();
        let new: Vec<String> = users
            .iter()
            .filter(|u| !self.watches.seen.contains_key(*u))
            .cloned()
            .collect();
        // Users watched before whose device counts are now asked for are
        // read again, like new ones: the client's record of them may lack
        // a count that changed meanwhile.
        let upgraded: Vec<String> = users
            .iter()
            .filter(|u| devices && self.watches.seen.get(*u).is_some_and(|s| !s.devices))
            .cloned()
            .collect();
        let max = self.node.config.max_watches;
        let watching = self.watches.seen.len();
        if watching + new.len() > max {
            let err = ProtocolError::new(
                ErrorCode::TooManyWatches,
                format!(
                    "a session may watch at most {max} users (watching {watching}, asked for {} more)",
                    new.len()
                ),
            );
            self.send_error(ctx, &err);
            return;
        }
        // Users already watched are current through live events: only new
        // ones are read (in start_watch), and reads are bounded per second.
        if let Err(wait) = self
            .reads
            .take(u32::try_from(new.len() + upgraded.len()).unwrap_or(u32::MAX))
        {
            let err = ProtocolError::new(
                ErrorCode::RateLimited,
                format!(
                    "watching {} new users needs that many reads; a session may read {} users per second: try again in {} ms",
                    new.len(),
                    self.node.config.max_user_reads_per_sec,
                    wait.as_millis()
                ),
            );
            self.send_error(ctx, &err);
            return;
        }
        for user in &new {
            let seen = Seen {
                pending: true,
                devices,
                ..Seen::default()
            };
            self.watches.seen.insert(user.clone(), seen);
        }
        for user in &upgraded {
            if let Some(seen) = self.watches.seen.get_mut(user) {
                seen.devices = true;
            }
        }
        let mut new = new;
        new.extend(upgraded);
        new.sort();
        self.request(Request::Watch { new, devices }, ctx);
    }

    /// Queues a request for Redis and starts it if nothing is in flight.
    fn request(&mut self, request: Request, ctx: &mut ws::WebsocketContext<Self>) {
        if self.requests.queue.len() >= MAX_PENDING_REQUESTS {
            if let Request::Watch { new, .. } = &request {
                self.forget_pending(new);
            }
            let err = ProtocolError::new(
                ErrorCode::RateLimited,
                format!(
                    "{MAX_PENDING_REQUESTS} requests are already waiting for the presence store; try again"
                ),
            );
            self.send_error(ctx, &err);
            return;
        }
        self.requests.queue.push_back(request);
        self.next_request(ctx);
    }

    /// Starts the oldest waiting request, unless one is in flight or the
    /// lease is not claimed yet.
    fn next_request(&mut self, ctx: &mut ws::WebsocketContext<Self>) {
        if self.requests.busy || !self.requests.ready {
            return;
        }
        let Some(request) = self.requests.queue.pop_front() else {
            return;
        };
        self.requests.busy = true;
        match request {
            Request::Watch { new, devices } => self.start_watch(new, devices, ctx),
            Request::Status { status, text } => self.start_status(status, text, ctx),
            Request::Privacy { online, last_seen } => self.start_privacy(online, last_seen, ctx),
            Request::Recheck { user } => self.start_recheck(user, ctx),
        }
    }

    /// The request in flight is answered: start the next one.
    fn request_done(&mut self, ctx: &mut ws::WebsocketContext<Self>) {
        self.requests.busy = false;
        self.next_request(ctx);
    }

    /// Registers the watch (the registry answers once the node is
    /// subscribed to the new users' events), then reads the snapshot:
    /// subscribed first, so that no transition falls between the read and
    /// the subscription. Only users new to the session are read.
    fn start_watch(
        &mut self,
        new: Vec<String>,
        devices: bool,
        ctx: &mut ws::WebsocketContext<Self>,
    ) {
        // An unwatch that came while this waited its turn wins. A user
        // watched before whose device counts this frame asked for is read
        // again, its events held until then like a new one's.
        let new: Vec<String> = new
            .into_iter()
            .filter(|u| match self.watches.seen.get_mut(u) {
                Some(seen) if seen.pending => true,
                Some(seen) if devices && seen.devices => {
                    seen.pending = true;
                    true
                }
                _ => false,
            })
            .collect();
        if new.is_empty() {
            self.send(ctx, protocol::snapshot_frame(&[]));
            return self.request_done(ctx);
        }
        let registry = self.node.registry.clone();
        let store = self.node.store.clone();
        let session = self.me.id;
        let watch = registry::Watch {
            session,
            recheck: ctx.address().recipient(),
            users: new.clone(),
            devices,
        };
        let viewer = self.me.user.clone();
        let fut = async move {
            match registry.send(watch).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    log::warn!("cannot subscribe to watched users' events: {e}");
                    registry.do_send(registry::Unwatch {
                        session,
                        users: new.clone(),
                    });
                    return Err(new);
                }
                Err(e) => {
                    log::error!("registry unreachable: {e}");
                    return Err(new);
                }
            }
            match store.presences(&new, Some(&viewer)).await {
                Ok(records) => Ok(records),
                Err(e) => {
                    log::warn!("snapshot failed: {e}");
                    // Undo what this frame added; earlier watches stay.
                    registry.do_send(registry::Unwatch {
                        session,
                        users: new.clone(),
                    });
                    Err(new)
                }
            }
        };
        ctx.spawn(fut.into_actor(self).map(|res, act, ctx| {
            match res {
                Ok(observed) => {
                    let out: Vec<Record> = observed.iter().map(|o| act.observe(o)).collect();
                    act.send(ctx, protocol::snapshot_frame(&out));
                    let early: Vec<Deliver> = observed
                        .iter()
                        .filter_map(|o| act.watches.early.remove(&o.presence.user))
                        .collect();
                    for deliver in early {
                        act.deliver(deliver, ctx);
                    }
                }
                Err(new) => {
                    act.forget_pending(&new);
                    act.send_error(ctx, &unavailable());
                }
            }
            act.request_done(ctx);
        }));
    }

    /// Drops watches that were asked for but never answered.
    fn forget_pending(&mut self, users: &[String]) {
        for user in users {
            if self.watches.seen.get(user).is_some_and(|s| s.pending) {
                self.watches.seen.remove(user);
            }
            self.watches.early.remove(user);
        }
    }

    fn start_status(
        &mut self,
        status: Status,
        text: Option<String>,
        ctx: &mut ws::WebsocketContext<Self>,
    ) {
        // A session watching its own user holds that user's events until the
        // answer is read, like a snapshot: the event of this change is then
        // dropped as already seen, instead of arriving beside the answer.
        // (One already pending waits for its own snapshot instead.)
        let held = match self.watches.seen.get_mut(&self.me.user) {
            Some(seen) if !seen.pending => {
                seen.pending = true;
                true
            }
            _ => false,
        };
        let store = self.node.store.clone();
        let user = self.me.user.clone();
        let chosen_text = text.clone().unwrap_or_default();
        // Set, then read back as the owner sees it: every accepted status
        // frame is answered with the sender's own record, so a device that
        // does not watch its own user can still confirm the change.
        // A change that Redis made is the session's to re-assert from then
        // on, whether or not the read-back works.
        let set = async move {
            let since = store.set_status(&user, status, text.as_deref()).await?;
            let own = store
                .presences(std::slice::from_ref(&user), Some(&user))
                .await;
            Ok::<_, crate::store::StoreError>((since, own))
        };
        ctx.spawn(set.into_actor(self).map(move |res, act, ctx| {
            match res {
                Ok((since, own)) => {
                    let known = act.lease.known_status.get_or_insert_default();
                    known.status = status.as_str().to_string();
                    known.text = chosen_text;
                    known.since = since;
                    match own {
                        Ok(own) => {
                            if let Some(own) = own.into_iter().next() {
                                let record = act.observe(&own);
                                act.send(ctx, protocol::presence_frame(&record));
                            }
                        }
                        // Setting it again is harmless: the same status
                        // keeps its `since`.
                        Err(e) => {
                            log::warn!("{}: status set, reading it back failed: {e}", act.me.user);
                            act.send_error(ctx, &unavailable());
                        }
                    }
                }
                Err(e) => {
                    log::warn!("{}: status change failed: {e}", act.me.user);
                    act.send_error(ctx, &unavailable());
                }
            }
            if held {
                let me = act.me.user.clone();
                if let Some(seen) = act.watches.seen.get_mut(&me) {
                    seen.pending = false;
                }
                if let Some(event) = act.watches.early.remove(&me) {
                    act.deliver(event, ctx);
                }
            }
            act.request_done(ctx);
        }));
    }

    fn start_privacy(
        &mut self,
        online: Option<Audience>,
        last_seen: Option<Audience>,
        ctx: &mut ws::WebsocketContext<Self>,
    ) {
        let store = self.node.store.clone();
        let user = self.me.user.clone();
        let set = async move { store.set_privacy(&user, online, last_seen).await };
        ctx.spawn(set.into_actor(self).map(move |res, act, ctx| {
            match res {
                Ok(_) => {
                    let known = act.lease.known_status.get_or_insert_default();
                    if let Some(a) = online {
                        known.show_online = a.as_str().to_string();
                    }
                    if let Some(a) = last_seen {
                        known.show_last_seen = a.as_str().to_string();
                    }
                }
                Err(e) => {
                    log::warn!("{}: privacy change failed: {e}", act.me.user);
                    act.send_error(ctx, &unavailable());
                }
            }
            act.request_done(ctx);
        }));
    }

    /// Re-reads a watched user as this viewer and tells the client if what
    /// it may see changed.
    fn start_recheck(&mut self, user: String, ctx: &mut ws::WebsocketContext<Self>) {
        if !self.watches.seen.contains_key(&user) {
            return self.request_done(ctx);
        }
        let store = self.node.store.clone();
        let viewer = self.me.user.clone();
        let read = async move { store.presences(&[user], Some(&viewer)).await };
        ctx.spawn(read.into_actor(self).map(|res, act, ctx| {
            // On failure the next transition or resync brings it.
            for o in res.unwrap_or_default() {
                let Some(before) = act.watches.seen.get(&o.presence.user) else {
                    continue;
                };
                let before = before.fingerprint;
                let record = act.observe(&o);
                let after = act
                    .watches
                    .seen
                    .get(&o.presence.user)
                    .map(|s| s.fingerprint);
                if after.is_some_and(|after| after != before) {
                    act.send(ctx, protocol::presence_frame(&record));
                }
            }
            act.request_done(ctx);
        }));
    }

    /// Takes in a fresh read of a watched user: how this viewer stands to
    /// it, its sequence number, and the view this client now holds. The
    /// view is returned even for a user unwatched meanwhile, whose entry
    /// stays gone.
    fn observe(&mut self, o: &Observed) -> Record {
        let relation = o.relation(Some(&self.me.user), self.node.config.contacts_only);
        let record = privacy::view(&o.presence, relation);
        if let Some(seen) = self.watches.seen.get_mut(&o.presence.user) {
            seen.seq = seen.seq.max(o.seq);
            seen.relation = relation;
            seen.fingerprint = seen.fingerprint_of(&record);
            seen.pending = false;
        }
        record
    }

    /// Passes a transition on to the client if it is news to it.
    fn deliver(&mut self, msg: Deliver, ctx: &mut ws::WebsocketContext<Self>) {
        let Some(seen) = self.watches.seen.get_mut(&*msg.user) else {
            return;
        };
        if seen.pending {
            // Held until the snapshot: keep the newest.
            let early = &mut self.watches.early;
            let newer = early
                .get(&*msg.user)
                .is_none_or(|held| msg.resync || msg.seq >= held.seq);
            if newer {
                early.insert(msg.user.to_string(), msg);
            }
            return;
        }
        // A live event no newer than what the client has is stale (its
        // snapshot covered it); a resync read is newer than every event the
        // registry let through before it, whatever its sequence number.
        if !msg.resync && msg.seq <= seen.seq {
            return;
        }
        seen.seq = seen.seq.max(msg.seq);
        let view = &msg.views[seen.relation.index()];
        let fingerprint = if seen.devices {
            view.devices_fingerprint
        } else {
            view.fingerprint
        };
        if fingerprint == seen.fingerprint {
            return;
        }
        seen.fingerprint = fingerprint;
        crate::metrics::METRICS.transitions_delivered.inc();
        self.send(ctx, view.frame.clone());
    }

    /// The connect claim came back.
    fn claimed(&mut self, res: StoreResult<Arrival>, ctx: &mut ws::WebsocketContext<Self>) {
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
                let config = &self.node.config;
                let hello = protocol::hello_frame(
                    user,
                    device,
                    config.heartbeat.as_millis() as u64,
                    config.ttl.as_millis() as u64,
                );
                self.send(ctx, hello);
                // After `hello`, so that a token already close to its
                // expiry is warned about after the greeting, not before.
                self.schedule_expiry(ctx);
                self.requests.ready = true;
                self.next_request(ctx);
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
                ctx.close(Some(ws::CloseReason {
                    code: ws::CloseCode::Policy,
                    description: Some("too many devices".into()),
                }));
                ctx.stop();
            }
            other => {
                log::warn!("{user}/{device}: cannot claim lease: {other:?}");
                self.send_error(ctx, &unavailable());
                ctx.close(Some(ws::CloseReason {
                    code: ws::CloseCode::Other(CLOSE_UNAVAILABLE),
                    description: Some("presence store unavailable".into()),
                }));
                ctx.stop();
            }
        }
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
    /// The session proper, once the user is known: join the registry,
    /// ping, claim the lease (then greet, and watch the token's expiry).
    fn begin(&mut self, ctx: &mut ws::WebsocketContext<Self>) {
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
        // then lapse, see [`GoingAway`].)
        let claim = self.arrive(ArriveMode::Connect);
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
        fanout::unregister(self.me.id);
        // The deadline is set once the lease was claimed (`claimed` may be
        // cleared since, by a shutdown or a takeover).
        if self.lease.state.deadline() != 0 {
            crate::metrics::METRICS.devices.dec();
        }
        self.node.registry.do_send(registry::Disconnect {
            session: self.me.id,
        });
        let Me {
            user,
            device,
            owner,
            ..
        } = &mut self.me;
        if !self.lease.claimed {
            log::debug!("{user}/{device}: closed without a lease to release");
            return;
        }
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

impl Handler<GoingAway> for Session {
    type Result = ();

    /// The node is shutting down for a deploy: tell the client to reconnect
    /// elsewhere and leave the lease to lapse, so that a device that is back
    /// on another node within its TTL shows no transition at all.
    fn handle(&mut self, _: GoingAway, ctx: &mut Self::Context) {
        self.lease.claimed = false;
        self.lease.state.leave();
        ctx.close(Some(ws::CloseReason {
            code: ws::CloseCode::Away,
            description: Some("server shutting down, reconnect".into()),
        }));
        ctx.stop();
    }
}

impl Handler<Deliver> for Session {
    type Result = ();

    fn handle(&mut self, msg: Deliver, ctx: &mut Self::Context) {
        self.deliver(msg, ctx);
    }
}

impl Handler<Recheck> for Session {
    type Result = ();

    /// The user's contacts changed: what this viewer may see of it may have
    /// changed too; re-read it in turn with the other requests.
    fn handle(&mut self, msg: Recheck, ctx: &mut Self::Context) {
        if self.watches.seen.contains_key(&msg.user) {
            self.request(Request::Recheck { user: msg.user }, ctx);
        }
    }
}

impl StreamHandler<Result<ws::Message, ws::ProtocolError>> for Session {
    fn handle(&mut self, msg: Result<ws::Message, ws::ProtocolError>, ctx: &mut Self::Context) {
        let msg = match msg {
            Ok(msg) => msg,
            Err(e) => {
                let max = self.node.config.max_frame_bytes;
                let (code, reason) = crate::frames::close_for(&e, max);
                log::debug!(
                    "{}/{}: closing with {code:?}: {e}",
                    self.me.user,
                    self.me.device
                );
                self.close_with(ctx, code, reason);
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
                        self.close_with(ctx, code, reason);
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

/// Token lifetime (JWT auth): the first-frame deadline, `auth_expiring`,
/// the expiry close, and fresh tokens.
impl Session {
    /// True while the first frame must still bring the token.
    fn awaiting_auth(&self) -> bool {
        matches!(
            self.token.as_deref(),
            Some(TokenClock {
                state: TokenState::Awaited { .. },
                ..
            })
        )
    }

    /// Closes the connection with 1008 unless its `auth` frame is in by
    /// the deadline.
    fn await_auth(&mut self, ctx: &mut ws::WebsocketContext<Self>) {
        ctx.run_later(self.node.config.auth_timeout, |act, ctx| {
            if act.awaiting_auth() {
                log::debug!("device {}: no auth frame in time, closing", act.me.device);
                close_policy(ctx, "no auth frame in time");
            }
        });
    }

    /// The first frame of a connection that carried no token: it must be
    /// `{"type":"auth","token":...}`; anything else closes with 1008.
    fn first_frame(&mut self, text: &str, ctx: &mut ws::WebsocketContext<Self>) {
        self.liveness.last_activity = Instant::now();
        match protocol::parse_client_frame(text) {
            Ok(ClientFrame::Auth { token }) => self.authenticate(token.0, ctx),
            _ => close_policy(
                ctx,
                "the first frame must be {\"type\":\"auth\",\"token\":...}",
            ),
        }
    }

    /// Verifies `token`: the first one starts the session; a later one must
    /// be for the same user and replaces the expiry. Verification may fetch
    /// the provider's keys, so it runs beside the mailbox; frames that come
    /// meanwhile are taken in, and their requests wait for the claim.
    fn authenticate(&mut self, token: String, ctx: &mut ws::WebsocketContext<Self>) {
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
                }
                if first {
                    act.me.user = verified.user;
                    act.begin(ctx);
                } else {
                    log::debug!("{}/{}: token refreshed", act.me.user, act.me.device);
                    act.schedule_expiry(ctx);
                }
            }
            Err(e) if first => {
                log::debug!("device {}: auth frame refused: {e}", act.me.device);
                close_policy(ctx, &e.to_string());
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

    /// Arms the `auth_expiring` notice and the expiry close for the current
    /// token, replacing those of an earlier one.
    fn schedule_expiry(&mut self, ctx: &mut ws::WebsocketContext<Self>) {
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
            ctx.close(Some(ws::CloseReason {
                code: ws::CloseCode::Other(CLOSE_TOKEN_EXPIRED),
                description: Some("token expired".into()),
            }));
            ctx.stop();
        });
        if let Some(clock) = &mut self.token {
            clock.timers = vec![notice, close];
        }
    }

    /// Time until the session is closed for its token's expiry: `exp` plus
    /// the verifier's leeway, from now. `None` without a valid token.
    fn token_left(&self) -> Option<Duration> {
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

/// Closes with 1008 (policy violation) and a reason cut to what a close
/// frame can carry (123 bytes).
fn close_policy(ctx: &mut ws::WebsocketContext<Session>, reason: &str) {
    let mut end = reason.len().min(123);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    ctx.close(Some(ws::CloseReason {
        code: ws::CloseCode::Policy,
        description: Some(reason[..end].to_string()),
    }));
    ctx.stop();
}

impl Session {
    /// One whole text message (a frame, or assembled fragments).
    fn handle_text(&mut self, text: &str, ctx: &mut ws::WebsocketContext<Self>) {
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
    fn refuse_binary(&mut self, ctx: &mut ws::WebsocketContext<Self>) {
        self.send_error(
            ctx,
            &ProtocolError::new(
                ErrorCode::Unsupported,
                "only text frames holding one JSON object are accepted",
            ),
        );
    }

    /// Sends a close frame and ends the session; the connection closes
    /// once the frame is flushed.
    fn close_with(
        &mut self,
        ctx: &mut ws::WebsocketContext<Self>,
        code: ws::CloseCode,
        reason: String,
    ) {
        ctx.close(Some(ws::CloseReason {
            code,
            description: Some(reason),
        }));
        ctx.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limiter_refuses_past_the_burst_then_calls_a_flood() {
        let start = Instant::now();
        let mut limiter = FrameLimiter::new(2, start);
        // A burst of twice the rate passes.
        for _ in 0..4 {
            assert_eq!(limiter.take(2, start), Admission::Admitted);
        }
        assert_eq!(limiter.take(2, start), Admission::RefusedFirst);
        for _ in 0..(2 * FLOOD_CLOSE_FACTOR - 1) {
            assert_eq!(limiter.take(2, start), Admission::Refused);
        }
        assert_eq!(limiter.take(2, start), Admission::Flood);
        // Half a second refills one token.
        let later = start + Duration::from_millis(500);
        assert_eq!(limiter.take(2, later), Admission::Admitted);
    }

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
}

