//! The Redis key schema, in one place (docs/internals.md, "Redis key schema").
//!
//! Per-user keys carry the `{<user>}` hash tag so that the atomic per-user
//! scripts touch a single Redis Cluster slot. The indexes over all users
//! (last seen, lease deadlines) are split into [`Buckets`], each
//! with its own hash tag (`{b00}`..), so that no single key takes every
//! refresh and a cluster spreads them over its slots; they are updated
//! idempotently beside the scripts.
//!
//! Keys are built by concatenation rather than `format!`: the device keys
//! are made for every lease refresh, and the formatting machinery was a
//! visible share of the node's time there.

/// Prefix of the short-lived key whose `expired` event start-up waits for
/// when CONFIG is denied (`presence-probe:<node>:<random>`).
pub const PROBE_PREFIX: &str = "presence-probe:";
/// Hash of deployment constants every node must agree on: `buckets` (B)
/// and `schema` (the key schema's version).
pub const META: &str = "presence-meta";
/// Version of this key schema, written to [`META`]. 3: a user's devices
/// are fields of its status hash (schema 2 kept them in a set of their own,
/// `presence-devices:{<user>}`, moved at start). 4: the online list reads
/// the deadlines in [`leases`]; schema 3's own index of online users,
/// `presence-online:{b<k>}` ([`v3_online`]), is deleted at start. 5: a
/// lease's value is one integer, and a device's field in the user's hash
/// holds the run number of the node holding it ([`run`]); there is nothing
/// to move, but a node of schema 4 would read both wrong.
pub const SCHEMA_VERSION: u32 = 5;
/// Highest run number (13 bits): a node's run is claimed at random among
/// 1..=`MAX_RUN` ([`run`]), small enough for a listpack's 13-bit integer in
/// the device fields.
pub const MAX_RUN: u64 = 8_191;
/// B for a new deployment.
pub const DEFAULT_BUCKETS: u32 = 16;
/// Most buckets a deployment may have (two digits in the key).
pub const MAX_BUCKETS: u32 = 100;
/// The unbucketed indexes of schema version 1 that are moved into buckets
/// at start.
pub const V1_INDEXES: [&str; 2] = ["presence-lastseen", "presence-leases"];
/// The unbucketed online index of schema version 1, deleted at start (as
/// its buckets of schemas 2 and 3 are).
pub const V1_ONLINE: &str = "presence-online";

/// How the indexes over all users are split: B buckets, a user's bucket a
/// stable hash of its id modulo B. B is fixed per deployment (stored in
/// [`META`]): changing it would strand every entry in the wrong bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Buckets(u32);

impl Buckets {
    /// `n` buckets, 1 to [`MAX_BUCKETS`].
    pub fn new(n: u32) -> Option<Self> {
        (1..=MAX_BUCKETS).contains(&n).then_some(Self(n))
    }

    /// How many there are.
    pub fn count(self) -> u32 {
        self.0
    }

    /// Every bucket.
    pub fn all(self) -> std::ops::Range<u32> {
        0..self.0
    }

    /// The bucket of `user`: FNV-1a (64 bit) of its bytes, modulo B. Fixed
    /// forever: every node and every version must place a user alike.
    pub fn of(self, user: &str) -> u32 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in user.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        (h % u64::from(self.0)) as u32
    }
}

impl Default for Buckets {
    fn default() -> Self {
        Self(DEFAULT_BUCKETS)
    }
}

/// Sorted set of one bucket: user -> last-seen epoch ms, kept after the
/// user goes offline.
pub fn last_seen(bucket: u32) -> String {
    format!("presence-lastseen:{{b{bucket:02}}}")
}

/// Sorted set of one bucket: user -> when the user's chosen status ends
/// (`until`, epoch ms); the status-end pass resets the due ones.
pub fn status_until(bucket: u32) -> String {
    format!("presence-until:{{b{bucket:02}}}")
}

/// Schemas 2 and 3's sorted set of one bucket: user -> last refresh epoch
/// ms, for users online now; deleted at start since schema 4.
pub fn v3_online(bucket: u32) -> String {
    format!("presence-online:{{b{bucket:02}}}")
}

