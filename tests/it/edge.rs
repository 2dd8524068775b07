//! Hostile clients at the WebSocket edge (issue 12): oversized and
//! malformed frames, fragments, close codes and connection teardown, each
//! sent with a raw socket.

use std::time::{Duration, Instant};

use crate::common::raw::{self, Raw, Read, CLOSE, CONT, PING, PONG, TEXT};
use crate::common::*;
use tokio::io::AsyncWriteExt;

/// A header announcing 1 GiB is refused as soon as it is read: the node
/// answers with 1009 and closes the socket within 200 ms, and its memory
/// does not grow with the bytes that keep coming.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_1gib_frame_header_is_refused_before_its_payload() {
    let redis = Redis::start();
    let node = Node::start(&redis, "n1");
    let Raw {
        mut reader,
        mut writer,
    } = Raw::hello(&node, "big", "d").await;
    let pid = node.pid();
    let before = raw::rss_kib(pid);

    writer
        .write_all(&raw::header(true, TEXT, 1 << 30))
        .await
        .unwrap();
    let sent = Instant::now();
    // Stream payload for as long as the node takes it (at most 1 GiB), and
    // for half a second after it closed (it drains meanwhile).
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop = done.clone();
    let streamer = tokio::spawn(async move {
        let chunk = raw::mask(&vec![b'x'; 64 * 1024], 0);
        let mut sent = 0u64;
        let mut stop_at = None;
        while sent < 1 << 30 {
            if stop.load(std::sync::atomic::Ordering::Relaxed) {
                let at =
                    *stop_at.get_or_insert_with(|| Instant::now() + Duration::from_millis(500));
                if Instant::now() > at {
                    break;
                }
            }
            if writer.write_all(&chunk).await.is_err() {
                break;
            }
            sent += chunk.len() as u64;
        }
        sent
    });
    let sampler = tokio::spawn(async move {
        let mut peak = 0;
        let end = Instant::now() + Duration::from_millis(1500);
        while Instant::now() < end {
            peak = peak.max(raw::rss_kib(pid));
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        peak
    });

    let close = reader.expect_close(DEADLINE).await;
    let close_after = sent.elapsed();
    let eof = reader.wait_eof(DEADLINE).await;
    let eof_after = sent.elapsed();
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let peak = sampler.await.unwrap();
    let streamed = tokio::time::timeout(DEADLINE, streamer)
        .await
        .map(|r| r.unwrap())
        .unwrap_or(0);
    let grew = peak.saturating_sub(before);
    println!(
        "1 GiB header: close {} after {close_after:?}, socket closed after {eof_after:?}; \
         RSS {before} KiB -> peak {peak} KiB (+{grew} KiB) while {} MiB were streamed",
        close.0,
        streamed >> 20
    );
    assert_eq!(close.0, 1009, "{close:?}");
    assert!(
        close_after < Duration::from_millis(200),
        "close after {close_after:?}"
    );
    assert!(eof, "socket still open");
    assert!(
        eof_after < Duration::from_millis(200),
        "socket closed after {eof_after:?}"
    );
    assert!(grew <= 16 * 1024, "RSS grew by {grew} KiB");
}

/// A text message in three fragments, with a ping between them, is
/// assembled and answered like one frame; the ping is answered at once.
#[tokio::test]
async fn a_fragmented_message_is_assembled() {
    let redis = Redis::start();
    let node = Node::start(&redis, "n1");
    let mut c = Raw::hello(&node, "alice", "a").await;
    let msg = br#"{"type":"watch","users":["bob","carol"]}"#;
    c.send(&raw::frame(false, TEXT, &msg[..10])).await;
    c.send(&raw::frame(true, PING, b"hi")).await;
    c.send(&raw::frame(false, CONT, &msg[10..20])).await;
    c.send(&raw::frame(true, CONT, &msg[20..])).await;
    let mut ponged = false;
    let snapshot = loop {
        match c.reader.next(DEADLINE).await {
            Read::Frame(f) if f.opcode == PONG => {
                assert_eq!(f.payload, b"hi");
                ponged = true;
            }
            Read::Frame(f) if f.opcode == PING => {}
            Read::Frame(f) if f.opcode == TEXT => break f.json(),
            other => panic!("expected the snapshot, got {other:?}"),
        }
    };
    assert!(ponged, "the ping between fragments was not answered first");
    assert_eq!(snapshot["type"], "snapshot", "{snapshot}");
    assert_eq!(snapshot["presence"].as_array().unwrap().len(), 2);
}

