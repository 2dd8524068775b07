//! `feed`: what the event feed (issue 39) costs Redis.
//!
//! One node; `--users` devices (one user each) connect and then close, in
//! waves of `--wave`, so that each makes two transitions (online, offline).
//! Run twice, each on a fresh Redis (unless `--redis-url` gives one): first
//! with the feed off (`--event-retention-secs 0`), then on. Figures:
//! - Redis CPU per transition (`INFO cpu`, the Redis process's user and
//!   system time over the churn, less its idle share), off and on, and
//!   their ratio (the target: within 25%).
//! - Redis bytes per retained event: `MEMORY USAGE` of the feed's keys
//!   (every bucket's log and marks) once all events are in the logs and
//!   the due index has drained, divided by the events (the target: at most
//!   200 B for online/offline).

use std::time::{Duration, Instant};

use clap::Args;
use futures_util::SinkExt;
use serde_json::json;
use tokio_tungstenite::tungstenite::Message;

use super::connect_many;
use crate::report::Report;
use crate::{procs, redis_info, Common, Setup};

/// Flags of `feed`.
#[derive(Args, Debug)]
pub struct FeedArgs {
    /// Users that come and go in each run (two transitions each).
    #[arg(long, default_value_t = 20_000)]
    pub users: usize,
    /// Devices connected at once.
    #[arg(long, default_value_t = 1_000)]
    pub wave: usize,
}

/// Handshakes in flight at once.
const CONCURRENCY: usize = 200;
/// Buckets of the deployment (the server's default).
const BUCKETS: u32 = 16;

/// The Redis process's CPU so far, seconds (user + system).
async fn redis_cpu(conn: &mut redis::aio::MultiplexedConnection) -> anyhow::Result<f64> {
    let user: f64 = redis_info(conn, "cpu", "used_cpu_user").await?.parse()?;
    let sys: f64 = redis_info(conn, "cpu", "used_cpu_sys").await?.parse()?;
    Ok(user + sys)
}

/// Events in every bucket's log.
pub(crate) async fn logged(conn: &mut redis::aio::MultiplexedConnection) -> anyhow::Result<u64> {
    let mut n = 0;
    for b in 0..BUCKETS {
        let len: u64 = redis::cmd("XLEN")
            .arg(format!("presence-feed-log:{{b{b:02}}}"))
            .query_async(conn)
            .await?;
        n += len;
    }
    Ok(n)
}

/// Entries of every bucket's due index.
async fn due_entries(conn: &mut redis::aio::MultiplexedConnection) -> anyhow::Result<u64> {
    let mut n = 0;
    for b in 0..BUCKETS {
        let len: u64 = redis::cmd("ZCARD")
            .arg(format!("presence-feed-due:{{b{b:02}}}"))
            .query_async(conn)
            .await?;
        n += len;
    }
    Ok(n)
}

/// Bytes of the feed's keys.
async fn feed_bytes(conn: &mut redis::aio::MultiplexedConnection) -> anyhow::Result<u64> {
    let mut n = 0;
    for b in 0..BUCKETS {
        for key in [
            format!("presence-feed-log:{{b{b:02}}}"),
            format!("presence-feed-moved:{{b{b:02}}}"),
            format!("presence-feed-due:{{b{b:02}}}"),
        ] {
            let bytes: Option<u64> = redis::cmd("MEMORY")
                .arg("USAGE")
                .arg(&key)
                .arg("SAMPLES")
                .arg(0)
                .query_async(conn)
                .await?;
            n += bytes.unwrap_or(0);
        }
    }
    Ok(n)
}

/// What each command cost per transition (`INFO commandstats` since the
/// last `CONFIG RESETSTAT`), most first: where the feed's extra CPU goes.
async fn command_costs(
    conn: &mut redis::aio::MultiplexedConnection,
    transitions: f64,
) -> anyhow::Result<String> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await?;
    let mut rows: Vec<(String, f64, f64)> = Vec::new();
    for line in info.lines() {
        let Some((name, rest)) = line
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(':'))
        else {
            continue;
        };
        let field = |k: &str| {
            rest.split(',')
                .find_map(|f| f.strip_prefix(k))
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        rows.push((name.to_string(), field("calls="), field("usec=")));
    }
    rows.sort_by(|a, b| b.2.total_cmp(&a.2));
    let total: f64 = rows.iter().map(|r| r.2).sum();
    let mut out = format!("{:.1} us in commands per transition:", total / transitions);
    for (name, calls, usec) in rows.iter().filter(|r| r.2 / transitions >= 0.05) {
        out += &format!(
            " {name} {:.2}x {:.2}us;",
            calls / transitions,
            usec / transitions
        );
    }
    Ok(out)
}

