//! The registry actor, one per node: which local sessions watch which users.
//!
//! It holds a sharded subscription to `presence-events:{<user>}` exactly
//! while one of its sessions watches that user (through
//! [`subscriptions`]): subscribed before the watcher's snapshot is read,
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

pub mod fanout;
mod handlers;
mod messages;
mod rooms;
mod subscriptions;
mod taken;
mod watching;

use crate::protocol::{try_again_reason, CLOSE_TRY_AGAIN, TRY_AGAIN_AFTER_MS};
pub use fanout::{Home, Inbound, SlowWatchers};
pub use messages::*;
use messages::{FromSubscriptions, Resynced};
pub use rooms::{JoinRoom, LeaveRoom, RoomResync};

use std::collections::{HashMap, HashSet};

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use watching::Watching;

use crate::ids::UserId;

use actix::prelude::*;
use tokio::sync::oneshot;

use crate::conn::ConnHandle;
use crate::redis::cluster::Source;
use crate::store::Store;
use subscriptions::{Channel, Notice, Subscriptions};

/// Identifies one session within this node.
pub type SessionId = u64;

/// Users re-read per round trip during a resync.
const RESYNC_BATCH: usize = 1_000;
/// How long a node keeps a user's subscription after its last local
/// watcher left: a watcher that comes back (a page reload, a reconnect)
/// finds it still in place.
pub const LINGER: Duration = Duration::from_secs(2);
/// Most subscriptions a node keeps lingering; beyond it they are all dropped
/// at once, so that sessions swapping whom they watch cannot hold a channel
/// per user they ever glanced at (issue 30, item 10).
pub const MAX_LINGERING: usize = 10_000;

/// One open session of this node.
struct Joined {
    /// Where the shutdown notice, or word that its device was taken, goes.
    end: Recipient<End>,
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
    /// What it watches, so that a disconnect can be undone in one step:
    /// sorted, each once.
    users: Vec<UserId>,
}

