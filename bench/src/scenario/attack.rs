//! `rooms-attack`: issue 37's target. While one address attacks at its
//! limits, another client's presence reads keep their p99 under 50 ms,
//! `/healthz` stays `200`, and Redis memory grows by less than 50 MB.
//!
//! One private Redis and two nodes, A and B, with the server's default
//! limits: the nodes the bench starts for its other scenarios have the HTTP
//! read rate lifted, here it is the default again (the WebSockets per
//! address stay uncapped: the members stand for many clients on a few
//! addresses, and the attacker holds only a few). The attacker's requests
//! and WebSockets come from one loopback address, a probe's from another,
//! the rooms' members from the `--sources` addresses (127.0.0.2 onwards);
//! the attacker is the address after those, the probe the next.
//!
//! Beside every attack the probe reads `GET /api/presence/probe-user` from
//! node A every 50 ms and `GET /healthz` every 500 ms, and Redis's
//! `used_memory` is sampled every 100 ms. Each phase reports the probe's
//! latency and non-200 answers, the non-200 `/healthz`, Redis's memory
//! peak less its value just before the attack, Redis's and node A's CPU
//! share over the attack, and the attack's statuses (200/429/503/other).
//!
//! 1. **page**: a room of `--page-devices` devices (one user each) with
//!    `--state-bytes` states; `--bursts` bursts of `--burst-size`
//!    concurrent `GET /api/rooms/{room}?limit=1` spread over
//!    `--burst-secs`, then the same with `limit=1000`.
//! 2. **hidden**: a room of `--hidden-members` invisible members (each sets
//!    its status, then joins with a `--state-bytes` state); 7
//!    `POST /api/rooms/query` in a row, each naming the room 1,000 times
//!    (the review's attack), then for `--flood-secs` as many as the read
//!    budget lets through (16 in flight per node, a refused one sent again
//!    10 ms later).
//!
//!    The page and hidden attacks go to the first `--attack-nodes` nodes in
//!    turn: the read limits are per node, and an attacker uses them all.
//! 3. **crossing** ([`crossing`]): a room of `--residents` users at
//!    `--announce-max`, `--resident-devices` devices each on both nodes;
//!    `--churners` users of the attacker (WebSockets on node B) join and
//!    leave twice a second for `--crossing-secs`, the room crossing the
//!    list limit once (`crossing`), then as many residents with them, the
//!    room crossing both ways each cycle (`crossing_both`). Besides the
//!    common figures: each node's shared room reads, the `room` frames the
//!    residents got, and the resident views that did not end equal to the
//!    room (the run fails after its table when there is one).

mod crossing;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use hdrhistogram::Histogram;
use serde_json::{json, Value};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::rooms::{leave_all, members, Joining, Member};
use crate::client::{self, state_of, Held};
use crate::report::{latency_histogram, Report};
use crate::{procs, redis_used_memory, Common, Setup};

/// Flags of `rooms-attack`.
#[derive(Args, Debug)]
pub struct AttackArgs {
    /// Member devices (one user each) of the paged room.
    #[arg(long, default_value_t = 2_000)]
    pub page_devices: usize,
    /// Size of each member's state in the paged and the hidden room, bytes.
    #[arg(long, default_value_t = 1_024)]
    pub state_bytes: usize,
    /// Bursts of concurrent room reads, for each limit.
    #[arg(long, default_value_t = 10)]
    pub bursts: usize,
    /// Concurrent reads in a burst.
    #[arg(long, default_value_t = 200)]
    pub burst_size: usize,
    /// Seconds the bursts are spread over.
    #[arg(long, default_value_t = 16)]
    pub burst_secs: u64,
    /// Invisible members of the queried room.
    #[arg(long, default_value_t = 1_000)]
    pub hidden_members: usize,
    /// Seconds of queries after the first seven.
    #[arg(long, default_value_t = 10)]
    pub flood_secs: u64,
    /// Nodes the HTTP attacks go to (1: node A only, 2: A and B in turn).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=2))]
    pub attack_nodes: u64,
    /// Resident users of the crossed room.
    #[arg(long, default_value_t = 100)]
    pub residents: usize,
    /// Devices of each resident user.
    #[arg(long, default_value_t = 4)]
    pub resident_devices: usize,
    /// The attacker's users joining and leaving (and, in `crossing_both`,
    /// resident users leaving and coming back).
    #[arg(long, default_value_t = 11)]
    pub churners: usize,
    /// Seconds of each crossing variant.
    #[arg(long, default_value_t = 15)]
    pub crossing_secs: u64,
    /// The nodes' `--room-announce-max` (the server's default: 100).
    #[arg(long, default_value_t = 100)]
    pub announce_max: usize,
}

