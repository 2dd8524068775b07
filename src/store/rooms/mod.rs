//! Rooms in Redis: presence in a place. Every key of one room shares the
//! room's hash tag, so each step (`room_*.lua`) is one script on one slot;
//! a room and a user live on different slots, so what spans both (the
//! per-user list of rooms, the bucketed deadline index, a user's
//! visibility) is written beside the steps and repaired by the deadline
//! pass.
//!
//! A membership lapses on its own: its deadline is pushed on with its
//! device's lease in the refresh batch ([`Store::arrive_batch`]), and the
//! room deadline pass ([`Store::reap_rooms`], `pass.rs`) removes the
//! memberships past it whose lease is gone (`leased.rs`), each with the
//! same leave as a clean one.
//!
//! - `read.rs`: the reads, each bounded by what was asked for: a `room`
//!   frame's list (only in a room small enough to list), a page of
//!   members by user, the counts.
//! - `visibility.rs`: a user turning invisible (or visible again) hides
//!   (or shows) every membership of its devices at once.
//! - `webhooks.rs`: the webhooks of the events a step published.
//! - `pass.rs`, `leased.rs`: the room deadline pass, which asks a lapsed
//!   membership's lease before it removes it.

mod allowed;
mod leased;
mod pass;
mod read;
mod visibility;
mod webhooks;

pub use allowed::{MembersSet, MAX_ROOM_MEMBERS};
pub use read::{PageReader, RoomPage, MAX_PAGE_BYTES};

use redis::Value;

use super::reply::{array, at, int, text};
use super::scripts::eval;
use super::{now_ms, Store, StoreError, StoreResult};
use crate::keys;

/// One device in a room, as a `room` frame lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoomMember {
    /// The user.
    pub user: String,
    /// The device.
    pub device: String,
    /// Its state, a JSON object as the device sent it.
    pub state: String,
    /// When it joined (or, for a member that was hidden, became visible),
    /// epoch ms.
    pub joined_at: i64,
}

/// A room as read for a `room` frame: its event clock, its counts and,
/// in a room small enough, its members sorted by user and device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoomSnapshot {
    /// The room's event clock: events with a higher `seq` come after this.
    pub seq: u64,
    /// Users in the room.
    pub users: u64,
    /// Devices in the room.
    pub devices: u64,
    /// The members, or `None` while the room is in counts mode.
    pub members: Option<Vec<RoomMember>>,
    /// The reader's own hidden members (its user is invisible), which it
    /// alone sees.
    pub hidden: Vec<RoomMember>,
}

/// What a join did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Joined {
    /// The device joined; `first` when it is its user's first device there.
    Joined {
        /// The user joined the room with it.
        first: bool,
        /// The room right after the join.
        room: RoomSnapshot,
    },
    /// The device was in the room already; its state was replaced.
    Updated {
        /// The room right after the update.
        room: RoomSnapshot,
    },
    /// The room holds the most devices allowed (on the joiner's side:
    /// visible, or hidden).
    Full,
    /// A newer connection of the device holds the membership.
    Taken,
    /// The room's policy is `members` and the user is not on its list.
    NotListed,
    /// The session's own rejoin of a device the backend removed lately.
    Removed,
    /// The backend's grant ([`JoinAccess::granted_at`]) is no newer than
    /// the user's removal from the room: ask it again.
    Revoked,
}

/// How a join is let in, besides the step's own checks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JoinAccess {
    /// The room's policy is `members`: the step checks the member list.
    pub listed: bool,
    /// The session's own rejoin of a membership it found gone (not its
    /// client's join): refused for a device the backend removed lately.
    pub rejoin: bool,
    /// When the app's backend was asked the question whose answer let the
    /// user in (`proxy`), epoch ms: refused as [`Joined::Revoked`] when
    /// the user was removed from the room since.
    pub granted_at: Option<i64>,
}

/// What a leave did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Left {
    /// The device left; `last` when it was its user's last device there.
    Left {
        /// The user left the room with it.
        last: bool,
    },
    /// The device was not in the room (it lapsed, or never joined).
    Absent,
    /// Another connection of the device holds the membership now.
    Taken,
}

