//! The session actor, one per WebSocket: one device of one user.
//!
//! It owns the device's lease: claims it on connect, refreshes it on client
//! frames and pongs (throttled), pings the client every heartbeat and closes
//! a client that stops answering, and on close releases the device through
//! the atomic departure step, which leaves a lease alone that a newer
//! connection of the same device has taken over.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use actix::prelude::*;
use actix_web_actors::ws;

use crate::auth::{Auth, AuthError};
use crate::config::Config;
use bytestring::ByteString;

use crate::conn::ConnHandle;
use crate::privacy::{self, Relation};
use crate::protocol::Record;
use crate::protocol::{self, ClientFrame, ErrorCode, ProtocolError, Status};
use crate::refresh::{LeaseState, Refreshed};
use crate::registry::{self, Deliver, GoingAway, Recheck, Registry, SessionId};
use crate::store::{
    now_ms, Arrival, ArriveMode, ChosenStatus, Departure, Lease, Observed, Store, StoreResult,
};

/// Close code sent when another connection of the same device took the lease.
pub const CLOSE_REPLACED: u16 = 4001;
/// Close code sent when the lease cannot be claimed (Redis unreachable).
pub const CLOSE_UNAVAILABLE: u16 = 1011;
/// Close code sent when the session's token expired and no fresh one came.
pub const CLOSE_TOKEN_EXPIRED: u16 = 4401;
/// Sustained flooding this many times the allowed rate, within one refill
/// of the bucket, closes the session instead of refusing frame by frame.
const FLOOD_CLOSE_FACTOR: u32 = 5;
/// First wait before retrying a release that Redis refused.
const RELEASE_RETRY_MIN: Duration = Duration::from_millis(100);
/// Longest wait between release retries.
const RELEASE_RETRY_MAX: Duration = Duration::from_secs(2);

/// One WebSocket connection.
pub struct Session {
    /// Unique within this node; the registry's key for this session.
    id: SessionId,
    /// The connected user.
    user: String,
    /// The connected device.
    device: String,
    /// Lease value naming this connection (`<node> <conn> <since>`).
    owner: String,
    /// Whether a lease refresh is in flight, and the deadline last written
    /// to `presence-leases` (epoch ms), which lets the departure remove
    /// exactly our entry and not a newer connection's. Shared with the
    /// node's refresher.
    lease_state: Arc<LeaseState>,
    /// The lease belongs to this connection and must be released on close.
    claimed: bool,
    /// Redis state.
    store: Store,
    /// This node's registry.
    registry: Addr<Registry>,
    /// Timings and limits.
    config: Arc<Config>,
    /// Last client frame or pong; a silent client is disconnected.
    last_activity: Instant,
    /// The same, in epoch ms, shared with the registry, which cuts off a
    /// session frozen by a client that stopped reading.
    alive: Arc<AtomicI64>,
    /// When the last lease refresh started (throttling).
    last_refresh: Instant,
    /// Watched users -> what this client was last told about them.
    watching: HashMap<String, Seen>,
    /// The user's chosen status as last seen in Redis, re-asserted if Redis
    /// comes back without it.
    known_status: Option<ChosenStatus>,
    /// Handle on the TCP connection, handed to the registry to cut it when
    /// this session falls too far behind.
    conn: Option<ConnHandle>,
    /// Client frames this session may still send now (token bucket).
    tokens: f64,
    /// When `tokens` was last refilled.
    refilled: Instant,
    /// Frames refused since the bucket last had a token.
    refused: u32,
    /// With JWT auth: the token's state and the timers of its expiry.
    token: Option<TokenClock>,
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

impl Default for Seen {
    fn default() -> Self {
        Self {
            seq: 0,
            fingerprint: 0,
            relation: Relation::Other,
        }
    }
}

impl Session {
    /// A session for `who` on connection `conn`.
    pub fn new(
        who: Identity,
        store: Store,
        registry: Addr<Registry>,
        config: Arc<Config>,
        conn: Option<ConnHandle>,
    ) -> Self {
        let now = Instant::now();
        let burst = f64::from(config.max_frames_per_sec) * 2.0;
        Self {
            id: who.id,
            user: who.user,
            device: who.device,
            owner: who.owner,
            lease_state: Arc::default(),
            claimed: false,
            store,
            registry,
            config,
            last_activity: now,
            alive: Arc::new(AtomicI64::new(now_ms())),
            last_refresh: now,
            watching: HashMap::new(),
            // Since 0: applied only where no status is stored at all.
            known_status: who.status.map(|s| ChosenStatus {
                status: s.as_str().to_string(),
                ..ChosenStatus::default()
            }),
            conn,
            tokens: burst,
            refilled: now,
            refused: 0,
            token: who.token.map(|(auth, state)| TokenClock {
                auth,
                state,
                timers: Vec::new(),
            }),
        }
    }

