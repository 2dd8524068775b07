//! Reading rooms, each read bounded by what was asked for whatever the
//! room's size and whoever else is hidden in it:
//! - a `room` frame's read (`room_read.lua`): the member list only while
//!   the room is small enough to list, and the reader's own hidden members
//!   found by its range of the hidden index;
//! - a page of members by user (`room_page.lua`): a range of the room's
//!   index from the cursor on, then the page's members read by field;
//! - the counts of many rooms, in one round trip.

use redis::Value;

use super::super::reply::{array, at, int, text};
use super::super::{Store, StoreError, StoreResult};
use super::{count, parse_members, RoomMember, RoomSnapshot};
use crate::keys;

/// Most bytes of members' values (their states, mostly) one page holds:
/// a page stops before the user that would take it past this (it holds at
/// least one whole user), so that what a read costs Redis's reply and the
/// node to pass on is bounded in bytes as well as in members, whatever the
/// states (1,000 states of 1 KiB would be a megabyte).
pub const MAX_PAGE_BYTES: usize = 256 * 1024;

/// Who reads a page or counts: what it may see.
#[derive(Debug, Clone, Copy)]
pub enum PageReader<'a> {
    /// The service view: every member, hidden ones too.
    Service,
    /// A member's view: the visible members, and `Some(user)`'s own hidden
    /// ones.
    Member(Option<&'a str>),
}

/// One page of a room's members, as its reader sees them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoomPage {
    /// Users in the room, as the reader sees it.
    pub users: u64,
    /// Devices, likewise.
    pub devices: u64,
    /// The page's members, sorted by user and device.
    pub members: Vec<RoomMember>,
    /// The user the next page starts after; `None` on the last page.
    pub next: Option<String>,
}

impl Store {
    /// The room as a `room` frame shows it to `viewer` (`""`: to nobody
    /// in particular): its members unless it is in counts mode, and
    /// `viewer`'s own hidden members.
    pub async fn read_room(&self, room: &str, viewer: &str) -> StoreResult<RoomSnapshot> {
        let k1 = keys::room_members(room);
        let items = self
            .room_step(&self.scripts.room_read, room, |pipe| {
                pipe.arg(viewer);
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

    /// One page of `room`'s members as `reader` sees them: the users after
    /// `after` (`""`: from the first), at most `max_users` of them, at most
    /// `max_devices` devices and [`MAX_PAGE_BYTES`] of values (one user's
    /// devices are never split, so a page holds at least one whole user).
    pub async fn room_page(
        &self,
        room: &str,
        after: &str,
        max_users: u32,
        max_devices: u32,
        reader: PageReader<'_>,
    ) -> StoreResult<RoomPage> {
        let k1 = keys::room_members(room);
        let mut pipe = redis::pipe();
        self.push_page(&mut pipe, room, after, max_users, max_devices, reader);
        let reply = self.query(&pipe).await?;
        let items = array(at(&reply, 0, &k1)?, &k1)?;
        let (users, devices) = page_counts(items, reader, &k1)?;
        let members = parse_members(at(items, 3, &k1)?, room)?.unwrap_or_default();
        let next = text(at(items, 4, &k1)?, &k1)?;
        Ok(RoomPage {
            users,
            devices,
            members,
            next: (!next.is_empty()).then_some(next),
        })
    }

    /// The counts of each of `rooms` as `reader` sees them, in order, in
    /// one round trip: no member is read but the reader's own.
    pub async fn room_counts(
        &self,
        rooms: &[&str],
        reader: PageReader<'_>,
    ) -> StoreResult<Vec<(u64, u64)>> {
        let mut pipe = redis::pipe();
        for room in rooms {
            self.push_page(&mut pipe, room, "", 0, 0, reader);
        }
        let reply = self.query(&pipe).await?;
        if reply.len() != rooms.len() {
            return Err(StoreError::reply(
                "room_page",
                format!("{} replies to {} rooms", reply.len(), rooms.len()),
            ));
        }
        rooms
            .iter()
            .zip(&reply)
            .map(|(room, v)| {
                let k1 = keys::room_members(room);
                page_counts(array(v, &k1)?, reader, &k1)
            })
            .collect()
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

    /// Adds one `room_page.lua` call to `pipe`.
    fn push_page(
        &self,
        pipe: &mut redis::Pipeline,
        room: &str,
        after: &str,
        max_users: u32,
        max_devices: u32,
        reader: PageReader<'_>,
    ) {
        let (viewer, all) = match reader {
            PageReader::Service => ("", "1"),
            PageReader::Member(user) => (user.unwrap_or(""), "0"),
        };
        self.push_room_step(pipe, &self.scripts.room_page, room, false, |pipe| {
            pipe.arg(after)
                .arg(max_users)
                .arg(max_devices)
                .arg(viewer)
                .arg(all)
                .arg(MAX_PAGE_BYTES);
        });
    }
}

/// The users and devices of a `room_page.lua` reply as `reader` sees
/// them: the visible ones, with the reader's own hidden devices (and its
/// user, when none of its devices is visible), or with every hidden one
/// for the service.
fn page_counts(items: &[Value], reader: PageReader<'_>, key: &str) -> StoreResult<(u64, u64)> {
    let (users, devices) = (count(items, 1, key)?, count(items, 2, key)?);
    Ok(match reader {
        PageReader::Service => (
            users + count(items, 7, key)?,
            devices + count(items, 8, key)?,
        ),
        PageReader::Member(_) => {
            let own = count(items, 5, key)?;
            let visible = int(at(items, 6, key)?, key)? == 1;
            (users + u64::from(own > 0 && !visible), devices + own)
        }
    })
}