/// Sorted set of one bucket: `<user>:<device>` -> lease deadline epoch ms;
/// drives timely expiry, and lists who is online (`GET /api/online`).
pub fn leases(bucket: u32) -> String {
    format!("presence-leases:{{b{bucket:02}}}")
}

/// Short lock that lets one node at a time run the deadline pass over one
/// bucket.
pub fn reaper_lock(bucket: u32) -> String {
    format!("presence-reaper-lock:{{b{bucket:02}}}")
}

/// Short lock that lets one node at a time own the expired-key events of
/// one cluster primary (named by its node id); the others stand by.
pub fn expiry_owner(primary_id: &str) -> String {
    ["presence-expiry-owner:{", primary_id, "}"].concat()
}

/// Which node a run is (`presence-run:<run>`, the node id, with a TTL the
/// node renews): claimed with `SET NX` at start, so no two live nodes share
/// a run number; where a device's field, which holds the run number, finds
/// the node holding its connection.
pub fn run(run: u64) -> String {
    format!("presence-run:{run}")
}

/// The device lease: a string with a TTL whose value names the owning connection.
pub fn lease(user: &str, device: &str) -> String {
    ["presence:{", user, "}:", device].concat()
}

/// The number of live devices of a user.
pub fn count(user: &str) -> String {
    ["presence-count:{", user, "}"].concat()
}

/// The hash of a user: its counted devices (one [`device_field`] each)
/// and its status (status, text, since, privacy, last_seen, seq).
/// One small hash per user rather than a set beside a hash: Redis keeps it
/// as one listpack, the cheapest shape it has.
pub fn status(user: &str) -> String {
    ["presence-status:{", user, "}"].concat()
}

/// Prefix of a device's field in the user's [`status`] hash. Ids never
/// contain `:`, so no device field is ever taken for a status field.
pub const DEVICE_FIELD_PREFIX: &str = "d:";

/// The field of `device` in its user's [`status`] hash; present while the
/// device is counted.
pub fn device_field(device: &str) -> String {
    [DEVICE_FIELD_PREFIX, device].concat()
}

/// The device of a [`device_field`]; `None` for a status field.
pub fn parse_device_field(field: &str) -> Option<&str> {
    field.strip_prefix(DEVICE_FIELD_PREFIX)
}

/// Schema 2's set of a user's counted devices, moved into the user's
/// [`status`] hash at start.
pub fn v2_devices(user: &str) -> String {
    ["presence-devices:{", user, "}"].concat()
}

/// The sharded pub/sub channel of one user's transitions (SPUBLISH from
/// the scripts; a node SSUBSCRIBEs while one of its sessions watches the
/// user). Its hash tag puts it in the user's slot.
pub fn events(user: &str) -> String {
    ["presence-events:{", user, "}"].concat()
}

/// The user of an events channel; `None` for any other channel.
pub fn parse_events(channel: &str) -> Option<&str> {
    channel.strip_prefix("presence-events:{")?.strip_suffix('}')
}

/// The sharded pub/sub channel of one node run: what other nodes must tell
/// that node about the sockets it holds (a device taken away by `DELETE`,
/// or taken over by an HTTP heartbeat). A lease value names its node's run
/// ([`run`]), so whoever ends a device from outside its connection knows
/// where to say so. The node subscribes to its own channel for its whole
/// life; no node hears another's. `{n:<run>}`: a user id has no `:`, so no
/// user's tag is a run's. Named under `presence-events` so that the
/// documented least-privilege ACL user (`&presence-events*`,
/// docs/operations.md) may subscribe to it: a fleet keeps its ACL across
/// the upgrade, where a channel it may not hear would stop every node's
/// subscriptions, and so its start.
pub fn node_events(run: u64) -> String {
    format!("presence-events-node:{{n:{run}}}")
}

/// The run of a [`node_events`] channel; `None` for any other channel.
pub fn parse_node_events(channel: &str) -> Option<u64> {
    channel
        .strip_prefix("presence-events-node:{n:")?
        .strip_suffix('}')?
        .parse()
        .ok()
}

/// The hash tag of one room: every key of the room and its channel share
/// it, so that each room step is one script on one slot. A user id has no
/// `:`, so no user's tag can equal a room's.
fn room_tag(room: &str) -> String {
    ["{r:", room, "}"].concat()
}

