//! `expiry`: many live leases written straight into Redis (as a node
//! writes them), plus devices on node A that is SIGKILLed; a watcher on
//! node B. Time from each dead lease's deadline (its score in
//! `presence-leases:{b<k>}`, read right after the kill) to the watcher's `offline`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use serde_json::json;

use super::{connect_many, hold_many, watch_lists};
use crate::client::{self, spawn_watcher};
use crate::report::{latency_histogram, Report};
use crate::{now_ms, Common, Setup};

/// Flags of `expiry`.
#[derive(Args, Debug)]
pub struct ExpiryArgs {
    /// Live leases beside the dying devices (TTL 10 minutes).
    #[arg(long, default_value_t = 100_000)]
    pub live: usize,
    /// Devices on the node that is killed.
    #[arg(long, default_value_t = 1_000)]
    pub devices: usize,
}

/// Heartbeat of spawned nodes unless --heartbeat-ms says otherwise: a 3 s
/// TTL keeps the run short.
const DEFAULT_HEARTBEAT_MS: u64 = 1_000;
/// Users per watcher: the node's default max_watches.
const WATCH_PER_SESSION: usize = 1_000;
/// How long past the TTL to wait for the last offline event.
const GIVE_UP_AFTER_TTL: Duration = Duration::from_secs(30);

pub async fn run(common: &Common, args: &ExpiryArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        common.node_urls.is_empty(),
        "expiry kills a node: it needs spawned nodes, not --node-url"
    );
    let mut report = Report::new("expiry");
    let mut setup = Setup::redis(common)?;
    let hb_ms = common.heartbeat_ms.unwrap_or(DEFAULT_HEARTBEAT_MS);
    let ttl = Duration::from_millis(3 * hb_ms);
    let mut redis = setup.redis_conn().await?;
    eprintln!("expiry: writing {} live leases", args.live);
    crate::fixture::live_leases(
        &mut redis,
        "live",
        args.live,
        crate::fixture::LEASE_VALUE,
        true,
    )
    .await?;
    setup.start_nodes(common, 2, Some(DEFAULT_HEARTBEAT_MS))?;
    let (node_a, node_b) = (setup.nodes[0].addr, setup.nodes[1].addr);

    let users: Vec<String> = (0..args.devices).map(|i| format!("e{i}")).collect();
    // Each answers pings from its connect on: one that did not would let its
    // lease lapse before the kill on a loaded machine.
    let devices = hold_many(node_a, &setup.sources, users.clone(), 100).await?;
    let lists = watch_lists(&users, WATCH_PER_SESSION);
    let names: Vec<String> = (0..lists.len()).map(|i| format!("ew{i}")).collect();
    let (watchers, _) = connect_many(node_b, &setup.sources, names, 50).await?;
    // Receipt times in epoch µs, per user.
    let offline: Arc<Mutex<HashMap<String, i64>>> = Arc::default();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let base_instant = Instant::now();
    let base_epoch_us = now_ms() * 1000;
    for (mut ws, list) in watchers.into_iter().zip(lists) {
        let snap = client::watch(&mut ws, &list).await?;
        anyhow::ensure!(
            snap.iter().all(|r| r["status"] == "online"),
            "every device should be online before the kill"
        );
        let offline = offline.clone();
        spawn_watcher(ws, stop_rx.clone(), move |(user, status, at)| {
            if status == "offline" {
                let us = base_epoch_us + at.duration_since(base_instant).as_micros() as i64;
                offline.lock().unwrap().entry(user).or_insert(us);
            }
        });
    }

    eprintln!("expiry: SIGKILL node A with {} devices", args.devices);
    let killed_epoch_us = base_epoch_us + base_instant.elapsed().as_micros() as i64;
    let killed = Instant::now();
    setup.nodes[0].kill()?;
    // The node is dead: these are the final deadlines.
    let mut pipe = redis::pipe();
    for u in &users {
        pipe.cmd("ZSCORE")
            .arg(crate::fixture::index_key("presence-leases", u))
            .arg(format!("{u}:d"));
    }
    let deadlines: Vec<Option<f64>> = pipe.query_async(&mut redis).await?;
    drop(devices);

    let give_up = killed + ttl + GIVE_UP_AFTER_TTL;
    while offline.lock().unwrap().len() < users.len() && Instant::now() < give_up {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = stop_tx.send(true);
    let offline = offline.lock().unwrap();
    let mut from_deadline = latency_histogram();
    let mut from_kill = latency_histogram();
    let (mut early, mut no_deadline) = (0u64, 0u64);
    for (u, d) in users.iter().zip(&deadlines) {
        let Some(&at) = offline.get(u) else { continue };
        from_kill.saturating_record((at - killed_epoch_us).max(1) as u64);
        match d {
            Some(d) => {
                let lat = at - (*d as i64) * 1000;
                if lat < 0 {
                    early += 1;
                }
                from_deadline.saturating_record(lat.max(1) as u64);
            }
            None => no_deadline += 1,
        }
    }
    report.figure(
        "offline_events",
        offline.len() as f64,
        "devices",
        json!({"devices": args.devices, "live_leases": args.live, "ttl_ms": ttl.as_millis() as u64,
               "before_deadline": early, "deadline_unknown": no_deadline}),
    );
    report.latency(
        "deadline_to_offline",
        &from_deadline,
        json!({"target_p99_ms": 1000}),
    );
    report.latency(
        "kill_to_offline",
        &from_kill,
        json!({"ttl_ms": ttl.as_millis() as u64, "target_p99_ms": ttl.as_millis() as u64 + 1000}),
    );
    if let Some(dir) = &common.svg {
        crate::plot::latency(
            &dir.join("expiry-latency.svg"),
            &format!(
                "silent death: lease deadline -> offline event ({} beside {} live leases)",
                args.devices, args.live
            ),
            &[("deadline -> offline", &from_deadline)],
        )?;
    }
    report.print_table();
    anyhow::ensure!(
        offline.len() == users.len(),
        "only {} of {} devices announced offline",
        offline.len(),
        users.len()
    );
    Ok(())
}
