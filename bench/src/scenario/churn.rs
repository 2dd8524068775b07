//! `churn`: devices that keep swapping the users they watch (issue 30,
//! item 10), and what it costs everyone else. Each churner unwatches its
//! batch and watches a fresh one every tick; meanwhile a probe device
//! changes its status every 20 ms and a probe watcher times each event.
//! Reports the probe's latency before and during the churn, the node's and
//! Redis's CPU during it, the most sharded channels seen, and how many
//! watch changes the node accepted and refused.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use futures_util::SinkExt;
use hdrhistogram::Histogram;
use serde_json::json;
use tokio_tungstenite::tungstenite::Message;

use crate::client::{self, spawn_reader};
use crate::report::{latency_histogram, Report};
use crate::{Common, Setup};

/// Flags of `churn`.
#[derive(Args, Debug)]
pub struct ChurnArgs {
    /// Devices swapping their watched users.
    #[arg(long, default_value_t = 32)]
    pub churners: usize,
    /// Users each churner swaps per second (unwatches that many, watches
    /// as many fresh ones).
    #[arg(long, default_value_t = 1_000)]
    pub swaps_per_sec: usize,
    /// Seconds of churn measured.
    #[arg(long, default_value_t = 10)]
    pub secs: u64,
    /// Seconds of churn before the measurement, so that the figures are
    /// those of the sustained rate and not of each session's first burst.
    #[arg(long, default_value_t = 10)]
    pub settle_secs: u64,
}

/// Swaps per churner per second are sent in this many batches.
const TICKS_PER_SEC: u64 = 10;
/// The probe's status changes this often.
const PROBE_EVERY: Duration = Duration::from_millis(20);
/// Probe latency is measured alone for this long first.
const BASELINE: Duration = Duration::from_secs(3);

/// The probe's status changes, timed: `sent` holds the send time (µs since
/// the run's start) of each change by its sequence number.
struct Probe {
    sent: Mutex<Vec<u64>>,
    quiet: Mutex<Histogram<u64>>,
    churning: Mutex<Histogram<u64>>,
    /// 0: before the churn, 1: settling (not recorded), 2: measured, 3: after.
    phase: std::sync::atomic::AtomicU8,
}