/// Hash of one room's memberships: `<user>:<device>` -> the member's
/// value (`<joined_at>|<owner>|<state JSON>`).
pub fn room_members(room: &str) -> String {
    ["presence-room:", &room_tag(room)].concat()
}

/// Hash of one room's hidden memberships (devices of users who are
/// invisible), as [`room_members`]: not counted, and their events go to
/// their own user's devices only.
pub fn room_hidden(room: &str) -> String {
    ["presence-room-hidden:", &room_tag(room)].concat()
}

/// Sorted set of one room's membership deadlines: `<user>:<device>` ->
/// epoch ms, pushed on with the device's lease; a membership past its
/// deadline lapses (the room deadline pass).
pub fn room_deadlines(room: &str) -> String {
    ["presence-room-deadlines:", &room_tag(room)].concat()
}

/// Hash of one room's users: user -> devices in the room, so that a
/// user's first device joining and last device leaving happen once per
/// fleet.
pub fn room_users(room: &str) -> String {
    ["presence-room-users:", &room_tag(room)].concat()
}

/// Hash of one room's counters: `seq`, the room's event clock, and
/// `large` while the room's members get counts instead of every event.
pub fn room_meta(room: &str) -> String {
    ["presence-room-meta:", &room_tag(room)].concat()
}

/// The sharded channel of one room's events (SPUBLISH from the room steps
/// and for signals; a node SSUBSCRIBEs while one of its sessions is in the
/// room). Named under `presence-events`, so that the least-privilege ACL
/// user of docs/operations.md (`&presence-events*`) may use it.
pub fn room_events(room: &str) -> String {
    ["presence-events-room:", &room_tag(room)].concat()
}

/// The room of a room events channel; `None` for any other channel.
pub fn parse_room_events(channel: &str) -> Option<&str> {
    channel
        .strip_prefix("presence-events-room:{r:")?
        .strip_suffix('}')
}

/// Sorted set of one room's visible members as `<user> <device>`, all of
/// score 0: ordered by user, then device (ids hold no space, which sorts
/// before every other id character), so that a page of users, and one
/// user's devices, is a range read (`ZRANGEBYLEX`) however large the room.
pub fn room_index(room: &str) -> String {
    ["presence-room-index:", &room_tag(room)].concat()
}

/// As [`room_index`], for the hidden members: a reader finds its own
/// without reading anyone else's.
pub fn room_hidden_index(room: &str) -> String {
    ["presence-room-hidden-index:", &room_tag(room)].concat()
}

/// Hash of one room's hidden users: user -> hidden devices in the room,
/// as [`room_users`] for the visible ones.
pub fn room_hidden_users(room: &str) -> String {
    ["presence-room-hidden-users:", &room_tag(room)].concat()
}

/// Sorted set of the users a room under `--room-policy members` lets in
/// (score 0, by id): kept by the backend (`/api/rooms/{room}/members`),
/// checked by the join step itself.
pub fn room_allowed(room: &str) -> String {
    ["presence-room-allowed:", &room_tag(room)].concat()
}

/// Hash of a room's devices removed by `DELETE /api/rooms/{room}/members/{user}`
/// lately: `<user>:<device>` -> when, epoch ms. A session's own rejoin of a
/// membership it found gone (not its client's join) is refused for them;
/// the hash expires a lease TTL after the last removal.
pub fn room_removed(room: &str) -> String {
    ["presence-room-removed:", &room_tag(room)].concat()
}

/// The keys of one room in the order the room scripts expect them
/// (`lua/room_common.lua`): members, deadlines, users, meta, channel,
/// hidden members, index, hidden index, hidden users, allowed users,
/// removed devices.
pub fn room_keys(room: &str) -> [String; 11] {
    [
        room_members(room),
        room_deadlines(room),
        room_users(room),
        room_meta(room),
        room_events(room),
        room_hidden(room),
        room_index(room),
        room_hidden_index(room),
        room_hidden_users(room),
        room_allowed(room),
        room_removed(room),
    ]
}

