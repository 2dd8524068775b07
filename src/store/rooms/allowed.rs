//! The backend's say over a room: the member list of a room under
//! `--room-policy members` (`room_allowed.lua`), checked by the join step
//! itself, and the removal of a user from a room under any policy
//! (`room_remove_user.lua`): its devices leave at once, each told so by its
//! own leave event (`"removed":true`), and a session's own rejoin of a
//! membership it finds gone is refused for a lease TTL.

use redis::Value;

use super::super::reply::{at, int, text};
use super::super::{Store, StoreError, StoreResult};
use crate::keys;

/// Most users one room's member list may hold.
pub const MAX_ROOM_MEMBERS: usize = 10_000;

/// What a change of a member list did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MembersSet {
    /// Done: the users on the list now, and the devices (`user`, `device`)
    /// that left the room with it.
    Set {
        /// Users on the list.
        users: u64,
        /// Devices removed from the room (users taken off the list).
        removed: Vec<(String, String)>,
    },
    /// The list would hold more than [`MAX_ROOM_MEMBERS`]; nothing changed.
    Full,
}

impl Store {
    /// Adds `users` to `room`'s member list, or (`replace`) makes it exactly
    /// `users`: the devices of users taken off leave the room at once.
    pub async fn set_room_members(
        &self,
        room: &str,
        users: &[String],
        replace: bool,
    ) -> StoreResult<MembersSet> {
        let key = keys::room_allowed(room);
        let items = self
            .room_change(&self.scripts.room_allowed, room, |pipe| {
                pipe.arg(if replace { "replace" } else { "add" })
                    .arg(MAX_ROOM_MEMBERS)
                    .arg(self.ttl_ms);
                for user in users {
                    pipe.arg(user);
                }
            })
            .await?;
        let items = &items[..];
        match text(at(items, 0, &key)?, &key)?.as_str() {
            "full" => Ok(MembersSet::Full),
            "set" => {
                let users = u64::try_from(int(at(items, 1, &key)?, &key)?).unwrap_or(0);
                let gone: Vec<String> = redis::from_redis_value_ref(at(items, 2, &key)?)?;
                let removed: Vec<(String, String)> = gone
                    .iter()
                    .filter_map(|m| keys::parse_lease_member(m))
                    .map(|(u, d)| (u.to_string(), d.to_string()))
                    .collect();
                self.forget_user_rooms(room, &removed).await?;
                Ok(MembersSet::Set { users, removed })
            }
            other => Err(StoreError::reply(&key, format!("room_allowed: {other:?}"))),
        }
    }

    /// Removes every device of `user` from `room` at once, and (`unlist`)
    /// takes the user off the room's member list. A session's own rejoin
    /// of a removed device, and a join on a grant of the app's backend from
    /// before the removal, are refused for the lease TTL or `hold`, the
    /// longer. Returns the devices removed and whether the user was on the
    /// list.
    pub async fn remove_room_user(
        &self,
        room: &str,
        user: &str,
        unlist: bool,
        hold: std::time::Duration,
    ) -> StoreResult<(Vec<String>, bool)> {
        let key = keys::room_members(room);
        let items = self
            .room_change(&self.scripts.room_remove_user, room, |pipe| {
                pipe.arg(user)
                    .arg(if unlist { "1" } else { "0" })
                    .arg(self.ttl_ms.max(hold.as_millis() as u64));
            })
            .await?;
        let items = &items[..];
        let devices: Vec<String> = redis::from_redis_value_ref(at(items, 0, &key)?)?;
        let listed = int(at(items, 1, &key)?, &key)? == 1;
        let removed: Vec<(String, String)> = devices
            .iter()
            .map(|d| (user.to_string(), d.clone()))
            .collect();
        self.forget_user_rooms(room, &removed).await?;
        Ok((devices, listed))
    }

    /// One page of `room`'s member list: the users after `after` (`""`:
    /// from the first), at most `limit`, the user to start the next page
    /// after (`None` on the last), and how many the list holds.
    pub async fn room_members_page(
        &self,
        room: &str,
        after: &str,
        limit: usize,
    ) -> StoreResult<(Vec<String>, Option<String>, u64)> {
        let key = keys::room_allowed(room);
        let from = if after.is_empty() {
            "-".to_string()
        } else {
            format!("({after}")
        };
        let mut pipe = redis::pipe();
        pipe.cmd("ZRANGEBYLEX")
            .arg(&key)
            .arg(from)
            .arg("+")
            .arg("LIMIT")
            .arg(0)
            .arg(limit + 1)
            .zcard(&key);
        let (mut users, total): (Vec<String>, u64) = pipe.query_async(&mut self.conn()).await?;
        let next = (users.len() > limit).then(|| users[limit - 1].clone());
        users.truncate(limit);
        Ok((users, next, total))
    }

    /// Whether `user` is on `room`'s member list.
    pub async fn is_room_member(&self, room: &str, user: &str) -> StoreResult<bool> {
        let score: Option<f64> = redis::cmd("ZSCORE")
            .arg(keys::room_allowed(room))
            .arg(user)
            .query_async(&mut self.conn())
            .await?;
        Ok(score.is_some())
    }

    /// Whether `user` was removed from `room` at or after `since` (epoch
    /// ms), within the time removals are kept: a grant of the app's backend
    /// asked before that is void.
    pub async fn removed_since(&self, room: &str, user: &str, since: i64) -> StoreResult<bool> {
        let at: Option<i64> = redis::cmd("HGET")
            .arg(keys::room_removed(room))
            .arg(user)
            .query_async(&mut self.conn())
            .await?;
        Ok(at.is_some_and(|at| at >= since))
    }

    /// Drops `removed` devices' entries of `room` from their users' lists
    /// of rooms (another slot, beside the step).
    async fn forget_user_rooms(&self, room: &str, removed: &[(String, String)]) -> StoreResult<()> {
        if removed.is_empty() {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        for (user, device) in removed {
            pipe.hdel(keys::user_rooms(user), keys::user_room(device, room))
                .ignore();
        }
        self.query(&pipe).await.map(|_: Vec<Value>| ())
    }
}
