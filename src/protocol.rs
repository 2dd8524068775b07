//! The WebSocket protocol: client frames in, server frames out (docs/protocol.md).
//!
//! Parsing never panics: every input either becomes a [`ClientFrame`] or a
//! [`ProtocolError`] with a stable `code` for the error frame.

use serde::{Deserialize, Serialize};

use crate::config::MAX_STATUS_TEXT;
use crate::ids;
use crate::model::{status_text_problem, until_problem, Audience, Record, Status, UnknownStatus};

/// A frame sent by a client.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum ClientFrame {
    /// Start watching users: answered by one snapshot, then live events.
    Watch {
        /// Users to watch.
        users: Vec<String>,
        /// Also a `presence` frame whenever a watched user's device count
        /// changes (kept until the user is unwatched).
        #[serde(default)]
        devices: bool,
    },
    /// Stop watching users.
    Unwatch {
        /// Users to stop watching.
        users: Vec<String>,
    },
    /// Set this user's status (for all of the user's devices).
    Status {
        /// online, away or busy.
        status: String,
        /// Optional free text ("in a meeting").
        #[serde(default)]
        text: Option<String>,
        /// When the status ends (back to `online`, no text), epoch ms.
        #[serde(default)]
        until: Option<i64>,
    },
    /// Refresh the lease explicitly.
    Heartbeat,
    /// The device steps away without leaving: it stays present for a
    /// grace (at most `--pause-grace-ms`), then the server closes with 1000.
    Pause {
        /// The grace asked for, in ms (cut to the bound).
        #[serde(default)]
        grace_ms: Option<u64>,
    },
    /// Change who may see this user (`everyone`, `contacts`, `nobody`).
    Privacy {
        /// Who may see that the user is online.
        #[serde(default)]
        online: Option<String>,
        /// Who may see when the user was last seen.
        #[serde(default)]
        last_seen: Option<String>,
    },
    /// With JWT auth: the token, as the first frame of a connection that
    /// carried none, or later a fresh one for the same user before `exp`.
    Auth {
        /// The JWT.
        token: Token,
    },
    /// Join a room with a state (a JSON object; `{}` when not given), or
    /// replace the state in a room the device is in already.
    Join {
        /// The room.
        room: String,
        /// This device's state in the room.
        #[serde(default)]
        state: Option<serde_json::Value>,
        /// A room token, for a room under `--room-policy token`.
        #[serde(default)]
        token: Option<Token>,
        /// State updates of the room's other members come as one
        /// `room_updates` frame per tick instead of one `room_update` each.
        #[serde(default)]
        batch: bool,
    },
    /// A fresh room token for a room the device is in (`--room-policy
    /// token`), replacing the one it joined with.
    #[serde(rename = "room_token")]
    RoomToken {
        /// The room.
        room: String,
        /// The room token.
        token: Token,
    },
    /// Leave a room.
    Leave {
        /// The room.
        room: String,
    },
    /// Replace this device's state in a room.
    #[serde(rename = "room_state")]
    RoomState {
        /// The room.
        room: String,
        /// The new state (a JSON object).
        state: serde_json::Value,
    },
    /// Relay `data` to the room's other member devices (never stored).
    Signal {
        /// The room.
        room: String,
        /// Any JSON value.
        data: serde_json::Value,
    },
}

/// A bearer token inside a frame: never printed, so that a debug log of a
/// frame cannot leak it.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Token(pub String);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

/// The frame types a client may send; anything else is `unknown_type`.
/// Close code for a session the node gives up on, or sheds, while its
/// client is fine: 1013, try again later.
pub const CLOSE_TRY_AGAIN: u16 = 1013;
/// The shortest wait a 1013 close asks for, in its reason
/// (`retry_after_ms=<n>`): the JS client waits that long, plus as much
/// again at random, before it reconnects, so that a node shedding load is
/// not met by every client at once.
pub const TRY_AGAIN_AFTER_MS: u64 = 2_000;
/// The wait a session shed before its claim asks for (`server busy`): it
/// cost the node nothing yet, and the storm that shed it is drained within
/// seconds, so it comes back sooner.
pub const SHED_RETRY_AFTER_MS: u64 = 1_000;

