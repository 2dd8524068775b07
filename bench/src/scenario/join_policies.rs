//! Phase 4 of `rooms`: what a join costs under each `--room-policy`.
//!
//! One node under `--auth jwt`, with one rule per policy (`open:*=open`,
//! `claim:*=claim`, `members:*=members`, `token:*=token`,
//! `proxy:*=proxy`) and an app backend in this process answering the
//! `proxy` questions at once (`{"allow":true}`, read in full, no
//! signature check: the figure is the node's own cost). `--join-samples`
//! devices each join a room of their own under every policy, one join at a
//! time across the whole run, so that a figure is a join's latency and not
//! a queue's: from the `join` frame sent to its `room` frame. `proxy`
//! twice: first joins (the backend asked), then the same joins again after
//! a leave (answered from the node's cache). The member lists are put
//! before, and the room tokens minted before, neither timed.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use futures_util::SinkExt;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

use crate::client::{next_json, Ws, HANDSHAKE_TIMEOUT};
use crate::report::{latency_histogram, Report};
use crate::{Common, Setup};

/// The nodes' JWT secret (HS256) and the admin key of the member lists.
const SECRET: &str = "bench-join-policies-secret-0123456789";
const ADMIN: &str = "bench-join-policies-admin-key";
/// The policies, each the prefix of its rooms (`<policy>:<user>`).
const POLICIES: [&str; 5] = ["open", "claim", "members", "token", "proxy"];

/// An HS256 token of `claims`.
fn token(claims: &Value) -> String {
    jsonwebtoken::encode(
        &jsonwebtoken::Header::default(),
        claims,
        &jsonwebtoken::EncodingKey::from_secret(SECRET.as_bytes()),
    )
    .expect("HS256 signs any claims")
}

fn exp() -> i64 {
    crate::now_ms() / 1000 + 3600
}