/// Sends `bytes` on a fresh connection and expects the close frame with
/// `code` followed by the end of the TCP connection.
async fn expect_close_for(node: &Node, what: &str, bytes: &[Vec<u8>], code: u16) {
    let mut c = Raw::hello(node, "alice", what).await;
    for b in bytes {
        c.send(b).await;
    }
    let (got, reason) = c.reader.expect_close(DEADLINE).await;
    println!("{what}: close {got} {reason:?}");
    assert_eq!(got, code, "{what}: {reason}");
    assert!(
        c.reader.wait_eof(Duration::from_secs(1)).await,
        "{what}: socket still open after the close frame"
    );
}

/// Protocol violations close with 1002, text that is not UTF-8 with 1007,
/// a message over the limit (even in fragments) with 1009; each close frame
/// comes before the socket closes.
#[tokio::test]
async fn refused_frames_close_with_their_rfc_6455_code() {
    let redis = Redis::start();
    let node = Node::start_with(&redis, "n1", &["--max-frame-bytes", "1024"]);
    let ok = br#"{"type":"heartbeat"}"#;
    let mut unmasked = vec![0x81, ok.len() as u8];
    unmasked.extend_from_slice(ok);
    let mut reserved = raw::frame(true, TEXT, ok);
    reserved[0] |= 0x40;
    let cases: Vec<(&str, Vec<Vec<u8>>, u16)> = vec![
        ("unmasked", vec![unmasked], 1002),
        ("reserved-bits", vec![reserved], 1002),
        ("bad-opcode", vec![raw::frame(true, 0x3, ok)], 1002),
        ("lone-continuation", vec![raw::frame(true, CONT, ok)], 1002),
        (
            "text-inside-fragments",
            vec![raw::frame(false, TEXT, b"{"), raw::frame(true, TEXT, ok)],
            1002,
        ),
        ("fragmented-ping", vec![raw::frame(false, PING, b"x")], 1002),
        ("long-ping", vec![raw::header(true, PING, 200)], 1002),
        (
            "not-utf8",
            vec![raw::frame(true, TEXT, &[b'"', 0xff, 0xfe])],
            1007,
        ),
        (
            "not-utf8-fragments",
            vec![
                raw::frame(false, TEXT, &[b'"', 0xc3]),
                raw::frame(true, CONT, b"\""),
            ],
            1007,
        ),
        ("oversized", vec![raw::header(true, TEXT, 1025)], 1009),
        (
            "oversized-fragments",
            vec![
                raw::frame(false, TEXT, &[b' '; 600]),
                raw::frame(false, CONT, &[b' '; 600]),
            ],
            1009,
        ),
    ];
    for (what, bytes, code) in &cases {
        expect_close_for(&node, what, bytes, *code).await;
    }
}

/// After the client's close frame, the server answers with its own and
/// ends the TCP connection right after: under 50 ms.
#[tokio::test]
async fn a_clean_close_ends_the_socket_at_once() {
    let redis = Redis::start();
    let node = Node::start(&redis, "n1");
    let mut c = Raw::hello(&node, "alice", "a").await;
    c.send(&raw::close_frame(1000)).await;
    let sent = Instant::now();
    let (code, _) = c.reader.expect_close(DEADLINE).await;
    let closed = c.reader.wait_eof(DEADLINE).await;
    let took = sent.elapsed();
    println!("clean close: close {code}, socket closed {took:?} after the client's close frame");
    assert_eq!(code, 1000);
    assert!(closed);
    assert!(
        took < Duration::from_millis(50),
        "socket closed after {took:?}"
    );
    let _ = CLOSE;
}

mod parser {
    //! The frame parser's header-length path (vendored actix-http, see
    //! vendor/README.md), over arbitrary headers, limits and partial payloads.

