//! Issue 37, item 9: a device a WebSocket holds, ended from outside its
//! connection, ends at once on whichever node holds the socket. `DELETE`
//! closes the socket with `4001` and removes the device's memberships (the
//! others get `room_leave`, once); an HTTP heartbeat that takes the device
//! id over closes the socket with `4001` too.
//!
//! The nodes run with a long heartbeat, so that neither the socket's next
//! ping nor its next lease refresh (which finds the lease replaced, the
//! way a takeover used to be noticed) can be what closes it in time.

use std::time::{Duration, Instant};

use super::*;
use crate::common::cluster::Cluster;

/// `--heartbeat-ms` of these nodes: a ping every 10 s, a refresh at most
/// every 3.3 s, and only on a client frame or pong.
const LONG_HEARTBEAT: &[&str] = &["--heartbeat-ms", "10000"];
/// "At once": well under the refresh interval (3.3 s) and the ping (10 s).
const AT_ONCE: Duration = Duration::from_millis(1_500);

/// Joins `room` and returns the `room` frame.
async fn join(c: &mut Client, room: &str) -> Value {
    c.send(json!({"type": "join", "room": room})).await;
    let frame = c.expect("room").await;
    assert_eq!(frame["room"], room, "{frame}");
    frame
}

/// The close (code) of `c` within `within`, passing over frames; fails
/// naming what it waited for.
async fn closed_within(c: &mut Client, within: Duration, what: &str) -> u16 {
    let until = Instant::now() + within;
    loop {
        let left = until.saturating_duration_since(Instant::now());
        match c.next_within(left).await {
            Some(Incoming::Closed(close)) => {
                return close.map(|(code, _)| code).unwrap_or(0);
            }
            Some(Incoming::Frame(_)) => continue,
            None => panic!(
                "{}/{}: the socket was not closed within {within:?} of {what}",
                c.user, c.device
            ),
        }
    }
}

/// The next `room_leave` of `c` within `within`, which must be about
/// `user`/`device` in `room`; fails naming what it waited for.
async fn leave_within(
    c: &mut Client,
    within: Duration,
    (room, user, device): (&str, &str, &str),
    what: &str,
) -> Value {
    match c.next_within(within).await {
        Some(Incoming::Frame(v)) => {
            assert_eq!(
                (
                    v["type"].as_str(),
                    v["room"].as_str(),
                    v["user"].as_str(),
                    v["device"].as_str()
                ),
                (Some("room_leave"), Some(room), Some(user), Some(device)),
                "{}/{}: {v}",
                c.user,
                c.device
            );
            v
        }
        other => panic!(
            "{}/{}: no room_leave of {user}/{device} within {within:?} of {what}: {other:?}",
            c.user, c.device
        ),
    }
}

/// The members of `room` as `GET /api/rooms/{room}` shows them to `viewer`
/// on `node`, as `user:device`, with the room's device count.
async fn room_members(node: &Node, room: &str, viewer: &str) -> (Vec<String>, u64) {
    let (code, body) = get(&format!("{}/api/rooms/{room}?viewer={viewer}", node.http())).await;
    assert_eq!(code, 200, "{body}");
    let members = body["members"]
        .as_array()
        .unwrap_or_else(|| panic!("members listed: {body}"))
        .iter()
        .flat_map(|m| {
            let user = m["user"].as_str().unwrap().to_string();
            m["devices"]
                .as_array()
                .unwrap()
                .iter()
                .map(move |d| format!("{user}:{}", d["device"].as_str().unwrap()))
        })
        .collect();
    (members, body["devices"].as_u64().unwrap_or(u64::MAX))
}

/// Nothing arrives on `c` within `window`.
async fn quiet(c: &mut Client, window: Duration) {
    if let Some(Incoming::Frame(v)) = c.next_within(window).await {
        panic!("{}/{}: unexpected frame {v}", c.user, c.device);
    }
}

