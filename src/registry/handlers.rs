//! The registry's handlers: notices from the subscriptions, resyncs,
//! watches and unwatches, joins and leaves, and each published event.

use std::collections::HashSet;

use actix::prelude::*;

use super::messages::{FromSubscriptions, Resynced};
use super::*;
use crate::keys;
use crate::model::{Audience, Event};

impl Handler<FromSubscriptions> for Registry {
    type Result = ();

    fn handle(&mut self, FromSubscriptions(notice): FromSubscriptions, ctx: &mut Self::Context) {
        match notice {
            Notice::Ready => match self.ready.take() {
                Some(ready) => {
                    let _ = ready.send(());
                }
                None => {
                    self.rooms.resync();
                    self.start_room_reads(ctx);
                    self.resync(ctx);
                }
            },
            Notice::Message { channel, payload } => {
                self.published(&channel, &payload);
                self.start_room_reads(ctx);
            }
            Notice::Dropped { channels } => {
                log::info!(
                    "{} subscription(s) dropped by redis and renewed; re-reading the watched users",
                    channels.len()
                );
                self.rooms.resync();
                self.start_room_reads(ctx);
                self.resync(ctx);
            }
        }
    }
}

impl Handler<Resynced> for Registry {
    type Result = ();

    fn handle(&mut self, msg: Resynced, _: &mut Self::Context) {
        if msg.round != self.round {
            return;
        }
        let mut sent = 0;
        for o in msg.records {
            if self.touched.contains(&o.presence.user) {
                continue;
            }
            sent += 1;
            self.deliver(Deliver::new(&o.presence, o.seq, true));
            // A contacts change may have been missed too: watchers of a
            // user whose view depends on contacts re-read their relation.
            let p = &o.presence;
            if self.contacts_only
                || p.show_online == Audience::Contacts
                || p.show_last_seen == Audience::Contacts
            {
                self.recheck(&p.user);
            }
        }
        self.resynced += sent;
        crate::metrics::registry_resynced(sent);
        self.touched.clear();
        self.reading = false;
        log::info!("resync: re-read {sent} watched users after resubscribing");
    }
}

impl Handler<Watch> for Registry {
    type Result = ResponseActFuture<Self, Result<Vec<UserId>, String>>;

    fn handle(&mut self, msg: Watch, _: &mut Self::Context) -> Self::Result {
        let users: Vec<UserId> = msg.users.into_iter().map(|u| self.intern(u)).collect();
        let held = users.clone();
        let watcher = self.watchers.entry(msg.session).or_insert_with(|| Watcher {
            recheck: msg.recheck,
            users: Vec::new(),
        });
        watcher.users.extend(users.iter().cloned());
        // Sorted, once each and no spare room: 8 B a watch, where a hash
        // set took 34 B (issue 29, memory per watch).
        watcher.users.sort_unstable();
        watcher.users.dedup();
        watcher.users.shrink_to_fit();
        let mut unsubscribed = Vec::new();
        for user in users {
            let lingered = self.lingering.remove(&*user).is_some_and(|(_, s)| s);
            let watching = self
                .by_user
                .entry(user.clone())
                .and_modify(|w| w.insert(msg.session))
                .or_insert(Watching::one(msg.session, lingered));
            if !watching.subscribed() {
                unsubscribed.push(user.clone());
            }
            if msg.devices {
                self.devices_by_user
                    .entry(user.clone())
                    .and_modify(|w| w.insert(msg.session))
                    .or_insert(Watching::one(msg.session, false));
            }
        }
        let subs = self.subscriptions.clone();
        let channels: Vec<Channel> = unsubscribed.iter().cloned().map(Channel::Events).collect();
        let subscribe = async move {
            match subs {
                _ if channels.is_empty() => Ok(()),
                Some(subs) => subs.subscribe(channels).await.map_err(|e| e.to_string()),
                None => Err("the event subscriptions are not running".to_string()),
            }
        };
        Box::pin(subscribe.into_actor(self).map(move |res, act, _| {
            res.map(|()| {
                // Confirmed; a user unwatched meanwhile lingers as usual.
                let mut orphans = Vec::new();
                for user in unsubscribed {
                    if let Some(w) = act.by_user.get_mut(&*user) {
                        w.set_subscribed();
                    } else if let Some((_, s)) = act.lingering.get_mut(&*user) {
                        *s = true;
                    } else {
                        // Unwatched, and its lingering dropped, while the
                        // subscription was on its way: nobody else will
                        // take it back.
                        orphans.push(Channel::Events(user));
                    }
                }
                if let (Some(subs), false) = (&act.subscriptions, orphans.is_empty()) {
                    subs.unsubscribe(orphans);
                }
                held
            })
        }))
    }
}

impl Handler<Unwatch> for Registry {
    type Result = ();

    fn handle(&mut self, msg: Unwatch, _: &mut Self::Context) {
        for user in &msg.users {
            self.unwatch(msg.session, user);
        }
        if let Some(w) = self.watchers.get_mut(&msg.session) {
            let gone: HashSet<&str> = msg.users.iter().map(String::as_str).collect();
            w.users.retain(|u| !gone.contains(&**u));
            if w.users.capacity() > 2 * w.users.len() {
                w.users.shrink_to_fit();
            }
            if w.users.is_empty() {
                self.watchers.remove(&msg.session);
            }
        }
    }
}

impl Handler<Join> for Registry {
    type Result = ();