    use super::raw;
    use actix_http::ws::{OpCode, Parser, ProtocolError};
    use bytes::BytesMut;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]

        /// A length over the limit is refused from the header alone, however
        /// little of the payload has come; a length within it waits for the
        /// payload without reserving more than the limit; a whole frame
        /// within it parses to exactly its payload.
        #[test]
        fn the_length_is_checked_at_the_header(
            opcode in prop::sample::select(vec![0u8, 1, 2, 8, 9, 10]),
            fin in any::<bool>(),
            len in prop_oneof![0u64..300, 0u64..70_000, any::<u64>()],
            max in prop_oneof![0usize..300, 0usize..100_000],
            sent in 0usize..70_000,
        ) {
            let head = raw::header(fin, opcode, len);
            let body = sent.min(usize::try_from(len).unwrap_or(usize::MAX));
            let mut buf = BytesMut::from(&head[..]);
            buf.extend_from_slice(&raw::mask(&vec![b'a'; body], 0));
            let control = opcode >= 8;
            match Parser::parse(&mut buf, true, max) {
                Err(ProtocolError::Overflow) => prop_assert!(len > max as u64),
                Err(ProtocolError::InvalidLength(n)) => prop_assert!(control && n > 125),
                Err(e) => prop_assert!(false, "unexpected error {e}"),
                Ok(None) => {
                    prop_assert!(len <= max as u64, "waited for {len} bytes over a {max} limit");
                    prop_assert!(!control || len <= 125);
                    prop_assert!((body as u64) < len);
                    prop_assert!(
                        buf.capacity() <= 2 * (head.len() + max + body) + 64,
                        "reserved {} for a {max} limit", buf.capacity()
                    );
                }
                Ok(Some((f, op, payload))) => {
                    prop_assert!(len <= max as u64);
                    prop_assert_eq!(f, fin);
                    prop_assert_eq!(op, OpCode::from(opcode));
                    let got = payload.map_or(0, |p| p.len());
                    prop_assert_eq!(got as u64, len);
                }
            }
        }
    }
}

/// The status of a plain HTTP GET of `path` with `Host: host`.
async fn get_status_with_host(node: &Node, path: &str, host: &str) -> u16 {
    status_with_host(&node.addr.to_string(), "GET", path, host, "").await
}

/// DNS rebinding: under development auth a page on any domain resolving to
/// 127.0.0.1 sends its own name as Host (and as Origin). Such a Host gets
/// 403 on /ws and /api/*; loopback names and --allowed-host names pass.
#[tokio::test]
async fn dev_auth_answers_only_loopback_or_allowed_hosts() {
    let redis = Redis::start();
    let ws = "/ws?user=alice&device=a";
    // Without --allowed-host first, so that this fails on a node without the check.
    let plain = Node::start(&redis, "n0");
    let status = get_status_with_host(&plain, "/api/online", "rebind.example").await;
    assert_eq!(status, 403, "/api/online with Host rebind.example");
    let (status, head, _, _) = raw::handshake(plain.addr, ws, &[("host", "rebind.example")]).await;
    assert_eq!(status, 403, "/ws with Host rebind.example: {head}");

    let node = Node::start_with(&redis, "n1", &["--allowed-host", "presence.test"]);
    let port = node.addr.port();
    for (host, want) in [
        (format!("rebind.example:{port}"), 403),
        ("rebind.example".to_string(), 403),
        (format!("localhost:{port}"), 101),
        (format!("127.0.0.1:{port}"), 101),
        (format!("PRESENCE.test:{port}"), 101),
    ] {
        let (status, head, _, _) = raw::handshake(node.addr, ws, &[("host", &host)]).await;
        println!("/ws with Host {host}: {status}");
        assert_eq!(status, want, "Host {host}: {head}");
    }
    for (host, want) in [
        (format!("rebind.example:{port}"), 403),
        (format!("localhost:{port}"), 200),
        ("presence.test".to_string(), 200),
    ] {
        for path in ["/api/presence/bob", "/api/online"] {
            let status = get_status_with_host(&node, path, &host).await;
            println!("{path} with Host {host}: {status}");
            assert_eq!(status, want, "{path} with Host {host}");
        }
    }
    // Not an API: the demo page and health answer under any name.
    assert_eq!(
        get_status_with_host(&node, "/healthz", "rebind.example").await,
        200
    );
}

