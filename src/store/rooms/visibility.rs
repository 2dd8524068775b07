//! A user turning invisible, or visible again, in its rooms: every
//! membership of every device of the user moves to the hidden side (or
//! back) at once, on every node, whoever made the change (a WebSocket, the
//! HTTP API, a status that ended).
//!
//! The status lives on the user's slot and a room on its own, so no step
//! can read one and write the other. Instead each writer of a visibility
//! reads the status again after writing, and writes again when it changed
//! meanwhile; a join reads it before and after its step, and writes the
//! user's rooms before the read after:
//! - a status change that a join's read after misses comes later than
//!   that read, so its sweep reads the user's rooms after the join wrote
//!   its room there, and hides (or shows) the device after its join;
//! - a change it sees, it settles itself (`room_visibility.lua`).
//!
//! The last writer's read after its write is the status it wrote, so the
//! rooms end as the status says. A join also goes hidden while the user's
//! other devices in the room are hidden, so that a device that had not
//! heard of a change never shows an invisible user, even for the moment
//! before it is settled.

use std::collections::BTreeSet;

use super::super::reply::{array, at, int};
use super::super::{Store, StoreResult};
use crate::keys;

/// Rounds of write-then-read-again before a sweep gives up on a status
/// that keeps changing; the next change sweeps again, and a session's
/// next join settles its room.
const MAX_ROUNDS: usize = 3;

impl Store {
    /// Hides (or shows) every membership of `user`'s devices in every room
    /// as its status in Redis says: after a change of the status to or
    /// from `invisible`. Returns how many memberships moved.
    pub async fn sync_room_visibility(&self, user: &str) -> StoreResult<usize> {
        self.sweep(user, None).await
    }

    /// As [`Store::sync_room_visibility`] for `rooms` alone (a session's
    /// own, when it hears at a refresh that its user's visibility changed:
    /// a safety net for a sweep whose node died half way).
    pub async fn settle_rooms(&self, user: &str, rooms: &[&str]) -> StoreResult<usize> {
        self.sweep(user, Some(rooms)).await
    }

    /// Settles `user`'s visibility in one `room` after a join whose read
    /// of the status after its step disagreed with the side it joined.
    pub(super) async fn settle_visibility(&self, room: &str, user: &str) -> StoreResult<()> {
        self.sweep(user, Some(&[room])).await.map(|_| ())
    }

    /// Writes the visibility of `user`'s memberships in `rooms` (`None`:
    /// every room of the user's devices, read with the status) as the
    /// status says, then reads the status again and writes again while it
    /// changed meanwhile.
    async fn sweep(&self, user: &str, rooms: Option<&[&str]>) -> StoreResult<usize> {
        let mut moved = 0;
        let mut last: Option<Option<String>> = None;
        for _ in 0..MAX_ROUNDS {
            let mut read = redis::pipe();
            read.hkeys(keys::user_rooms(user))
                .hget(keys::status(user), "status");
            let (fields, status): (Vec<String>, Option<String>) =
                read.query_async(&mut self.conn()).await?;
            if last.as_ref() == Some(&status) {
                return Ok(moved);
            }
            let targets: BTreeSet<&str> = match rooms {
                Some(rooms) => rooms.iter().copied().collect(),
                None => fields
                    .iter()
                    .filter_map(|f| keys::parse_user_room(f).map(|(_, room)| room))
                    .collect(),
            };
            moved += self.set_visibility(&targets, user, status.clone()).await?;
            last = Some(status);
        }
        log::warn!("{user}: the status kept changing while its rooms were swept");
        Ok(moved)
    }

    /// Moves `user`'s devices in each of `rooms` to the side `status`
    /// says, in one round trip; how many moved.
    async fn set_visibility(
        &self,
        rooms: &BTreeSet<&str>,
        user: &str,
        status: Option<String>,
    ) -> StoreResult<usize> {
        if rooms.is_empty() {
            return Ok(0);
        }
        let hide = if status.as_deref() == Some("invisible") {
            "1"
        } else {
            "0"
        };
        let mut pipe = redis::pipe();
        // One room that fails (its shard is down) does not hold up the
        // others: its next join or the next change settles it.
        pipe.ignore_errors();
        for room in rooms {
            self.push_room_step(
                &mut pipe,
                &self.scripts.room_visibility,
                room,
                true,
                |pipe| {
                    pipe.arg(user).arg(hide);
                },
            );
        }
        let reply = self.query(&pipe).await?;
        let mut moved = 0;
        for (room, value) in rooms.iter().zip(&reply) {
            let key = keys::room_members(room);
            match array(value, &key).and_then(|items| {
                self.announce(items.last());
                int(at(items, 0, &key)?, &key)
            }) {
                Ok(n) => moved += usize::try_from(n).unwrap_or(0),
                Err(e) => log::warn!("{user}: visibility in {room} not set: {e}"),
            }
        }
        Ok(moved)
    }
}
