//! Rooms: presence in a place (design, "Rooms: presence in a place";
//! invariants 7 and 8). Real Redis, real nodes, real WebSocket clients.

use std::time::{Duration, Instant};

use crate::common::jwt::{hs, now, SECRET};
use crate::common::*;
use serde_json::{json, Value};

/// Joins `room` with `state` and returns the `room` frame.
pub(crate) async fn join(c: &mut Client, room: &str, state: Value) -> Value {
    c.send(json!({"type": "join", "room": room, "state": state}))
        .await;
    let frame = c.expect("room").await;
    assert_eq!(frame["room"], room, "{frame}");
    frame
}

/// The next frame, which must be `kind` about `user`/`device` in `room`.
pub(crate) async fn expect_event(
    c: &mut Client,
    kind: &str,
    room: &str,
    user: &str,
    device: &str,
) -> Value {
    let v = c.expect(kind).await;
    assert_eq!(
        (v["room"].as_str(), v["user"].as_str(), v["device"].as_str()),
        (Some(room), Some(user), Some(device)),
        "{v}"
    );
    v
}

/// The next frame of `kind`, passing over the others.
pub(crate) async fn next_of(c: &mut Client, kind: &str) -> Value {
    loop {
        let v = c.recv().await;
        if v["type"] == kind {
            return v;
        }
    }
}

/// Sends `frame`, which must be refused: the error frame.
pub(crate) async fn refused(c: &mut Client, frame: Value) -> Value {
    c.send(frame).await;
    c.expect("error").await
}

/// Nothing arrives within `window` (a frame is a failure, naming it).
pub(crate) async fn expect_quiet(c: &mut Client, window: Duration) {
    if let Some(Incoming::Frame(v)) = c.next_within(window).await {
        panic!("{}/{}: unexpected frame {v}", c.user, c.device);
    }
}

/// The users of a `room` frame, each with its devices, as `user:device`.
pub(crate) fn members(frame: &Value) -> Vec<String> {
    frame["members"]
        .as_array()
        .expect("members listed")
        .iter()
        .flat_map(|m| {
            let user = m["user"].as_str().unwrap().to_string();
            m["devices"]
                .as_array()
                .unwrap()
                .iter()
                .map(move |d| format!("{user}:{}", d["device"].as_str().unwrap()))
        })
        .collect()
}

/// The room's counts in Redis: users, devices, memberships with a deadline.
pub(crate) async fn redis_counts(redis: &Redis, room: &str) -> (i64, i64, i64) {
    let mut c = redis.aconn().await;
    let users: i64 = redis::cmd("HLEN")
        .arg(format!("presence-room-users:{{r:{room}}}"))
        .query_async(&mut c)
        .await
        .unwrap();
    let devices: i64 = redis::cmd("HLEN")
        .arg(format!("presence-room:{{r:{room}}}"))
        .query_async(&mut c)
        .await
        .unwrap();
    let deadlines: i64 = redis::cmd("ZCARD")
        .arg(format!("presence-room-deadlines:{{r:{room}}}"))
        .query_async(&mut c)
        .await
        .unwrap();
    (users, devices, deadlines)
}

/// Two users in one room: the snapshot lists both grouped by user, and
/// each join, state change, signal and leave reaches the other, never its
/// own device.
#[tokio::test]
async fn members_see_joins_updates_signals_and_leaves() {
    let redis = Redis::start();
    let node = Node::start(&redis, "n1");
    let mut alice = Client::connect(&node, "alice", "web").await;
    let first = join(&mut alice, "doc:42", json!({"page": 1})).await;
    assert_eq!(
        (first["users"].as_u64(), first["devices"].as_u64()),
        (Some(1), Some(1))
    );
    assert_eq!(members(&first), ["alice:web"]);
    assert_eq!(
        first["members"][0]["devices"][0]["state"],
        json!({"page": 1})
    );
    assert!(
        first["members"][0]["devices"][0]["joined_at"]
            .as_i64()
            .unwrap()
            > 0
    );

    let mut bob = Client::connect(&node, "bob", "laptop").await;
    let snap = join(&mut bob, "doc:42", json!({})).await;
    assert_eq!(members(&snap), ["alice:web", "bob:laptop"]);
    assert_eq!(
        (snap["users"].as_u64(), snap["devices"].as_u64()),
        (Some(2), Some(2))
    );
    let joined = expect_event(&mut alice, "room_join", "doc:42", "bob", "laptop").await;
    assert_eq!(joined["first"], true);
    assert_eq!(joined["state"], json!({}));

    bob.send(json!({"type": "room_state", "room": "doc:42", "state": {"page": 7}}))
        .await;
    let update = expect_event(&mut alice, "room_update", "doc:42", "bob", "laptop").await;
    assert_eq!(update["state"], json!({"page": 7}));

    bob.send(json!({"type": "signal", "room": "doc:42", "data": {"typing": true}}))
        .await;
    let signal = expect_event(&mut alice, "signal", "doc:42", "bob", "laptop").await;
    assert_eq!(signal["data"], json!({"typing": true}));

    bob.send(json!({"type": "leave", "room": "doc:42"})).await;
    let left = expect_event(&mut alice, "room_leave", "doc:42", "bob", "laptop").await;
    assert_eq!(left["last"], true);
    // Bob's own device got none of its own events.
    expect_quiet(&mut bob, Duration::from_millis(300)).await;
    assert_eq!(redis_counts(&redis, "doc:42").await, (1, 1, 1));
}

