//! The room tokens one session holds (`--room-policy token`): per room,
//! when its token lapses (`exp` plus the verifier's leeway) and whether
//! the device was warned; and one timer for all of them, armed for the
//! earliest moment something is due.
//!
//! A verified token itself is not kept: the session's own rejoin (after
//! Redis lost the membership) needs only to know that it is still valid,
//! so a membership costs a deadline and a flag, not a 1 KiB JWT. The raw
//! token of a first join is held only until the join's turn verifies it.

use std::collections::HashMap;
use std::sync::Arc;

use actix::SpawnHandle;
use serde::Serialize;

use crate::protocol::{to_json, Tagged};

/// One room's token, as far as the session needs it.
#[derive(Debug, Default)]
struct Clock {
    /// When the token lapses, epoch ms; 0 while it is not verified yet.
    deadline_ms: i64,
    /// `room_token_expiring` went out for this deadline.
    warned: bool,
    /// The token of a join waiting its turn, verified then.
    pending: Option<Box<str>>,
}

/// Something a room token's clock says is due.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Due {
    /// Tell the device its token for `room` lapses at `expires_at`.
    Warn {
        /// The room.
        room: Arc<str>,
        /// When it lapses, epoch ms.
        expires_at: i64,
    },
    /// The token for this room lapsed: the device leaves it.
    Expired(Arc<str>),
}

/// The room tokens of one session.
#[derive(Debug, Default)]
pub struct RoomTokens {
    /// By room, only rooms under `--room-policy token`.
    by_room: HashMap<Arc<str>, Clock>,
    /// The one timer, and the moment (epoch ms) it is armed for.
    pub timer: Option<(SpawnHandle, i64)>,
}

impl RoomTokens {
    /// Holds the token of a first join until its turn.
    pub fn offer(&mut self, room: Arc<str>, token: Box<str>) {
        self.by_room.entry(room).or_default().pending = Some(token);
    }

    /// The token of a join whose turn came, if one waits.
    pub fn take_pending(&mut self, room: &str) -> Option<Box<str>> {
        self.by_room.get_mut(room)?.pending.take()
    }

    /// A token for `room` verified, lapsing at `deadline_ms`: it replaces
    /// the one before, and will be warned about afresh.
    pub fn grant(&mut self, room: Arc<str>, deadline_ms: i64) {
        let clock = self.by_room.entry(room).or_default();
        clock.deadline_ms = deadline_ms;
        clock.warned = false;
    }

    /// When the verified token for `room` lapses, if there is one.
    pub fn deadline(&self, room: &str) -> Option<i64> {
        self.by_room
            .get(room)
            .map(|c| c.deadline_ms)
            .filter(|d| *d > 0)
    }

    /// Forgets `room`'s token (the device left the room).
    pub fn remove(&mut self, room: &str) {
        self.by_room.remove(room);
    }

    /// The earliest moment a warning (`warn_ms` before a deadline) or an
    /// expiry is due, epoch ms.
    pub fn next_due(&self, warn_ms: i64) -> Option<i64> {
        self.by_room
            .values()
            .filter(|c| c.deadline_ms > 0)
            .map(|c| {
                if c.warned {
                    c.deadline_ms
                } else {
                    c.deadline_ms - warn_ms
                }
            })
            .min()
    }

    /// What is due at `now` (epoch ms): warnings, marked sent, and
    /// expiries, forgotten here.
    pub fn due(&mut self, now: i64, warn_ms: i64) -> Vec<Due> {
        let mut due = Vec::new();
        for (room, clock) in &mut self.by_room {
            if clock.deadline_ms == 0 {
                continue;
            }
            if clock.deadline_ms <= now {
                due.push(Due::Expired(room.clone()));
            } else if !clock.warned && clock.deadline_ms - warn_ms <= now {
                clock.warned = true;
                due.push(Due::Warn {
                    room: room.clone(),
                    expires_at: clock.deadline_ms,
                });
            }
        }
        for d in &due {
            if let Due::Expired(room) = d {
                self.by_room.remove(room);
            }
        }
        due
    }
}

/// The `room_token_expiring` frame: the device leaves `room` at
/// `expires_at` (epoch ms) unless it sends a fresh `room_token` first.
pub fn room_token_expiring_frame(room: &str, expires_at: i64) -> String {
    #[derive(Serialize)]
    struct Expiring<'a> {
        room: &'a str,
        expires_at: i64,
    }
    to_json(&Tagged {
        kind: "room_token_expiring",
        body: &Expiring { room, expires_at },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warnings_then_expiries_come_due_in_turn() {
        let mut t = RoomTokens::default();
        let (a, b): (Arc<str>, Arc<str>) = (Arc::from("a"), Arc::from("b"));
        t.offer(a.clone(), "jwt".into());
        // Not verified yet: nothing is due, ever.
        assert_eq!(t.next_due(100), None);
        assert_eq!(t.take_pending("a").as_deref(), Some("jwt"));
        assert_eq!(t.take_pending("a"), None);
        t.grant(a.clone(), 1_000);
        t.grant(b.clone(), 5_000);
        assert_eq!(t.deadline("a"), Some(1_000));
        assert_eq!(t.next_due(100), Some(900));
        assert_eq!(t.due(899, 100), []);
        assert_eq!(
            t.due(900, 100),
            [Due::Warn {
                room: a.clone(),
                expires_at: 1_000
            }]
        );
        // Warned once; next comes its expiry.
        assert_eq!(t.next_due(100), Some(1_000));
        assert_eq!(t.due(950, 100), []);
        // A fresh token before it: warned about afresh, later.
        t.grant(a.clone(), 2_000);
        assert_eq!(t.next_due(100), Some(1_900));
        assert_eq!(t.due(2_000, 100), [Due::Expired(a.clone())]);
        assert_eq!(t.deadline("a"), None);
        assert_eq!(t.next_due(100), Some(4_900));
        // A warning longer than the token's life is due at once.
        t.remove("b");
        t.grant(b.clone(), 5_000);
        assert_eq!(t.next_due(60_000), Some(5_000 - 60_000));
        assert_eq!(t.next_due(0), Some(5_000));
    }

    #[test]
    fn the_expiring_frame_names_the_room_and_the_moment() {
        let v: serde_json::Value =
            serde_json::from_str(&room_token_expiring_frame("chat:42", 1_700_000_000_000)).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"type": "room_token_expiring", "room": "chat:42", "expires_at": 1_700_000_000_000i64})
        );
    }
}
