//! `cursors`: live cursors (issue 42). `--devices` member devices of one
//! room (one user each, half on each of two nodes, every join with
//! `"batch":true`) each send their state (a pointer, with the time it was
//! made) at `--hz` for `--secs`. Figures:
//!
//! - `cursor_staleness_p99_ms`: how old each state is when a member
//!   receives it (made -> received, every update of every batch);
//! - `frames_per_sec_per_device`: `room_updates` frames a member receives
//!   per second (the mean; the worst member beside it), against
//!   `--room-state-hz` + 5;
//! - `node_cpu_per_member_update`: both nodes' CPU over the moving phase
//!   per update delivered to a member, µs;
//! - `redis_commands_per_sec`: Redis's `total_commands_processed` over the
//!   moving phase, per second, beside the `evalsha` calls: independent of
//!   `--hz` once it is above `--room-state-hz`.
//!
//! Spawned nodes take any frame rate (`procs`); nodes given with
//! `--node-url` need `--max-frames-per-sec` above `--hz`. The nodes'
//! `--room-announce-max` is raised so that the room lists its members.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use futures_util::SinkExt;
use hdrhistogram::Histogram;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

use super::rooms::{leave_all, members, nodes_cpu_us, Joining};
use crate::report::{latency_histogram, Report};
use crate::{procs, redis_calls, redis_info, Common, Setup};

/// Flags of `cursors`.
#[derive(Args, Debug)]
pub struct CursorsArgs {
    /// Member devices of the room, over two nodes, each moving.
    #[arg(long, default_value_t = 200)]
    pub devices: usize,
    /// States each device sends per second.
    #[arg(long, default_value_t = 60)]
    pub hz: u64,
    /// Seconds of moving.
    #[arg(long, default_value_t = 20)]
    pub secs: u64,
    /// The nodes' `--room-state-hz`.
    #[arg(long, default_value_t = 20)]
    pub room_state_hz: u64,
}

/// The room.
const ROOM: &str = "bench:cursors";

/// What every member's reader counts.
struct Seen {
    /// Age of each state received, µs.
    staleness: Mutex<Histogram<u64>>,
    /// `room_updates` frames received, per member.
    frames: Vec<AtomicU64>,
    /// Member updates received (entries of those frames).
    updates: AtomicU64,
    /// Counting (the moving phase).
    on: std::sync::atomic::AtomicBool,
}

impl Seen {
    /// A frame for member `i`, received at `at`; `base` is when states'
    /// `t` (µs) counts from.
    fn record(&self, i: usize, v: &Value, at: Instant, base: Instant) {
        if v["type"] != "room_updates" || !self.on.load(Ordering::Relaxed) {
            return;
        }
        let Some(updates) = v["updates"].as_array() else {
            return;
        };
        self.frames[i].fetch_add(1, Ordering::Relaxed);
        self.updates
            .fetch_add(updates.len() as u64, Ordering::Relaxed);
        let now = at.duration_since(base).as_micros() as u64;
        let mut hist = self.staleness.lock().unwrap();
        for u in updates {
            if let Some(t) = u["state"]["t"].as_u64() {
                hist.saturating_record(now.saturating_sub(t));
            }
        }
    }
}

