//! `refresh`: how many lease refreshes per second a node gets into Redis,
//! against the ceiling of the same Redis commands sent straight to Redis
//! pipelined, in the same run; and what the node's CPU per received frame
//! is against a floor of the same run, a bare server that only reads the
//! same frames ([`ReadFloor`]).
//!
//! Phases, one after another: the ceiling (before any device connects, on
//! a Redis doing nothing else), the node, then the floor.
//! The node batches the refreshes of all its sessions: one pipeline of
//! `arrive.lua` calls (EVALSHA, one per refresh), then one multi-member
//! `ZADD presence-leases:{b<k>} GT d1 m1 d2 m2 ...` per bucket for the batch.
//! The ceiling sends exactly that for devices written the same way:
//! `--pipeline` EVALSHAs followed by the ZADDs of as many members, from a
//! few connections. Refreshes through the node are the
//! node's own count of what it sent (`presence_refresh_batch_size` in its
//! /metrics, which also gives the mean batch size); Redis's EVALSHA count,
//! over a window just inside the node's, is printed beside it as a check, an
//! upper bound since it includes the node's other scripts (the
//! reconciliation pass). Each phase also prints what Redis spent per
//! refresh and its share of a core: the bench starts Redis in a session of
//! its own, so that it is scheduled as on a host of its own in both phases.
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
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::Message;

use crate::floor::ReadFloor;
use crate::report::Report;
use crate::{client, procs, redis_calls, Common, Setup};

/// The node's script, sent by the ceiling exactly as the node sends it.
const ARRIVE_LUA: &str = include_str!("../../../src/lua/arrive.lua");
/// Lease TTL the ceiling writes: long enough that none of its leases
/// lapses while the node is measured after it (their departures would
/// share Redis with the node's refreshes). Redis's cost is the same for
/// any TTL.
const CEILING_TTL_MS: u64 = 120_000;

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

/// Most devices the floor runs with: the bench holds both ends of each of
/// its connections, two descriptors per device.
const FLOOR_DEVICES: usize = 9_000;