/// Sorted set of one bucket: room -> a lower bound of its earliest
/// membership deadline; the room deadline pass visits the rooms due.
pub fn room_due(bucket: u32) -> String {
    format!("presence-room-due:{{b{bucket:02}}}")
}

/// A field of [`user_rooms`]: `<device>:<room>`.
pub fn user_room(device: &str, room: &str) -> String {
    [device, ":", room].concat()
}

/// Splits a [`user_rooms`] field back into device and room (a device id
/// has no `:`, a room id may).
pub fn parse_user_room(field: &str) -> Option<(&str, &str)> {
    field.split_once(':')
}

/// Hash of the rooms a user's devices are in: `<device>:<room>` -> 1.
/// Written beside the room steps (another slot), for
/// `GET /api/users/{user}/rooms`.
pub fn user_rooms(user: &str) -> String {
    ["presence-user-rooms:{", user, "}"].concat()
}

/// The users who count as a user's contacts (for its privacy settings).
pub fn contacts(user: &str) -> String {
    format!("presence-contacts:{{{user}}}")
}

/// The three per-user keys of a device, in the order the scripts expect
/// them: lease, counter, the user's hash.
pub fn device_keys(user: &str, device: &str) -> [String; 3] {
    [lease(user, device), count(user), status(user)]
}

/// Member of [`LEASES`] for one device.
pub fn lease_member(user: &str, device: &str) -> String {
    [user, ":", device].concat()
}

/// Splits a [`LEASES`] member back into user and device.
pub fn parse_lease_member(member: &str) -> Option<(&str, &str)> {
    member.split_once(':')
}

/// Splits a lease key back into user and device; `None` for any other key.
pub fn parse_lease(key: &str) -> Option<(&str, &str)> {
    let rest = key.strip_prefix("presence:{")?;
    let (user, device) = rest.split_once("}:")?;
    Some((user, device))
}

/// Fleet-wide figures the reconciliation pass counts, for every node's
/// metrics: `online_users` and `counted_at` (epoch ms).
pub const STATS: &str = "presence-stats";

/// Pattern matching every user's hash (for the reconciliation scan).
pub const STATUS_PATTERN: &str = "presence-status:{*}";

/// The user of a user-hash key; `None` for any other key.
pub fn parse_status(key: &str) -> Option<&str> {
    key.strip_prefix("presence-status:{")?.strip_suffix('}')
}

/// Pattern matching every schema-2 device set (for the move at start).
pub const V2_DEVICES_PATTERN: &str = "presence-devices:{*}";

/// The user of a schema-2 device-set key; `None` for any other key.
pub fn parse_v2_devices(key: &str) -> Option<&str> {
    key.strip_prefix("presence-devices:{")?.strip_suffix('}')
}

/// The keyspace-notification channel on which Redis announces expired keys.
pub fn expired_channel(db: i64) -> String {
    format!("__keyevent@{db}__:expired")
}

/// The event feed of a user: its transitions, recorded by the step that
/// made each one, until a node moves them to the bucket's log
/// ([`feed_log`]); a list of `<seq>|<kind>|<at>|<record>`.
pub fn feed(user: &str) -> String {
    format!("presence-feed:{{{user}}}")
}

/// The event feed of a room (its `room_joined` and `room_left`), as
/// [`feed`]: `presence-feed:{r:<room>}`, in the room's slot.
pub fn room_feed(room: &str) -> String {
    format!("presence-feed:{{r:{room}}}")
}

/// The hash tag's text of a feed key (`alice`, `r:doc:42`): what its bucket
/// is the bucket of; `None` for another key.
pub fn feed_owner(key: &str) -> Option<&str> {
    key.strip_prefix("presence-feed:{")?.strip_suffix('}')
}

/// Sorted set of one bucket: feed key -> when it is due a visit of the
/// feed pass (a node that recorded an event moves it at once; the entry
/// covers a node that died first).
pub fn feed_due(bucket: u32) -> String {
    format!("presence-feed-due:{{b{bucket:02}}}")
}

/// The event log of one bucket (a stream): every recorded event of its
/// users and rooms, oldest first, kept for `--event-retention-secs`.
pub fn feed_log(bucket: u32) -> String {
    format!("presence-feed-log:{{b{bucket:02}}}")
}

