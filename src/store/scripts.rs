//! The Lua steps of `src/lua/`, loaded once and called by SHA inside
//! pipelines. Each script has exactly one function here that adds its call
//! to a pipeline (the only place that knows its KEYS and ARGV order), and
//! each reply is parsed into a named type by one function beside it.

use std::borrow::Cow;

use redis::{Pipeline, Script, Value};

use super::feed::FeedKeys;
use super::reply::{array, at, int, opt_int, text};
use super::step_types::{Arrival, ArriveMode, Departure, Lease, Observed};
use super::StoreResult;
use crate::keys;
use crate::model::{Audience, ChosenStatus, DeviceKind, Presence, Status};

/// A script that publishes transitions, with the shared event code
/// (`lua/event.lua`) in front of it.
macro_rules! with_events {
    ($file:literal) => {
        concat!(
            include_str!("../lua/feed_direct.lua"),
            "\n",
            include_str!("../lua/event.lua"),
            "\n",
            include_str!($file)
        )
    };
}

/// A script that publishes transitions and reports the one it made to its
/// caller: its body runs as a function, and its reply gains one last
/// element, the published event's JSON or "" (split off by [`reported`]).
macro_rules! reporting {
    ($file:literal, $kind:literal) => {
        concat!(
            include_str!("../lua/feed_direct.lua"),
            "\n",
            include_str!("../lua/event.lua"),
            "\nlocal function step()\n",
            include_str!($file),
            "\nend\nlocal reply = step()\n",
            "if feed_record then\n",
            "  local kind = '",
            $kind,
            "'\n",
            "  if kind == 't' then kind = feed_offline and 'f' or 'o' end\n",
            "  kind = feed_kind or kind\n",
            "  feed_push(feed_key, feed_seq, kind, feed_now, feed_record)\n",
            "end\n",
            "reply[#reply + 1] = published or ''\nreturn reply\n"
        )
    };
}

/// A room step, with the room steps' shared code (`lua/room_common.lua`)
/// in front of it.
macro_rules! room {
    ($file:literal) => {
        concat!(
            include_str!("../lua/feed_direct.lua"),
            "\n",
            include_str!("../lua/room_common.lua"),
            "\n",
            include_str!($file)
        )
    };
}

/// Splits the reply of a [`reporting!`] script into the step's own reply
/// and the JSON of the event it published, if it published one. Anything
/// else (an error, a reply of another shape) comes back as it was.
pub(super) fn reported(value: &Value) -> (Cow<'_, Value>, Option<String>) {
    let Value::Array(items) = value else {
        return (Cow::Borrowed(value), None);
    };
    let Some((last, step)) = items.split_last() else {
        return (Cow::Borrowed(value), None);
    };
    let event = match last {
        Value::BulkString(b) if !b.is_empty() => Some(String::from_utf8_lossy(b).into_owned()),
        _ => None,
    };
    (Cow::Owned(Value::Array(step.to_vec())), event)
}

/// Adds the feed's time (`now`) as the last argument of the command just
/// added, when its feed key (`feed`) is the last key: see `event.lua`.
fn feed_now<'p>(pipe: &'p mut Pipeline, feed: Option<&FeedKeys>, now: i64) -> &'p mut Pipeline {
    if feed.is_some() {
        pipe.arg(now);
    }
    pipe
}

/// Every script of the store.
pub(super) struct Scripts {
    arrive: Script,
    depart: Script,
    status: Script,
    read: Script,
    reconcile: Script,
    privacy: Script,
    zrem_if: Script,
    lock_keep: Script,
    feed_append: Script,
    feed_done: Script,
    forget_offline: Script,
    migrate_devices: Script,
    fold_active: Script,
    status_end: Script,
    /// The room steps (`room_*.lua`, with `room_common.lua` in front).
    pub(super) room_join: Script,
    pub(super) room_leave: Script,
    pub(super) room_state: Script,
    pub(super) room_expire: Script,
    pub(super) room_read: Script,
    pub(super) room_page: Script,
    pub(super) room_signal: Script,
    pub(super) room_visibility: Script,
    pub(super) room_remove_user: Script,
    pub(super) room_allowed: Script,
}

