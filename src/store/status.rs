//! What a user chooses: its status and text (`status.lua`), who may see it
//! (`privacy.lua`), and who counts as its contacts.

use super::reply::int;
use super::scripts::parse_status_set;
use super::{now_ms, Store, StoreError, StoreResult};
use crate::keys;
use crate::model::{Audience, Status};

impl Store {
    /// Sets a user's status and text, until `until` (epoch ms) if given;
    /// publishes it when the user is online. Returns when the status was
    /// chosen (a change of text alone keeps it).
    pub async fn set_status(
        &self,
        user: &str,
        status: Status,
        text: Option<&str>,
        until: Option<i64>,
    ) -> StoreResult<i64> {
        let mut pipe = redis::pipe();
        let feed = self.feed_of(user);
        if let Some(feed) = &feed {
            self.send_due_for(feed);
        }
        self.scripts.status(
            &mut pipe,
            user,
            status,
            text.unwrap_or(""),
            until,
            now_ms(),
            feed.as_ref(),
        );
        if let Some(until) = until {
            // Beside the step, in the same round trip: the status-end pass
            // finds it there (and the reconciliation puts back one lost).
            pipe.zadd(keys::status_until(self.buckets.of(user)), user, until)
                .ignore();
        }
        let reply = self.query(&pipe).await?;
        let first = reply
            .first()
            .ok_or_else(|| StoreError::reply(&keys::status(user), "status: empty reply"))?;
        let set = parse_status_set(&self.report(first, true), user)?;
        let since = set.since;
        if status == Status::Invisible {
            // Others are shown the moment it went invisible as its last
            // seen, on every surface: the recently-seen list finds it there
            // (`presence-lastseen` holds every user by the last seen others
            // may be shown; a later departure only raises it, GT).
            let mut index = redis::pipe();
            index
                .cmd("ZADD")
                .arg(keys::last_seen(self.buckets.of(user)))
                .arg("GT")
                .arg(since)
                .arg(user)
                .ignore();
            self.query(&index).await?;
        }
        if set.was_invisible != (status == Status::Invisible) {
            // Hidden (or shown) in every room of every device at once,
            // whichever node each is on.
            self.sync_room_visibility(user).await?;
        }
        Ok(since)
    }

    /// Changes who may see `user` online and its last seen; publishes the
    /// record when something changed. Returns whether something did.
    pub async fn set_privacy(
        &self,
        user: &str,
        show_online: Option<Audience>,
        show_last_seen: Option<Audience>,
    ) -> StoreResult<bool> {
        let mut pipe = redis::pipe();
        self.scripts
            .privacy(&mut pipe, user, show_online, show_last_seen, now_ms());
        let reply = self.query(&pipe).await?;
        let key = keys::status(user);
        let first = reply
            .first()
            .ok_or_else(|| StoreError::reply(&key, "privacy: empty reply"))?;
        Ok(int(first, &key)? == 1)
    }

    /// Replaces `user`'s contacts and tells every node, so that watchers'
    /// views follow at once.
    pub async fn set_contacts(&self, user: &str, contacts: &[String]) -> StoreResult<()> {
        let mut pipe = redis::pipe();
        pipe.atomic();
        pipe.del(keys::contacts(user)).ignore();
        if !contacts.is_empty() {
            pipe.sadd(keys::contacts(user), contacts).ignore();
        }
        pipe.cmd("SPUBLISH")
            .arg(keys::events(user))
            .arg(serde_json::json!({"user": user, "contacts_changed": true}).to_string())
            .ignore();
        self.query(&pipe).await?;
        Ok(())
    }

    /// `user`'s contacts, sorted.
    pub async fn contacts(&self, user: &str) -> StoreResult<Vec<String>> {
        self.sorted_members(&keys::contacts(user)).await
    }
}
