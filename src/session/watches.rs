//! User presence inside a session: watches and their snapshots, the
//! chosen status and privacy, re-reads when contacts change, and the
//! delivery of each presence event (only what differs from what the client
//! was last told). Requests that need Redis wait in [`Requests`] and run one
//! at a time, in order.

use std::collections::VecDeque;
use std::time::Duration;

use actix::prelude::*;
use actix_web_actors::ws;

use super::requests::Request;
use super::seen::Seen;
use super::*;
use crate::ids::UserId;
use crate::model::{Audience, Record, Status};
use crate::privacy::{self, Relation};
use crate::protocol::{self, ErrorCode, ProtocolError};
use crate::registry::Inbound;
use crate::registry::{self, Deliver, Recheck, View};
use crate::store::Observed;

/// The waits before a watch's subscription and snapshot read are tried
/// again, after Redis failed or did not answer in time; after the last
/// try the watch is refused with `unavailable`.
const SNAPSHOT_RETRIES: [Duration; 3] = [
    Duration::from_millis(250),
    Duration::from_secs(1),
    Duration::from_secs(3),
];

/// Client requests that need a Redis round trip. They run one at a time in
/// arrival order, so that answers keep the order of the questions (a watch
/// is answered by its snapshot before the next request's answer), and only
/// once the lease is claimed, so that `hello` comes first.
#[derive(Default)]
pub(super) struct Requests {
    /// Waiting, oldest first.
    pub(super) queue: VecDeque<Request>,
    /// One is in flight.
    pub(super) busy: bool,
    /// The connect claim succeeded; requests may run.
    pub(super) ready: bool,
    /// Where the session's first request stands: while it runs it counts
    /// among the node's sessions setting up ([`crate::lease::claim`]).
    pub(super) first: First,
}

/// Where a session's first request stands.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) enum First {
    /// Not asked yet.
    #[default]
    NotYet,
    /// In flight, counted by the node's claimer.
    Running,
    /// Answered.
    Done,
}

impl Session {
    /// Checks a watch against the limit, marks its new users pending and
    /// queues it; the snapshot follows when its turn comes.
    pub(super) fn watch(
        &mut self,
        mut users: Vec<String>,
        devices: bool,
        ctx: &mut ws::WebsocketContext<Self>,
    ) {
        users.sort();
        users.dedup();
        let new: Vec<String> = users
            .iter()
            .filter(|u| !self.watches.seen.contains_key(u.as_str()))
            .cloned()
            .collect();
        // Users watched before whose device counts are now asked for are
        // read again, like new ones: the client's record of them may lack
        // a count that changed meanwhile.
        let upgraded: Vec<String> = users
            .iter()
            .filter(|u| {
                devices
                    && self
                        .watches
                        .seen
                        .get(u.as_str())
                        .is_some_and(|s| !s.devices)
            })
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
        let pending = Seen {
            pending: true,
            devices,
            ..Seen::default()
        };
        let entries = new
            .iter()
            .map(|u| (UserId::from(u.as_str()), pending.clone()));
        self.watches.seen.insert_new(entries);
        for user in &upgraded {
            if let Some(seen) = self.watches.seen.get_mut(user.as_str()) {
                seen.devices = true;
            }
        }
        let mut new = new;
        new.extend(upgraded);
        new.sort();
        self.request(Request::Watch { new, devices }, ctx);
    }

    /// Queues a request for Redis and starts it if nothing is in flight.
    pub(super) fn request(&mut self, request: Request, ctx: &mut ws::WebsocketContext<Self>) {
        if self.requests.queue.len() >= MAX_PENDING_REQUESTS {
            let mut err = ProtocolError::new(
                ErrorCode::RateLimited,
                format!(
                    "{MAX_PENDING_REQUESTS} requests are already waiting for the presence store; try again"
                ),
            );
            match &request {
                Request::Watch { new, .. } => self.forget_pending(new),
                Request::Room(room) => err = self.refused_room(room, err),
                _ => {}
            }
            self.send_error(ctx, &err);
            return;
        }
        self.request_always(request, ctx);
    }

