//! `connections`: ramp one node to N idle devices (one user each) and hold
//! them through heartbeats; connect rate, server RSS per connection (VmRSS)
//! and Redis memory per device (INFO memory used_memory).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use serde_json::json;
use tokio::sync::Semaphore;

use crate::client::{self, Held};
use crate::report::{latency_histogram, Report};
use crate::{procs, redis_used_memory, Common, Setup};

/// Flags of `connections`.
#[derive(Args, Debug)]
pub struct ConnectionsArgs {
    /// Devices to connect, one user each.
    #[arg(long, default_value_t = 100_000)]
    pub devices: usize,
    /// Handshakes in flight at once.
    #[arg(long, default_value_t = 200)]
    pub concurrency: usize,
    /// Seconds to hold every device after the ramp; with the default
    /// 15 s heartbeat, 20 s sees every device pinged and refreshed.
    #[arg(long, default_value_t = 20)]
    pub hold_secs: u64,
    /// During the hold, each device also sends a heartbeat frame this often
    /// (ms; 0: idle, answering pings only). Traffic walks the node's
    /// per-connection buffers, so RSS after a chatty hold is the figure
    /// for long-lived connections.
    #[arg(long, default_value_t = 0)]
    pub chatter_ms: u64,
}

/// RSS sampling period during the ramp (the plot's points).
const SAMPLE_EVERY: Duration = Duration::from_millis(250);

pub async fn run(common: &Common, args: &ConnectionsArgs) -> anyhow::Result<()> {
    procs::ensure_fds(args.devices)?;
    let mut report = Report::new("connections");
    let mut setup = Setup::redis(common)?;
    setup.start_nodes(common, 1, None)?;
    let node = setup.nodes[0].addr;
    let pid = setup.nodes[0].pid();
    let sources = setup.sources.clone();
    let mut redis = setup.redis_conn().await?;

    // Let the node settle (scripts loaded, subscriptions up) before the
    // baseline.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_before = pid.and_then(procs::rss_bytes);
    let mem_before = redis_used_memory(&mut redis).await?;

    let connected = Arc::new(AtomicUsize::new(0));
    let samples = Arc::new(std::sync::Mutex::new(Vec::new()));
    let sampler = pid.map(|pid| {
        let connected = connected.clone();
        let samples = samples.clone();
        tokio::spawn(async move {
            loop {
                if let Some(rss) = procs::rss_bytes(pid) {
                    let n = connected.load(Ordering::Relaxed);
                    samples.lock().unwrap().push((n, rss));
                }
                tokio::time::sleep(SAMPLE_EVERY).await;
            }
        })
    });

    eprintln!("connections: ramping to {} devices", args.devices);
    let sem = Arc::new(Semaphore::new(args.concurrency.max(1)));
    let cpu0 = pid.and_then(procs::cpu_us);
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(args.devices);
    for i in 0..args.devices {
        let permit = sem.clone().acquire_owned().await?;
        let sources = sources.clone();
        let connected = connected.clone();
        let chatter = (args.chatter_ms > 0).then(|| Duration::from_millis(args.chatter_ms));
        tasks.push(tokio::spawn(async move {
            let t = Instant::now();
            let ws = client::connect(node, sources.next(), &format!("c{i}"), "d").await;
            drop(permit);
            let ws = ws?;
            let n = connected.fetch_add(1, Ordering::Relaxed) + 1;
            if n.is_multiple_of(10_000) {
                eprintln!("connections: {n} connected");
            }
            anyhow::Ok((Held::chatty(ws, chatter), t.elapsed()))
        }));
    }
    let mut held = Vec::with_capacity(args.devices);
    let mut handshake = latency_histogram();
    let mut failed = 0usize;
    let mut first_error = None;
    for t in tasks {
        match t.await? {
            Ok((h, took)) => {
                handshake.saturating_record(took.as_micros() as u64);
                held.push(h);
            }
            Err(e) => {
                failed += 1;
                first_error.get_or_insert(e);
            }
        }
    }
    let ramp = start.elapsed();
    let cpu1 = pid.and_then(procs::cpu_us);
    if let Some(e) = first_error {
        eprintln!("connections: {failed} failed; first: {e:#}");
    }
    let n = held.len();
    report.figure(
        "connect_rate",
        n as f64 / ramp.as_secs_f64(),
        "conn/s",
        json!({"devices": n, "failed": failed, "ramp_s": ramp.as_secs_f64(), "concurrency": args.concurrency}),
    );
    report.latency("handshake", &handshake, json!({}));
    if let (Some(a), Some(b)) = (cpu0, cpu1) {
        report.figure(
            "node_cpu_per_connect",
            (b - a) as f64 / n.max(1) as f64,
            "us",
            json!({}),
        );
    }

    eprintln!("connections: holding {n} devices for {} s", args.hold_secs);
    tokio::time::sleep(Duration::from_secs(args.hold_secs)).await;
    let open = held.iter().filter(|h| h.is_open()).count();
    let leases = crate::fixture::index_len(&mut redis, "presence-leases").await?;
    report.figure(
        "held_after_hold",
        open as f64,
        "connections",
        json!({"hold_s": args.hold_secs, "leases_in_redis": leases, "target_min": 100_000}),
    );

    let mem_after = redis_used_memory(&mut redis).await?;
    report.figure(
        "redis_memory_per_device",
        (mem_after as f64 - mem_before as f64) / n.max(1) as f64,
        "bytes",
        json!({"used_memory_before": mem_before, "used_memory_after": mem_after}),
    );
    if let (Some(pid), Some(before)) = (pid, rss_before) {
        let after = procs::rss_bytes(pid).unwrap_or(0);
        report.figure(
            "server_rss_per_connection",
            (after as f64 - before as f64) / n.max(1) as f64,
            "bytes",
            json!({"rss_before": before, "rss_after": after,
                       "target_max": if args.chatter_ms > 0 { 5120 } else { 4096 }}),
        );
    }
    if let Some(s) = sampler {
        s.abort();
    }
    if let (Some(dir), Some(_)) = (&common.svg, pid) {
        let samples = samples.lock().unwrap().clone();
        crate::plot::rss(
            &dir.join("connections-rss.svg"),
            &format!("presence-server RSS against connections ({n} devices)"),
            &samples,
        )?;
    }
    report.print_table();
    // Nodes first (drop order of `setup`), so that 100,000 departures are
    // not run on the way out.
    drop(setup);
    drop(held);
    anyhow::ensure!(
        failed == 0 && open == n,
        "{failed} devices failed to connect, {} of {n} dropped while held",
        n - open
    );
    Ok(())
}
