//! `storm` (issue 29): a fleet on one box and its reconnect storm. N nodes
//! on a Redis Cluster (3 primaries with a replica each by default) hold
//! one device per user, each watching a few other users; the devices are
//! spread over worker processes (each within the open-file limit, see
//! [`worker`]). After the hold, one node is SIGKILLed: its devices come
//! back on the other nodes with full-jitter backoff, while a few probe
//! users on surviving nodes change status and their watchers time the
//! events. Reports memory per device on the nodes and in Redis, how long
//! until the last device is back, offline events for devices that came
//! back within the TTL, the watchers' latency meanwhile and Redis's peak
//! commands per second.

mod backend;
pub mod worker;
mod workers;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use serde_json::{json, Value};

use crate::procs::{rss_bytes, Node};
use crate::report::{latency_histogram, Report};
use crate::Common;
use backend::Backend;
use worker::{now_us, Spec};
use workers::{Totals, Workers};

/// Flags of `storm`.
#[derive(Args, Debug)]
pub struct StormArgs {
    /// Devices, one user each, spread evenly over the nodes.
    #[arg(long, default_value_t = 100_000)]
    pub devices: usize,
    /// Server nodes; the last one is SIGKILLed.
    #[arg(long, default_value_t = 6)]
    pub nodes: usize,
    /// Other users each device watches.
    #[arg(long, default_value_t = 20)]
    pub watches: usize,
    /// How long to hold every device before the kill, in seconds.
    #[arg(long, default_value_t = 60)]
    pub hold_secs: u64,
    /// Primaries of the Redis Cluster; 0 runs on one Redis server.
    #[arg(long, default_value_t = 3)]
    pub primaries: usize,
    /// Replicas per primary.
    #[arg(long, default_value_t = 1)]
    pub replicas: usize,
    /// Most devices one worker process holds (the open-file limit is per
    /// process).
    #[arg(long, default_value_t = 15_000)]
    pub per_worker: usize,
    /// Users on surviving nodes that change status every 500 ms during the
    /// storm, timed by their watchers.
    #[arg(long, default_value_t = 10)]
    pub probes: usize,
    /// Handshakes at a time per worker while connecting.
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
    /// Run the workers as tasks of this process (as it does anyway when
    /// one worker holds every device).
    #[arg(long)]
    pub in_process: bool,
}

/// The hidden `storm-worker` subcommand: one worker subprocess.
#[derive(Args, Debug)]
pub struct WorkerArgs {
    /// The worker's [`Spec`] as JSON.
    #[arg(long)]
    pub spec: String,
}

/// Runs one worker on stdin and stdout.
pub async fn run_worker(args: &WorkerArgs) -> anyhow::Result<()> {
    let spec = Spec::from_json(&serde_json::from_str(&args.spec)?)?;
    crate::procs::ensure_fds(spec.count)?;
    worker::serve(spec, tokio::io::stdin(), tokio::io::stdout()).await
}

/// The default heartbeat of the server (its TTL is three of them).
const SERVER_HEARTBEAT_MS: u64 = 15_000;
/// How long after the TTL to wait for devices that are not back.
const GIVE_UP_AFTER_TTL: Duration = Duration::from_secs(60);

