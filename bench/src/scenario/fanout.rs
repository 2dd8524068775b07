//! `fanout`: one user watched by many sessions on one node. The user's
//! device connects (online) and closes (offline) in turn; latency from the
//! start of the connect, or the close frame, to each watcher's receipt.
//!
//! In the same run the floor: a bare WebSocket server ([`FloorServer`])
//! writes a frame of the same size to as many watchers, from two threads
//! like the node's; what it takes is what this box's kernel, scheduler and
//! load generator cost any server, and the node's figure is printed as a
//! ratio to it.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use futures_util::StreamExt;
use hdrhistogram::Histogram;
use serde_json::json;

use super::connect_many;
use crate::client::{self, spawn_reader, spawn_watcher};
use crate::floor::FloorServer;
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
    let receipts = Arc::new(Receipts::new());
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let star = vec![STAR.to_string()];
    let mut tasks = Vec::with_capacity(watchers.len());
    for mut ws in watchers {
        let (star, receipts, stop_rx) = (star.clone(), receipts.clone(), stop_rx.clone());
        // Watch in parallel: 10,000 snapshots one after another would be slow.
        tasks.push(tokio::spawn(async move {
            client::watch(&mut ws, &star).await?;
            anyhow::Ok(spawn_watcher(ws, stop_rx, move |(_, _, at)| {
                receipts.record(at)
            }))
        }));
    }
    let mut readers = Vec::with_capacity(tasks.len());
    for t in tasks {
        readers.push(t.await??);
    }

    eprintln!(
        "fanout: {} transitions of {STAR} (node pid {:?})",
        args.transitions,
        setup.nodes[0].pid()
    );
    let pid = setup.nodes[0].pid();
    let split0 = pid.and_then(crate::procs::cpu_split_us);
    let (cpu0, user0) = (split0.map(|(u, s)| u + s), split0.map(|(u, _)| u));
    let mut device = None;
    for _ in 0..args.transitions {
        receipts.begin();
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
        receipts.end(args.watchers).await;
    }
    let split1 = pid.and_then(crate::procs::cpu_split_us);
    let (cpu1, user1) = (split1.map(|(u, s)| u + s), split1.map(|(u, _)| u));
    let _ = stop_tx.send(true);
    for r in readers {
        let _ = r.await;
    }
    report.latency(
        "transition_to_watcher",
        &receipts.hist.lock().unwrap(),
        json!({"watchers": args.watchers, "transitions": args.transitions,
               "incomplete_transitions": receipts.incomplete(), "target_p99_ms": 50}),
    );
    report.latency(
        "transition_to_last_watcher",
        &receipts.lasts.lock().unwrap(),
        json!({}),
    );
    let deliveries = (args.watchers * args.transitions).max(1) as f64;
    // Per delivery, µs: all the node's CPU, and its user part (the node's
    // own code, without the kernel's TCP path, the floor's cost).
    let node_cpu = cpu0.zip(cpu1).map(|(a, b)| (b - a) as f64 / deliveries);
    let node_user = user0.zip(user1).map(|(a, b)| (b - a) as f64 / deliveries);
    if let Some(cpu) = node_cpu {
        report.figure(
            "node_cpu_per_delivery",
            cpu,
            "us",
            json!({"node_cpu_ms": cpu * deliveries / 1000.0, "target_max": 6}),
        );
    }
    if let Some(user) = node_user {
        report.figure(
            "node_user_cpu_per_delivery",
            user,
            "us",
            json!({"node_user_cpu_ms": user * deliveries / 1000.0}),
        );
    }
    // The node's sockets are closed: the floor may use the descriptors.
    drop(setup);
    let floor = floor(args.watchers, args.transitions, FLOOR_FRAME, Duration::ZERO).await?;
    report.latency(
        "floor_frame_to_watcher",
        &floor.receipts.hist.lock().unwrap(),
        json!({"watchers": floor.watchers, "rounds": args.transitions,
               "incomplete_rounds": floor.receipts.incomplete(),
               "what": "the same frame written to raw sockets from 2 threads in a loop"}),
    );
    let writes = (floor.watchers * args.transitions).max(1) as f64;
    let floor_cpu = floor.cpu_us as f64 / writes;
    report.figure(
        "floor_cpu_per_write",
        floor_cpu,
        "us",
        json!({"compare": "node_cpu_per_delivery", "floor_sys_per_write": floor.sys_us as f64 / writes}),
    );
    if let (Some(node_cpu), Some(node_user)) = (node_cpu, node_user) {
        report.figure(
            "node_cpu_over_floor_cpu",
            node_cpu / floor_cpu.max(0.001),
            "ratio",
            json!({"target_max": 1.25}),
        );
        // The same writes with the node's own work per delivery (busy
        // work) before each: what the kernel's share becomes at the
        // node's pace, receivers waking for each frame instead of being
        // kept busy by a tight loop.
        let pace = Duration::from_nanos((node_user * 1000.0) as u64);
        eprintln!("floor: again, {pace:?} of busy work before each write");
        let paced = self::floor(args.watchers, args.transitions, FLOOR_FRAME, pace).await?;
        let paced_writes = (paced.watchers * args.transitions).max(1) as f64;
        report.figure(
            "floor_paced_sys_per_write",
            paced.sys_us as f64 / paced_writes,
            "us",
            json!({"pace_us": node_user, "compare": "node_sys_per_delivery",
                   "node_sys_per_delivery": node_cpu - node_user,
                   "floor_sys_per_write": floor.sys_us as f64 / writes}),
        );
    }
    let node_p99 = receipts.hist.lock().unwrap().value_at_quantile(0.99) as f64;
    let floor_p99 = floor.receipts.hist.lock().unwrap().value_at_quantile(0.99) as f64;
    report.figure(
        "node_p99_over_floor_p99",
        node_p99 / floor_p99.max(1.0),
        "ratio",
        json!({"target_max": 1.1, "node_p99_ms": node_p99 / 1000.0, "floor_p99_ms": floor_p99 / 1000.0}),
    );
    if let Some(dir) = &common.svg {
        crate::plot::latency(
            &dir.join("fanout-latency.svg"),
            &format!(
                "fan-out: one transition -> each of {} watchers on one node",
                args.watchers
            ),
            &[
                (
                    "presence-server: transition -> receipt",
                    &receipts.hist.lock().unwrap(),
                ),
                (
                    "floor: raw writes from 2 threads, write -> receipt",
                    &floor.receipts.hist.lock().unwrap(),
                ),
            ],
        )?;
    }
    report.print_table();
    anyhow::ensure!(
        receipts.incomplete() == 0 && floor.receipts.incomplete() == 0,
        "{} transitions (and {} floor rounds) did not reach every watcher",
        receipts.incomplete(),
        floor.receipts.incomplete()
    );
    Ok(())
}

