//! Chaos for the event feed (issue 39): three nodes send their webhooks
//! from the feed to one receiver that answers 500 to 30% of the POSTs at
//! random and is down (connections closed without an answer) for a while
//! in the middle of the first half. Users connect, close, drop and come
//! back elsewhere, change status and text (invisible too) and join and
//! leave rooms; some users stay invisible all along (the ghosts); watchers
//! watch them all and the members of each room see one another come and
//! go; a node is SIGKILLed every few seconds and started again a second
//! later. Halfway, the churn pauses until the fleet is quiet (every device
//! and membership as the test holds them, every feed moved into the log,
//! the receiver caught up), the feed is read, and Redis fails: one Redis
//! restarts empty (its loss is documented: the test reads the feed before,
//! and closes the watchers across it, whose views Redis lost), or on a
//! Redis Cluster a primary is SIGKILLed once its replica has every write
//! (an unreplicated write is a documented loss) and its replica takes over
//! while the churn goes on.
//!
//! At the end, quiet again, the checks are exact:
//! - the receiver's events, deduplicated by `id`, are the recorded feed
//!   (every read of `GET /api/events` over the run), payload for payload,
//!   and each user's and room's first deliveries come in `seq` order;
//! - every `presence` frame a watcher got is, in order, the view of one of
//!   the user's events in the feed (frames carry no `seq`: the view is the
//!   status, text, last seen, until and kinds the event shows a watcher),
//!   and no two in a row alike;
//! - every `room_join` (first device) and `room_leave` (last device) a
//!   member got is, in order, a `room_joined` or `room_left` of the feed;
//! - an invisible user's comings and goings show nowhere: the ghosts'
//!   events in the feed say `invisible` or `offline`, no watcher got a
//!   frame about a ghost and no member a room event, and the feed has no
//!   room event of theirs.
//!
//! A short run of each is part of `cargo test`; a long one, with the
//! receiver down for a minute:
//! `FEED_CHAOS_SECS=180 FEED_CHAOS_DOWN_SECS=60 cargo test --release --test it feed_chaos:: -- --nocapture`

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::common::cluster::Cluster;
use crate::common::*;
use crate::webhooks::receiver::{Receiver, SECRET};

mod check;
mod world;

use check::Recorded;
use world::World;

const NODES: usize = 3;
/// Users who change status (invisible too), two devices each.
const USERS: usize = 10;
/// Users invisible all along, two devices each.
const GHOSTS: usize = 3;
const DEVICES_PER_USER: usize = 2;
/// Watchers, each watching every user and ghost.
const WATCHERS: usize = 3;
/// Rooms on one Redis; on a cluster, one on each shard.
const ROOMS: usize = 3;
/// Percent of the POSTs the receiver answers 500, at random.
const FAIL_PERCENT: u32 = 30;
/// How often a node is SIGKILLed during the churn (started again a second
/// later).
const KILL_EVERY: Duration = Duration::from_secs(4);
/// How long the fleet may take to be quiet: a sender whose POSTs failed
/// while the receiver was down waits up to 30 s before it tries again.
const QUIET_WITHIN: Duration = Duration::from_secs(75);

/// The Redis the nodes share.
pub(super) enum Backend {
    One(Redis),
    /// The cluster and its SIGKILLed primaries.
    Cluster(Cluster, Vec<u16>),
}

impl Backend {
    /// A node `id` sending its webhooks (from the feed, on by default) to
    /// `url`, with short leases so that a SIGKILLed node's devices lapse
    /// fast; the test's service reads (the feed, again and again while it
    /// waits) are not counted against a budget.
    fn node(&self, id: &str, url: &str) -> Node {
        let flags = [
            "--admin-key",
            ADMIN,
            "--webhook-url",
            url,
            "--webhook-secret",
            SECRET,
            "--webhook-batch-ms",
            "50",
            "--heartbeat-ms",
            "500",
            "--ttl-ms",
            "1500",
            "--max-frames-per-sec",
            "1000",
            "--max-room-messages-per-sec",
            "1000",
            "--service-reads-per-sec",
            "10000000",
        ];
        match self {
            Self::One(redis) => Node::start_with(redis, id, &flags),
            Self::Cluster(cluster, _) => cluster.node_with(id, &flags),
        }
    }

    /// The rooms: on a cluster, one on each shard.
    fn rooms(&self) -> Vec<String> {
        match self {
            Self::One(_) => (0..ROOMS).map(|r| format!("room{r}")).collect(),
            Self::Cluster(cluster, _) => cluster
                .shards()
                .iter()
                .enumerate()
                .map(|(i, shard)| {
                    (0..)
                        .map(|r| format!("room{i}:{r}"))
                        .find(|r| shard.serves(cluster.slot(&format!("r:{r}"))))
                        .unwrap()
                })
                .collect(),
        }
    }

