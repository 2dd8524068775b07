//! `transitions`: devices arrive and leave at a set rate on node A, one
//! fresh user each; watchers on node B watch all of them. Latency from the
//! start of the device's connect (online) or its close frame (offline) to
//! the watcher's `presence` event.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use hdrhistogram::Histogram;
use serde_json::json;

use super::{connect_many, watch_lists};
use crate::client::{self, spawn_watcher};
use crate::report::{latency_histogram, Report};
use crate::{Common, Setup};

/// Flags of `transitions`.
#[derive(Args, Debug)]
pub struct TransitionsArgs {
    /// Transitions per second; each device makes two (online, offline).
    #[arg(long, default_value_t = 1_000)]
    pub rate: u64,
    /// Seconds of arrivals.
    #[arg(long, default_value_t = 10)]
    pub secs: u64,
    /// How long each device stays connected, in ms.
    #[arg(long, default_value_t = 1_000)]
    pub hold_ms: u64,
}

/// Users per watcher: the node's default max_watches.
const WATCH_PER_SESSION: usize = 1_000;
/// How long to wait for the last events after the last close.
const DRAIN: Duration = Duration::from_secs(10);

/// What the watchers record.
struct Seen {
    online: Histogram<u64>,
    offline: Histogram<u64>,
    /// Events with no matching start (should stay 0).
    unexpected: u64,
}

pub async fn run(common: &Common, args: &TransitionsArgs) -> anyhow::Result<()> {
    let mut report = Report::new("transitions");
    let mut setup = Setup::redis(common)?;
    setup.start_nodes(common, 2, None)?;
    let (node_a, node_b) = (setup.nodes[0].addr, setup.nodes[1].addr);
    let arrivals_per_s = (args.rate as f64 / 2.0).max(0.5);
    let total = ((arrivals_per_s * args.secs as f64).ceil() as usize).max(1);
    let users: Vec<String> = (0..total).map(|i| format!("t{i}")).collect();

    // Start times in µs since `base`, 0 while unset: [online, offline].
    let base = Instant::now();
    let starts: Arc<Vec<[AtomicU64; 2]>> = Arc::new(
        (0..total)
            .map(|_| [AtomicU64::new(0), AtomicU64::new(0)])
            .collect(),
    );
    let seen = Arc::new(Mutex::new(Seen {
        online: latency_histogram(),
        offline: latency_histogram(),
        unexpected: 0,
    }));
    let events = Arc::new(AtomicU64::new(0));

    let lists = watch_lists(&users, WATCH_PER_SESSION);
    let watcher_names: Vec<String> = (0..lists.len()).map(|i| format!("tw{i}")).collect();
    let (mut watchers, _) = connect_many(node_b, &setup.sources, watcher_names, 50).await?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut readers = Vec::new();
    for (ws, list) in watchers.drain(..).zip(lists) {
        let mut ws = ws;
        let snap = client::watch(&mut ws, &list).await?;
        anyhow::ensure!(
            snap.iter().all(|r| r["status"] == "offline"),
            "fresh users should be offline"
        );
        let (starts, seen, events) = (starts.clone(), seen.clone(), events.clone());
        readers.push(spawn_watcher(
            ws,
            stop_rx.clone(),
            move |(user, status, at)| {
                let at_us = at.duration_since(base).as_micros() as u64;
                let idx: Option<usize> = user.strip_prefix('t').and_then(|n| n.parse().ok());
                let slot = match status.as_str() {
                    "online" => 0,
                    _ => 1,
                };
                let start = idx
                    .and_then(|i| starts.get(i))
                    .map(|s| s[slot].load(Ordering::Acquire))
                    .unwrap_or(0);
                let mut seen = seen.lock().unwrap();
                if start == 0 {
                    seen.unexpected += 1;
                    return;
                }
                let lat = at_us.saturating_sub(start).max(1);
                if slot == 0 {
                    seen.online.saturating_record(lat);
                } else {
                    seen.offline.saturating_record(lat);
                }
                events.fetch_add(1, Ordering::Relaxed);
            },
        ));
    }

    eprintln!(
        "transitions: {total} devices, {arrivals_per_s} arrivals/s, each held {} ms",
        args.hold_ms
    );
    let pids: Vec<u32> = setup.nodes.iter().filter_map(|n| n.pid()).collect();
    let node_cpu = || -> Option<u64> { pids.iter().map(|&p| crate::procs::cpu_us(p)).sum() };
    let cpu0 = node_cpu();
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / arrivals_per_s));
    let hold = Duration::from_millis(args.hold_ms);
    let sources = setup.sources.clone();
    let mut devices = Vec::with_capacity(total);
    let t0 = Instant::now();
    for (i, user) in users.iter().enumerate() {
        tick.tick().await;
        let (starts, src, user) = (starts.clone(), sources.next(), user.clone());
        devices.push(tokio::spawn(async move {
            super::arrive_and_leave(node_a, src, &user, hold, |slot| {
                let at = base.elapsed().as_micros().max(1) as u64;
                starts[i][slot].store(at, Ordering::Release);
            })
            .await
        }));
    }
    let scheduled_for = t0.elapsed();
    let mut failed = 0;
    for d in devices {
        if let Err(e) = d.await? {
            if failed == 0 {
                eprintln!("transitions: a device failed: {e:#}");
            }
            failed += 1;
        }
    }
    let expected = 2 * (total - failed) as u64;
    let drain_until = Instant::now() + DRAIN;
    while events.load(Ordering::Relaxed) < expected && Instant::now() < drain_until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cpu1 = node_cpu();
    let _ = stop_tx.send(true);
    let seen = seen.lock().unwrap();
    let got = events.load(Ordering::Relaxed);
    report.figure(
        "transition_rate",
        2.0 * total as f64 / scheduled_for.as_secs_f64(),
        "transitions/s",
        json!({"devices": total, "failed": failed, "events_expected": expected,
               "events_received": got, "unexpected": seen.unexpected}),
    );
    if let (Some(a), Some(b)) = (cpu0, cpu1) {
        report.figure(
            "nodes_cpu_per_transition",
            (b - a) as f64 / expected.max(1) as f64,
            "us",
            json!({"includes": "both nodes: connect, close, publish, deliver"}),
        );
    }
    let mut both = seen.online.clone();
    both.add(&seen.offline)?;
    report.latency("latency_all", &both, json!({"target_p99_ms": 5}));
    report.latency(
        "latency_online",
        &seen.online,
        json!({"from": "connect start"}),
    );
    report.latency(
        "latency_offline",
        &seen.offline,
        json!({"from": "close frame sent"}),
    );
    if let Some(dir) = &common.svg {
        crate::plot::latency(
            &dir.join("transitions-latency.svg"),
            &format!(
                "transition latency, node A -> watcher on node B, {} transitions/s",
                args.rate
            ),
            &[
                ("online (from connect)", &seen.online),
                ("offline (from close)", &seen.offline),
            ],
        )?;
    }
    report.print_table();
    anyhow::ensure!(
        failed == 0 && got == expected && seen.unexpected == 0,
        "{failed} devices failed, {got} of {expected} events received, {} unexpected",
        seen.unexpected
    );
    Ok(())
}
