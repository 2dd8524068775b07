//! The registry actor, one per node: which local sessions watch which users.
//!
//! It holds a sharded subscription to `presence-events:{<user>}` exactly
//! while one of its sessions watches that user (through
//! [`crate::subscriber`]): subscribed before the watcher's snapshot is read,
//! unsubscribed a short [`LINGER`] after the last local watcher left. So a
//! node hears only about users its sessions watch, and a fleet of many nodes
//! costs no more per event than one. Each event is delivered only to the
//! local sessions that watch that user; the frame is serialized once per
//! event and shared by all of its watchers.
//!
//! Pub/sub is fire-and-forget: whatever is published while a subscription
//! is down is gone. So after every resubscription the registry re-reads the
//! watched users and hands their current records to the sessions, which pass
//! on only what differs from what they last told their client. The re-read
//! waits one heartbeat, so that after Redis came back empty the live
//! sessions have re-asserted their leases first and nobody flickers.

use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use bytestring::ByteString;
use tokio::sync::oneshot;

use crate::redis::cluster::Source;
use crate::conn::ConnHandle;
use crate::fanout::{self, Home, SlowWatchers};
use crate::keys;
use crate::model::{Audience, Event, Presence, Record};
use crate::privacy::{self, Relation};
use crate::protocol;
use crate::store::{Observed, Store};
use crate::subscriber::{Notice, Subscriptions};

/// Identifies one session within this node.
pub type SessionId = u64;

/// Users re-read per round trip during a resync.
const RESYNC_BATCH: usize = 1_000;
/// How long a node keeps a user's subscription after its last local
/// watcher left: a watcher that comes back (a page reload, a reconnect)
/// finds it still in place.
pub const LINGER: Duration = Duration::from_secs(2);

/// One viewer class's view of a transition, ready to send.
#[derive(Debug, Clone)]
pub struct View {
    /// What the viewer can tell apart (status and text); equal
    /// fingerprints mean nothing changed for the viewer.
    pub fingerprint: u64,
    /// The same for a viewer who asked for device counts: status, text
    /// and devices.
    pub devices_fingerprint: u64,
    /// The `presence` frame.
    pub frame: ByteString,
}

/// A transition (or re-read) of one watched user, ready to send: one view
/// per [`Relation`], each serialized once for all watchers of that class.
#[derive(Message, Clone)]
#[rtype(result = "()")]
pub struct Deliver {
    /// The user the record is about.
    pub user: ByteString,
    /// The user's transition sequence number.
    pub seq: u64,
    /// A re-read after missed events rather than a live event: passed on
    /// only if it differs from what the session last sent.
    pub resync: bool,
    /// The views, indexed by [`Relation::index`].
    pub views: Arc<[View; 4]>,
    /// Only the device count changed: handed only to the watchers who
    /// asked for device counts.
    pub devices_only: bool,
}

impl Deliver {
    /// A delivery of `presence`.
    pub fn new(presence: &Presence, seq: u64, resync: bool) -> Self {
        let views = Relation::ALL.map(|r| {
            let record = privacy::view(presence, r);
            View {
                fingerprint: fingerprint(&record),
                devices_fingerprint: devices_fingerprint(&record),
                frame: ByteString::from(protocol::presence_frame(&record)),
            }
        });
        Self {
            user: ByteString::from(presence.user.as_str()),
            seq,
            resync,
            views: Arc::new(views),
            devices_only: false,
        }
    }
}

/// Asks a session to re-read a watched user whose contacts changed, since
/// what it may see of that user may have changed.
#[derive(Message, Clone)]
#[rtype(result = "()")]
pub struct Recheck {
    /// The user whose contacts changed.
    pub user: String,
}

/// What a watcher can tell apart in a record: its status and text. Device
/// counts and last-seen times change without a transition.
pub fn fingerprint(record: &Record) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    record.status.hash(&mut h);
    record.text.hash(&mut h);
    h.finish()
}

/// What a watcher who asked for device counts can tell apart: status,
/// text and the number of devices.
pub fn devices_fingerprint(record: &Record) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    record.status.hash(&mut h);
    record.text.hash(&mut h);
    record.devices.hash(&mut h);
    h.finish()
}