    /// Events recorded in the users' and rooms' feeds and not yet moved
    /// into the log; `None` when a server did not answer.
    fn feeds_held(&self) -> Option<usize> {
        let ports = match self {
            Self::One(redis) => vec![redis.port],
            Self::Cluster(cluster, dead) => cluster
                .shards_without(dead)
                .iter()
                .map(|s| s.primary)
                .collect(),
        };
        let mut held = 0;
        for port in ports {
            let mut c = conn_at(port).ok()?;
            let feeds: Vec<String> = redis::cmd("KEYS")
                .arg("presence-feed:{*")
                .query(&mut c)
                .ok()?;
            for feed in feeds {
                let n: usize = redis::cmd("LLEN").arg(&feed).query(&mut c).ok()?;
                held += n;
            }
        }
        Some(held)
    }

    /// The Redis fault of the run: one Redis restarts empty; on a
    /// cluster, the first shard's primary is SIGKILLed once its replica
    /// has every write it took, and the replica takes over.
    async fn fault(&mut self) -> &'static str {
        match self {
            Self::One(redis) => {
                redis.restart_empty();
                "redis restart (empty)"
            }
            Self::Cluster(cluster, dead) => {
                let shard = cluster.shards().remove(0);
                let offset = repl_offset(shard.primary, "master_repl_offset");
                for &replica in &shard.replicas {
                    wait_until("the replica has every write", DEADLINE, || async {
                        repl_offset(replica, "slave_repl_offset") >= offset
                    })
                    .await;
                }
                cluster.kill(shard.primary);
                dead.push(shard.primary);
                "primary SIGKILL (replica promoted)"
            }
        }
    }

    /// Waits until the cluster's failover is over.
    fn settle(&self) {
        if let Self::Cluster(cluster, dead) = self {
            tokio::task::block_in_place(|| cluster.wait_healthy(dead));
        }
    }
}

/// `field` of `INFO replication` on the server on `port` (0 when it does
/// not answer).
fn repl_offset(port: u16, field: &str) -> u64 {
    let Ok(mut c) = conn_at(port) else {
        return 0;
    };
    let info: String = redis::cmd("INFO")
        .arg("replication")
        .query(&mut c)
        .unwrap_or_default();
    info.lines()
        .find_map(|l| {
            l.strip_prefix(field)?
                .strip_prefix(':')?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_feed_and_its_webhooks_survive_chaos() {
    run(Backend::One(Redis::start())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_feed_and_its_webhooks_survive_chaos_on_a_cluster() {
    run(Backend::Cluster(Cluster::start(), Vec::new())).await;
}

async fn run(backend: Backend) {
    raise_fd_limit();
    let secs = env_u64("FEED_CHAOS_SECS", 12);
    let down = Duration::from_secs(env_u64("FEED_CHAOS_DOWN_SECS", 4));
    let seed = env_u64("CHAOS_SEED", 39);
    let one_redis = matches!(backend, Backend::One(_));
    let started = std::time::Instant::now();
    let receiver = Receiver::start(0).await;
    receiver.fail_percent.store(FAIL_PERCENT, Ordering::SeqCst);
    let mut world = World::start(backend, receiver, seed).await;
    let mut recorded = Recorded::default();
    // The first half, the receiver down in its middle.
    let first = Duration::from_secs(secs / 2).max(down + Duration::from_secs(4));
    world.churn(first, Some(((first - down) / 2, down))).await;
    if one_redis {
        // What they were shown, Redis will have lost.
        world.close_watchers().await;
    }
    world.quiesce(&mut recorded, "before the Redis fault").await;
    let fault = world.backend.fault().await;
    world.count(fault);
    if one_redis {
        world
            .quiesce(&mut recorded, "after Redis restarted empty")
            .await;
        world.ghosts_invisible().await;
        world.open_watchers().await;
    }
    let second = Duration::from_secs(secs - secs / 2).max(Duration::from_secs(4));
    world.churn(second, None).await;
    world.backend.settle();
    world.quiesce(&mut recorded, "at the end").await;
    let tally = check::all(&world, &recorded);
    eprintln!(
        "feed chaos ({}), {secs} s, receiver down {down:?}, done in {:.0?}:\n  {tally}\n  kills: {}; ops: {:?}",
        if one_redis { "one Redis" } else { "cluster" },
        started.elapsed(),
        world.kills,
        world.ops
    );
}