/// Script calls Redis has served so far (EVAL and EVALSHA).
async fn script_calls(redis: &Redis) -> u64 {
    let mut c = redis.aconn().await;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut c)
        .await
        .unwrap();
    info.lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// Four sessions looping `watch` on the same 1,000 users: after the first
/// snapshot only users new to a session are read, so the loop costs Redis
/// under 1,000 script calls per second (it cost ~100k/s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn re_watching_reads_only_new_users() {
    let redis = Redis::start();
    let node = Node::start(&redis, "n1");
    let users: Vec<String> = (0..1000).map(|i| format!("u{i}")).collect();
    let frame = serde_json::json!({"type":"watch","users":users});
    let mut clients = Vec::new();
    for i in 0..4 {
        let mut c = Client::connect(&node, &format!("looper{i}"), "d").await;
        c.send(frame.clone()).await;
        assert_eq!(
            c.expect("snapshot").await["presence"]
                .as_array()
                .unwrap()
                .len(),
            1000
        );
        clients.push(c);
    }
    let before = script_calls(&redis).await;
    let start = Instant::now();
    let loops = clients.into_iter().map(|mut c| {
        let frame = frame.clone();
        tokio::spawn(async move {
            let mut answered = 0u32;
            while start.elapsed() < Duration::from_secs(2) {
                c.send(frame.clone()).await;
                // A snapshot, or rate_limited from the frame limit.
                let v = c.recv().await;
                assert!(
                    v["type"] == "snapshot" || v["code"] == "rate_limited",
                    "{v}"
                );
                answered += 1;
                // 25 watches a second: within the frame limit (30/s), so
                // that every watch is answered.
                tokio::time::sleep(Duration::from_millis(40)).await;
            }
            answered
        })
    });
    let answered: u32 = futures_util::future::join_all(loops)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .sum();
    let secs = start.elapsed().as_secs_f64();
    let per_sec = (script_calls(&redis).await - before) as f64 / secs;
    println!(
        "re-watch loop: {answered} watches answered in {secs:.1} s, {per_sec:.0} script calls/s"
    );
    assert!(answered > 20, "the loop hardly ran: {answered}");
    assert!(per_sec < 1000.0, "{per_sec:.0} script calls/s");
}

/// Watch/unwatch in a loop reads new users every time: the reads are
/// bounded by --max-user-reads-per-sec, beyond which the watch is refused
/// with `rate_limited`.
#[tokio::test]
async fn user_reads_are_bounded_per_second() {
    let redis = Redis::start();
    let node = Node::start_with(
        &redis,
        "n1",
        &["--max-user-reads-per-sec", "100", "--max-watches", "200"],
    );
    let users: Vec<String> = (0..200).map(|i| format!("u{i}")).collect();
    let mut c = Client::connect(&node, "looper", "d").await;
    let before = script_calls(&redis).await;
    let start = Instant::now();
    let (mut snapshots, mut limited) = (0, 0);
    while start.elapsed() < Duration::from_secs(3) {
        c.send(serde_json::json!({"type":"watch","users":users}))
            .await;
        let v = c.recv().await;
        match v["type"].as_str() {
            Some("snapshot") => snapshots += 1,
            _ if v["code"] == "rate_limited" => limited += 1,
            _ => panic!("{v}"),
        }
        c.send(serde_json::json!({"type":"unwatch","users":users}))
            .await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let calls = script_calls(&redis).await - before;
    let secs = start.elapsed().as_secs_f64();
    println!("watch/unwatch loop: {snapshots} snapshots, {limited} rate_limited, {calls} script calls in {secs:.1} s");
    assert!(limited > 0, "never rate limited");
    // The burst (2 x --max-watches: 400) plus 100 users/s, plus the lease
    // refreshes.
    assert!(
        (calls as f64) < 400.0 + 100.0 * secs + 50.0 * secs,
        "{calls} script calls in {secs:.1} s"
    );
}

/// Unsolicited pongs count against the frame rate like any frame: a pong
/// flooder is closed with 1008 while another client's watches are answered
/// within 100 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pong_flood_is_closed_like_any_flood() {
    let redis = Redis::start();
    let node = Node::start(&redis, "n1");
    let mut calm = Client::connect(&node, "calm", "c").await;
    let Raw {
        mut reader,
        mut writer,
    } = Raw::hello(&node, "flooder", "f").await;
    let flood = tokio::spawn(async move {
        let pong = raw::frame(true, PONG, b"");
        let batch: Vec<u8> = pong
            .iter()
            .copied()
            .cycle()
            .take(pong.len() * 1000)
            .collect();
        let mut sent = 0u64;
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(5) {
            if writer.write_all(&batch).await.is_err() {
                break;
            }
            sent += 1000;
        }
        sent
    });
    let flood_start = Instant::now();
    let mut slowest = Duration::ZERO;
    for i in 0..5 {
        let asked = Instant::now();
        calm.send(serde_json::json!({"type":"watch","users":[format!("someone{i}")]}))
            .await;
        calm.expect("snapshot").await;
        slowest = slowest.max(asked.elapsed());
    }
    let (code, reason) = reader.expect_close(DEADLINE).await;
    let closed_after = flood_start.elapsed();
    flood.abort();
    println!("pong flood: closed with {code} ({reason}) {closed_after:?} after it began; slowest watch meanwhile {slowest:?}");
    assert_eq!(code, 1008, "{reason}");
    assert!(
        slowest < Duration::from_millis(100),
        "a watch took {slowest:?}"
    );
}