/// The paged room.
const PAGE_ROOM: &str = "attack:page";
/// The room of invisible members.
const HIDDEN_ROOM: &str = "attack:hidden";
/// The user the probe reads (one device of it is connected to node B).
const PROBE_USER: &str = "probe-user";
/// The server's default `--http-reads-per-sec`, which the bench's node
/// environment lifts for the other scenarios.
const HTTP_READS_PER_SEC: &str = "2000";
/// The server's default `--http-reads-in-flight`: the flood keeps this many
/// queries in flight per node.
const READS_IN_FLIGHT: usize = 16;
/// The review's hidden-room attack: this many queries in a row...
const QUERIES_IN_A_ROW: usize = 7;
/// ... each naming the room this many times (the most a query may name).
const NAMES_PER_QUERY: usize = 1_000;
/// How long the flood waits after a `429` before it sends again.
const RETRY_REFUSED: Duration = Duration::from_millis(10);
/// How often the probe reads presence.
const PROBE_EVERY: Duration = Duration::from_millis(50);
/// How often the probe reads `/healthz`.
const HEALTH_EVERY: Duration = Duration::from_millis(500);
/// How often Redis's `used_memory` is sampled.
const MEMORY_EVERY: Duration = Duration::from_millis(100);
/// The bench gives up on an HTTP answer after this long (the server's own
/// deadline is 1.5 s).
const HTTP_TIMEOUT: Duration = Duration::from_secs(10);

/// Answers to a set of HTTP requests, by status.
#[derive(Default)]
struct Statuses {
    /// 200, 429, 503, anything else (a transport error or timeout too).
    counts: [AtomicU64; 4],
}

impl Statuses {
    /// Sends `req` and counts its answer; the answer when it is a 200.
    async fn send(&self, req: reqwest::RequestBuilder) -> Option<reqwest::Response> {
        let resp = req.send().await.ok();
        let code = resp.as_ref().map(|r| r.status().as_u16());
        let slot = match code {
            Some(200) => 0,
            Some(429) => 1,
            Some(503) => 2,
            _ => 3,
        };
        self.counts[slot].fetch_add(1, Ordering::Relaxed);
        resp.filter(|_| slot == 0)
    }

    /// [`Statuses::send`], the body read to its end.
    async fn fetch(&self, req: reqwest::RequestBuilder) -> bool {
        match self.send(req).await {
            Some(resp) => resp.bytes().await.is_ok(),
            None => false,
        }
    }

    /// The counts so far: 200, 429, 503, other.
    fn get(&self) -> [u64; 4] {
        self.counts.each_ref().map(|c| c.load(Ordering::Relaxed))
    }
}

/// What every phase shares.
struct Ctx {
    /// Redis and the two nodes.
    setup: Setup,
    /// HTTP from the attacker's address.
    attacker: reqwest::Client,
    /// The attacker's address, for its WebSockets.
    attacker_ip: IpAddr,
    /// HTTP from the probe's address.
    probe: reqwest::Client,
    /// Where the HTTP attacks go.
    targets: Vec<SocketAddr>,
}

impl Ctx {
    /// Node A (0) or B (1).
    fn node(&self, i: usize) -> SocketAddr {
        self.setup.nodes[i].addr
    }
}

/// An HTTP client whose connections come from `ip`.
fn http_from(ip: IpAddr) -> anyhow::Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .local_address(ip)
        .timeout(HTTP_TIMEOUT)
        .build()?)
}

