//! The server on a real Redis Cluster (three primaries, one replica each):
//! users placed on every shard, nodes as processes, primaries and nodes
//! killed with SIGKILL.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use crate::common::cluster::Cluster;
use crate::common::*;
use serde_json::json;

/// One user per shard, named `<prefix><n>`.
fn users_on_every_shard(cluster: &Cluster, prefix: &str) -> Vec<String> {
    cluster
        .shards()
        .iter()
        .enumerate()
        .map(|(i, shard)| cluster.user_on(shard, &format!("{prefix}{i}x")))
        .collect()
}

/// Nothing more arrives at `client` within `quiet`.
async fn assert_quiet(client: &mut Client, quiet: Duration, what: &str) {
    if let Some(frame) = client.next_within(quiet).await {
        panic!("{what}: unexpected {frame:?}");
    }
}

#[tokio::test]
async fn transitions_cross_nodes_exactly_once_on_every_shard() {
    let cluster = Cluster::start();
    let a = cluster.node("a");
    let b = cluster.node("b");
    let users = users_on_every_shard(&cluster, "u");
    let names: Vec<&str> = users.iter().map(String::as_str).collect();

    let mut watcher = Client::connect(&a, "watcher", "w").await;
    let snap = watcher.watch(&names).await;
    assert!(snap.iter().all(|r| r["status"] == "offline"), "{snap:?}");
    for user in &users {
        // The watch is answered once the subscription is confirmed on the
        // shard that serves the user's channel.
        assert_eq!(cluster.shard_subscribers(user), 1, "{user}");
    }

    // Each user comes online on the other node, then leaves: one event
    // each way, no duplicates.
    for user in &users {
        let device = Client::connect(&b, user, "d").await;
        watcher.expect_presence(user, "online").await;
        device.close().await;
        watcher.expect_presence(user, "offline").await;
    }
    assert_quiet(
        &mut watcher,
        Duration::from_millis(2 * HEARTBEAT_MS),
        "a duplicate",
    )
    .await;

    // Unwatch and disconnect let the subscriptions go.
    watcher
        .send(json!({"type": "unwatch", "users": [names[0]]}))
        .await;
    cluster.wait_subscribers(names[0], 0).await;
    assert_eq!(cluster.shard_subscribers(names[1]), 1);
    watcher.close().await;
    for user in &users {
        cluster.wait_subscribers(user, 0).await;
    }
}

