//! Lists over many users: who is online now (`presence-online`, paged), and
//! the retention of last-seen times (`presence-lastseen`).

use std::time::Duration;

use super::reply::{at, int};
use super::scripts::{parse_online_page, OnlineFrom};
use super::{now_ms, Store, StoreError, StoreResult};
use crate::keys;
use crate::model::Record;

/// One page of `GET /api/online`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct OnlinePage {
    /// Users online now, most recently active first.
    pub users: Vec<OnlineUser>,
    /// Pass back as `cursor` for the next page; `None` on the last one.
    pub next_cursor: Option<String>,
}

/// One entry of [`OnlinePage`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct OnlineUser {
    /// The user's record.
    #[serde(flatten)]
    pub record: Record,
    /// Last refresh of any of the user's devices, epoch ms.
    pub active_at: i64,
}

/// Most index entries one `GET /api/online` examines per user it may
/// list: a viewer who may see few of the online users costs a bounded
/// amount of Redis work per request, and pages on with the cursor.
pub const EXAMINED_PER_LISTED: usize = 4;
/// Most index entries one `GET /api/online` examines, whatever its limit.
pub const MAX_EXAMINED: usize = 2_000;

/// Position in `GET /api/online`: where the previous page stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cursor {
    /// After this user, the last the previous page examined, which its
    /// viewer was shown: `<active_at>.<user>`.
    After {
        /// That user's score (last refresh, epoch ms).
        active_at: i64,
        /// That user.
        user: String,
    },
    /// After the first `skip` entries whose score is `active_at`: the last
    /// entry examined was one the viewer may not see, so the cursor does
    /// not name it: `<active_at>~<skip>`.
    Ties {
        /// The score.
        active_at: i64,
        /// Entries with that score already examined.
        skip: u64,
    },
}

impl Cursor {
    /// The opaque string handed to clients.
    pub fn encode(&self) -> String {
        match self {
            Cursor::After { active_at, user } => format!("{active_at}.{user}"),
            Cursor::Ties { active_at, skip } => format!("{active_at}~{skip}"),
        }
    }

    /// Reads a cursor back; `None` when it is not one of ours.
    pub fn decode(s: &str) -> Option<Self> {
        let digits = s.bytes().take_while(u8::is_ascii_digit).count();
        let (at, rest) = s.split_at(digits);
        let active_at = at.parse().ok()?;
        if let Some(user) = rest.strip_prefix('.') {
            crate::ids::validate("user", user).ok()?;
            return Some(Cursor::After {
                active_at,
                user: user.to_string(),
            });
        }
        let skip = rest.strip_prefix('~')?;
        if !skip.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        Some(Cursor::Ties {
            active_at,
            skip: skip.parse().ok()?,
        })
    }
}