/// A step between a device and the users it watches that is coprime with
/// the node count (so a user's watchers are spread over the nodes) and
/// keeps the watches distinct.
fn watch_step(devices: usize, watches: usize, nodes: usize) -> usize {
    let mut step = (devices / (watches + 1)).max(1);
    while step > 1 && gcd(step, nodes) != 1 {
        step -= 1;
    }
    step
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// The worker specs: contiguous ranges of at most `per_worker` devices.
fn specs(args: &StormArgs, common: &Common, nodes: &[Node], victim: usize) -> Vec<Spec> {
    let n = nodes.len();
    let spread = (args.devices / args.probes.max(1)).max(1);
    let probes: Vec<usize> = (0..args.devices)
        .step_by(spread)
        .map(|i| {
            if i % n == victim {
                (i + 1) % args.devices
            } else {
                i
            }
        })
        .take(args.probes)
        .collect();
    let per = args.per_worker.max(1);
    (0..args.devices)
        .step_by(per)
        .map(|first| Spec {
            nodes: nodes.iter().map(|n| n.addr).collect(),
            first,
            count: per.min(args.devices - first),
            devices: args.devices,
            watches: args.watches,
            step: watch_step(args.devices, args.watches, n),
            victim,
            probes: probes.clone(),
            sources: common.sources,
            concurrency: args.concurrency,
        })
        .collect()
}

/// Waits until `done` holds for the workers' totals, printing progress;
/// the last totals and whether it held before `limit`.
async fn wait_for(
    workers: &Workers,
    what: &str,
    limit: Duration,
    done: impl Fn(&Totals) -> bool,
) -> (Totals, bool) {
    let start = Instant::now();
    let mut said = Instant::now();
    loop {
        let t = workers.totals();
        if done(&t) {
            return (t, true);
        }
        if start.elapsed() > limit {
            return (t, false);
        }
        if said.elapsed() > Duration::from_secs(5) {
            eprintln!(
                "storm: {what}: {} held, {} watches, {} dropped, {} back, {} failed attempts",
                t.held, t.watches, t.dropped, t.back, t.errors
            );
            said = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub async fn run(common: &Common, args: &StormArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        common.redis_url.is_none() && common.node_urls.is_empty(),
        "storm starts its own Redis (or cluster) and nodes, and SIGKILLs one"
    );
    anyhow::ensure!(args.nodes >= 2, "storm needs at least 2 nodes");
    anyhow::ensure!(
        args.watches < args.devices && args.devices >= args.nodes,
        "storm needs more devices than watches per device, and than nodes"
    );
    let mut report = Report::new("storm");
    let backend = Backend::start(args.primaries, args.replicas)?;
    let mut redis = backend::connect_all(&backend.primaries()).await?;
    let redis_before = backend::used_memory(&mut redis).await?;
    let bin = crate::procs::server_bin(common.server_bin.as_deref())?;
    let hb = common.heartbeat_ms.unwrap_or(SERVER_HEARTBEAT_MS);
    let mut nodes = Vec::new();
    for i in 0..args.nodes {
        let id = format!("storm-{i}");
        nodes.push(Node::spawn_shedding(
            &bin,
            &backend.url(),
            &id,
            common.heartbeat_ms,
            &[],
            true,
        )?);
    }
    let victim = args.nodes - 1;
    let after = args.devices.div_ceil(args.nodes - 1);
    if after as u64 + 256 > crate::procs::fd_limit() {
        eprintln!(
            "storm: warning: after the kill each node must hold {after} devices, past the \
             open-file limit of {}",
            crate::procs::fd_limit()
        );
    }
    let specs = specs(args, common, &nodes, victim);
    let in_process = args.in_process || specs.len() == 1;
    eprintln!(
        "storm: {} devices x {} watches on {} nodes, {}, {} workers{}, heartbeat {hb} ms",
        args.devices,
        args.watches,
        args.nodes,
        backend.describe(),
        specs.len(),
        if in_process { " in this process" } else { "" }
    );
    let rss0: u64 = nodes.iter().filter_map(|n| rss_bytes(n.pid()?)).sum();
    let workers = Workers::start(specs, in_process)?;
    let storming = Arc::new(AtomicBool::new(false));
    let sampling = Arc::new(AtomicBool::new(false));
    let peaks = Arc::new(Mutex::new(backend::Peaks::default()));
    let sampler = backend::sample_ops(
        backend::connect_all(&backend.primaries()).await?,
        storming.clone(),
        sampling.clone(),
        peaks.clone(),
    );

    connect_and_hold(
        &mut report,
        &workers,
        &nodes,
        &mut redis,
        (redis_before, rss0),
        args,
    )
    .await?;
    let ttl = Duration::from_millis(3 * hb);
    storm_phase(
        report,
        workers,
        &mut nodes[victim],
        victim,
        ttl,
        args,
        (storming, sampling, sampler, peaks),
    )
    .await
}

/// Connects and watches every device, reports what they hold and cost,
/// then holds them `hold_secs`.
async fn connect_and_hold(
    report: &mut Report,
    workers: &Workers,
    nodes: &[Node],
    redis: &mut [redis::aio::MultiplexedConnection],
    (redis_before, rss0): (u64, u64),
    args: &StormArgs,
) -> anyhow::Result<()> {
    // Connect and watch.
    let t0 = Instant::now();
    let (devices, watches) = (args.devices as u64, (args.devices * args.watches) as u64);
    let limit = Duration::from_secs(120 + args.devices as u64 / 100);
    let (t, ok) = wait_for(workers, "connecting", limit, |t| {
        t.held == devices && t.watches == watches
    })
    .await;
    anyhow::ensure!(
        ok,
        "only {} devices and {} watches held within {limit:?}",
        t.held,
        t.watches
    );
    let ramp = t0.elapsed();
    eprintln!(
        "storm: all connected in {:.1} s; holding {} s",
        ramp.as_secs_f64(),
        args.hold_secs
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    memory_figures(report, nodes, redis, redis_before, rss0, args, ramp).await?;
    let t = workers.totals();
    report.figure(
        "devices_held",
        t.held as f64,
        "devices",
        json!({"target_min": args.devices, "connect_secs": ramp.as_secs_f64(),
               "failed_attempts": t.errors}),
    );
    report.figure(
        "watches_held",
        t.watches as f64,
        "watches",
        json!({"target_min": watches, "per_device": args.watches}),
    );
    tokio::time::sleep(Duration::from_secs(args.hold_secs)).await;
    let (t, ok) = wait_for(workers, "hold", Duration::ZERO, |t| t.held == devices).await;
    anyhow::ensure!(
        ok,
        "{} of {devices} devices lost during the hold",
        devices - t.held
    );
    Ok(())
}

/// The sampler of Redis's ops: flags for the storm and the end, the task,
/// the peaks.
type Sampler = (
    Arc<AtomicBool>,
    Arc<AtomicBool>,
    tokio::task::JoinHandle<()>,
    Arc<Mutex<backend::Peaks>>,
);

/// Kills `node` (the victim) and waits for its devices to come back
/// elsewhere and for late offline events; reports the storm's figures.
async fn storm_phase(
    mut report: Report,
    mut workers: Workers,
    node: &mut Node,
    victim: usize,
    ttl: Duration,
    args: &StormArgs,
    (storming, sampling, sampler, peaks): Sampler,
) -> anyhow::Result<()> {
    let devices = args.devices as u64;
    let victims = (0..args.devices)
        .filter(|i| i % args.nodes == victim)
        .count() as u64;
    storming.store(true, Ordering::SeqCst);
    workers.send("storm").await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    eprintln!("storm: SIGKILL node {victim} with {victims} devices");
    let kill_us = now_us();
    let killed = Instant::now();
    node.kill()?;
    let (t, all_back) = wait_for(&workers, "storm", ttl + GIVE_UP_AFTER_TTL, |t| {
        t.dropped >= victims && t.back >= t.dropped
    })
    .await;
    // Offline events for leases that lapse come about one TTL after the kill.
    let settle = (ttl + Duration::from_secs(5)).saturating_sub(killed.elapsed());
    eprintln!(
        "storm: {} of {victims} back; waiting {settle:?} for late events",
        t.back
    );
    tokio::time::sleep(settle).await;
    let held_after = workers.totals().held;
    sampling.store(true, Ordering::SeqCst);
    // A lease is refreshed at least once a heartbeat (a third of the TTL),
    // so every lease of the killed node is held until TTL - heartbeat after
    // the kill; a device back later than that may have lapsed first, a
    // real offline. Devices back sooner must see none.
    let held = ttl * 2 / 3;
    let ends = workers.end(kill_us, held.as_micros() as u64).await?;
    let _ = sampler.await;
    let peaks = peaks.lock().unwrap();
    storm_figures(
        &mut report,
        &t,
        all_back,
        victims,
        kill_us,
        &ends,
        &peaks,
        held,
    );
    report.print_table();
    anyhow::ensure!(
        all_back && held_after == devices,
        "{} of {victims} devices of the killed node back; {held_after} of {devices} held at the end",
        t.back
    );
    Ok(())
}

/// Node RSS and Redis memory per device, once every device is connected.
async fn memory_figures(
    report: &mut Report,
    nodes: &[Node],
    redis: &mut [redis::aio::MultiplexedConnection],
    redis_before: u64,
    rss_before: u64,
    args: &StormArgs,
    ramp: Duration,
) -> anyhow::Result<()> {
    let per_node: Vec<u64> = nodes
        .iter()
        .map(|n| n.pid().and_then(rss_bytes).unwrap_or(0))
        .collect();
    let rss: u64 = per_node.iter().sum();
    let d = args.devices as f64;
    report.figure(
        "node_rss_per_device",
        rss as f64 / d,
        "B",
        json!({"target_max": 8192, "rss_mb_per_node": per_node.iter().map(|b| b >> 20).collect::<Vec<_>>(),
               "grown_per_device": rss.saturating_sub(rss_before) as f64 / d,
               "watches_per_device": args.watches, "connect_secs": ramp.as_secs_f64()}),
    );
    let used = backend::used_memory(redis).await?;
    let parts = backend::memory_parts(redis).await?;
    report.figure(
        "redis_memory_per_device",
        used as f64 / d,
        "B",
        json!({"target_max": 1024, "primaries": args.primaries,
               "grown_per_device": used.saturating_sub(redis_before) as f64 / d,
               "fixed_per_device": parts.fixed as f64 / d,
               "clients_per_device": parts.clients as f64 / d,
               "channels": parts.channels,
               "subscribers_per_channel": parts.subscriptions as f64 / parts.channels.max(1) as f64,
               "what": "used_memory summed over the primaries, channels included"}),
    );
    Ok(())
}

/// The storm's figures from the workers' summaries.
#[allow(clippy::too_many_arguments)]
fn storm_figures(
    report: &mut Report,
    t: &Totals,
    all_back: bool,
    victims: u64,
    kill_us: u64,
    ends: &[Value],
    peaks: &backend::Peaks,
    held: Duration,
) {
    let all_back_s = t.last_back_us.saturating_sub(kill_us) as f64 / 1e6;
    // When a share of the killed node's devices was back (null if that
    // share never was): the figure that still says something when a few
    // cannot come back (the open-file limit).
    let mut back_ms: Vec<u64> = ends
        .iter()
        .flat_map(|e| e["back_ms"].as_array().cloned().unwrap_or_default())
        .filter_map(|v| v.as_u64())
        .collect();
    back_ms.sort_unstable();
    let share_back_s = |share: f64| {
        let k = ((victims as f64 * share).ceil() as usize).max(1);
        back_ms.get(k - 1).map(|&ms| ms as f64 / 1e3)
    };
    report.figure(
        "storm_all_back_s",
        if all_back { all_back_s } else { f64::NAN },
        "s",
        json!({"target_max": 15, "devices_killed": victims, "dropped": t.dropped,
               "back": t.back, "last_back_s": all_back_s, "failed_attempts": t.errors,
               "half_back_s": share_back_s(0.5), "p90_back_s": share_back_s(0.9),
               "p99_back_s": share_back_s(0.99),
               "backoff": "full jitter, 500 ms doubling to 15 s"}),
    );
    let late: HashSet<u64> = ends
        .iter()
        .flat_map(|e| e["late"].as_array().cloned().unwrap_or_default())
        .filter_map(|v| v.as_u64())
        .collect();
    // (user, ms after the kill) per offline event.
    let offline: Vec<(u64, i64)> = ends
        .iter()
        .flat_map(|e| e["offline"].as_array().cloned().unwrap_or_default())
        .filter_map(|v| Some((v[0].as_u64()?, v[1].as_i64()?)))
        .collect();
    let spurious_at: Vec<i64> = offline
        .iter()
        .filter(|(u, _)| !late.contains(u))
        .map(|&(_, ms)| ms)
        .collect();
    let (first_ms, last_ms) = (spurious_at.iter().min(), spurious_at.iter().max());
    let users: HashSet<u64> = offline
        .iter()
        .filter(|(u, _)| !late.contains(u))
        .map(|&(u, _)| u)
        .collect();
    let sum = |k: &str| ends.iter().map(|e| e[k].as_u64().unwrap_or(0)).sum::<u64>();
    let mut kinds = serde_json::Map::new();
    for e in ends {
        for (k, v) in e["error_kinds"].as_object().into_iter().flatten() {
            let n = kinds.get(k).and_then(Value::as_u64).unwrap_or(0) + v.as_u64().unwrap_or(0);
            kinds.insert(k.clone(), json!(n));
        }
    }
    report.figure(
        "storm_failed_attempts",
        t.errors as f64,
        "attempts",
        json!({"kinds": kinds}),
    );
    let spurious =
        spurious_at.len() as u64 + sum("offline_count").saturating_sub(offline.len() as u64);
    report.figure(
        "storm_spurious_offline",
        spurious as f64,
        "events",
        json!({"target_max": 0, "offline_events": sum("offline_count"),
               "online_events_for_those_users": sum("online_victim"),
               "devices_back_after_lease_held": late.len(), "lease_held_ms": held.as_millis() as u64,
               "spurious_users": users.len(), "first_ms_after_kill": first_ms,
               "last_ms_after_kill": last_ms}),
    );
    let mut h = latency_histogram();
    for e in ends {
        for v in e["latency_us"].as_array().into_iter().flatten() {
            h.saturating_record(v.as_u64().unwrap_or(0));
        }
    }
    report.latency(
        "storm_watcher_latency",
        &h,
        json!({"what": "probe status change -> each watcher, from 2 s before the kill until the end"}),
    );
    report.figure(
        "storm_watcher_p99_ms",
        h.value_at_quantile(0.99) as f64 / 1000.0,
        "ms",
        json!({"target_max": 1000, "events": h.len()}),
    );
    report.figure(
        "storm_redis_peak_ops",
        peaks.storm,
        "ops/s",
        json!({"before_storm_peak": peaks.before,
               "what": "highest total_commands_processed per second on any primary"}),
    );
}