/// What a signal did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Relayed {
    /// To every other member device.
    Everyone,
    /// To the user's own other devices only (it is hidden).
    OwnDevices,
    /// The device is not in the room (it left, lapsed or was removed).
    Absent,
    /// Another connection of the device holds the membership now.
    Taken,
}

/// What a state change did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateSet {
    /// Replaced; the others were told.
    Updated,
    /// The state was the same; nobody was told.
    Same,
    /// The device is not in the room.
    Absent,
    /// Another connection of the device holds the membership now.
    Taken,
}

/// The members of `(member, value)` pairs, sorted by user and device;
/// `Value::Int(0)` (a room in counts mode) is `None`. A malformed entry is
/// an error naming the room.
fn parse_members(v: &Value, room: &str) -> StoreResult<Option<Vec<RoomMember>>> {
    let key = keys::room_members(room);
    let items = match v {
        Value::Int(0) => return Ok(None),
        Value::Array(items) => items,
        // An empty array may come back as an empty map under RESP3.
        Value::Map(m) if m.is_empty() => return Ok(Some(Vec::new())),
        _ => return Err(StoreError::reply(&key, format!("members: {v:?}"))),
    };
    let mut members = Vec::with_capacity(items.len() / 2);
    for pair in items.chunks(2) {
        let [member, value] = pair else {
            return Err(StoreError::reply(&key, "an odd list of members"));
        };
        let (member, value) = (text(member, &key)?, text(value, &key)?);
        let bad = || StoreError::reply(&key, format!("member {member:?} is {value:?}"));
        let (user, device) = keys::parse_lease_member(&member).ok_or_else(bad)?;
        let mut parts = value.splitn(3, '|');
        let (Some(joined_at), Some(_owner), Some(state)) =
            (parts.next(), parts.next(), parts.next())
        else {
            return Err(bad());
        };
        members.push(RoomMember {
            user: user.to_string(),
            device: device.to_string(),
            state: state.to_string(),
            joined_at: joined_at.parse().map_err(|_| bad())?,
        });
    }
    members.sort_unstable_by(|a, b| (&a.user, &a.device).cmp(&(&b.user, &b.device)));
    Ok(Some(members))
}

/// A count or clock of a room step's reply.
fn count(items: &[Value], i: usize, key: &str) -> StoreResult<u64> {
    let n = int(at(items, i, key)?, key)?;
    u64::try_from(n).map_err(|_| StoreError::reply(key, format!("a negative count {n}")))
}

/// The most users and devices of a room whose members get every event
/// (and whose `room` frame lists them): above either, the room is in
/// counts mode (`--room-announce-max`, `--room-announce-max-devices`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoomLists {
    /// Most users.
    pub users: u32,
    /// Most devices.
    pub devices: u32,
}

impl Default for RoomLists {
    fn default() -> Self {
        Self {
            users: crate::config::DEFAULT_ROOM_ANNOUNCE_MAX,
            devices: crate::config::DEFAULT_ROOM_ANNOUNCE_MAX_DEVICES,
        }
    }
}

impl Store {
    /// This store with the list limits of rooms.
    pub fn with_room_lists(self, room_lists: RoomLists) -> Self {
        Self { room_lists, ..self }
    }

    /// [`Store::room_step`] for a step that changes the room: the events
    /// it published (the last element of its reply) get their webhooks.
    async fn room_change(
        &self,
        script: &redis::Script,
        room: &str,
        args: impl FnOnce(&mut redis::Pipeline),
    ) -> StoreResult<Vec<Value>> {
        let k1 = keys::room_members(room);
        let mut pipe = redis::pipe();
        self.push_room_step(&mut pipe, script, room, true, args);
        let reply = self.query(&pipe).await?;
        let items = array(at(&reply, 0, &k1)?, &k1)?.to_vec();
        self.announce(items.last());
        Ok(items)
    }

