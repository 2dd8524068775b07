//! Rooms in Redis: presence in a place. Every key of one room shares the
//! room's hash tag, so each step (`room_*.lua`) is one script on one slot;
//! a room and a user live on different slots, so what spans both (the
//! per-user list of rooms, the bucketed deadline index) is written beside
//! the steps and repaired by the deadline pass.
//!
//! A membership lapses on its own: its deadline is pushed on with its
//! device's lease in the refresh batch ([`Store::arrive_batch`]), and the
//! room deadline pass ([`Store::reap_rooms`]) removes the memberships past
//! it, each with the same leave as a clean one.

use redis::Value;

use super::reply::{array, at, int, text};
use super::scripts::eval;
use super::{now_ms, Store, StoreError, StoreResult};
use crate::keys;
use crate::webhooks::{RoomKind, RoomWebhookEvent};

/// One device in a room, as a `room` frame lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoomMember {
    /// The user.
    pub user: String,
    /// The device.
    pub device: String,
    /// Its state, a JSON object as the device sent it.
    pub state: String,
    /// When it joined, epoch ms.
    pub joined_at: i64,
}

/// A room as read: its event clock, its counts and, in a room small
/// enough, its members sorted by user and device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoomSnapshot {
    /// The room's event clock: events with a higher `seq` come after this.
    pub seq: u64,
    /// Users in the room.
    pub users: u64,
    /// Devices in the room.
    pub devices: u64,
    /// The members, or `None` above the member-list limit.
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
    /// The room holds the most devices allowed.
    Full,
    /// A newer connection of the device holds the membership.
    Taken,
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

/// The members of a room's HGETALL (`member`, `value` pairs), sorted by
/// user and device; a malformed entry is an error naming the room.
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
            return Err(StoreError::reply(&key, "an odd HGETALL reply"));
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

/// What the webhooks need of one published room event.
#[derive(serde::Deserialize)]
struct Emitted {
    e: String,
    room: String,
    user: String,
    seq: u64,
    users: u64,
    devices: u64,
    #[serde(default)]
    first: bool,
    #[serde(default)]
    last: bool,
    #[serde(default)]
    to: Option<String>,
}

/// The webhook events of one published room event: a user's first device
/// joining (and the room's first user) or its last leaving (and the last
/// user); nothing for a hidden member's own events.
fn room_webhooks(e: Emitted, at: i64) -> Vec<RoomWebhookEvent> {
    if e.to.as_deref() == Some("user") {
        return Vec::new();
    }
    let (kind, whole, happened) = match e.e.as_str() {
        "join" => (RoomKind::RoomJoined, RoomKind::RoomOccupied, e.first),
        "leave" => (RoomKind::RoomLeft, RoomKind::RoomVacated, e.last),
        _ => return Vec::new(),
    };
    if !happened {
        return Vec::new();
    }
    let event = |kind, id: String, user| RoomWebhookEvent {
        id,
        kind,
        at,
        room: e.room.clone(),
        user,
        users: e.users,
        devices: e.devices,
        seq: e.seq,
    };
    let mut out = vec![event(
        kind,
        format!("{}:{}", e.room, e.seq),
        Some(e.user.clone()),
    )];
    let edge = if kind == RoomKind::RoomJoined {
        e.users == 1
    } else {
        e.users == 0
    };
    if edge {
        let suffix = if kind == RoomKind::RoomJoined {
            "occupied"
        } else {
            "vacated"
        };
        out.push(event(whole, format!("{}:{}:{suffix}", e.room, e.seq), None));
    }
    out
}

/// A count or clock of a room step's reply.
fn count(items: &[Value], i: usize, key: &str) -> StoreResult<u64> {
    let n = int(at(items, i, key)?, key)?;
    u64::try_from(n).map_err(|_| StoreError::reply(key, format!("a negative count {n}")))
}

impl Store {
    /// Queues the webhooks of the events a room step published (the last
    /// element of its reply): only the node that ran the step does, so
    /// each is sent once per fleet.
    fn announce(&self, emitted: Option<&Value>) {
        let (Some(webhooks), Some(Value::Array(items))) = (&self.webhooks, emitted) else {
            return;
        };
        let at = now_ms();
        for item in items {
            let Value::BulkString(payload) = item else {
                continue;
            };
            match serde_json::from_slice::<Emitted>(payload) {
                Ok(e) => {
                    // The member's user causes all of them (occupied and
                    // vacated too), and answers for them in the queue.
                    let by = e.user.clone();
                    for event in room_webhooks(e, at) {
                        webhooks.room(&event, &by);
                    }
                }
                Err(e) => log::warn!("webhook: unreadable room event ({e})"),
            }
        }
    }

    /// [`Store::room_step`] for a step that changes the room: the events
    /// it published get their webhooks.
    async fn room_change(
        &self,
        script: &redis::Script,
        room: &str,
        args: impl FnOnce(&mut redis::Pipeline),
    ) -> StoreResult<Vec<Value>> {
        let items = self.room_step(script, room, args).await?;
        self.announce(items.last());
        Ok(items)
    }