/// A user's second device is no second join, and its leave no leave of
/// the user; a clean close leaves at once.
#[tokio::test]
async fn a_user_joins_once_and_leaves_once_across_devices() {
    let redis = Redis::start();
    let node = Node::start(&redis, "n1");
    let mut alice = Client::connect(&node, "alice", "web").await;
    join(&mut alice, "chat:1", json!({})).await;
    let mut laptop = Client::connect(&node, "bob", "laptop").await;
    join(&mut laptop, "chat:1", json!({})).await;
    assert_eq!(
        expect_event(&mut alice, "room_join", "chat:1", "bob", "laptop").await["first"],
        true
    );
    let mut phone = Client::connect(&node, "bob", "phone").await;
    let snap = join(&mut phone, "chat:1", json!({"on": "phone"})).await;
    assert_eq!(members(&snap), ["alice:web", "bob:laptop", "bob:phone"]);
    assert_eq!(
        (snap["users"].as_u64(), snap["devices"].as_u64()),
        (Some(2), Some(3))
    );
    assert_eq!(
        expect_event(&mut alice, "room_join", "chat:1", "bob", "phone").await["first"],
        false
    );
    // The user's other device hears of it too.
    assert_eq!(
        expect_event(&mut laptop, "room_join", "chat:1", "bob", "phone").await["first"],
        false
    );

    phone.close().await;
    let left = expect_event(&mut alice, "room_leave", "chat:1", "bob", "phone").await;
    assert_eq!(left["last"], false);
    let closed = Instant::now();
    laptop.close().await;
    let left = expect_event(&mut alice, "room_leave", "chat:1", "bob", "laptop").await;
    assert_eq!(left["last"], true);
    assert!(
        closed.elapsed() < TTL,
        "a clean close leaves at once, took {:?}",
        closed.elapsed()
    );
    assert_eq!(redis_counts(&redis, "chat:1").await, (1, 1, 1));
}

/// Members on different nodes see each other; a member whose node is
/// SIGKILLed leaves every room within TTL + 1 s, once, and the counts
/// return to the live memberships.
#[tokio::test]
async fn a_killed_nodes_members_leave_within_the_ttl() {
    let redis = Redis::start();
    let a = Node::start(&redis, "a");
    let mut b = Node::start(&redis, "b");
    let mut alice = Client::connect(&a, "alice", "web").await;
    join(&mut alice, "r1", json!({})).await;
    join(&mut alice, "r2", json!({})).await;
    let mut bob = Client::connect(&b, "bob", "laptop").await;
    join(&mut bob, "r1", json!({"x": 1})).await;
    join(&mut bob, "r2", json!({})).await;
    for room in ["r1", "r2"] {
        let ev = expect_event(&mut alice, "room_join", room, "bob", "laptop").await;
        assert_eq!(ev["first"], true);
    }
    let killed = Instant::now();
    b.kill();
    let mut left = Vec::new();
    while left.len() < 2 {
        let ev = alice.expect("room_leave").await;
        assert_eq!(
            (ev["user"].as_str(), ev["last"].as_bool()),
            (Some("bob"), Some(true)),
            "{ev}"
        );
        left.push(ev["room"].as_str().unwrap().to_string());
        let elapsed = killed.elapsed();
        assert!(
            elapsed <= TTL + Duration::from_secs(1),
            "left after {elapsed:?}"
        );
    }
    left.sort();
    assert_eq!(left, ["r1", "r2"]);
    expect_quiet(&mut alice, Duration::from_millis(500)).await;
    for room in ["r1", "r2"] {
        assert_eq!(redis_counts(&redis, room).await, (1, 1, 1));
    }
}