/// Nodes' flags: the tick, the room listed.
fn node_flags(args: &CursorsArgs) -> Vec<String> {
    let listed = (args.devices + 10).to_string();
    [
        "--room-state-hz",
        &args.room_state_hz.to_string(),
        "--room-announce-max",
        &listed,
        "--room-announce-max-devices",
        &listed,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

pub async fn run(common: &Common, args: &CursorsArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.devices >= 2, "--devices needs two at least");
    procs::ensure_fds(args.devices)?;
    let mut report = Report::new("cursors");
    let mut setup = Setup::redis(common)?;
    setup.node_args = node_flags(args);
    setup.start_nodes(common, 2, None)?;
    let base = Instant::now();
    let seen = Arc::new(Seen {
        staleness: Mutex::new(latency_histogram()),
        frames: (0..args.devices).map(|_| AtomicU64::new(0)).collect(),
        updates: AtomicU64::new(0),
        on: false.into(),
    });
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let joining = Joining {
        room: ROOM,
        state: json!({"x": 0, "y": 0}),
        invisible: false,
        batch: true,
    };
    let s = seen.clone();
    eprintln!("cursors: {} devices join {ROOM} on two nodes", args.devices);
    let mut devices = members(
        &setup,
        "cur",
        args.devices,
        &joining,
        &stop_rx,
        move |i, v, at| s.record(i, v, at, base),
    )
    .await?;
    tokio::time::sleep(Duration::from_millis(500)).await;

    eprintln!("cursors: each moves at {} Hz for {} s", args.hz, args.secs);
    let mut conn = setup.redis_conn().await?;
    let commands = async |conn: &mut _| -> anyhow::Result<(u64, u64)> {
        let total = redis_info(conn, "stats", "total_commands_processed").await?;
        Ok((total.parse()?, redis_calls(conn, "evalsha").await?))
    };
    let (cmd0, eval0) = commands(&mut conn).await?;
    let (cpu0, t0) = (nodes_cpu_us(&setup), Instant::now());
    seen.on.store(true, Ordering::Relaxed);
    let movers: Vec<_> = devices
        .iter_mut()
        .map(|d| move_at(&mut d.tx, args.hz, args.secs, base))
        .collect();
    for r in futures_util::future::join_all(movers).await {
        r?;
    }
    // The last tick's batches land.
    tokio::time::sleep(Duration::from_millis(200)).await;
    seen.on.store(false, Ordering::Relaxed);
    let took = t0.elapsed().as_secs_f64();
    let cpu1 = nodes_cpu_us(&setup);
    let (cmd1, eval1) = commands(&mut conn).await?;
    leave_all(devices, stop_tx).await;
    figures(
        &mut report,
        args,
        &seen,
        took,
        (cpu0, cpu1),
        (cmd1 - cmd0, eval1 - eval0),
    );
    report.print_table();
    Ok(())
}

/// Sends a state `{"x","y","t"}` at `hz` for `secs` (`t`: µs since `base`).
async fn move_at(
    tx: &mut futures_util::stream::SplitSink<crate::client::Ws, Message>,
    hz: u64,
    secs: u64,
    base: Instant,
) -> anyhow::Result<()> {
    let mut every = tokio::time::interval(Duration::from_micros(1_000_000 / hz.max(1)));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let end = Instant::now() + Duration::from_secs(secs);
    let mut n = 0u64;
    while Instant::now() < end {
        every.tick().await;
        n += 1;
        let t = base.elapsed().as_micros() as u64;
        let frame = json!({"type": "room_state", "room": ROOM,
                           "state": {"x": n % 1000, "y": n / 1000, "t": t}});
        tx.send(Message::Text(frame.to_string().into())).await?;
    }
    Ok(())
}

/// Prints the figures of the moving phase.
fn figures(
    report: &mut Report,
    args: &CursorsArgs,
    seen: &Seen,
    took: f64,
    (cpu0, cpu1): (Option<u64>, Option<u64>),
    (commands, evalsha): (u64, u64),
) {
    let staleness = seen.staleness.lock().unwrap();
    let note = json!({"devices": args.devices, "hz": args.hz, "secs": args.secs,
                      "room_state_hz": args.room_state_hz, "updates": staleness.len()});
    report.latency("cursor_staleness", &staleness, note.clone());
    report.figure(
        "cursor_staleness_p99_ms",
        staleness.value_at_quantile(0.99) as f64 / 1000.0,
        "ms",
        json!({"target_max": 100}),
    );
    let per_member: Vec<f64> = seen
        .frames
        .iter()
        .map(|f| f.load(Ordering::Relaxed) as f64 / took)
        .collect();
    let worst = per_member.iter().cloned().fold(0.0, f64::max);
    report.figure(
        "frames_per_sec_per_device",
        per_member.iter().sum::<f64>() / per_member.len().max(1) as f64,
        "frames/s",
        json!({"worst_member": worst, "target_max": args.room_state_hz + 5}),
    );
    let updates = seen.updates.load(Ordering::Relaxed);
    if let (Some(a), Some(b)) = (cpu0, cpu1) {
        report.figure(
            "node_cpu_per_member_update",
            (b - a) as f64 / updates.max(1) as f64,
            "us",
            json!({"nodes_cpu_ms": (b - a) as f64 / 1000.0, "member_updates": updates,
                   "target_max": 1}),
        );
    }
    report.figure(
        "redis_commands_per_sec",
        commands as f64 / took,
        "commands/s",
        json!({"evalsha_per_sec": evalsha as f64 / took,
               "states_sent_per_sec": (args.devices as u64 * args.hz) as f64,
               "bound": "devices x --room-state-hz script calls, whatever --hz"}),
    );
}
