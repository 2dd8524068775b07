//! A `storm` worker: holds a share of the devices (at most what one
//! process's open files allow), reconnects the ones whose node dies with
//! full-jitter backoff, and reports over a small line protocol.
//!
//! Commands in (one a line): `storm` (probes start changing status, events
//! count from now), `calm` (events stop counting; answered `{"t":"calm"}`),
//! `end <kill_us> <held_us>` (close everything, send the summary, return).
//! End of input ends the worker too.
//!
//! Lines out (JSON): `{"t":"stat",...}` once a second, `{"t":"calm"}` when
//! told, `{"t":"end",...}` once. Times are epoch µs, comparable across the processes of one box.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{watch, Semaphore};
use tokio_tungstenite::tungstenite::Message;

use crate::client::{self, Sources, Ws};

/// First reconnect delay bound and the largest, as the JS client's
/// `minBackoffMs` / `maxBackoffMs` defaults.
const BACKOFF_BASE_MS: u64 = 500;
const BACKOFF_CAP_MS: u64 = 15_000;
/// How often a probe changes its status while the storm runs.
const PROBE_EVERY: Duration = Duration::from_millis(500);
/// How long a connected device waits for its watch snapshot.
const SNAPSHOT_PATIENCE: Duration = Duration::from_secs(600);
/// Most offline events listed in the summary (the rest are counted).
const MAX_LISTED: usize = 100_000;

/// What one worker is to hold; the same in every worker of a run but for
/// `first` and `count`.
#[derive(Debug, Clone)]
pub struct Spec {
    /// The nodes; device `i` connects to `nodes[i % nodes.len()]` first.
    pub nodes: Vec<SocketAddr>,
    /// This worker's devices: `first .. first + count`.
    pub first: usize,
    pub count: usize,
    /// Devices of the whole run (user `s<i>` has device `d`).
    pub devices: usize,
    /// Users each device watches: `i + k * step` for k in 1..=watches.
    pub watches: usize,
    pub step: usize,
    /// The node that will be killed: its users' offline events count.
    pub victim: usize,
    /// Users that change status during the storm.
    pub probes: Vec<usize>,
    /// Loopback source addresses.
    pub sources: usize,
    /// Handshakes at a time while connecting the first time.
    pub concurrency: usize,
}

impl Spec {
    pub fn to_json(&self) -> Value {
        json!({"nodes": self.nodes.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
               "first": self.first, "count": self.count, "devices": self.devices,
               "watches": self.watches, "step": self.step, "victim": self.victim,
               "probes": self.probes, "sources": self.sources,
               "concurrency": self.concurrency})
    }

    pub fn from_json(v: &Value) -> anyhow::Result<Self> {
        let n = |k: &str| -> anyhow::Result<usize> {
            Ok(v[k].as_u64().with_context(|| format!("spec has no {k}"))? as usize)
        };
        let nodes = v["nodes"]
            .as_array()
            .context("spec has no nodes")?
            .iter()
            .map(|a| Ok(a.as_str().context("node")?.parse()?))
            .collect::<anyhow::Result<_>>()?;
        let probes = v["probes"]
            .as_array()
            .context("spec has no probes")?
            .iter()
            .filter_map(Value::as_u64)
            .map(|p| p as usize)
            .collect();
        Ok(Self {
            nodes,
            first: n("first")?,
            count: n("count")?,
            devices: n("devices")?,
            watches: n("watches")?,
            step: n("step")?,
            victim: n("victim")?,
            probes,
            sources: n("sources")?,
            concurrency: n("concurrency")?,
        })
    }

    /// The users device `i` watches.
    pub fn watch_list(&self, i: usize) -> Vec<String> {
        (1..=self.watches)
            .map(|k| user((i + k * self.step) % self.devices))
            .collect()
    }

    fn home(&self, i: usize) -> usize {
        i % self.nodes.len()
    }
}

/// User `i`'s id.
pub fn user(i: usize) -> String {
    format!("s{i}")
}