/// A device that comes back within its membership's deadline and joins
/// again causes no leave and no join for the others: only an update when
/// its state changed.
#[tokio::test]
async fn a_rejoin_within_the_ttl_is_no_leave_and_no_join() {
    let redis = Redis::start();
    let node = Node::start(&redis, "n1");
    let mut alice = Client::connect(&node, "alice", "web").await;
    join(&mut alice, "doc:1", json!({})).await;
    let mut bob = Client::connect(&node, "bob", "laptop").await;
    join(&mut bob, "doc:1", json!({"page": 1})).await;
    expect_event(&mut alice, "room_join", "doc:1", "bob", "laptop").await;

    // The same device reconnects (the old connection is taken over) and
    // joins again with the same state: the others hear nothing.
    let mut again = Client::connect(&node, "bob", "laptop").await;
    let snap = join(&mut again, "doc:1", json!({"page": 1})).await;
    assert_eq!(members(&snap), ["alice:web", "bob:laptop"]);
    drop(bob);
    expect_quiet(&mut alice, TTL + Duration::from_millis(500)).await;

    // Once more with another state: an update, still no leave or join.
    let mut third = Client::connect(&node, "bob", "laptop").await;
    join(&mut third, "doc:1", json!({"page": 2})).await;
    let ev = expect_event(&mut alice, "room_update", "doc:1", "bob", "laptop").await;
    assert_eq!(ev["state"], json!({"page": 2}));
    drop(again);
    expect_quiet(&mut alice, TTL + Duration::from_millis(500)).await;
    assert_eq!(redis_counts(&redis, "doc:1").await, (2, 2, 2));
}

/// Every refused room frame gets its error, naming the room; the session
/// goes on and Redis is unchanged.
#[tokio::test]
async fn bad_room_frames_get_clear_errors_and_change_nothing() {
    let redis = Redis::start();
    let node = Node::start_with(
        &redis,
        "n1",
        &[
            "--max-rooms-per-device",
            "2",
            "--max-room-devices",
            "2",
            "--max-room-state-bytes",
            "32",
            "--max-room-messages-per-sec",
            "2",
        ],
    );
    let mut c = Client::connect(&node, "alice", "web").await;
    assert_eq!(
        refused(&mut c, json!({"type": "join", "room": "a b"})).await["code"],
        "invalid_id"
    );
    assert_eq!(
        refused(&mut c, json!({"type": "join", "room": "x{y}"})).await["code"],
        "invalid_id"
    );
    assert_eq!(
        refused(&mut c, json!({"type": "join", "room": ""})).await["code"],
        "invalid_id"
    );
    assert_eq!(
        refused(&mut c, json!({"type": "join", "room": "r", "state": [1]})).await["code"],
        "bad_request"
    );
    assert_eq!(
        refused(&mut c, json!({"type": "join"})).await["code"],
        "bad_request"
    );
    let e = refused(
        &mut c,
        json!({"type": "room_state", "room": "r", "state": {}}),
    )
    .await;
    assert_eq!(
        (e["code"].as_str(), e["room"].as_str()),
        (Some("not_in_room"), Some("r"))
    );
    assert_eq!(
        refused(&mut c, json!({"type": "signal", "room": "r", "data": 1})).await["code"],
        "not_in_room"
    );
    assert_eq!(
        refused(&mut c, json!({"type": "leave", "room": "r"})).await["code"],
        "not_in_room"
    );
    for bad in [
        json!({"type": "leave", "room": "a b"}),
        json!({"type": "room_state", "room": "{x}", "state": {}}),
        json!({"type": "signal", "room": "", "data": 1}),
    ] {
        assert_eq!(refused(&mut c, bad).await["code"], "invalid_id");
    }
    let big = json!({"type": "join", "room": "r", "state": {"text": "x".repeat(40)}});
    assert_eq!(refused(&mut c, big).await["code"], "state_too_large");
    let mut conn = redis.aconn().await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("presence-room*")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(keys.is_empty(), "refused frames wrote {keys:?}");

    join(&mut c, "one", json!({})).await;
    join(&mut c, "two", json!({})).await;
    c.send(json!({"type": "join", "room": "three"})).await;
    let e = c.expect("error").await;
    assert_eq!(
        (e["code"].as_str(), e["room"].as_str()),
        (Some("too_many_rooms"), Some("three"))
    );
    // Joining a room it is in again is no new room: a fresh room frame.
    join(&mut c, "one", json!({"again": true})).await;

    // Too large a state or signal, in a room it is in.
    let big = json!({"text": "x".repeat(40)});
    let e = refused(
        &mut c,
        json!({"type": "room_state", "room": "one", "state": big}),
    )
    .await;
    assert_eq!(
        (e["code"].as_str(), e["room"].as_str()),
        (Some("state_too_large"), Some("one"))
    );
    let e = refused(
        &mut c,
        json!({"type": "signal", "room": "one", "data": "x".repeat(1100)}),
    )
    .await;
    assert_eq!(e["code"], "state_too_large");

    // A full room.
    let mut b = Client::connect(&node, "bob", "b").await;
    join(&mut b, "one", json!({})).await;
    let mut carol = Client::connect(&node, "carol", "c").await;
    carol.send(json!({"type": "join", "room": "one"})).await;
    assert_eq!(carol.expect("error").await["code"], "room_full");
    assert_eq!(redis_counts(&redis, "one").await, (2, 2, 2));

    // Signal frames over the rate: refused, the session goes on. State
    // frames are never refused for their rate (the latest wins).
    let mut codes = Vec::new();
    for i in 0..8 {
        c.send(json!({"type": "signal", "room": "one", "data": i}))
            .await;
        c.send(json!({"type": "room_state", "room": "one", "state": {"i": i}}))
            .await;
    }
    while let Some(Incoming::Frame(v)) = c.next_within(Duration::from_millis(300)).await {
        if v["type"] == "error" {
            codes.push(v["code"].as_str().unwrap().to_string());
        }
    }
    assert!(codes.iter().any(|c| c == "rate_limited"), "{codes:?}");
    assert!(codes.len() <= 8, "a state frame was refused: {codes:?}");
    c.send(json!({"type": "heartbeat"})).await;
    c.send(json!({"type": "watch", "users": ["bob"]})).await;
    assert_eq!(c.expect("snapshot").await["presence"][0]["user"], "bob");
}

