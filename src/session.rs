//! The session actor, one per WebSocket: one device of one user.
//!
//! It owns the device's lease: claims it on connect, refreshes it on client
//! frames and pongs (throttled), pings the client every heartbeat and closes
//! a client that stops answering, and on close releases the device through
//! the atomic departure step, which leaves a lease alone that a newer
//! connection of the same device has taken over.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use actix::prelude::*;
use actix_web_actors::ws;

use crate::config::Config;
use crate::protocol::{self, ClientFrame, ErrorCode, ProtocolError, Status};
use crate::registry::{self, Deliver, GoingAway, Registry, SessionId};
use crate::store::{Arrival, ArriveMode, Departure, Store};

/// Close code sent when another connection of the same device took the lease.
pub const CLOSE_REPLACED: u16 = 4001;
/// Close code sent when the lease cannot be claimed (Redis unreachable).
pub const CLOSE_UNAVAILABLE: u16 = 1011;

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
    /// Deadline last written to `presence-leases`, epoch ms; lets the
    /// departure remove exactly our entry and not a newer connection's.
    deadline: i64,
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
    /// Last lease refresh sent to Redis (throttling).
    last_refresh: Instant,
    /// A refresh is in flight.
    refreshing: bool,
    /// Watched users -> highest transition sequence number seen, so that an
    /// event that a snapshot already reflects is not sent again.
    watching: HashMap<String, u64>,
}

impl Session {
    /// A session for `user`/`device`; `owner` is its lease value.
    pub fn new(
        id: SessionId,
        user: String,
        device: String,
        owner: String,
        store: Store,
        registry: Addr<Registry>,
        config: Arc<Config>,
    ) -> Self {
        let now = Instant::now();
        Self {
            id,
            user,
            device,
            owner,
            deadline: 0,
            claimed: false,
            store,
            registry,
            config,
            last_activity: now,
            last_refresh: now,
            refreshing: false,
            watching: HashMap::new(),
        }
    }

