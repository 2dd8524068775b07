//! `rooms`: presence in a place, in three phases on one private Redis.
//!
//! 1. **Signal fan-out.** One room of `--members` member devices (one user
//!    each) spread over two nodes; one member sends `--rounds` signals, a
//!    pause between rounds. Latency from the send to each other member's
//!    receipt, and both nodes' CPU per delivered frame against the
//!    raw-write floor of `fanout` ([`floor`]) writing a frame of the same
//!    size to as many sockets in the same run. The nodes keep the default
//!    `--room-announce-max`: the room runs on counts, and signals go to
//!    every member either way.
//! 2. **Join/leave churn.** `--residents` members of one room (half on
//!    each node) watch devices of other users join and, `--hold-ms` later,
//!    leave, `--churn-rate` joins per second for `--churn-secs`. Latency
//!    from the `join` (or `leave`) frame sent to each resident's
//!    `room_join` (or `room_leave`), and Redis's CPU per join and leave.
//!    `--room-announce-max` is raised so that every join is announced.
//! 3. **Memory per membership.** `--memberships` devices (one user each)
//!    connect, then each joins one of `--memory-rooms` rooms with a state
//!    of `--state-bytes`; Redis's `used_memory` after the joins and both
//!    nodes' RSS 2 s after them, less before them, per membership
//!    (`--state-bytes 1024`: what one membership costs at the default state
//!    limit).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use futures_util::stream::SplitSink;
use futures_util::{SinkExt, StreamExt};
use hdrhistogram::Histogram;
use serde_json::json;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::Message;

use super::connect_many;
use super::fanout::{floor, Receipts};
use crate::client::{self, spawn_reader, Held, Ws};
use crate::report::{latency_histogram, Report};
use crate::{procs, redis_used_memory, Common, Setup};

/// Flags of `rooms`.
#[derive(Args, Debug)]
pub struct RoomsArgs {
    /// Member devices of the signalled room, over two nodes.
    #[arg(long, default_value_t = 1_000)]
    pub members: usize,
    /// Signals sent by one member.
    #[arg(long, default_value_t = 10)]
    pub rounds: usize,
    /// Resident members of the churned room.
    #[arg(long, default_value_t = 100)]
    pub residents: usize,
    /// Joins per second into the churned room (as many leaves).
    #[arg(long, default_value_t = 200)]
    pub churn_rate: u64,
    /// Seconds of churn.
    #[arg(long, default_value_t = 10)]
    pub churn_secs: u64,
    /// How long a churning device stays in the room, ms.
    #[arg(long, default_value_t = 200)]
    pub hold_ms: u64,
    /// Memberships whose Redis memory is measured (one device each).
    #[arg(long, default_value_t = 10_000)]
    pub memberships: usize,
    /// Rooms the measured memberships are spread over.
    #[arg(long, default_value_t = 100)]
    pub memory_rooms: usize,
    /// Size of each measured membership's state, serialized, in bytes
    /// (below 8: `{}`); the nodes' `--max-room-state-bytes` is 1024.
    #[arg(long, default_value_t = 0)]
    pub state_bytes: usize,
    /// Joins timed under each room policy (phase 4); 0 skips the phase.
    #[arg(long, default_value_t = 300)]
    pub join_samples: usize,
    /// The policies whose joins phase 4 times.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "open,claim,members,token,proxy"
    )]
    pub join_policies: Vec<String>,
}

/// The signalled room, the churned one, and the prefix of the measured ones.
const SIGNAL_ROOM: &str = "bench:signal";
const CHURN_ROOM: &str = "bench:churn";
const MEMORY_ROOM: &str = "bench:mem";
/// A signal frame the size of the node's, for the floor.
const FLOOR_FRAME: &str =
    r#"{"type":"signal","room":"bench:signal","user":"sm0","device":"d","data":{"round":1}}"#;