/// Under JWT auth the token's rooms claim decides which rooms a user may
/// join, with prefixes ending in `*`.
#[tokio::test]
async fn the_rooms_claim_decides_who_joins() {
    let redis = Redis::start();
    let node = Node::start_with(&redis, "n1", &["--auth", "jwt", "--jwt-secret", SECRET]);
    let token = hs(json!({"sub": "alice", "exp": now() + 3600, "rooms": ["doc:42", "team:7:*"]}));
    let url = format!(
        "ws://{}/ws?device=web&token={token}",
        node.http().trim_start_matches("http://")
    );
    let mut c = Client::connect_raw(&url, "alice", "web").await.unwrap();
    assert_eq!(c.expect("hello").await["user"], "alice");
    join(&mut c, "doc:42", json!({})).await;
    join(&mut c, "team:7:general", json!({})).await;
    for room in ["doc:43", "team:70:x", "other"] {
        c.send(json!({"type": "join", "room": room})).await;
        let e = c.expect("error").await;
        assert_eq!(
            (e["code"].as_str(), e["room"].as_str()),
            (Some("forbidden"), Some(room))
        );
    }
    // The same with the token in the first frame rather than the URL.
    let url = format!(
        "ws://{}/ws?device=tab",
        node.http().trim_start_matches("http://")
    );
    let mut first = Client::connect_raw(&url, "alice", "tab").await.unwrap();
    first.send(json!({"type": "auth", "token": token})).await;
    assert_eq!(first.expect("hello").await["user"], "alice");
    join(&mut first, "team:7:x", json!({})).await;
    first.send(json!({"type": "join", "room": "doc:43"})).await;
    assert_eq!(first.expect("error").await["code"], "forbidden");
    // The HTTP reads take the same claim.
    let base = node.http();
    let (status, _) = get(&format!("{base}/api/rooms/doc:42?token={token}")).await;
    assert_eq!(status, 200);
    let (status, body) = get(&format!("{base}/api/rooms/doc:43?token={token}")).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (403, Some("forbidden")),
        "{body}"
    );
    let (status, _) = post(
        &format!("{base}/api/rooms/query?token={token}"),
        &json!({"rooms": ["doc:42", "other"]}),
    )
    .await;
    assert_eq!(status, 403);
    // --jwt-rooms-claim names another claim.
    let named = Node::start_with(
        &redis,
        "n3",
        &[
            "--auth",
            "jwt",
            "--jwt-secret",
            SECRET,
            "--jwt-rooms-claim",
            "perms",
        ],
    );
    let perms =
        hs(json!({"sub": "carol", "exp": now() + 3600, "perms": ["doc:*"], "rooms": ["x"]}));
    let url = format!(
        "ws://{}/ws?device=d&token={perms}",
        named.http().trim_start_matches("http://")
    );
    let mut carol = Client::connect_raw(&url, "carol", "d").await.unwrap();
    carol.expect("hello").await;
    join(&mut carol, "doc:7", json!({})).await;
    carol.send(json!({"type": "join", "room": "x"})).await;
    assert_eq!(carol.expect("error").await["code"], "forbidden");
    // A token without the claim joins nothing; --room-policy open lets it.
    let bare = hs(json!({"sub": "bob", "exp": now() + 3600}));
    let url = format!(
        "ws://{}/ws?device=d&token={bare}",
        node.http().trim_start_matches("http://")
    );
    let mut b = Client::connect_raw(&url, "bob", "d").await.unwrap();
    b.expect("hello").await;
    b.send(json!({"type": "join", "room": "doc:42"})).await;
    assert_eq!(b.expect("error").await["code"], "forbidden");
    let open = Node::start_with(
        &redis,
        "n2",
        &[
            "--auth",
            "jwt",
            "--jwt-secret",
            SECRET,
            "--room-policy",
            "open",
        ],
    );
    let url = format!(
        "ws://{}/ws?device=d&token={bare}",
        open.http().trim_start_matches("http://")
    );
    let mut b = Client::connect_raw(&url, "bob", "d").await.unwrap();
    b.expect("hello").await;
    let snap = join(&mut b, "doc:42", json!({})).await;
    assert_eq!(members(&snap), ["alice:web", "bob:d"]);
}

