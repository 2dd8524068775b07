//! A slow Redis must slow a session's answers, never its delivery of
//! events: a session that waits on Redis with a paused mailbox lets events
//! pile up until the registry cuts a healthy client as "slow".
//!
//! The delay is real: node A talks to Redis through a TCP proxy in this test
//! that holds every reply for [`DELAY`]. Node B talks to Redis directly and
//! makes the transitions. All 200 watchers on A keep their sessions waiting
//! on Redis (a status frame every 400 ms). [`HOT`] of them watch users that
//! change faster than [`QUEUE`] events per round trip: a session that
//! paused its mailbox for each of its requests would overflow; the rest
//! watch users that change slowly. None may be cut, each must get every
//! event. (All 200 at the hot rate would measure this machine's fan-out in
//! a debug build rather than the session.)

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::common::*;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

/// How long the proxy holds each reply from Redis.
const DELAY: Duration = Duration::from_millis(300);
/// Watching clients on the slowed node.
const WATCHERS: usize = 200;
/// Of those, the ones watching the fast-changing users.
const HOT: usize = 20;
/// Users watched by each group.
const TARGETS: usize = 5;
/// Times each hot user comes online and goes offline, one change every 15 ms.
const HOT_CYCLES: usize = 10;
/// Times each calm user does, one change every 150 ms.
const CALM_CYCLES: usize = 2;
/// Events a watcher may have queued on node A before it is cut: the
/// smallest the node accepts, so that a mailbox paused for one Redis round
/// trip overflows at the hot rate (about 66 events/s, 20 per round trip).
const QUEUE: &str = "16";

/// A TCP proxy to `upstream` that forwards requests at once and holds each
/// chunk of reply for `delay`, in order; returns its port. It runs on a
/// thread of its own, so that the test's 200 clients cannot hold it back
/// and turn its steady replies into bursts.
fn delaying_proxy(upstream: u16, delay: Duration) -> u16 {
    let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    std_listener.set_nonblocking(true).unwrap();
    let port = std_listener.local_addr().unwrap().port();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    std::thread::spawn(move || runtime.block_on(proxy(std_listener, upstream, delay)));
    port
}