/// Handshakes (and joins) in flight at once.
const CONCURRENCY: usize = 200;
/// How long the residents may take to see the last churn.
const DRAIN: Duration = Duration::from_secs(30);
/// How long after the joins the nodes' RSS is read: the joins' frames on
/// their way to members are freed by then, and the server's jemalloc hands
/// freed pages back within about a second (its `dirty_decay_ms`). With
/// 1 KiB states, RSS right after the joins was 1.7 times what stays.
const RSS_SETTLE: Duration = Duration::from_secs(2);

/// Nodes' flags: no room-message limit in the way of the bench.
fn node_flags(announce_max: Option<usize>) -> Vec<String> {
    let mut flags = vec![
        "--max-room-messages-per-sec".to_string(),
        "10000".to_string(),
        "--max-room-devices".to_string(),
        "1000000".to_string(),
    ];
    if let Some(n) = announce_max {
        flags.extend(["--room-announce-max".to_string(), n.to_string()]);
    }
    flags
}

pub async fn run(common: &Common, args: &RoomsArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.members >= 2, "--members needs a sender and a receiver");
    procs::ensure_fds(args.members.max(args.memberships))?;
    let mut report = Report::new("rooms");
    let mut setup = Setup::redis(common)?;
    setup.node_args = node_flags(None);
    setup.start_nodes(common, 2, None)?;
    signals(common, args, &mut setup, &mut report).await?;

    setup.nodes.clear();
    setup.node_args = node_flags(Some(100_000));
    setup.start_nodes(common, 2, None)?;
    churn(args, &setup, &mut report).await?;
    memory(args, &setup, &mut report).await?;
    if args.join_samples > 0 {
        super::join_policies::run(common, args, &mut setup, &mut report).await?;
    }
    report.print_table();
    Ok(())
}

/// A member device: its writing half, and a task reading the other half.
pub(crate) struct Member {
    pub(crate) tx: SplitSink<Ws, Message>,
    pub(crate) reader: JoinHandle<()>,
}

/// How each member device joins its room.
pub(crate) struct Joining<'a> {
    /// The room.
    pub(crate) room: &'a str,
    /// Its state there.
    pub(crate) state: serde_json::Value,
    /// It turns invisible first (`{"type":"status","status":"invisible"}`),
    /// so that its membership is hidden.
    pub(crate) invisible: bool,
    /// It asks for state changes in `room_updates` batches.
    pub(crate) batch: bool,
}

impl<'a> Joining<'a> {
    /// A visible member with state `{}`.
    pub(crate) fn plain(room: &'a str) -> Self {
        Self {
            room,
            state: json!({}),
            invisible: false,
            batch: false,
        }
    }
}

/// Connects devices of users `<prefix>0` to `<prefix>{n-1}`, alternately
/// to the setup's nodes; returns them in that order.
async fn connect_spread(setup: &Setup, prefix: &str, n: usize) -> anyhow::Result<Vec<Ws>> {
    let nodes = setup.nodes.len();
    let mut sockets = Vec::with_capacity(n);
    for (k, node) in setup.nodes.iter().enumerate() {
        let users: Vec<String> = (k..n)
            .step_by(nodes)
            .map(|i| format!("{prefix}{i}"))
            .collect();
        let (ws, _) = connect_many(node.addr, &setup.sources, users, CONCURRENCY).await?;
        sockets.extend(
            ws.into_iter()
                .enumerate()
                .map(|(j, ws)| (k + j * nodes, ws)),
        );
    }
    sockets.sort_by_key(|(i, _)| *i);
    Ok(sockets.into_iter().map(|(_, ws)| ws).collect())
}

