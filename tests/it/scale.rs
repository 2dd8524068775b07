//! Expiry stays timely at scale (design invariant 3): with 100,000 live
//! leases in Redis, 1,000 devices whose node dies are all announced offline
//! within TTL + 1 s.

use std::time::{Duration, Instant};

use crate::common::*;

const LIVE_LEASES: usize = 100_000;
const DYING_DEVICES: usize = 1_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_devices_of_a_killed_node_expire_on_time_beside_100k_live_leases() {
    raise_fd_limit();
    let redis = Redis::start();
    fill_live_leases(&redis).await;
    let mut a = Node::start(&redis, "a");
    let b = Node::start(&redis, "b");

    let users: Vec<String> = (0..DYING_DEVICES).map(|i| format!("dying{i}")).collect();
    let mut devices = Vec::with_capacity(DYING_DEVICES);
    for chunk in users.chunks(100) {
        let batch =
            futures_util::future::join_all(chunk.iter().map(|u| Client::connect(&a, u, "phone")))
                .await;
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
        "{DYING_DEVICES} devices offline {latest:?} after SIGKILL (TTL {TTL:?}) beside {LIVE_LEASES} live leases"
    );
    assert!(
        latest <= TTL + Duration::from_secs(1),
        "last offline after {latest:?}"
    );

    // Counters at rest: the dead devices are gone, the live leases untouched.
    wait_until("the index holds only live leases", DEADLINE, || async {
        let leases = index_members(&redis, "presence-leases").await.len();
        // The live leases and the watcher's.
        leases == LIVE_LEASES + 1
    })
    .await;
    for u in users.iter().step_by(97) {
        assert_eq!(count(&redis, u).await, 0, "{u}");
    }
    drop(devices);
}

/// Writes leases the way a node does (lease, device set, counter, deadline
/// index), with a TTL far beyond the test.
async fn fill_live_leases(redis: &Redis) {
    let mut c = redis.aconn().await;
    presence_bench::fixture::live_leases(&mut c, "live", LIVE_LEASES, "elsewhere 1 0", true)
        .await
        .unwrap();
}

/// Live memberships written as the room steps write them, far from their
/// deadline: `rooms` rooms of `per_room` members each.
async fn fill_live_memberships(redis: &Redis, rooms: usize, per_room: usize) {
    let mut conn = redis.aconn().await;
    let deadline = presence_server::store::now_ms() + 600_000;
    for r in 0..rooms {
        let room = format!("big{r}");
        let mut pipe = redis::pipe();
        for i in 0..per_room {
            let user = format!("live{r}_{i}");
            let member = format!("{user}:d");
            pipe.hset(format!("presence-room:{{r:{room}}}"), &member, "1|0|{}")
                .ignore();
            pipe.zadd(
                format!("presence-room-deadlines:{{r:{room}}}"),
                &member,
                deadline,
            )
            .ignore();
            pipe.hset(format!("presence-room-users:{{r:{room}}}"), &user, 1)
                .ignore();
        }
        let bucket = presence_server::keys::Buckets::default().of(&room);
        pipe.zadd(presence_server::keys::room_due(bucket), &room, deadline)
            .ignore();
        let () = pipe.query_async(&mut conn).await.unwrap();
    }
}

/// Design invariant 7 at scale: the devices of a SIGKILLed node leave
/// every room within TTL + 1 s, beside 100,000 live memberships.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_nodes_members_leave_on_time_beside_100k_live_memberships() {
    const ROOMS: usize = 100;
    const PER_ROOM: usize = 1_000;
    const DYING: usize = 200;
    raise_fd_limit();
    let redis = Redis::start();
    fill_live_memberships(&redis, ROOMS, PER_ROOM).await;
    let mut a = Node::start(&redis, "a");
    // The node whose room deadline pass sees them go.
    let _b = Node::start(&redis, "b");
    let mut dying = Vec::with_capacity(DYING);
    for i in 0..DYING {
        let mut c = Client::connect(&a, &format!("dying{i}"), "phone").await;
        c.send(serde_json::json!({"type": "join", "room": format!("big{}", i % 10)}))
            .await;
        dying.push(c);
    }
    for c in &mut dying {
        c.expect("room").await;
    }
    let members = |r: usize| {
        let redis = &redis;
        async move {
            let mut conn = redis.aconn().await;
            redis::cmd("HLEN")
                .arg(format!("presence-room:{{r:big{r}}}"))
                .query_async::<usize>(&mut conn)
                .await
                .unwrap()
        }
    };
    assert_eq!(members(0).await, PER_ROOM + DYING / 10);

    let killed = Instant::now();
    a.kill();
    loop {
        let mut left = 0;
        for r in 0..10 {
            left += members(r).await - PER_ROOM;
        }
        if left == 0 {
            break;
        }
        assert!(
            killed.elapsed() <= TTL + Duration::from_secs(1),
            "{left} memberships of the killed node left after {:?}",
            killed.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!(
        "{DYING} memberships gone {:?} after SIGKILL (TTL {TTL:?}) beside {} live ones",
        killed.elapsed(),
        ROOMS * PER_ROOM
    );
    // The live memberships are untouched.
    for r in 0..ROOMS {
        assert_eq!(members(r).await, PER_ROOM, "big{r}");
    }
    drop(dying);
}
