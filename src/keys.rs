//! The Redis key schema, in one place (the README's "Key schema" table).
//!
//! Per-user keys carry the `{<user>}` hash tag so that the atomic per-user
//! scripts touch a single Redis Cluster slot; the global sorted sets beside
//! them are updated idempotently outside the scripts.
//!
//! Keys are built by concatenation rather than `format!`: the device keys
//! are made for every lease refresh, and the formatting machinery was a
//! visible share of the node's time there.

/// Sorted set: user -> last-seen epoch ms, kept after the user goes offline.
pub const LAST_SEEN: &str = "presence-lastseen";
/// Sorted set: user -> last refresh epoch ms, for users online now.
pub const ONLINE: &str = "presence-online";
/// Sorted set: `<user>:<device>` -> lease deadline epoch ms; drives timely expiry.
pub const LEASES: &str = "presence-leases";
/// Short lock that lets one node at a time run the deadline pass.
pub const REAPER_LOCK: &str = "presence-reaper-lock";

/// The device lease: a string with a TTL whose value names the owning connection.
pub fn lease(user: &str, device: &str) -> String {
    ["presence:{", user, "}:", device].concat()
}

/// The number of live devices of a user.
pub fn count(user: &str) -> String {
    ["presence-count:{", user, "}"].concat()
}

/// The set of counted device ids of a user.
pub fn devices(user: &str) -> String {
    ["presence-devices:{", user, "}"].concat()
}

/// The status hash of a user (status, text, since, active, seq).
pub fn status(user: &str) -> String {
    ["presence-status:{", user, "}"].concat()
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

/// The users who count as a user's contacts (for its privacy settings).
pub fn contacts(user: &str) -> String {
    format!("presence-contacts:{{{user}}}")
}

/// The four per-user keys of a device, in the order the scripts expect them.
pub fn device_keys(user: &str, device: &str) -> [String; 4] {
    [
        lease(user, device),
        count(user),
        devices(user),
        status(user),
    ]
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

/// Pattern matching every device set (for the reconciliation scan).
pub const DEVICES_PATTERN: &str = "presence-devices:{*}";

/// The user of a device-set key; `None` for any other key.
pub fn parse_devices(key: &str) -> Option<&str> {
    key.strip_prefix("presence-devices:{")?.strip_suffix('}')
}

/// The keyspace-notification channel on which Redis announces expired keys.
pub fn expired_channel(db: i64) -> String {
    format!("__keyevent@{db}__:expired")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_keys_parse_back() {
        let key = lease("alice@x", "phone-1");
        assert_eq!(key, "presence:{alice@x}:phone-1");
        assert_eq!(parse_lease(&key), Some(("alice@x", "phone-1")));
        assert_eq!(parse_lease("presence-count:{alice}"), None);
        assert_eq!(parse_lease("other"), None);
        let member = lease_member("bob", "tab");
        assert_eq!(parse_lease_member(&member), Some(("bob", "tab")));
        assert_eq!(parse_devices(&devices("a.b")), Some("a.b"));
        assert_eq!(parse_devices("presence-count:{a}"), None);
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
        assert_eq!(parse_devices(&devices(user)), Some(user));
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
                let (key, member, set) =
                    (lease(&user, &device), lease_member(&user, &device), devices(&user));
                proptest::prop_assert_eq!(parse_lease(&key), pair);
                proptest::prop_assert_eq!(parse_lease_member(&member), pair);
                proptest::prop_assert_eq!(parse_devices(&set), Some(user.as_str()));
            }
        }
    }
}