    /// Runs one room step on `room`'s keys, `args` chaining the step's
    /// arguments after the room id; its reply's items.
    async fn room_step(
        &self,
        script: &redis::Script,
        room: &str,
        args: impl FnOnce(&mut redis::Pipeline),
    ) -> StoreResult<Vec<Value>> {
        let [k1, k2, k3, k4, k5, k6] = keys::room_keys(room);
        let mut pipe = redis::pipe();
        eval(&mut pipe, script, &[&k1, &k2, &k3, &k4, &k5, &k6]).arg(room);
        args(&mut pipe);
        let reply = self.query(&pipe).await?;
        Ok(array(at(&reply, 0, &k1)?, &k1)?.to_vec())
    }

    /// Joins `user`'s `device` to `room` with `state` (a JSON object), or
    /// replaces its state when it is in the room already. `owner` names the
    /// connection, so that a late leave of an older one cannot remove it.
    /// The reply carries the room right after, with its members when it
    /// has at most `list_max` users.
    #[allow(clippy::too_many_arguments)]
    pub async fn join_room(
        &self,
        room: &str,
        user: &str,
        device: &str,
        state: &str,
        owner: &str,
        hidden: bool,
        max_devices: u32,
        list_max: u32,
    ) -> StoreResult<Joined> {
        let now = now_ms();
        let deadline = now + self.ttl_ms as i64;
        let k1 = keys::room_members(room);
        // In the index before the step too, so that a node dying between
        // the step and the write below leaves nothing unindexed (the write
        // after covers a room the pass is emptying meanwhile).
        let due = keys::room_due(self.buckets.of(room));
        redis::cmd("ZADD")
            .arg(&due)
            .arg("LT")
            .arg(deadline)
            .arg(room)
            .query_async::<()>(&mut self.conn())
            .await?;
        let items = self
            .room_change(&self.scripts.room_join, room, |pipe| {
                pipe.arg(user)
                    .arg(device)
                    .arg(state)
                    .arg(now)
                    .arg(deadline)
                    .arg(owner)
                    .arg(max_devices)
                    .arg(list_max)
                    .arg(if hidden { "1" } else { "0" });
            })
            .await?;
        let items = &items[..];
        let kind = text(at(items, 0, &k1)?, &k1)?;
        match kind.as_str() {
            "full" => return Ok(Joined::Full),
            "taken" => return Ok(Joined::Taken),
            _ => {}
        }
        // After the step, never before it: the deadline pass may be taking
        // the room out of its index as it empties, and then re-reads it.
        let mut beside = redis::pipe();
        beside
            .cmd("ZADD")
            .arg(keys::room_due(self.buckets.of(room)))
            .arg("LT")
            .arg(deadline)
            .arg(room)
            .ignore();
        beside
            .hset(keys::user_rooms(user), keys::user_room(device, room), 1)
            .ignore();
        self.query(&beside).await?;
        let snapshot = RoomSnapshot {
            seq: count(items, 2, &k1)?,
            users: count(items, 3, &k1)?,
            devices: count(items, 4, &k1)?,
            members: parse_members(at(items, 5, &k1)?, room)?,
            hidden: parse_members(at(items, 6, &k1)?, room)?.unwrap_or_default(),
        };
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
        match text(at(items, 0, &k1)?, &k1)?.as_str() {
            "updated" => Ok(StateSet::Updated),
            "same" => Ok(StateSet::Same),
            "absent" => Ok(StateSet::Absent),
            "taken" => Ok(StateSet::Taken),
            other => Err(StoreError::reply(&k1, format!("room_state: {other:?}"))),
        }
    }

