//! Reading users: the truth about one or many (`read.lua`, one atomic read
//! per user), what a viewer may see of them, and a user's device detail.

use super::scripts::parse_read;
use super::step_types::Observed;
use super::{LeaseOwner, Store, StoreError, StoreResult};
use crate::keys;
use crate::model::Record;
use crate::privacy::{view, Relation};

/// Who reads records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reader<'a> {
    /// A user (`None`: anonymous), who sees what privacy lets it.
    Viewer(Option<&'a str>),
    /// The app's backend (admin or service key), which sees the truth:
    /// `invisible`, exact devices, text and last seen.
    Service,
}

/// One live device of a user, as shown by `GET /api/presence/{user}`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct DeviceInfo {
    /// Device id.
    pub device: String,
    /// Node holding the connection.
    pub node: Option<String>,
    /// When the connection was made, epoch ms.
    pub connected_at: Option<i64>,
    /// Remaining lease TTL in ms.
    pub expires_in_ms: Option<i64>,
    /// The device's kind: web, desktop, mobile, tablet, bot or other.
    #[schema(example = "mobile")]
    pub kind: String,
    /// The device is paused (`{"type":"pause"}`): present until its lease
    /// (`expires_in_ms`, the grace) ends, unless it comes back. Absent
    /// otherwise.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
}

/// What `reader` may see of one user read for it: a viewer's view, or for
/// the service the truth (the user as it sees itself).
pub(super) fn view_as(o: &Observed, reader: Reader<'_>, contacts_only: bool) -> Record {
    let relation = match reader {
        Reader::Viewer(v) => o.relation(v, contacts_only),
        Reader::Service => Relation::Owner,
    };
    view(&o.presence, relation)
}

impl Store {
    /// The true presence of `users`, in order, each with its transition
    /// sequence number (for dropping events a snapshot already reflects)
    /// and whether `viewer` is one of the user's contacts. Each user is read
    /// atomically, so state and sequence number belong together.
    pub async fn presences(
        &self,
        users: &[String],
        viewer: Option<&str>,
    ) -> StoreResult<Vec<Observed>> {
        if users.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for user in users {
            self.scripts.read(&mut pipe, user, viewer);
        }
        let reply = self.query(&pipe).await?;
        if reply.len() != users.len() {
            return Err(StoreError::reply(
                "read",
                format!("{} replies to {} reads", reply.len(), users.len()),
            ));
        }
        users
            .iter()
            .zip(&reply)
            .map(|(user, value)| parse_read(value, user))
            .collect()
    }

    /// What `viewer` may see of `users`, in order (see [`crate::privacy`]).
    pub async fn records(
        &self,
        users: &[String],
        viewer: Option<&str>,
        contacts_only: bool,
    ) -> StoreResult<Vec<Record>> {
        self.records_as(users, Reader::Viewer(viewer), contacts_only)
            .await
    }

    /// What `reader` may see of `users`, in order: a viewer's view, or for
    /// the service the truth (each user as it sees itself).
    pub async fn records_as(
        &self,
        users: &[String],
        reader: Reader<'_>,
        contacts_only: bool,
    ) -> StoreResult<Vec<Record>> {
        let viewer = match reader {
            Reader::Viewer(v) => v,
            Reader::Service => None,
        };
        Ok(self
            .presences(users, viewer)
            .await?
            .iter()
            .map(|o| view_as(o, reader, contacts_only))
            .collect())
    }

    /// The members of a set, sorted.
    pub(super) async fn sorted_members(&self, key: &str) -> StoreResult<Vec<String>> {
        let mut conn = self.conn();
        let mut out: Vec<String> = redis::cmd("SMEMBERS")
            .arg(key)
            .query_async(&mut conn)
            .await?;
        out.sort();
        Ok(out)
    }

    /// The devices counted in `user`'s hash, sorted by id, each with the
    /// run number of the node holding it (0: not known), its kind and
    /// whether it is paused.
    async fn device_fields(&self, user: &str) -> StoreResult<Vec<(String, u64, String, bool)>> {
        let mut conn = self.conn();
        let fields: Vec<(String, String)> = redis::cmd("HGETALL")
            .arg(keys::status(user))
            .query_async(&mut conn)
            .await?;
        let key = keys::status(user);
        let kinds: std::collections::HashMap<&str, &str> = fields
            .iter()
            .filter_map(|(f, v)| Some((f.strip_prefix("k:")?, v.as_str())))
            .collect();
        let paused: std::collections::HashSet<&str> = fields
            .iter()
            .filter_map(|(f, _)| f.strip_prefix("i:"))
            .collect();
        let mut out = Vec::with_capacity(fields.len());
        for (field, value) in &fields {
            let Some(device) = keys::parse_device_field(field) else {
                continue;
            };
            // Every step writes a run number here (0: not known); anything
            // else is not ours, and is said rather than read as 0.
            let run = value.parse().map_err(|_| {
                StoreError::reply(&key, format!("{field} is {value:?}, not a run number"))
            })?;
            let kind = kinds.get(device).copied().unwrap_or("other").to_string();
            out.push((device.to_string(), run, kind, paused.contains(device)));
        }
        out.sort();
        Ok(out)
    }

    /// The live devices of `user`, sorted by device id.
    pub async fn devices(&self, user: &str) -> StoreResult<Vec<DeviceInfo>> {
        let fields = self.device_fields(user).await?;
        if fields.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for (device, ..) in &fields {
            pipe.get(keys::lease(user, device));
            pipe.pttl(keys::lease(user, device));
        }
        let reply = self.query(&pipe).await?;
        if reply.len() != 2 * fields.len() {
            return Err(StoreError::reply(
                &keys::status(user),
                format!("{} replies for {} devices", reply.len(), fields.len()),
            ));
        }
        let mut out = Vec::with_capacity(fields.len());
        // Runs whose node is asked for, each with the devices it holds.
        let mut runs: std::collections::BTreeMap<u64, Vec<usize>> = Default::default();
        for ((device, run, kind, paused), chunk) in fields.into_iter().zip(reply.chunks(2)) {
            let owner: Option<String> = redis::from_redis_value_ref(&chunk[0])?;
            let pttl: i64 = redis::from_redis_value_ref(&chunk[1])?;
            let Some(owner) = owner else {
                // Counted but lapsed a moment ago: on its way out.
                continue;
            };
            let lease = LeaseOwner::parse(&owner);
            if lease.node.is_none() && run != 0 {
                runs.entry(run).or_default().push(out.len());
            }
            out.push(DeviceInfo {
                device,
                node: lease.node.map(str::to_string),
                connected_at: lease.connected_at,
                expires_in_ms: (pttl >= 0).then_some(pttl),
                kind,
                paused,
            });
        }
        if !runs.is_empty() {
            // Each run's record is a key of its own (its own slot in a cluster).
            let mut pipe = redis::pipe();
            for run in runs.keys() {
                pipe.get(keys::run(*run));
            }
            let nodes = self.query(&pipe).await?;
            for (devices, node) in runs.values().zip(&nodes) {
                let node: Option<String> = redis::from_redis_value_ref(node)?;
                for &i in devices {
                    out[i].node.clone_from(&node);
                }
            }
        }
        Ok(out)
    }
}