    /// Queues a text frame for the client.
    fn send(&mut self, ctx: &mut ws::WebsocketContext<Self>, frame: impl Into<ByteString>) {
        ctx.text(frame.into());
    }

    /// Takes a token for one client frame. Returns false when the frame is
    /// to be refused; a sustained flood closes the session with 1008.
    fn admit(&mut self, ctx: &mut ws::WebsocketContext<Self>) -> bool {
        let rate = f64::from(self.config.max_frames_per_sec);
        let now = Instant::now();
        let elapsed = now.duration_since(self.refilled).as_secs_f64();
        self.refilled = now;
        self.tokens = (self.tokens + elapsed * rate).min(rate * 2.0);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            self.refused = 0;
            return true;
        }
        self.refused += 1;
        if self.refused == 1 {
            let err = ProtocolError::new(
                ErrorCode::RateLimited,
                format!(
                    "more than {} frames per second; frames are refused until the rate drops",
                    self.config.max_frames_per_sec
                ),
            );
            self.send_error(ctx, &err);
        } else if self.refused > self.config.max_frames_per_sec * FLOOD_CLOSE_FACTOR {
            log::warn!("{}/{}: flooding, closing", self.user, self.device);
            crate::metrics::METRICS.floods.inc();
            ctx.close(Some(ws::CloseReason {
                code: ws::CloseCode::Policy,
                description: Some("too many frames".into()),
            }));
            ctx.stop();
        }
        false
    }

    /// Pings the client every heartbeat; stops a client that went silent.
    fn hb(&self, ctx: &mut ws::WebsocketContext<Self>) {
        ctx.run_interval(self.config.heartbeat, |act, ctx| {
            if act.last_activity.elapsed() > act.config.client_timeout() {
                log::debug!(
                    "{}/{}: silent for {:?}, disconnecting",
                    act.user,
                    act.device,
                    act.config.client_timeout()
                );
                ctx.stop();
                return;
            }
            ctx.ping(b"");
        });
    }

    /// The arrival step for this connection, as a future.
    fn arrive(&self, mode: ArriveMode) -> impl Future<Output = StoreResult<Arrival>> + 'static {
        let store = self.store.clone();
        let (user, device, owner) = (self.user.clone(), self.device.clone(), self.owner.clone());
        let known = self.known_status.clone();
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
    /// settles `lease_state`; anything else comes back as [`Refreshed`].
    fn touch(&mut self, ctx: &mut ws::WebsocketContext<Self>) {
        self.last_activity = Instant::now();
        self.alive.store(now_ms(), Ordering::Relaxed);
        if !self.claimed
            || self.lease_state.refreshing()
            || self.last_refresh.elapsed() < self.config.refresh_interval()
        {
            return;
        }
        self.lease_state.start();
        // Stamped when it starts: under load a slow round trip must not
        // make every frame meanwhile count as due.
        self.last_refresh = Instant::now();
        let lease = Lease {
            user: self.user.clone(),
            device: self.device.clone(),
            owner: self.owner.clone(),
            known: self.known_status.clone(),
        };
        self.store
            .refresh(lease, self.lease_state.clone(), ctx.address().recipient());
    }
}

impl Handler<Refreshed> for Session {
    type Result = ();