/// A node frozen past the lease TTL (SIGSTOP) and resumed (SIGCONT) keeps
/// the clients that were answering all along: it notices the jump of its
/// clock and gives them a fresh timeout. Each user ends online, with
/// exactly one online transition after the resume and none after that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_node_keeps_its_clients_after_resuming() {
    let redis = Redis::start();
    let frozen = Node::start(&redis, "frozen");
    let observer = Node::start(&redis, "observer");
    let mut watcher = Client::connect(&observer, "watcher", "w").await;
    watcher.watch(&["alice", "bob"]).await;
    let mut alice = Client::connect(&frozen, "alice", "a").await;
    let mut bob = Client::connect(&frozen, "bob", "b").await;
    for _ in 0..2 {
        assert_eq!(watcher.expect("presence").await["status"], "online");
    }
    unsafe {
        libc::kill(frozen.pid() as i32, libc::SIGSTOP);
    }
    // Frozen for twice the lease TTL: the other node lets the leases lapse.
    let freeze = TTL * 2;
    tokio::time::sleep(freeze).await;
    unsafe {
        libc::kill(frozen.pid() as i32, libc::SIGCONT);
    }
    let resumed = Instant::now();
    wait_until("both devices counted again", DEADLINE, || async {
        count(&redis, "alice").await == 1 && count(&redis, "bob").await == 1
    })
    .await;
    let back_after = resumed.elapsed();
    // Watch what follows for four lease TTLs.
    let mut after = Vec::new();
    let end = Instant::now() + TTL * 4;
    while let Some(left) = end.checked_duration_since(Instant::now()) {
        match watcher.next_within(left).await {
            Some(Incoming::Frame(f)) => after.push(format!(
                "{} {}",
                f["user"].as_str().unwrap_or(""),
                f["status"].as_str().unwrap_or("")
            )),
            Some(Incoming::Closed(c)) => panic!("watcher closed: {c:?}"),
            None => break,
        }
    }
    println!("frozen {freeze:?}: counted again {back_after:?} after SIGCONT; events since the freeze: {after:?}");
    // The other node announced the lapse during the freeze (offline); the
    // resumed node re-asserts each lease once (online), and nothing follows.
    for user in ["alice", "bob"] {
        let mine: Vec<&String> = after
            .iter()
            .filter(|e| e.starts_with(&format!("{user} ")))
            .collect();
        let onlines = mine.iter().filter(|e| e.ends_with(" online")).count();
        assert!(
            onlines == 1 && mine.last().is_some_and(|e| e.ends_with(" online")),
            "{user}: {mine:?}"
        );
    }
    for c in [&mut alice, &mut bob] {
        assert!(
            !matches!(c.try_next(), Some(Incoming::Closed(_))),
            "{} was disconnected",
            c.user
        );
    }
    assert_eq!(count(&redis, "alice").await, 1);
    assert_eq!(count(&redis, "bob").await, 1);
}

