//! Statuses that end: the due index `presence-until:{b<k>}` (user -> the
//! `until` of its chosen status), the status-end pass that resets the due
//! ones (`status_end.lua`, run under the bucket's deadline-pass lock, beside
//! the lease and room passes), and the repair that puts back entries Redis
//! lost (a restart: the sessions re-assert the status, the reconciliation
//! re-indexes its `until`).

use super::reply::opt_int;
use super::scripts::{parse_status_end, StatusEnd};
use super::{now_ms, Store, StoreError, StoreResult};
use crate::keys;

impl Store {
    /// One step of the status-end pass over `bucket`: ends up to `max`
    /// statuses whose `until` has come. Each reset is one atomic step that
    /// finds nothing to do when run again, so it is announced once in the
    /// fleet whichever node runs it, even when the node that set the
    /// status is gone. Returns how many statuses it ended.
    pub async fn end_statuses(&self, bucket: u32, max: usize) -> StoreResult<usize> {
        let now = now_ms();
        let index = keys::status_until(bucket);
        let due = self.scored_up_to(&index, now, max).await?;
        if due.is_empty() {
            return Ok(0);
        }
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        let mut pre = redis::pipe();
        for (user, _) in &due {
            let feed = self.feed_of(user);
            if let Some(feed) = &feed {
                self.feed_due_before(&mut pre, feed);
            }
            self.scripts.status_end(&mut pipe, user, now, feed.as_ref());
        }
        self.send_due(pre);
        let reply = self.query(&pipe).await?;
        if reply.len() != due.len() {
            return Err(StoreError::reply(
                &index,
                format!("{} replies to {} status ends", reply.len(), due.len()),
            ));
        }
        let mut ended = 0;
        // Users whose `invisible` ended: shown again in their rooms.
        let mut shown = Vec::new();
        let mut follow = redis::pipe();
        for ((user, score), value) in due.iter().zip(&reply) {
            match parse_status_end(&self.report(value, true), user) {
                Ok(StatusEnd::Later(until)) => {
                    // XX: an entry removed meanwhile stays removed.
                    follow
                        .cmd("ZADD")
                        .arg(&index)
                        .arg("XX")
                        .arg(until)
                        .arg(user)
                        .ignore();
                }
                Ok(outcome) => {
                    if let StatusEnd::Ended(was_invisible) = outcome {
                        ended += 1;
                        if was_invisible {
                            shown.push(user.as_str());
                        }
                    }
                    // Only this entry: a new `until` chosen meanwhile stays.
                    self.scripts
                        .zrem_if(&mut follow, &index, user, score)
                        .ignore();
                }
                Err(e) => log::warn!("ending the status of {user} failed: {e}"),
            }
        }
        if !follow.is_empty() {
            self.query(&follow).await?;
        }
        for user in shown {
            if let Err(e) = self.sync_room_visibility(user).await {
                log::warn!("{user}: rooms not swept after its status ended: {e}");
            }
        }
        Ok(ended)
    }

    /// Puts back in the due index the `until` of each of `users` that has
    /// one (`ZADD NX`: an entry there is left alone). For the
    /// reconciliation: Redis lost the index, or a node died between a
    /// status step and its index write.
    pub(super) async fn reindex_until(&self, users: &[&str]) -> StoreResult<()> {
        if users.is_empty() {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        for user in users {
            pipe.hget(keys::status(user), "until");
        }
        let reply = self.query(&pipe).await?;
        let mut add = redis::pipe();
        for (user, value) in users.iter().zip(&reply) {
            let until = match value {
                redis::Value::Nil => None,
                v => opt_int(v, &keys::status(user))?,
            };
            if let Some(until) = until {
                add.cmd("ZADD")
                    .arg(keys::status_until(self.buckets.of(user)))
                    .arg("NX")
                    .arg(until)
                    .arg(*user)
                    .ignore();
            }
        }
        if !add.is_empty() {
            self.query(&add).await?;
        }
        Ok(())
    }
}