    /// Pings the client every heartbeat; stops a client that went silent.
    fn hb(&self, ctx: &mut ws::WebsocketContext<Self>) {
        ctx.run_interval(self.config.heartbeat, |act, ctx| {
            if act.last_activity.elapsed() > act.config.client_timeout() {
                log::debug!(
                    "{}/{}: no pong for {:?}, disconnecting",
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

    /// The client is alive: note it and refresh the lease if due.
    fn touch(&mut self, ctx: &mut ws::WebsocketContext<Self>) {
        self.last_activity = Instant::now();
        if !self.claimed
            || self.refreshing
            || self.last_refresh.elapsed() < self.config.refresh_interval()
        {
            return;
        }
        self.refreshing = true;
        let store = self.store.clone();
        let (user, device, owner) = (self.user.clone(), self.device.clone(), self.owner.clone());
        let refresh = async move {
            store
                .arrive(&user, &device, &owner, ArriveMode::Refresh)
                .await
        };
        ctx.spawn(refresh.into_actor(self).map(|res, act, ctx| {
            act.refreshing = false;
            match res {
                Ok((Arrival::Held { came_online }, deadline)) => {
                    act.last_refresh = Instant::now();
                    act.deadline = deadline;
                    if came_online {
                        log::info!("{}/{}: lease re-asserted", act.user, act.device);
                    }
                }
                Ok((Arrival::Replaced, _)) => {
                    log::debug!(
                        "{}/{}: replaced by a newer connection",
                        act.user,
                        act.device
                    );
                    act.claimed = false;
                    ctx.close(Some(ws::CloseReason {
                        code: ws::CloseCode::Other(CLOSE_REPLACED),
                        description: Some("device connected elsewhere".into()),
                    }));
                    ctx.stop();
                }
                Err(e) => log::warn!("{}/{}: lease refresh failed: {e}", act.user, act.device),
            }
        }));
    }

    fn send_error(ctx: &mut ws::WebsocketContext<Self>, err: &ProtocolError) {
        ctx.text(err.to_frame());
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
                let set = async move { store.set_status(&user, status, text.as_deref()).await };
                ctx.wait(set.into_actor(self).map(|res, act, ctx| {
                    if let Err(e) = res {
                        log::warn!("{}: status change failed: {e}", act.user);
                        Self::send_error(ctx, &unavailable());
                    }
                }));
            }
            ClientFrame::Heartbeat => {}
        }
    }

    /// Registers the watch, then answers with a snapshot. The actor waits
    /// for both, so live events queued meanwhile follow the snapshot.
    fn watch(&mut self, mut users: Vec<String>, ctx: &mut ws::WebsocketContext<Self>) {
        users.sort();
        users.dedup();
        let new = users
            .iter()
            .filter(|u| !self.watching.contains_key(*u))
            .count();
        if self.watching.len() + new > self.config.max_watches {
            Self::send_error(
                ctx,
                &ProtocolError::new(
                    ErrorCode::TooManyWatches,
                    format!(
                        "a session may watch at most {} users (watching {}, asked for {new} more)",
                        self.config.max_watches,
                        self.watching.len()
                    ),
                ),
            );
            return;
        }
        let registry = self.registry.clone();
        let store = self.store.clone();
        let watch = registry::Watch {
            session: self.id,
            addr: ctx.address().recipient(),
            users: users.clone(),
        };
        let fut = async move {
            registry
                .send(watch)
                .await
                .map_err(|e| log::error!("registry unreachable: {e}"))?;
            store
                .records(&users)
                .await
                .map_err(|e| log::warn!("snapshot failed: {e}"))
        };
        ctx.wait(fut.into_actor(self).map(|res, act, ctx| match res {
            Ok(records) => {
                let mut out = Vec::with_capacity(records.len());
                for (record, seq) in records {
                    let seen = act.watching.entry(record.user.clone()).or_insert(0);
                    *seen = (*seen).max(seq);
                    out.push(record);
                }
                ctx.text(protocol::snapshot_frame(&out));
            }
            Err(()) => Self::send_error(ctx, &unavailable()),
        }));
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
        self.registry.do_send(registry::Join {
            session: self.id,
            addr: ctx.address().recipient(),
        });
        self.hb(ctx);
        let store = self.store.clone();
        let (user, device, owner) = (self.user.clone(), self.device.clone(), self.owner.clone());
        let claim = async move {
            store
                .arrive(&user, &device, &owner, ArriveMode::Connect)
                .await
        };
        ctx.wait(claim.into_actor(self).map(|res, act, ctx| match res {
            Ok((_, deadline)) => {
                act.claimed = true;
                act.deadline = deadline;
                act.last_refresh = Instant::now();
                log::debug!("{}/{}: connected", act.user, act.device);
                ctx.text(protocol::hello_frame(
                    &act.user,
                    &act.device,
                    act.config.heartbeat.as_millis() as u64,
                    act.config.ttl.as_millis() as u64,
                ));
            }
            Err(e) => {
                log::warn!("{}/{}: cannot claim lease: {e}", act.user, act.device);
                Self::send_error(ctx, &unavailable());
                ctx.close(Some(ws::CloseReason {
                    code: ws::CloseCode::Other(CLOSE_UNAVAILABLE),
                    description: Some("presence store unavailable".into()),
                }));
                ctx.stop();
            }
        }));
    }

    fn stopped(&mut self, _: &mut Self::Context) {
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
        let store = self.store.clone();
        let (user, device, owner, deadline) = (
            std::mem::take(&mut self.user),
            std::mem::take(&mut self.device),
            std::mem::take(&mut self.owner),
            self.deadline,
        );
        actix::spawn(async move {
            match store.depart(&user, &device, Some((&owner, deadline))).await {
                Ok(Departure::Removed { last_seen }) => log::debug!(
                    "{user}/{device}: closed, device released{}",
                    if last_seen.is_some() {
                        ", user offline"
                    } else {
                        ""
                    }
                ),
                Ok(Departure::Leased { .. }) => {
                    log::debug!("{user}/{device}: closed, lease kept by a newer connection")
                }
                Ok(Departure::AlreadyGone) => {
                    log::debug!("{user}/{device}: closed, device was already released")
                }
                Err(e) => log::warn!("{user}/{device}: release failed ({e}); the lease will lapse"),
            }
        });
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
        if msg.seq <= *seen {
            return;
        }
        *seen = msg.seq;
        ctx.text(msg.frame);
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
            ws::Message::Ping(payload) => {
                self.touch(ctx);
                ctx.pong(&payload);
            }
            ws::Message::Pong(_) => self.touch(ctx),
            ws::Message::Text(text) => {
                self.touch(ctx);
                match protocol::parse_client_frame(&text) {
                    Ok(frame) => self.handle_frame(frame, ctx),
                    Err(e) => Self::send_error(ctx, &e),
                }
            }
            ws::Message::Binary(_) | ws::Message::Continuation(_) => {
                self.touch(ctx);
                Self::send_error(
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
