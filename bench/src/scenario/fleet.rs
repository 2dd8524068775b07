//! `fleet`: N nodes on a Redis Cluster of P primaries (or on one Redis).
//! Each user is watched from one node and connects on the next one, so
//! every transition crosses nodes. Then a further node holding devices is
//! SIGKILLed. Reports what the fleet pays per event:
//! - events each node received for every event its watchers needed (1.0:
//!   a node hears only about users its sessions watch);
//! - departure steps (Lua) per expired lease across the fleet (1.0: one
//!   node handles each lapsed lease);
//! - commands per primary, max / min (under 1.5: no hot shard);
//! - cross-node transition latency.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use serde_json::json;

use super::{connect_many, hold_many, watch_lists};
use crate::client::{self, spawn_watcher};
use crate::procs::{node_metric_sum, LocalCluster, LocalRedis, Node};
use crate::report::{latency_histogram, Report};
use crate::Common;

/// Flags of `fleet`.
#[derive(Args, Debug)]
pub struct FleetArgs {
    /// Server nodes (each watches a share of the users).
    #[arg(long, default_value_t = 3)]
    pub nodes: usize,
    /// Primaries of the Redis Cluster; 0 runs on one Redis server.
    #[arg(long, default_value_t = 3)]
    pub primaries: usize,
    /// Users who each arrive and leave once (two transitions each).
    #[arg(long, default_value_t = 1_000)]
    pub users: usize,
    /// Transitions per second.
    #[arg(long, default_value_t = 400)]
    pub rate: u64,
    /// How long each device stays connected, in ms.
    #[arg(long, default_value_t = 1_000)]
    pub hold_ms: u64,
    /// Devices on the extra node that is SIGKILLed.
    #[arg(long, default_value_t = 300)]
    pub dying: usize,
}

/// Heartbeat of the nodes unless --heartbeat-ms says otherwise: a 3 s TTL
/// keeps the expiry phase short.
const DEFAULT_HEARTBEAT_MS: u64 = 1_000;
/// Users per watcher session: the node's default max_watches.
const WATCH_PER_SESSION: usize = 1_000;
/// How long to wait for the last events of a phase.
const DRAIN: Duration = Duration::from_secs(30);

/// The Redis under test: what it takes to reach each primary.
enum Backend {
    One(LocalRedis),
    Cluster(LocalCluster),
}

impl Backend {
    fn start(primaries: usize) -> anyhow::Result<Self> {
        Ok(match primaries {
            0 => Self::One(LocalRedis::start()?),
            n => Self::Cluster(LocalCluster::start(n)?),
        })
    }

    /// What the nodes take as `--redis-url`.
    fn url(&self) -> String {
        match self {
            Self::One(r) => r.url.clone(),
            Self::Cluster(c) => c.seeds(),
        }
    }

    /// A URL per primary.
    fn primaries(&self) -> Vec<String> {
        match self {
            Self::One(r) => vec![r.url.clone()],
            Self::Cluster(c) => c.urls.clone(),
        }
    }

    fn describe(&self) -> String {
        match self {
            Self::One(_) => "one Redis server".into(),
            Self::Cluster(c) => format!("a Redis Cluster of {} primaries", c.urls.len()),
        }
    }
}

/// Commands each primary has run so far (`INFO commandstats`, all commands).
async fn commands_per_primary(primaries: &[String]) -> anyhow::Result<Vec<u64>> {
    let mut out = Vec::new();
    for url in primaries {
        let mut c = redis::Client::open(url.as_str())?
            .get_multiplexed_async_connection()
            .await?;
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut c)
            .await?;
        out.push(
            info.lines()
                .filter(|l| l.starts_with("cmdstat_"))
                .filter_map(|l| {
                    l.split(',')
                        .find_map(|kv| kv.split_once("calls=").map(|(_, n)| n))
                        .and_then(|n| n.parse::<u64>().ok())
                })
                .sum(),
        );
    }
    Ok(out)
}

/// Deadline entries of `prefix*` users still in any bucket of
/// `presence-leases`, asked of every primary (a bucket another primary
/// serves answers MOVED and is skipped).
async fn leases_left(primaries: &[String], prefix: &str) -> anyhow::Result<usize> {
    let mut left = HashSet::new();
    for url in primaries {
        let mut c = redis::Client::open(url.as_str())?
            .get_multiplexed_async_connection()
            .await?;
        for bucket in 0..crate::fixture::BUCKETS {
            let key = format!("presence-leases:{{b{bucket:02}}}");
            let members: redis::RedisResult<Vec<String>> = redis::cmd("ZRANGE")
                .arg(&key)
                .arg(0)
                .arg(-1)
                .query_async(&mut c)
                .await;
            left.extend(
                members
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|m| m.starts_with(prefix)),
            );
        }
    }
    Ok(left.len())
}