/// Adds an EVALSHA of `script` to `pipe`; the caller chains the arguments.
pub(super) fn eval<'p>(pipe: &'p mut Pipeline, script: &Script, keys: &[&str]) -> &'p mut Pipeline {
    // Sized up front for the scripts' usual arguments (about as many bytes
    // again as the keys, and up to 16 of them): a command grown argument by
    // argument reallocates its buffers several times. In `presence-bench
    // refresh` those reallocations were 1.6 % of the node's CPU samples,
    // 0.3 % once sized.
    let keys_len: usize = keys.iter().map(|k| k.len()).sum();
    let mut cmd = redis::Cmd::with_capacity(3 + keys.len() + 16, 2 * keys_len + 160);
    cmd.arg("EVALSHA")
        .arg(script.get_hash())
        .arg(keys.len())
        .arg(keys);
    pipe.add_command(cmd)
}

/// What `status.lua` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct StatusSet {
    /// A `presence` event was published (the user is online and something
    /// visible changed).
    pub published: bool,
    /// When the current status was chosen, epoch ms.
    pub since: i64,
    /// The status was `invisible` before this step.
    pub was_invisible: bool,
}

/// What `reconcile.lua` did for one user.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Reconciled {
    /// Devices removed for want of a lease.
    pub removed: i64,
    /// The counter before.
    pub old_count: i64,
    /// The counter after.
    pub new_count: i64,
    /// `online` or `offline` was published.
    pub transition: bool,
}

impl Scripts {
    /// Compiles the scripts (hashes them) and names them for the metrics,
    /// the steps that write the log themselves (`feed_direct.lua`) bounded
    /// to `cap` events per feed and window of `window_ms`.
    pub(super) fn with_feed_bound(cap: u64, window_ms: u64) -> Self {
        let bound = format!("local FEED_CAP, FEED_WINDOW = {cap}, {window_ms}\n");
        let bounded = |body: &str| Script::new(&format!("{bound}{body}"));
        let scripts = Self {
            arrive: bounded(reporting!("../lua/arrive.lua", "t")),
            depart: bounded(reporting!("../lua/depart.lua", "t")),
            status: bounded(reporting!("../lua/status.lua", "s")),
            read: bounded(with_events!("../lua/read.lua")),
            reconcile: bounded(reporting!("../lua/reconcile.lua", "t")),
            privacy: bounded(with_events!("../lua/privacy.lua")),
            zrem_if: Script::new(include_str!("../lua/zrem_if.lua")),
            lock_keep: Script::new(include_str!("../lua/lock_keep.lua")),
            feed_append: Script::new(include_str!("../lua/feed_append.lua")),
            feed_done: Script::new(include_str!("../lua/feed_done.lua")),
            forget_offline: Script::new(include_str!("../lua/forget_offline.lua")),
            migrate_devices: Script::new(include_str!("../lua/migrate_devices.lua")),
            fold_active: Script::new(include_str!("../lua/fold_active.lua")),
            status_end: bounded(reporting!("../lua/status_end.lua", "s")),
            room_join: bounded(room!("../lua/room_join.lua")),
            room_leave: bounded(room!("../lua/room_leave.lua")),
            room_state: bounded(room!("../lua/room_state.lua")),
            room_expire: bounded(room!("../lua/room_expire.lua")),
            room_read: bounded(room!("../lua/room_read.lua")),
            room_page: bounded(room!("../lua/room_page.lua")),
            room_signal: bounded(room!("../lua/room_signal.lua")),
            room_visibility: bounded(room!("../lua/room_visibility.lua")),
            room_remove_user: bounded(room!("../lua/room_remove_user.lua")),
            room_allowed: bounded(room!("../lua/room_allowed.lua")),
        };
        crate::redis::conn::name_scripts(scripts.named());
        scripts
    }

