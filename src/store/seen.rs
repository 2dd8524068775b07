//! Recently seen: `GET /api/online?seen_within_ms=` goes on, after the
//! users online now, with the users last seen within the window, most
//! recent first, walked from the buckets of `presence-lastseen` the way the
//! online list walks `presence-leases` (same bounded work per request, same
//! sealed cursor: a negative score marks a position in this second part).

use std::collections::{HashMap, HashSet};

use super::lists::{Entry, Walk, EXAMINE_PER_LIMIT, MAX_EXAMINED};
use super::records::view_as;
use super::{Cursor, OnlinePage, OnlineUser, Reader, Store, StoreResult};
use crate::keys;
use crate::model::Record;

/// The score of a cursor at the start of the recently seen (no entry
/// passed yet). Last-seen scores are whole positive ms, so their negations
/// are at most -1.
const SEEN_START: f64 = -0.5;

/// Whether a cursor points into the recently seen.
pub fn is_seen_cursor(c: &Cursor) -> bool {
    c.score < 0.0
}

impl Store {
    /// The cursor at the start of the recently seen, sealed.
    pub fn seen_start_cursor(&self) -> String {
        self.cursor_key.seal(&Cursor {
            score: SEEN_START,
            ties: vec![0; self.buckets.count() as usize],
        })
    }

    /// One page of the users last seen at or after `since` (epoch ms),
    /// most recent first, that `reader` sees offline with a last seen
    /// within the window: a user whose last seen is hidden from the
    /// reader is not listed. `cursor` is a recently seen cursor (see
    /// [`is_seen_cursor`]) or `None` for the start. At most 4 x `limit`
    /// entries (2,000 at most) are examined, as for the online list.
    pub async fn recently_seen(
        &self,
        limit: usize,
        cursor: Option<&Cursor>,
        since: i64,
        reader: Reader<'_>,
        contacts_only: bool,
    ) -> StoreResult<OnlinePage> {
        let limit = limit.max(1);
        let budget = (EXAMINE_PER_LIMIT * limit).min(MAX_EXAMINED).max(limit);
        let buckets = self.buckets.count() as usize;
        let mut walk = match cursor {
            Some(c) if c.score < SEEN_START => Walk {
                at: Some(-c.score),
                ties: c.ties.clone(),
            },
            _ => Walk {
                at: None,
                ties: vec![0; buckets],
            },
        };
        let min = since.to_string();
        let mut users: Vec<OnlineUser> = Vec::new();
        let mut listed: HashSet<String> = HashSet::new();
        let mut examined = 0;
        let mut exhausted = false;
        while users.len() < limit && examined < budget {
            let want = budget - examined;
            let per = (want.div_ceil(buckets) * 2 + 2).min(want);
            let (candidates, more) = self
                .next_round(&walk, per, want, (keys::last_seen, &min))
                .await?;
            let read = self
                .seen_records(&candidates, reader, contacts_only)
                .await?;
            let mut rest = candidates.iter();
            for (score, user, b) in rest.by_ref() {
                examined += 1;
                walk.pass(*b, *score);
                let shown = read
                    .get(user.as_str())
                    .filter(|r| r.devices == 0 && r.last_seen.is_some_and(|ls| ls >= since));
                if let Some(record) = shown {
                    if listed.insert(user.clone()) {
                        users.push(OnlineUser {
                            record: record.clone(),
                            active_at: *score as i64,
                        });
                    }
                }
                if users.len() == limit {
                    break;
                }
            }
            if !more && rest.next().is_none() {
                exhausted = true;
                break;
            }
        }
        let next_cursor = match (exhausted, walk.at) {
            (true, _) => None,
            (false, None) => Some(self.seen_start_cursor()),
            (false, Some(at)) => Some(self.cursor_key.seal(&Cursor {
                score: -at,
                ties: walk.ties,
            })),
        };
        Ok(OnlinePage { users, next_cursor })
    }

    /// What `reader` may see of the users of `entries`. The caller lists
    /// those shown offline with a last seen in the window: the same record
    /// `GET /api/presence` gives, so that whether a user is listed tells no
    /// more than that record (an invisible user is in the index at the
    /// moment it went invisible, a user online but hidden from the viewer
    /// at its last departure, the last seen each is shown).
    async fn seen_records(
        &self,
        entries: &[Entry],
        reader: Reader<'_>,
        contacts_only: bool,
    ) -> StoreResult<HashMap<String, Record>> {
        let mut names: Vec<String> = Vec::new();
        let mut seen: HashSet<&str> = HashSet::new();
        for (_, user, _) in entries {
            if seen.insert(user) {
                names.push(user.clone());
            }
        }
        let viewer = match reader {
            Reader::Viewer(v) => v,
            Reader::Service => None,
        };
        let observed = self.presences(&names, viewer).await?;
        Ok(observed
            .iter()
            .map(|o| (o.presence.user.clone(), view_as(o, reader, contacts_only)))
            .collect())
    }
}