    /// Relays a signal to the room's other member devices (a hidden
    /// member's to its own user's devices only): published on the room's
    /// channel, never stored.
    pub async fn signal_room(
        &self,
        room: &str,
        user: &str,
        device: &str,
        data: &str,
        hidden: bool,
    ) -> StoreResult<()> {
        let to = if hidden { r#","to":"user""# } else { "" };
        // Ids are checked and hold no '"' but may hold '\': encoded as JSON.
        let payload = format!(
            r#"{{"e":"signal","room":{},"user":{},"device":{}{to},"data":{data}}}"#,
            serde_json::Value::from(room),
            serde_json::Value::from(user),
            serde_json::Value::from(device),
        );
        let mut conn = self.conn();
        redis::cmd("SPUBLISH")
            .arg(keys::room_events(room))
            .arg(payload)
            .query_async::<()>(&mut conn)
            .await?;
        Ok(())
    }

    /// The room as it is now, with its members when it has at most
    /// `list_max` users, and `viewer`'s own hidden members (`""`: none).
    pub async fn read_room(
        &self,
        room: &str,
        list_max: u32,
        viewer: &str,
    ) -> StoreResult<RoomSnapshot> {
        self.read_room_as(room, list_max, viewer, false).await
    }

    /// [`Store::read_room`], with every hidden member listed when `all`
    /// (the service view, which sees the truth).
    pub async fn read_room_as(
        &self,
        room: &str,
        list_max: u32,
        viewer: &str,
        all: bool,
    ) -> StoreResult<RoomSnapshot> {
        let k1 = keys::room_members(room);
        let items = self
            .room_step(&self.scripts.room_read, room, |pipe| {
                pipe.arg(list_max)
                    .arg(viewer)
                    .arg(if all { "1" } else { "0" });
            })
            .await?;
        let items = &items[..];
        Ok(RoomSnapshot {
            seq: count(items, 0, &k1)?,
            users: count(items, 1, &k1)?,
            devices: count(items, 2, &k1)?,
            members: parse_members(at(items, 3, &k1)?, room)?,
            hidden: parse_members(at(items, 4, &k1)?, room)?.unwrap_or_default(),
        })
    }

    /// The rooms each of `user`'s devices is in, sorted by device, each
    /// with its rooms sorted.
    pub async fn user_rooms(&self, user: &str) -> StoreResult<Vec<(String, Vec<String>)>> {
        let mut conn = self.conn();
        let fields: Vec<String> = redis::cmd("HKEYS")
            .arg(keys::user_rooms(user))
            .query_async(&mut conn)
            .await?;
        let mut by_device: std::collections::BTreeMap<String, Vec<String>> = Default::default();
        for field in fields {
            let Some((device, room)) = keys::parse_user_room(&field) else {
                return Err(StoreError::reply(
                    &keys::user_rooms(user),
                    format!("field {field:?}"),
                ));
            };
            by_device
                .entry(device.to_string())
                .or_default()
                .push(room.to_string());
        }
        Ok(by_device
            .into_iter()
            .map(|(device, mut rooms)| {
                rooms.sort();
                (device, rooms)
            })
            .collect())
    }

    /// The room deadline pass over one bucket: each room whose earliest
    /// membership deadline may have passed loses its lapsed memberships
    /// (at most `max` per room), and its index entry follows its next
    /// deadline. Returns the rooms looked at and the memberships removed.
    pub async fn reap_rooms(&self, bucket: u32, max: usize) -> StoreResult<(usize, usize)> {
        let now = now_ms();
        let index = keys::room_due(bucket);
        let due = self.scored_up_to(&index, now, max).await?;
        let mut removed = 0;
        for (room, score) in &due {
            // One room that fails (logged) does not hold up the others.
            match self.expire_room(&index, room, score, now, max).await {
                Ok(n) => removed += n,
                Err(e) => log::warn!("room deadline pass: {room}: {e}"),
            }
        }
        Ok((due.len(), removed))
    }

    /// Removes `room`'s memberships lapsed by `now`, then moves its entry
    /// in `index` (read with `score`) to its next deadline, or takes it out
    /// when the room is empty.
    async fn expire_room(
        &self,
        index: &str,
        room: &str,
        score: &str,
        now: i64,
        max: usize,
    ) -> StoreResult<usize> {
        let k2 = keys::room_deadlines(room);
        let items = self
            .room_change(&self.scripts.room_expire, room, |pipe| {
                pipe.arg(now).arg(max).arg(self.ttl_ms);
            })
            .await?;
        let items = &items[..];
        let gone: Vec<String> = redis::from_redis_value_ref(at(items, 0, &k2)?)?;
        let next = text(at(items, 1, &k2)?, &k2)?;
        let repaired = int(at(items, 2, &k2)?, &k2)?;
        if repaired > 0 {
            log::warn!("room {room}: reconciliation repaired {repaired} entries of its counts and deadlines");
            crate::metrics::METRICS
                .reconcile_repairs
                .inc_by(repaired as u64);
        }
        let mut beside = redis::pipe();
        for member in &gone {
            if let Some((user, device)) = keys::parse_lease_member(member) {
                beside
                    .hdel(keys::user_rooms(user), keys::user_room(device, room))
                    .ignore();
            }
        }
        if next.is_empty() {
            self.scripts.zrem_if(&mut beside, index, room, score);
            beside.zcard(&k2);
            let reply = self.query(&beside).await?;
            // A join may have come between the step and the removal: its
            // own index write may have landed before the removal, so the
            // room is read once more and put back when it has members.
            if let Some(Value::Int(n)) = reply.last() {
                if *n > 0 {
                    let first: Vec<(String, f64)> = redis::cmd("ZRANGE")
                        .arg(&k2)
                        .arg(0)
                        .arg(0)
                        .arg("WITHSCORES")
                        .query_async(&mut self.conn())
                        .await?;
                    if let Some((_, deadline)) = first.first() {
                        redis::cmd("ZADD")
                            .arg(index)
                            .arg("LT")
                            .arg(*deadline)
                            .arg(room)
                            .query_async::<()>(&mut self.conn())
                            .await?;
                    }
                }
            }
        } else {
            beside
                .cmd("ZADD")
                .arg(index)
                .arg("XX")
                .arg(&next)
                .arg(room)
                .ignore();
            self.query(&beside).await?;
        }
        Ok(gone.len())
    }
}
