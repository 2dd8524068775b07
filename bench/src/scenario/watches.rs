//! `watches`: what a watch costs a node (issue 29). Sessions connect, then
//! each watches its own list of distinct users (or, with `--shared`, all
//! the same list); node RSS is read after the connects, after the watches,
//! and for `--give-back-secs` after every session left.

use std::time::{Duration, Instant};

use clap::Args;
use serde_json::json;

use super::connect_many;
use crate::client::{self, Held};
use crate::procs::rss_bytes;
use crate::report::Report;
use crate::{Common, Setup};

/// Flags of `watches`.
#[derive(Args, Debug)]
pub struct WatchesArgs {
    /// Watching sessions.
    #[arg(long, default_value_t = 1_000)]
    pub sessions: usize,
    /// Users each session watches.
    #[arg(long, default_value_t = 1_000)]
    pub watches: usize,
    /// Every session watches the same users (else each its own).
    #[arg(long)]
    pub shared: bool,
    /// How long to watch RSS come back after the sessions left.
    #[arg(long, default_value_t = 20)]
    pub give_back_secs: u64,
}

pub async fn run(common: &Common, args: &WatchesArgs) -> anyhow::Result<()> {
    let mut report = Report::new("watches");
    let mut setup = Setup::redis(common)?;
    setup.node_args = vec![
        "--max-watches".into(),
        args.watches.to_string(),
        "--max-user-reads-per-sec".into(),
        "1000000".into(),
    ];
    setup.start_nodes(common, 1, None)?;
    let node = &setup.nodes[0];
    let pid = node
        .pid()
        .ok_or_else(|| anyhow::anyhow!("needs a node the bench started"))?;
    crate::procs::ensure_fds(args.sessions + 100)?;
    let rss = || rss_bytes(pid).unwrap_or(0);
    let mut redis = setup.redis_conn().await?;
    let before = rss();
    let names: Vec<String> = (0..args.sessions).map(|i| format!("w{i}")).collect();
    let (sockets, _) = connect_many(node.addr, &setup.sources, names, 50).await?;
    let connected = rss();
    let redis_connected = crate::redis_used_memory(&mut redis).await?;
    // Sockets waiting for their turn to watch keep reading (and so answer
    // the node's pings): on a loaded box the watches take longer than the
    // two heartbeats after which a silent client is closed.
    let parked: Vec<_> = sockets.into_iter().map(park).collect();
    let mut held = Vec::with_capacity(parked.len());
    let t0 = Instant::now();
    for (i, (wake, waiting)) in parked.into_iter().enumerate() {
        let _ = wake.send(());
        let mut ws = waiting.await??;
        let list: Vec<String> = (0..args.watches)
            .map(|u| match args.shared {
                true => format!("u{u}"),
                false => format!("u{i}-{u}"),
            })
            .collect();
        let snap = client::watch(&mut ws, &list).await?;
        anyhow::ensure!(snap.len() == args.watches, "short snapshot");
        held.push(Held::new(ws));
    }
    let watching = t0.elapsed();
    // Let the last snapshot buffers go.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let peak = rss();
    let redis_peak = crate::redis_used_memory(&mut redis).await?;
    let total = (args.sessions * args.watches) as f64;
    let distinct = if args.shared {
        args.watches
    } else {
        args.sessions * args.watches
    };
    let params = json!({"sessions": args.sessions, "watches_per_session": args.watches,
                        "distinct_users": distinct, "shared": args.shared,
                        "watch_secs": watching.as_secs_f64()});
    report.figure(
        "node_rss_per_watch",
        peak.saturating_sub(connected) as f64 / total,
        "B",
        params.clone(),
    );
    report.figure(
        "redis_memory_per_distinct_user",
        redis_peak.saturating_sub(redis_connected) as f64 / distinct as f64,
        "B",
        json!({"what": "used_memory after the watches less after the connects: one sharded channel per watched user, subscribed by this one node"}),
    );
    report.figure(
        "node_rss_per_session",
        connected.saturating_sub(before) as f64 / args.sessions as f64,
        "B",
        json!({"before watching": true}),
    );
    for h in &mut held {
        h.close();
    }
    let left = Instant::now();
    let grown = peak.saturating_sub(before).max(1);
    let mut after = rss();
    while left.elapsed() < Duration::from_secs(args.give_back_secs) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        after = rss();
    }
    drop(held);
    report.figure(
        "given_back_pct",
        peak.saturating_sub(after) as f64 * 100.0 / grown as f64,
        "%",
        json!({"within_s": args.give_back_secs, "rss_before_mb": before >> 20,
               "rss_peak_mb": peak >> 20, "rss_after_mb": after >> 20}),
    );
    report.print_table();
    Ok(())
}

/// Reads `ws` (answering pings) until told to stop, then hands it back.
fn park(
    mut ws: client::Ws,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<anyhow::Result<client::Ws>>,
) {
    use futures_util::StreamExt;
    let (tx, mut rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = &mut rx => return Ok(ws),
                msg = ws.next() => match msg {
                    Some(Ok(_)) => {}
                    other => anyhow::bail!("closed while waiting to watch: {other:?}"),
                },
            }
        }
    });
    (tx, task)
}