/// Hash of one bucket: feed key -> the last `seq` moved into the log (so
/// that a move twice adds nothing), and `#n`, the log's ordinal.
pub fn feed_moved(bucket: u32) -> String {
    format!("presence-feed-moved:{{b{bucket:02}}}")
}

/// Short lock that lets one node at a time run the feed pass over one
/// bucket.
pub fn feed_lock(bucket: u32) -> String {
    format!("presence-feed-lock:{{b{bucket:02}}}")
}

/// Hash of one bucket: webhook URL -> `<id> <n>`, the last event of the
/// bucket's log that URL took (its stream id and ordinal).
pub fn feed_sent(bucket: u32) -> String {
    format!("presence-feed-sent:{{b{bucket:02}}}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_stable_and_spread() {
        let b = Buckets::default();
        // Fixed forever: these values are in every deployment's Redis
        // (FNV-1a 64 of "alice" is 5803779529149266183).
        assert_eq!(b.of("alice"), 7);
        let mut seen = [0u32; 16];
        for i in 0..16_000 {
            seen[b.of(&format!("user{i}")) as usize] += 1;
        }
        assert!(seen.iter().all(|&n| (800..1200).contains(&n)), "{seen:?}");
        assert_eq!(leases(3), "presence-leases:{b03}");
        assert!(Buckets::new(0).is_none() && Buckets::new(101).is_none());
        assert_eq!(Buckets::new(1).unwrap().of("anyone"), 0);
    }

    #[test]
    fn node_channels_parse_back() {
        assert_eq!(node_events(17), "presence-events-node:{n:17}");
        assert_eq!(parse_node_events(&node_events(8_191)), Some(8_191));
        assert_eq!(parse_node_events(&events("n:17")), None);
        // Not a user's events channel, though under the same ACL prefix.
        assert_eq!(parse_events(&node_events(17)), None);
        assert_eq!(parse_node_events("presence-events-node:{n:x}"), None);
    }

    #[test]
    fn lease_keys_parse_back() {
        let key = lease("alice@x", "phone-1");
        assert_eq!(key, "presence:{alice@x}:phone-1");
        assert_eq!(parse_lease(&key), Some(("alice@x", "phone-1")));
        assert_eq!(parse_lease("presence-count:{alice}"), None);
        assert_eq!(parse_lease("other"), None);
        let member = lease_member("bob", "tab");
        assert_eq!(parse_lease_member(&member), Some(("bob", "tab")));
        assert_eq!(parse_status(&status("a.b")), Some("a.b"));
        assert_eq!(parse_status("presence-count:{a}"), None);
        assert_eq!(parse_v2_devices(&v2_devices("a.b")), Some("a.b"));
        assert_eq!(parse_device_field(&device_field("tab|2")), Some("tab|2"));
        assert_eq!(parse_device_field("status"), None);
    }

    #[test]
    fn provider_subjects_parse_back() {
        // Ids may hold `|`, `+`, `/`, `@` and the like, never `:` or braces.
        let (user, device) = ("auth0|64f1+x/y@z", "tab|2");
        assert_eq!(parse_lease(&lease(user, device)), Some((user, device)));
        assert_eq!(
            parse_lease_member(&lease_member(user, device)),
            Some((user, device))
        );
        assert_eq!(parse_status(&status(user)), Some(user));
    }

    proptest::proptest! {
        /// Whatever the id rules accept, every key and member made of it
        /// parses back to the same ids.
        #[test]
        fn accepted_ids_parse_back(user in "[ -~]{1,130}", device in "[ -~|+]{1,20}") {
            if crate::ids::validate("user", &user).is_ok()
                && crate::ids::validate("device", &device).is_ok()
            {
                let pair = Some((user.as_str(), device.as_str()));
                let (key, member, hash) =
                    (lease(&user, &device), lease_member(&user, &device), status(&user));
                proptest::prop_assert_eq!(parse_lease(&key), pair);
                proptest::prop_assert_eq!(parse_lease_member(&member), pair);
                proptest::prop_assert_eq!(parse_status(&hash), Some(user.as_str()));
                let field = device_field(&device);
                proptest::prop_assert_eq!(parse_device_field(&field), Some(device.as_str()));
            }
        }
    }
}
