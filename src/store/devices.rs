//! Devices ended from outside their connection: `DELETE
//! /api/users/{user}/devices/{device}` takes a device away whoever holds
//! it, and an HTTP heartbeat takes a device id over from a socket.
//!
//! Either way a socket may still hold the device, on any node. That node is
//! told at once on its own channel, `presence-events-node:{n:<run>}`, the run being
//! the one the lease value names (see [`super::LeaseOwner`]); it closes the
//! socket with 4001. Should the word be lost (the publisher died between
//! the step and the publish, the node's subscription was down), the socket
//! still finds its lease replaced at its next refresh, as it always did.
//! docs/internals.md ("A device ended from outside") says why a channel
//! per node rather than the user's own.

use serde::{Deserialize, Serialize};

use super::{Departure, Store, StoreResult};
use crate::keys;

/// Why a socket's device was ended from outside its connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TakenWhy {
    /// `DELETE`: the device left, memberships and all.
    Removed,
    /// An HTTP heartbeat took the device id over: the newer wins.
    Replaced,
}

/// What one node tells another on the receiver's own channel
/// ([`keys::node_events`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "e", rename_all = "snake_case")]
pub enum NodeNotice {
    /// A device one of the node's sockets held is no longer its own.
    Taken {
        /// The device's user.
        user: String,
        /// The device.
        device: String,
        /// The lease value of the connection that held it, which is also
        /// its session's id on that node.
        owner: String,
        /// Why.
        why: TakenWhy,
    },
}

impl NodeNotice {
    /// The JSON published.
    fn payload(&self) -> String {
        // A plain enum of strings always serializes.
        serde_json::to_string(self).unwrap_or_default()
    }
}

impl Store {
    /// Makes `user`'s `device` leave at once, whoever holds its lease: the
    /// same departure step as a close, with the lease left as a tombstone
    /// until its TTL, so that a socket holding it finds it replaced rather
    /// than claiming it again. The socket's node is told to close it now,
    /// and the device leaves its rooms now (the others get `room_leave`,
    /// once: the room step decides) instead of when its memberships lapse.
    /// True when the device was counted.
    pub async fn take_device(&self, user: &str, device: &str) -> StoreResult<bool> {
        let (departure, taken, mut follow) = self.depart_step(user, device, "*").await?;
        follow
            .zrem(
                keys::leases(self.buckets.of(user)),
                keys::lease_member(user, device),
            )
            .ignore();
        if let Some(owner) = taken {
            Self::tell(&mut follow, user, device, owner, TakenWhy::Removed);
        }
        // The device's rooms are read beside the index updates and the
        // word to the socket: no round trip of its own.
        let (followed, rooms) =
            futures_util::future::join(self.query(&follow), self.user_rooms(user)).await;
        if let Err(e) = followed {
            log::warn!("{user}/{device}: taken away, but updating the indexes or telling its socket failed: {e}");
        }
        self.leave_rooms(user, device, rooms?).await?;
        Ok(matches!(departure, Departure::Removed { .. }))
    }

    /// Tells the node whose socket held `user`'s `device` under the lease
    /// value `owner` that an HTTP heartbeat took the device over, so that
    /// it closes the socket now. Its memberships stay, as after any
    /// takeover: the device's next connection joins again without a leave
    /// or a join for the others.
    pub async fn tell_taken(&self, user: &str, device: &str, owner: String) -> StoreResult<()> {
        let mut pipe = redis::pipe();
        Self::tell(&mut pipe, user, device, owner, TakenWhy::Replaced);
        self.query(&pipe).await.map(drop)
    }

    /// Adds the word to the node holding the socket of lease value `owner`
    /// (none when no socket holds it).
    fn tell(pipe: &mut redis::Pipeline, user: &str, device: &str, owner: String, why: TakenWhy) {
        let Some(run) = super::LeaseOwner::socket_run(&owner) else {
            return;
        };
        let notice = NodeNotice::Taken {
            user: user.to_string(),
            device: device.to_string(),
            owner,
            why,
        };
        pipe.cmd("SPUBLISH")
            .arg(keys::node_events(run))
            .arg(notice.payload())
            .ignore();
    }

    /// Takes `device` out of each of its rooms among `rooms` (as
    /// [`Store::user_rooms`] lists them), whichever connection joined.
    async fn leave_rooms(
        &self,
        user: &str,
        device: &str,
        rooms: Vec<(String, Vec<String>)>,
    ) -> StoreResult<()> {
        let Some((_, rooms)) = rooms.into_iter().find(|(d, _)| d == device) else {
            return Ok(());
        };
        // Side by side on the multiplexed connection: at most
        // --max-rooms-per-device of them.
        let leaves = rooms
            .iter()
            .map(|room| self.leave_room(room, user, device, ""));
        for (room, left) in rooms
            .iter()
            .zip(futures_util::future::join_all(leaves).await)
        {
            if let Err(e) = left {
                log::warn!("{user}/{device}: taken away, but leaving {room} failed: {e}");
                return Err(e);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_notice_reads_back() {
        let notice = NodeNotice::Taken {
            user: "alice".into(),
            device: "phone".into(),
            owner: "123".into(),
            why: TakenWhy::Removed,
        };
        let payload = notice.payload();
        assert_eq!(
            payload,
            r#"{"e":"taken","user":"alice","device":"phone","owner":"123","why":"removed"}"#
        );
        assert_eq!(
            serde_json::from_str::<NodeNotice>(&payload).unwrap(),
            notice
        );
    }
}
