//! `--room-policy proxy` (issue 38): the node asks the app's backend about
//! each join, signed like the webhooks, and fails closed. Real nodes, real
//! Redis, real WebSocket clients; the backend is an HTTP server in the
//! test process ([`backend`]) that can refuse, fail, be slow or be down.
//!
//! - this file: what the backend's answers do, the signature, the state
//!   the backend gives, a slow or a down backend, and the start-up checks;
//! - `cache.rs`: the cache, refusals' `Cache-Control`, and a member's own
//!   rejoin when the backend is down;
//! - `flood.rs`: the bound on requests in flight, and shared requests;
//! - `fleet.rs`: the HTTP reads, two nodes on one Redis, a Redis Cluster.

pub mod backend;
mod cache;
mod fleet;
mod flood;
mod revoke;

use std::time::{Duration, Instant};

use crate::common::*;
use crate::rooms::{join, members, next_of};
use crate::webhooks::receiver::verify;
use backend::{Backend, Reply};
use serde_json::{json, Value};

/// The `--room-join-secret` of these tests' nodes.
const JOIN_SECRET: &str = "roomjoin_test_0123456789abcdef";

/// The flags of a node whose `p:*` rooms ask `url`, with `extra` after.
fn proxy_flags<'a>(url: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut flags = vec![
        "--room-policy",
        "p:*=proxy",
        "--room-join-url",
        url,
        "--room-join-secret",
        JOIN_SECRET,
        "--admin-key",
        ADMIN,
    ];
    flags.extend_from_slice(extra);
    flags
}

/// A node on `redis` whose `p:*` rooms ask `url`.
fn node(redis: &Redis, id: &str, url: &str, extra: &[&str]) -> Node {
    Node::start_with(redis, id, &proxy_flags(url, extra))
}

/// Sends a join of `room`; the error it gets, which names the room.
async fn refused_join(c: &mut Client, room: &str) -> Value {
    c.send(json!({"type": "join", "room": room, "state": {}}))
        .await;
    let e = c.expect("error").await;
    assert_eq!(e["room"], room, "{e}");
    assert!(
        e["message"].as_str().unwrap().contains(room),
        "the message names the room: {e}"
    );
    e
}

/// Everything in the Redis at `conn` that mentions `needle`: key names, and
/// the members, fields and values of sets, sorted sets, hashes and strings.
fn traces(conn: &mut redis::Connection, needle: &str) -> Vec<String> {
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(conn).unwrap();
    let mut found = Vec::new();
    for key in keys {
        if key.contains(needle) {
            found.push(key);
            continue;
        }
        let kind: String = redis::cmd("TYPE").arg(&key).query(conn).unwrap();
        let cmd = match kind.as_str() {
            "set" => redis::cmd("SMEMBERS").arg(&key).clone(),
            "zset" => redis::cmd("ZRANGE").arg(&key).arg(0).arg(-1).clone(),
            "hash" => redis::cmd("HGETALL").arg(&key).clone(),
            "string" => redis::cmd("GET").arg(&key).clone(),
            _ => continue,
        };
        // Values may be binary (packed marks): compare their text.
        let items: Vec<String> = match kind.as_str() {
            "string" => cmd
                .query::<Option<Vec<u8>>>(conn)
                .unwrap()
                .into_iter()
                .collect(),
            _ => cmd.query::<Vec<Vec<u8>>>(conn).unwrap(),
        }
        .into_iter()
        .map(|v| String::from_utf8_lossy(&v).into_owned())
        .collect();
        found.extend(
            items
                .into_iter()
                .filter(|i| i.contains(needle))
                .map(|i| format!("{key}: {i}")),
        );
    }
    found
}

/// Nothing in `redis` mentions `room`.
fn assert_no_trace(redis: &Redis, room: &str) {
    let found = traces(&mut redis.conn(), room);
    assert!(found.is_empty(), "{room} left in Redis: {found:?}");
}

/// Nothing in `redis` mentions `room` once the deadline pass has been by:
/// a member's refresh may have put the room back in the pass's index just
/// before its membership was found gone, and the pass drops it.
async fn wait_no_trace(redis: &Redis, room: &str) {
    wait_until(
        &format!("no trace of {room} in Redis"),
        DEADLINE,
        || async { traces(&mut redis.conn(), room).is_empty() },
    )
    .await;
    assert_no_trace(redis, room);
}

/// The rooms the backend was asked about, in order.
fn rooms_asked(backend: &Backend) -> Vec<String> {
    backend
        .asked()
        .iter()
        .map(|a| a.json()["room"].as_str().unwrap().to_string())
        .collect()
}