/// Connects `users` alternately to the setup's two nodes, joins each as
/// `joining` says (in parallel, like `fanout`'s watches) and hands every
/// frame a member reads afterwards to `on_frame(member, frame, at)`.
pub(crate) async fn members<F>(
    setup: &Setup,
    prefix: &str,
    n: usize,
    joining: &Joining<'_>,
    stop: &tokio::sync::watch::Receiver<bool>,
    on_frame: F,
) -> anyhow::Result<Vec<Member>>
where
    F: Fn(usize, &serde_json::Value, Instant) + Send + Sync + 'static,
{
    let on_frame = Arc::new(on_frame);
    let sockets = connect_spread(setup, prefix, n).await?;
    let sem = Arc::new(Semaphore::new(CONCURRENCY));
    let mut tasks = Vec::with_capacity(n);
    for (i, mut ws) in sockets.into_iter().enumerate() {
        let permit = sem.clone().acquire_owned().await?;
        let (room, state) = (joining.room.to_string(), joining.state.clone());
        let (invisible, stop, on_frame) = (joining.invisible, stop.clone(), on_frame.clone());
        let batch = joining.batch;
        tasks.push(tokio::spawn(async move {
            if invisible {
                let frame = json!({"type": "status", "status": "invisible"});
                ws.send(Message::Text(frame.to_string().into())).await?;
            }
            client::join_as(&mut ws, &room, &state, batch).await?;
            drop(permit);
            let (tx, rx) = ws.split();
            let reader = spawn_reader(rx, stop, move |v, at| on_frame(i, v, at));
            anyhow::Ok(Member { tx, reader })
        }));
    }
    let mut out = Vec::with_capacity(n);
    for t in tasks {
        out.push(t.await??);
    }
    Ok(out)
}

/// How long Redis's idle CPU is sampled after the churn.
const IDLE: Duration = Duration::from_secs(2);

/// CPU time `cpu` (µs so far) grows by over `took` of doing nothing.
async fn idle_cpu_us(took: Duration, cpu: impl Fn() -> Option<u64>) -> Option<u64> {
    let before = cpu();
    tokio::time::sleep(took).await;
    Some(cpu()? - before?)
}

/// Closes every member cleanly (so that the nodes remove their leases and
/// memberships at once, not at their deadlines during a later phase) and
/// waits for the server's answers, briefly; then stops what still reads.
pub(crate) async fn leave_all(members: Vec<Member>, stop: tokio::sync::watch::Sender<bool>) {
    let mut readers = Vec::with_capacity(members.len());
    for mut m in members {
        let _ = m.tx.close().await;
        readers.push(m.reader);
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        for r in &mut readers {
            let _ = r.await;
        }
    })
    .await;
    let _ = stop.send(true);
    // The nodes' departures reach Redis.
    tokio::time::sleep(Duration::from_millis(500)).await;
}

/// The sum over both nodes of `of(pid)` (CPU time, RSS), when the bench
/// spawned them.
fn nodes_total(setup: &Setup, of: fn(u32) -> Option<u64>) -> Option<u64> {
    setup.nodes.iter().map(|n| n.pid().and_then(of)).sum()
}

/// Both nodes' CPU time so far (user + system), µs.
pub(crate) fn nodes_cpu_us(setup: &Setup) -> Option<u64> {
    nodes_total(setup, procs::cpu_us)
}