/// Bytes of one masked client text frame carrying `text` (under 126 bytes).
fn client_frame_len(text: &str) -> u64 {
    (2 + 4 + text.len()) as u64
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

    // Phase 1: the ceiling, straight to Redis, while the node is idle.
    let redis_pid = setup.local_redis.as_ref().map(|r| r.pid());
    let (ceiling, ceiling_redis_cpu) = ceiling(&setup, redis_pid, &mut redis, args, secs).await?;
    report.figure(
        "ceiling_direct_to_redis",
        ceiling,
        "refresh/s",
        json!({"connections": args.direct_conns, "pipeline": args.pipeline,
               "redis_cpu_share": ceiling_redis_cpu.map(|c| c.share)}),
    );

    // Phase 2: through the node.
    eprintln!("refresh: connecting {} devices", args.devices);
    let send_interval_ms = args.send_interval_ms.unwrap_or(hb_ms / 3 + 10);
    let interval = Duration::from_millis(send_interval_ms);
    let devices = Devices::connect(node, &setup, "r", args.devices, interval).await?;
    // Let the first round of refreshes settle, then count.
    tokio::time::sleep(Duration::from_millis(hb_ms)).await;
    eprintln!(
        "refresh: measuring the node (pid {:?}) for {} s",
        setup.nodes[0].pid(),
        secs.as_secs()
    );
    let pid = setup.nodes[0].pid();
    let node = setup.nodes[0].addr;
    let r0 = Reading::take(node, pid, redis_pid, &devices).await?;
    let (calls0, t0) = (redis_calls(&mut redis, "evalsha").await?, Instant::now());
    tokio::time::sleep(secs).await;
    let (calls1, took) = (redis_calls(&mut redis, "evalsha").await?, t0.elapsed());
    let r1 = Reading::take(node, pid, redis_pid, &devices).await?;
    let (still_open, why_closed) = devices.finish().await?;
    anyhow::ensure!(
        calls1 >= calls0,
        "EVALSHA calls went down ({calls0} -> {calls1}): was Redis restarted or its stats reset?"
    );
    // Every figure of the node's phase is over the window between the two
    // readings, each dated halfway through its /metrics request, with the
    // CPU times and the frames sent read around the request: under load the
    // request takes a while, and everything kept growing meanwhile.
    let node_took = r1.at.duration_since(r0.at);
    let per_s = |n: f64| n / node_took.as_secs_f64();
    let cpu_delta = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| (b - a).max(0.0));
    let (cpu, user_cpu, redis_cpu) = (
        cpu_delta(r0.cpu, r1.cpu),
        cpu_delta(r0.user_cpu, r1.user_cpu),
        cpu_delta(r0.redis_cpu, r1.redis_cpu),
    );
    // The node's own count of the refreshes it sent in batches: Redis's
    // EVALSHA count (over the bench's own window inside this one) also holds
    // the node's other scripts (the reconciliation pass runs one per user
    // every minute), so it is only an upper bound.
    let refreshed = (r1.refreshed - r0.refreshed).max(0.0);
    let frames = (r1.sent - r0.sent).max(0.0);
    let through_node = per_s(refreshed);
    let bound = args.devices as f64 * 3000.0 / hb_ms as f64;
    report.figure(
        "heartbeats_sent",
        per_s(frames),
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
    if let Some(cpu) = cpu {
        report.figure(
            "node_cpu_per_refresh",
            cpu / refreshed.max(1.0),
            "us",
            json!({"node_cpu_share": cpu / node_took.as_micros() as f64,
                   "includes": "parsing every heartbeat frame, refreshed or not",
                   "target_max": 8}),
        );
    }
    // Every frame the node reads costs it at least what a bare server pays
    // for one: the floor, from the same devices, in the same run.
    let node_per_frame = cpu.map(|cpu| cpu / frames.max(1.0));
    if let Some(per_frame) = node_per_frame {
        report.figure(
            "node_cpu_per_frame",
            per_frame,
            "us",
            json!({"frames": "the devices' heartbeat frames over the window"}),
        );
    }
    // The node's own code, without the kernel's TCP path (the floor's cost).
    if let Some(user_cpu) = user_cpu {
        report.figure(
            "node_user_cpu_per_frame",
            user_cpu / frames.max(1.0),
            "us",
            json!({}),
        );
    }
    // What Redis spent per refresh, and how much of a core it got, in each
    // phase: through the node the same refreshes cost Redis about the same,
    // so a lower rate through the node with Redis below a whole core means
    // Redis was starved of CPU on this box, not that the node sent less.
    if let (Some(ceiling_cpu), Some(redis_cpu)) = (ceiling_redis_cpu, redis_cpu) {
        report.figure(
            "redis_cpu_per_refresh",
            redis_cpu / refreshed.max(1.0),
            "us",
            json!({"redis_cpu_share": redis_cpu / node_took.as_micros() as f64,
                   "ceiling_redis_cpu_per_refresh": ceiling_cpu.per_refresh,
                   "ceiling_redis_cpu_share": ceiling_cpu.share}),
        );
    }
    let batches = (r1.batches - r0.batches).max(0.0);
    report.figure(
        "node_refresh_batch_mean",
        refreshed / batches.max(1.0),
        "refresh/batch",
        json!({"batches_per_s": per_s(batches)}),
    );
    report.figure(
        "throttle_bound",
        bound,
        "refresh/s",
        json!({"why": "one refresh per session per heartbeat/3"}),
    );

    report.figure(
        "ratio_node_to_ceiling",
        through_node / ceiling,
        "ratio",
        json!({"target_min": 0.6, "bound_ratio": bound / ceiling,
               "through_node": through_node, "ceiling": ceiling}),
    );
    // The floor: the same kind of devices sending to a bare server that
    // only reads. The node's devices are closed: the floor may use their
    // descriptors (the bench holds both ends of each floor connection).
    let floor_devices = args.devices.min(FLOOR_DEVICES);
    eprintln!("refresh: floor, {floor_devices} devices sending to a bare server that only reads");
    let floor = ReadFloor::start()?;
    let devices = Devices::connect(floor.addr, &setup, "f", floor_devices, interval).await?;
    tokio::time::sleep(Duration::from_millis(hb_ms)).await;
    let (cpu0, bytes0, t0) = (floor.cpu_us(), floor.bytes(), Instant::now());
    tokio::time::sleep(secs).await;
    let (cpu1, bytes1, took) = (floor.cpu_us(), floor.bytes(), t0.elapsed());
    devices.finish().await?;
    drop(floor);
    let frames = (bytes1 - bytes0) / client_frame_len(&json!({"type": "heartbeat"}).to_string());
    let floor_per_frame = (cpu1 - cpu0) as f64 / frames.max(1) as f64;
    report.figure(
        "floor_cpu_per_frame",
        floor_per_frame,
        "us",
        json!({"devices": floor_devices, "frames_per_s": frames as f64 / took.as_secs_f64(),
               "what": "a bare server on 2 threads reading the same heartbeat frames",
               "compare": "node_cpu_per_frame"}),
    );
    if let Some(per_frame) = node_per_frame {
        report.figure(
            "node_cpu_per_frame_over_floor",
            per_frame / floor_per_frame.max(0.001),
            "ratio",
            json!({}),
        );
    }
    report.print_table();
    anyhow::ensure!(
        still_open == args.devices,
        "only {still_open} of {} devices stayed connected; the first: {}",
        args.devices,
        why_closed.lock().unwrap().as_deref().unwrap_or("?")
    );
    Ok(())
}