    /// A refresh came back with something to act on: the lease was lost,
    /// re-asserted or found with another status, or the refresh failed.
    fn handle(&mut self, Refreshed(res): Refreshed, ctx: &mut Self::Context) {
        self.lease_state.finish();
        match res {
            Ok(Arrival::Held {
                came_online,
                status,
                ..
            }) => {
                if status.is_some() {
                    self.known_status = status;
                }
                if came_online {
                    log::info!("{}/{}: lease re-asserted", self.user, self.device);
                }
            }
            Ok(Arrival::Replaced | Arrival::TooManyDevices) => {
                log::debug!(
                    "{}/{}: replaced by a newer connection",
                    self.user,
                    self.device
                );
                self.claimed = false;
                ctx.close(Some(ws::CloseReason {
                    code: ws::CloseCode::Other(CLOSE_REPLACED),
                    description: Some("device connected elsewhere".into()),
                }));
                ctx.stop();
            }
            Err(e) => log::warn!("{}/{}: lease refresh failed: {e}", self.user, self.device),
        }
    }
}

impl Session {
    fn send_error(&mut self, ctx: &mut ws::WebsocketContext<Self>, err: &ProtocolError) {
        self.send(ctx, err.to_frame());
    }

    fn handle_frame(&mut self, frame: ClientFrame, ctx: &mut ws::WebsocketContext<Self>) {
        match frame {
            ClientFrame::Watch { users } => self.watch(users, ctx),
            ClientFrame::Unwatch { users } => {
                for user in &users {
                    self.watching.remove(user);
                }
                self.registry.do_send(registry::Unwatch {
                    session: self.id,
                    users,
                });
            }
            ClientFrame::Status { status, text } => {
                // Already validated by the parser.
                let Ok(status) = Status::parse(&status) else {
                    return;
                };
                let store = self.store.clone();
                let user = self.user.clone();
                let chosen_text = text.clone().unwrap_or_default();
                let set = async move { store.set_status(&user, status, text.as_deref()).await };
                ctx.wait(set.into_actor(self).map(move |res, act, ctx| match res {
                    Ok(since) => {
                        let known = act.known_status.get_or_insert_with(Default::default);
                        known.status = status.as_str().to_string();
                        known.text = chosen_text;
                        known.since = since;
                    }
                    Err(e) => {
                        log::warn!("{}: status change failed: {e}", act.user);
                        act.send_error(ctx, &unavailable());
                    }
                }));
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
                let store = self.store.clone();
                let user = self.user.clone();
                let set = async move { store.set_privacy(&user, online, last_seen).await };
                ctx.wait(set.into_actor(self).map(move |res, act, ctx| match res {
                    Ok(_) => {
                        let known = act.known_status.get_or_insert_with(Default::default);
                        if let Some(a) = online {
                            known.show_online = a.as_str().to_string();
                        }
                        if let Some(a) = last_seen {
                            known.show_last_seen = a.as_str().to_string();
                        }
                    }
                    Err(e) => {
                        log::warn!("{}: privacy change failed: {e}", act.user);
                        act.send_error(ctx, &unavailable());
                    }
                }));
            }
        }
    }

    /// Registers the watch, then answers with a snapshot. The actor waits
    /// for both, so live events queued meanwhile follow the snapshot.
    fn watch(&mut self, mut users: Vec<String>, ctx: &mut ws::WebsocketContext<Self>) {
        users.sort();
        users.dedup();
        if users.is_empty() {
            self.send(ctx, protocol::snapshot_frame(&[]));
            return;
        }
        let new: Vec<String> = users
            .iter()
            .filter(|u| !self.watching.contains_key(*u))
            .cloned()
            .collect();
        if self.watching.len() + new.len() > self.config.max_watches {
            self.send_error(
                ctx,
                &ProtocolError::new(
                    ErrorCode::TooManyWatches,
                    format!(
                        "a session may watch at most {} users (watching {}, asked for {} more)",
                        self.config.max_watches,
                        self.watching.len(),
                        new.len()
                    ),
                ),
            );
            return;
        }
        let registry = self.registry.clone();
        let store = self.store.clone();
        let session = self.id;
        let watch = registry::Watch {
            session,
            addr: ctx.address().recipient(),
            recheck: ctx.address().recipient(),
            users: new.clone(),
        };
        let viewer = self.user.clone();
        let fut = async move {
            if let Err(e) = registry.send(watch).await {
                log::error!("registry unreachable: {e}");
                return None;
            }
            match store.presences(&users, Some(&viewer)).await {
                Ok(records) => Some(records),
                Err(e) => {
                    log::warn!("snapshot failed: {e}");
                    // Undo what this frame added; earlier watches stay.
                    registry.do_send(registry::Unwatch {
                        session,
                        users: new,
                    });
                    None
                }
            }
        };
        ctx.wait(fut.into_actor(self).map(|res, act, ctx| match res {
            Some(observed) => {
                let out: Vec<Record> = observed.iter().map(|o| act.observe(o)).collect();
                act.send(ctx, protocol::snapshot_frame(&out));
            }
            None => act.send_error(ctx, &unavailable()),
        }));
    }
}

