//! The requests a session queues for Redis (see `Requests` in
//! `watches.rs`), presence and room ones alike: apart from the files that
//! make and run them, so that those do not import each other.

use std::sync::Arc;

use crate::model::{Audience, Status};

/// One request waiting for Redis.
pub(super) enum Request {
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
        /// When it ends, epoch ms.
        until: Option<i64>,
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
        /// Earlier tries that failed.
        attempt: u32,
    },
    /// A room step.
    Room(RoomRequest),
}

/// A room request waiting its turn for Redis.
pub(super) enum RoomRequest {
    /// Join, or replace the state of a room the device is in.
    Join {
        /// The room.
        room: Arc<str>,
        /// The state, serialized.
        state: String,
        /// The session's own rejoin of a membership it found gone, not its
        /// client's join: refused for a device the backend removed lately.
        rejoin: bool,
    },
    /// Leave.
    Leave {
        /// The room.
        room: Arc<str>,
    },
    /// Write the device's latest state (`Held::state`), if not written yet.
    State {
        /// The room.
        room: Arc<str>,
    },
}
