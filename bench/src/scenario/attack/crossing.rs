//! Phase 3 of `rooms-attack`: a room crossing `--room-announce-max`.
//!
//! `--residents` users (at the limit) with `--resident-devices` devices
//! each, device `k` of user `u` on node `(u + k) % 2`, each keeping its view
//! of the room as a client does: its last `room` frame, then the joins,
//! leaves and `occupancy` since. `--churners` users of the attacker (one
//! WebSocket each, from its address, on node B) join, then leave, twice a
//! second: the room goes to counts once and stays there, as it lists again
//! only a tenth below the limit (`crossing`). Then the same, and as many
//! resident users leave with the churners and come back with them, so that
//! the room crosses both ways each cycle (`crossing_both`). After each,
//! every resident's view must settle to the room's counts.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::stream::SplitSink;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::sync::{watch, Semaphore};
use tokio_tungstenite::tungstenite::Message;

use super::{AttackArgs, Ctx, Monitor};
use crate::client::{self, spawn_reader, Ws};
use crate::procs;
use crate::report::Report;
use crate::scenario::rooms::{leave_all, Member};

/// The crossed room.
const CROSS_ROOM: &str = "attack:cross";
/// Churners join, then leave, this often.
const CYCLE: Duration = Duration::from_millis(500);
/// How long the residents' views may take to settle after the crossing
/// (the nodes read a room at most every `--room-occupancy-ms`, 2 s).
const SETTLE: Duration = Duration::from_secs(10);
/// Handshakes and joins in flight at once.
const CONCURRENCY: usize = 200;

/// A resident device's view of the crossed room, as a client keeps it.
#[derive(Default)]
struct View {
    /// The room's users and devices, from the last `room` or `occupancy`
    /// frame (counted from the list while there is one).
    users: u64,
    devices: u64,
    /// Each user's devices, while the room lists its members.
    members: Option<BTreeMap<String, BTreeSet<String>>>,
}

impl View {
    /// Applies one frame of the room.
    fn apply(&mut self, v: &Value) {
        if v["room"] != CROSS_ROOM {
            return;
        }
        let user = v["user"].as_str().unwrap_or_default();
        let device = v["device"].as_str().unwrap_or_default();
        match v["type"].as_str() {
            Some("room") => {
                self.members = v["members"]
                    .as_array()
                    .map(|ms| ms.iter().map(listed).collect());
                self.set_counts(v);
            }
            Some("occupancy") => self.set_counts(v),
            Some("room_join") => {
                if let Some(list) = &mut self.members {
                    list.entry(user.to_string())
                        .or_default()
                        .insert(device.to_string());
                }
                self.recount();
            }
            Some("room_leave") => {
                if let Some(devices) = self.members.as_mut().and_then(|l| l.get_mut(user)) {
                    devices.remove(device);
                }
                if let Some(list) = &mut self.members {
                    list.retain(|_, devices| !devices.is_empty());
                }
                self.recount();
            }
            _ => {}
        }
    }

    /// Takes the counts of a `room` or `occupancy` frame.
    fn set_counts(&mut self, v: &Value) {
        self.users = v["users"].as_u64().unwrap_or(0);
        self.devices = v["devices"].as_u64().unwrap_or(0);
    }

    /// Counts the list, while there is one.
    fn recount(&mut self) {
        if let Some(list) = &self.members {
            self.users = list.len() as u64;
            self.devices = list.values().map(|d| d.len() as u64).sum();
        }
    }

    /// Equal to the room's `users` and `devices`, its list (if any) too.
    fn agrees(&self, users: u64, devices: u64) -> bool {
        let listed = self.members.as_ref().is_none_or(|l| {
            l.len() as u64 == users && l.values().map(|d| d.len() as u64).sum::<u64>() == devices
        });
        listed && self.users == users && self.devices == devices
    }
}

/// One member of a `room` frame's list: its user and devices.
fn listed(m: &Value) -> (String, BTreeSet<String>) {
    let devices = m["devices"].as_array().into_iter().flatten();
    let devices = devices.filter_map(|d| Some(d["device"].as_str()?.to_string()));
    let user = m["user"].as_str().unwrap_or_default().to_string();
    (user, devices.collect())
}

/// A resident device of the crossed room.
struct Resident {
    /// Its user's number.
    user: usize,
    /// Its socket's writing half and reader.
    member: Member,
    /// Kept by its reader.
    view: Arc<Mutex<View>>,
}