#[tokio::test]
async fn snapshot_bulk_query_and_online_list_span_the_shards() {
    let cluster = Cluster::start();
    let a = cluster.node("a");
    let b = cluster.node("b");
    // Three users per shard online on node a, one offline user per shard.
    let mut online = Vec::new();
    for round in 0..3 {
        online.extend(users_on_every_shard(&cluster, &format!("on{round}")));
    }
    let offline = users_on_every_shard(&cluster, "off");
    let mut devices = Vec::new();
    for user in &online {
        devices.push(Client::connect(&a, user, "d").await);
    }

    // A snapshot on the other node: every user, in order, as it is.
    let mut watched: Vec<&str> = online.iter().map(String::as_str).collect();
    watched.extend(offline.iter().map(String::as_str));
    let mut watcher = Client::connect(&b, "watcher", "w").await;
    let snap = watcher.watch(&watched).await;
    let got: HashSet<(String, String)> = snap
        .iter()
        .map(|r| {
            (
                r["user"].as_str().unwrap().to_string(),
                r["status"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    for user in &online {
        assert!(
            got.contains(&(user.clone(), "online".into())),
            "{user}: {snap:?}"
        );
    }
    for user in &offline {
        assert!(
            got.contains(&(user.clone(), "offline".into())),
            "{user}: {snap:?}"
        );
    }

    // The bulk query keeps the order asked, across shards.
    let (status, body) = post(
        &format!("{}/api/presence/query", b.http()),
        &json!({"users": watched}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let statuses: Vec<(&str, &str)> = body["presence"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["user"].as_str().unwrap(), r["status"].as_str().unwrap()))
        .collect();
    let expected: Vec<(&str, &str)> = watched
        .iter()
        .map(|u| {
            let status = if online.iter().any(|o| o == u) {
                "online"
            } else {
                "offline"
            };
            (*u, status)
        })
        .collect();
    assert_eq!(statuses, expected);

    // The online list, two per page, merges the buckets of every shard:
    // each online user once, newest first.
    let mut seen: Vec<(String, i64)> = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let url = match &cursor {
            Some(c) => format!("{}/api/online?limit=2&cursor={c}", b.http()),
            None => format!("{}/api/online?limit=2", b.http()),
        };
        let (status, page) = get(&url).await;
        assert_eq!(status, 200, "{page}");
        for u in page["users"].as_array().unwrap() {
            seen.push((
                u["user"].as_str().unwrap().to_string(),
                u["active_at"].as_i64().unwrap(),
            ));
        }
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
        assert!(seen.len() <= 100, "the list never ends");
    }
    let listed: HashSet<&str> = seen.iter().map(|(u, _)| u.as_str()).collect();
    let mut wanted: HashSet<&str> = online.iter().map(String::as_str).collect();
    wanted.insert("watcher");
    assert_eq!(listed, wanted);
    assert_eq!(seen.len(), wanted.len(), "a user listed twice: {seen:?}");
    assert!(seen.windows(2).all(|w| w[0].1 >= w[1].1), "{seen:?}");
}

#[tokio::test]
async fn a_killed_nodes_devices_go_offline_within_ttl_on_every_shard() {
    let cluster = Cluster::start();
    let mut a = cluster.node("a");
    let b = cluster.node("b");
    let users = users_on_every_shard(&cluster, "k");
    let names: Vec<&str> = users.iter().map(String::as_str).collect();
    let mut watcher = Client::connect(&b, "watcher", "w").await;
    watcher.watch(&names).await;
    let mut devices = Vec::new();
    for user in &users {
        devices.push(Client::connect(&a, user, "d").await);
        watcher.expect_presence(user, "online").await;
    }

    let killed = Instant::now();
    a.kill();
    let mut gone = HashSet::new();
    while gone.len() < users.len() {
        let ev = watcher.expect("presence").await;
        assert_eq!(ev["status"], "offline", "{ev}");
        assert!(
            gone.insert(ev["user"].as_str().unwrap().to_string()),
            "twice: {ev}"
        );
        let elapsed = killed.elapsed();
        assert!(
            elapsed <= TTL + Duration::from_millis(1500),
            "offline after {elapsed:?}"
        );
    }
    assert_quiet(
        &mut watcher,
        Duration::from_millis(2 * HEARTBEAT_MS),
        "a duplicate",
    )
    .await;
}

/// A primary killed with SIGKILL: its replica takes over; devices that stay
/// connected do not flicker, a new arrival is announced, and a device that
/// dies silently on the promoted shard goes offline within TTL + 1.5 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_failover_keeps_presence_right() {
    let mut cluster = Cluster::start();
    // Leases outlive the failover (node timeout plus an election, and the
    // node learning of it; on a box busy with the whole suite that has
    // taken longer than a 4.5 s lease once in CI).
    const HB: &str = "2000";
    let ttl = Duration::from_millis(3 * 2000);
    let a = cluster.node_with("a", &["--heartbeat-ms", HB]);
    let b = cluster.node_with("b", &["--heartbeat-ms", HB]);
    let mut c = cluster.node_with("c", &["--heartbeat-ms", HB]);
    let shards = cluster.shards();
    let victim = shards[0].clone();
    let stays = users_on_every_shard(&cluster, "stay");
    let newcomer = cluster.user_on(&victim, "new");
    let doomed = cluster.user_on(&victim, "doom");
    let mut watched: Vec<&str> = stays.iter().map(String::as_str).collect();
    watched.extend([newcomer.as_str(), doomed.as_str()]);

    let mut watcher = Client::connect(&b, "watcher", "w").await;
    watcher.watch(&watched).await;
    let mut devices = Vec::new();
    for user in &stays {
        devices.push(Client::connect(&a, user, "d").await);
        watcher.expect_presence(user, "online").await;
    }
    let _doomed = Client::connect(&c, &doomed, "d").await;
    watcher.expect_presence(&doomed, "online").await;

    cluster.kill(victim.primary);
    // The clients keep answering pings meanwhile, as live devices do: on a
    // loaded machine the failover can outlast the node's client timeout.
    tokio::task::block_in_place(|| cluster.wait_healthy(&[victim.primary]));
    let promoted = cluster.shard_of(&newcomer).primary;
    assert!(victim.replicas.contains(&promoted), "{promoted} took over");

    // A new arrival on the promoted shard is announced. The node may learn
    // of the promotion a moment after redis-cli does: until then its claim
    // fails and the device is told `unavailable`, and retries like a client.
    let deadline = Instant::now() + DEADLINE;
    let _new = loop {
        if let Some(c) = Client::try_connect(&a, &newcomer, "d").await {
            break c;
        }
        assert!(Instant::now() < deadline, "{newcomer} never got in");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    watcher.expect_presence(&newcomer, "online").await;

    // A device dying silently on the promoted shard: its node is killed.
    let killed = Instant::now();
    c.kill();
    watcher.expect_presence(&doomed, "offline").await;
    let elapsed = killed.elapsed();
    assert!(
        elapsed <= ttl + Duration::from_millis(1500),
        "offline after {elapsed:?}"
    );

    // The devices that stayed never flickered: nothing else came.
    assert_quiet(&mut watcher, Duration::from_secs(2), "a flicker").await;
    // Read back through the other node; a read that meets the cluster
    // still settling is answered 503 (documented) and asked again.
    let deadline = Instant::now() + DEADLINE;
    let body = loop {
        let (status, body) = post(
            &format!("{}/api/presence/query", b.http()),
            &json!({"users": stays}),
        )
        .await;
        if status == 200 {
            break body;
        }
        assert!(
            status == 503 && Instant::now() < deadline,
            "query answered {status}: {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for r in body["presence"].as_array().unwrap() {
        assert_eq!(r["status"], "online", "{r}");
    }
}

/// A node started while a shard has no primary (its failover under way)
/// waits for the promotion instead of exiting, and then serves users on
/// every shard, the failed one's too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_started_during_a_failover_waits_for_it() {
    let mut cluster = Cluster::start();
    let victim = cluster.shards()[0].clone();
    cluster.kill(victim.primary);
    let node = cluster.node_with("late", &[]);
    let mut watcher = Client::connect(&node, "watcher", "w").await;
    let users = users_on_every_shard(&cluster, "late");
    let watched: Vec<&str> = users.iter().map(String::as_str).collect();
    watcher.watch(&watched).await;
    let mut devices = Vec::new();
    for user in &users {
        devices.push(Client::connect(&node, user, "d").await);
        watcher.expect_presence(user, "online").await;
    }
}

#[tokio::test]
async fn a_list_of_seeds_starts_and_a_non_cluster_list_is_refused() {
    let cluster = Cluster::start();
    let mut args: Vec<String> = ["--listen", "127.0.0.1:0", "--node-id", "s", "--redis-url"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.push(cluster.seeds());
    let node = Node::spawn("s", &args, &[]).expect("starts on a seed list");
    let _alice = Client::connect(&node, "alice", "d").await;
    let (_, body) = get(&format!("{}/api/presence/alice", node.http())).await;
    assert_eq!(body["status"], "online", "{body}");
    // /healthz watches the cluster through its own connection.
    let (status, health) = get(&format!("{}/healthz", node.http())).await;
    assert_eq!(status, 200, "{health}");

    // Two standalone servers are not a cluster: a clear error, no start.
    let (one, two) = (Redis::start(), Redis::start());
    args.pop();
    args.push(format!("{},{}", one.url, two.url));
    let logs = Node::spawn("s2", &args, &[]).err().expect("refused");
    assert!(logs.contains("not a Redis Cluster node"), "{logs}");
}

/// Expired events handled by `node` so far.
async fn expired_events(node: &Node) -> i64 {
    let (_, health) = get(&format!("{}/healthz", node.http())).await;
    health["counters"]["expired_events"].as_i64().unwrap()
}

/// Each primary's expired events reach one node of the fleet, not every
/// node: a lapsed lease is departed once by its event.
#[tokio::test]
async fn each_expired_event_is_handled_by_one_node() {
    let cluster = Cluster::start();
    // The first node takes every primary's expiry lock; the others stand by.
    let b = cluster.node("b");
    wait_until("b owns the three primaries' events", DEADLINE, || async {
        b.logs().matches("owning the expired events of").count() == 3
    })
    .await;
    let c = cluster.node("c");
    let mut a = cluster.node("a");
    let mut users = Vec::new();
    for round in 0..4 {
        users.extend(users_on_every_shard(&cluster, &format!("e{round}")));
    }
    let names: Vec<&str> = users.iter().map(String::as_str).collect();
    let mut watcher = Client::connect(&c, "watcher", "w").await;
    watcher.watch(&names).await;
    let mut devices = Vec::new();
    for user in &users {
        devices.push(Client::connect(&a, user, "d").await);
        watcher.expect_presence(user, "online").await;
    }
    let before = expired_events(&b).await + expired_events(&c).await;

    a.kill();
    for _ in &users {
        let ev = watcher.expect("presence").await;
        assert_eq!(ev["status"], "offline", "{ev}");
    }
    // Every lapsed lease is announced by its primary once; wait for the
    // events, then count them across the fleet.
    wait_until("the expired events", DEADLINE, || async {
        expired_events(&b).await + expired_events(&c).await - before >= users.len() as i64
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let handled = expired_events(&b).await + expired_events(&c).await - before;
    assert_eq!(
        handled,
        users.len() as i64,
        "expired events handled in the fleet"
    );
    assert!(
        !c.logs().contains("owning the expired events of"),
        "{}",
        c.logs()
    );
}

/// Live leases beside the dying devices, spread over the shards.
const LIVE_LEASES: usize = 30_000;
/// Devices of the node that is killed.
const DYING_DEVICES: usize = 300;

/// Writes `LIVE_LEASES` live leases (as the bench's fixture writes them)
/// through the server's own cluster connection, which splits the pipelines
/// by slot.
async fn fill_live_leases(cluster: &Cluster) {
    let client = redis::cluster::ClusterClient::new(vec![cluster.url()]).unwrap();
    let mut conn =
        presence_server::store::RedisConn::cluster(client.get_async_connection().await.unwrap());
    presence_bench::fixture::live_leases(&mut conn, "live", LIVE_LEASES, "elsewhere 1 0", true)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dying_devices_expire_on_time_beside_live_leases_on_every_shard() {
    raise_fd_limit();
    let cluster = Cluster::start();
    fill_live_leases(&cluster).await;
    let mut a = cluster.node("a");
    let b = cluster.node("b");

    let users: Vec<String> = (0..DYING_DEVICES).map(|i| format!("dying{i}")).collect();
    let shards: HashSet<u16> = users.iter().map(|u| cluster.shard_of(u).primary).collect();
    assert_eq!(shards.len(), 3, "the dying users span every shard");
    let mut devices = Vec::with_capacity(DYING_DEVICES);
    for chunk in users.chunks(100) {
        let batch =
            futures_util::future::join_all(chunk.iter().map(|u| Client::connect(&a, u, "d"))).await;
        devices.extend(batch);
    }
    let mut watcher = Client::connect(&b, "watcher", "w").await;
    let names: Vec<&str> = users.iter().map(String::as_str).collect();
    let snap = watcher.watch(&names).await;
    assert!(
        snap.iter().all(|r| r["status"] == "online"),
        "not all online before the kill"
    );

    let killed = Instant::now();
    a.kill();
    let latest = last_of_offlines(&mut watcher, DYING_DEVICES, killed, TTL).await;
    println!(
        "{DYING_DEVICES} devices offline {latest:?} after SIGKILL (TTL {TTL:?}) beside {LIVE_LEASES} live leases on 3 primaries"
    );
    assert!(
        latest <= TTL + Duration::from_secs(1),
        "last offline after {latest:?}"
    );
    drop(devices);
}

/// One room per shard (its keys share the `{r:<room>}` tag), named
/// `<prefix><n>`.
fn rooms_on_every_shard(cluster: &Cluster, prefix: &str) -> Vec<String> {
    cluster
        .shards()
        .iter()
        .enumerate()
        .map(|(i, shard)| {
            (0..)
                .map(|n| format!("{prefix}{i}:{n}"))
                .find(|room| shard.serves(cluster.slot(&format!("r:{room}"))))
                .unwrap()
        })
        .collect()
}

/// Joins `room` and waits for its `room` frame.
async fn join_room(c: &mut Client, room: &str) -> serde_json::Value {
    c.send(json!({"type": "join", "room": room})).await;
    let frame = c.expect("room").await;
    assert_eq!(frame["room"], room, "{frame}");
    frame
}

/// Rooms on every shard: joins cross nodes once, and a SIGKILLed node's
/// members leave every room within TTL + 1.5 s, once.
#[tokio::test]
async fn rooms_on_every_shard_and_a_killed_nodes_members_leave() {
    let cluster = Cluster::start();
    let a = cluster.node("a");
    let mut b = cluster.node("b");
    let rooms = rooms_on_every_shard(&cluster, "room");
    let mut alice = Client::connect(&a, "alice", "web").await;
    let mut bob = Client::connect(&b, "bob", "laptop").await;
    for room in &rooms {
        join_room(&mut alice, room).await;
        let frame = join_room(&mut bob, room).await;
        assert_eq!(frame["users"], 2, "{frame}");
        let ev = alice.expect("room_join").await;
        assert_eq!(
            (ev["room"].as_str(), ev["first"].as_bool()),
            (Some(room.as_str()), Some(true))
        );
    }
    let killed = Instant::now();
    b.kill();
    let mut left = HashSet::new();
    while left.len() < rooms.len() {
        let ev = alice.expect("room_leave").await;
        assert_eq!(
            (ev["user"].as_str(), ev["last"].as_bool()),
            (Some("bob"), Some(true)),
            "{ev}"
        );
        assert!(
            left.insert(ev["room"].as_str().unwrap().to_string()),
            "twice: {ev}"
        );
        let elapsed = killed.elapsed();
        assert!(
            elapsed <= TTL + Duration::from_millis(1500),
            "left after {elapsed:?}"
        );
    }
    assert_quiet(
        &mut alice,
        Duration::from_millis(2 * HEARTBEAT_MS),
        "a duplicate",
    )
    .await;
    for room in &rooms {
        let (_, body) = get(&format!("{}/api/rooms/{room}", a.http())).await;
        assert_eq!(
            (body["users"].as_u64(), body["devices"].as_u64()),
            (Some(1), Some(1)),
            "{body}"
        );
    }
}

/// A primary killed with SIGKILL: members connected across the failover
/// keep every room, with no leave, on every shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_keep_their_rooms_across_a_primary_failover() {
    let mut cluster = Cluster::start();
    const HB: &str = "1500";
    let a = cluster.node_with("a", &["--heartbeat-ms", HB]);
    let b = cluster.node_with("b", &["--heartbeat-ms", HB]);
    let victim = cluster.shards()[0].clone();
    let rooms = rooms_on_every_shard(&cluster, "stay");
    let mut alice = Client::connect(&a, "alice", "web").await;
    let mut bob = Client::connect(&b, "bob", "laptop").await;
    for room in &rooms {
        join_room(&mut alice, room).await;
        join_room(&mut bob, room).await;
        alice.expect("room_join").await;
    }
    cluster.kill(victim.primary);
    tokio::task::block_in_place(|| cluster.wait_healthy(&[victim.primary]));
    // Two membership deadlines on: every refresh went through. A fresh room
    // frame (the node re-reads its rooms after its subscriptions were
    // renewed) is fine; a leave or a join is not.
    let until = Instant::now() + Duration::from_secs(9);
    while let Some(frame) = alice
        .next_within(until.saturating_duration_since(Instant::now()))
        .await
    {
        let Incoming::Frame(v) = frame else {
            panic!("alice's connection closed: {frame:?}");
        };
        assert_eq!(v["type"], "room", "across the failover: {v}");
        assert_eq!(
            (v["users"].as_u64(), v["devices"].as_u64()),
            (Some(2), Some(2)),
            "{v}"
        );
    }
    for room in &rooms {
        let (_, body) = get(&format!("{}/api/rooms/{room}", b.http())).await;
        assert_eq!(
            (body["users"].as_u64(), body["devices"].as_u64()),
            (Some(2), Some(2)),
            "{body}"
        );
    }
    // The room on the promoted shard still works both ways.
    bob.send(json!({"type": "signal", "room": rooms[0], "data": "hi"}))
        .await;
    let ev = alice.expect("signal").await;
    assert_eq!(ev["room"], rooms[0]);
}