/// Adds `users` to what `session` watches; answers once the node is
/// subscribed to each of their events, so that a snapshot read after it
/// misses nothing. `Err` when Redis could not confirm the subscription.
#[derive(Message)]
#[rtype(result = "Result<(), String>")]
pub struct Watch {
    /// The watching session.
    pub session: SessionId,
    /// Where re-read requests go.
    pub recheck: Recipient<Recheck>,
    /// Users to watch.
    pub users: Vec<String>,
    /// The session also wants their device-count changes.
    pub devices: bool,
}

/// Removes `users` from what `session` watches.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Unwatch {
    /// The watching session.
    pub session: SessionId,
    /// Users to stop watching.
    pub users: Vec<String>,
}

/// Announces a session of this node, so that a shutdown can reach it.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Join {
    /// The new session.
    pub session: SessionId,
    /// Where the shutdown notice goes.
    pub addr: Recipient<GoingAway>,
    /// Its TCP connection, cut if the session falls too far behind.
    pub conn: Option<ConnHandle>,
    /// When its client was last heard from, epoch ms (kept by the session).
    pub alive: Arc<AtomicI64>,
    /// The worker it runs on, where its events are handed out.
    pub home: Home,
}

/// Tells a session that the node is shutting down.
#[derive(Message, Clone, Copy)]
#[rtype(result = "()")]
pub struct GoingAway;

/// Asks every session of this node to close with 1001; returns how many.
#[derive(Message)]
#[rtype(result = "usize")]
pub struct Shutdown;

/// Forgets a session that closed.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Disconnect {
    /// The closed session.
    pub session: SessionId,
}

/// What the subscription task reported.
#[derive(Message)]
#[rtype(result = "()")]
struct FromSubscriptions(Notice);

/// Records re-read after a resubscription.
#[derive(Message)]
#[rtype(result = "()")]
struct Resynced {
    /// Which resync they belong to.
    round: u64,
    /// The users as read.
    records: Vec<Observed>,
}

/// Numbers for `/healthz` and tests.
#[derive(Message)]
#[rtype(result = "RegistryStats")]
pub struct GetStats;

/// What the registry holds now.
#[derive(Debug, Clone, Copy, Default, serde::Serialize, MessageResponse)]
pub struct RegistryStats {
    /// Open sessions on this node.
    pub sessions: usize,
    /// Sessions watching at least one user.
    pub watching_sessions: usize,
    /// Distinct users watched on this node.
    pub watched_users: usize,
    /// Records re-sent to sessions by resyncs since start.
    pub resynced: u64,
}

/// Close code for a session the node gives up on while its client is
/// fine: 1013, try again later.
const CLOSE_TRY_AGAIN: u16 = 1013;

impl From<RegistryStats> for crate::metrics::NodeGauges {
    fn from(s: RegistryStats) -> Self {
        Self {
            sessions: s.sessions,
            watching_sessions: s.watching_sessions,
            watched_users: s.watched_users,
        }
    }
}

/// One open session of this node.
struct Joined {
    /// Where the shutdown notice goes.
    going_away: Recipient<GoingAway>,
    /// Its TCP connection, to cut it from here.
    conn: Option<ConnHandle>,
    /// When its client was last heard from, epoch ms.
    alive: Arc<AtomicI64>,
    /// Its worker: an index into [`Registry::homes`].
    home: usize,
}

/// One watching session; its events go through its worker's delivery
/// list ([`fanout`]).
struct Watcher {
    /// Where re-read requests go.
    recheck: Recipient<Recheck>,
    /// What it watches, so that a disconnect can be undone in one step.
    users: HashSet<String>,
}

