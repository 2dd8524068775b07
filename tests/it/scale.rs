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