/// `users` users come and go on `node`, `wave` at a time, with prefix
/// `tag`; the Redis CPU seconds it took (less the idle share) and the time.
async fn churn(setup: &Setup, tag: &str, args: &FeedArgs) -> anyhow::Result<(f64, Duration)> {
    let node = setup.nodes[0].addr;
    let mut conn = setup.redis_conn().await?;
    let idle_from = redis_cpu(&mut conn).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle = redis_cpu(&mut conn).await? - idle_from;
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn)
        .await?;
    let cpu_from = redis_cpu(&mut conn).await?;
    let start = Instant::now();
    let mut i = 0;
    while i < args.users {
        let n = args.wave.min(args.users - i);
        let users: Vec<String> = (i..i + n).map(|k| format!("{tag}{k}")).collect();
        let (socks, _) = connect_many(node, &setup.sources, users, CONCURRENCY).await?;
        for mut ws in socks {
            ws.send(Message::Close(None)).await.ok();
        }
        i += n;
    }
    // The departures run as the closes arrive: wait until Redis is quiet.
    let mut last = redis_cpu(&mut conn).await?;
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = redis_cpu(&mut conn).await?;
        if now - last < idle / 2.0 + 0.002 {
            break;
        }
        last = now;
    }
    let took = start.elapsed();
    let cpu = redis_cpu(&mut conn).await? - cpu_from - idle * took.as_secs_f64();
    eprintln!(
        "feed: {}",
        command_costs(&mut conn, 2.0 * args.users as f64).await?
    );
    Ok((cpu.max(0.0), took))
}

pub async fn run(common: &Common, args: &FeedArgs) -> anyhow::Result<()> {
    procs::ensure_fds(args.wave + 100)?;
    let mut report = Report::new("feed");
    let mut setup = Setup::redis(common)?;
    let transitions = 2.0 * args.users as f64;
    let mut per = Vec::new();
    for (on, retention) in [(false, "0"), (true, "86400")] {
        setup.nodes.clear();
        if common.redis_url.is_none() {
            // A Redis of its own for each run: the second must not pay
            // for the keys the first left (a larger keyspace).
            setup = Setup::redis(common)?;
        }
        setup.node_args = vec!["--event-retention-secs".into(), retention.into()];
        setup.start_nodes(common, 1, None)?;
        let tag = if on { "fon" } else { "foff" };
        eprintln!(
            "feed: {} users come and go, feed {}",
            args.users,
            if on { "on" } else { "off" }
        );
        let (cpu, took) = churn(&setup, tag, args).await?;
        let us = cpu * 1e6 / transitions;
        per.push(us);
        report.figure(
            &format!(
                "redis_cpu_per_transition_feed_{}",
                if on { "on" } else { "off" }
            ),
            us,
            "us",
            json!({"transitions": transitions, "secs": took.as_secs_f64()}),
        );
    }
    report.figure(
        "redis_cpu_feed_on_over_off",
        per[1] / per[0].max(f64::MIN_POSITIVE),
        "ratio",
        json!({"target_max": 1.25}),
    );
    let mut conn = setup.redis_conn().await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut events = logged(&mut conn).await?;
    while events < transitions as u64 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        events = logged(&mut conn).await?;
    }
    // The due index holds each feed for 5 s after its step: transient, so
    // measured once it has drained (the pass takes the moved ones out).
    let deadline = Instant::now() + Duration::from_secs(30);
    while due_entries(&mut conn).await? > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let bytes = feed_bytes(&mut conn).await?;
    report.figure(
        "redis_bytes_per_retained_event",
        bytes as f64 / events.max(1) as f64,
        "B",
        json!({"events": events, "expected": transitions, "bytes": bytes, "target_max": 200}),
    );
    report.print_table();
    Ok(())
}