/// The registry actor.
pub struct Registry {
    /// Source of the dedicated pub/sub connection.
    client: Source,
    /// The node's sharded subscriptions (set once started).
    subscriptions: Option<Subscriptions>,
    /// Users whose events channel Redis has confirmed subscribed.
    subscribed: HashSet<String>,
    /// Users no local session watches any more, with when their
    /// subscription is to be dropped (see [`LINGER`]).
    lingering: HashMap<String, Instant>,
    /// Reads records for resyncs.
    store: Store,
    /// How long a resync waits for live sessions to re-assert.
    resync_delay: Duration,
    /// Watch policy `contacts`: every view depends on contacts.
    contacts_only: bool,
    /// A session whose client has been silent this long is frozen (its
    /// socket stopped taking bytes, so its own heartbeat cannot run) and is
    /// cut off; a running session closes itself well before.
    stall_after: Duration,
    /// Told once the first subscription is in place.
    ready: Option<oneshot::Sender<()>>,
    /// Watched user -> sessions watching it.
    by_user: HashMap<String, HashSet<SessionId>>,
    /// Watched user -> the sessions among [`Registry::by_user`] that asked
    /// for its device counts: the only ones a `devices_only` event wakes.
    devices_by_user: HashMap<String, HashSet<SessionId>>,
    /// Session -> its re-read address and watched users.
    watchers: HashMap<SessionId, Watcher>,
    /// Every open session of this node: where the shutdown notice goes,
    /// its connection and its worker.
    sessions: HashMap<SessionId, Joined>,
    /// The workers sessions run on (a handful, one per HTTP worker).
    homes: Vec<Home>,
    /// This actor, where the delivery lists report slow watchers.
    me: Option<Addr<Registry>>,
    /// Current resync round (0: none yet).
    round: u64,
    /// A resync read is in flight.
    reading: bool,
    /// Users with a live event since the current resync's read began: their
    /// event is newer than the read, which must not override it.
    touched: HashSet<String>,
    /// Records re-sent by resyncs.
    resynced: u64,
    /// The node is shutting down ([`Shutdown`]): a session that joins from
    /// now on (its first-frame token verified late) is told at once.
    shutting_down: bool,
}

impl Registry {
    /// A registry that subscribes through `client`, re-reads through
    /// `store` after resubscribing (waiting `resync_delay` first), and
    /// signals `ready` once first subscribed.
    pub fn new(
        client: impl Into<Source>,
        store: Store,
        resync_delay: Duration,
        contacts_only: bool,
        stall_after: Duration,
        ready: oneshot::Sender<()>,
    ) -> Self {
        Self {
            client: client.into(),
            subscriptions: None,
            subscribed: HashSet::new(),
            lingering: HashMap::new(),
            store,
            resync_delay,
            contacts_only,
            stall_after,
            ready: Some(ready),
            by_user: HashMap::new(),
            devices_by_user: HashMap::new(),
            watchers: HashMap::new(),
            sessions: HashMap::new(),
            homes: Vec::new(),
            me: None,
            round: 0,
            reading: false,
            touched: HashSet::new(),
            resynced: 0,
            shutting_down: false,
        }
    }

    fn unwatch(&mut self, session: SessionId, user: &str) {
        if let Some(sessions) = self.devices_by_user.get_mut(user) {
            sessions.remove(&session);
            if sessions.is_empty() {
                self.devices_by_user.remove(user);
            }
        }
        if let Some(sessions) = self.by_user.get_mut(user) {
            sessions.remove(&session);
            if sessions.is_empty() {
                self.by_user.remove(user);
                self.lingering
                    .insert(user.to_string(), Instant::now() + LINGER);
            } else if sessions.capacity() > 64 && sessions.len() * 4 < sessions.capacity() {
                sessions.shrink_to_fit();
            }
        }
    }

