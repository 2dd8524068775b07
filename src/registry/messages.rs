//! The registry's messages: what sessions and the subscriptions tell it,
//! and what it hands to sessions (events, re-read requests, shutdown).

use std::hash::{Hash, Hasher};
use std::sync::atomic::AtomicI64;
use std::sync::Arc;

use actix::prelude::*;
use bytestring::ByteString;

use super::*;
use crate::conn::ConnHandle;
use crate::model::{Presence, Record};
use crate::privacy::{self, Relation};
use crate::protocol;
use crate::store::Observed;

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

impl View {
    /// The view that shows `record`.
    pub fn of(record: &Record) -> Self {
        View {
            fingerprint: fingerprint(record),
            devices_fingerprint: devices_fingerprint(record),
            frame: ByteString::from(protocol::presence_frame(record)),
        }
    }

    /// The fingerprint a watcher compares: with device counts if it asked
    /// for them.
    pub fn fingerprint_for(&self, devices: bool) -> u64 {
        if devices {
            self.devices_fingerprint
        } else {
            self.fingerprint
        }
    }
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
        let views = Relation::ALL.map(|r| View::of(&privacy::view(presence, r)));
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

/// What a watcher can tell apart in a record: its status, text, until and
/// idle mark. Device
/// counts and last-seen times change without a transition.
pub fn fingerprint(record: &Record) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    record.status.hash(&mut h);
    record.text.hash(&mut h);
    record.until.hash(&mut h);
    record.idle.hash(&mut h);
    h.finish()
}

/// What a watcher who asked for device counts can tell apart: status,
/// text, until, the number of devices and their kinds.
pub fn devices_fingerprint(record: &Record) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    record.status.hash(&mut h);
    record.text.hash(&mut h);
    record.until.hash(&mut h);
    record.devices.hash(&mut h);
    record.kinds.hash(&mut h);
    record.idle.hash(&mut h);
    h.finish()
}

/// Adds `users` to what `session` watches; answers once the node is
/// subscribed to each of their events, so that a snapshot read after it
/// misses nothing. `Err` when Redis could not confirm the subscription.
/// `Ok` holds the registry's copies of the users' ids, for the session to
/// keep instead of its own: one copy per user on the node.
#[derive(Message)]
#[rtype(result = "Result<Vec<UserId>, String>")]
pub struct Watch {
    /// The watching session.
    pub session: SessionId,
    /// Where re-read requests go.
    pub recheck: Recipient<Recheck>,
    /// Users to watch: the session's own copies of their ids, which the
    /// registry keeps when it has none yet (one copy per user on the node).
    pub users: Vec<UserId>,
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

/// Announces a session of this node, so that a shutdown, or word that its
/// device was taken from it, can reach it.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Join {
    /// The new session: its lease value, which is how word from another
    /// node names it.
    pub session: SessionId,
    /// Where [`End`] goes.
    pub addr: Recipient<End>,
    /// Its TCP connection, cut if the session falls too far behind.
    pub conn: Option<ConnHandle>,
    /// When its client was last heard from, epoch ms (kept by the session).
    pub alive: Arc<AtomicI64>,
    /// The worker it runs on, where its events are handed out.
    pub home: Home,
}

/// Tells a session to end: the node is shutting down, or its device was
/// taken from it. One message for both, so that the registry holds one
/// address per session.
#[derive(Message, Clone, Debug, PartialEq, Eq)]
#[rtype(result = "()")]
pub enum End {
    /// The node is shutting down.
    GoingAway,
    /// The device was taken away (`DELETE`) or over (an HTTP heartbeat)
    /// from outside this connection.
    Taken {
        /// The user the lease was taken from, checked by the session.
        user: String,
        /// The device, likewise.
        device: String,
        /// Why.
        why: crate::store::TakenWhy,
    },
}

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
pub(super) struct FromSubscriptions(pub(super) Notice);

/// Records re-read after a resubscription.
#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct Resynced {
    /// Which resync they belong to.
    pub(super) round: u64,
    /// The users as read.
    pub(super) records: Vec<Observed>,
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
    /// Rooms with a member on this node.
    pub rooms: usize,
    /// Room memberships of this node's sessions.
    pub room_memberships: usize,
}

impl From<RegistryStats> for crate::metrics::NodeGauges {
    fn from(s: RegistryStats) -> Self {
        Self {
            sessions: s.sessions,
            watching_sessions: s.watching_sessions,
            watched_users: s.watched_users,
            rooms: s.rooms,
            room_memberships: s.room_memberships,
        }
    }
}