/// The same fan-out from a bare WebSocket server ([`FloorServer`]): as many
/// of `watchers` as the open-file limit allows beside their server-side
/// sockets (all of them on a host with room), `frame` (one of the node's
/// size) once per round. `rooms` uses it too.
pub(crate) async fn floor(
    watchers: usize,
    rounds: usize,
    frame: &str,
    pace: Duration,
) -> anyhow::Result<Floor> {
    let room = (crate::procs::fd_limit().saturating_sub(FD_MARGIN) / 2).max(1) as usize;
    let n = watchers.min(room);
    eprintln!("floor: a bare WebSocket server writing to {n} watchers");
    let server = FloorServer::start()?;
    let sources = Arc::new(crate::client::Sources::new(4));
    let names: Vec<String> = (0..n).map(|i| format!("f{i}")).collect();
    let (sockets, _) = connect_many(server.addr, &sources, names, 200).await?;
    // Every handshake has finished once its `hello` arrived; the server
    // keeps the socket just after writing it.
    let t = Instant::now();
    while server.connections() < n && t.elapsed() < PER_TRANSITION {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let receipts = Arc::new(Receipts::new());
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let readers: Vec<_> = sockets
        .into_iter()
        .map(|ws| {
            let receipts = receipts.clone();
            // Every frame the floor writes is a round's.
            spawn_reader(ws, stop_rx.clone(), move |_, at| receipts.record(at))
        })
        .collect();
    let (mut cpu_us, mut sys_us) = (0, 0);
    for _ in 0..rounds {
        receipts.begin();
        let (user, sys) = tokio::task::block_in_place(|| server.send(frame, 2, pace));
        cpu_us += user + sys;
        sys_us += sys;
        receipts.end(n).await;
    }
    let _ = stop_tx.send(true);
    for r in readers {
        let _ = r.await;
    }
    drop(server);
    Ok(Floor {
        receipts,
        watchers: n,
        cpu_us,
        sys_us,
    })
}

/// What the floor measured.
pub(crate) struct Floor {
    /// Its receipt times.
    pub(crate) receipts: Arc<Receipts>,
    /// Watchers it wrote to (fewer than the node's when the open-file
    /// limit has no room for all of them twice).
    pub(crate) watchers: usize,
    /// CPU time its writing threads used, µs.
    pub(crate) cpu_us: u64,
    /// Of which in the kernel, µs.
    pub(crate) sys_us: u64,
}

/// Descriptors kept free for everything but the floor's sockets.
const FD_MARGIN: u64 = 64;

/// A presence frame the size of the node's (an `online` for `star`).
const FLOOR_FRAME: &str = r#"{"type":"presence","user":"star","status":"online","devices":1,"last_seen":null,"text":null,"since":1763719200000,"seq":1763719200001}"#;

/// Receipt times of one phase, against the start of the current round.
pub(crate) struct Receipts {
    /// The clock's origin.
    base: Instant,
    /// The current round's start in µs since `base`.
    start: AtomicU64,
    /// Receipts in the current round.
    received: AtomicUsize,
    /// The slowest receipt of the current round, µs.
    slowest: AtomicU64,
    /// Every receipt, µs.
    pub(crate) hist: Mutex<Histogram<u64>>,
    /// The slowest receipt of each round, µs.
    pub(crate) lasts: Mutex<Histogram<u64>>,
    /// Rounds that did not reach every watcher.
    incomplete: AtomicUsize,
}

impl Receipts {
    pub(crate) fn new() -> Self {
        Self {
            base: Instant::now(),
            start: AtomicU64::new(0),
            received: AtomicUsize::new(0),
            slowest: AtomicU64::new(0),
            hist: Mutex::new(latency_histogram()),
            lasts: Mutex::new(latency_histogram()),
            incomplete: AtomicUsize::new(0),
        }
    }

    /// A round starts now.
    pub(crate) fn begin(&self) {
        self.received.store(0, Ordering::Release);
        self.slowest.store(0, Ordering::Release);
        self.start
            .store(self.base.elapsed().as_micros() as u64, Ordering::Release);
    }

    /// A watcher received the round's frame at `at`.
    pub(crate) fn record(&self, at: Instant) {
        let lat = (at.duration_since(self.base).as_micros() as u64)
            .saturating_sub(self.start.load(Ordering::Acquire))
            .max(1);
        self.hist.lock().unwrap().saturating_record(lat);
        self.slowest.fetch_max(lat, Ordering::AcqRel);
        self.received.fetch_add(1, Ordering::Release);
    }

    /// Waits until `n` watchers have the round's frame (or gives up after
    /// [`PER_TRANSITION`]), then lets stragglers land.
    pub(crate) async fn end(&self, n: usize) {
        let t = Instant::now();
        while self.received.load(Ordering::Acquire) < n && t.elapsed() < PER_TRANSITION {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let got = self.received.load(Ordering::Acquire);
        if got < n {
            eprintln!("a round reached only {got} of {n} receivers");
            self.incomplete.fetch_add(1, Ordering::Relaxed);
        }
        self.lasts
            .lock()
            .unwrap()
            .saturating_record(self.slowest.load(Ordering::Acquire).max(1));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    pub(crate) fn incomplete(&self) -> usize {
        self.incomplete.load(Ordering::Relaxed)
    }
}