/// DELETE of a device whose socket is on another node: the socket is
/// closed with 4001 at once, the device leaves its room at once (one
/// `room_leave`, `last` only with the user's last device there), and the
/// room's HTTP read no longer lists it. Both ways between two nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_of_a_socket_device_closes_it_and_leaves_its_rooms_at_once() {
    let redis = Redis::start();
    let a = Node::start_with(&redis, "a", LONG_HEARTBEAT);
    let b = Node::start_with(&redis, "b", LONG_HEARTBEAT);
    let room = "doc:9";
    let mut phone = Client::connect(&a, "alice", "phone").await;
    join(&mut phone, room).await;
    let mut tab = Client::connect(&b, "alice", "tab").await;
    join(&mut tab, room).await;
    let mut bob = Client::connect(&b, "bob", "laptop").await;
    join(&mut bob, room).await;
    assert_eq!(
        room_members(&a, room, "bob").await,
        (
            vec![
                "alice:phone".to_string(),
                "alice:tab".to_string(),
                "bob:laptop".to_string()
            ],
            3
        )
    );

    // The phone's socket is on node A; the DELETE goes to node B.
    let (code, _) = leave(&b, "alice", "phone", None).await;
    assert_eq!(code, 204);
    let asked = Instant::now();
    let what = "DELETE of alice/phone on the other node";
    assert_eq!(closed_within(&mut phone, AT_ONCE, what).await, 4001);
    let left = leave_within(&mut bob, AT_ONCE, (room, "alice", "phone"), what).await;
    assert_eq!(left["last"], false, "alice's tab is still there: {left}");
    assert!(asked.elapsed() < AT_ONCE, "{:?}", asked.elapsed());
    assert_eq!(
        room_members(&a, room, "bob").await,
        (vec!["alice:tab".to_string(), "bob:laptop".to_string()], 2)
    );
    assert_eq!(count(&redis, "alice").await, 1);

    // The tab's socket is on node B; the DELETE goes to node A.
    assert_eq!(leave(&a, "alice", "tab", None).await.0, 204);
    let what = "DELETE of alice/tab on the other node";
    assert_eq!(closed_within(&mut tab, AT_ONCE, what).await, 4001);
    let left = leave_within(&mut bob, AT_ONCE, (room, "alice", "tab"), what).await;
    assert_eq!(left["last"], true, "alice's last device there: {left}");
    assert_eq!(
        room_members(&b, room, "bob").await,
        (vec!["bob:laptop".to_string()], 1)
    );
    assert_eq!(count(&redis, "alice").await, 0);

    // Once each in the fleet, and nothing left of alice in the room's keys
    // or in her list of rooms.
    quiet(&mut bob, Duration::from_secs(1)).await;
    let mut c = redis.aconn().await;
    let held: Vec<String> = redis::cmd("HKEYS")
        .arg(format!("presence-room:{{r:{room}}}"))
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(held, ["bob:laptop"]);
    let rooms: i64 = redis::cmd("HLEN")
        .arg("presence-user-rooms:{alice}")
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(rooms, 0);
    // Deleting again is harmless, and a device never connected too.
    assert_eq!(leave(&b, "alice", "phone", None).await.0, 204);
    assert_eq!(leave(&a, "nobody", "none", None).await.0, 204);
    quiet(&mut bob, Duration::from_millis(300)).await;
}

/// An HTTP heartbeat that takes over a device id whose socket is on
/// another node closes that socket with 4001 at once: the newer wins. Its
/// memberships are left to the device's next connection, as after any
/// takeover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_taking_over_a_socket_on_another_node_closes_it_at_once() {
    let redis = Redis::start();
    let a = Node::start_with(&redis, "a", LONG_HEARTBEAT);
    let b = Node::start_with(&redis, "b", LONG_HEARTBEAT);
    let mut watcher = Client::connect(&a, "watcher", "w").await;
    watcher.watch(&["alice"]).await;
    let mut phone = Client::connect(&a, "alice", "phone").await;
    watcher.expect_presence("alice", "online").await;

    let (code, body) = heartbeat(&b, "alice", "phone", "mobile").await;
    assert_eq!(code, 200, "{body}");
    let what = "a heartbeat for alice/phone on the other node";
    assert_eq!(closed_within(&mut phone, AT_ONCE, what).await, 4001);
    // No flicker: the device stays, held by the heartbeats now.
    quiet(&mut watcher, Duration::from_millis(500)).await;
    assert_eq!(count(&redis, "alice").await, 1);
    // Heartbeats after it, on either node, hold the device as before.
    for node in [&a, &b] {
        assert_eq!(heartbeat(node, "alice", "phone", "mobile").await.0, 200);
    }
    // A socket takes the id back (on node B this time), and a heartbeat on
    // node A takes it over again: closed at once as well.
    let mut again = Client::connect(&b, "alice", "phone").await;
    assert_eq!(heartbeat(&a, "alice", "phone", "mobile").await.0, 200);
    let what = "a second takeover of alice/phone";
    assert_eq!(closed_within(&mut again, AT_ONCE, what).await, 4001);
    quiet(&mut watcher, Duration::from_millis(300)).await;
}

/// On a Redis Cluster, where the user's keys and the node's channel live
/// on different shards: a DELETE on node B closes each socket on node A at
/// once and takes its device out of the room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_closes_sockets_at_once_on_a_cluster() {
    let cluster = Cluster::start();
    let a = cluster.node_with("a", LONG_HEARTBEAT);
    let b = cluster.node_with("b", LONG_HEARTBEAT);
    let room = "team:1";
    let mut bob = Client::connect(&b, "bob", "laptop").await;
    join(&mut bob, room).await;
    let users: Vec<String> = cluster
        .shards()
        .iter()
        .enumerate()
        .map(|(i, shard)| cluster.user_on(shard, &format!("t{i}x")))
        .collect();
    let mut sockets = Vec::new();
    for user in &users {
        let mut c = Client::connect(&a, user, "phone").await;
        join(&mut c, room).await;
        let joined = bob.expect("room_join").await;
        assert_eq!(joined["user"], user.as_str(), "{joined}");
        sockets.push(c);
    }
    for (user, socket) in users.iter().zip(&mut sockets) {
        assert_eq!(leave(&b, user, "phone", None).await.0, 204);
        let what = format!("DELETE of {user}/phone on the other node");
        assert_eq!(closed_within(socket, AT_ONCE, &what).await, 4001);
        let left = leave_within(&mut bob, AT_ONCE, (room, user, "phone"), &what).await;
        assert_eq!(left["last"], true, "{left}");
    }
    assert_eq!(
        room_members(&a, room, "bob").await,
        (vec!["bob:laptop".to_string()], 1)
    );
}