/// The counters of the node's phase at one moment: the node's count of
/// refreshes sent in batches and of those batches (one read of its
/// /metrics), and, averaged from just before and just after that request,
/// the node's and Redis's CPU times (µs) and the frames the devices sent.
/// Dated halfway through the request.
struct Reading {
    at: Instant,
    refreshed: f64,
    batches: f64,
    cpu: Option<f64>,
    user_cpu: Option<f64>,
    redis_cpu: Option<f64>,
    sent: f64,
}

impl Reading {
    async fn take(
        node: std::net::SocketAddr,
        pid: Option<u32>,
        redis_pid: Option<u32>,
        devices: &Devices,
    ) -> anyhow::Result<Self> {
        let sample = || {
            let split = pid.and_then(procs::cpu_split_us);
            (
                split.map(|(user, system)| user + system),
                split.map(|(user, _)| user),
                redis_pid.and_then(procs::cpu_us),
                devices.sent(),
            )
        };
        let mean = |a: Option<u64>, b: Option<u64>| a.zip(b).map(|(a, b)| (a + b) as f64 / 2.0);
        let (asked, before) = (Instant::now(), sample());
        let names = [
            "presence_refresh_batch_size_sum",
            "presence_refresh_batch_size_count",
        ];
        let values = procs::node_metrics(node, &names).await?;
        let after = sample();
        Ok(Self {
            at: asked + asked.elapsed() / 2,
            refreshed: values[0],
            batches: values[1],
            cpu: mean(before.0, after.0),
            user_cpu: mean(before.1, after.1),
            redis_cpu: mean(before.2, after.2),
            sent: (before.3 + after.3) as f64 / 2.0,
        })
    }
}

/// Redis's CPU in the ceiling's window.
#[derive(Clone, Copy)]
struct RedisCpu {
    /// Of one core.
    share: f64,
    /// µs per refresh.
    per_refresh: f64,
}