    fn handle(&mut self, msg: Join, _: &mut Self::Context) {
        if self.shutting_down {
            msg.addr.do_send(End::GoingAway);
        }
        let home = match self.homes.iter().position(|h| h.thread == msg.home.thread) {
            Some(i) => i,
            None => {
                self.homes.push(msg.home);
                self.homes.len() - 1
            }
        };
        self.sessions.insert(
            msg.session,
            Joined {
                end: msg.addr,
                conn: msg.conn,
                alive: msg.alive,
                home,
            },
        );
    }
}

impl Handler<SlowWatchers> for Registry {
    type Result = ();

    fn handle(&mut self, msg: SlowWatchers, _: &mut Self::Context) {
        for session in msg.sessions {
            // Still watching, or in a room: not cut off yet by an earlier
            // list.
            if self.watchers.contains_key(&session) || self.rooms.has_member(session) {
                self.cut_off(session);
            }
        }
    }
}

impl Handler<Shutdown> for Registry {
    type Result = usize;

    fn handle(&mut self, _: Shutdown, _: &mut Self::Context) -> usize {
        self.shutting_down = true;
        for s in self.sessions.values() {
            s.end.do_send(End::GoingAway);
        }
        self.sessions.len()
    }
}

impl Handler<Disconnect> for Registry {
    type Result = ();

    fn handle(&mut self, msg: Disconnect, _: &mut Self::Context) {
        self.sessions.remove(&msg.session);
        self.leave_rooms(msg.session);
        if let Some(w) = self.watchers.remove(&msg.session) {
            for user in &w.users {
                self.unwatch(msg.session, user);
            }
        }
        // Maps keep their largest size: give it back once they are mostly
        // empty, so that memory taken by a crowd that left is returned.
        shrink_if_sparse(&mut self.sessions, 64);
        shrink_if_sparse(&mut self.watchers, 64);
        shrink_if_sparse(&mut self.by_user, 64);
        shrink_if_sparse(&mut self.devices_by_user, 64);
    }
}

impl Registry {
    /// Takes `session` out of every local room (it ended, or was cut off):
    /// it gets no more room events, and channels nobody else here needs are
    /// unsubscribed.
    pub(super) fn leave_rooms(&mut self, session: SessionId) {
        let channels = self.rooms.disconnect(session);
        if let (Some(subs), false) = (&self.subscriptions, channels.is_empty()) {
            subs.unsubscribe(channels.into_iter().map(Channel::Named).collect());
        }
    }

    /// A payload on a user's events channel: a transition, or word that its
    /// contacts changed.
    fn published(&mut self, channel: &str, payload: &str) {
        if keys::parse_node_events(channel).is_some() {
            return self.node_notice(payload);
        }
        if let Some(room) = keys::parse_room_events(channel) {
            if let Some(event) = crate::rooms::RoomEvent::parse(room, payload) {
                // A hidden member's own events are nobody else's business,
                // on a public /metrics too.
                if event.to != crate::rooms::events::To::User {
                    crate::metrics::METRICS.rooms.events.inc();
                }
                self.rooms.deliver(std::sync::Arc::new(event));
            }
            return;
        }
        let wire: Wire = match serde_json::from_str(payload) {
            Ok(w) => w,
            Err(e) => {
                log::warn!("ignoring malformed presence event on {channel} ({e}): {payload}");
                return;
            }
        };
        let user = match &wire {
            Wire::ContactsChanged { user, .. } => user,
            Wire::Event(event) => &event.presence.user,
        };
        // The channel names its user; a payload about someone else is not
        // ours to trust.
        if keys::parse_events(channel) != Some(user.as_str()) {
            log::warn!("ignoring an event about {user} on {channel}");
            return;
        }
        match wire {
            Wire::ContactsChanged { user, .. } => self.recheck(&user),
            Wire::Event(event) => {
                // A change of the device count alone wakes only the
                // watchers who asked for it; except during a resync read,
                // which it overrides for every watcher (it carries the
                // whole record, and the others pass it on only if their
                // view differs).
                if event.devices_only && !self.reading {
                    if self
                        .devices_by_user
                        .contains_key(event.presence.user.as_str())
                    {
                        let mut deliver = Deliver::new(&event.presence, event.seq, false);
                        deliver.devices_only = true;
                        self.deliver(deliver);
                    }
                    return;
                }
                if !event.devices_only {
                    crate::metrics::transition_published(event.presence.status.as_str());
                }
                if !self.by_user.contains_key(event.presence.user.as_str()) {
                    return;
                }
                if self.reading {
                    self.touched.insert(event.presence.user.clone());
                }
                self.deliver(Deliver::new(&event.presence, event.seq, false));
            }
        }
    }
}

/// What travels on `presence-events:{<user>}`.
#[derive(serde::Deserialize)]
#[serde(untagged)]
enum Wire {
    /// A user's contacts were replaced.
    ContactsChanged {
        /// The user.
        user: String,
        /// Always true; tells this shape apart.
        #[allow(dead_code)]
        contacts_changed: bool,
    },
    /// A transition, as published by the scripts.
    Event(Event),
}

impl Handler<GetStats> for Registry {
    type Result = RegistryStats;

    fn handle(&mut self, _: GetStats, _: &mut Self::Context) -> RegistryStats {
        RegistryStats {
            sessions: self.sessions.len(),
            watching_sessions: self.watchers.len(),
            watched_users: self.by_user.len(),
            resynced: self.resynced,
            rooms: self.rooms.counts().0,
            room_memberships: self.rooms.counts().1,
        }
    }
}
