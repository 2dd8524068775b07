//! The expired-key events of every primary, each held by one node of the
//! fleet at a time.
//!
//! Keyspace notifications are local to each primary. The node finds the
//! primaries with `CLUSTER SHARDS` every [`OWNER_REFRESH`] (so it follows
//! failovers and resharding) and, for each, competes for a short lock
//! `presence-expiry-owner:{<primary id>}`: the holder subscribes to that
//! primary's `expired` events, the other nodes stand by and take over
//! within [`OWNER_HOLD`] when it dies. One Redis server is one primary
//! (`presence-expiry-owner:{primary}`). So each lapsed lease is departed
//! once by its event; the deadline pass covers what falls between owners.

use std::collections::HashMap;
use std::time::Duration;

use crate::keys;
use crate::redis::{RedisSource, Source};
use crate::store::Store;

/// How often the node re-reads the primaries and renews its expiry locks.
const OWNER_REFRESH: Duration = Duration::from_secs(1);
/// How long an expiry lock lasts unless renewed: a dead owner's primaries
/// are taken over within this.
const OWNER_HOLD: Duration = Duration::from_secs(3);

/// One primary whose `expired` events some node of the fleet must hear.
struct Stream {
    /// Names its ownership lock: the cluster node id, or [`SINGLE`].
    id: String,
    /// Where it is, as shown in logs; a new address ends the old stream.
    addr: String,
    /// Its keyevent channel.
    channel: String,
    /// Connects to it.
    source: RedisSource,
}

/// The lock name of one Redis server's (or Sentinel group's) events.
const SINGLE: &str = "primary";

/// The primaries of `source` now: one server, or every primary of the
/// cluster (`CLUSTER SHARDS`).
async fn streams(source: &Source, store: &Store) -> redis::RedisResult<Vec<Stream>> {
    match source {
        Source::Single(client) => Ok(vec![Stream {
            id: SINGLE.to_string(),
            addr: client.display().to_string(),
            channel: keys::expired_channel(client.db()),
            source: client.clone(),
        }]),
        Source::Cluster(seeds) => {
            let shards = store.redis().shards().await?;
            seeds.learn(&shards);
            Ok(shards
                .into_iter()
                .filter_map(|shard| match seeds.client_for(&shard.primary) {
                    Ok(client) => Some(Stream {
                        id: shard.primary_id,
                        addr: shard.primary.to_string(),
                        channel: keys::expired_channel(0),
                        source: RedisSource::direct(client),
                    }),
                    Err(e) => {
                        log::warn!("{}: {e}", shard.primary);
                        None
                    }
                })
                .collect())
        }
    }
}

/// Holds the expired-key events of the primaries this node owns (see the
/// module docs) while `alive` holds; one Redis server counts as one
/// primary. Each announced key goes to `on_key`; `ready` runs once the
/// first round of ownership is settled.
pub async fn expiry_streams(
    store: Store,
    source: Source,
    node_id: String,
    ready: impl FnOnce(),
    alive: impl Fn() -> bool,
    on_key: impl Fn(String) -> bool + Clone + Send + 'static,
) {
    let mut owned: HashMap<String, (String, tokio::task::JoinHandle<()>)> = HashMap::new();
    let mut ready = Some(ready);
    while alive() {
        match streams(&source, &store).await {
            Ok(streams) => {
                // A primary that is no longer one (failover, resharding):
                // its stream is over.
                owned.retain(|id, (addr, task)| {
                    let current = streams.iter().any(|s| &s.id == id && &s.addr == addr);
                    if !current {
                        log::info!("expired events of {addr}: no longer a primary");
                        task.abort();
                    }
                    current
                });
                for stream in streams {
                    let lock = keys::expiry_owner(&stream.id);
                    match store.hold_lock(&lock, &node_id, OWNER_HOLD).await {
                        Ok(true) if !owned.contains_key(&stream.id) => {
                            log::info!("owning the expired events of {}", stream.addr);
                            let task = tokio::spawn(crate::redis::pubsub::run(
                                stream.source,
                                stream.channel,
                                || {},
                                on_key.clone(),
                            ));
                            owned.insert(stream.id, (stream.addr, task));
                        }
                        Ok(true) => {}
                        Ok(false) => {
                            if let Some((addr, task)) = owned.remove(&stream.id) {
                                log::info!("another node owns the expired events of {addr}");
                                task.abort();
                            }
                        }
                        // Keep what is held: two owners for a moment only
                        // cost a second, idempotent departure step.
                        Err(e) => log::warn!("expiry lock of {}: {e}", stream.addr),
                    }
                }
            }
            Err(e) => log::warn!("cannot read the primaries: {e}"),
        }
        if let Some(ready) = ready.take() {
            ready();
        }
        tokio::time::sleep(OWNER_REFRESH).await;
    }
    for (_, (_, task)) in owned {
        task.abort();
    }
}