/// A backend that lets everyone in, and counts the questions.
async fn backend() -> anyhow::Result<(SocketAddr, Arc<AtomicU64>)> {
    let asked = Arc::new(AtomicU64::new(0));
    let count = asked.clone();
    let addr = crate::http_sink::serve(move |_| {
        count.fetch_add(1, Ordering::Relaxed);
        (200, r#"{"allow":true}"#.to_string())
    })
    .await?;
    Ok((addr, asked))
}

/// The node's flags: a rule per policy, the backend, the keys.
fn node_flags(backend: SocketAddr, policies: &[&str]) -> Vec<String> {
    let mut flags: Vec<String> = [
        "--auth",
        "jwt",
        "--jwt-secret",
        SECRET,
        "--admin-key",
        ADMIN,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for policy in POLICIES.into_iter().filter(|p| policies.contains(p)) {
        flags.extend(["--room-policy".into(), format!("{policy}:*={policy}")]);
    }
    flags.extend([
        "--room-join-url".into(),
        format!("http://{backend}/join"),
        "--room-join-secret".into(),
        "bench-room-join-secret-0123".into(),
    ]);
    flags
}

/// A device of `user` on `node`, past its `auth` first frame.
async fn connect(node: SocketAddr, user: &str) -> anyhow::Result<Ws> {
    let tcp = tokio::net::TcpStream::connect(node).await?;
    tcp.set_nodelay(true)?;
    let (mut ws, _) =
        tokio_tungstenite::client_async(format!("ws://{node}/ws?device=d"), tcp).await?;
    let claims = json!({"sub": user, "exp": exp(), "rooms": ["claim:*"]});
    let frame = json!({"type": "auth", "token": token(&claims)});
    ws.send(Message::Text(frame.to_string().into())).await?;
    loop {
        let v = tokio::time::timeout(HANDSHAKE_TIMEOUT, next_json(&mut ws)).await??;
        match v["type"].as_str() {
            Some("hello") => return Ok(ws),
            Some("error") => anyhow::bail!("{user}: {v}"),
            _ => {}
        }
    }
}

/// Sends `frame` and waits for the `room` frame of `room`: the time it took.
async fn timed_join(ws: &mut Ws, room: &str, frame: Value) -> anyhow::Result<u64> {
    let start = Instant::now();
    ws.send(Message::Text(frame.to_string().into())).await?;
    loop {
        let v = tokio::time::timeout(HANDSHAKE_TIMEOUT, next_json(ws))
            .await
            .with_context(|| format!("no room frame for {room}"))??;
        match v["type"].as_str() {
            Some("room") if v["room"] == room => return Ok(start.elapsed().as_micros() as u64),
            Some("error") => anyhow::bail!("join {room}: {v}"),
            _ => {}
        }
    }
}

/// Puts each device's user on the member list of its `members` room.
async fn put_member_lists(node: SocketAddr, users: &[String]) -> anyhow::Result<()> {
    let http = reqwest::Client::new();
    for user in users {
        let res = http
            .put(format!("http://{node}/api/rooms/members:{user}/members"))
            .bearer_auth(ADMIN)
            .json(&json!({"users": [user]}))
            .send()
            .await?;
        anyhow::ensure!(res.status().is_success(), "PUT members: {}", res.status());
    }
    Ok(())
}

/// Every device joins its room under `policy`, one join at a time; with
/// `leave`, leaves it after. The latency of each join.
async fn joins(
    devices: &mut [(String, Ws)],
    policy: &str,
    leave: bool,
) -> anyhow::Result<hdrhistogram::Histogram<u64>> {
    let mut hist = latency_histogram();
    for (user, ws) in devices.iter_mut() {
        let room = format!("{policy}:{user}");
        let mut frame = json!({"type": "join", "room": room, "state": {}});
        if policy == "token" {
            frame["token"] = json!(token(&json!({"sub": user, "room": room, "exp": exp()})));
        }
        hist.saturating_record(timed_join(ws, &room, frame).await?);
        if leave {
            let frame = json!({"type": "leave", "room": room});
            ws.send(Message::Text(frame.to_string().into())).await?;
        }
    }
    Ok(hist)
}

pub async fn run(
    common: &Common,
    args: &super::rooms::RoomsArgs,
    setup: &mut Setup,
    report: &mut Report,
) -> anyhow::Result<()> {
    let samples = args.join_samples;
    let timed: Vec<&str> = POLICIES
        .into_iter()
        .filter(|p| args.join_policies.iter().any(|q| q == p))
        .collect();
    anyhow::ensure!(
        timed.len() == args.join_policies.len(),
        "--join-policies: each of {POLICIES:?}"
    );
    let (backend, asked) = backend().await?;
    setup.nodes.clear();
    setup.node_args = node_flags(backend, &timed);
    setup.start_nodes(common, 1, None)?;
    let node = setup.nodes[0].addr;
    let users: Vec<String> = (0..samples).map(|i| format!("jp{i}")).collect();
    put_member_lists(node, &users).await?;
    let mut devices = Vec::with_capacity(samples);
    for user in &users {
        devices.push((user.clone(), connect(node, user).await?));
    }
    // A warm-up pass, not counted: connections to Redis and to the
    // backend made, scripts loaded.
    joins(&mut devices[..samples.min(20)], "open", true).await?;
    for &policy in &timed {
        let leave = policy == "proxy";
        let hist = joins(&mut devices, policy, leave).await?;
        let name = if leave {
            "proxy (backend asked)"
        } else {
            policy
        };
        report.latency(
            &format!("join latency, {name}"),
            &hist,
            json!({"policy": policy, "samples": samples}),
        );
    }
    if !timed.contains(&"proxy") {
        return Ok(());
    }
    let before = asked.load(Ordering::Relaxed);
    let hist = joins(&mut devices, "proxy", false).await?;
    let again = asked.load(Ordering::Relaxed) - before;
    report.latency(
        "join latency, proxy (cached answer)",
        &hist,
        json!({"policy": "proxy", "samples": samples, "backend_asked": again}),
    );
    anyhow::ensure!(
        again == 0,
        "the cached joins asked the backend {again} times"
    );
    Ok(())
}