pub async fn run(common: &Common, args: &ChurnArgs) -> anyhow::Result<()> {
    let mut report = Report::new("churn");
    let mut setup = Setup::redis(common)?;
    setup.start_nodes(common, 1, None)?;
    let node = setup.nodes[0].addr;
    let mut redis = setup.redis_conn().await?;
    let base = Instant::now();
    let probe = Arc::new(Probe {
        sent: Mutex::new(Vec::new()),
        quiet: Mutex::new(latency_histogram()),
        churning: Mutex::new(latency_histogram()),
        phase: 0.into(),
    });
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);

    // The probe: a device whose status text carries its sequence number,
    // watched by one session.
    let mut watcher = client::connect(node, setup.sources.next(), "churn-watcher", "d").await?;
    client::watch(&mut watcher, &["churn-probe".to_string()]).await?;
    let p = probe.clone();
    let watching = spawn_reader(watcher, stop_rx.clone(), move |v, at| {
        let Some(seq) = v["text"].as_str().and_then(|t| t.parse::<usize>().ok()) else {
            return;
        };
        let Some(&sent) = p.sent.lock().unwrap().get(seq) else {
            return;
        };
        let lat = (at.duration_since(base).as_micros() as u64)
            .saturating_sub(sent)
            .max(1);
        let h = match p.phase.load(Ordering::Acquire) {
            0 => &p.quiet,
            2 => &p.churning,
            _ => return,
        };
        h.lock().unwrap().saturating_record(lat);
    });
    let mut device = client::connect(node, setup.sources.next(), "churn-probe", "d").await?;
    let p = probe.clone();
    let mut probe_stop = stop_rx.clone();
    let prober = tokio::spawn(async move {
        let mut tick = tokio::time::interval(PROBE_EVERY);
        for seq in 0usize.. {
            tokio::select! {
                _ = tick.tick() => {}
                _ = probe_stop.changed() => return,
            }
            let status = if seq % 2 == 0 { "away" } else { "busy" };
            p.sent
                .lock()
                .unwrap()
                .push(base.elapsed().as_micros() as u64);
            let frame = json!({"type": "status", "status": status, "text": seq.to_string()});
            if device
                .send(Message::Text(frame.to_string().into()))
                .await
                .is_err()
            {
                return;
            }
        }
    });
    tokio::time::sleep(BASELINE).await;

    // The churners.
    let accepted = Arc::new(AtomicU64::new(0));
    let refused = Arc::new(AtomicU64::new(0));
    let batch = (args.swaps_per_sec as u64 / TICKS_PER_SEC).max(1) as usize;
    let mut churners = Vec::new();
    let mut readers = Vec::new();
    for c in 0..args.churners {
        let ws = client::connect(node, setup.sources.next(), &format!("churner{c}"), "d").await?;
        let (mut sink, stream) = futures_util::StreamExt::split(ws);
        let (acc, refd) = (accepted.clone(), refused.clone());
        readers.push(spawn_reader(stream, stop_rx.clone(), move |v, _| {
            if v["type"] == "snapshot" {
                acc.fetch_add(
                    v["presence"].as_array().map_or(0, Vec::len) as u64,
                    Ordering::Relaxed,
                );
            } else if v["type"] == "error" {
                refd.fetch_add(1, Ordering::Relaxed);
            }
        }));
        let secs = args.settle_secs + args.secs;
        churners.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(1_000 / TICKS_PER_SEC));
            let mut current: Vec<String> = Vec::new();
            for round in 0..secs * TICKS_PER_SEC {
                tick.tick().await;
                if !current.is_empty() {
                    let frame = json!({"type": "unwatch", "users": current});
                    let _ = sink.send(Message::Text(frame.to_string().into())).await;
                }
                current = (0..batch).map(|i| format!("x{c}-{round}-{i}")).collect();
                let frame = json!({"type": "watch", "users": current});
                let _ = sink.send(Message::Text(frame.to_string().into())).await;
            }
        }));
    }
    probe.phase.store(1, Ordering::Release);
    eprintln!(
        "churn: {} churners swapping {} users/s each for {} s, measured after {} s",
        args.churners, args.swaps_per_sec, args.secs, args.settle_secs
    );
    tokio::time::sleep(Duration::from_secs(args.settle_secs)).await;
    let (accepted0, refused0) = (
        accepted.load(Ordering::Relaxed),
        refused.load(Ordering::Relaxed),
    );
    probe.phase.store(2, Ordering::Release);
    let node_pid = setup.nodes[0].pid();
    let redis_pid = setup.local_redis.as_ref().map(|r| r.pid());
    let cpu = |pid: Option<u32>| pid.and_then(crate::procs::cpu_us);
    let (node0, redis0, t0) = (cpu(node_pid), cpu(redis_pid), Instant::now());
    let mut peak_channels = 0usize;
    let churn_end = Instant::now() + Duration::from_secs(args.secs);
    while Instant::now() < churn_end {
        let channels: Vec<String> = redis::cmd("PUBSUB")
            .arg("SHARDCHANNELS")
            .query_async(&mut redis)
            .await?;
        peak_channels = peak_channels.max(channels.len());
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let (node1, redis1, took) = (cpu(node_pid), cpu(redis_pid), t0.elapsed());
    probe.phase.store(3, Ordering::Release);
    for c in churners {
        c.await?;
    }
    for r in readers {
        r.abort();
    }
    let _ = stop_tx.send(true);
    let _ = prober.await;
    watching.abort();

    let pct = |a: Option<u64>, b: Option<u64>| match (a, b) {
        (Some(a), Some(b)) => (b - a) as f64 / took.as_micros() as f64 * 100.0,
        _ => f64::NAN,
    };
    let params =
        json!({"churners": args.churners, "swaps_per_sec": args.swaps_per_sec, "secs": args.secs});
    report.latency(
        "probe_quiet",
        &probe.quiet.lock().unwrap(),
        json!({"before the churn": true}),
    );
    report.latency(
        "probe_churning",
        &probe.churning.lock().unwrap(),
        params.clone(),
    );
    report.figure("node_cpu_pct", pct(node0, node1), "%", params.clone());
    report.figure(
        "redis_cpu_pct",
        pct(redis0, redis1),
        "%",
        json!({"local redis only": true}),
    );
    report.figure(
        "peak_shard_channels",
        peak_channels as f64,
        "channels",
        json!({}),
    );
    let secs = took.as_secs_f64();
    report.figure(
        "watches_accepted_per_sec",
        (accepted.load(Ordering::Relaxed) - accepted0) as f64 / secs,
        "users/s",
        json!({"asked_per_sec": args.churners * args.swaps_per_sec}),
    );
    report.figure(
        "watch_frames_refused_per_sec",
        (refused.load(Ordering::Relaxed) - refused0) as f64 / secs,
        "frames/s",
        json!({}),
    );
    report.print_table();
    let (quiet, churning) = (
        probe.quiet.lock().unwrap().len(),
        probe.churning.lock().unwrap().len(),
    );
    anyhow::ensure!(
        quiet > 0 && churning > 0,
        "the probe's watcher got {quiet} events before and {churning} during the churn"
    );
    Ok(())
}
