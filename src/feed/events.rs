//! The events of the log, as the webhooks and `GET /api/events` give them:
//! the recorded entries (`<seq>|<kind>|<at>|<record>`, see `event.lua` and
//! `room_common.lua`) made back into the webhook payloads.

use serde_json::Value;

use crate::store::feed::LogEntry;
use crate::webhooks::{Kind, RoomKind, RoomWebhookEvent, WebhookEvent};

/// The webhook events of one log entry: one for a user's transition, one
/// or two for a room's (a join that occupied it, a leave that vacated
/// it); none for an entry that does not parse (logged).
pub fn events_of(entry: &LogEntry) -> Vec<Value> {
    let parsed = match entry.owner.strip_prefix("r:") {
        Some(room) => room_events(room, &entry.entry),
        None => user_event(&entry.owner, &entry.entry).map(|e| vec![e]),
    };
    match parsed {
        Some(events) => events
            .into_iter()
            .filter_map(|e| serde_json::to_value(e).ok())
            .collect(),
        None => {
            log::warn!(
                "feed: unreadable entry {:?} of {}",
                entry.entry,
                entry.owner
            );
            Vec::new()
        }
    }
}

/// Either kind of event, serialized as itself.
#[derive(serde::Serialize)]
#[serde(untagged)]
enum AnyEvent {
    User(WebhookEvent),
    Room(RoomWebhookEvent),
}

/// `<seq>|<kind>|<at>|<record>`, split.
fn split(entry: &str) -> Option<(u64, &str, i64, &str)> {
    let mut parts = entry.splitn(4, '|');
    let seq = parts.next()?.parse().ok()?;
    let kind = parts.next()?;
    let at = parts.next()?.parse().ok()?;
    Some((seq, kind, at, parts.next()?))
}

/// A user's recorded transition: `[status, devices, last_seen, text, since,
/// until, kinds (comma-separated), seq, idle]`, the idle mark (1 or 0)
/// written only on a flip of it (kind `i`): every other entry keeps the
/// eight elements an older node reads.
#[derive(serde::Deserialize)]
struct UserRecord(
    String,
    u32,
    Option<i64>,
    Option<String>,
    i64,
    Option<i64>,
    String,
    serde::de::IgnoredAny,
    #[serde(default)] u8,
);

/// A user's transition: the record is a [`UserRecord`].
fn user_event(user: &str, entry: &str) -> Option<AnyEvent> {
    let (seq, kind, at, record) = split(entry)?;
    let UserRecord(status, devices, last_seen, text, since, until, kinds, _, idle) =
        serde_json::from_str(record).ok()?;
    let kind = match kind {
        "o" => Kind::Online,
        "f" => Kind::Offline,
        "s" => Kind::Status,
        "i" => Kind::Idle,
        _ => return None,
    };
    Some(AnyEvent::User(WebhookEvent {
        id: format!("{user}:{seq}"),
        kind,
        at,
        user: user.to_string(),
        status,
        devices,
        last_seen,
        text,
        since,
        until,
        kinds: kinds
            .split(',')
            .filter(|k| !k.is_empty())
            .map(str::to_string)
            .collect(),
        idle: (kind == Kind::Idle).then_some(idle == 1),
        seq,
    }))
}

/// A room's join or leave of a user: the record is `[user, users,
/// devices]`; the room's first user's join also occupied it, its last
/// user's leave vacated it.
fn room_events(room: &str, entry: &str) -> Option<Vec<AnyEvent>> {
    let (seq, kind, at, record) = split(entry)?;
    let (user, users, devices): (String, u64, u64) = serde_json::from_str(record).ok()?;
    let (kind, whole, edge) = match kind {
        "j" => (RoomKind::RoomJoined, RoomKind::RoomOccupied, users == 1),
        "l" => (RoomKind::RoomLeft, RoomKind::RoomVacated, users == 0),
        _ => return None,
    };
    let event = |kind, id: String, user| {
        AnyEvent::Room(RoomWebhookEvent {
            id,
            kind,
            at,
            room: room.to_string(),
            user,
            users,
            devices,
            seq,
        })
    };
    let mut out = vec![event(kind, format!("{room}:{seq}"), Some(user))];
    if edge {
        let suffix = if whole == RoomKind::RoomOccupied {
            "occupied"
        } else {
            "vacated"
        };
        out.push(event(whole, format!("{room}:{seq}:{suffix}"), None));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(owner: &str, entry: &str) -> LogEntry {
        LogEntry {
            bucket: 0,
            id: "1-0".into(),
            n: 1,
            owner: owner.into(),
            entry: entry.into(),
        }
    }

    #[test]
    fn entries_become_the_webhook_payloads() {
        let e = events_of(&entry(
            "alice",
            r#"17|o|1000|["busy",2,900,"deep work",800,null,"mobile,web",17]"#,
        ));
        assert_eq!(
            e,
            [
                serde_json::json!({"id":"alice:17","type":"online","at":1000,"user":"alice",
                "status":"busy","devices":2,"last_seen":900,"text":"deep work","since":800,
                "until":null,"kinds":["mobile","web"],"seq":17})
            ]
        );
        // A flip of the idle mark, with the mark that older entries lack.
        let e = events_of(&entry(
            "alice",
            r#"18|i|1100|["busy",2,null,null,800,null,"mobile",18,1]"#,
        ));
        assert_eq!(
            (&e[0]["type"], &e[0]["idle"]),
            (&Value::from("idle"), &Value::from(true))
        );
        let e = events_of(&entry("r:doc:1", r#"5|l|2000|["bob",0,0]"#));
        assert_eq!(e.len(), 2);
        assert_eq!(e[0]["type"], "room_left");
        assert_eq!(e[0]["user"], "bob");
        assert_eq!(e[1]["id"], "doc:1:5:vacated");
        assert!(events_of(&entry("alice", "junk")).is_empty());
    }
}
