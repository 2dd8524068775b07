//! Who may join which room: one policy per room-id pattern
//! (`--room-policy 'chat:*=members' --room-policy 'doc:*=token'
//! --room-policy '*=claim'`), the first that matches a room deciding, so
//! that one deployment can hold several kinds of rooms.

use std::fmt;

/// How a join to a room is decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// The connection token's rooms claim (ids and prefixes ending in `*`).
    Claim,
    /// Any authenticated user (anyone under development auth).
    Open,
    /// A room token from the app's backend, in the join frame.
    Token,
    /// A member list the backend keeps in the server, checked in the join's
    /// own atomic step.
    Members,
    /// The backend is asked (`--room-join-url`).
    Proxy,
}

impl Policy {
    /// Every policy, by name.
    pub const ALL: [Policy; 5] = [
        Policy::Claim,
        Policy::Open,
        Policy::Token,
        Policy::Members,
        Policy::Proxy,
    ];

    /// Its name in flags, docs and errors.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Claim => "claim",
            Policy::Open => "open",
            Policy::Token => "token",
            Policy::Members => "members",
            Policy::Proxy => "proxy",
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Which rooms a rule covers: one room id, a prefix (ending in `*`), or
/// every room (`*`).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Pattern {
    /// Exactly this room.
    Room(String),
    /// Rooms whose id starts with this (possibly empty: every room).
    Prefix(String),
}

impl Pattern {
    fn covers(&self, room: &str) -> bool {
        match self {
            Pattern::Room(id) => id == room,
            Pattern::Prefix(prefix) => room.starts_with(prefix.as_str()),
        }
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Pattern::Room(id) => f.write_str(id),
            Pattern::Prefix(prefix) => write!(f, "{prefix}*"),
        }
    }
}

/// The rules of `--room-policy`, in order, and the policy of a room no
/// rule covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policies {
    rules: Vec<(Pattern, Policy)>,
    fallback: Policy,
}

impl Default for Policies {
    /// Every room open (development auth's default).
    fn default() -> Self {
        Self::all(Policy::Open)
    }
}

impl Policies {
    /// One policy for every room.
    pub fn all(policy: Policy) -> Self {
        Self {
            rules: Vec::new(),
            fallback: policy,
        }
    }

    /// Parses the values of `--room-policy`: each `<pattern>=<policy>` or a
    /// bare `<policy>` (every room). A pattern is a room id, a prefix ending
    /// in `*`, or `*`. Rooms no rule covers get `fallback`.
    pub fn parse<S: AsRef<str>>(values: &[S], fallback: Policy) -> Result<Self, String> {
        let mut rules = Vec::with_capacity(values.len());
        for value in values {
            let value = value.as_ref().trim();
            let (pattern, name) = match value.rsplit_once('=') {
                Some((pattern, name)) => (pattern.trim(), name.trim()),
                None => ("*", value),
            };
            let policy = Policy::ALL
                .into_iter()
                .find(|p| p.name() == name)
                .ok_or_else(|| {
                    format!(
                        "--room-policy {value:?}: unknown policy {name:?}; one of claim, open, token, members, proxy"
                    )
                })?;
            let pattern = match pattern.strip_suffix('*') {
                Some(prefix) if !prefix.contains('*') => Pattern::Prefix(prefix.to_string()),
                None if !pattern.is_empty() && !pattern.contains('*') => {
                    Pattern::Room(pattern.to_string())
                }
                _ => {
                    return Err(format!(
                        "--room-policy {value:?}: {pattern:?} is not a room id, a prefix ending in `*`, or `*`"
                    ))
                }
            };
            if let Some((earlier, _)) = rules.iter().find(|(p, _): &&(Pattern, Policy)| {
                matches!(p, Pattern::Prefix(pre) if pattern_text(&pattern).starts_with(pre.as_str()))
            }) {
                return Err(format!(
                    "--room-policy {value:?} comes after {earlier}, which already covers every room it names: first match wins"
                ));
            }
            rules.push((pattern, policy));
        }
        // A catch-all rule is the fallback: nothing after it can match.
        let fallback = match rules.last() {
            Some((Pattern::Prefix(prefix), policy)) if prefix.is_empty() => {
                let policy = *policy;
                rules.pop();
                policy
            }
            _ => fallback,
        };
        Ok(Self { rules, fallback })
    }

    /// The policy of `room`: the first rule that covers it, else the
    /// fallback.
    pub fn of(&self, room: &str) -> Policy {
        self.rules
            .iter()
            .find(|(pattern, _)| pattern.covers(room))
            .map_or(self.fallback, |(_, policy)| *policy)
    }

    /// These rules with `claim` read as `open`: under development auth
    /// there is no token, so no rooms claim (as before per-room policies).
    pub fn claim_as_open(mut self) -> Self {
        let open = |p: Policy| if p == Policy::Claim { Policy::Open } else { p };
        self.fallback = open(self.fallback);
        for (_, policy) in &mut self.rules {
            *policy = open(*policy);
        }
        self
    }

    /// Whether any room may have `policy`.
    pub fn uses(&self, policy: Policy) -> bool {
        // A rule for every room became the fallback in `parse`: the
        // fallback is always reached.
        self.fallback == policy || self.rules.iter().any(|(_, p)| *p == policy)
    }

    /// The rules as given, then the fallback (`*=<policy>`), for the log
    /// at start.
    pub fn describe(&self) -> String {
        let mut parts: Vec<String> = self
            .rules
            .iter()
            .map(|(pattern, policy)| format!("{pattern}={policy}"))
            .collect();
        parts.push(format!("*={}", self.fallback));
        parts.join(" ")
    }
}

/// The text a pattern stands for, as a room id would start.
fn pattern_text(pattern: &Pattern) -> &str {
    match pattern {
        Pattern::Room(id) => id,
        Pattern::Prefix(prefix) => prefix,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_rule_that_covers_a_room_decides() {
        let p = Policies::parse(
            &["chat:*=members", "doc:42=open", "doc:*=token", "proxy"],
            Policy::Claim,
        )
        .unwrap();
        assert_eq!(p.of("chat:7"), Policy::Members);
        assert_eq!(p.of("doc:42"), Policy::Open);
        assert_eq!(p.of("doc:421"), Policy::Token);
        assert_eq!(p.of("team:1"), Policy::Proxy);
        assert!(p.uses(Policy::Token) && !p.uses(Policy::Claim));
        assert_eq!(
            p.describe(),
            "chat:*=members doc:42=open doc:*=token *=proxy"
        );
        let none = Policies::parse(&["chat:*=members"], Policy::Claim).unwrap();
        assert_eq!(none.of("doc:1"), Policy::Claim);
        assert_eq!(none.describe(), "chat:*=members *=claim");
        // A bare policy is every room, as the single value of old.
        assert_eq!(
            Policies::parse(&["open"], Policy::Claim).unwrap().of("x"),
            Policy::Open
        );
    }

    #[test]
    fn bad_rules_are_refused_with_the_reason() {
        for (values, says) in [
            (&["chat:*=member"][..], "unknown policy"),
            (&["ch*at=open"][..], "not a room id"),
            (&["=open"][..], "not a room id"),
            (&["*=open", "chat:*=members"][..], "first match wins"),
            (&["chat:*=open", "chat:7=members"][..], "first match wins"),
        ] {
            let err = Policies::parse(values, Policy::Claim).unwrap_err();
            assert!(err.contains(says), "{values:?}: {err}");
        }
    }
}
