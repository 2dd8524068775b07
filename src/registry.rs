//! The registry actor, one per node: which local sessions watch which users.
//!
//! It subscribes to `presence-events` (every transition of every user, from
//! every node) and delivers each event only to the local sessions that watch
//! that user. The frame is serialized once per event and shared by all of
//! its watchers.

use std::collections::{HashMap, HashSet};

use actix::prelude::*;
use bytestring::ByteString;

use crate::keys;
use crate::protocol::{self, Event};

/// Identifies one session within this node.
pub type SessionId = u64;

/// A presence event for one watched user, ready to send.
#[derive(Message, Clone)]
#[rtype(result = "()")]
pub struct Deliver {
    /// The user the event is about.
    pub user: ByteString,
    /// The user's transition sequence number.
    pub seq: u64,
    /// The `presence` frame, serialized once for every watcher.
    pub frame: ByteString,
}

/// Adds `users` to what `session` watches.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Watch {
    /// The watching session.
    pub session: SessionId,
    /// Where its events go.
    pub addr: Recipient<Deliver>,
    /// Users to watch.
    pub users: Vec<String>,
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

/// A payload published on `presence-events`.
#[derive(Message)]
#[rtype(result = "()")]
struct Published {
    /// JSON written by the Lua scripts.
    payload: String,
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
}

/// One watching session.
struct Watcher {
    /// Where its events go.
    addr: Recipient<Deliver>,
    /// What it watches, so that a disconnect can be undone in one step.
    users: HashSet<String>,
}

/// The registry actor.
pub struct Registry {
    /// Source of the dedicated pub/sub connection.
    client: redis::Client,
    /// Watched user -> sessions watching it.
    by_user: HashMap<String, HashSet<SessionId>>,
    /// Session -> its address and watched users.
    watchers: HashMap<SessionId, Watcher>,
    /// Every open session of this node, for the shutdown notice.
    sessions: HashMap<SessionId, Recipient<GoingAway>>,
}

impl Registry {
    /// A registry that will subscribe through `client`.
    pub fn new(client: redis::Client) -> Self {
        Self {
            client,
            by_user: HashMap::new(),
            watchers: HashMap::new(),
            sessions: HashMap::new(),
        }
    }

    fn unwatch(&mut self, session: SessionId, user: &str) {
        if let Some(sessions) = self.by_user.get_mut(user) {
            sessions.remove(&session);
            if sessions.is_empty() {
                self.by_user.remove(user);
            }
        }
    }
}

impl Actor for Registry {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        let addr = ctx.address();
        let client = self.client.clone();
        actix::spawn(crate::pubsub::run(
            client,
            keys::EVENTS.to_string(),
            || {},
            move |payload| {
                if !addr.connected() {
                    return false;
                }
                addr.do_send(Published { payload });
                true
            },
        ));
    }
}

impl Handler<Watch> for Registry {
    type Result = ();

    fn handle(&mut self, msg: Watch, _: &mut Self::Context) {
        let watcher = self.watchers.entry(msg.session).or_insert_with(|| Watcher {
            addr: msg.addr,
            users: HashSet::new(),
        });
        for user in msg.users {
            self.by_user
                .entry(user.clone())
                .or_default()
                .insert(msg.session);
            watcher.users.insert(user);
        }
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
        self.sessions.insert(msg.session, msg.addr);
    }
}

impl Handler<Shutdown> for Registry {
    type Result = usize;

    fn handle(&mut self, _: Shutdown, _: &mut Self::Context) -> usize {
        for addr in self.sessions.values() {
            addr.do_send(GoingAway);
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
    }
}

impl Handler<Published> for Registry {
    type Result = ();

    fn handle(&mut self, msg: Published, _: &mut Self::Context) {
        let event: Event = match serde_json::from_str(&msg.payload) {
            Ok(e) => e,
            Err(e) => {
                log::warn!("ignoring malformed presence event ({e}): {}", msg.payload);
                return;
            }
        };
        let Some(sessions) = self.by_user.get(&event.record.user) else {
            return;
        };
        let deliver = Deliver {
            user: ByteString::from(event.record.user.as_str()),
            seq: event.seq,
            frame: ByteString::from(protocol::presence_frame(&event.record)),
        };
        for session in sessions {
            if let Some(w) = self.watchers.get(session) {
                w.addr.do_send(deliver.clone());
            }
        }
    }
}

impl Handler<GetStats> for Registry {
    type Result = RegistryStats;

    fn handle(&mut self, _: GetStats, _: &mut Self::Context) -> RegistryStats {
        RegistryStats {
            sessions: self.sessions.len(),
            watching_sessions: self.watchers.len(),
            watched_users: self.by_user.len(),
        }
    }
}