/// Epoch µs.
pub fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// What the devices of one worker share.
#[derive(Default)]
struct State {
    /// Devices connected now, and the watches their snapshots confirmed.
    held: AtomicUsize,
    watches: AtomicUsize,
    /// Devices that lost their connection (not closed by us), and how many
    /// of those are connected again.
    dropped: AtomicUsize,
    back: AtomicUsize,
    /// The last of those reconnects, epoch µs.
    last_back_us: AtomicU64,
    /// Per device: when it was back, epoch µs (0: never lost or not back).
    back_at: Vec<AtomicU64>,
    /// Failed connection attempts, and how many of each kind.
    errors: AtomicUsize,
    error_kinds: Mutex<std::collections::BTreeMap<String, u64>>,
    /// From the `storm` command on.
    storming: AtomicBool,
    /// Probe event latencies, µs.
    latency: Mutex<Vec<u64>>,
    /// Offline and online events for the victim node's users.
    offline: Mutex<Vec<(u32, u64)>>,
    offline_count: AtomicUsize,
    online_victim: AtomicUsize,
}

/// Runs one worker: the devices of `spec`, commands from `input`, reports
/// to `output`.
pub async fn serve<R, W>(spec: Spec, input: R, mut output: W) -> anyhow::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let spec = Arc::new(spec);
    let state = Arc::new(State {
        back_at: (0..spec.count).map(|_| AtomicU64::new(0)).collect(),
        ..State::default()
    });
    let sources = Arc::new(Sources::new(spec.sources));
    let (stop_tx, stop_rx) = watch::channel(false);
    let sem = Arc::new(Semaphore::new(spec.concurrency.max(1)));
    let mut tasks = Vec::with_capacity(spec.count);
    for i in spec.first..spec.first + spec.count {
        let (spec, state, sources, stop, sem) = (
            spec.clone(),
            state.clone(),
            sources.clone(),
            stop_rx.clone(),
            sem.clone(),
        );
        tasks.push(tokio::spawn(device(i, spec, state, sources, stop, sem)));
    }
    let mut lines = BufReader::new(input).lines();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let (kill_us, held_us) = loop {
        tokio::select! {
            _ = tick.tick() => {
                let line = stat_line(&state);
                output.write_all(format!("{line}\n").as_bytes()).await?;
                output.flush().await?;
                continue;
            }
            line = lines.next_line() => match line?.as_deref().map(str::split_whitespace) {
                None => break (0, 0),
                Some(mut words) => match words.next() {
                    Some("storm") => {
                        state.storming.store(true, Ordering::SeqCst);
                        continue;
                    }
                    // Stops counting before any worker closes its devices:
                    // their goodbyes are real offlines, not the storm's.
                    Some("calm") => {
                        state.storming.store(false, Ordering::SeqCst);
                        output.write_all(b"{\"t\":\"calm\"}\n").await?;
                        output.flush().await?;
                        continue;
                    }
                    Some("end") => {
                        let mut num = || words.next().and_then(|w| w.parse().ok()).unwrap_or(0u64);
                        break (num(), num());
                    }
                    _ => continue,
                },
            }
        }
    };
    let _ = stop_tx.send(true);
    for t in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(10), t).await;
    }
    let line = end_line(&spec, &state, kill_us, held_us);
    output.write_all(format!("{line}\n").as_bytes()).await?;
    output.flush().await?;
    Ok(())
}

fn stat_line(s: &State) -> Value {
    json!({"t": "stat", "held": s.held.load(Ordering::Relaxed),
           "watches": s.watches.load(Ordering::Relaxed),
           "dropped": s.dropped.load(Ordering::Relaxed),
           "back": s.back.load(Ordering::Relaxed),
           "last_back_us": s.last_back_us.load(Ordering::Relaxed),
           "errors": s.errors.load(Ordering::Relaxed)})
}

/// The summary: probe latencies, offline events for the victim's users,
/// and the devices that were not back while their leases were surely held
/// (`held_us` after the kill: TTL - heartbeat).
fn end_line(spec: &Spec, s: &State, kill_us: u64, held_us: u64) -> Value {
    // Each of the killed node's devices here: its index, and when it was
    // back, µs after the kill (None: not back).
    let victims: Vec<(usize, Option<u64>)> = s
        .back_at
        .iter()
        .enumerate()
        .map(|(k, at)| (spec.first + k, at.load(Ordering::Relaxed)))
        .filter(|&(i, _)| spec.home(i) == spec.victim)
        .map(|(i, at)| (i, (at != 0).then(|| at.saturating_sub(kill_us))))
        .collect();
    let late: Vec<usize> = victims
        .iter()
        .filter(|(_, back)| back.is_none_or(|us| us > held_us))
        .map(|&(i, _)| i)
        .collect();
    let mut line = stat_line(s);
    line["t"] = json!("end");
    line["latency_us"] = json!(*s.latency.lock().unwrap());
    // [user, ms after the kill] per event.
    let offline: Vec<(u32, i64)> = s
        .offline
        .lock()
        .unwrap()
        .iter()
        .map(|&(u, at)| (u, (at as i64 - kill_us as i64) / 1000))
        .collect();
    line["offline"] = json!(offline);
    line["offline_count"] = json!(s.offline_count.load(Ordering::Relaxed));
    line["online_victim"] = json!(s.online_victim.load(Ordering::Relaxed));
    line["late"] = json!(late);
    // ms after the kill at which each of them was back (those not back
    // are left out).
    let back_ms: Vec<u64> = victims
        .iter()
        .filter_map(|(_, back)| *back)
        .map(|us| us / 1000)
        .collect();
    line["back_ms"] = json!(back_ms);
    line["error_kinds"] = json!(*s.error_kinds.lock().unwrap());
    line
}