impl Session {
    /// Takes in a fresh read of a watched user: how this viewer stands to
    /// it, its sequence number, and the view this client now holds.
    fn observe(&mut self, o: &Observed) -> Record {
        let relation = o.relation(Some(&self.user), self.config.contacts_only);
        let record = privacy::view(&o.presence, relation);
        let seen = self.watching.entry(o.presence.user.clone()).or_default();
        seen.seq = seen.seq.max(o.seq);
        seen.relation = relation;
        seen.fingerprint = registry::fingerprint(&record);
        record
    }
}

fn unavailable() -> ProtocolError {
    ProtocolError::new(
        ErrorCode::Unavailable,
        "presence store unavailable, try again",
    )
}

/// Releases a device after its connection closed. While Redis is
/// unreachable it retries until the lease would have lapsed anyway; after
/// that the expiry path owns the departure.
async fn release(store: Store, user: String, device: String, owner: String, deadline: i64) {
    let give_up = Instant::now() + Duration::from_millis(store.ttl_ms());
    let mut wait = RELEASE_RETRY_MIN;
    loop {
        match store.depart(&user, &device, Some((&owner, deadline))).await {
            Ok(Departure::Removed { last_seen }) => {
                let offline = if last_seen.is_some() {
                    ", user offline"
                } else {
                    ""
                };
                log::debug!("{user}/{device}: closed, device released{offline}");
            }
            Ok(Departure::Leased { .. }) => {
                log::debug!("{user}/{device}: closed, lease kept by a newer connection")
            }
            Ok(Departure::AlreadyGone) => {
                log::debug!("{user}/{device}: closed, device was already released")
            }
            Err(e) if Instant::now() + wait < give_up => {
                log::debug!("{user}/{device}: release failed ({e}); retrying in {wait:?}");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(RELEASE_RETRY_MAX);
                continue;
            }
            Err(e) => log::warn!("{user}/{device}: release failed ({e}); the lease will lapse"),
        }
        return;
    }
}