pub async fn run(common: &Common, args: &AttackArgs) -> anyhow::Result<()> {
    let cross_devices = args.residents * args.resident_devices;
    procs::ensure_fds(
        args.page_devices
            .max(args.hidden_members)
            .max(cross_devices)
            + 500,
    )?;
    // A room in counts mode lists again a tenth (at least one) below.
    let relist_at = args
        .announce_max
        .saturating_sub((args.announce_max / 10).max(1));
    anyhow::ensure!(
        args.residents + args.churners > args.announce_max
            && args.residents.saturating_sub(args.churners) <= relist_at,
        "--residents {} and --churners {} do not cross --announce-max {} (up past it, down to {relist_at})",
        args.residents,
        args.churners,
        args.announce_max
    );
    // The members' addresses are 127.0.0.2 .. 127.0.0.{1 + sources}.
    let used = common.sources.clamp(1, 250);
    anyhow::ensure!(
        used <= 248,
        "--sources leaves no address for the attacker and the probe"
    );
    let attacker_ip = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2 + used as u8));
    let probe_ip = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 3 + used as u8));

    let mut setup = Setup::redis(common)?;
    setup.node_args = vec![
        "--http-reads-per-sec".into(),
        HTTP_READS_PER_SEC.into(),
        "--room-announce-max".into(),
        args.announce_max.to_string(),
    ];
    setup.start_nodes(common, 2, None)?;
    let targets = setup.nodes[..args.attack_nodes as usize]
        .iter()
        .map(|n| n.addr)
        .collect();
    let ctx = Ctx {
        attacker: http_from(attacker_ip)?,
        attacker_ip,
        probe: http_from(probe_ip)?,
        targets,
        setup,
    };
    let probe_device = client::connect(ctx.node(1), probe_ip, PROBE_USER, "d").await?;
    let _probe_device = Held::new(probe_device);
    eprintln!("rooms-attack: attacker {attacker_ip}, probe {probe_ip}");
    let mut report = Report::new("rooms-attack");
    page(&ctx, args, &mut report).await?;
    let shown = hidden(&ctx, args, &mut report).await?;
    let stale = crossing::crossing(&ctx, args, &mut report).await?;
    report.print_table();
    for (name, node) in ["A", "B"].iter().zip(&ctx.setup.nodes) {
        for line in node.warnings() {
            // Every node started with development auth says so.
            if !line.contains("--auth dev") {
                eprintln!("rooms-attack: node {name}: {line}");
            }
        }
    }
    anyhow::ensure!(
        shown == 0 && stale == 0,
        "invisible members were counted {shown} times; {stale} resident views did not end \
         equal to the room"
    );
    Ok(())
}

/// The probe's answers.
struct Probe {
    /// Latency of each presence read that answered 200, µs.
    reads: Mutex<Histogram<u64>>,
    /// Statuses of the presence reads.
    read_statuses: Statuses,
    /// Statuses of `/healthz`.
    health: Statuses,
}

/// What runs beside one attack: the probe, and Redis's memory sampled.
struct Monitor {
    /// Stops the probe and the sampler.
    stop: watch::Sender<bool>,
    /// The probe's reads, its health checks and the memory sampler.
    tasks: Vec<JoinHandle<()>>,
    /// What the probe got.
    probe: Arc<Probe>,
    /// Redis's `used_memory` just before the attack, and its peak since.
    memory_before: u64,
    memory_peak: Arc<AtomicU64>,
    /// Redis's and node A's CPU time at the start, µs.
    cpu: [Option<u64>; 2],
    /// When the attack started, for the CPU shares.
    started: Instant,
}

/// Redis's and node A's CPU time so far, µs, when the bench started them.
fn cpu_now(setup: &Setup) -> [Option<u64>; 2] {
    let redis = setup.local_redis.as_ref().map(|r| r.pid());
    [redis, setup.nodes[0].pid()].map(|pid| pid.and_then(procs::cpu_us))
}

/// Calls `each` every `every` until `stop` fires; waits for what it started.
fn every<F, Fut>(every: Duration, mut stop: watch::Receiver<bool>, each: F) -> JoinHandle<()>
where
    F: Fn() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        let mut started = Vec::new();
        loop {
            tokio::select! {
                _ = tick.tick() => started.push(tokio::spawn(each())),
                _ = stop.changed() => break,
            }
        }
        for t in started {
            let _ = t.await;
        }
    })
}

impl Monitor {
    /// Reads Redis's memory, then starts the probe and the sampler.
    async fn start(ctx: &Ctx) -> anyhow::Result<Self> {
        let mut redis = ctx.setup.redis_conn().await?;
        let memory_before = redis_used_memory(&mut redis).await?;
        let memory_peak = Arc::new(AtomicU64::new(memory_before));
        let probe = Arc::new(Probe {
            reads: Mutex::new(latency_histogram()),
            read_statuses: Statuses::default(),
            health: Statuses::default(),
        });
        let (stop, stop_rx) = watch::channel(false);
        let a = ctx.node(0);
        let (p, http) = (probe.clone(), ctx.probe.clone());
        let reads = every(PROBE_EVERY, stop_rx.clone(), move || {
            let (p, req) = (
                p.clone(),
                http.get(format!("http://{a}/api/presence/{PROBE_USER}")),
            );
            async move {
                let t = Instant::now();
                if p.read_statuses.fetch(req).await {
                    let us = t.elapsed().as_micros() as u64;
                    p.reads.lock().unwrap().saturating_record(us.max(1));
                }
            }
        });
        let (p, http) = (probe.clone(), ctx.probe.clone());
        let health = every(HEALTH_EVERY, stop_rx.clone(), move || {
            let (p, req) = (p.clone(), http.get(format!("http://{a}/healthz")));
            async move {
                p.health.fetch(req).await;
            }
        });
        let peak = memory_peak.clone();
        let memory = every(MEMORY_EVERY, stop_rx, move || {
            let (peak, mut redis) = (peak.clone(), redis.clone());
            async move {
                if let Ok(m) = redis_used_memory(&mut redis).await {
                    peak.fetch_max(m, Ordering::Relaxed);
                }
            }
        });
        Ok(Self {
            stop,
            tasks: vec![reads, health, memory],
            probe,
            memory_before,
            memory_peak,
            cpu: cpu_now(&ctx.setup),
            started: Instant::now(),
        })
    }