    /// Drops the subscriptions of users unwatched for [`LINGER`].
    fn drop_lingering(&mut self) {
        let now = Instant::now();
        let due: Vec<String> = self
            .lingering
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(u, _)| u.clone())
            .collect();
        if due.is_empty() {
            return;
        }
        let mut channels = Vec::with_capacity(due.len());
        for user in due {
            self.lingering.remove(&user);
            if !self.by_user.contains_key(&user) && self.subscribed.remove(&user) {
                channels.push(keys::events(&user));
            }
        }
        if let Some(subs) = &self.subscriptions {
            if !channels.is_empty() {
                subs.unsubscribe(channels);
            }
        }
        self.lingering.shrink_to_fit();
        self.subscribed.shrink_to_fit();
    }

    /// Hands `deliver` to every local watcher of its user: one delivery
    /// list per worker, which puts the event into its watchers' mailboxes
    /// from there ([`fanout`]). A session whose mailbox is full has a client
    /// that stopped reading (its actor only runs while the socket takes
    /// bytes): the list reports it ([`SlowWatchers`]) and it is cut off
    /// rather than allowed to grow the node's memory.
    fn deliver(&mut self, deliver: Deliver) {
        let watchers = if deliver.devices_only {
            &self.devices_by_user
        } else {
            &self.by_user
        };
        let Some(sessions) = watchers.get(&*deliver.user) else {
            return;
        };
        let Some(me) = &self.me else {
            return;
        };
        let mut lists: Vec<Vec<SessionId>> = vec![Vec::new(); self.homes.len()];
        for session in sessions {
            if let Some(joined) = self.sessions.get(session) {
                lists[joined.home].push(*session);
            }
        }
        for (home, list) in self.homes.iter().zip(lists) {
            if !list.is_empty() {
                fanout::send(home, deliver.clone(), list, me.clone().recipient());
            }
        }
    }

    /// Cuts off sessions whose client has not been heard from for
    /// `stall_after`: a client that stops reading freezes its session
    /// (whose own heartbeat then cannot run) even when no event is queued.
    fn cut_frozen(&mut self) {
        let limit = crate::store::now_ms() - self.stall_after.as_millis() as i64;
        // A session whose client reads everything it was sent (empty send
        // queue) is not frozen by its client but held up on the server
        // (e.g. waiting on Redis): it stays, and resumes by itself.
        let frozen: Vec<SessionId> = self
            .sessions
            .iter()
            .filter(|(_, s)| s.alive.load(Ordering::Relaxed) < limit)
            .filter(|(_, s)| s.conn.is_none_or(|c| c.unsent() != Some(0)))
            .map(|(id, _)| *id)
            .collect();
        for session in frozen {
            self.cut_off(session);
            // Cut once: its close will send Disconnect.
            if let Some(s) = self.sessions.get(&session) {
                s.alive.store(i64::MAX, Ordering::Relaxed);
            }
        }
    }

    /// Asks every local watcher of `user` to re-read how it stands to it.
    /// A watcher whose mailbox is full is cut off like for an event: a
    /// lost re-read could leave it seeing what it no longer may.
    fn recheck(&mut self, user: &str) {
        let Some(sessions) = self.by_user.get(user) else {
            return;
        };
        let mut slow = Vec::new();
        for session in sessions {
            if let Some(w) = self.watchers.get(session) {
                let msg = Recheck {
                    user: user.to_string(),
                };
                if let Err(SendError::Full(_)) = w.recheck.try_send(msg) {
                    slow.push(*session);
                }
            }
        }
        for session in slow {
            self.cut_off(session);
        }
    }

    /// Disconnects a session that cannot keep up; its close releases its
    /// device like any other.
    /// A session whose client reads (its send queue is empty) fell behind
    /// because the server held it up (waiting on Redis): it gets a close
    /// frame, 1013 "try again later", not a bare cut.
    fn cut_off(&mut self, session: SessionId) {
        if let Some(Joined {
            conn: Some(conn), ..
        }) = self.sessions.get(&session)
        {
            if conn.unsent() == Some(0) {
                log::warn!("session {session} is held up on the server: its queue is full, closing with 1013");
                conn.close(CLOSE_TRY_AGAIN, "server overloaded, reconnect");
            } else {
                log::warn!("session {session} reads too slowly: its queue is full, disconnecting");
                crate::metrics::slow_consumer_dropped();
                conn.cut();
            }
        }
        if let Some(w) = self.watchers.remove(&session) {
            for user in &w.users {
                self.unwatch(session, user);
            }
        }
    }

    /// Re-reads every watched user after `resync_delay`.
    fn resync(&mut self, ctx: &mut Context<Self>) {
        self.round += 1;
        let round = self.round;
        ctx.run_later(self.resync_delay, move |act, ctx| {
            if act.round != round {
                return; // a newer resubscription superseded this one
            }
            act.touched.clear();
            act.reading = true;
            let users: Vec<String> = act.by_user.keys().cloned().collect();
            let store = act.store.clone();
            let addr = ctx.address();
            actix::spawn(async move {
                let mut records = Vec::with_capacity(users.len());
                for batch in users.chunks(RESYNC_BATCH) {
                    match store.presences(batch, None).await {
                        Ok(r) => records.extend(r),
                        Err(e) => {
                            // Hand over what was read; the rest waits for
                            // the next resubscription.
                            log::warn!("resync read failed: {e}");
                            break;
                        }
                    }
                }
                addr.do_send(Resynced { round, records });
            });
        });
    }
}