/// Phase 1: one member signals the others.
async fn signals(
    common: &Common,
    args: &RoomsArgs,
    setup: &mut Setup,
    report: &mut Report,
) -> anyhow::Result<()> {
    eprintln!(
        "rooms: {} members of {SIGNAL_ROOM} on two nodes",
        args.members
    );
    let receipts = Arc::new(Receipts::new());
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let r = receipts.clone();
    let mut members = members(
        setup,
        "sm",
        args.members,
        &Joining::plain(SIGNAL_ROOM),
        &stop_rx,
        move |_, v, at| {
            if v["type"] == "signal" {
                r.record(at);
            }
        },
    )
    .await?;
    // Every member's `room` frame is in; let the joins' own frames land.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let others = args.members - 1;
    eprintln!(
        "rooms: {} signals from sm0 to {others} members",
        args.rounds
    );
    let (cpu0, t0) = (nodes_cpu_us(setup), Instant::now());
    for round in 0..args.rounds {
        receipts.begin();
        let frame = json!({"type": "signal", "room": SIGNAL_ROOM, "data": {"round": round}});
        members[0]
            .tx
            .send(Message::Text(frame.to_string().into()))
            .await?;
        receipts.end(others).await;
    }
    let cpu1 = nodes_cpu_us(setup);
    // What the nodes spend on their own (pings, refresh batches, passes)
    // over as long, with the members in the room and no signal.
    let idle = idle_cpu_us(t0.elapsed(), || nodes_cpu_us(setup)).await;
    leave_all(members, stop_tx).await;
    let delivered = receipts.hist.lock().unwrap().len();
    report.latency(
        "signal_to_member",
        &receipts.hist.lock().unwrap(),
        json!({"members": args.members, "nodes": 2, "rounds": args.rounds,
               "incomplete_rounds": receipts.incomplete()}),
    );
    report.latency(
        "signal_to_last_member",
        &receipts.lasts.lock().unwrap(),
        json!({}),
    );
    let node_cpu = match (cpu0, cpu1) {
        (Some(a), Some(b)) => Some((b - a) as f64 / delivered.max(1) as f64),
        _ => None,
    };
    if let (Some(per), Some(a), Some(b)) = (node_cpu, cpu0, cpu1) {
        report.figure(
            "node_cpu_per_signal_delivery",
            per,
            "us",
            json!({"nodes_cpu_ms": (b - a) as f64 / 1000.0, "deliveries": delivered,
                   "idle_nodes_cpu_ms_as_long": idle.map(|i| i as f64 / 1000.0)}),
        );
    }
    // The members' sockets are closed: the floor may use the descriptors.
    setup.nodes.clear();
    let floor = floor(others, args.rounds, FLOOR_FRAME, Duration::ZERO).await?;
    let floor_per = floor.cpu_us as f64 / (floor.watchers * args.rounds).max(1) as f64;
    report.latency(
        "floor_frame_to_member",
        &floor.receipts.hist.lock().unwrap(),
        json!({"watchers": floor.watchers, "rounds": args.rounds,
               "incomplete_rounds": floor.receipts.incomplete(),
               "what": "the same frame written to raw sockets from 2 threads in a loop"}),
    );
    report.figure(
        "floor_cpu_per_write",
        floor_per,
        "us",
        json!({"compare": "node_cpu_per_signal_delivery"}),
    );
    if let Some(per) = node_cpu {
        report.figure(
            "node_cpu_over_floor_cpu",
            per / floor_per.max(0.001),
            "ratio",
            json!({"node_us": per, "floor_us": floor_per}),
        );
    }
    if let Some(dir) = &common.svg {
        crate::plot::latency(
            &dir.join("rooms-signal-latency.svg"),
            &format!(
                "rooms: one signal -> each of {} members on two nodes",
                others
            ),
            &[
                (
                    "presence-server: signal sent -> receipt",
                    &receipts.hist.lock().unwrap(),
                ),
                (
                    "floor: raw writes from 2 threads, write -> receipt",
                    &floor.receipts.hist.lock().unwrap(),
                ),
            ],
        )?;
    }
    anyhow::ensure!(
        receipts.incomplete() == 0 && floor.receipts.incomplete() == 0,
        "{} signals (and {} floor rounds) did not reach every member",
        receipts.incomplete(),
        floor.receipts.incomplete()
    );
    Ok(())
}

/// When each churning device last sent its join and its leave.
type Sent = Vec<Mutex<[Option<Instant>; 2]>>;

/// What the residents saw of the churn.
struct Seen {
    /// Join (0) and leave (1) frames sent to receipt, µs.
    hist: [Mutex<Histogram<u64>>; 2],
    /// Receipts of each kind.
    count: [AtomicUsize; 2],
    /// `room_join` without `first:true`, `room_leave` without `last:true`
    /// (every churning device is its user's only one).
    odd: AtomicUsize,
}

