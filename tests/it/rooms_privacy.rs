//! An invisible user never shows in a room (issue 37, items 4, 5, 6 and
//! 10): every membership of every device is hidden the moment the status
//! changes, on every node, whoever changed it; a visible joiner's answer
//! depends only on what it may see; a member's `joined_at` is when it
//! became visible; and a public `/metrics` does not move for a hidden
//! member.

use std::time::{Duration, Instant};

use crate::common::*;
use crate::rooms::{expect_event, expect_quiet, join, members, next_of};
use serde_json::json;

/// Nodes whose sessions refresh every 5 s: anything that happens sooner
/// is not a refresh's doing.
const SLOW: [&str; 2] = ["--heartbeat-ms", "5000"];

/// Turns `c`'s user to `status` and waits for its own record.
async fn set_status(c: &mut Client, status: &str) {
    c.send(json!({"type": "status", "status": status})).await;
    assert_eq!(next_of(c, "presence").await["status"], status);
}

/// Item 4: a device of a user turns it invisible; the user's other device,
/// on another node, leaves the room for the others at once (not at its
/// next refresh), and its signals reach nobody else from then on. The
/// same over HTTP, for an idle device.
#[tokio::test]
async fn turning_invisible_hides_every_device_of_the_user_at_once() {
    let redis = Redis::start();
    let a = Node::start_with(&redis, "a", &SLOW);
    let b = Node::start_with(&redis, "b", &SLOW);
    let base = a.http();
    let mut alice = Client::connect(&a, "alice", "web").await;
    join(&mut alice, "r", json!({})).await;
    let mut phone = Client::connect(&a, "carol", "phone").await;
    let mut laptop = Client::connect(&b, "carol", "laptop").await;
    join(&mut laptop, "r", json!({"typing": false})).await;
    expect_event(&mut alice, "room_join", "r", "carol", "laptop").await;

    let changed = Instant::now();
    set_status(&mut phone, "invisible").await;
    let left = expect_event(&mut alice, "room_leave", "r", "carol", "laptop").await;
    assert_eq!(left["last"], true);
    assert!(
        changed.elapsed() < Duration::from_secs(2),
        "the leave took {:?}: a refresh's doing, not the change's",
        changed.elapsed()
    );
    // Its signals and updates reach nobody else now.
    laptop
        .send(json!({"type": "signal", "room": "r", "data": "typing"}))
        .await;
    laptop
        .send(json!({"type": "room_state", "room": "r", "state": {"typing": true}}))
        .await;
    expect_quiet(&mut alice, Duration::from_millis(500)).await;
    let (_, room) = get(&format!("{base}/api/rooms/r?viewer=alice")).await;
    assert_eq!(members_of_page(&room), ["alice:web"], "{room}");
    // The device itself still sees itself.
    let (_, own) = get(&format!("{base}/api/rooms/r?viewer=carol")).await;
    assert_eq!(
        members_of_page(&own),
        ["alice:web", "carol:laptop"],
        "{own}"
    );

    // Over HTTP, for a user none of whose devices is the one that asked.
    let status = |s: &str| json!({ "status": s });
    let client = reqwest::Client::new();
    let put = |body: serde_json::Value| {
        client
            .put(format!("{base}/api/users/carol/status"))
            .json(&body)
            .send()
    };
    assert_eq!(put(status("online")).await.unwrap().status(), 200);
    let back = expect_event(&mut alice, "room_join", "r", "carol", "laptop").await;
    assert_eq!(back["first"], true);
    let changed = Instant::now();
    assert_eq!(put(status("invisible")).await.unwrap().status(), 200);
    expect_event(&mut alice, "room_leave", "r", "carol", "laptop").await;
    assert!(changed.elapsed() < Duration::from_secs(2));
    let (_, room) = get(&format!("{base}/api/rooms/r?viewer=alice")).await;
    assert_eq!(room["users"], 1, "{room}");
}

/// `user:device` of each member of an HTTP page.
fn members_of_page(page: &serde_json::Value) -> Vec<String> {
    members(page)
}

