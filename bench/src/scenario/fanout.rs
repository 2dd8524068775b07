//! `fanout`: one user watched by many sessions on one node. The user's
//! device connects (online) and closes (offline) in turn; latency from the
//! start of the connect, or the close frame, to each watcher's receipt.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use futures_util::StreamExt;
use serde_json::json;

use super::connect_many;
use crate::client::{self, spawn_watcher};
use crate::report::{latency_histogram, Report};
use crate::{Common, Setup};

/// Flags of `fanout`.
#[derive(Args, Debug)]
pub struct FanoutArgs {
    /// Sessions watching the one user.
    #[arg(long, default_value_t = 10_000)]
    pub watchers: usize,
    /// Transitions of the watched user (alternately online and offline).
    #[arg(long, default_value_t = 10)]
    pub transitions: usize,
}

/// The watched user.
const STAR: &str = "star";
/// How long one transition may take to reach every watcher.
const PER_TRANSITION: Duration = Duration::from_secs(30);

pub async fn run(common: &Common, args: &FanoutArgs) -> anyhow::Result<()> {
    crate::procs::ensure_fds(args.watchers)?;
    let mut report = Report::new("fanout");
    let mut setup = Setup::redis(common)?;
    setup.start_nodes(common, 1, None)?;
    let node = setup.nodes[0].addr;

    eprintln!("fanout: connecting {} watchers", args.watchers);
    let names: Vec<String> = (0..args.watchers).map(|i| format!("fw{i}")).collect();
    let (watchers, _) = connect_many(node, &setup.sources, names, 200).await?;
    // The transition's start in µs since `base`.
    let base = Instant::now();
    let start = Arc::new(AtomicU64::new(0));
    let received = Arc::new(AtomicUsize::new(0));
    // The slowest receipt of the current transition, µs.
    let slowest = Arc::new(AtomicU64::new(0));
    let hist = Arc::new(Mutex::new(latency_histogram()));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let star = vec![STAR.to_string()];
    let mut tasks = Vec::with_capacity(watchers.len());
    for mut ws in watchers {
        let star = star.clone();
        let (start, received, hist, stop_rx, slowest) = (
            start.clone(),
            received.clone(),
            hist.clone(),
            stop_rx.clone(),
            slowest.clone(),
        );
        // Watch in parallel: 10,000 snapshots one after another would be slow.
        tasks.push(tokio::spawn(async move {
            client::watch(&mut ws, &star).await?;
            spawn_watcher(ws, stop_rx, move |(_, _, at)| {
                let lat = (at.duration_since(base).as_micros() as u64)
                    .saturating_sub(start.load(Ordering::Acquire))
                    .max(1);
                hist.lock().unwrap().saturating_record(lat);
                slowest.fetch_max(lat, Ordering::AcqRel);
                received.fetch_add(1, Ordering::Release);
            });
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }

    eprintln!(
        "fanout: {} transitions of {STAR} (node pid {:?})",
        args.transitions,
        setup.nodes[0].pid()
    );
    let pid = setup.nodes[0].pid();
    let cpu0 = pid.and_then(crate::procs::cpu_us);
    let mut lasts = latency_histogram();
    let mut incomplete = 0;
    let mut device = None;
    for k in 0..args.transitions {
        received.store(0, Ordering::Release);
        slowest.store(0, Ordering::Release);
        start.store(base.elapsed().as_micros() as u64, Ordering::Release);
        let t = Instant::now();
        match device.take() {
            None => {
                device = Some(client::connect(node, setup.sources.next(), STAR, "d").await?);
            }
            Some(mut ws) => {
                let ws: &mut client::Ws = &mut ws;
                ws.close(None).await?;
                let _ = tokio::time::timeout(Duration::from_secs(5), async {
                    while let Some(Ok(_)) = ws.next().await {}
                })
                .await;
            }
        }
        while received.load(Ordering::Acquire) < args.watchers && t.elapsed() < PER_TRANSITION {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let got = received.load(Ordering::Acquire);
        if got < args.watchers {
            eprintln!(
                "fanout: transition {k} reached only {got} of {} watchers",
                args.watchers
            );
            incomplete += 1;
        }
        lasts.saturating_record(slowest.load(Ordering::Acquire).max(1));
        // Lets stragglers land before the next transition starts.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let cpu1 = pid.and_then(crate::procs::cpu_us);
    let _ = stop_tx.send(true);
    let hist = hist.lock().unwrap();
    report.latency(
        "transition_to_watcher",
        &hist,
        json!({"watchers": args.watchers, "transitions": args.transitions,
               "incomplete_transitions": incomplete, "target_p99_ms": 50}),
    );
    report.latency("transition_to_last_watcher", &lasts, json!({}));
    if let (Some(a), Some(b)) = (cpu0, cpu1) {
        report.figure(
            "node_cpu_per_delivery",
            (b - a) as f64 / (args.watchers * args.transitions).max(1) as f64,
            "us",
            json!({"node_cpu_ms": (b - a) as f64 / 1000.0}),
        );
    }
    if let Some(dir) = &common.svg {
        crate::plot::latency(
            &dir.join("fanout-latency.svg"),
            &format!(
                "fan-out: one transition -> each of {} watchers on one node",
                args.watchers
            ),
            &[("transition -> watcher receipt", &hist)],
        )?;
    }
    report.print_table();
    anyhow::ensure!(
        incomplete == 0,
        "{incomplete} transitions did not reach every watcher"
    );
    Ok(())
}