/// The reason of a 1013 close: why, then the wait it asks for.
pub fn try_again_reason(why: &str, wait_ms: u64) -> String {
    format!("{why}, reconnect; retry_after_ms={wait_ms}")
}

const CLIENT_TYPES: [&str; 12] = [
    "watch",
    "unwatch",
    "status",
    "heartbeat",
    "privacy",
    "auth",
    "join",
    "leave",
    "room_state",
    "signal",
    "room_token",
    "pause",
];

/// Stable error codes, shared by error frames and HTTP error bodies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// Not JSON, not an object, or fields of the wrong shape.
    BadRequest,
    /// A `type` the server does not know.
    UnknownType,
    /// A user or device id outside the id alphabet or length.
    InvalidId,
    /// A status other than online, away or busy, or text too long.
    InvalidStatus,
    /// More watched users than the per-session limit.
    TooManyWatches,
    /// More users in a bulk query than allowed.
    TooManyUsers,
    /// The user already has the most devices allowed.
    TooManyDevices,
    /// More frames per second than allowed; the frame was not processed.
    RateLimited,
    /// A frame larger than the limit, or a binary frame.
    Unsupported,
    /// Redis could not be reached; try again.
    Unavailable,
    /// No such route.
    NotFound,
    /// No valid credentials.
    Unauthorized,
    /// Credentials valid, but not for this.
    Forbidden,
    /// A room state or signal frame for a room the device is not in.
    NotInRoom,
    /// More rooms than one device may be in.
    TooManyRooms,
    /// The room holds the most devices allowed.
    RoomFull,
    /// A room state or signal larger than allowed.
    StateTooLarge,
    /// The app's backend removed the device's user from the room
    /// (`DELETE /api/rooms/{room}/members/{user}`): it is out of it.
    Removed,
    /// The device's room token expired with no fresh one sent: it is out
    /// of the room.
    TokenExpired,
}

/// A refused request: what goes into an error frame or HTTP error body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error, utoipa::ToSchema)]
#[error("{code:?}: {message}")]
pub struct ProtocolError {
    /// Machine-readable code.
    pub code: ErrorCode,
    /// Human-readable explanation.
    pub message: String,
    /// The room a refused room frame named, so that a client in several
    /// rooms knows which one it was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub room: Option<String>,
}

impl ProtocolError {
    /// An error with `code` and `message`.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            room: None,
        }
    }

    /// The same error, about `room`.
    pub fn in_room(mut self, room: &str) -> Self {
        self.room = Some(room.to_string());
        self
    }

    /// The error frame sent to the client.
    pub fn to_frame(&self) -> String {
        to_json(&Tagged {
            kind: "error",
            body: self,
        })
    }
}

impl From<UnknownStatus> for ProtocolError {
    fn from(e: UnknownStatus) -> Self {
        ProtocolError::new(ErrorCode::InvalidStatus, e.to_string())
    }
}

impl From<ids::IdError> for ProtocolError {
    fn from(e: ids::IdError) -> Self {
        ProtocolError::new(ErrorCode::InvalidId, e.to_string())
    }
}