/// An invisible user is absent from every room surface for everyone but
/// itself: the room frame and its counts, joins, updates, signals and
/// leaves. Turning visible is a join for the others, turning invisible
/// again a leave.
#[tokio::test]
async fn an_invisible_user_is_absent_from_rooms_for_the_others() {
    let redis = Redis::start();
    let node = Node::start(&redis, "n1");
    let mut alice = Client::connect(&node, "alice", "web").await;
    join(&mut alice, "doc:1", json!({})).await;

    let mut carol = Client::connect(&node, "carol", "tab").await;
    carol
        .send(json!({"type": "status", "status": "invisible"}))
        .await;
    assert_eq!(carol.expect("presence").await["status"], "invisible");
    let own = join(&mut carol, "doc:1", json!({"page": 1})).await;
    // Carol sees herself, in the list and the counts.
    assert_eq!(members(&own), ["alice:web", "carol:tab"]);
    assert_eq!(
        (own["users"].as_u64(), own["devices"].as_u64()),
        (Some(2), Some(2))
    );
    // Her other device sees her too, and hears of her.
    let mut carol2 = Client::connect(&node, "carol", "phone").await;
    let snap = join(&mut carol2, "doc:1", json!({})).await;
    assert_eq!(members(&snap), ["alice:web", "carol:phone", "carol:tab"]);
    assert_eq!(
        expect_event(&mut carol, "room_join", "doc:1", "carol", "phone").await["first"],
        false
    );
    carol
        .send(json!({"type": "room_state", "room": "doc:1", "state": {"page": 2}}))
        .await;
    carol
        .send(json!({"type": "signal", "room": "doc:1", "data": "typing"}))
        .await;
    expect_event(&mut carol2, "room_update", "doc:1", "carol", "tab").await;
    expect_event(&mut carol2, "signal", "doc:1", "carol", "tab").await;
    // Alice heard nothing of it, and a fresh member does not see her.
    expect_quiet(&mut alice, Duration::from_millis(300)).await;
    let mut bob = Client::connect(&node, "bob", "b").await;
    let snap = join(&mut bob, "doc:1", json!({})).await;
    assert_eq!(members(&snap), ["alice:web", "bob:b"]);
    assert_eq!(
        (snap["users"].as_u64(), snap["devices"].as_u64()),
        (Some(2), Some(2))
    );
    expect_event(&mut alice, "room_join", "doc:1", "bob", "b").await;
    assert_eq!(redis_counts(&redis, "doc:1").await.0, 2);

    // Visible again: a join (one, first) for the others, nothing new for
    // her own devices but a fresh room frame.
    carol
        .send(json!({"type": "status", "status": "online"}))
        .await;
    assert_eq!(next_of(&mut carol, "presence").await["status"], "online");
    let mut joined = Vec::new();
    while joined.len() < 2 {
        let ev = alice.expect("room_join").await;
        assert_eq!(ev["user"], "carol", "{ev}");
        joined.push((
            ev["device"].as_str().unwrap().to_string(),
            ev["first"].as_bool().unwrap(),
        ));
    }
    joined.sort();
    assert_eq!(
        joined.iter().filter(|(_, first)| *first).count(),
        1,
        "{joined:?}"
    );
    assert_eq!(redis_counts(&redis, "doc:1").await.0, 3);

    // Invisible again: one leave of the user (last), as the others see it.
    carol
        .send(json!({"type": "status", "status": "invisible"}))
        .await;
    let mut lasts = 0;
    for _ in 0..2 {
        let ev = alice.expect("room_leave").await;
        assert_eq!(ev["user"], "carol", "{ev}");
        lasts += usize::from(ev["last"] == true);
    }
    assert_eq!(lasts, 1);
    // A hidden device that vanishes leaves silently for the others.
    carol.drop_tcp();
    carol2.drop_tcp();
    expect_quiet(&mut alice, TTL + Duration::from_millis(1_500)).await;
    assert_eq!(redis_counts(&redis, "doc:1").await, (2, 2, 2));
}