impl Store {
    /// One page of users online now, most recently active first. `cursor` is
    /// the `next_cursor` of the previous page. Scores move as devices
    /// refresh, so a user who becomes active while a client pages may show
    /// up on an earlier page than the one being read: the list is a view of
    /// "now", not a snapshot.
    ///
    /// Only users `viewer` may see online are listed, and one request
    /// examines at most `limit` x [`EXAMINED_PER_LISTED`] index entries
    /// (at most [`MAX_EXAMINED`]): a page may be short, even empty, with a
    /// `next_cursor` to go on. `next_cursor` is `None` only when the index
    /// has no entry left.
    pub async fn online(
        &self,
        limit: usize,
        cursor: Option<&Cursor>,
        viewer: Option<&str>,
        contacts_only: bool,
    ) -> StoreResult<OnlinePage> {
        let budget = (limit * EXAMINED_PER_LISTED)
            .min(MAX_EXAMINED)
            .max(limit + 1);
        let mut from = match cursor {
            None => OnlineFrom::Top,
            Some(Cursor::After { active_at, user }) => OnlineFrom::After {
                score: *active_at,
                member: user.clone(),
            },
            Some(Cursor::Ties { active_at, skip }) => OnlineFrom::Ties {
                score: *active_at,
                skip: *skip,
            },
        };
        let mut users: Vec<(Record, i64)> = Vec::with_capacity(limit);
        let mut examined = 0usize;
        // The last entry examined: score, member, position, shown.
        let mut last: Option<(i64, String, u64, bool)> = None;
        let mut more = true;
        'read: while examined < budget {
            let want = (budget - examined).min(limit + 1);
            let mut pipe = redis::pipe();
            self.scripts.online_page(&mut pipe, &from, want);
            let reply = self.query(&pipe).await?;
            let (start, page) = parse_online_page(at(&reply, 0, keys::ONLINE)?)?;
            let exhausted = page.len() < want;
            let names: Vec<String> = page.iter().map(|(u, _)| u.clone()).collect();
            // Entries of users no longer online (the index is repaired
            // lazily) are dropped by the record check, as hidden ones are.
            let records = self.records(&names, viewer, contacts_only).await?;
            let n = page.len();
            for (i, ((user, score), record)) in page.into_iter().zip(records).enumerate() {
                examined += 1;
                let shown = record.devices > 0;
                last = Some((score, user, start + i as u64, shown));
                if shown {
                    users.push((record, score));
                    if users.len() == limit {
                        more = !(exhausted && i + 1 == n);
                        break 'read;
                    }
                }
            }
            if exhausted {
                more = false;
                break;
            }
            if let Some((score, member, _, _)) = &last {
                from = OnlineFrom::After {
                    score: *score,
                    member: member.clone(),
                };
            }
        }
        let next_cursor = match last {
            Some((active_at, user, _, true)) if more => {
                Some(Cursor::After { active_at, user }.encode())
            }
            Some((active_at, _, position, false)) if more => {
                // Never name a user the viewer may not see: say how far
                // into the entries with that score the page got instead.
                let mut conn = self.conn();
                let above: u64 = redis::cmd("ZCOUNT")
                    .arg(keys::ONLINE)
                    .arg(format!("({active_at}"))
                    .arg("+inf")
                    .query_async(&mut conn)
                    .await?;
                Some(
                    Cursor::Ties {
                        active_at,
                        skip: (position + 1).saturating_sub(above),
                    }
                    .encode(),
                )
            }
            _ => None,
        };
        let users = users
            .into_iter()
            .map(|(record, active_at)| OnlineUser { record, active_at })
            .collect();
        Ok(OnlinePage { users, next_cursor })
    }

    /// Forgets users offline for longer than `retention`: their last seen
    /// (index entry and field) and status text, when no device came back.
    /// Returns how many were forgotten (at most `max` per call).
    pub async fn trim_last_seen(&self, retention: Duration, max: usize) -> StoreResult<usize> {
        let retention_ms = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
        let cutoff = now_ms().saturating_sub(retention_ms);
        let old = self.scored_up_to(keys::LAST_SEEN, cutoff, max).await?;
        if old.is_empty() {
            return Ok(0);
        }
        let mut pipe = redis::pipe();
        for (user, score) in &old {
            self.scripts
                .zrem_if(&mut pipe, keys::LAST_SEEN, user, score);
        }
        let reply = self.query(&pipe).await?;
        if reply.len() != old.len() {
            return Err(StoreError::reply(
                keys::LAST_SEEN,
                format!("{} replies to {} removals", reply.len(), old.len()),
            ));
        }
        let mut forget = redis::pipe();
        let mut forgotten = 0;
        for ((user, _), removed) in old.iter().zip(&reply) {
            if int(removed, keys::LAST_SEEN)? == 1 {
                forgotten += 1;
                // Only when offline: a user online again keeps all of it.
                self.scripts.forget_offline(&mut forget, user).ignore();
            }
        }
        self.query(&forget).await?;
        Ok(forgotten)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_round_trips_and_refuses_junk() {
        for c in [
            Cursor::After {
                active_at: 17,
                user: "a.b@c".into(),
            },
            Cursor::After {
                active_at: 17,
                user: "auth0|x~1.2".into(),
            },
            Cursor::Ties {
                active_at: 1795475817456,
                skip: 3,
            },
        ] {
            assert_eq!(Cursor::decode(&c.encode()), Some(c));
        }
        for junk in ["x.y", "12.b:ad", "nodot", "12~", "12~x", "~3", "12~3.4", ""] {
            assert_eq!(Cursor::decode(junk), None, "{junk:?}");
        }
    }
}