    fn named(&self) -> [(&Script, &'static str); 24] {
        [
            (&self.arrive, "arrive"),
            (&self.depart, "depart"),
            (&self.status, "status"),
            (&self.read, "read"),
            (&self.reconcile, "reconcile"),
            (&self.privacy, "privacy"),
            (&self.zrem_if, "zrem_if"),
            (&self.lock_keep, "lock_keep"),
            (&self.feed_append, "feed_append"),
            (&self.feed_done, "feed_done"),
            (&self.forget_offline, "forget_offline"),
            (&self.migrate_devices, "migrate_devices"),
            (&self.fold_active, "fold_active"),
            (&self.status_end, "status_end"),
            (&self.room_join, "room_join"),
            (&self.room_leave, "room_leave"),
            (&self.room_state, "room_state"),
            (&self.room_expire, "room_expire"),
            (&self.room_read, "room_read"),
            (&self.room_page, "room_page"),
            (&self.room_signal, "room_signal"),
            (&self.room_visibility, "room_visibility"),
            (&self.room_remove_user, "room_remove_user"),
            (&self.room_allowed, "room_allowed"),
        ]
    }

    /// Every script, for loading into Redis.
    pub(super) fn all(&self) -> impl Iterator<Item = &Script> {
        self.named().into_iter().map(|(s, _)| s)
    }

    /// `arrive.lua` for one lease; parse the reply with [`parse_arrival`].
    #[allow(clippy::too_many_arguments)]
    pub(super) fn arrive<'p>(
        &self,
        pipe: &'p mut Pipeline,
        lease: &Lease,
        mode: ArriveMode,
        ttl_ms: u64,
        now: i64,
        max_devices: u32,
        run: u64,
        feed: Option<&FeedKeys>,
    ) -> &'p mut Pipeline {
        let default = ChosenStatus::default();
        let known = lease.known.as_ref().unwrap_or(&default);
        let [key, count, status] = keys::device_keys(&lease.user, &lease.device);
        let mode = match mode {
            ArriveMode::Connect => "connect",
            ArriveMode::Refresh => "refresh",
            ArriveMode::Pause => "pause",
        };
        let mut k: Vec<&str> = vec![&key, &count, &status];
        k.extend(feed.into_iter().flat_map(FeedKeys::keys));
        eval(pipe, &self.arrive, &k)
            .arg(&lease.owner)
            .arg(ttl_ms)
            .arg(&lease.device)
            .arg(now)
            .arg(mode)
            .arg(&lease.user)
            .arg(keys::events(&lease.user))
            .arg(&known.status)
            .arg(&known.text)
            .arg(known.since)
            .arg(max_devices)
            .arg(&known.show_online)
            .arg(&known.show_last_seen)
            .arg(run)
            .arg(known.until)
            .arg(lease.kind.map_or("", DeviceKind::as_str));
        feed_now(pipe, feed, now)
    }

    /// `depart.lua` for one device; `owner` is "" for a lapsed lease. Parse
    /// the reply with [`parse_departure`].
    pub(super) fn depart<'p>(
        &self,
        pipe: &'p mut Pipeline,
        user: &str,
        device: &str,
        owner: &str,
        now: i64,
        feed: Option<&FeedKeys>,
    ) -> &'p mut Pipeline {
        let [lease, count, status] = keys::device_keys(user, device);
        let mut k: Vec<&str> = vec![&lease, &count, &status];
        k.extend(feed.into_iter().flat_map(FeedKeys::keys));
        eval(pipe, &self.depart, &k)
            .arg(owner)
            .arg(device)
            .arg(now)
            .arg(user)
            .arg(keys::events(user));
        feed_now(pipe, feed, now)
    }

    /// `status.lua`; parse the reply with [`parse_status_set`].
    #[allow(clippy::too_many_arguments)]
    pub(super) fn status<'p>(
        &self,
        pipe: &'p mut Pipeline,
        user: &str,
        status: Status,
        text: &str,
        until: Option<i64>,
        now: i64,
        feed: Option<&FeedKeys>,
    ) -> &'p mut Pipeline {
        let (s, c) = (keys::status(user), keys::count(user));
        let mut k: Vec<&str> = vec![&s, &c];
        k.extend(feed.into_iter().flat_map(FeedKeys::keys));
        eval(pipe, &self.status, &k)
            .arg(status.as_str())
            .arg(text)
            .arg(now)
            .arg(user)
            .arg(keys::events(user))
            .arg(until.unwrap_or(0));
        feed_now(pipe, feed, now)
    }

    /// `status_end.lua` for one user whose status's `until` is due; parse
    /// the reply with [`parse_status_end`].
    pub(super) fn status_end<'p>(
        &self,
        pipe: &'p mut Pipeline,
        user: &str,
        now: i64,
        feed: Option<&FeedKeys>,
    ) -> &'p mut Pipeline {
        let (s, c) = (keys::status(user), keys::count(user));
        let mut k: Vec<&str> = vec![&s, &c];
        k.extend(feed.into_iter().flat_map(FeedKeys::keys));
        eval(pipe, &self.status_end, &k)
            .arg(now)
            .arg(user)
            .arg(keys::events(user));
        feed_now(pipe, feed, now)
    }

    /// `read.lua` for one user as `viewer`; parse the reply with
    /// [`parse_read`].
    pub(super) fn read<'p>(
        &self,
        pipe: &'p mut Pipeline,
        user: &str,
        viewer: Option<&str>,
    ) -> &'p mut Pipeline {
        let keys = [keys::count(user), keys::status(user), keys::contacts(user)];
        eval(pipe, &self.read, &[&keys[0], &keys[1], &keys[2]]).arg(viewer.unwrap_or(""))
    }

    /// `reconcile.lua` for one user and the devices found in its hash;
    /// parse the reply with [`parse_reconciled`].
    pub(super) fn reconcile<'p>(
        &self,
        pipe: &'p mut Pipeline,
        user: &str,
        devices: &[String],
        now: i64,
        feed: Option<&FeedKeys>,
    ) -> &'p mut Pipeline {
        let mut keys = vec![keys::count(user), keys::status(user)];
        keys.extend(devices.iter().map(|d| keys::lease(user, d)));
        keys.extend(
            feed.into_iter()
                .flat_map(FeedKeys::keys)
                .map(str::to_string),
        );
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        eval(pipe, &self.reconcile, &keys)
            .arg(user)
            .arg(now)
            .arg(keys::events(user))
            .arg(devices);
        feed_now(pipe, feed, now)
    }

    /// `feed_append.lua`: moves `groups` (feed, lost, entries) of one
    /// bucket into its `log` (`moved` its marks), trimming it to
    /// `keep_from`, at most `cap` events per feed and window of
    /// `window_ms`; the reply is the last seq moved of each feed.
    pub(super) fn feed_append<'p>(
        &self,
        pipe: &'p mut Pipeline,
        log: &str,
        moved: &str,
        keep_from: &str,
        (cap, window_ms, now): (u64, u64, i64),
        groups: &[(&str, u64, &[String])],
    ) -> &'p mut Pipeline {
        let cmd = eval(pipe, &self.feed_append, &[log, moved])
            .arg(keep_from)
            .arg(cap)
            .arg(window_ms)
            .arg(now);
        for (feed, lost, entries) in groups {
            cmd.arg(*feed).arg(*lost).arg(entries.len()).arg(*entries);
        }
        cmd
    }

    /// `feed_done.lua`: takes `done` (feed, score read) out of the due
    /// index `due` while their scores are the ones read.
    pub(super) fn feed_done<'p>(
        &self,
        pipe: &'p mut Pipeline,
        due: &str,
        done: &[(&str, &str)],
    ) -> &'p mut Pipeline {
        let cmd = eval(pipe, &self.feed_done, &[due]);
        for (feed, score) in done {
            cmd.arg(*feed).arg(*score);
        }
        cmd
    }

    /// `privacy.lua`; the reply is 1 when a setting changed ([`int`]).
    pub(super) fn privacy<'p>(
        &self,
        pipe: &'p mut Pipeline,
        user: &str,
        show_online: Option<Audience>,
        show_last_seen: Option<Audience>,
        now: i64,
    ) -> &'p mut Pipeline {
        eval(
            pipe,
            &self.privacy,
            &[&keys::status(user), &keys::count(user)],
        )
        .arg(show_online.map_or("", Audience::as_str))
        .arg(show_last_seen.map_or("", Audience::as_str))
        .arg(now)
        .arg(user)
        .arg(keys::events(user))
    }

    /// `zrem_if.lua`: removes `member` from the sorted set `key` while its
    /// score is still `score`; the reply is 1 when removed.
    pub(super) fn zrem_if<'p>(
        &self,
        pipe: &'p mut Pipeline,
        key: &str,
        member: &str,
        score: impl redis::ToRedisArgs,
    ) -> &'p mut Pipeline {
        eval(pipe, &self.zrem_if, &[key]).arg(member).arg(score)
    }

    /// `lock_keep.lua`: extends the lock `key` by `hold_ms` while it holds
    /// `value`; the reply is 1 when extended.
    pub(super) fn lock_keep<'p>(
        &self,
        pipe: &'p mut Pipeline,
        key: &str,
        value: &str,
        hold_ms: u64,
    ) -> &'p mut Pipeline {
        eval(pipe, &self.lock_keep, &[key]).arg(value).arg(hold_ms)
    }

    /// `migrate_devices.lua`: moves `user`'s schema-2 device set into its
    /// hash; the reply is the number of devices moved.
    pub(super) fn migrate_devices<'p>(
        &self,
        pipe: &'p mut Pipeline,
        user: &str,
    ) -> &'p mut Pipeline {
        eval(
            pipe,
            &self.migrate_devices,
            &[&keys::v2_devices(user), &keys::status(user)],
        )
    }

    /// `fold_active.lua`: folds a schema-3 hash's `active` into `seq`; the
    /// reply is 1 when the hash had `active`.
    pub(super) fn fold_active<'p>(&self, pipe: &'p mut Pipeline, user: &str) -> &'p mut Pipeline {
        eval(pipe, &self.fold_active, &[&keys::status(user)])
    }

    /// `forget_offline.lua`: forgets an offline user's last seen and text;
    /// the reply is the number of fields removed.
    pub(super) fn forget_offline<'p>(
        &self,
        pipe: &'p mut Pipeline,
        user: &str,
    ) -> &'p mut Pipeline {
        eval(
            pipe,
            &self.forget_offline,
            &[&keys::status(user), &keys::count(user)],
        )
    }
}