    /// Adds one room step on `room`'s keys to `pipe`: the room id, the
    /// list limits and the time, then what `args` chains. A step that
    /// `changes` the room may record in its feed (when the feed is on: its
    /// key is the 12th) and puts the feed in the due index before.
    fn push_room_step(
        &self,
        pipe: &mut redis::Pipeline,
        script: &redis::Script,
        room: &str,
        changes: bool,
        args: impl FnOnce(&mut redis::Pipeline),
    ) {
        let feed = self.room_feed_of(room).filter(|_| changes);
        if let Some(feed) = &feed {
            self.send_due_for(feed);
        }
        let keys = keys::room_keys(room);
        let mut keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        keys.extend(feed.iter().flat_map(|f| f.keys()));
        eval(pipe, script, &keys)
            .arg(room)
            .arg(self.room_lists.users)
            .arg(self.room_lists.devices)
            .arg(now_ms());
        args(pipe);
    }

    /// Runs one room step on `room`'s keys, `args` chaining the step's
    /// arguments after the room id and the list limits; its reply's items.
    async fn room_step(
        &self,
        script: &redis::Script,
        room: &str,
        args: impl FnOnce(&mut redis::Pipeline),
    ) -> StoreResult<Vec<Value>> {
        let k1 = keys::room_members(room);
        let mut pipe = redis::pipe();
        self.push_room_step(&mut pipe, script, room, false, args);
        let reply = self.query(&pipe).await?;
        Ok(array(at(&reply, 0, &k1)?, &k1)?.to_vec())
    }

    /// Joins `user`'s `device` to `room` with `state` (a JSON object), or
    /// replaces its state when it is in it already. `owner` names the
    /// connection, so that a late leave of an older one cannot remove it.
    /// Whether it joins hidden is the user's status in Redis, read just
    /// before and settled just after (see `visibility.rs`), not what the
    /// connection last heard of it. The reply carries the room right
    /// after, with its members unless it is in counts mode.
    #[allow(clippy::too_many_arguments)]
    pub async fn join_room(
        &self,
        room: &str,
        user: &str,
        device: &str,
        state: &str,
        owner: &str,
        max_devices: u32,
        access: JoinAccess,
    ) -> StoreResult<Joined> {
        let now = now_ms();
        let deadline = now + self.ttl_ms as i64;
        let k1 = keys::room_members(room);
        let due = keys::room_due(self.buckets.of(room));
        // In the index before the step too, so that a node dying between
        // the step and the write below leaves nothing unindexed (the write
        // after covers a room the pass is emptying meanwhile). The status
        // rides along: the visibility to join with.
        let mut before = redis::pipe();
        before
            .cmd("ZADD")
            .arg(&due)
            .arg("LT")
            .arg(deadline)
            .arg(room)
            .ignore()
            .hget(keys::status(user), "status");
        let (status,): (Option<String>,) = before.query_async(&mut self.conn()).await?;
        let hidden = status.as_deref() == Some("invisible");
        let items = self
            .room_change(&self.scripts.room_join, room, |pipe| {
                pipe.arg(user)
                    .arg(device)
                    .arg(state)
                    .arg(deadline)
                    .arg(owner)
                    .arg(max_devices)
                    .arg(if hidden { "1" } else { "0" })
                    .arg(if access.listed { "1" } else { "0" })
                    .arg(if access.rejoin { "1" } else { "0" })
                    .arg(access.granted_at.unwrap_or(0));
            })
            .await?;
        let items = &items[..];
        let kind = text(at(items, 0, &k1)?, &k1)?;
        match kind.as_str() {
            "full" => return Ok(Joined::Full),
            "taken" => return Ok(Joined::Taken),
            "forbidden" => return Ok(Joined::NotListed),
            "removed" => return Ok(Joined::Removed),
            "revoked" => return Ok(Joined::Revoked),
            _ => {}
        }
        // After the step, never before it: the deadline pass may be taking
        // the room out of its index as it empties, and then re-reads it.
        // The user's rooms, then its status again, in this order on the
        // user's slot: a status change that this read misses sweeps this
        // room (it finds it in the user's rooms), and one it sees is
        // settled here.
        let mut beside = redis::pipe();
        beside
            .cmd("ZADD")
            .arg(due)
            .arg("LT")
            .arg(deadline)
            .arg(room)
            .ignore()
            .hset(keys::user_rooms(user), keys::user_room(device, room), 1)
            .ignore()
            .hget(keys::status(user), "status");
        let (status,): (Option<String>,) = beside.query_async(&mut self.conn()).await?;
        let joined_hidden = count(items, 7, &k1)? == 1;
        let mut snapshot = RoomSnapshot {
            seq: count(items, 2, &k1)?,
            users: count(items, 3, &k1)?,
            devices: count(items, 4, &k1)?,
            members: parse_members(at(items, 5, &k1)?, room)?,
            hidden: parse_members(at(items, 6, &k1)?, room)?.unwrap_or_default(),
        };
        if (status.as_deref() == Some("invisible")) != joined_hidden {
            // The status changed meanwhile (or the user's other devices
            // here were still on the old side): settle it, then show the
            // room as it is after.
            self.settle_visibility(room, user).await?;
            snapshot = self.read_room(room, user).await?;
        }
        match kind.as_str() {
            "joined" => Ok(Joined::Joined {
                first: count(items, 1, &k1)? == 1,
                room: snapshot,
            }),
            "updated" => Ok(Joined::Updated { room: snapshot }),
            other => Err(StoreError::reply(&k1, format!("room_join: {other:?}"))),
        }
    }

