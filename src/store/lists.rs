//! Lists over many users: who is online now (`presence-online`, paged), and
//! the retention of last-seen times (`presence-lastseen`).

use std::time::Duration;

use super::reply::int;
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

/// Position in `GET /api/online`: the last user of the previous page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    /// That user's score (last refresh, epoch ms).
    pub active_at: i64,
    /// That user.
    pub user: String,
}

impl Cursor {
    /// The opaque string handed to clients: `<active_at>.<user>`.
    pub fn encode(&self) -> String {
        format!("{}.{}", self.active_at, self.user)
    }

    /// Reads a cursor back; `None` when it is not one of ours.
    pub fn decode(s: &str) -> Option<Self> {
        let (at, user) = s.split_once('.')?;
        crate::ids::validate("user", user).ok()?;
        Some(Self {
            active_at: at.parse().ok()?,
            user: user.to_string(),
        })
    }
}

impl Store {
    /// One page of users online now, most recently active first. `cursor` is
    /// the `next_cursor` of the previous page. Scores move as devices
    /// refresh, so a user who becomes active while a client pages may show
    /// up on an earlier page than the one being read: the list is a view of
    /// "now", not a snapshot.
    /// Only users `viewer` may see online are listed.
    pub async fn online(
        &self,
        limit: usize,
        cursor: Option<&Cursor>,
        viewer: Option<&str>,
        contacts_only: bool,
    ) -> StoreResult<OnlinePage> {
        let mut conn = self.conn();
        let mut users: Vec<(Record, i64)> = Vec::with_capacity(limit + 1);
        let max = cursor.map_or("+inf".to_string(), |c| c.active_at.to_string());
        let mut offset = 0usize;
        let batch = limit + 1;
        // Entries tied with the cursor's score that come before it in the
        // (descending) order are skipped; entries of users no longer online
        // (the index is repaired lazily) are dropped by the record check.
        loop {
            let page: Vec<(String, f64)> = redis::cmd("ZRANGE")
                .arg(keys::ONLINE)
                .arg(&max)
                .arg("-inf")
                .arg("BYSCORE")
                .arg("REV")
                .arg("LIMIT")
                .arg(offset)
                .arg(batch)
                .arg("WITHSCORES")
                .query_async(&mut conn)
                .await?;
            let exhausted = page.len() < batch;
            offset += page.len();
            let candidates: Vec<(String, i64)> = page
                .into_iter()
                .map(|(u, s)| (u, s as i64))
                .filter(|(u, s)| match cursor {
                    Some(c) => *s < c.active_at || (*s == c.active_at && *u < c.user),
                    None => true,
                })
                .collect();
            let names: Vec<String> = candidates.iter().map(|(u, _)| u.clone()).collect();
            let records = self.records(&names, viewer, contacts_only).await?;
            for ((_, score), record) in candidates.into_iter().zip(records) {
                if record.devices > 0 {
                    users.push((record, score));
                }
            }
            if users.len() > limit || exhausted {
                break;
            }
        }
        let next_cursor = if users.len() > limit {
            users.truncate(limit);
            users.last().map(|(r, s)| {
                Cursor {
                    active_at: *s,
                    user: r.user.clone(),
                }
                .encode()
            })
        } else {
            None
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
        let c = Cursor {
            active_at: 17,
            user: "a.b@c".into(),
        };
        assert_eq!(Cursor::decode(&c.encode()), Some(c));
        assert_eq!(Cursor::decode("x.y"), None);
        assert_eq!(Cursor::decode("12.b:ad"), None);
        assert_eq!(Cursor::decode("nodot"), None);
    }
}