/// The HTTP reads: one room's members as a member sees them (paged by
/// user), the service's truth, many rooms' counts, and the rooms of one
/// user's devices.
#[tokio::test]
async fn rooms_over_http() {
    const SERVICE: &str = "service-key-for-rooms-789";
    let redis = Redis::start();
    let node = Node::start_with(&redis, "n1", &["--service-key", SERVICE]);
    let base = node.http();
    let mut alice = Client::connect(&node, "alice", "web").await;
    join(&mut alice, "doc:1", json!({"page": 1})).await;
    let mut bob = Client::connect(&node, "bob", "laptop").await;
    join(&mut bob, "doc:1", json!({})).await;
    join(&mut bob, "doc:2", json!({})).await;
    let mut carol = Client::connect(&node, "carol", "tab").await;
    carol
        .send(json!({"type": "status", "status": "invisible"}))
        .await;
    carol.expect("presence").await;
    join(&mut carol, "doc:1", json!({})).await;

    let (status, page) = get(&format!("{base}/api/rooms/doc:1?viewer=alice&limit=1")).await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(
        (page["users"].as_u64(), page["devices"].as_u64()),
        (Some(2), Some(2))
    );
    assert_eq!(page["members"][0]["user"], "alice");
    assert_eq!(
        page["members"][0]["devices"][0]["state"],
        json!({"page": 1})
    );
    let cursor = page["next_cursor"]
        .as_str()
        .expect("a next page")
        .to_string();
    let (_, next) = get(&format!(
        "{base}/api/rooms/doc:1?viewer=alice&limit=1&cursor={cursor}"
    ))
    .await;
    assert_eq!(next["members"][0]["user"], "bob", "{next}");
    assert!(
        next["next_cursor"].is_null(),
        "carol is hidden from alice: {next}"
    );
    // Carol sees herself; the service sees the truth.
    let (_, own) = get(&format!("{base}/api/rooms/doc:1?viewer=carol")).await;
    assert_eq!(own["users"], 3, "{own}");
    let (status, truth) = get_as(&format!("{base}/api/rooms/doc:1"), Some(SERVICE)).await;
    assert_eq!(status, 200, "{truth}");
    assert_eq!(
        (truth["users"].as_u64(), truth["view"].as_str()),
        (Some(3), Some("service"))
    );

    let (status, counts) = post(
        &format!("{base}/api/rooms/query?viewer=alice"),
        &json!({"rooms": ["doc:2", "doc:1", "empty"]}),
    )
    .await;
    assert_eq!(status, 200, "{counts}");
    assert_eq!(
        counts["rooms"],
        json!([
            {"room": "doc:2", "users": 1, "devices": 1},
            {"room": "doc:1", "users": 2, "devices": 2},
            {"room": "empty", "users": 0, "devices": 0}
        ])
    );

    let (status, rooms) = get_as(&format!("{base}/api/users/bob/rooms"), Some(SERVICE)).await;
    assert_eq!(status, 200, "{rooms}");
    assert_eq!(
        rooms["devices"],
        json!([{"device": "laptop", "rooms": ["doc:1", "doc:2"]}])
    );
    let (status, _) = get(&format!("{base}/api/users/bob/rooms")).await;
    assert_eq!(status, 401);

    for bad in ["a%20b", "doc:1?limit=0", "doc:1?limit=5000"] {
        let (status, body) = get(&format!("{base}/api/rooms/{bad}")).await;
        assert_eq!(status, 400, "{bad}: {body}");
    }
    // Leaving shows at once.
    bob.send(json!({"type": "leave", "room": "doc:2"})).await;
    wait_until("bob out of doc:2", DEADLINE, || async {
        get(&format!("{base}/api/rooms/doc:2")).await.1["users"] == 0
    })
    .await;
    let (_, rooms) = get_as(&format!("{base}/api/users/bob/rooms"), Some(SERVICE)).await;
    assert_eq!(
        rooms["devices"],
        json!([{"device": "laptop", "rooms": ["doc:1"]}])
    );
}

