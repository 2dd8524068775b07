//! What the atomic steps (`scripts.rs`) take and give back: a lease
//! to claim or refresh, the outcome of an arrival or a departure, a user
//! as read. Apart from the steps' callers (`leases`, `passes`, `records`),
//! so that the steps and their callers do not import each other.

use crate::model::{ChosenStatus, Presence};
use crate::privacy::Relation;

/// How [`Store::arrive`](super::Store::arrive) treats a lease held by another connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArriveMode {
    /// A new connection: take the lease over from any older one.
    Connect,
    /// A live connection: keep the lease only while it is still ours.
    Refresh,
    /// A refresh to the grace that marks the device paused (`i:<device>`).
    Pause,
}

/// One device's lease to claim or refresh, for [`Store::arrive_batch`](super::Store::arrive_batch).
#[derive(Debug, Clone)]
pub struct Lease {
    /// The user.
    pub user: String,
    /// The device.
    pub device: String,
    /// The connection's lease value.
    pub owner: String,
    /// The user's status as this connection last saw it, restored if Redis
    /// lost it.
    pub known: Option<ChosenStatus>,
    /// The rooms the connection is in: their memberships' deadlines are
    /// pushed on with the lease's.
    pub rooms: Vec<std::sync::Arc<str>>,
    /// The device's kind, written when the device is claimed or counted
    /// (`None`: leave what is stored).
    pub kind: Option<crate::model::DeviceKind>,
}

/// Outcome of [`Store::arrive`](super::Store::arrive).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Arrival {
    /// The lease belongs to this connection.
    Held {
        /// This call made the user's first device arrive (and published
        /// `online`).
        came_online: bool,
        /// The user's chosen status and privacy settings now; `None` when
        /// they are exactly what the call sent as known (a refresh only).
        status: Option<ChosenStatus>,
        /// The deadline written to `presence-leases`, epoch ms.
        deadline: i64,
        /// The rooms of [`Lease::rooms`] whose membership was gone (it
        /// lapsed, or Redis lost its data): the session joins them again.
        lost_rooms: Vec<std::sync::Arc<str>>,
        /// A connect that took the device over from a socket: that
        /// connection's lease value, for its node to close it at once
        /// ([`Store::tell_taken`](super::Store::tell_taken)).
        took_over: Option<String>,
    },
    /// Another connection took this device over; this one should close.
    Replaced,
    /// The user has the most devices allowed (connect only); nothing changed.
    TooManyDevices,
}

/// Outcome of the departure step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Departure {
    /// A lease still exists (not lapsed, or another connection's); it has
    /// this many ms left (`None`: no TTL).
    Leased {
        /// Remaining TTL in ms.
        ttl_ms: Option<u64>,
    },
    /// This call removed the device; `last_seen` is set when it was the
    /// user's last device (and `offline` was published).
    Removed {
        /// Last-seen time published with `offline`, epoch ms.
        last_seen: Option<i64>,
    },
    /// The device had already been removed.
    AlreadyGone,
}

/// One user as read for a viewer: the truth, its sequence number, and
/// whether the viewer is one of the user's contacts.
#[derive(Debug, Clone)]
pub struct Observed {
    /// The user's true presence.
    pub presence: Presence,
    /// Its transition sequence number.
    pub seq: u64,
    /// The viewer is in the user's contacts.
    pub is_contact: bool,
}

impl Observed {
    /// How `viewer` stands to this user.
    pub fn relation(&self, viewer: Option<&str>, contacts_only: bool) -> Relation {
        Relation::of(viewer, &self.presence.user, self.is_contact, contacts_only)
    }
}