    /// Queues a request the session makes of itself (a room joined again
    /// after a visibility change or a lost membership): never refused by
    /// the cap, which bounds what a client may pile up.
    pub(super) fn request_always(
        &mut self,
        request: Request,
        ctx: &mut ws::WebsocketContext<Self>,
    ) {
        self.requests.queue.push_back(request);
        self.next_request(ctx);
    }

    /// Starts the oldest waiting request, unless one is in flight or the
    /// lease is not claimed yet.
    pub(super) fn next_request(&mut self, ctx: &mut ws::WebsocketContext<Self>) {
        if self.requests.busy || !self.requests.ready {
            return;
        }
        let Some(request) = self.requests.queue.pop_front() else {
            return;
        };
        self.requests.busy = true;
        if self.requests.first == First::NotYet {
            self.requests.first = First::Running;
            self.node.claimer.first_request();
        }
        match request {
            Request::Watch { new, devices } => self.start_watch(new, devices, ctx),
            Request::Status {
                status,
                text,
                until,
            } => self.start_status(status, text, until, ctx),
            Request::Privacy { online, last_seen } => self.start_privacy(online, last_seen, ctx),
            Request::Recheck { user, attempt } => self.start_recheck(user, attempt, ctx),
            Request::Room(room) => self.start_room(room, ctx),
        }
    }

    /// The first request is answered, or the session stopped: its place
    /// among the sessions setting up is given back.
    pub(super) fn first_request_done(&mut self) {
        if self.requests.first == First::Running {
            self.requests.first = First::Done;
            self.node.claimer.first_request_done();
        }
    }

    /// The request in flight is answered: start the next one.
    pub(super) fn request_done(&mut self, ctx: &mut ws::WebsocketContext<Self>) {
        self.requests.busy = false;
        self.first_request_done();
        self.next_request(ctx);
    }