/// The crossed room's residents: device `k` of user `u` on node `(u + k) % 2`.
async fn residents(
    ctx: &Ctx,
    args: &AttackArgs,
    stop: &watch::Receiver<bool>,
    room_frames: &Arc<AtomicU64>,
) -> anyhow::Result<Vec<Resident>> {
    let sem = Arc::new(Semaphore::new(CONCURRENCY));
    let mut tasks = Vec::new();
    for u in 0..args.residents {
        for k in 0..args.resident_devices {
            let permit = sem.clone().acquire_owned().await?;
            let (node, src) = (ctx.node((u + k) % 2), ctx.setup.sources.next());
            let (stop, frames) = (stop.clone(), room_frames.clone());
            tasks.push(tokio::spawn(async move {
                let mut ws =
                    client::connect(node, src, &format!("xr{u}"), &format!("d{k}")).await?;
                let view = Arc::new(Mutex::new(View::default()));
                let first = client::join(&mut ws, CROSS_ROOM).await?;
                view.lock().unwrap().apply(&first);
                drop(permit);
                let (tx, rx) = ws.split();
                let v = view.clone();
                let reader = spawn_reader(rx, stop, move |f, _| {
                    if f["type"] == "room" {
                        frames.fetch_add(1, Ordering::Relaxed);
                    }
                    v.lock().unwrap().apply(f);
                });
                let member = Member { tx, reader };
                anyhow::Ok(Resident {
                    user: u,
                    member,
                    view,
                })
            }));
        }
    }
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        out.push(t.await??);
    }
    Ok(out)
}

/// Sends one frame on each of `txs`.
async fn send_all<'a>(
    txs: impl Iterator<Item = &'a mut SplitSink<Ws, Message>>,
    frame: &Value,
) -> anyhow::Result<()> {
    for tx in txs {
        tx.send(Message::Text(frame.to_string().into())).await?;
    }
    Ok(())
}

/// The crossed room's residents, the attacker's churners, and what they
/// got.
struct Crowd {
    /// The resident devices.
    residents: Vec<Resident>,
    /// The attacker's devices, one per churning user.
    churners: Vec<Member>,
    /// `room` frames the residents got.
    room_frames: Arc<AtomicU64>,
    /// Error frames the churners got (e.g. `rate_limited`).
    refused: Arc<AtomicU64>,
}

/// Phase 3: churners crossing the list limit, then residents with them.
/// Returns the number of resident views that did not end equal to the room.
pub(super) async fn crossing(
    ctx: &Ctx,
    args: &AttackArgs,
    report: &mut Report,
) -> anyhow::Result<usize> {
    eprintln!(
        "rooms-attack: crossing: {} users x {} devices in {CROSS_ROOM}, {} churners",
        args.residents, args.resident_devices, args.churners
    );
    let (stop, stop_rx) = watch::channel(false);
    let room_frames = Arc::new(AtomicU64::new(0));
    let residents = residents(ctx, args, &stop_rx, &room_frames).await?;
    let refused = Arc::new(AtomicU64::new(0));
    let mut churners = Vec::with_capacity(args.churners);
    for i in 0..args.churners {
        let ws = client::connect(ctx.node(1), ctx.attacker_ip, &format!("xc{i}"), "d").await?;
        let (tx, rx) = ws.split();
        let refused = refused.clone();
        let reader = spawn_reader(rx, stop_rx.clone(), move |f, _| {
            if f["type"] == "error" {
                refused.fetch_add(1, Ordering::Relaxed);
            }
        });
        churners.push(Member { tx, reader });
    }
    let mut crowd = Crowd {
        residents,
        churners,
        room_frames,
        refused,
    };
    let mut stale = 0;
    for (phase, flip) in [("crossing", false), ("crossing_both", true)] {
        stale += crowd.cross(ctx, args, report, phase, flip).await?;
    }
    let Crowd {
        residents,
        churners,
        ..
    } = crowd;
    let all = residents.into_iter().map(|r| r.member).chain(churners);
    leave_all(all.collect(), stop).await;
    Ok(stale)
}