/// Parses one text frame.
pub fn parse_client_frame(text: &str) -> Result<ClientFrame, ProtocolError> {
    #[derive(Deserialize)]
    struct Tagged<'a> {
        #[serde(rename = "type", borrow)]
        kind: std::borrow::Cow<'a, str>,
    }
    let tagged: Tagged = serde_json::from_str(text).map_err(|e| {
        ProtocolError::new(
            ErrorCode::BadRequest,
            format!("expected a JSON object with a string field \"type\": {e}"),
        )
    })?;
    if !CLIENT_TYPES.contains(&tagged.kind.as_ref()) {
        return Err(ProtocolError::new(
            ErrorCode::UnknownType,
            format!(
                "unknown type {:?}; expected one of {}",
                tagged.kind,
                CLIENT_TYPES.join(", ")
            ),
        ));
    }
    let frame: ClientFrame = serde_json::from_str(text)
        .map_err(|e| ProtocolError::new(ErrorCode::BadRequest, format!("{}: {e}", tagged.kind)))?;
    if let ClientFrame::Watch { users, .. } | ClientFrame::Unwatch { users } = &frame {
        for user in users {
            ids::validate("user", user)?;
        }
    }
    match &frame {
        ClientFrame::Join { room, state, .. } => {
            ids::validate_room(room)?;
            if state.as_ref().is_some_and(|s| !s.is_object()) {
                return Err(ProtocolError::new(
                    ErrorCode::BadRequest,
                    "join: state must be a JSON object",
                ));
            }
        }
        ClientFrame::RoomState { room, state } => {
            ids::validate_room(room)?;
            if !state.is_object() {
                return Err(ProtocolError::new(
                    ErrorCode::BadRequest,
                    "room_state: state must be a JSON object",
                ));
            }
        }
        ClientFrame::Leave { room }
        | ClientFrame::Signal { room, .. }
        | ClientFrame::RoomToken { room, .. } => {
            ids::validate_room(room)?;
        }
        _ => {}
    }
    if let ClientFrame::Privacy { online, last_seen } = &frame {
        parse_privacy(online.as_deref(), last_seen.as_deref())?;
    }
    if let ClientFrame::Status {
        status,
        text,
        until,
    } = &frame
    {
        check_status(status, text.as_deref(), *until)?;
    }
    Ok(frame)
}

/// Checks a status choice (a `status` frame, `PUT /api/users/{user}/status`):
/// a known status, a text within the limits, an `until` ahead but not by
/// more than 30 days.
pub fn check_status(
    status: &str,
    text: Option<&str>,
    until: Option<i64>,
) -> Result<Status, ProtocolError> {
    let parsed = Status::parse(status)?;
    let problem = text
        .and_then(|t| status_text_problem(t, MAX_STATUS_TEXT))
        .or_else(|| until.and_then(|u| until_problem(u, crate::clock::now_ms())));
    if let Some(problem) = problem {
        return Err(ProtocolError::new(ErrorCode::InvalidStatus, problem));
    }
    Ok(parsed)
}

/// Reads the two privacy settings of a `privacy` frame or HTTP body; at
/// least one must be given.
pub fn parse_privacy(
    online: Option<&str>,
    last_seen: Option<&str>,
) -> Result<(Option<Audience>, Option<Audience>), ProtocolError> {
    let parse = |what: &str, v: Option<&str>| {
        v.map(|s| {
            Audience::parse(s).ok_or_else(|| {
                ProtocolError::new(
                    ErrorCode::BadRequest,
                    format!("{what} must be everyone, contacts or nobody, not {s:?}"),
                )
            })
        })
        .transpose()
    };
    let settings = (parse("online", online)?, parse("last_seen", last_seen)?);
    if settings == (None, None) {
        return Err(ProtocolError::new(
            ErrorCode::BadRequest,
            "give online and/or last_seen: everyone, contacts or nobody",
        ));
    }
    Ok(settings)
}

/// A server frame: `type` first, then the body's fields.
#[derive(Serialize)]
pub(crate) struct Tagged<'a, T: Serialize> {
    /// The frame's `type`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// Its other fields.
    #[serde(flatten)]
    pub body: &'a T,
}

/// A frame as JSON.
pub(crate) fn to_json<T: Serialize>(frame: &T) -> String {
    // Our frames hold only strings, numbers and options: they always serialize.
    serde_json::to_string(frame).expect("server frames serialize")
}

/// The answer to `pause`: the device stays present for `grace_ms`.
pub fn paused_frame(grace_ms: u64) -> String {
    format!(r#"{{"type":"paused","grace_ms":{grace_ms}}}"#)
}

/// The `hello` frame, with the user's own record (`self`: as the answer
/// to a `status` frame has it; null when it could not be read).
pub fn hello_frame(
    user: &str,
    device: &str,
    heartbeat_ms: u64,
    ttl_ms: u64,
    own: Option<&Record>,
) -> String {
    #[derive(Serialize)]
    struct Hello<'a> {
        user: &'a str,
        device: &'a str,
        heartbeat_ms: u64,
        ttl_ms: u64,
        #[serde(rename = "self")]
        own: Option<&'a Record>,
    }
    to_json(&Tagged {
        kind: "hello",
        body: &Hello {
            user,
            device,
            heartbeat_ms,
            ttl_ms,
            own,
        },
    })
}