    /// Removes `user`'s `device` from `room`, only while the connection
    /// `owner` holds the membership (`""`: whoever holds it).
    pub async fn leave_room(
        &self,
        room: &str,
        user: &str,
        device: &str,
        owner: &str,
    ) -> StoreResult<Left> {
        let k1 = keys::room_members(room);
        let items = self
            .room_change(&self.scripts.room_leave, room, |pipe| {
                pipe.arg(user).arg(device).arg(owner);
            })
            .await?;
        let items = &items[..];
        let left = match text(at(items, 0, &k1)?, &k1)?.as_str() {
            "left" => Left::Left {
                last: count(items, 1, &k1)? == 1,
            },
            "absent" => Left::Absent,
            "taken" => return Ok(Left::Taken),
            other => return Err(StoreError::reply(&k1, format!("room_leave: {other:?}"))),
        };
        let mut conn = self.conn();
        redis::cmd("HDEL")
            .arg(keys::user_rooms(user))
            .arg(keys::user_room(device, room))
            .query_async::<()>(&mut conn)
            .await?;
        Ok(left)
    }

    /// Replaces the state of `user`'s `device` in `room`.
    pub async fn set_room_state(
        &self,
        room: &str,
        user: &str,
        device: &str,
        state: &str,
        owner: &str,
    ) -> StoreResult<StateSet> {
        let k1 = keys::room_members(room);
        let items = self
            .room_change(&self.scripts.room_state, room, |pipe| {
                pipe.arg(user).arg(device).arg(state).arg(owner);
            })
            .await?;
        let items = &items[..];
        parse_state_set(text(at(items, 0, &k1)?, &k1)?.as_str(), &k1)
    }

    /// Relays a signal to the room's other member devices: published on
    /// the room's channel, never stored. The membership decides who hears
    /// it: a hidden member's go to its own user's devices only, and a
    /// device no longer in the room (or no longer this connection's) is
    /// not relayed at all (`Absent`, `Taken`).
    pub async fn signal_room(
        &self,
        room: &str,
        user: &str,
        device: &str,
        owner: &str,
        data: &str,
    ) -> StoreResult<Relayed> {
        let k1 = keys::room_members(room);
        let mut pipe = redis::pipe();
        self.push_room_step(&mut pipe, &self.scripts.room_signal, room, false, |pipe| {
            pipe.arg(user).arg(device).arg(owner).arg(data);
        });
        let reply = self.query(&pipe).await?;
        match text(at(&reply, 0, &k1)?, &k1)?.as_str() {
            "sent" => Ok(Relayed::Everyone),
            "hidden" => Ok(Relayed::OwnDevices),
            "absent" => Ok(Relayed::Absent),
            "taken" => Ok(Relayed::Taken),
            other => Err(StoreError::reply(&k1, format!("room_signal: {other:?}"))),
        }
    }
}

/// The outcome of `room_state.lua`.
fn parse_state_set(kind: &str, key: &str) -> StoreResult<StateSet> {
    match kind {
        "updated" => Ok(StateSet::Updated),
        "same" => Ok(StateSet::Same),
        "absent" => Ok(StateSet::Absent),
        "taken" => Ok(StateSet::Taken),
        other => Err(StoreError::reply(key, format!("room step: {other:?}"))),
    }
}