/// Sessions watching many users take memory; after they leave the node
/// gives at least 80% of it back within 20 s. Each session watches users
/// of its own, so that every per-user table (the registry's, the
/// subscription task's, the Redis connection's) grows and must shrink
/// back; with all watching the same users a watch now costs so little
/// (about 90 B) that the node's few MB that never come back were a fifth.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_memory_is_given_back() {
    raise_fd_limit();
    let redis = Redis::start();
    let node = Node::start(&redis, "n1");
    let (sessions, watches) = (300, 1000);
    let base = raw::rss_kib(node.pid());
    let mut clients = Vec::new();
    for i in 0..sessions {
        let users: Vec<String> = (0..watches).map(|u| format!("u{i}-{u}")).collect();
        let frame = serde_json::json!({"type":"watch","users":users});
        let mut c = Client::connect(&node, &format!("w{i}"), "d").await;
        c.send(frame).await;
        clients.push(c);
    }
    for c in &mut clients {
        let snap = c.expect("snapshot").await;
        assert_eq!(snap["presence"].as_array().unwrap().len(), watches);
    }
    let held = raw::rss_kib(node.pid());
    let leave = Instant::now();
    for c in clients {
        c.close().await;
    }
    wait_until("every session gone", DEADLINE, || async {
        get(&format!("{}/healthz", node.http())).await.1["registry"]["sessions"] == 0
    })
    .await;
    let took = held.saturating_sub(base);
    let mut after = raw::rss_kib(node.pid());
    // Until 90% is back (or 20 s), so that the figure printed is settled.
    while leave.elapsed() < Duration::from_secs(20) && held.saturating_sub(after) * 10 < took * 9 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        after = raw::rss_kib(node.pid());
    }
    let given_back = held.saturating_sub(after);
    println!(
        "{sessions} sessions x {watches} watches: RSS {base} KiB -> {held} KiB ({} B per watch), \
         {after} KiB {:?} after they left: gave back {given_back} of {took} KiB ({:.0}%)",
        took * 1024 / (sessions * watches) as u64,
        leave.elapsed(),
        given_back as f64 * 100.0 / took.max(1) as f64
    );
    assert!(
        given_back * 5 >= took * 4,
        "gave back {given_back} of {took} KiB"
    );
}

/// A Redis outage with a short heartbeat: sessions held up waiting on
/// Redis (their clients reading all along) are not cut without a close
/// frame as if their clients had stopped reading. They stay open, or close
/// with 1011/1013 and a reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_outage_does_not_cut_reading_clients() {
    let redis = Redis::start();
    let node = Node::start(&redis, "n1"); // 500 ms heartbeat
    let mut a = Client::connect(&node, "alice", "a").await;
    let mut b = Client::connect(&node, "bob", "b").await;
    // A hung Redis: every command waits for the 5 s response timeout.
    unsafe {
        libc::kill(redis.pid() as i32, libc::SIGSTOP);
    }
    let stopped = Instant::now();
    a.send(serde_json::json!({"type":"watch","users":["carol"]}))
        .await;
    b.send(serde_json::json!({"type":"status","status":"away"}))
        .await;
    // Four seconds: beyond the 1.5 s after which a silent client's session
    // counts as frozen.
    let mut seen = Vec::new();
    let end = stopped + Duration::from_secs(4);
    for c in [&mut a, &mut b] {
        loop {
            // Each client's reader queues what arrives, so the second is
            // read after the first without missing anything.
            let left = end.saturating_duration_since(Instant::now());
            let next = match left.is_zero() {
                true => c.try_next(),
                false => c.next_within(left).await,
            };
            match next {
                Some(Incoming::Closed(close)) => {
                    seen.push(format!(
                        "{} closed {close:?} after {:?}",
                        c.user,
                        stopped.elapsed()
                    ));
                    assert!(
                        matches!(close, Some((1011 | 1013, _))),
                        "{} cut without a 1011/1013 close frame: {close:?} after {:?}",
                        c.user,
                        stopped.elapsed()
                    );
                    // A 1013 names the shortest wait before coming back.
                    if let Some((1013, reason)) = &close {
                        assert!(reason.contains("retry_after_ms=2000"), "{reason}");
                    }
                    break;
                }
                Some(Incoming::Frame(f)) => seen.push(format!("{} got {f}", c.user)),
                None => break,
            }
        }
    }
    unsafe {
        libc::kill(redis.pid() as i32, libc::SIGCONT);
    }
    println!("Redis stopped for 4 s with a 500 ms heartbeat: {seen:?}");
    // Open sessions work again once Redis is back.
    for c in [&mut a, &mut b] {
        if seen
            .iter()
            .any(|s| s.starts_with(&format!("{} closed", c.user)))
        {
            continue;
        }
        c.send(serde_json::json!({"type":"watch","users":["dave"]}))
            .await;
        loop {
            let v = c.recv().await;
            if v["type"] == "snapshot" {
                break;
            }
        }
    }
}