/// Only `200` with `{"allow":true}` lets a device in; `{"allow":false}`,
/// a 4xx, a 5xx and an answer that does not parse are `forbidden`, naming
/// the room, and leave nothing in Redis. Rooms under another policy ask
/// nothing. Each question is exactly `{"user","device","room","state"}`.
#[tokio::test]
async fn the_backend_decides_each_join_and_a_refusal_leaves_nothing() {
    let redis = Redis::start();
    let backend = Backend::start(|q| match q["room"].as_str().unwrap_or("") {
        "p:ok" => Reply::ok(r#"{"allow":true}"#),
        "p:no" => Reply::ok(r#"{"allow":false}"#),
        "p:403" => Reply::status(403, r#"{"allow":true}"#),
        "p:500" => Reply::status(500, r#"{"allow":true}"#),
        "p:html" => Reply::ok("<html>ok</html>"),
        "p:yes" => Reply::ok(r#"{"allow":"yes"}"#),
        _ => Reply::status(404, ""),
    })
    .await;
    let node = node(&redis, "n1", &backend.url, &[]);
    let mut alice = Client::connect(&node, "alice", "web").await;
    let frame = join(&mut alice, "p:ok", json!({"page": 1})).await;
    assert_eq!(members(&frame), ["alice:web"]);
    let refused = ["p:no", "p:403", "p:500", "p:html", "p:yes"];
    for room in refused {
        assert_eq!(refused_join(&mut alice, room).await["code"], "forbidden");
        assert_no_trace(&redis, room);
    }
    // Not in: its frames for the room are refused.
    alice
        .send(json!({"type": "signal", "room": "p:no", "data": 1}))
        .await;
    assert_eq!(alice.expect("error").await["code"], "not_in_room");
    join(&mut alice, "open:1", json!({})).await;
    let mut expected = vec!["p:ok"];
    expected.extend(refused);
    assert_eq!(
        rooms_asked(&backend),
        expected,
        "once each, and no open room"
    );
    assert_eq!(
        String::from_utf8(backend.asked()[0].body.clone()).unwrap(),
        r#"{"user":"alice","device":"web","room":"p:ok","state":{"page":1}}"#
    );
    let (status, rooms) = get_as(
        &format!("{}/api/users/alice/rooms", node.http()),
        Some(ADMIN),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(
        rooms["devices"],
        json!([{"device": "web", "rooms": ["open:1", "p:ok"]}])
    );
    for (outcome, n) in [
        ("allowed", 1.0),
        ("refused", 2.0),
        ("failed", 1.0),
        ("invalid", 2.0),
    ] {
        let name = format!("presence_room_join_requests_total{{outcome=\"{outcome}\"}}");
        assert_eq!(metric(&node, &name).await, n, "{name}");
    }
}

/// Every question carries `Presence-Signature` as webhooks do: it checks
/// with the room-join secret, and not with another or on a changed body.
#[tokio::test]
async fn questions_are_signed_like_webhooks() {
    let redis = Redis::start();
    let backend = Backend::allowing().await;
    let node = node(&redis, "n1", &backend.url, &[]);
    let mut bob = Client::connect(&node, "bob", "phone").await;
    join(&mut bob, "p:signed", json!({"x": "y"})).await;
    let asked = backend.asked();
    assert_eq!(asked.len(), 1);
    let (signature, body) = (&asked[0].signature, &asked[0].body);
    assert!(signature.starts_with("t="), "{signature}");
    assert!(verify(JOIN_SECRET, signature, body), "{signature}");
    assert!(!verify("roomjoin_other_0123456789abcdef", signature, body));
    let mut changed = body.clone();
    changed.push(b' ');
    assert!(!verify(JOIN_SECRET, signature, &changed));
}

/// `200` with a state replaces the device's own, for every member alike
/// (its own room frame, the others' events, the HTTP read); the device
/// may change it afterwards. A state that is not an object within
/// `--max-room-state-bytes` is a refusal.
#[tokio::test]
async fn the_backend_state_replaces_the_devices_own() {
    let redis = Redis::start();
    let backend = Backend::start(|q| match q["user"].as_str().unwrap_or("") {
        "alice" => Reply::ok(r#"{"allow": true, "state": {"role": "host"}}"#),
        "carol" => Reply::ok(&format!(
            r#"{{"allow":true,"state":{{"pad":"{}"}}}}"#,
            "x".repeat(64)
        )),
        "dave" => Reply::ok(r#"{"allow":true,"state":["host"]}"#),
        _ => Reply::ok(r#"{"allow":true}"#),
    })
    .await;
    let node = node(
        &redis,
        "n1",
        &backend.url,
        &["--max-room-state-bytes", "64"],
    );
    let mut alice = Client::connect(&node, "alice", "web").await;
    let frame = join(&mut alice, "p:s", json!({"page": 1})).await;
    assert_eq!(
        frame["members"][0]["devices"][0]["state"],
        json!({"role": "host"}),
        "{frame}"
    );
    let mut bob = Client::connect(&node, "bob", "web").await;
    let frame = join(&mut bob, "p:s", json!({"page": 2})).await;
    let states: Vec<&Value> = frame["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| &m["devices"][0]["state"])
        .collect();
    assert_eq!(states, [&json!({"role": "host"}), &json!({"page": 2})]);
    let v = alice.expect("room_join").await;
    assert_eq!(v["state"], json!({"page": 2}), "{v}");
    let (_, page) = get_as(&format!("{}/api/rooms/p:s", node.http()), Some(ADMIN)).await;
    assert_eq!(
        page["members"][0]["devices"][0]["state"],
        json!({"role": "host"}),
        "{page}"
    );
    alice
        .send(json!({"type": "room_state", "room": "p:s", "state": {"page": 3}}))
        .await;
    assert_eq!(bob.expect("room_update").await["state"], json!({"page": 3}));
    for user in ["carol", "dave"] {
        let mut c = Client::connect(&node, user, "web").await;
        assert_eq!(refused_join(&mut c, "p:t").await["code"], "forbidden");
    }
    assert_no_trace(&redis, "p:t");
}

/// A backend that does not answer within `--room-join-timeout-ms`, or
/// that is down, refuses the join with `unavailable` and leaves nothing in
/// Redis; no answer is ever kept, so the next join asks again.
#[tokio::test]
async fn a_slow_or_down_backend_is_unavailable() {
    let redis = Redis::start();
    let backend = Backend::allowing().await;
    let node = node(
        &redis,
        "n1",
        &backend.url,
        &["--room-join-timeout-ms", "300"],
    );
    let mut alice = Client::connect(&node, "alice", "web").await;
    backend.hold();
    let asked = Instant::now();
    let e = refused_join(&mut alice, "p:slow").await;
    let took = asked.elapsed();
    assert_eq!(e["code"], "unavailable", "{e}");
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_millis(1_500),
        "{took:?}"
    );
    assert_no_trace(&redis, "p:slow");
    backend.release();
    join(&mut alice, "p:slow", json!({})).await;
    assert_eq!(backend.asked_about("p:slow").len(), 2);

    backend.stop();
    let mut bob = Client::connect(&node, "bob", "web").await;
    let asked = Instant::now();
    assert_eq!(
        refused_join(&mut bob, "p:down").await["code"],
        "unavailable"
    );
    assert!(
        asked.elapsed() < Duration::from_millis(300),
        "{:?}",
        asked.elapsed()
    );
    assert_no_trace(&redis, "p:down");
    let timeout = "presence_room_join_requests_total{outcome=\"timeout\"}";
    assert_eq!(metric(&node, timeout).await, 1.0);
    let unreachable = "presence_room_join_requests_total{outcome=\"unreachable\"}";
    assert_eq!(metric(&node, unreachable).await, 1.0);
}

/// A node with a `proxy` rule and no backend, or a backend without a
/// secret of 16 bytes, or not over HTTP, does not start, and says why.
#[test]
fn a_proxy_rule_needs_a_backend_and_a_secret() {
    let redis = Redis::start();
    for (flags, says) in [
        (&["--room-policy", "p:*=proxy"][..], "needs --room-join-url"),
        (
            &[
                "--room-policy",
                "proxy",
                "--room-join-url",
                "http://127.0.0.1:9/j",
            ][..],
            "--room-join-secret",
        ),
        (
            &[
                "--room-policy",
                "proxy",
                "--room-join-url",
                "http://127.0.0.1:9/j",
                "--room-join-secret",
                "short",
            ][..],
            "at least 16 bytes",
        ),
        (
            &[
                "--room-policy",
                "proxy",
                "--room-join-url",
                "ftp://127.0.0.1/j",
                "--room-join-secret",
                JOIN_SECRET,
            ][..],
            "http:// or https://",
        ),
    ] {
        let mut args: Vec<String> = ["--listen", "127.0.0.1:0", "--redis-url", &redis.url]
            .iter()
            .map(|s| s.to_string())
            .collect();
        args.extend(flags.iter().map(|s| s.to_string()));
        let err = Node::spawn("bad", &args, &[]).err().expect("refused");
        assert!(err.contains(says), "{flags:?}: {err}");
    }
}

/// The next frame of `kind` about `room`, passing over the others.
async fn next_about(c: &mut Client, kind: &str, room: &str) -> Value {
    loop {
        let v = next_of(c, kind).await;
        if v["room"] == room {
            return v;
        }
    }
}