/// One reply of `arrive.lua` for `user`'s lease. A short one
/// (`{1, came_online}`) confirms the status the call sent as known:
/// `status: None`.
pub(super) fn parse_arrival(value: &Value, user: &str, deadline: i64) -> StoreResult<Arrival> {
    let key = keys::status(user);
    let v = array(value, &key)?;
    let held = int(at(v, 0, &key)?, &key)?;
    let came_online = int(at(v, 1, &key)?, &key)? == 1;
    let status = match v.len() {
        2 => None,
        8 | 9 => Some(ChosenStatus {
            status: text(&v[2], &key)?,
            text: text(&v[3], &key)?,
            since: int(&v[4], &key)?,
            show_online: text(&v[5], &key)?,
            show_last_seen: text(&v[6], &key)?,
            until: int(&v[7], &key)?,
        }),
        n => {
            return Err(super::StoreError::reply(
                &key,
                format!("arrive: {n} fields"),
            ))
        }
    };
    // Only a socket's value names anyone to tell (see `LeaseOwner`).
    let took_over = match v.get(8) {
        Some(replaced) => {
            Some(text(replaced, &key)?).filter(|r| super::LeaseOwner::socket_run(r).is_some())
        }
        None => None,
    };
    Ok(match held {
        1 => Arrival::Held {
            came_online,
            status,
            deadline,
            lost_rooms: Vec::new(),
            took_over,
        },
        -1 => Arrival::TooManyDevices,
        0 => Arrival::Replaced,
        other => {
            return Err(super::StoreError::reply(
                &key,
                format!("arrive: held = {other}"),
            ))
        }
    })
}