/// The pong that answers the server's ping stays free: a client allowed
/// one frame a second that answers two pings a second and sends one
/// heartbeat a second is never refused.
#[tokio::test]
async fn answering_pings_stays_free() {
    let redis = Redis::start();
    let node = Node::start_with(&redis, "n1", &["--max-frames-per-sec", "1"]);
    let mut c = Client::connect(&node, "alice", "a").await;
    let start = Instant::now();
    let mut sent = 0;
    while start.elapsed() < Duration::from_secs(3) {
        c.send(serde_json::json!({"type":"heartbeat"})).await;
        sent += 1;
        if let Some(Incoming::Frame(f)) = c.next_within(Duration::from_secs(1)).await {
            panic!("after {sent} heartbeats and ~{} pongs: {f}", sent * 2);
        }
    }
    println!(
        "{sent} heartbeats and ~{} pongs at 1 frame/s: none refused",
        sent * 2
    );
}

/// Counts the server's pings to a raw client over `heartbeats` heartbeats,
/// answering each; `chatty` clients also send a heartbeat frame every
/// fifth of a heartbeat. Panics if the connection ends.
async fn pings_over(node: &Node, user: &str, heartbeats: u32, chatty: bool) -> u32 {
    let mut c = Raw::hello(node, user, "d").await;
    let hb = Duration::from_millis(HEARTBEAT_MS);
    let end = Instant::now() + hb * heartbeats;
    let mut pings = 0;
    let heartbeat = raw::frame(true, TEXT, br#"{"type":"heartbeat"}"#);
    while Instant::now() < end {
        let wait = (hb / 5).min(end.saturating_duration_since(Instant::now()));
        match c.reader.next(wait).await {
            Read::Frame(f) if f.opcode == PING => {
                pings += 1;
                c.send(&raw::frame(true, PONG, &f.payload)).await;
            }
            Read::Frame(_) => {}
            Read::Timeout if chatty => c.send(&heartbeat).await,
            Read::Timeout => {}
            Read::Eof => panic!("{user}: the node closed the connection"),
        }
    }
    pings
}

/// A client that sends frames of its own is pinged every other heartbeat
/// (a ping would only prove what its frames prove, but the node still
/// writes often enough for a proxy's read timeout); a quiet one is pinged
/// every heartbeat. Both stay connected.
#[tokio::test]
async fn a_client_that_speaks_is_pinged_half_as_often() {
    let redis = Redis::start();
    let node = Node::start(&redis, "n1");
    let (quiet, chatty) = tokio::join!(
        pings_over(&node, "quiet", 10, false),
        pings_over(&node, "chatty", 10, true)
    );
    println!("over 10 heartbeats: {quiet} pings to the quiet client, {chatty} to the chatty one");
    assert!((9..=11).contains(&quiet), "quiet client: {quiet} pings");
    assert!((4..=6).contains(&chatty), "chatty client: {chatty} pings");
}
