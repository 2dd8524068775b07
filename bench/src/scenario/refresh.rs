//! `refresh`: how many lease refreshes per second a node gets into Redis,
//! against the ceiling of the same Redis commands sent straight to Redis
//! pipelined, in the same run.
//!
//! The node batches the refreshes of all its sessions: one pipeline of
//! `arrive.lua` calls (EVALSHA, one per refresh), then one multi-member
//! `ZADD presence-leases:{b<k>} GT d1 m1 d2 m2 ...` per bucket for the batch.
//! The ceiling sends exactly that for devices written the same way:
//! `--pipeline` EVALSHAs followed by the ZADDs of as many members, from a
//! few connections. Refreshes through the node are the
//! node's own count of what it sent (`presence_refresh_batch_size` in its
//! /metrics, which also gives the mean batch size); Redis's EVALSHA count
//! over the same window is printed beside it as a check, an upper bound
//! since it includes the node's other scripts (the reconciliation pass).
//!
//! The node refreshes one session's lease at most once per heartbeat / 3,
//! however fast the client sends, so the node's figure is bounded by
//! `devices * 3 / heartbeat`, which the scenario prints beside the figures.
//! To measure the node's capacity rather than the throttle, the defaults
//! (10,000 devices, a 450 ms heartbeat for the spawned node, a send interval
//! of heartbeat / 3 + 10 ms) put that bound at 66,667/s, above the target,
//! and make nearly every frame a refresh.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use tokio::sync::Semaphore;
use tokio_tungstenite::tungstenite::Message;

use crate::report::Report;
use crate::{client, procs, redis_calls, Common, Setup};

/// The node's script, sent by the ceiling exactly as the node sends it.
const ARRIVE_LUA: &str = include_str!("../../../src/lua/arrive.lua");
/// Lease TTL the ceiling writes (the node's own TTL is 3 heartbeats).
const CEILING_TTL_MS: u64 = 900;

/// Flags of `refresh`.
#[derive(Args, Debug)]
pub struct RefreshArgs {
    /// Devices (one WebSocket each) sending heartbeats.
    #[arg(long, default_value_t = 10_000)]
    pub devices: usize,
    /// Seconds each phase (node, then ceiling) is measured.
    #[arg(long, default_value_t = 10)]
    pub secs: u64,
    /// Pause between one device's heartbeats in ms; 0 sends as fast as the
    /// node reads them [default: heartbeat / 3 + 10, just above the node's
    /// refresh throttle, so that nearly every frame is a refresh].
    #[arg(long)]
    pub send_interval_ms: Option<u64>,
    /// Connections the ceiling sends from.
    #[arg(long, default_value_t = 4)]
    pub direct_conns: usize,
    /// Refreshes per pipeline in the ceiling (that many EVALSHAs, then two
    /// ZADDs of that many members each).
    #[arg(long, default_value_t = 64)]
    pub pipeline: usize,
}

/// WebSocket handshakes in flight at once.
const CONNECT_CONCURRENCY: usize = 200;

/// Heartbeat of spawned nodes unless --heartbeat-ms says otherwise: with
/// 10,000 devices the throttle allows 66,667 refreshes/s, above the target
/// of half a ceiling near 100,000/s.
const DEFAULT_HEARTBEAT_MS: u64 = 450;