/// What kind of failure a connection attempt met, for the summary: its
/// root cause (e.g. `connection refused`, `no snapshot`, an HTTP status),
/// or `timeout`.
fn kind(e: &anyhow::Error) -> String {
    let text = format!("{e:#}");
    // "1013 server busy", "1011 presence store unavailable"...
    if let Some(at) = text.find("closed by the server: ") {
        let close = &text[at + "closed by the server: ".len()..];
        return close.split(',').next().unwrap_or(close).to_string();
    }
    if text.contains("timed out") {
        return "timeout".into();
    }
    if text.contains("no snapshot") {
        return "no snapshot".into();
    }
    e.root_cause().to_string().chars().take(60).collect()
}

/// The wait a node that shed the attempt asked for: `retry_after_ms=<n>`
/// in its 1013 close's reason (at most a minute, as the JS client).
fn retry_hint(e: &anyhow::Error) -> Option<u64> {
    let text = format!("{e:#}");
    let at = text.find("retry_after_ms=")? + "retry_after_ms=".len();
    let digits: String = text[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse::<u64>().ok().map(|ms| ms.min(60_000))
}

/// A small xorshift for the jitter (no rand dependency in the bench).
fn jitter(seed: &mut u64, bound_ms: u64) -> Duration {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    Duration::from_millis(*seed % (bound_ms + 1))
}

/// One device: connects to its home node, watches, holds; when the
/// connection is lost, reconnects to another node after a full-jitter
/// backoff, as the JS client does, until told to stop.
async fn device(
    i: usize,
    spec: Arc<Spec>,
    state: Arc<State>,
    sources: Arc<Sources>,
    mut stop: watch::Receiver<bool>,
    sem: Arc<Semaphore>,
) {
    let mut seed = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ now_us();
    let (name, list) = (user(i), spec.watch_list(i));
    let mut node = spec.home(i);
    let (mut attempt, mut lost) = (0u32, false);
    loop {
        let mut hint_ms = None;
        let permit = match lost {
            false => sem.clone().acquire_owned().await.ok(),
            true => None,
        };
        let conn = tokio::select! {
            c = connect_and_watch(spec.nodes[node], sources.next(), &name, &list) => c,
            _ = stop.changed() => return,
        };
        drop(permit);
        match conn {
            Ok((ws, n)) => {
                attempt = 0;
                state.held.fetch_add(1, Ordering::Relaxed);
                state.watches.fetch_add(n, Ordering::Relaxed);
                if lost {
                    let at = now_us();
                    state.back_at[i - spec.first].store(at, Ordering::Relaxed);
                    state.back.fetch_add(1, Ordering::Relaxed);
                    state.last_back_us.fetch_max(at, Ordering::Relaxed);
                }
                let stopped = hold(i, ws, &spec, &state, &mut stop).await;
                state.held.fetch_sub(1, Ordering::Relaxed);
                state.watches.fetch_sub(n, Ordering::Relaxed);
                if stopped {
                    return;
                }
                if !lost {
                    state.dropped.fetch_add(1, Ordering::Relaxed);
                }
                lost = true;
            }
            Err(e) => {
                hint_ms = retry_hint(&e);
                state.errors.fetch_add(1, Ordering::Relaxed);
                *state
                    .error_kinds
                    .lock()
                    .unwrap()
                    .entry(kind(&e))
                    .or_default() += 1;
            }
        }
        // Elsewhere after a loss: any node but the dead one (a load
        // balancer whose health check dropped it).
        if lost && spec.nodes.len() > 1 {
            let other = 1 + jitter(&mut seed, (spec.nodes.len() - 2) as u64).as_millis() as usize;
            node = (spec.victim + other) % spec.nodes.len();
        }
        // As the JS client: full jitter, or, after a 1013 that names its
        // wait, that wait plus as much again at random.
        let bound = BACKOFF_CAP_MS.min(BACKOFF_BASE_MS << attempt.min(16));
        attempt += 1;
        let wait = match hint_ms {
            Some(hint) => Duration::from_millis(hint) + jitter(&mut seed, hint),
            None => jitter(&mut seed, bound),
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.changed() => return,
        }
    }
}

/// Connects and watches; the socket and the snapshot's size.
async fn connect_and_watch(
    node: SocketAddr,
    src: std::net::IpAddr,
    name: &str,
    list: &[String],
) -> anyhow::Result<(Ws, usize)> {
    let mut ws = client::connect(node, src, name, "d").await?;
    // Once `hello` came the device is online: waits for the snapshot as
    // the JS client does, however slow (giving up would close the socket,
    // and its watchers would see a real offline).
    let frame = json!({"type": "watch", "users": list});
    ws.send(Message::Text(frame.to_string().into())).await?;
    let snap = tokio::time::timeout(SNAPSHOT_PATIENCE, async {
        loop {
            let v = client::next_json(&mut ws).await?;
            if v["type"] == "snapshot" {
                return anyhow::Ok(v["presence"].as_array().map_or(0, Vec::len));
            }
            // The watch refused (e.g. `unavailable`): this attempt failed.
            if v["type"] == "error" {
                anyhow::bail!("watch answered {}", v["code"]);
            }
        }
    })
    .await
    .context("no snapshot")??;
    Ok((ws, snap))
}

/// Reads the socket (answering pings) until it ends or `stop` fires (then
/// true); a probe also changes its status every [`PROBE_EVERY`] while the
/// storm runs, with the time in its status text.
async fn hold(
    i: usize,
    mut ws: Ws,
    spec: &Spec,
    state: &State,
    stop: &mut watch::Receiver<bool>,
) -> bool {
    let probe = spec.probes.contains(&i);
    let mut tick = tokio::time::interval(PROBE_EVERY);
    let mut away = false;
    loop {
        tokio::select! {
            _ = tick.tick(), if probe => {
                if !state.storming.load(Ordering::Relaxed) {
                    continue;
                }
                away = !away;
                let status = if away { "away" } else { "busy" };
                let frame = json!({"type": "status", "status": status, "text": now_us().to_string()});
                if ws.send(Message::Text(frame.to_string().into())).await.is_err() {
                    return false;
                }
            }
            msg = ws.next() => match msg {
                Some(Ok(Message::Text(t))) => on_frame(&t, spec, state),
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => return false,
                Some(Ok(_)) => {}
            },
            _ = stop.changed() => {
                let _ = ws.close(None).await;
                return true;
            }
        }
    }
}

/// A frame a device received: probe latencies and the victim's users'
/// transitions, while the storm runs.
fn on_frame(text: &str, spec: &Spec, state: &State) {
    if !state.storming.load(Ordering::Relaxed) {
        return;
    }
    let Ok(v) = serde_json::from_str::<Value>(text) else {
        return;
    };
    if v["type"] != "presence" {
        return;
    }
    let Some(u) = v["user"]
        .as_str()
        .and_then(|u| u.strip_prefix('s'))
        .and_then(|n| n.parse::<usize>().ok())
    else {
        return;
    };
    match v["status"].as_str() {
        Some("away") | Some("busy") => {
            if let Some(sent) = v["text"].as_str().and_then(|t| t.parse::<u64>().ok()) {
                let lat = now_us().saturating_sub(sent).max(1);
                state.latency.lock().unwrap().push(lat);
            }
        }
        // Counted in any case; listed up to MAX_LISTED.
        Some("offline")
            if spec.home(u) == spec.victim
                && state.offline_count.fetch_add(1, Ordering::Relaxed) < MAX_LISTED =>
        {
            state.offline.lock().unwrap().push((u as u32, now_us()));
        }
        Some("online") if spec.home(u) == spec.victim => {
            state.online_victim.fetch_add(1, Ordering::Relaxed);
        }
        _ => {}
    }
}