/// The registry actor.
pub struct Registry {
    /// Source of the dedicated pub/sub connection.
    client: Source,
    /// The node's sharded subscriptions (set once started).
    subscriptions: Option<Subscriptions>,
    /// Users no local session watches any more, with when their
    /// subscription is to be dropped (see [`LINGER`]) and whether Redis
    /// confirmed it. (A watched user's confirmation is in its
    /// [`Registry::by_user`] entry.)
    lingering: HashMap<UserId, (Instant, bool)>,
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
    by_user: HashMap<UserId, Watching>,
    /// Watched user -> the sessions among [`Registry::by_user`] that asked
    /// for its device counts: the only ones a `devices_only` event wakes.
    devices_by_user: HashMap<UserId, Watching>,
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
    /// Which local sessions are in which room.
    rooms: rooms::RoomInterest,
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
            rooms: rooms::RoomInterest::default(),
        }
    }

    /// Rooms in counts mode get `occupancy` frames, at most every
    /// `occupancy`, instead of every join, leave and update, and are read
    /// again for their members at most that often; members that asked for
    /// batches get a room's state updates every `state_tick`.
    pub fn with_rooms(mut self, occupancy: Duration, state_tick: Duration) -> Self {
        self.rooms = rooms::RoomInterest::new(occupancy, state_tick);
        self
    }

    fn unwatch(&mut self, session: SessionId, user: &str) {
        if let Some(sessions) = self.devices_by_user.get_mut(user) {
            if sessions.remove(session) {
                self.devices_by_user.remove(user);
            }
        }
        if let Some(sessions) = self.by_user.get_mut(user) {
            if sessions.remove(session) {
                let (user, watching) = self.by_user.remove_entry(user).expect("just found");
                let subscribed = watching.subscribed();
                self.lingering
                    .insert(user, (Instant::now() + LINGER, subscribed));
                if self.lingering.len() > MAX_LINGERING {
                    self.drop_lingering_until(Instant::now() + LINGER);
                }
            }
        }
    }

    /// The one shared copy of `user`'s id on this node: the registry's maps
    /// and sets all hold the same `UserId` (issue 29, memory per watch).
    fn intern(&self, user: UserId) -> UserId {
        if let Some((k, _)) = self.by_user.get_key_value(&*user) {
            return k.clone();
        }
        if let Some((k, _)) = self.lingering.get_key_value(&*user) {
            return k.clone();
        }
        user
    }

    /// Drops the subscriptions of users unwatched for [`LINGER`].
    fn drop_lingering(&mut self) {
        self.drop_lingering_until(Instant::now());
    }

    /// Drops the lingering subscriptions due by `until`.
    fn drop_lingering_until(&mut self, until: Instant) {
        let due: Vec<UserId> = self
            .lingering
            .iter()
            .filter(|(_, (at, _))| *at <= until)
            .map(|(u, _)| u.clone())
            .collect();
        if due.is_empty() {
            return;
        }
        let mut channels = Vec::with_capacity(due.len());
        for user in due {
            let subscribed = self.lingering.remove(&*user).is_some_and(|(_, s)| s);
            if subscribed && !self.by_user.contains_key(&*user) {
                channels.push(Channel::Events(user));
            }
        }
        if let Some(subs) = &self.subscriptions {
            if !channels.is_empty() {
                subs.unsubscribe(channels);
            }
        }
        self.lingering.shrink_to_fit();
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
        self.hand_out(&fanout::Inbound::Presence(deliver), sessions.iter());
    }

    /// Hands `inbound` to `sessions`: one delivery list per worker, which
    /// puts it into its sessions' mailboxes from there ([`fanout`]); those
    /// whose mailbox is full come back as [`SlowWatchers`].
    fn hand_out(&self, inbound: &fanout::Inbound, sessions: impl IntoIterator<Item = SessionId>) {
        let Some(me) = &self.me else {
            return;
        };
        let mut lists: Vec<Vec<SessionId>> = vec![Vec::new(); self.homes.len()];
        for session in sessions {
            if let Some(joined) = self.sessions.get(&session) {
                lists[joined.home].push(session);
            }
        }
        for (home, list) in self.homes.iter().zip(lists) {
            if !list.is_empty() {
                fanout::send(home, inbound.clone(), list, me.clone().recipient());
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
        for session in sessions.iter() {
            if let Some(w) = self.watchers.get(&session) {
                let msg = Recheck {
                    user: user.to_string(),
                };
                if let Err(SendError::Full(_)) = w.recheck.try_send(msg) {
                    slow.push(session);
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
                conn.close(
                    CLOSE_TRY_AGAIN,
                    &try_again_reason("server overloaded", TRY_AGAIN_AFTER_MS),
                );
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
        // Nor room events: one cut-off is enough.
        self.leave_rooms(session);
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
            let users: Vec<String> = act.by_user.keys().map(|u| u.to_string()).collect();
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
        ctx.run_interval(self.rooms.tick(), |act, ctx| {
            act.rooms.flush();
            act.start_room_reads(ctx);
        });
        ctx.run_interval(self.rooms.state_tick(), |act, _| {
            act.rooms.flush_batches();
            act.send_room_events();
        });
        let addr = ctx.address();
        // The node's own channel, for good: word about its sockets from the
        // nodes that take their devices (`taken.rs`).
        let own = vec![Channel::Named(crate::keys::node_events(self.store.run()))];
        let started = Subscriptions::start(&self.client, own, move |notice| {
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

/// A hash set or map whose table can be given back.
pub(crate) trait Sparse {
    /// Slots the table holds.
    fn capacity(&self) -> usize;
    /// Entries in it.
    fn len(&self) -> usize;
    /// Gives the spare slots back.
    fn shrink(&mut self);
}

impl<T: std::hash::Hash + Eq> Sparse for HashSet<T> {
    fn capacity(&self) -> usize {
        HashSet::capacity(self)
    }
    fn len(&self) -> usize {
        HashSet::len(self)
    }
    fn shrink(&mut self) {
        self.shrink_to_fit();
    }
}

impl<K: std::hash::Hash + Eq, V> Sparse for HashMap<K, V> {
    fn capacity(&self) -> usize {
        HashMap::capacity(self)
    }
    fn len(&self) -> usize {
        HashMap::len(self)
    }
    fn shrink(&mut self) {
        self.shrink_to_fit();
    }
}

/// Shrinks a table of more than `min_capacity` slots that holds less than
/// a quarter of them: tables keep their largest size otherwise, so memory
/// taken by a crowd that left would stay resident.
pub(crate) fn shrink_if_sparse(table: &mut impl Sparse, min_capacity: usize) {
    if table.capacity() > min_capacity && table.len() * 4 < table.capacity() {
        table.shrink();
    }
}