impl Actor for Registry {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.me = Some(ctx.address());
        // After a freeze of the node (its clock jumped) every session looks
        // silent: skip judging for one stall period, so that each session's
        // own heartbeat gets its client heard first.
        let mut ticks = crate::clock::Ticks::new(self.stall_after / 2);
        let mut grace_until = None;
        ctx.run_interval(self.stall_after / 2, move |act, _| {
            let now = std::time::Instant::now();
            if ticks.jumped() {
                log::info!(
                    "the node was frozen; frozen-client checks resume in {:?}",
                    act.stall_after
                );
                grace_until = Some(now + act.stall_after);
            }
            if grace_until.is_some_and(|t| now < t) {
                return;
            }
            act.cut_frozen();
        });
        ctx.run_interval(LINGER / 4, |act, _| act.drop_lingering());
        let addr = ctx.address();
        let started = Subscriptions::start(&self.client, move |notice| {
            if !addr.connected() {
                return false;
            }
            addr.do_send(FromSubscriptions(notice));
            true
        });
        match started {
            Ok(subs) => self.subscriptions = Some(subs),
            Err(e) => {
                log::error!("cannot start the event subscriptions: {e}");
                ctx.stop();
            }
        }
    }
}

impl Handler<FromSubscriptions> for Registry {
    type Result = ();

    fn handle(&mut self, FromSubscriptions(notice): FromSubscriptions, ctx: &mut Self::Context) {
        match notice {
            Notice::Ready { .. } => match self.ready.take() {
                Some(ready) => {
                    let _ = ready.send(());
                }
                None => self.resync(ctx),
            },
            Notice::Message { channel, payload } => self.published(&channel, &payload),
            Notice::Dropped { channels } => {
                log::info!(
                    "{} subscription(s) dropped by redis and renewed; re-reading the watched users",
                    channels.len()
                );
                self.resync(ctx);
            }
        }
    }
}

impl Handler<Resynced> for Registry {
    type Result = ();

    fn handle(&mut self, msg: Resynced, _: &mut Self::Context) {
        if msg.round != self.round {
            return;
        }
        let mut sent = 0;
        for o in msg.records {
            if self.touched.contains(&o.presence.user) {
                continue;
            }
            sent += 1;
            self.deliver(Deliver::new(&o.presence, o.seq, true));
            // A contacts change may have been missed too: watchers of a
            // user whose view depends on contacts re-read their relation.
            let p = &o.presence;
            if self.contacts_only
                || p.show_online == Audience::Contacts
                || p.show_last_seen == Audience::Contacts
            {
                self.recheck(&p.user);
            }
        }
        self.resynced += sent;
        crate::metrics::registry_resynced(sent);
        self.touched.clear();
        self.reading = false;
        log::info!("resync: re-read {sent} watched users after resubscribing");
    }
}

impl Handler<Watch> for Registry {
    type Result = ResponseActFuture<Self, Result<(), String>>;

    fn handle(&mut self, msg: Watch, _: &mut Self::Context) -> Self::Result {
        let watcher = self.watchers.entry(msg.session).or_insert_with(|| Watcher {
            recheck: msg.recheck,
            users: HashSet::new(),
        });
        let mut unsubscribed = Vec::new();
        for user in msg.users {
            self.lingering.remove(&user);
            if !self.subscribed.contains(&user) {
                unsubscribed.push(user.clone());
            }
            self.by_user
                .entry(user.clone())
                .or_default()
                .insert(msg.session);
            if msg.devices {
                self.devices_by_user
                    .entry(user.clone())
                    .or_default()
                    .insert(msg.session);
            }
            watcher.users.insert(user);
        }
        let subs = self.subscriptions.clone();
        let channels: Vec<String> = unsubscribed.iter().map(|u| keys::events(u)).collect();
        let subscribe = async move {
            match subs {
                _ if channels.is_empty() => Ok(()),
                Some(subs) => subs.subscribe(channels).await.map_err(|e| e.to_string()),
                None => Err("the event subscriptions are not running".to_string()),
            }
        };
        Box::pin(subscribe.into_actor(self).map(move |res, act, _| {
            if res.is_ok() {
                // Confirmed; a user unwatched meanwhile lingers as usual.
                act.subscribed.extend(unsubscribed);
            }
            res
        }))
    }
}

impl Handler<Unwatch> for Registry {
    type Result = ();

    fn handle(&mut self, msg: Unwatch, _: &mut Self::Context) {
        for user in &msg.users {
            self.unwatch(msg.session, user);
        }
        if let Some(w) = self.watchers.get_mut(&msg.session) {
            for user in &msg.users {
                w.users.remove(user);
            }
            if w.users.is_empty() {
                self.watchers.remove(&msg.session);
            }
        }
    }
}

impl Handler<Join> for Registry {
    type Result = ();