impl Actor for Session {
    type Context = ws::WebsocketContext<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        // Bounded, so that a client that stops reading cannot grow the
        // server's memory: the registry cuts it off when this fills up.
        ctx.set_mailbox_capacity(self.config.max_queued_events);
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
    /// ping, claim the lease, greet, and watch the token's expiry.
    fn begin(&mut self, ctx: &mut ws::WebsocketContext<Self>) {
        self.schedule_expiry(ctx);
        self.registry.do_send(registry::Join {
            session: self.id,
            addr: ctx.address().recipient(),
            conn: self.conn.take(),
            alive: self.alive.clone(),
        });
        self.hb(ctx);
        let claim = self.arrive(ArriveMode::Connect);
        ctx.wait(claim.into_actor(self).map(|res, act, ctx| match res {
            Ok(Arrival::Held {
                status, deadline, ..
            }) => {
                act.claimed = true;
                crate::metrics::METRICS.devices.inc();
                act.lease_state.set_deadline(deadline);
                act.known_status = status;
                act.last_refresh = Instant::now();
                log::debug!("{}/{}: connected", act.user, act.device);
                let hello = protocol::hello_frame(
                    &act.user,
                    &act.device,
                    act.config.heartbeat.as_millis() as u64,
                    act.config.ttl.as_millis() as u64,
                );
                act.send(ctx, hello);
            }
            Ok(Arrival::TooManyDevices) => {
                let limit = act.config.max_devices_per_user;
                log::debug!(
                    "{}/{}: refused, {limit} devices already",
                    act.user,
                    act.device
                );
                act.send_error(
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
                log::warn!("{}/{}: cannot claim lease: {other:?}", act.user, act.device);
                act.send_error(ctx, &unavailable());
                ctx.close(Some(ws::CloseReason {
                    code: ws::CloseCode::Other(CLOSE_UNAVAILABLE),
                    description: Some("presence store unavailable".into()),
                }));
                ctx.stop();
            }
        }));
    }

    /// The connection closed: leave the registry and release the lease.
    fn release_on_stop(&mut self) {
        // `deadline` is set once the lease was claimed (`claimed` may be
        // cleared since, by a shutdown or a takeover).
        if self.lease_state.deadline() != 0 {
            crate::metrics::METRICS.devices.dec();
        }
        self.registry
            .do_send(registry::Disconnect { session: self.id });
        if !self.claimed {
            log::debug!(
                "{}/{}: closed without a lease to release",
                self.user,
                self.device
            );
            return;
        }
        actix::spawn(release(
            self.store.clone(),
            std::mem::take(&mut self.user),
            std::mem::take(&mut self.device),
            std::mem::take(&mut self.owner),
            self.lease_state.deadline(),
        ));
    }
}

impl Handler<GoingAway> for Session {
    type Result = ();

    /// The node is shutting down for a deploy: tell the client to reconnect
    /// elsewhere and leave the lease to lapse, so that a device that is back
    /// on another node within its TTL shows no transition at all.
    fn handle(&mut self, _: GoingAway, ctx: &mut Self::Context) {
        self.claimed = false;
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
        let Some(seen) = self.watching.get_mut(&*msg.user) else {
            return;
        };
        // A live event no newer than what the client has is stale (its
        // snapshot covered it); a resync read is newer than every event the
        // registry let through before it, whatever its sequence number.
        if !msg.resync && msg.seq <= seen.seq {
            return;
        }
        seen.seq = seen.seq.max(msg.seq);
        let view = &msg.views[seen.relation.index()];
        if view.fingerprint == seen.fingerprint {
            return;
        }
        seen.fingerprint = view.fingerprint;
        crate::metrics::METRICS.transitions_delivered.inc();
        self.send(ctx, view.frame.clone());
    }
}

impl Handler<Recheck> for Session {
    type Result = ();