    /// Registers the watch (the registry answers once the node is
    /// subscribed to the new users' events), then reads the snapshot:
    /// subscribed first, so that no transition falls between the read and
    /// the subscription. Only users new to the session are read.
    pub(super) fn start_watch(
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
            .filter(|u| match self.watches.seen.get_mut(u.as_str()) {
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
        // The ids as the session holds them, for the registry to share.
        let users: Vec<UserId> = new
            .iter()
            .map(|u| match self.watches.seen.get_key_value(u.as_str()) {
                Some((k, _)) => k.clone(),
                None => UserId::from(u.as_str()),
            })
            .collect();
        let recheck = ctx.address().recipient();
        let viewer = self.me.user.clone();
        let fut = async move {
            // A subscription or read Redis did not answer in time (the node
            // is behind in a reconnect storm, a shard fails over) is tried
            // again, later each time, before the watch is refused: the
            // client asked once, and waits for its snapshot.
            for wait in SNAPSHOT_RETRIES.iter().map(Some).chain([None]) {
                let watch = registry::Watch {
                    session,
                    recheck: recheck.clone(),
                    users: users.clone(),
                    devices,
                };
                let failed = match registry.send(watch).await {
                    Ok(Ok(held)) => match store.presences(&new, Some(&viewer)).await {
                        Ok(records) => return Ok((records, held)),
                        Err(e) => format!("snapshot failed: {e}"),
                    },
                    Ok(Err(e)) => format!("cannot subscribe to watched users' events: {e}"),
                    Err(e) => {
                        log::error!("registry unreachable: {e}");
                        return Err(new);
                    }
                };
                let Some(wait) = wait else {
                    log::warn!("{failed}");
                    break;
                };
                log::debug!("{failed}; trying again in {wait:?}");
                tokio::time::sleep(*wait).await;
            }
            // Undo what this frame added; earlier watches stay.
            registry.do_send(registry::Unwatch {
                session,
                users: new.clone(),
            });
            Err(new)
        };
        ctx.spawn(fut.into_actor(self).map(|res, act, ctx| {
            match res {
                Ok((observed, held)) => {
                    act.watches.share(held);
                    let out: Vec<Record> = observed.iter().map(|o| act.observe(o)).collect();
                    act.send(ctx, protocol::snapshot_frame(&out));
                    let early: Vec<Deliver> = observed
                        .iter()
                        .filter_map(|o| act.watches.rare.take_early(&o.presence.user))
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
    pub(super) fn forget_pending(&mut self, users: &[String]) {
        for user in users {
            if self
                .watches
                .seen
                .get(user.as_str())
                .is_some_and(|s| s.pending)
            {
                self.watches.forget(user);
            }
            self.watches.rare.take_early(user);
        }
    }

    pub(super) fn start_status(
        &mut self,
        status: Status,
        text: Option<String>,
        until: Option<i64>,
        ctx: &mut ws::WebsocketContext<Self>,
    ) {
        // A session watching its own user holds that user's events until the
        // answer is read, like a snapshot: the event of this change is then
        // dropped as already seen, instead of arriving beside the answer.
        // (One already pending waits for its own snapshot instead.)
        let held = match self.watches.seen.get_mut(self.me.user.as_str()) {
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
            let since = store
                .set_status(&user, status, text.as_deref(), until)
                .await?;
            let own = store
                .presences(std::slice::from_ref(&user), Some(&user))
                .await;
            Ok::<_, crate::store::StoreError>((since, own))
        };
        ctx.spawn(set.into_actor(self).map(move |res, act, ctx| {
            match res {
                Ok((since, own)) => {
                    // The store swept the user's rooms with the change.
                    let known = act.lease.known_status.get_or_insert_default();
                    known.status = status.as_str().to_string();
                    known.text = chosen_text;
                    known.since = since;
                    known.until = until.unwrap_or(0);
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
                if let Some(seen) = act.watches.seen.get_mut(me.as_str()) {
                    seen.pending = false;
                }
                if let Some(event) = act.watches.rare.take_early(&me) {
                    act.deliver(event, ctx);
                }
            }
            act.request_done(ctx);
        }));
    }

    pub(super) fn start_privacy(
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
    /// it may see changed. A failed read is tried again, later and later,
    /// until it works or the watch ends; meanwhile the viewer keeps the
    /// non-contact view [`Session::contacts_changed`] gave it. A read that
    /// a newer contacts change overtook is dropped: that change's own
    /// re-read follows.
    pub(super) fn start_recheck(
        &mut self,
        user: String,
        attempt: u32,
        ctx: &mut ws::WebsocketContext<Self>,
    ) {
        let Some(marker) = self.watches.seen.get(user.as_str()).map(|s| s.marker) else {
            return self.request_done(ctx);
        };
        let store = self.node.store.clone();
        let viewer = self.me.user.clone();
        let users = [user.clone()];
        let read = async move { store.presences(&users, Some(&viewer)).await };
        ctx.spawn(read.into_actor(self).map(move |res, act, ctx| {
            let current = act.watches.seen.get(user.as_str()).map(|s| s.marker) == Some(marker);
            match res {
                Ok(records) => {
                    for o in records.iter().filter(|_| current) {
                        let before = act.watches.seen.get(user.as_str()).map(|s| s.fingerprint);
                        let record = act.observe(o);
                        let after = act.watches.seen.get(user.as_str()).map(|s| s.fingerprint);
                        if after != before {
                            act.send(ctx, protocol::presence_frame(&record));
                        }
                    }
                }
                Err(e) => {
                    log::warn!(
                        "{}: re-reading {user} after its contacts changed failed (try {}): {e}",
                        act.me.user,
                        attempt + 1
                    );
                    let delay = Duration::from_millis(100 << attempt.min(6));
                    ctx.run_later(delay, move |act, ctx| {
                        act.queue_recheck(user, attempt + 1, ctx)
                    });
                }
            }
            act.request_done(ctx);
        }));
    }

    /// Queues a re-read of a watched user, unless one is waiting already:
    /// the session asks it of itself, so the request cap never refuses it.
    fn queue_recheck(&mut self, user: String, attempt: u32, ctx: &mut ws::WebsocketContext<Self>) {
        let waiting = self
            .requests
            .queue
            .iter()
            .any(|r| matches!(r, Request::Recheck { user: u, .. } if *u == user));
        if self.watches.seen.contains_key(user.as_str()) && !waiting {
            self.request_always(Request::Recheck { user, attempt }, ctx);
        }
    }

    /// A watched user's contacts changed: this viewer may no longer be one.
    /// It falls back at once to what a non-contact may see (told to the
    /// client if that differs from what it was told), so that the events
    /// that follow are filtered as for a non-contact; the re-read that
    /// follows gives back what it may see, if more.
    fn contacts_changed(&mut self, user: String, ctx: &mut ws::WebsocketContext<Self>) {
        let stranger = Relation::stranger(self.node.config.contacts_only);
        let Some(seen) = self.watches.seen.get_mut(user.as_str()) else {
            return;
        };
        seen.marker = seen.marker.wrapping_add(1);
        if seen.relation == Relation::Contact {
            seen.relation = stranger;
            let view = self.watches.rare.take_stranger(user.as_str());
            if let Some(view) = view
                .filter(|v| !seen.pending && v.fingerprint_for(seen.devices) != seen.fingerprint)
            {
                seen.fingerprint = view.fingerprint_for(seen.devices);
                self.send(ctx, view.frame);
            }
        }
        self.queue_recheck(user, 0, ctx);
    }

    /// Takes in a fresh read of a watched user: how this viewer stands to
    /// it, its sequence number, and the view this client now holds. The
    /// view is returned even for a user unwatched meanwhile, whose entry
    /// stays gone.
    pub(super) fn observe(&mut self, o: &Observed) -> Record {
        let relation = o.relation(Some(&self.me.user), self.node.config.contacts_only);
        let record = privacy::view(&o.presence, relation);
        let user = o.presence.user.as_str();
        let key = self
            .watches
            .seen
            .get_key_value(user)
            .map(|(k, _)| k.clone());
        if let (Some(key), Some(seen)) = (key, self.watches.seen.get_mut(user)) {
            seen.seq = seen.seq.max(o.seq);
            seen.relation = relation;
            seen.fingerprint = seen.fingerprint_of(&record);
            seen.pending = false;
            if relation == Relation::Contact {
                let stranger = Relation::stranger(self.node.config.contacts_only);
                let view = View::of(&privacy::view(&o.presence, stranger));
                self.watches.rare.maps().strangers.insert(key, view);
            } else {
                self.watches.rare.take_stranger(user);
            }
        }
        record
    }

    /// Passes a transition on to the client if it is news to it.
    pub(super) fn deliver(&mut self, msg: Deliver, ctx: &mut ws::WebsocketContext<Self>) {
        let Some(seen) = self.watches.seen.get_mut(&msg.user) else {
            return;
        };
        if seen.pending {
            // Held until the snapshot: keep the newest.
            let early = &mut self.watches.rare.maps().early;
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
        if seen.relation == Relation::Contact {
            let stranger = Relation::stranger(self.node.config.contacts_only);
            let view = msg.views[stranger.index()].clone();
            let strangers = &mut self.watches.rare.maps().strangers;
            match strangers.get_mut(&*msg.user) {
                Some(held) => *held = view,
                None => {
                    strangers.insert(UserId::from(&*msg.user), view);
                }
            }
        }
        let view = &msg.views[seen.relation.index()];
        let fingerprint = view.fingerprint_for(seen.devices);
        if fingerprint == seen.fingerprint {
            return;
        }
        seen.fingerprint = fingerprint;
        crate::metrics::METRICS.transitions_delivered.inc();
        self.send(ctx, view.frame.clone());
    }
}

/// What the worker's delivery lists bring ([`crate::registry::fanout`]):
/// records of watched users and events of the session's rooms, in the
/// order the registry handed them out.
impl Handler<Inbound> for Session {
    type Result = ();

    fn handle(&mut self, msg: Inbound, ctx: &mut Self::Context) {
        match msg {
            Inbound::Presence(deliver) => self.deliver(deliver, ctx),
            Inbound::Room(room) => self.room_event(room.event, ctx),
        }
    }
}

impl Handler<Recheck> for Session {
    type Result = ();

    /// The user's contacts changed: what this viewer may see of it may have
    /// changed too; it sees what a non-contact sees until a re-read says.
    fn handle(&mut self, msg: Recheck, ctx: &mut Self::Context) {
        self.contacts_changed(msg.user, ctx);
    }
}