pub async fn run(common: &Common, args: &RefreshArgs) -> anyhow::Result<()> {
    crate::procs::ensure_fds(args.devices)?;
    let mut report = Report::new("refresh");
    let mut setup = Setup::redis(common)?;
    setup.start_nodes(common, 1, Some(DEFAULT_HEARTBEAT_MS))?;
    let hb_ms = common.heartbeat_ms.unwrap_or(DEFAULT_HEARTBEAT_MS);
    let node = setup.nodes[0].addr;
    let mut redis = setup.redis_conn().await?;
    let secs = Duration::from_secs(args.secs.max(1));

    // Phase 1: through the node.
    eprintln!("refresh: connecting {} devices", args.devices);
    let users: Vec<String> = (0..args.devices).map(|i| format!("r{i}")).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let connected = Arc::new(AtomicUsize::new(0));
    let handshakes = Arc::new(Semaphore::new(CONNECT_CONCURRENCY));
    let mut tasks = Vec::with_capacity(users.len());
    // Why the first device that lost its connection lost it.
    let why_closed: Arc<std::sync::Mutex<Option<String>>> = Arc::default();
    let frame = json!({"type": "heartbeat"}).to_string();
    let send_interval_ms = args.send_interval_ms.unwrap_or(hb_ms / 3 + 10);
    let interval = Duration::from_millis(send_interval_ms);
    // Each device reads and sends from the moment it is connected: one that
    // waited, silent, for the others would be cut off by a node with a short
    // heartbeat (three heartbeats of silence) before the run began.
    for user in users {
        let permit = handshakes.clone().acquire_owned().await?;
        let (sources, why) = (setup.sources.clone(), why_closed.clone());
        let (stop, sent, connected, frame) =
            (stop.clone(), sent.clone(), connected.clone(), frame.clone());
        tasks.push(tokio::spawn(async move {
            let ws = client::connect(node, sources.next(), &user, "d").await;
            if ws.is_ok() {
                connected.fetch_add(1, Ordering::Relaxed);
            }
            drop(permit);
            let (mut sink, mut stream) = ws?.split();
            // Reads all the time: answers pings, and notices a close.
            let reader = tokio::spawn(async move {
                let reason = loop {
                    match stream.next().await {
                        Some(Ok(Message::Close(f))) => break format!("closed by the node: {f:?}"),
                        Some(Ok(_)) => {}
                        Some(Err(e)) => break format!("error: {e}"),
                        None => break "dropped".to_string(),
                    }
                };
                why.lock().unwrap().get_or_insert(reason);
            });
            while !stop.load(Ordering::Relaxed) {
                if sink
                    .send(Message::Text(frame.as_str().into()))
                    .await
                    .is_err()
                {
                    return anyhow::Ok((reader, false));
                }
                sent.fetch_add(1, Ordering::Relaxed);
                if interval.is_zero() {
                    tokio::task::yield_now().await;
                } else {
                    tokio::time::sleep(interval).await;
                }
            }
            Ok((reader, true))
        }));
    }
    // Every handshake has ended once all permits are back.
    let _all = handshakes.acquire_many(CONNECT_CONCURRENCY as u32).await?;
    if connected.load(Ordering::Relaxed) < args.devices {
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            t.await??;
        }
        anyhow::bail!("a device could not connect");
    }
    // Let the first round of refreshes settle, then count.
    tokio::time::sleep(Duration::from_millis(hb_ms)).await;
    eprintln!(
        "refresh: measuring the node (pid {:?}) for {} s",
        setup.nodes[0].pid(),
        secs.as_secs()
    );
    let pid = setup.nodes[0].pid();
    let cpu0 = pid.and_then(procs::cpu_us);
    let node = setup.nodes[0].addr;
    let (refreshed0, batches0) = (
        procs::node_metric(node, "presence_refresh_batch_size_sum").await?,
        procs::node_metric(node, "presence_refresh_batch_size_count").await?,
    );
    let (calls0, sent0, t0) = (
        redis_calls(&mut redis, "evalsha").await?,
        sent.load(Ordering::Relaxed),
        Instant::now(),
    );
    tokio::time::sleep(secs).await;
    let (calls1, sent1, took) = (
        redis_calls(&mut redis, "evalsha").await?,
        sent.load(Ordering::Relaxed),
        t0.elapsed(),
    );
    let (refreshed1, batches1) = (
        procs::node_metric(node, "presence_refresh_batch_size_sum").await?,
        procs::node_metric(node, "presence_refresh_batch_size_count").await?,
    );
    let cpu1 = pid.and_then(procs::cpu_us);
    stop.store(true, Ordering::Relaxed);
    let mut still_open = 0;
    for t in tasks {
        let (reader, ok) = t.await??;
        if ok && !reader.is_finished() {
            still_open += 1;
        }
        reader.abort();
    }
    anyhow::ensure!(
        calls1 >= calls0,
        "EVALSHA calls went down ({calls0} -> {calls1}): was Redis restarted or its stats reset?"
    );
    // The node's own count of the refreshes it sent in batches: Redis's
    // EVALSHA count also holds the node's other scripts (the reconciliation
    // pass runs one per user every minute), so it is only an upper bound.
    let refreshed = (refreshed1 - refreshed0).max(0.0);
    let through_node = refreshed / took.as_secs_f64();
    let bound = args.devices as f64 * 3000.0 / hb_ms as f64;
    report.figure(
        "heartbeats_sent",
        (sent1 - sent0) as f64 / took.as_secs_f64(),
        "frames/s",
        json!({"devices": args.devices, "still_open": still_open,
               "send_interval_ms": send_interval_ms}),
    );
    report.figure(
        "refreshes_through_node",
        through_node,
        "refresh/s",
        json!({"heartbeat_ms": hb_ms, "throttle_bound": bound,
               "counted": "the node's presence_refresh_batch_size_sum over the window",
               "evalsha_per_s": (calls1 - calls0) as f64 / took.as_secs_f64()}),
    );
    if let (Some(a), Some(b)) = (cpu0, cpu1) {
        report.figure(
            "node_cpu_per_refresh",
            (b - a) as f64 / refreshed.max(1.0),
            "us",
            json!({"node_cpu_share": (b - a) as f64 / took.as_micros() as f64,
                   "includes": "parsing every heartbeat frame, refreshed or not",
                   "target_max": 8}),
        );
    }
    let batches = (batches1 - batches0).max(0.0);
    report.figure(
        "node_refresh_batch_mean",
        refreshed / batches.max(1.0),
        "refresh/batch",
        json!({"batches_per_s": batches / took.as_secs_f64()}),
    );
    report.figure(
        "throttle_bound",
        bound,
        "refresh/s",
        json!({"why": "one refresh per session per heartbeat/3"}),
    );

    // Phase 2: the ceiling, straight to Redis.
    eprintln!("refresh: ceiling, straight to Redis");
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(ARRIVE_LUA)
        .query_async(&mut redis)
        .await?;
    let owner = "bench 1 0";
    crate::fixture::live_leases(&mut redis, "x", args.devices, owner, false).await?;
    let done = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + secs;
    let mut workers = Vec::new();
    let devices = args.devices.max(1);
    let per = args.pipeline.max(1);
    for w in 0..args.direct_conns.max(1) {
        let mut conn = setup.redis_conn().await?;
        let (sha, done) = (sha.clone(), done.clone());
        workers.push(tokio::spawn(async move {
            let mut i = w * 7919;
            while Instant::now() < deadline {
                let now = crate::now_ms();
                let deadline = now + CEILING_TTL_MS as i64;
                let mut pipe = redis::pipe();
                // Per bucket, one ZADD of deadlines, as the node writes
                // them.
                let mut indexes: std::collections::BTreeMap<u32, redis::Cmd> = Default::default();
                for _ in 0..per {
                    let user = format!("x{}", i % devices);
                    i += 1;
                    pipe.cmd("EVALSHA")
                        .arg(&sha)
                        .arg(3)
                        .arg(format!("presence:{{{user}}}:d"))
                        .arg(format!("presence-count:{{{user}}}"))
                        .arg(format!("presence-status:{{{user}}}"))
                        .arg(owner)
                        .arg(CEILING_TTL_MS)
                        .arg("d")
                        .arg(now)
                        .arg("refresh")
                        .arg(&user)
                        .arg(format!("presence-events:{{{user}}}"))
                        // The status and privacy a session knows after its
                        // connect: none chosen, as the bench's devices.
                        .arg("")
                        .arg("")
                        .arg(0)
                        // Devices per user (connect only), known privacy.
                        .arg(32)
                        .arg("")
                        .arg("")
                        .ignore();
                    let bucket = crate::fixture::bucket_of(&user, crate::fixture::BUCKETS);
                    let leases = indexes.entry(bucket).or_insert_with(|| {
                        let mut leases = redis::cmd("ZADD");
                        leases
                            .arg(format!("presence-leases:{{b{bucket:02}}}"))
                            .arg("GT");
                        leases
                    });
                    leases.arg(deadline).arg(format!("{user}:d"));
                }
                for leases in indexes.into_values() {
                    pipe.add_command(leases).ignore();
                }
                pipe.query_async::<()>(&mut conn).await?;
                done.fetch_add(per as u64, Ordering::Relaxed);
            }
            anyhow::Ok(())
        }));
    }
    let t0 = Instant::now();
    for w in workers {
        w.await??;
    }
    let ceiling = done.load(Ordering::Relaxed) as f64 / t0.elapsed().as_secs_f64();
    report.figure(
        "ceiling_direct_to_redis",
        ceiling,
        "refresh/s",
        json!({"connections": args.direct_conns, "pipeline": per}),
    );
    report.figure(
        "ratio_node_to_ceiling",
        through_node / ceiling,
        "ratio",
        json!({"target_min": 0.6, "bound_ratio": bound / ceiling,
               "through_node": through_node, "ceiling": ceiling}),
    );
    report.print_table();
    anyhow::ensure!(
        still_open == args.devices,
        "only {still_open} of {} devices stayed connected; the first: {}",
        args.devices,
        why_closed.lock().unwrap().as_deref().unwrap_or("?")
    );
    Ok(())
}