    /// The user's contacts changed: re-read it as this viewer and tell the
    /// client if what it may see changed.
    fn handle(&mut self, msg: Recheck, ctx: &mut Self::Context) {
        if !self.watching.contains_key(&msg.user) {
            return;
        }
        let store = self.store.clone();
        let viewer = self.user.clone();
        let read = async move { store.presences(&[msg.user], Some(&viewer)).await };
        ctx.wait(read.into_actor(self).map(|res, act, ctx| {
            let Ok(observed) = res else {
                return; // the next transition or resync brings it
            };
            for o in observed {
                let before = act.watching.get(&o.presence.user).map(|s| s.fingerprint);
                let record = act.observe(&o);
                if before != Some(registry::fingerprint(&record)) {
                    act.send(ctx, protocol::presence_frame(&record));
                }
            }
        }));
    }
}

impl StreamHandler<Result<ws::Message, ws::ProtocolError>> for Session {
    fn handle(&mut self, msg: Result<ws::Message, ws::ProtocolError>, ctx: &mut Self::Context) {
        let msg = match msg {
            Ok(msg) => msg,
            Err(ws::ProtocolError::Overflow) => {
                ctx.close(Some(ws::CloseReason {
                    code: ws::CloseCode::Size,
                    description: Some(format!(
                        "frame larger than {} bytes",
                        self.config.max_frame_bytes
                    )),
                }));
                ctx.stop();
                return;
            }
            Err(e) => {
                log::debug!("{}/{}: protocol error: {e}", self.user, self.device);
                ctx.stop();
                return;
            }
        };
        match msg {
            // Pongs answer our own pings: never limited.
            ws::Message::Pong(_) => self.touch(ctx),
            ws::Message::Ping(payload) => {
                self.touch(ctx);
                if self.admit(ctx) {
                    ctx.pong(&payload);
                }
            }
            ws::Message::Text(text) if self.awaiting_auth() => self.first_frame(&text, ctx),
            ws::Message::Text(text) => {
                self.touch(ctx);
                if !self.admit(ctx) {
                    return;
                }
                match protocol::parse_client_frame(&text) {
                    Ok(frame) => self.handle_frame(frame, ctx),
                    Err(e) => self.send_error(ctx, &e),
                }
            }
            ws::Message::Binary(_) | ws::Message::Continuation(_) => {
                self.touch(ctx);
                if !self.admit(ctx) {
                    return;
                }
                self.send_error(
                    ctx,
                    &ProtocolError::new(
                        ErrorCode::Unsupported,
                        "only text frames holding one JSON object are accepted",
                    ),
                );
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
            self.token,
            Some(TokenClock {
                state: TokenState::Awaited { .. },
                ..
            })
        )
    }

    /// Closes the connection with 1008 unless its `auth` frame is in by
    /// the deadline.
    fn await_auth(&mut self, ctx: &mut ws::WebsocketContext<Self>) {
        ctx.run_later(self.config.auth_timeout, |act, ctx| {
            if act.awaiting_auth() {
                log::debug!("device {}: no auth frame in time, closing", act.device);
                close_policy(ctx, "no auth frame in time");
            }
        });
    }

    /// The first frame of a connection that carried no token: it must be
    /// `{"type":"auth","token":...}`; anything else closes with 1008.
    fn first_frame(&mut self, text: &str, ctx: &mut ws::WebsocketContext<Self>) {
        self.last_activity = Instant::now();
        match protocol::parse_client_frame(text) {
            Ok(ClientFrame::Auth { token }) => self.authenticate(token.0, ctx),
            _ => close_policy(
                ctx,
                "the first frame must be {\"type\":\"auth\",\"token\":...}",
            ),
        }
    }

    /// Verifies `token`: the first one starts the session; a later one must
    /// be for the same user and replaces the expiry. The actor waits for the
    /// verification, so that no frame is handled before it is known who
    /// sends it.
    fn authenticate(&mut self, token: String, ctx: &mut ws::WebsocketContext<Self>) {
        let Some(clock) = &self.token else {
            self.send_error(
                ctx,
                &ProtocolError::new(
                    ErrorCode::BadRequest,
                    "auth frames are only used with --auth jwt",
                ),
            );
            return;
        };
        let first = self.awaiting_auth();
        let asked = match &clock.state {
            TokenState::Awaited { asked } => asked.clone(),
            TokenState::Valid(_) => Some(self.user.clone()),
        };
        let auth = clock.auth.clone();
        let verify = async move {
            match &*auth {
                Auth::Jwt(v) => v.verify_as(&token, asked.as_deref()).await,
                Auth::Dev => Err(AuthError::Invalid("no JWT auth".into())),
            }
        };
        ctx.wait(verify.into_actor(self).map(move |res, act, ctx| match res {
            Ok(verified) => {
                if let Some(clock) = &mut act.token {
                    clock.state = TokenState::Valid(verified.exp);
                }
                if first {
                    act.user = verified.user;
                    act.begin(ctx);
                } else {
                    log::debug!("{}/{}: token refreshed", act.user, act.device);
                    act.schedule_expiry(ctx);
                }
            }
            Err(e) if first => {
                log::debug!("device {}: auth frame refused: {e}", act.device);
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
            left.saturating_sub(self.config.auth_expiring),
            |act, ctx| {
                let in_ms = act.token_left().unwrap_or_default().as_millis() as u64;
                act.send(ctx, protocol::auth_expiring_frame(in_ms));
            },
        );
        let close = ctx.run_later(left, |act, ctx| {
            log::debug!("{}/{}: token expired, closing", act.user, act.device);
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