/// Above `--room-announce-max` users a room's members get `occupancy`
/// counts, at most every `--room-occupancy-ms`, instead of every join and
/// leave; crossing the threshold upwards sends each member a `room` frame
/// of the counts, and coming back under it a tenth (at least one user)
/// below sends the full list again (hysteresis: one user going and coming
/// at the edge does not switch every member's view).
#[tokio::test]
async fn a_large_room_switches_to_counts_and_back() {
    let redis = Redis::start();
    let flags = ["--room-announce-max", "3", "--room-occupancy-ms", "200"];
    let a = Node::start_with(&redis, "a", &flags);
    let b = Node::start_with(&redis, "b", &flags);
    let mut alice = Client::connect(&a, "alice", "web").await;
    join(&mut alice, "big", json!({})).await;
    let mut bob = Client::connect(&b, "bob", "web").await;
    join(&mut bob, "big", json!({})).await;
    expect_event(&mut alice, "room_join", "big", "bob", "web").await;
    let mut carol = Client::connect(&a, "carol", "web").await;
    join(&mut carol, "big", json!({})).await;
    for c in [&mut alice, &mut bob] {
        expect_event(c, "room_join", "big", "carol", "web").await;
    }

    // A fourth user: over the threshold.
    let mut dave = Client::connect(&a, "dave", "web").await;
    let snap = join(&mut dave, "big", json!({})).await;
    assert!(snap["members"].is_null(), "{snap}");
    assert_eq!(snap["users"], 4);
    for c in [&mut alice, &mut bob, &mut carol] {
        let frame = c.expect("room").await;
        assert!(frame["members"].is_null(), "{frame}");
        assert_eq!(frame["users"], 4, "{frame}");
    }
    // Joins and leaves now move the counts, a few frames at most.
    let mut more = Vec::new();
    for i in 0..5 {
        let mut c = Client::connect(&b, &format!("u{i}"), "d").await;
        join(&mut c, "big", json!({})).await;
        more.push(c);
    }
    let started = Instant::now();
    let mut frames = 0;
    loop {
        let v = alice.recv().await;
        assert_eq!(v["type"], "occupancy", "{v}");
        frames += 1;
        if v["users"] == 9 {
            assert_eq!(v["devices"], 9);
            break;
        }
    }
    assert!(
        frames <= 3,
        "{frames} occupancy frames for 5 joins within {:?}",
        started.elapsed()
    );
    // Back at the threshold: still counts.
    for c in more {
        c.close().await;
    }
    dave.close().await;
    loop {
        let v = alice.recv().await;
        assert_eq!(v["type"], "occupancy", "{v}");
        if v["users"] == 3 {
            break;
        }
    }
    // A tenth (one user) below it: everyone gets the full list again.
    carol.close().await;
    let v = next_of(&mut alice, "room").await;
    assert_eq!(members(&v), ["alice:web", "bob:web"], "{v}");
    let frame = next_of(&mut bob, "room").await;
    assert_eq!(members(&frame), ["alice:web", "bob:web"]);
    // And every join and leave again.
    let mut erin = Client::connect(&a, "erin", "d").await;
    join(&mut erin, "big", json!({})).await;
    expect_event(&mut alice, "room_join", "big", "erin", "d").await;
    let mut frank = Client::connect(&b, "frank", "d").await;
    join(&mut frank, "big", json!({})).await;
    let v = next_of(&mut alice, "room").await;
    assert!(v["members"].is_null(), "four users again: {v}");
}

