//! `feed-deliver`: how fast a fleet sends the event feed to one webhook
//! receiver (issue 39).
//!
//! One Redis, `--nodes` nodes (3) with `--webhook-url` to a receiver in
//! this process; `--users` users (one device each) connect and close, spread
//! over the nodes, so each makes two events (online, offline).
//! - Backlog: the receiver answers 503 while the users come and go; once
//!   every event is in the log it comes up, and the figures are the events
//!   per second the fleet delivers from its first accepted POST until it
//!   has them all (what a receiver back from an outage gets), and how long
//!   the first took (the senders' backoff, up to 30 s, grown while it was
//!   down).
//! - Live: the receiver up, another `--users` come and go as fast as the
//!   bench makes them; the events per second from the first connect to the
//!   last event received, and each event's lag (its receipt less its `at`).
//!
//! Every event is counted once by `id`; repeats (at least once) are counted
//! apart.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use futures_util::SinkExt;
use hdrhistogram::Histogram;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

use super::connect_many;
use crate::report::{latency_histogram, Report};
use crate::{now_ms, procs, Common, Setup};

/// Flags of `feed-deliver`.
#[derive(Args, Debug)]
pub struct FeedDeliverArgs {
    /// Users that come and go in each phase (two events each).
    #[arg(long, default_value_t = 10_000)]
    pub users: usize,
    /// Nodes of the fleet.
    #[arg(long, default_value_t = 3)]
    pub nodes: usize,
    /// Devices connected at once.
    #[arg(long, default_value_t = 1_000)]
    pub wave: usize,
}

/// Handshakes in flight at once.
const CONCURRENCY: usize = 200;
/// The longest a phase may take to deliver everything.
const DEADLINE: Duration = Duration::from_secs(300);

/// What the receiver got.
#[derive(Default)]
struct Received {
    /// Up (answers 200) or down (503).
    up: AtomicBool,
    /// Distinct event ids.
    ids: Mutex<HashSet<String>>,
    /// Events received again.
    repeats: AtomicU64,
    /// POSTs answered 200.
    posts: AtomicU64,
    /// When the first POST was answered 200.
    first_ok: Mutex<Option<Instant>>,
    /// Each new event's lag, ms (its receipt less its `at`), in µs.
    lag: Mutex<Option<Histogram<u64>>>,
}

impl Received {
    /// Takes one POST's body; the status to answer.
    fn take(&self, body: &[u8]) -> u16 {
        if !self.up.load(Ordering::Relaxed) {
            return 503;
        }
        let Ok(batch) = serde_json::from_slice::<Value>(body) else {
            return 400;
        };
        let now = now_ms();
        let mut ids = self.ids.lock().unwrap();
        let mut lag = self.lag.lock().unwrap();
        for e in batch["events"].as_array().into_iter().flatten() {
            let id = e["id"].as_str().unwrap_or_default().to_string();
            if !ids.insert(id) {
                self.repeats.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            if let (Some(h), Some(at)) = (lag.as_mut(), e["at"].as_i64()) {
                let _ = h.record(((now - at).max(0) as u64) * 1000);
            }
        }
        self.posts.fetch_add(1, Ordering::Relaxed);
        self.first_ok
            .lock()
            .unwrap()
            .get_or_insert_with(Instant::now);
        200
    }

    fn count(&self) -> usize {
        self.ids.lock().unwrap().len()
    }
}

/// `users` users come and go, spread over the nodes, with prefix `tag`.
async fn churn(setup: &Setup, tag: &str, args: &FeedDeliverArgs) -> anyhow::Result<()> {
    let mut i = 0;
    let mut wave = 0;
    while i < args.users {
        let n = args.wave.min(args.users - i);
        let users: Vec<String> = (i..i + n).map(|k| format!("{tag}{k}")).collect();
        let node = setup.nodes[wave % setup.nodes.len()].addr;
        let (socks, _) = connect_many(node, &setup.sources, users, CONCURRENCY).await?;
        for mut ws in socks {
            ws.send(Message::Close(None)).await.ok();
        }
        i += n;
        wave += 1;
    }
    Ok(())
}

/// Waits until the receiver has `want` distinct events; how long it took.
async fn until_received(got: &Received, want: usize) -> anyhow::Result<Duration> {
    let start = Instant::now();
    while got.count() < want {
        anyhow::ensure!(
            start.elapsed() < DEADLINE,
            "the receiver has {} of {want} events after {DEADLINE:?}",
            got.count()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(start.elapsed())
}

pub async fn run(common: &Common, args: &FeedDeliverArgs) -> anyhow::Result<()> {
    procs::ensure_fds(args.wave + 100)?;
    let mut report = Report::new("feed-deliver");
    let got = Arc::new(Received::default());
    let sink = got.clone();
    let addr = crate::http_sink::serve(move |body| (sink.take(body), String::new())).await?;
    let mut setup = Setup::redis(common)?;
    setup.node_args = vec![
        "--webhook-url".into(),
        format!("http://{addr}/hooks/presence"),
        "--webhook-secret".into(),
        "whsec_bench_0123456789abcdef".into(),
    ];
    setup.start_nodes(common, args.nodes, None)?;
    let events = 2 * args.users;
    eprintln!(
        "feed-deliver: {} users come and go on {} nodes, the receiver down",
        args.users, args.nodes
    );
    churn(&setup, "dn", args).await?;
    let mut conn = setup.redis_conn().await?;
    let start = Instant::now();
    while super::feed::logged(&mut conn).await? < events as u64 {
        anyhow::ensure!(start.elapsed() < DEADLINE, "the log never held every event");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    got.up.store(true, Ordering::Relaxed);
    let up = Instant::now();
    until_received(&got, events).await?;
    let first = got.first_ok.lock().unwrap().expect("a POST was taken");
    let took = first.elapsed();
    report.figure(
        "feed_backlog_events_per_sec",
        events as f64 / took.as_secs_f64(),
        "events/s",
        json!({"events": events, "nodes": args.nodes, "secs": took.as_secs_f64(),
               "posts": got.posts.load(Ordering::Relaxed)}),
    );
    report.figure(
        "feed_backlog_first_delivery_ms",
        (first - up).as_secs_f64() * 1000.0,
        "ms",
        json!({"note": "the senders' backoff after the receiver was down"}),
    );
    eprintln!(
        "feed-deliver: another {} users, the receiver up",
        args.users
    );
    *got.lag.lock().unwrap() = Some(latency_histogram());
    let start = Instant::now();
    churn(&setup, "up", args).await?;
    until_received(&got, 2 * events).await?;
    let took = start.elapsed();
    report.figure(
        "feed_live_events_per_sec",
        events as f64 / took.as_secs_f64(),
        "events/s",
        json!({"events": events, "nodes": args.nodes, "secs": took.as_secs_f64()}),
    );
    let lag = got.lag.lock().unwrap().take().expect("set above");
    for (name, q) in [("p50", 0.5), ("p99", 0.99)] {
        report.figure(
            &format!("feed_delivery_lag_{name}_ms"),
            lag.value_at_quantile(q) as f64 / 1000.0,
            "ms",
            json!({"events": lag.len()}),
        );
    }
    report.figure(
        "feed_webhook_repeats",
        got.repeats.load(Ordering::Relaxed) as f64,
        "events",
        json!({"distinct": got.count()}),
    );
    report.print_table();
    Ok(())
}