impl Crowd {
    /// One variant: churns for `--crossing-secs` (the residents below
    /// `--churners` too when `flip`), lets the views settle and reports.
    /// Returns the number of stale views.
    async fn cross(
        &mut self,
        ctx: &Ctx,
        args: &AttackArgs,
        report: &mut Report,
        phase: &str,
        flip: bool,
    ) -> anyhow::Result<usize> {
        eprintln!("rooms-attack: {phase} for {} s", args.crossing_secs);
        let reads0 = shared_reads(ctx).await?;
        let frames0 = self.room_frames.load(Ordering::Relaxed);
        let refused0 = self.refused.load(Ordering::Relaxed);
        let monitor = Monitor::start(ctx).await?;
        let cycles = args.crossing_secs * 1_000 / CYCLE.as_millis() as u64;
        churn(self, args.churners, flip, cycles).await?;
        let params = json!({"residents": args.residents, "devices_each": args.resident_devices,
                            "churners": args.churners, "secs": args.crossing_secs,
                            "residents_flip": flip});
        monitor.finish(ctx, report, phase, None, params).await;
        // The room ends at `--residents` users: above the point where it
        // lists again, so still counting after `crossing`; listing after
        // `crossing_both`, whose last crossing was down below that point.
        let settled = settle(ctx, &self.residents, flip).await?;
        let reads1 = shared_reads(ctx).await?;
        let mut fig = |name: &str, value: f64, unit: &str, mut extra: Value| {
            extra["phase"] = json!(phase);
            report.figure(&format!("{phase}_{name}"), value, unit, extra);
        };
        for (k, node) in ["a", "b"].iter().enumerate() {
            let metric = "presence_room_shared_reads_total";
            let extra = json!({"metric": metric, "cycles": cycles});
            fig(
                &format!("shared_reads_node_{node}"),
                reads1[k] - reads0[k],
                "reads",
                extra,
            );
        }
        let devices = self.residents.len();
        let frames = self.room_frames.load(Ordering::Relaxed) - frames0;
        let extra = json!({"resident_devices": devices});
        fig("room_frames_to_residents", frames as f64, "frames", extra);
        let refused = self.refused.load(Ordering::Relaxed) - refused0;
        fig("attacker_error_frames", refused as f64, "frames", json!({}));
        let extra = json!({"room_users": settled.users, "room_devices": settled.devices,
                           "resident_devices": devices, "listing_views": settled.listing,
                           "target_max": 0});
        fig("stale_views", settled.stale as f64, "devices", extra);
        Ok(settled.stale)
    }
}

/// `cycles` of: the churners join, then leave, half a cycle apart; with
/// `flip`, every device of the resident users below `flippers` leaves with
/// them and, from the second cycle on, joins with them (and once more at
/// the end, so that the room ends as it began).
async fn churn(crowd: &mut Crowd, flippers: usize, flip: bool, cycles: u64) -> anyhow::Result<()> {
    let frames = [
        json!({"type": "join", "room": CROSS_ROOM, "state": {}}),
        json!({"type": "leave", "room": CROSS_ROOM}),
    ];
    let mut tick = tokio::time::interval(CYCLE / 2);
    for step in 0..2 * cycles + u64::from(flip) {
        tick.tick().await;
        let frame = &frames[(step % 2) as usize];
        if step < 2 * cycles {
            send_all(crowd.churners.iter_mut().map(|m| &mut m.tx), frame).await?;
        }
        if flip && step > 0 {
            let flippers = crowd.residents.iter_mut().filter(|r| r.user < flippers);
            send_all(flippers.map(|r| &mut r.member.tx), frame).await?;
        }
    }
    Ok(())
}

/// Both nodes' `presence_room_shared_reads_total`.
async fn shared_reads(ctx: &Ctx) -> anyhow::Result<[f64; 2]> {
    let metric = "presence_room_shared_reads_total";
    Ok([
        procs::node_metric_sum(ctx.node(0), metric).await?,
        procs::node_metric_sum(ctx.node(1), metric).await?,
    ])
}

/// The crossed room after the crossing, and the residents' views of it.
struct Settled {
    /// The room's counts, as `GET /api/rooms/{room}` reads them.
    users: u64,
    devices: u64,
    /// Views that differ from them, or are in the wrong mode (a list where
    /// the room counts, or the other way round): such a view misses what
    /// the room's mode sends.
    stale: usize,
    /// Views with a member list.
    listing: usize,
}

/// Waits (at most [`SETTLE`]) until every resident's view equals the
/// room's counts, each with a member list if `listing`, else none.
async fn settle(ctx: &Ctx, residents: &[Resident], listing: bool) -> anyhow::Result<Settled> {
    let url = format!("http://{}/api/rooms/{CROSS_ROOM}?limit=1", ctx.node(0));
    let deadline = Instant::now() + SETTLE;
    loop {
        let resp = ctx.probe.get(&url).send().await?.error_for_status()?;
        let room: Value = resp.json().await?;
        let users = room["users"].as_u64().unwrap_or(0);
        let devices = room["devices"].as_u64().unwrap_or(0);
        let views: Vec<(bool, bool)> = residents
            .iter()
            .map(|r| {
                let view = r.view.lock().unwrap();
                (view.agrees(users, devices), view.members.is_some())
            })
            .collect();
        let stale = views
            .iter()
            .filter(|(agrees, list)| !agrees || *list != listing)
            .count();
        if stale == 0 || Instant::now() >= deadline {
            return Ok(Settled {
                users,
                devices,
                stale,
                listing: views.iter().filter(|(_, list)| *list).count(),
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