/// The `auth_expiring` frame: the session is closed in `in_ms` unless the
/// client sends a fresh token first.
pub fn auth_expiring_frame(in_ms: u64) -> String {
    #[derive(Serialize)]
    struct Expiring {
        in_ms: u64,
    }
    to_json(&Tagged {
        kind: "auth_expiring",
        body: &Expiring { in_ms },
    })
}

/// The `snapshot` frame.
pub fn snapshot_frame(records: &[Record]) -> String {
    #[derive(Serialize)]
    struct Snapshot<'a> {
        presence: &'a [Record],
    }
    to_json(&Tagged {
        kind: "snapshot",
        body: &Snapshot { presence: records },
    })
}

/// The `presence` frame for one record.
pub fn presence_frame(record: &Record) -> String {
    to_json(&Tagged {
        kind: "presence",
        body: record,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(text: &str) -> ErrorCode {
        parse_client_frame(text).unwrap_err().code
    }

    #[test]
    fn auth_frames_keep_the_token_out_of_debug_output() {
        let frame = parse_client_frame(r#"{"type":"auth","token":"eyJ.secret.sig"}"#).unwrap();
        assert_eq!(
            frame,
            ClientFrame::Auth {
                token: Token("eyJ.secret.sig".into())
            }
        );
        assert!(!format!("{frame:?}").contains("secret"));
        assert_eq!(code(r#"{"type":"auth"}"#), ErrorCode::BadRequest);
        assert_eq!(code(r#"{"type":"auth","token":7}"#), ErrorCode::BadRequest);
    }

    #[test]
    fn parses_each_frame() {
        assert_eq!(
            parse_client_frame(r#"{"type":"watch","users":["bob","carol"]}"#),
            Ok(ClientFrame::Watch {
                users: vec!["bob".into(), "carol".into()],
                devices: false,
            })
        );
        assert_eq!(
            parse_client_frame(r#"{"type":"watch","users":["bob"],"devices":true}"#),
            Ok(ClientFrame::Watch {
                users: vec!["bob".into()],
                devices: true,
            })
        );
        assert_eq!(
            code(r#"{"type":"watch","users":["bob"],"devices":"yes"}"#),
            ErrorCode::BadRequest
        );
        assert_eq!(
            parse_client_frame(r#"{"type":"status","status":"away","text":"lunch"}"#),
            Ok(ClientFrame::Status {
                status: "away".into(),
                text: Some("lunch".into()),
                until: None,
            })
        );
        assert_eq!(
            parse_client_frame(r#"{"type":"heartbeat"}"#),
            Ok(ClientFrame::Heartbeat)
        );
    }

    #[test]
    fn refuses_bad_input_with_a_code() {
        assert_eq!(code("not json"), ErrorCode::BadRequest);
        assert_eq!(code("[1,2]"), ErrorCode::BadRequest);
        assert_eq!(code(r#"{"type":7}"#), ErrorCode::BadRequest);
        assert_eq!(code(r#"{"type":"dance"}"#), ErrorCode::UnknownType);
        assert_eq!(code(r#"{"type":"watch"}"#), ErrorCode::BadRequest);
        assert_eq!(
            code(r#"{"type":"watch","users":"bob"}"#),
            ErrorCode::BadRequest
        );
        assert_eq!(
            code(r#"{"type":"watch","users":["b:ob"]}"#),
            ErrorCode::InvalidId
        );
        assert_eq!(
            code(r#"{"type":"status","status":"sleepy"}"#),
            ErrorCode::InvalidStatus
        );
        assert_eq!(
            code(r#"{"type":"privacy","online":"friends"}"#),
            ErrorCode::BadRequest
        );
        assert_eq!(code(r#"{"type":"privacy"}"#), ErrorCode::BadRequest);
        let long = "x".repeat(MAX_STATUS_TEXT + 1);
        assert_eq!(
            code(&format!(
                r#"{{"type":"status","status":"away","text":"{long}"}}"#
            )),
            ErrorCode::InvalidStatus
        );
        assert_eq!(
            code(r#"{"type":"status","status":"away","text":"a\u202Eb"}"#),
            ErrorCode::InvalidStatus
        );
    }

    #[test]
    fn presence_frame_is_flat() {
        let r = Record {
            user: "bob".into(),
            status: "online".into(),
            devices: 2,
            last_seen: None,
            text: None,
            until: None,
            kinds: vec!["web".into()],
            idle: false,
        };
        let v: serde_json::Value = serde_json::from_str(&presence_frame(&r)).unwrap();
        assert_eq!(v["type"], "presence");
        assert_eq!(v["user"], "bob");
        assert_eq!(v["devices"], 2);
        assert!(v["last_seen"].is_null());
        // The idle mark only where set.
        assert!(v.get("idle").is_none());
        let idle = Record { idle: true, ..r };
        let v: serde_json::Value = serde_json::from_str(&presence_frame(&idle)).unwrap();
        assert_eq!(v["idle"], true);
    }
}

#[cfg(test)]
mod fuzz {
    //! Arbitrary input never panics the parser and always yields a typed result.

    use super::*;
    use proptest::prelude::*;
    use serde_json::Value;

    fn json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<f64>()
                .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
            ".{0,20}".prop_map(Value::String),
            prop_oneof![
                Just("watch"),
                Just("unwatch"),
                Just("status"),
                Just("heartbeat"),
                Just("online"),
                Just("invisible"),
                Just("bob"),
                Just("b:ob"),
            ]
            .prop_map(|s| Value::String(s.into())),
        ];
        leaf.prop_recursive(4, 64, 8, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
                prop::collection::btree_map(
                    prop_oneof![
                        Just("type".to_string()),
                        Just("users".to_string()),
                        Just("status".to_string()),
                        Just("text".to_string()),
                        ".{0,8}"
                    ],
                    inner,
                    0..6
                )
                .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn check(text: &str) {
        match parse_client_frame(text) {
            Ok(ClientFrame::Watch { users, .. }) | Ok(ClientFrame::Unwatch { users }) => {
                assert!(users.iter().all(|u| ids::validate("user", u).is_ok()))
            }
            Ok(ClientFrame::Status { status, text, .. }) => {
                assert!(Status::parse(&status).is_ok());
                assert!(text.is_none_or(|t| status_text_problem(&t, MAX_STATUS_TEXT).is_none()));
            }
            Ok(ClientFrame::Heartbeat)
            | Ok(ClientFrame::Auth { .. })
            | Ok(ClientFrame::Pause { .. }) => {}
            Ok(ClientFrame::Privacy { online, last_seen }) => {
                assert!(parse_privacy(online.as_deref(), last_seen.as_deref()).is_ok())
            }
            Ok(ClientFrame::Join { room, state, .. }) => {
                assert!(ids::validate_room(&room).is_ok());
                assert!(state.is_none_or(|s| s.is_object()));
            }
            Ok(ClientFrame::RoomState { room, state }) => {
                assert!(ids::validate_room(&room).is_ok());
                assert!(state.is_object());
            }
            Ok(ClientFrame::Leave { room })
            | Ok(ClientFrame::Signal { room, .. })
            | Ok(ClientFrame::RoomToken { room, .. }) => {
                assert!(ids::validate_room(&room).is_ok())
            }
            Err(e) => assert!(!e.message.is_empty()),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn arbitrary_text_is_typed(text in ".{0,200}") {
            check(&text);
        }

        #[test]
        fn arbitrary_bytes_are_typed(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
            check(&String::from_utf8_lossy(&bytes));
        }

        #[test]
        fn arbitrary_json_is_typed(v in json()) {
            check(&v.to_string());
        }

        #[test]
        fn tagged_json_is_typed(kind in prop_oneof![Just("watch"), Just("unwatch"), Just("status"), Just("heartbeat"), Just("privacy")], v in json()) {
            let mut obj = match v { Value::Object(m) => m, other => {
                let mut m = serde_json::Map::new();
                m.insert("users".into(), other);
                m
            }};
            obj.insert("type".into(), Value::String(kind.into()));
            check(&Value::Object(obj).to_string());
        }
    }
}
