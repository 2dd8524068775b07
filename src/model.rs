//! The presence data every layer shares: what a user chose ([`Status`],
//! [`Audience`], [`ChosenStatus`]), the truth about a user ([`Presence`],
//! published as an [`Event`]) and what one viewer is shown of it
//! ([`Record`]). It imports nothing of the crate, so that the protocol, the
//! privacy rules and the store can all use it without importing each other.

use serde::{Deserialize, Serialize};

/// A status a user may choose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Available.
    Online,
    /// Away from the keyboard.
    Away,
    /// Do not disturb.
    Busy,
    /// Online, but offline to everyone else.
    Invisible,
}

impl Status {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Online => "online",
            Status::Away => "away",
            Status::Busy => "busy",
            Status::Invisible => "invisible",
        }
    }

    /// Parses a client's choice.
    pub fn parse(s: &str) -> Result<Self, UnknownStatus> {
        match s {
            "online" => Ok(Status::Online),
            "away" => Ok(Status::Away),
            "busy" => Ok(Status::Busy),
            "invisible" => Ok(Status::Invisible),
            other => Err(UnknownStatus(other.to_string())),
        }
    }
}

/// A status name that is not one of [`Status`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("status must be online, away, busy or invisible, not {0:?}")]
pub struct UnknownStatus(pub String);

/// Who may see one piece of a user's presence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Audience {
    /// Anyone who can ask.
    #[default]
    Everyone,
    /// Only the user's contacts.
    Contacts,
    /// No one but the user.
    Nobody,
}

impl Audience {
    /// Parses `everyone`, `contacts` or `nobody`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "everyone" => Some(Audience::Everyone),
            "contacts" => Some(Audience::Contacts),
            "nobody" => Some(Audience::Nobody),
            _ => None,
        }
    }

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Audience::Everyone => "everyone",
            Audience::Contacts => "contacts",
            Audience::Nobody => "nobody",
        }
    }
}

/// A user's true presence with what decides who may see it; what the
/// scripts publish and `read.lua` returns.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Presence {
    /// The user.
    pub user: String,
    /// online, away, busy, invisible (while online) or offline.
    pub status: String,
    /// Live devices.
    pub devices: u32,
    /// Last time the user went offline, epoch ms.
    pub last_seen: Option<i64>,
    /// Status text.
    pub text: Option<String>,
    /// The status the user chose (kept while offline).
    #[serde(default = "online")]
    pub chosen: String,
    /// When it was chosen, epoch ms.
    #[serde(default)]
    pub since: i64,
    /// Who may see that the user is online.
    #[serde(default)]
    pub show_online: Audience,
    /// Who may see when the user was last seen.
    #[serde(default)]
    pub show_last_seen: Audience,
    /// When the chosen status ends (back to `online`, no text), epoch ms.
    #[serde(default)]
    pub until: Option<i64>,
    /// The sorted distinct kinds of the live devices ([`DeviceKind`]).
    #[serde(default)]
    pub kinds: Vec<String>,
    /// Every live device is paused (`{"type":"pause"}`): the user stepped
    /// away from all of them and is still present for their grace.
    #[serde(default)]
    pub idle: bool,
}

fn online() -> String {
    "online".into()
}

/// A user's chosen status and privacy settings as stored in Redis; what a
/// session re-asserts if Redis loses them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ChosenStatus {
    /// online, away, busy or invisible ("" for none chosen).
    pub status: String,
    /// Free text, "" for none.
    pub text: String,
    /// When the status was chosen, epoch ms.
    pub since: i64,
    /// Who may see the user online ("" when unset).
    pub show_online: String,
    /// Who may see the user's last seen ("" when unset).
    pub show_last_seen: String,
    /// When the status ends, epoch ms (0: it does not).
    pub until: i64,
}

/// What a viewer sees of one user.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Record {
    /// The user.
    #[schema(example = "bob")]
    pub user: String,
    /// online, away, busy or offline (`invisible` only in the user's own
    /// view and in a service view).
    #[schema(example = "online")]
    pub status: String,
    /// Number of live devices.
    pub devices: u32,
    /// When the user was last online, epoch ms; null while online or never seen.
    pub last_seen: Option<i64>,
    /// Optional status text.
    pub text: Option<String>,
    /// When the status ends (back to `online`), epoch ms; null when it
    /// does not, or when the status is not visible.
    #[serde(default)]
    pub until: Option<i64>,
    /// The sorted distinct kinds of the live devices (web, desktop,
    /// mobile, tablet, bot, other); shown exactly when `devices` is.
    #[serde(default)]
    #[schema(example = json!(["mobile", "web"]))]
    pub kinds: Vec<String>,
    /// `true` while every live device of the user is paused (an app in
    /// the background, a phone locked): present, but away from all of
    /// them. Absent otherwise; shown exactly when the status is.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub idle: bool,
}

/// The kind of a device, given on connect or on an HTTP heartbeat
/// (`&kind=`): what the "on mobile" mark of chat apps is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceKind {
    /// A browser tab.
    Web,
    /// A desktop app.
    Desktop,
    /// A phone.
    Mobile,
    /// A tablet.
    Tablet,
    /// A program acting for the user.
    Bot,
    /// Anything else (the default).
    #[default]
    Other,
}