/// The lease value a `depart.lua` call with owner `*` turned into the
/// tombstone, when a socket held it: the connection to tell.
pub(super) fn parse_taken(value: &Value, user: &str) -> StoreResult<Option<String>> {
    let key = keys::count(user);
    match array(value, &key)?.get(3) {
        Some(taken) => {
            Ok(Some(text(taken, &key)?).filter(|t| super::LeaseOwner::socket_run(t).is_some()))
        }
        None => Ok(None),
    }
}

/// One reply of `depart.lua` for `user`'s device.
pub(super) fn parse_departure(value: &Value, user: &str) -> StoreResult<Departure> {
    let key = keys::count(user);
    let v = array(value, &key)?;
    let outcome = int(at(v, 0, &key)?, &key)?;
    let went_offline = int(at(v, 1, &key)?, &key)? == 1;
    let value = int(at(v, 2, &key)?, &key)?;
    Ok(match outcome {
        0 => Departure::Leased {
            ttl_ms: (value >= 0).then_some(value as u64),
        },
        1 => Departure::Removed {
            last_seen: went_offline.then_some(value),
        },
        2 => Departure::AlreadyGone,
        other => {
            return Err(super::StoreError::reply(
                &key,
                format!("depart: outcome = {other}"),
            ))
        }
    })
}