/// The sum of one metric over `nodes`.
async fn fleet_sum(nodes: &[SocketAddr], name: &str) -> anyhow::Result<f64> {
    let mut sum = 0.0;
    for &n in nodes {
        sum += node_metric_sum(n, name).await?;
    }
    Ok(sum)
}

/// Lapsed-lease departure steps (expired events and the deadline pass).
async fn lapsed_departures(nodes: &[SocketAddr]) -> anyhow::Result<f64> {
    Ok(
        fleet_sum(nodes, "presence_departure_steps_total{path=\"event\"}").await?
            + fleet_sum(nodes, "presence_departure_steps_total{path=\"pass\"}").await?,
    )
}

pub async fn run(common: &Common, args: &FleetArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        common.redis_url.is_none() && common.node_urls.is_empty(),
        "fleet starts its own Redis (or cluster) and nodes, and SIGKILLs one"
    );
    anyhow::ensure!(args.nodes >= 2, "fleet needs at least 2 nodes");
    let mut report = Report::new("fleet");
    let backend = Backend::start(args.primaries)?;
    let primaries = backend.primaries();
    let bin = crate::procs::server_bin(common.server_bin.as_deref())?;
    let hb = common.heartbeat_ms.unwrap_or(DEFAULT_HEARTBEAT_MS);
    let sources = Arc::new(crate::client::Sources::new(common.sources));
    // Declared after the backend: dropped (killed) before it.
    let mut nodes = Vec::new();
    for i in 0..=args.nodes {
        let id = format!("fleet-{i}");
        nodes.push(Node::spawn(&bin, &backend.url(), &id, Some(hb), &[])?);
    }
    let mut victim = nodes.pop().expect("nodes + 1 spawned");
    let addrs: Vec<SocketAddr> = nodes.iter().map(|n| n.addr).collect();
    let n = args.nodes;
    eprintln!(
        "fleet: {n} nodes (+1 to kill) on {}, heartbeat {hb} ms",
        backend.describe()
    );
    let commands0 = commands_per_primary(&primaries).await?;

    // Phase 1: user i is watched on node i % n and connects on node i+1.
    let users: Vec<String> = (0..args.users).map(|i| format!("f{i}")).collect();
    let base = Instant::now();
    let starts: Arc<Vec<[AtomicU64; 2]>> = Arc::new(
        (0..users.len())
            .map(|_| [AtomicU64::new(0), AtomicU64::new(0)])
            .collect(),
    );
    let latency = Arc::new(Mutex::new(latency_histogram()));
    let seen_events = Arc::new(AtomicU64::new(0));
    // Dying devices' offline events: user -> receipt.
    let offline: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let dying: Vec<String> = (0..args.dying).map(|i| format!("fd{i}")).collect();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut relevant = vec![0u64; n];
    for (j, &addr) in addrs.iter().enumerate() {
        let mine: Vec<String> = users.iter().skip(j).step_by(n).cloned().collect();
        let doomed: Vec<String> = dying.iter().skip(j).step_by(n).cloned().collect();
        relevant[j] = 2 * mine.len() as u64;
        let lists: Vec<Vec<String>> = watch_lists(&mine, WATCH_PER_SESSION)
            .into_iter()
            .chain(watch_lists(&doomed, WATCH_PER_SESSION))
            .collect();
        let names = (0..lists.len()).map(|k| format!("fw{j}-{k}")).collect();
        let (watchers, _) = connect_many(addr, &sources, names, 20).await?;
        for (mut ws, list) in watchers.into_iter().zip(lists) {
            client::watch(&mut ws, &list).await?;
            let (starts, latency, seen, offline) = (
                starts.clone(),
                latency.clone(),
                seen_events.clone(),
                offline.clone(),
            );
            spawn_watcher(ws, stop_rx.clone(), move |(user, status, at)| {
                if user.starts_with("fd") {
                    if status == "offline" {
                        offline.lock().unwrap().entry(user).or_insert(at);
                    }
                    return;
                }
                let slot = usize::from(status != "online");
                let idx: Option<usize> = user.strip_prefix('f').and_then(|n| n.parse().ok());
                let Some(start) = idx.and_then(|i| starts.get(i)) else {
                    return;
                };
                let start = start[slot].load(Ordering::Acquire);
                if start > 0 {
                    let at_us = at.duration_since(base).as_micros() as u64;
                    latency
                        .lock()
                        .unwrap()
                        .saturating_record(at_us.saturating_sub(start).max(1));
                    seen.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
    }
    let mut received0 = Vec::new();
    for &a in &addrs {
        received0.push(node_metric_sum(a, "presence_transitions_published_total").await?);
    }
    eprintln!(
        "fleet: {} users arrive and leave at {} transitions/s",
        users.len(),
        args.rate
    );
    let arrivals_per_s = (args.rate as f64 / 2.0).max(0.5);
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / arrivals_per_s));
    let hold = Duration::from_millis(args.hold_ms);
    let mut devices = Vec::new();
    for (i, user) in users.iter().enumerate() {
        tick.tick().await;
        let node = addrs[(i + 1) % n];
        let (starts, src, user) = (starts.clone(), sources.next(), user.clone());
        devices.push(tokio::spawn(async move {
            super::arrive_and_leave(node, src, &user, hold, |slot| {
                let at = base.elapsed().as_micros().max(1) as u64;
                starts[i][slot].store(at, Ordering::Release);
            })
            .await
        }));
    }
    for d in devices {
        d.await??;
    }
    let expected = 2 * users.len() as u64;
    let until = Instant::now() + DRAIN;
    while seen_events.load(Ordering::Relaxed) < expected && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut ratios = Vec::new();
    for (j, &a) in addrs.iter().enumerate() {
        let got = node_metric_sum(a, "presence_transitions_published_total").await? - received0[j];
        ratios.push(got / relevant[j].max(1) as f64);
    }
    let worst = ratios.iter().cloned().fold(0.0, f64::max);
    report.figure(
        "events_received_per_relevant_event",
        worst,
        "ratio",
        json!({"per_node": ratios, "nodes": n, "goal": 1.0,
               "note": "events a node received / events its watchers needed; worst node"}),
    );
    report.latency(
        "cross_node_transition",
        &latency.lock().unwrap(),
        json!({"events_expected": expected,
               "events_received": seen_events.load(Ordering::Relaxed)}),
    );

    // Phase 2: the extra node dies with its devices.
    // Answering pings until the kill, as live devices do.
    let victim_devices = hold_many(victim.addr, &sources, dying.clone(), 50).await?;
    let departures0 = lapsed_departures(&addrs).await?;
    let heard0 = fleet_sum(&addrs, "presence_expired_events_total").await?;
    eprintln!("fleet: SIGKILL a node with {} devices", dying.len());
    let killed = Instant::now();
    victim.kill()?;
    drop(victim_devices);
    let ttl = Duration::from_millis(3 * hb);
    let until = killed + ttl + DRAIN;
    while offline.lock().unwrap().len() < dying.len() && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Once their deadline entries are gone, nothing departs them again.
    while leases_left(&primaries, "fd").await? > 0 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let steps = lapsed_departures(&addrs).await? - departures0;
    let heard = fleet_sum(&addrs, "presence_expired_events_total").await? - heard0;
    let mut from_kill = latency_histogram();
    for at in offline.lock().unwrap().values() {
        from_kill.saturating_record(at.duration_since(killed).as_micros() as u64);
    }
    let lapsed = dying.len().max(1) as f64;
    report.figure(
        "departure_steps_per_expired_lease",
        steps / lapsed,
        "ratio",
        json!({"leases": dying.len(), "steps": steps, "expired_events_handled": heard,
               "goal": 1.0}),
    );
    report.latency(
        "kill_to_offline",
        &from_kill,
        json!({"ttl_ms": ttl.as_millis() as u64, "devices": dying.len()}),
    );

    let commands1 = commands_per_primary(&primaries).await?;
    let per: Vec<u64> = commands1
        .iter()
        .zip(&commands0)
        .map(|(b, a)| b.saturating_sub(*a))
        .collect();
    let (max, min) = (
        per.iter().copied().max().unwrap_or(0),
        per.iter().copied().min().unwrap_or(0),
    );
    report.figure(
        "commands_per_primary_max_over_min",
        max as f64 / min.max(1) as f64,
        "ratio",
        json!({"per_primary": per, "goal": "< 1.5"}),
    );
    let _ = stop_tx.send(true);
    report.print_table();
    let got = seen_events.load(Ordering::Relaxed);
    let dead = offline.lock().unwrap().len();
    anyhow::ensure!(
        got == expected && dead == dying.len(),
        "{got} of {expected} transitions and {dead} of {} offline events seen",
        dying.len()
    );
    Ok(())
}