async fn proxy(std_listener: std::net::TcpListener, upstream: u16, delay: Duration) {
    let listener = TcpListener::from_std(std_listener).unwrap();
    {
        while let Ok((client, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                    return;
                };
                let (mut client_rd, mut client_wr) = client.into_split();
                let (mut server_rd, mut server_wr) = server.into_split();
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut client_rd, &mut server_wr).await;
                });
                let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        match server_rd.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => {
                                if tx
                                    .send((Instant::now() + delay, buf[..n].to_vec()))
                                    .is_err()
                                {
                                    return;
                                }
                            }
                        }
                    }
                });
                while let Some((due, bytes)) = rx.recv().await {
                    tokio::time::sleep_until(due.into()).await;
                    if client_wr.write_all(&bytes).await.is_err() {
                        return;
                    }
                }
            });
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_redis_does_not_cut_watchers_that_read() {
    raise_fd_limit();
    let redis = Redis::start();
    let proxy = delaying_proxy(redis.port, DELAY);
    let slow_url = format!("redis://127.0.0.1:{proxy}/0");
    let args: Vec<String> = [
        "--listen",
        "127.0.0.1:0",
        "--redis-url",
        &slow_url,
        "--node-id",
        "a",
        // A lease refresh is two slowed round trips: a TTL of 3 s keeps
        // them well inside it, so that no lease lapses on a busy machine.
        "--heartbeat-ms",
        "1000",
        "--max-queued-events",
        QUEUE,
        // 200 sessions set up at once over a 300 ms Redis: no shedding
        // (its cap bounds setups per second to 128 / their time).
        "--max-pending-claims",
        "0",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let a = Node::spawn("a", &args, &[]).unwrap_or_else(|log| panic!("node A:\n{log}"));
    let b = Node::start(&redis, "fast");

    // Round trip through the proxy, to show the delay is there.
    let started = Instant::now();
    let (status, _) = get(&format!("{}/api/presence/nobody", a.http())).await;
    assert_eq!(status, 200);
    let rtt = started.elapsed();
    assert!(rtt >= DELAY, "the proxy did not slow Redis: {rtt:?}");

    let hot: Vec<String> = (0..TARGETS).map(|i| format!("hot{i}")).collect();
    let calm: Vec<String> = (0..TARGETS).map(|i| format!("calm{i}")).collect();
    // Each connect waits for its lease claim, a slowed round trip: all at once.
    let names: Vec<String> = (0..WATCHERS).map(|i| format!("w{i}")).collect();
    let mut watchers =
        futures_util::future::join_all(names.iter().map(|n| Client::connect(&a, n, "d"))).await;
    for (i, w) in watchers.iter_mut().enumerate() {
        let users = if i < HOT { &hot } else { &calm };
        w.send(json!({"type": "watch", "users": users})).await;
    }
    for w in &mut watchers {
        let snap = w.expect("snapshot").await;
        assert_eq!(snap["presence"].as_array().unwrap().len(), TARGETS);
    }

    // Each watcher keeps its session busy with Redis: a status frame every
    // 400 ms, each one a round trip of at least DELAY. The same status each
    // time, so that only the first one publishes anything.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut ticking = Vec::new();
    for (i, mut w) in watchers.into_iter().enumerate() {
        let mut stop = stop_rx.clone();
        let expected = TARGETS * 2 * if i < HOT { HOT_CYCLES } else { CALM_CYCLES };
        ticking.push(tokio::spawn(async move {
            let mut presences: HashMap<String, usize> = HashMap::new();
            let mut closed = None;
            let mut tick = tokio::time::interval(Duration::from_millis(400));
            loop {
                tokio::select! {
                    _ = tick.tick() => {
                        let status = json!({"type": "status", "status": "busy", "text": "on a call"});
                        let frame = tokio_tungstenite::tungstenite::Message::Text(status.to_string().into());
                        if w.sink_send(frame).await.is_err() {
                            break;
                        }
                    }
                    item = w.next_within(Duration::from_millis(50)) => match item {
                        Some(Incoming::Frame(v)) if v["type"] == "presence" => {
                            let user = v["user"].as_str().unwrap_or("").to_string();
                            *presences.entry(user).or_default() += 1;
                        }
                        Some(Incoming::Closed(c)) => { closed = Some(c); break; }
                        _ => {}
                    },
                    _ = stop.changed() => break,
                }
                if presences.values().sum::<usize>() == expected {
                    break;
                }
            }
            (w.user.clone(), expected, presences, closed)
        }));
    }

    // The transitions, made on the fast node: both groups at once.
    let started = Instant::now();
    tokio::join!(
        churn(&b, &hot, HOT_CYCLES, Duration::from_millis(15)),
        churn(&b, &calm, CALM_CYCLES, Duration::from_millis(150)),
    );
    let made = started.elapsed();

    let stopper = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(30)).await;
        let _ = stop_tx.send(true);
    });
    let results = futures_util::future::join_all(ticking).await;
    stopper.abort();
    let mut cut = 0;
    let mut short = Vec::new();
    for r in results {
        let (user, expected, presences, closed) = r.unwrap();
        if closed.is_some() {
            cut += 1;
        }
        let got: usize = presences.values().sum();
        if got != expected {
            short.push(format!("{user}: {got} of {expected} ({closed:?})"));
        }
    }
    eprintln!(
        "slowed redis ({DELAY:?} per reply, round trip {rtt:?}): transitions made in {made:?}; \
         {cut} of {WATCHERS} watchers cut, {} short of their events",
        short.len(),
    );
    assert_eq!(
        cut,
        0,
        "watchers cut: {short:?}\nnode A log:\n{}",
        tail(&a.logs())
    );
    assert!(short.is_empty(), "watchers short of events: {short:?}");
    assert!(
        !a.logs().contains("reads too slowly"),
        "a healthy watcher was cut:\n{}",
        tail(&a.logs())
    );
}

/// Brings each of `users` online and offline on `node`, `cycles` times,
/// one change every `pace`.
async fn churn(node: &Node, users: &[String], cycles: usize, pace: Duration) {
    let mut pace = tokio::time::interval(pace);
    for _ in 0..cycles {
        let mut devices = Vec::new();
        for u in users {
            pace.tick().await;
            devices.push(Client::connect(node, u, "phone").await);
        }
        for d in devices {
            pace.tick().await;
            d.close().await;
        }
    }
}

/// The lines of a log that tell why sessions ended: warnings, errors, and
/// the session's own reasons, at most 60.
fn tail(log: &str) -> String {
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| {
            ["WARN", "ERROR", "silent", "slow", "flood", "closing"]
                .iter()
                .any(|k| l.contains(k))
        })
        .collect();
    lines[..lines.len().min(60)].join("\n")
}