/// The ceiling: the node's refresh commands sent straight to Redis,
/// pipelined, from a few connections, for `secs`; refreshes per second, and
/// Redis's CPU meanwhile when the bench started Redis (`redis_pid`).
/// Measured before the devices connect, on a Redis that does nothing else
/// (measured after them, it shared Redis with their 10,000 departures).
async fn ceiling(
    setup: &Setup,
    redis_pid: Option<u32>,
    redis: &mut redis::aio::MultiplexedConnection,
    args: &RefreshArgs,
    secs: Duration,
) -> anyhow::Result<(f64, Option<RedisCpu>)> {
    eprintln!("refresh: ceiling, straight to Redis");
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(ARRIVE_LUA)
        .query_async(redis)
        .await?;
    let owner = crate::fixture::LEASE_VALUE;
    crate::fixture::live_leases(redis, "x", args.devices, owner, false).await?;
    let done = Arc::new(AtomicU64::new(0));
    let (cpu0, t0) = (redis_pid.and_then(procs::cpu_us), Instant::now());
    let deadline = t0 + secs;
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
                        // The node's run number.
                        .arg(crate::fixture::LEASE_RUN)
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
    for w in workers {
        w.await??;
    }
    // From before the first worker started: each starts sending as soon as
    // it is spawned, while the next ones connect.
    let took = t0.elapsed();
    let cpu1 = redis_pid.and_then(procs::cpu_us);
    let done = done.load(Ordering::Relaxed) as f64;
    let cpu = match (cpu0, cpu1) {
        (Some(a), Some(b)) => Some(RedisCpu {
            share: (b - a) as f64 / took.as_micros() as f64,
            per_refresh: (b - a) as f64 / done.max(1.0),
        }),
        _ => None,
    };
    Ok((done / took.as_secs_f64(), cpu))
}

/// How one device's task ended: its reading task, and whether it was still
/// sending when told to stop.
type DeviceEnd = (JoinHandle<()>, bool);

/// Devices that each send a heartbeat frame every `interval` from the
/// moment they are connected, and read all the time (answering pings,
/// noticing a close).
struct Devices {
    tasks: Vec<JoinHandle<anyhow::Result<DeviceEnd>>>,
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    /// Why the first device that lost its connection lost it.
    why_closed: Arc<std::sync::Mutex<Option<String>>>,
}

impl Devices {
    /// Connects `n` devices (users `<prefix><i>`, device `d`) to `addr`;
    /// fails if one cannot connect.
    async fn connect(
        addr: std::net::SocketAddr,
        setup: &Setup,
        prefix: &str,
        n: usize,
        interval: Duration,
    ) -> anyhow::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let connected = Arc::new(AtomicUsize::new(0));
        let handshakes = Arc::new(Semaphore::new(CONNECT_CONCURRENCY));
        let why_closed: Arc<std::sync::Mutex<Option<String>>> = Arc::default();
        let frame = json!({"type": "heartbeat"}).to_string();
        let mut tasks = Vec::with_capacity(n);
        // Each device reads and sends from the moment it is connected: one
        // that waited, silent, for the others would be cut off by a node
        // with a short heartbeat (three heartbeats of silence) before the
        // run began.
        for i in 0..n {
            let user = format!("{prefix}{i}");
            let permit = handshakes.clone().acquire_owned().await?;
            let (sources, why) = (setup.sources.clone(), why_closed.clone());
            let (stop, sent, connected, frame) =
                (stop.clone(), sent.clone(), connected.clone(), frame.clone());
            tasks.push(tokio::spawn(async move {
                let ws = client::connect(addr, sources.next(), &user, "d").await;
                if ws.is_ok() {
                    connected.fetch_add(1, Ordering::Relaxed);
                }
                drop(permit);
                let (mut sink, mut stream) = ws?.split();
                // Reads all the time: answers pings, and notices a close.
                let reader = tokio::spawn(async move {
                    let reason = loop {
                        match stream.next().await {
                            Some(Ok(Message::Close(f))) => {
                                break format!("closed by the server: {f:?}")
                            }
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
        let devices = Self {
            tasks,
            stop,
            sent,
            why_closed,
        };
        if connected.load(Ordering::Relaxed) < n {
            devices.finish().await?;
            anyhow::bail!("a device could not connect");
        }
        Ok(devices)
    }

    /// Frames sent so far.
    fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// Stops sending and closes every device. Returns how many were still
    /// open, and why the first one that closed before did.
    async fn finish(self) -> anyhow::Result<(usize, Arc<std::sync::Mutex<Option<String>>>)> {
        self.stop.store(true, Ordering::Relaxed);
        let mut still_open = 0;
        for t in self.tasks {
            let (reader, ok) = t.await??;
            if ok && !reader.is_finished() {
                still_open += 1;
            }
            reader.abort();
        }
        Ok((still_open, self.why_closed))
    }
}