/// Item 5: a room's device limit counts what a joiner may see: a visible
/// joiner is not refused for the hidden members it cannot see, and hidden
/// members are bounded apart.
#[tokio::test]
async fn room_full_counts_only_what_the_joiner_may_see() {
    let redis = Redis::start();
    let node = Node::start_with(&redis, "n1", &["--max-room-devices", "2"]);
    let mut alice = Client::connect(&node, "alice", "web").await;
    join(&mut alice, "small", json!({})).await;
    let mut ghost = Client::connect(&node, "ghost", "d").await;
    set_status(&mut ghost, "invisible").await;
    join(&mut ghost, "small", json!({})).await;
    let mut ghost2 = Client::connect(&node, "ghost2", "d").await;
    set_status(&mut ghost2, "invisible").await;
    join(&mut ghost2, "small", json!({})).await;
    // The room shows one device to bob: a second fits.
    let mut bob = Client::connect(&node, "bob", "web").await;
    let frame = join(&mut bob, "small", json!({})).await;
    assert_eq!(members(&frame), ["alice:web", "bob:web"], "{frame}");
    // Now it is full for the visible, and for the hidden.
    let mut carol = Client::connect(&node, "carol", "web").await;
    carol
        .send(json!({"type": "join", "room": "small", "state": {}}))
        .await;
    assert_eq!(carol.expect("error").await["code"], "room_full");
    let mut ghost3 = Client::connect(&node, "ghost3", "d").await;
    set_status(&mut ghost3, "invisible").await;
    ghost3
        .send(json!({"type": "join", "room": "small", "state": {}}))
        .await;
    assert_eq!(ghost3.expect("error").await["code"], "room_full");
}

/// Item 6: a member that joined while invisible shows, once visible, the
/// moment it became visible as its `joined_at`, not how long it was there
/// unseen.
#[tokio::test]
async fn joined_at_is_when_a_member_became_visible() {
    let redis = Redis::start();
    let node = Node::start(&redis, "n1");
    let base = node.http();
    let mut alice = Client::connect(&node, "alice", "web").await;
    join(&mut alice, "r", json!({})).await;
    let mut carol = Client::connect(&node, "carol", "tab").await;
    set_status(&mut carol, "invisible").await;
    let frame = join(&mut carol, "r", json!({})).await;
    let hidden_since = frame["members"][1]["devices"][0]["joined_at"]
        .as_i64()
        .unwrap();
    // Long enough that the two moments cannot be confused.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let shown_after = now_ms();
    set_status(&mut carol, "online").await;
    let joined = expect_event(&mut alice, "room_join", "r", "carol", "tab").await;
    let joined_at = joined["joined_at"].as_i64().unwrap();
    assert!(
        joined_at >= shown_after,
        "joined_at {joined_at} is before she became visible at {shown_after} (hidden since {hidden_since})"
    );
    let (_, page) = get(&format!("{base}/api/rooms/r?viewer=alice")).await;
    assert_eq!(
        page["members"][1]["devices"][0]["joined_at"], joined_at,
        "{page}"
    );
}

/// Epoch ms now.
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Item 10: with `--public-metrics`, the rooms' series do not move for an
/// invisible user joining, acting in and leaving a room, nor for its
/// membership lapsing when its node dies.
#[tokio::test]
async fn public_room_series_do_not_move_for_a_hidden_member() {
    const SERIES: [&str; 5] = [
        "presence_room_memberships",
        "presence_room_events_total",
        "presence_room_frames_sent_total",
        "presence_signals_relayed_total",
        "presence_room_memberships_lapsed_total",
    ];
    let redis = Redis::start();
    let node = Node::start_with(&redis, "n1", &["--public-metrics"]);
    let mut far = Node::start_with(&redis, "n2", &["--heartbeat-ms", "500"]);
    let mut alice = Client::connect(&node, "alice", "web").await;
    join(&mut alice, "r", json!({})).await;
    let mut ghost = Client::connect(&node, "ghost", "tab").await;
    set_status(&mut ghost, "invisible").await;
    let snapshot = async || {
        let mut out = Vec::new();
        for s in SERIES {
            out.push(metric(&node, s).await);
        }
        out
    };
    let before = snapshot().await;
    assert_eq!(before[0], 1.0, "alice's membership");
    join(&mut ghost, "r", json!({})).await;
    let mut phone = Client::connect(&far, "ghost", "phone").await;
    join(&mut phone, "r", json!({})).await;
    // Its other device hears of it: frames were sent, to its own devices.
    expect_event(&mut ghost, "room_join", "r", "ghost", "phone").await;
    phone
        .send(json!({"type": "room_state", "room": "r", "state": {"x": 1}}))
        .await;
    expect_event(&mut ghost, "room_update", "r", "ghost", "phone").await;
    phone
        .send(json!({"type": "signal", "room": "r", "data": 1}))
        .await;
    expect_event(&mut ghost, "signal", "r", "ghost", "phone").await;
    ghost
        .send(json!({"type": "signal", "room": "r", "data": 2}))
        .await;
    expect_event(&mut phone, "signal", "r", "ghost", "tab").await;
    assert_eq!(snapshot().await, before, "in the room: {SERIES:?}");
    // Its phone's node dies: the membership lapses (this node's pass, the
    // only one left, removes it).
    far.kill();
    expect_event(&mut ghost, "room_leave", "r", "ghost", "phone").await;
    ghost.close().await;
    assert_eq!(snapshot().await, before, "gone: {SERIES:?}");
    expect_quiet(&mut alice, Duration::from_millis(100)).await;
}