    /// Stops the probe and reports the phase's common figures, and the
    /// attack's statuses when it was over HTTP.
    async fn finish(
        self,
        ctx: &Ctx,
        report: &mut Report,
        phase: &str,
        attack: Option<&Statuses>,
        params: Value,
    ) {
        let (cpu, took) = (cpu_now(&ctx.setup), self.started.elapsed());
        let _ = self.stop.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
        let mut fig = |name: &str, value: f64, unit: &str, mut extra: Value| {
            extra["phase"] = json!(phase);
            report.figure(&format!("{phase}_{name}"), value, unit, extra);
        };
        let (p, count) = (&self.probe, |s: &Statuses| s.get().iter().sum::<u64>());
        let refused = count(&p.read_statuses) - p.read_statuses.get()[0];
        fig(
            "probe_non_200",
            refused as f64,
            "reads",
            json!({"target_max": 0}),
        );
        let unhealthy = count(&p.health) - p.health.get()[0];
        fig(
            "healthz_non_200",
            unhealthy as f64,
            "checks",
            json!({"checks": count(&p.health), "target_max": 0}),
        );
        let peak = self.memory_peak.load(Ordering::Relaxed);
        fig(
            "redis_memory_growth",
            peak.saturating_sub(self.memory_before) as f64 / 1e6,
            "MB",
            json!({"used_memory_before": self.memory_before, "used_memory_peak": peak,
                   "target_max": 50}),
        );
        for (k, name) in [(0, "redis_cpu_share"), (1, "node_a_cpu_share")] {
            if let (Some(a), Some(b)) = (self.cpu[k], cpu[k]) {
                let share = (b - a) as f64 / took.as_micros().max(1) as f64;
                fig(
                    name,
                    share,
                    "cores",
                    json!({"cpu_ms": (b - a) / 1000, "secs": took.as_secs_f64()}),
                );
            }
        }
        let extra = json!({"phase": phase, "params": params, "target_max": 50,
                           "target": "p99 under 50 ms", "statuses": p.read_statuses.get()});
        report.latency(
            &format!("{phase}_probe_read"),
            &p.reads.lock().unwrap(),
            extra,
        );
        if let Some(attack) = attack {
            let kinds = ["200", "429", "503", "other"];
            let counts: Vec<(&str, u64)> = kinds.into_iter().zip(attack.get()).collect();
            let extra = json!({"phase": phase, "from": "the attacker's address"});
            report.counts(&format!("{phase}_attack"), &counts, "requests", extra);
        }
    }
}

/// A room of `n` member devices (users `<prefix>0` ..) spread over both
/// nodes, each with a `--state-bytes` state, and invisible first if
/// `invisible`; and what stops their readers.
async fn room_of(
    ctx: &Ctx,
    prefix: &str,
    n: usize,
    room: &str,
    args: &AttackArgs,
    invisible: bool,
) -> anyhow::Result<(Vec<Member>, watch::Sender<bool>)> {
    let (stop, stop_rx) = watch::channel(false);
    let joining = Joining {
        room,
        state: state_of(args.state_bytes),
        invisible,
        batch: false,
    };
    let members = members(&ctx.setup, prefix, n, &joining, &stop_rx, |_, _, _| {}).await?;
    Ok((members, stop))
}

/// How long the control phase probes with no attack.
const CONTROL: Duration = Duration::from_secs(8);