impl DeviceKind {
    /// Every kind, in wire order.
    pub const ALL: [DeviceKind; 6] = [
        DeviceKind::Web,
        DeviceKind::Desktop,
        DeviceKind::Mobile,
        DeviceKind::Tablet,
        DeviceKind::Bot,
        DeviceKind::Other,
    ];

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceKind::Web => "web",
            DeviceKind::Desktop => "desktop",
            DeviceKind::Mobile => "mobile",
            DeviceKind::Tablet => "tablet",
            DeviceKind::Bot => "bot",
            DeviceKind::Other => "other",
        }
    }

    /// Parses `kind=`; `None` (absent or empty) is [`DeviceKind::Other`].
    pub fn parse(s: Option<&str>) -> Result<Self, String> {
        match s {
            None | Some("") => Ok(DeviceKind::Other),
            Some(s) => Self::ALL
                .into_iter()
                .find(|k| k.as_str() == s)
                .ok_or_else(|| {
                    format!("kind must be web, desktop, mobile, tablet, bot or other, not {s:?}")
                }),
        }
    }
}

/// Longest a status may be set ahead of time: 30 days.
pub const MAX_UNTIL_AHEAD_MS: i64 = 30 * 24 * 3_600_000;

/// Why a status's `until` (epoch ms) is refused at `now`, if it is: in the
/// past, or more than 30 days ahead.
pub fn until_problem(until: i64, now: i64) -> Option<String> {
    if until <= now {
        return Some(format!("until ({until}) is in the past"));
    }
    if until - now > MAX_UNTIL_AHEAD_MS {
        return Some("until is more than 30 days ahead".to_string());
    }
    None
}

/// A transition as published on the `presence-events` channel by the scripts.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Event {
    /// The user's true presence after the transition.
    #[serde(flatten)]
    pub presence: Presence,
    /// Per-user sequence number, increasing with each transition; lets a
    /// session drop an event its snapshot already reflects.
    pub seq: u64,
    /// Only the device count changed (a second device came or went): for
    /// the watchers who asked for device counts alone.
    #[serde(default)]
    pub devices_only: bool,
    /// The transition is a flip of the idle mark alone ([`Presence::idle`]):
    /// a device paused, resumed, or left the others all paused.
    #[serde(default)]
    pub idle_flip: bool,
}

/// Why a status text is refused, if it is: longer than `max` characters, or
/// holding a code point that would mislead whoever reads it: C0 and C1
/// controls and DEL (line breaks, escapes), bidi embeddings, overrides and
/// isolates (U+202A to U+202E, U+2066 to U+2069: "gnp.exe" shown as
/// "exe.png"), and noncharacters (U+FDD0 to U+FDEF, and the last two code
/// points of every plane). Zero-width joiners (U+200D) are kept: emoji
/// sequences need them.
pub fn status_text_problem(text: &str, max: usize) -> Option<String> {
    if text.chars().count() > max {
        return Some(format!("status text is longer than {max} characters"));
    }
    let bad = text.chars().find(|&c| {
        c.is_control()
            || ('\u{202A}'..='\u{202E}').contains(&c)
            || ('\u{2066}'..='\u{2069}').contains(&c)
            || ('\u{FDD0}'..='\u{FDEF}').contains(&c)
            || (c as u32 & 0xFFFE) == 0xFFFE
    })?;
    Some(format!(
        "status text may not hold U+{:04X} (control, bidi or noncharacter)",
        bad as u32
    ))
}

#[cfg(test)]
mod tests {
    use super::status_text_problem;

    #[test]
    fn status_text_refuses_controls_bidi_and_noncharacters() {
        for bad in [
            "\u{0}",
            "a\u{1F}",
            "\u{7F}",
            "\u{80}",
            "\u{9F}",
            "line\nbreak",
            "\u{202A}",
            "\u{202E}",
            "\u{2066}",
            "\u{2069}",
            "\u{FDD0}",
            "\u{FDEF}",
            "\u{FFFE}",
            "\u{FFFF}",
            "\u{1FFFE}",
            "\u{10FFFF}",
        ] {
            assert!(status_text_problem(bad, 256).is_some(), "{bad:?}");
        }
        for good in [
            "",
            "in a meeting",
            "\u{1F468}\u{200D}\u{1F469}\u{200D}\u{1F467}",
            "\u{1F3F3}\u{FE0F}\u{200D}\u{1F308}",
            "\u{A0}caf\u{E9} \u{05E9}\u{05DC}\u{05D5}\u{05DD}",
            "\u{2065}\u{206A}\u{FDCF}\u{FDF0}\u{FFFD}",
        ] {
            assert_eq!(status_text_problem(good, 256), None, "{good:?}");
        }
        assert!(status_text_problem(&"x".repeat(257), 256).is_some());
        assert_eq!(status_text_problem(&"\u{e9}".repeat(256), 256), None);
    }
}
