//! Rooms the app's backend controls (issue 38): a policy per room-id
//! pattern, first match wins; the `members` policy's list kept through the
//! admin API and checked by the join step itself; and a user removed from
//! a room at once, on every node, under any policy.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use crate::common::cluster::Cluster;
use crate::common::jwt::{hs, now, SECRET};
use crate::common::*;
use crate::rooms::{expect_event, expect_quiet, join, members, next_of};
use serde_json::{json, Value};

/// The admin key of these tests' nodes.
const ADMIN: &str = "admin-key-for-room-access-1234";

/// `PUT`, `POST` or `DELETE` on the admin API of `node`; status and body.
async fn admin(
    node: &Node,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = reqwest::Client::new()
        .request(method, format!("{}{path}", node.http()))
        .bearer_auth(ADMIN);
    if let Some(body) = body {
        req = req.json(&body);
    }
    let r = req.send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

/// Puts `users` on `room`'s member list.
async fn put_members(node: &Node, room: &str, users: &[&str]) {
    let (status, body) = admin(
        node,
        reqwest::Method::PUT,
        &format!("/api/rooms/{room}/members"),
        Some(json!({ "users": users })),
    )
    .await;
    assert_eq!(status, 200, "{body}");
}

/// Removes `user` from `room`; the devices that left.
async fn remove(node: &Node, room: &str, user: &str) -> Value {
    let (status, body) = admin(
        node,
        reqwest::Method::DELETE,
        &format!("/api/rooms/{room}/members/{user}"),
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    body
}

/// Sends a join for `room`; the error it gets.
async fn refused_join(c: &mut Client, room: &str) -> Value {
    c.send(json!({"type": "join", "room": room, "state": {}}))
        .await;
    let e = c.expect("error").await;
    assert_eq!(e["room"], room, "{e}");
    e
}

/// A node on `redis` with the admin key and `policies`.
fn node(redis: &Redis, id: &str, policies: &[&str]) -> Node {
    let mut flags = vec!["--admin-key", ADMIN];
    for p in policies {
        flags.extend(["--room-policy", p]);
    }
    Node::start_with(redis, id, &flags)
}

/// Policies by room-id pattern, first match wins, under JWT: `claim`,
/// `open` and `members` side by side; the HTTP reads follow the same
/// policy as a join.
#[tokio::test]
async fn each_room_follows_the_first_policy_that_covers_it() {
    let redis = Redis::start();
    let policies = [
        "--room-policy",
        "chat:*=members",
        "--room-policy",
        "lobby:*=open",
        "--room-policy",
        "*=claim",
        "--admin-key",
        ADMIN,
    ];
    let mut flags = vec!["--auth", "jwt", "--jwt-secret", SECRET];
    flags.extend(policies);
    let node = Node::start_with(&redis, "n1", &flags);
    put_members(&node, "chat:1", &["alice"]).await;
    let token = hs(json!({"sub": "alice", "exp": now() + 3600, "rooms": ["doc:*"]}));
    let bob_token = hs(json!({"sub": "bob", "exp": now() + 3600, "rooms": []}));
    let connect = |token: String, device: &'static str| {
        let url = format!("ws://{}/ws?device={device}&token={token}", node.addr);
        async move {
            let mut c = Client::connect_raw(&url, "?", device).await.unwrap();
            c.expect("hello").await;
            c
        }
    };
    let mut alice = connect(token.clone(), "web").await;
    let mut bob = connect(bob_token.clone(), "web").await;
    join(&mut alice, "chat:1", json!({})).await;
    join(&mut alice, "lobby:x", json!({})).await;
    join(&mut alice, "doc:9", json!({})).await;
    join(&mut bob, "lobby:x", json!({})).await;
    for room in ["chat:1", "doc:9", "other"] {
        assert_eq!(refused_join(&mut bob, room).await["code"], "forbidden");
    }
    // The reads: the list, the claim, open.
    let base = node.http();
    for (room, token, status) in [
        ("chat:1", &token, 200),
        ("chat:1", &bob_token, 403),
        ("doc:9", &token, 200),
        ("doc:9", &bob_token, 403),
        ("lobby:x", &bob_token, 200),
    ] {
        let (got, body) = get(&format!("{base}/api/rooms/{room}?token={token}")).await;
        assert_eq!(got, status, "{room}: {body}");
    }
    let (status, body) = post(
        &format!("{base}/api/rooms/query?token={bob_token}"),
        &json!({"rooms": ["lobby:x", "chat:1"]}),
    )
    .await;
    assert_eq!(status, 403, "{body}");
}

/// A policy that names no policy, or a rule after one that covers it,
/// keeps the node from starting, with the reason.
#[test]
fn bad_policies_keep_the_node_from_starting() {
    let redis = Redis::start();
    for (policy, says) in [
        ("chat:*=member", "unknown policy"),
        ("ch*t=open", "not a room id"),
    ] {
        let args: Vec<String> = [
            "--listen",
            "127.0.0.1:0",
            "--redis-url",
            &redis.url,
            "--room-policy",
            policy,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let err = Node::spawn("bad", &args, &[]).err().expect("refused");
        assert!(err.contains(says), "{policy}: {err}");
    }
}

/// `members`: only the users on the list join, checked by the join step;
/// a removal takes every device of the user out at once, on every node
/// (the others see the leave, the device gets `removed` and hears nothing
/// more), and off the list, so that its join is refused.
#[tokio::test]
async fn a_member_list_lets_in_and_a_removal_is_at_once_on_every_node() {
    let redis = Redis::start();
    let a = node(&redis, "a", &["chat:*=members"]);
    let b = node(&redis, "b", &["chat:*=members"]);
    put_members(&a, "chat:7", &["alice", "bob"]).await;
    let mut alice = Client::connect(&a, "alice", "web").await;
    join(&mut alice, "chat:7", json!({})).await;
    let mut bob = Client::connect(&b, "bob", "phone").await;
    let mut bob2 = Client::connect(&a, "bob", "laptop").await;
    join(&mut bob, "chat:7", json!({})).await;
    join(&mut bob2, "chat:7", json!({})).await;
    expect_event(&mut alice, "room_join", "chat:7", "bob", "phone").await;
    expect_event(&mut alice, "room_join", "chat:7", "bob", "laptop").await;
    let mut carol = Client::connect(&b, "carol", "web").await;
    let e = refused_join(&mut carol, "chat:7").await;
    assert_eq!(e["code"], "forbidden", "{e}");

    let removed_at = Instant::now();
    let gone = remove(&b, "chat:7", "bob").await;
    assert_eq!(gone["devices"], json!(["laptop", "phone"]), "{gone}");
    assert_eq!(gone["listed"], true);
    let mut lefts = BTreeSet::new();
    for _ in 0..2 {
        let v = alice.expect("room_leave").await;
        assert_eq!(
            (v["user"].as_str(), v["removed"].as_bool()),
            (Some("bob"), Some(true)),
            "{v}"
        );
        lefts.insert(v["device"].as_str().unwrap().to_string());
    }
    assert!(
        removed_at.elapsed() < Duration::from_secs(1),
        "{:?}",
        removed_at.elapsed()
    );
    for c in [&mut bob, &mut bob2] {
        let e = next_of(c, "error").await;
        assert_eq!(
            (e["code"].as_str(), e["room"].as_str()),
            (Some("removed"), Some("chat:7")),
            "{e}"
        );
    }
    // Nothing more reaches bob's devices, and their frames are refused.
    alice
        .send(json!({"type": "signal", "room": "chat:7", "data": "hi"}))
        .await;
    expect_quiet(&mut bob, Duration::from_millis(300)).await;
    bob.send(json!({"type": "signal", "room": "chat:7", "data": "x"}))
        .await;
    assert_eq!(bob.expect("error").await["code"], "not_in_room");
    // Off the list: a join is refused; back on it, it passes.
    assert_eq!(refused_join(&mut bob, "chat:7").await["code"], "forbidden");
    let (status, _) = admin(
        &a,
        reqwest::Method::POST,
        "/api/rooms/chat:7/members/bob",
        None,
    )
    .await;
    assert_eq!(status, 200);
    let frame = join(&mut bob, "chat:7", json!({})).await;
    assert_eq!(members(&frame), ["alice:web", "bob:phone"]);
    expect_event(&mut alice, "room_join", "chat:7", "bob", "phone").await;
    // The list, paged.
    let (status, page) = get_as(
        &format!("{}/api/rooms/chat:7/members?limit=1", a.http()),
        Some(ADMIN),
    )
    .await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(
        (page["users"].clone(), page["total"].clone()),
        (json!(["alice"]), json!(2))
    );
    assert_eq!(page["next_cursor"], "alice");
    // A replacement takes users off: their devices leave at once.
    put_members(&a, "chat:7", &["bob"]).await;
    let v = bob.expect("room_leave").await;
    assert_eq!(
        (v["user"].as_str(), v["removed"].as_bool()),
        (Some("alice"), Some(true)),
        "{v}"
    );
    assert_eq!(alice.expect("error").await["code"], "removed");
}

/// Under `open` (and `claim`), a removal takes the user's devices out at
/// once as well; a join of its own afterwards follows the policy.
#[tokio::test]
async fn a_removal_works_under_every_policy() {
    let redis = Redis::start();
    let node = node(&redis, "n1", &[]);
    let mut alice = Client::connect(&node, "alice", "web").await;
    join(&mut alice, "open:1", json!({})).await;
    let mut bob = Client::connect(&node, "bob", "web").await;
    join(&mut bob, "open:1", json!({})).await;
    expect_event(&mut alice, "room_join", "open:1", "bob", "web").await;
    let gone = remove(&node, "open:1", "bob").await;
    assert_eq!(
        (gone["devices"].clone(), gone["listed"].clone()),
        (json!(["web"]), json!(false))
    );
    let v = expect_event(&mut alice, "room_leave", "open:1", "bob", "web").await;
    assert_eq!(v["removed"], true);
    assert_eq!(bob.expect("error").await["code"], "removed");
    let frame = join(&mut bob, "open:1", json!({})).await;
    assert_eq!(members(&frame), ["alice:web", "bob:web"]);
    expect_event(&mut alice, "room_join", "open:1", "bob", "web").await;
    // Nothing to remove: an empty answer, no event.
    let gone = remove(&node, "open:1", "nobody").await;
    assert_eq!(gone["devices"], json!([]));
    expect_quiet(&mut alice, Duration::from_millis(200)).await;
    // The admin API needs the key.
    let (status, _) = post(
        &format!("{}/api/rooms/open:1/members/x", node.http()),
        &json!({}),
    )
    .await;
    assert_eq!(status, 401);
}

/// Adds, removals and joins racing on two nodes end with exactly the
/// allowed users in the room: no device of a user off the list stays in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adds_removals_and_joins_racing_end_with_only_the_allowed_in() {
    let redis = Redis::start();
    let a = node(&redis, "a", &["race:*=members"]);
    let b = node(&redis, "b", &["race:*=members"]);
    let users: Vec<String> = (0..20).map(|i| format!("u{i:02}")).collect();
    let mut devices = Vec::new();
    for (i, user) in users.iter().enumerate() {
        let n = if i % 2 == 0 { &a } else { &b };
        devices.push(Client::connect(n, user, "d").await);
    }
    // 1,000 admin operations, adds and removals at random, from both
    // nodes, while every device sends joins all along.
    let ops = {
        let (a, b, users) = (a.http(), b.http(), users.clone());
        tokio::spawn(async move {
            let client = reqwest::Client::new();
            let mut tasks = Vec::new();
            for i in 0..1_000usize {
                let base = if i % 2 == 0 { &a } else { &b };
                let user = &users[(i * 7 + i / 3) % users.len()];
                let (method, path) = if (i / 5) % 2 == 0 {
                    (
                        reqwest::Method::POST,
                        format!("{base}/api/rooms/race:1/members/{user}"),
                    )
                } else {
                    (
                        reqwest::Method::DELETE,
                        format!("{base}/api/rooms/race:1/members/{user}"),
                    )
                };
                let req = client.request(method, path).bearer_auth(ADMIN);
                tasks.push(tokio::spawn(async move {
                    req.send().await.map(|r| r.status().as_u16())
                }));
                if tasks.len() >= 50 {
                    for t in tasks.drain(..) {
                        assert_eq!(t.await.unwrap().unwrap(), 200);
                    }
                }
            }
            for t in tasks {
                assert_eq!(t.await.unwrap().unwrap(), 200);
            }
        })
    };
    while !ops.is_finished() {
        for d in devices.iter_mut() {
            d.send(json!({"type": "join", "room": "race:1", "state": {}}))
                .await;
        }
        // Ten joins a second per device: under its frame limit.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    ops.await.unwrap();
    let allowed: BTreeSet<String> = {
        let mut c = redis.aconn().await;
        redis::cmd("ZRANGE")
            .arg("presence-room-allowed:{r:race:1}")
            .arg(0)
            .arg(-1)
            .query_async::<Vec<String>>(&mut c)
            .await
            .unwrap()
            .into_iter()
            .collect()
    };
    // Every answer to the joins so far is in; then each device joins once
    // more: the allowed get in, the others are refused.
    for d in devices.iter_mut() {
        while d.next_within(Duration::from_millis(300)).await.is_some() {}
    }
    for (user, d) in users.iter().zip(devices.iter_mut()) {
        d.send(json!({"type": "join", "room": "race:1", "state": {}}))
            .await;
        let v = loop {
            let v = d.recv().await;
            if v["type"] == "room" || v["type"] == "error" {
                break v;
            }
        };
        let allowed = allowed.contains(user);
        assert_eq!(
            v["type"],
            if allowed { "room" } else { "error" },
            "{user}: {v}"
        );
        if !allowed {
            assert_eq!(v["code"], "forbidden", "{user}: {v}");
        }
    }
    // The room holds exactly the allowed users' devices.
    let (_, page) = get_as(
        &format!("{}/api/rooms/race:1?limit=1000", a.http()),
        Some(ADMIN),
    )
    .await;
    let listed: BTreeSet<String> = page["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["user"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(listed, allowed, "{page}");
}

/// The same on a Redis Cluster: the list and the room on one shard, the
/// removal seen at once by a member on another node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removal_is_at_once_on_a_cluster() {
    let cluster = Cluster::start();
    let flags = ["--admin-key", ADMIN, "--room-policy", "chat:*=members"];
    let a = cluster.node_with("a", &flags);
    let b = cluster.node_with("b", &flags);
    put_members(&a, "chat:c", &["alice", "bob"]).await;
    let mut alice = Client::connect(&a, "alice", "web").await;
    join(&mut alice, "chat:c", json!({})).await;
    let mut bob = Client::connect(&b, "bob", "web").await;
    join(&mut bob, "chat:c", json!({})).await;
    expect_event(&mut alice, "room_join", "chat:c", "bob", "web").await;
    let removed_at = Instant::now();
    remove(&a, "chat:c", "bob").await;
    let v = expect_event(&mut alice, "room_leave", "chat:c", "bob", "web").await;
    assert_eq!(v["removed"], true);
    assert_eq!(bob.expect("error").await["code"], "removed");
    assert!(
        removed_at.elapsed() < Duration::from_secs(1),
        "{:?}",
        removed_at.elapsed()
    );
    assert_eq!(refused_join(&mut bob, "chat:c").await["code"], "forbidden");
}

/// A device the backend removed is not put back by its session's own
/// rejoin (a refresh that found the membership gone before the removal's
/// event reached the session): the step refuses it for a lease TTL, while
/// a join of the client's own follows the policy. Run on the store itself,
/// so that the order of the two is certain.
#[tokio::test]
async fn a_removed_device_is_not_rejoined_by_its_session() {
    use presence_server::store::rooms::{JoinAccess, Joined};
    let redis = Redis::start();
    let client = redis::Client::open(redis.url.as_str()).unwrap();
    let store = presence_server::store::Store::new(
        client.get_connection_manager().await.unwrap(),
        Duration::from_secs(45),
    );
    store.load_scripts().await.unwrap();
    let owner = store.lease_value().to_string();
    let join_granted = |rejoin: bool, granted_at: Option<i64>| {
        let (store, owner) = (store.clone(), owner.clone());
        async move {
            let access = JoinAccess {
                listed: false,
                rejoin,
                granted_at,
            };
            store
                .join_room("r", "bob", "d", "{}", &owner, 100, access)
                .await
                .unwrap()
        }
    };
    let join = |rejoin: bool| join_granted(rejoin, None);
    assert!(matches!(join(false).await, Joined::Joined { .. }));
    let before = presence_server::clock::now_ms() - 1;
    let (devices, _) = store
        .remove_room_user("r", "bob", false, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(devices, ["d"]);
    assert_eq!(join(true).await, Joined::Removed);
    // The client's own join is let in (the policy is open), and from then
    // on the session's rejoins are too.
    assert!(matches!(join(false).await, Joined::Joined { .. }));
    assert!(matches!(join(true).await, Joined::Updated { .. }));
    // A grant of the app's backend (`proxy`) asked before the removal is
    // void, for a new device of the user too; one asked after it holds.
    assert_eq!(join_granted(false, Some(before)).await, Joined::Revoked);
    let after = presence_server::clock::now_ms() + 1;
    assert!(matches!(
        join_granted(false, Some(after)).await,
        Joined::Updated { .. }
    ));
}

/// A member list of 10,000 users fits, whatever the length of their ids
/// (the longest are 128 bytes: 1.3 MB of JSON, past the 256 KiB of the
/// other bodies); one more user is `413 too_many_users`.
#[tokio::test]
async fn the_longest_member_list_fits() {
    let redis = Redis::start();
    let node = node(&redis, "n1", &["big:*=members"]);
    let long = |i: usize| format!("{i:0>128}");
    let users: Vec<String> = (0..10_000).map(long).collect();
    let (status, body) = admin(
        &node,
        reqwest::Method::PUT,
        "/api/rooms/big:1/members",
        Some(json!({ "users": users })),
    )
    .await;
    assert_eq!((status, body["users"].clone()), (200, json!(10_000)));
    let more: Vec<String> = (0..10_001).map(long).collect();
    let (status, body) = admin(
        &node,
        reqwest::Method::PUT,
        "/api/rooms/big:1/members",
        Some(json!({ "users": more })),
    )
    .await;
    assert_eq!(
        (status, body["code"].clone()),
        (413, json!("too_many_users")),
        "{body}"
    );
}