/// Phase 1: the control (no attack), then bursts of concurrent room reads,
/// `limit=1` then `limit=1000`.
async fn page(ctx: &Ctx, args: &AttackArgs, report: &mut Report) -> anyhow::Result<()> {
    eprintln!(
        "rooms-attack: page: {} devices in {PAGE_ROOM} with {} B states",
        args.page_devices, args.state_bytes
    );
    let (room, stop) = room_of(ctx, "pg", args.page_devices, PAGE_ROOM, args, false).await?;
    // The control: the probe alone beside the same room, no attack.
    eprintln!("rooms-attack: control: the probe alone for {CONTROL:?}");
    let monitor = Monitor::start(ctx).await?;
    tokio::time::sleep(CONTROL).await;
    let params = json!({"devices": args.page_devices, "secs": CONTROL.as_secs()});
    monitor.finish(ctx, report, "control", None, params).await;
    let every = Duration::from_secs(args.burst_secs) / args.bursts.max(1) as u32;
    for limit in [1, 1_000] {
        eprintln!(
            "rooms-attack: page: {} bursts of {} reads with limit={limit}",
            args.bursts, args.burst_size
        );
        let monitor = Monitor::start(ctx).await?;
        let statuses = Arc::new(Statuses::default());
        let mut tick = tokio::time::interval(every);
        let mut reads = Vec::with_capacity(args.bursts * args.burst_size);
        for _ in 0..args.bursts {
            tick.tick().await;
            for i in 0..args.burst_size {
                let node = ctx.targets[i % ctx.targets.len()];
                let req = ctx
                    .attacker
                    .get(format!("http://{node}/api/rooms/{PAGE_ROOM}?limit={limit}"));
                let statuses = statuses.clone();
                reads.push(tokio::spawn(async move { statuses.fetch(req).await }));
            }
        }
        // The last burst has its share of the time too.
        tick.tick().await;
        for r in reads {
            r.await?;
        }
        let params = json!({"devices": args.page_devices, "state_bytes": args.state_bytes,
                            "bursts": args.bursts, "burst_size": args.burst_size,
                            "burst_secs": args.burst_secs, "limit": limit,
                            "attack_nodes": args.attack_nodes});
        let phase = format!("page_limit{limit}");
        monitor
            .finish(ctx, report, &phase, Some(&statuses), params)
            .await;
    }
    leave_all(room, stop).await;
    Ok(())
}

/// Phase 2: counts queries naming a room of invisible members. Returns how
/// many of them the first seven queries counted (none may be).
async fn hidden(ctx: &Ctx, args: &AttackArgs, report: &mut Report) -> anyhow::Result<u64> {
    eprintln!(
        "rooms-attack: hidden: {} invisible members in {HIDDEN_ROOM}",
        args.hidden_members
    );
    let (room, stop) = room_of(ctx, "hd", args.hidden_members, HIDDEN_ROOM, args, true).await?;
    let body = Arc::new(json!({ "rooms": vec![HIDDEN_ROOM; NAMES_PER_QUERY] }));
    let query = &move |i: usize| {
        let node = ctx.targets[i % ctx.targets.len()];
        ctx.attacker
            .post(format!("http://{node}/api/rooms/query"))
            .json(&*body)
    };
    let params = json!({"hidden_members": args.hidden_members, "state_bytes": args.state_bytes,
                        "names_per_query": NAMES_PER_QUERY, "attack_nodes": args.attack_nodes});

    let monitor = Monitor::start(ctx).await?;
    let statuses = Statuses::default();
    let mut shown = 0;
    for i in 0..QUERIES_IN_A_ROW {
        if let Some(resp) = statuses.send(query(i)).await {
            let v: Value = resp.json().await?;
            shown += v["rooms"][0]["users"].as_u64().unwrap_or(0);
        }
    }
    let mut seven = params.clone();
    seven["queries"] = json!(QUERIES_IN_A_ROW);
    monitor
        .finish(ctx, report, "hidden_in_a_row", Some(&statuses), seven)
        .await;
    let extra = json!({"phase": "hidden_in_a_row", "target_max": 0});
    report.figure("hidden_members_counted", shown as f64, "users", extra);

    eprintln!("rooms-attack: hidden: queries for {} s", args.flood_secs);
    let monitor = Monitor::start(ctx).await?;
    let statuses = Statuses::default();
    let end = Instant::now() + Duration::from_secs(args.flood_secs);
    let worker = |w: usize| {
        let statuses = &statuses;
        async move {
            while Instant::now() < end {
                if !statuses.fetch(query(w)).await {
                    tokio::time::sleep(RETRY_REFUSED).await;
                }
            }
        }
    };
    let workers = READS_IN_FLIGHT * ctx.targets.len();
    futures_util::future::join_all((0..workers).map(worker)).await;
    let mut flood = params;
    flood["secs"] = json!(args.flood_secs);
    flood["in_flight"] = json!(workers);
    monitor
        .finish(ctx, report, "hidden_flood", Some(&statuses), flood)
        .await;
    leave_all(room, stop).await;
    Ok(shown)
}