    fn handle(&mut self, msg: Join, _: &mut Self::Context) {
        if self.shutting_down {
            msg.addr.do_send(GoingAway);
        }
        let home = match self.homes.iter().position(|h| h.thread == msg.home.thread) {
            Some(i) => i,
            None => {
                self.homes.push(msg.home);
                self.homes.len() - 1
            }
        };
        self.sessions.insert(
            msg.session,
            Joined {
                going_away: msg.addr,
                conn: msg.conn,
                alive: msg.alive,
                home,
            },
        );
    }
}

impl Handler<SlowWatchers> for Registry {
    type Result = ();

    fn handle(&mut self, msg: SlowWatchers, _: &mut Self::Context) {
        for session in msg.sessions {
            // Still watching: not cut off yet by an earlier list.
            if self.watchers.contains_key(&session) {
                self.cut_off(session);
            }
        }
    }
}

impl Handler<Shutdown> for Registry {
    type Result = usize;

    fn handle(&mut self, _: Shutdown, _: &mut Self::Context) -> usize {
        self.shutting_down = true;
        for s in self.sessions.values() {
            s.going_away.do_send(GoingAway);
        }
        self.sessions.len()
    }
}

impl Handler<Disconnect> for Registry {
    type Result = ();

    fn handle(&mut self, msg: Disconnect, _: &mut Self::Context) {
        self.sessions.remove(&msg.session);
        if let Some(w) = self.watchers.remove(&msg.session) {
            for user in &w.users {
                self.unwatch(msg.session, user);
            }
        }
        // Maps keep their largest size: give it back once they are mostly
        // empty, so that memory taken by a crowd that left is returned.
        shrink(&mut self.sessions);
        shrink(&mut self.watchers);
        shrink(&mut self.by_user);
        shrink(&mut self.devices_by_user);
    }
}

/// Shrinks a map that holds less than a quarter of its capacity.
fn shrink<K: std::hash::Hash + Eq, V>(map: &mut HashMap<K, V>) {
    if map.capacity() > 64 && map.len() * 4 < map.capacity() {
        map.shrink_to_fit();
    }
}

impl Registry {
    /// A payload on a user's events channel: a transition, or word that its
    /// contacts changed.
    fn published(&mut self, channel: &str, payload: &str) {
        let wire: Wire = match serde_json::from_str(payload) {
            Ok(w) => w,
            Err(e) => {
                log::warn!("ignoring malformed presence event on {channel} ({e}): {payload}");
                return;
            }
        };
        let user = match &wire {
            Wire::ContactsChanged { user, .. } => user,
            Wire::Event(event) => &event.presence.user,
        };
        // The channel names its user; a payload about someone else is not
        // ours to trust.
        if keys::parse_events(channel) != Some(user.as_str()) {
            log::warn!("ignoring an event about {user} on {channel}");
            return;
        }
        match wire {
            Wire::ContactsChanged { user, .. } => self.recheck(&user),
            Wire::Event(event) => {
                // A change of the device count alone wakes only the
                // watchers who asked for it; except during a resync read,
                // which it overrides for every watcher (it carries the
                // whole record, and the others pass it on only if their
                // view differs).
                if event.devices_only && !self.reading {
                    if self.devices_by_user.contains_key(&event.presence.user) {
                        let mut deliver = Deliver::new(&event.presence, event.seq, false);
                        deliver.devices_only = true;
                        self.deliver(deliver);
                    }
                    return;
                }
                if !event.devices_only {
                    crate::metrics::transition_published(event.presence.status.as_str());
                }
                if !self.by_user.contains_key(&event.presence.user) {
                    return;
                }
                if self.reading {
                    self.touched.insert(event.presence.user.clone());
                }
                self.deliver(Deliver::new(&event.presence, event.seq, false));
            }
        }
    }
}

/// What travels on `presence-events:{<user>}`.
#[derive(serde::Deserialize)]
#[serde(untagged)]
enum Wire {
    /// A user's contacts were replaced.
    ContactsChanged {
        /// The user.
        user: String,
        /// Always true; tells this shape apart.
        #[allow(dead_code)]
        contacts_changed: bool,
    },
    /// A transition, as published by the scripts.
    Event(Event),
}

impl Handler<GetStats> for Registry {
    type Result = RegistryStats;

    fn handle(&mut self, _: GetStats, _: &mut Self::Context) -> RegistryStats {
        RegistryStats {
            sessions: self.sessions.len(),
            watching_sessions: self.watchers.len(),
            watched_users: self.by_user.len(),
            resynced: self.resynced,
        }
    }
}