/// Redis restarts empty: the live members join their rooms again with
/// their state, and every member ends with a room frame listing them all.
#[tokio::test]
async fn members_rejoin_after_redis_loses_its_data() {
    let mut redis = Redis::start();
    let node = Node::start(&redis, "n1");
    let mut alice = Client::connect(&node, "alice", "web").await;
    join(&mut alice, "doc:1", json!({"page": 3})).await;
    let mut bob = Client::connect(&node, "bob", "laptop").await;
    join(&mut bob, "doc:1", json!({})).await;
    expect_event(&mut alice, "room_join", "doc:1", "bob", "laptop").await;

    redis.restart_empty();
    let base = node.http();
    wait_until("both members back in Redis", DEADLINE, || async {
        let (_, room) = get(&format!("{base}/api/rooms/doc:1")).await;
        room["users"] == 2 && room["devices"] == 2
    })
    .await;
    let (_, room) = get(&format!("{base}/api/rooms/doc:1")).await;
    assert_eq!(
        room["members"][0]["devices"][0]["state"],
        json!({"page": 3}),
        "{room}"
    );
    // Alice's view, kept as a client keeps it (a room frame replaces it,
    // joins and leaves change it), ends with both.
    let mut view = std::collections::BTreeSet::new();
    while let Some(Incoming::Frame(v)) = alice.next_within(Duration::from_millis(800)).await {
        match v["type"].as_str() {
            Some("room") => view = members(&v).into_iter().collect(),
            Some("room_join") => {
                view.insert(format!(
                    "{}:{}",
                    v["user"].as_str().unwrap(),
                    v["device"].as_str().unwrap()
                ));
            }
            Some("room_leave") => {
                view.remove(&format!(
                    "{}:{}",
                    v["user"].as_str().unwrap(),
                    v["device"].as_str().unwrap()
                ));
            }
            _ => {}
        }
    }
    assert_eq!(
        view.into_iter().collect::<Vec<_>>(),
        ["alice:web", "bob:laptop"]
    );
    assert_eq!(redis_counts(&redis, "doc:1").await, (2, 2, 2));
}

/// The room pass repairs counts and deadlines that went wrong outside the
/// steps, without a leave or a join for the members.
#[tokio::test]
async fn the_room_pass_repairs_counts_and_deadlines() {
    let redis = Redis::start();
    let node = Node::start(&redis, "n1");
    let mut alice = Client::connect(&node, "alice", "web").await;
    join(&mut alice, "r", json!({})).await;
    let mut bob = Client::connect(&node, "bob", "laptop").await;
    join(&mut bob, "r", json!({})).await;
    expect_event(&mut alice, "room_join", "r", "bob", "laptop").await;
    let mut c = redis.aconn().await;
    let _: () = redis::cmd("HINCRBY")
        .arg("presence-room-users:{r:r}")
        .arg("bob")
        .arg(3)
        .query_async(&mut c)
        .await
        .unwrap();
    let _: () = redis::cmd("ZREM")
        .arg("presence-room-deadlines:{r:r}")
        .arg("alice:web")
        .query_async(&mut c)
        .await
        .unwrap();
    wait_until("counts and deadlines repaired", DEADLINE, || async {
        let mut c = redis.aconn().await;
        let bob: i64 = redis::cmd("HGET")
            .arg("presence-room-users:{r:r}")
            .arg("bob")
            .query_async(&mut c)
            .await
            .unwrap();
        bob == 1 && redis_counts(&redis, "r").await == (2, 2, 2)
    })
    .await;
    // Two TTLs later both are still members, and nobody saw a leave or a
    // join (alice's refresh found her deadline gone and joined again: a
    // fresh room frame, the same members).
    let until = Instant::now() + 2 * TTL;
    while let Some(Incoming::Frame(v)) = alice
        .next_within(until.saturating_duration_since(Instant::now()))
        .await
    {
        assert_eq!(v["type"], "room", "{v}");
        assert_eq!(members(&v), ["alice:web", "bob:laptop"]);
    }
    while let Some(Incoming::Frame(v)) = bob.next_within(Duration::from_millis(10)).await {
        assert_eq!(v["type"], "room", "{v}");
    }
    assert_eq!(redis_counts(&redis, "r").await, (2, 2, 2));
}