/// Phase 2: devices join and leave a room of residents.
async fn churn(args: &RoomsArgs, setup: &Setup, report: &mut Report) -> anyhow::Result<()> {
    let interval = Duration::from_secs_f64(1.0 / args.churn_rate.max(1) as f64);
    let hold = Duration::from_millis(args.hold_ms);
    // A device is back in the pool well after its leave.
    let pool = ((hold + Duration::from_millis(500)).as_secs_f64() / interval.as_secs_f64()).ceil()
        as usize;
    let joins = (args.churn_rate * args.churn_secs) as usize;
    eprintln!(
        "rooms: {} residents of {CHURN_ROOM}, {} joins/s for {} s from {pool} devices",
        args.residents, args.churn_rate, args.churn_secs
    );
    let sent: Arc<Sent> = Arc::new((0..pool).map(|_| Mutex::new([None, None])).collect());
    let seen = Arc::new(Seen {
        hist: [
            Mutex::new(latency_histogram()),
            Mutex::new(latency_histogram()),
        ],
        count: [AtomicUsize::new(0), AtomicUsize::new(0)],
        odd: AtomicUsize::new(0),
    });
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let (s, sn) = (sent.clone(), seen.clone());
    let residents = members(
        setup,
        "cr",
        args.residents,
        &Joining::plain(CHURN_ROOM),
        &stop_rx,
        move |_, v, at| {
            let (kind, flag) = match v["type"].as_str() {
                Some("room_join") => (0, "first"),
                Some("room_leave") => (1, "last"),
                _ => return,
            };
            let Some(i) = v["user"]
                .as_str()
                .and_then(|u| u.strip_prefix("cc"))
                .and_then(|i| i.parse::<usize>().ok())
            else {
                return;
            };
            if v[flag] != true {
                sn.odd.fetch_add(1, Ordering::Relaxed);
            }
            if let Some(t) = s.get(i).and_then(|m| m.lock().unwrap()[kind]) {
                let lat = at.saturating_duration_since(t).as_micros() as u64;
                sn.hist[kind].lock().unwrap().saturating_record(lat.max(1));
            }
            sn.count[kind].fetch_add(1, Ordering::Release);
        },
    )
    .await?;
    // The churning devices, connected (not joined) ahead, alternately on
    // the two nodes; they read and drop whatever reaches them.
    let mut txs = Vec::with_capacity(pool);
    let mut readers = Vec::with_capacity(pool);
    for ws in connect_spread(setup, "cc", pool).await? {
        let (tx, rx) = ws.split();
        txs.push(Arc::new(tokio::sync::Mutex::new(tx)));
        readers.push(spawn_reader(rx, stop_rx.clone(), |_, _| {}));
    }

    let redis_pid = setup.local_redis.as_ref().map(|r| r.pid());
    let cpu0 = redis_pid.and_then(procs::cpu_us);
    let t0 = Instant::now();
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut churners = Vec::with_capacity(joins);
    for k in 0..joins {
        tick.tick().await;
        let i = k % pool;
        let (tx, sent) = (txs[i].clone(), sent.clone());
        churners.push(tokio::spawn(async move {
            let mut tx = tx.lock().await;
            for (kind, frame) in [
                json!({"type": "join", "room": CHURN_ROOM, "state": {}}),
                json!({"type": "leave", "room": CHURN_ROOM}),
            ]
            .into_iter()
            .enumerate()
            {
                if kind == 1 {
                    tokio::time::sleep(hold).await;
                }
                sent[i].lock().unwrap()[kind] = Some(Instant::now());
                tx.send(Message::Text(frame.to_string().into())).await?;
            }
            anyhow::Ok(())
        }));
    }
    for c in churners {
        c.await??;
    }
    let want = joins * args.residents;
    let t = Instant::now();
    while seen.count[1].load(Ordering::Acquire) < want && t.elapsed() < DRAIN {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (cpu1, took) = (redis_pid.and_then(procs::cpu_us), t0.elapsed());
    // What Redis spends meanwhile on the nodes' own work (refresh batches,
    // the room deadline pass) with nobody churning.
    let idle = idle_cpu_us(IDLE, || redis_pid.and_then(procs::cpu_us)).await;
    let churners = txs.into_iter().zip(readers).filter_map(|(tx, reader)| {
        let tx = Arc::into_inner(tx)?.into_inner();
        Some(Member { tx, reader })
    });
    leave_all(residents.into_iter().chain(churners).collect(), stop_tx).await;
    let got = [0, 1].map(|k| seen.count[k].load(Ordering::Acquire));
    for (kind, name) in [(0, "join_to_member"), (1, "leave_to_member")] {
        report.latency(
            name,
            &seen.hist[kind].lock().unwrap(),
            json!({"residents": args.residents, "rate_per_s": args.churn_rate,
                   "secs": args.churn_secs, "hold_ms": args.hold_ms,
                   "expected": want, "received": got[kind]}),
        );
    }
    if let (Some(a), Some(b)) = (cpu0, cpu1) {
        report.figure(
            "redis_cpu_per_join_or_leave",
            (b - a) as f64 / (2 * joins).max(1) as f64,
            "us",
            json!({"redis_cpu_ms": (b - a) as f64 / 1000.0, "joins": joins, "leaves": joins,
                   "redis_cpu_share": (b - a) as f64 / took.as_micros().max(1) as f64,
                   "redis_idle_cpu_share": idle.map(|i| i as f64 / IDLE.as_micros() as f64)}),
        );
    }
    anyhow::ensure!(
        got == [want, want],
        "the residents saw {} joins and {} leaves of {want} each",
        got[0],
        got[1]
    );
    anyhow::ensure!(
        seen.odd.load(Ordering::Relaxed) == 0,
        "{} joins or leaves of a single-device user came without first/last",
        seen.odd.load(Ordering::Relaxed)
    );
    Ok(())
}

/// Phase 3: Redis and node memory per membership.
async fn memory(args: &RoomsArgs, setup: &Setup, report: &mut Report) -> anyhow::Result<()> {
    let rooms = args.memory_rooms.max(1);
    let state = client::state_of(args.state_bytes);
    eprintln!(
        "rooms: {} devices joining {rooms} rooms with {} B states, memory",
        args.memberships,
        state.to_string().len()
    );
    let mut redis = setup.redis_conn().await?;
    let sockets = connect_spread(setup, "mm", args.memberships).await?;
    let before = redis_used_memory(&mut redis).await?;
    let rss_before = nodes_total(setup, procs::rss_bytes);
    let sem = Arc::new(Semaphore::new(CONCURRENCY));
    let mut tasks = Vec::with_capacity(sockets.len());
    for (i, mut ws) in sockets.into_iter().enumerate() {
        let permit = sem.clone().acquire_owned().await?;
        let state = state.clone();
        tasks.push(tokio::spawn(async move {
            let room = format!("{MEMORY_ROOM}:{}", i % rooms);
            client::join_with(&mut ws, &room, &state).await?;
            drop(permit);
            anyhow::Ok(Held::new(ws))
        }));
    }
    let mut held = Vec::with_capacity(tasks.len());
    for t in tasks {
        held.push(t.await??);
    }
    let after = redis_used_memory(&mut redis).await?;
    let rss_at_once = nodes_total(setup, procs::rss_bytes);
    tokio::time::sleep(RSS_SETTLE).await;
    let rss_after = nodes_total(setup, procs::rss_bytes);
    let per = |a: u64, b: u64| b.saturating_sub(a) as f64 / args.memberships.max(1) as f64;
    let state_bytes = state.to_string().len();
    report.figure(
        "redis_bytes_per_membership",
        per(before, after),
        "B",
        json!({"memberships": args.memberships, "rooms": rooms,
               "devices": args.memberships, "state_bytes": state_bytes,
               "used_memory_before": before, "used_memory_after": after}),
    );
    if let (Some(a), Some(b)) = (rss_before, rss_after) {
        report.figure(
            "node_bytes_per_membership",
            per(a, b),
            "B",
            json!({"memberships": args.memberships, "nodes": setup.nodes.len(),
                   "state_bytes": state_bytes, "rss_before": a, "rss_after": b,
                   "rss_right_after_the_joins": rss_at_once,
                   "what": "both nodes' RSS 2 s after the joins less before them"}),
        );
    }
    drop(held);
    Ok(())
}