/// The reply of `status.lua` for `user`.
pub(super) fn parse_status_set(value: &Value, user: &str) -> StoreResult<StatusSet> {
    let key = keys::status(user);
    let v = array(value, &key)?;
    Ok(StatusSet {
        published: int(at(v, 0, &key)?, &key)? == 1,
        since: int(at(v, 1, &key)?, &key)?,
        was_invisible: text(at(v, 2, &key)?, &key)? == "invisible",
    })
}

/// The reply of `read.lua` for `user`: its truth, sequence number and
/// whether the viewer is a contact.
pub(super) fn parse_read(value: &Value, user: &str) -> StoreResult<Observed> {
    let key = keys::status(user);
    let v = array(value, &key)?;
    if v.len() != 12 {
        return Err(super::StoreError::reply(
            &key,
            format!("read: {} fields", v.len()),
        ));
    }
    let devices = int(&v[0], &keys::count(user))?.max(0) as u32;
    let status = text(&v[1], &key)?;
    let chosen = if status.is_empty() {
        "online".to_string()
    } else {
        status
    };
    let text_ = text(&v[2], &key)?;
    let audience = |i: usize| -> StoreResult<Audience> {
        let s = text(&v[i], &key)?;
        if s.is_empty() {
            return Ok(Audience::default());
        }
        Audience::parse(&s).ok_or_else(|| super::StoreError::reply(&key, format!("audience {s:?}")))
    };
    let presence = Presence {
        user: user.to_string(),
        status: if devices > 0 {
            chosen.clone()
        } else {
            "offline".into()
        },
        devices,
        last_seen: opt_int(&v[4], &key)?,
        text: (!text_.is_empty()).then_some(text_),
        chosen,
        since: int(&v[5], &key)?,
        show_online: audience(6)?,
        show_last_seen: audience(7)?,
        until: opt_int(&v[9], &key)?,
        kinds: match text(&v[10], &key)? {
            k if k.is_empty() => Vec::new(),
            k => k.split(',').map(str::to_string).collect(),
        },
        idle: int(&v[11], &key)? == 1,
    };
    Ok(Observed {
        presence,
        seq: int(&v[3], &key)? as u64,
        is_contact: int(&v[8], &keys::contacts(user))? == 1,
    })
}

/// What `status_end.lua` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum StatusEnd {
    /// No `until` left: the index entry goes.
    Nothing,
    /// Ended now; `true` when the status that ended was `invisible`.
    Ended(bool),
    /// Not due yet: the entry's score becomes this.
    Later(i64),
}

/// The reply of `status_end.lua` for `user`.
pub(super) fn parse_status_end(value: &Value, user: &str) -> StoreResult<StatusEnd> {
    let key = keys::status(user);
    let v = array(value, &key)?;
    Ok(match int(at(v, 0, &key)?, &key)? {
        0 => StatusEnd::Nothing,
        1 => StatusEnd::Ended(int(at(v, 2, &key)?, &key)? == 1),
        2 => StatusEnd::Later(int(at(v, 1, &key)?, &key)?),
        other => {
            return Err(super::StoreError::reply(
                &key,
                format!("status_end: outcome = {other}"),
            ))
        }
    })
}

/// The reply of `reconcile.lua` for `user`.
pub(super) fn parse_reconciled(value: &Value, user: &str) -> StoreResult<Reconciled> {
    let key = keys::status(user);
    let v = array(value, &key)?;
    Ok(Reconciled {
        removed: int(at(v, 0, &key)?, &key)?,
        old_count: int(at(v, 1, &key)?, &key)?,
        new_count: int(at(v, 2, &key)?, &key)?,
        transition: int(at(v, 3, &key)?, &key)? == 1,
    })
}
