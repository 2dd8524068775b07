//! Smoke run of every `presence-bench` scenario, tiny, against this build's
//! server binary: the load generator keeps working. Timings are printed by
//! the bench, never asserted; each scenario fails only when something is
//! lost (a device not connected, an event not delivered).

use std::time::Duration;

/// A tiny run of one scenario; panics with the bench's error.
async fn bench(args: &[&str]) {
    let bin = env!("CARGO_BIN_EXE_presence-server");
    let mut argv = vec!["presence-bench", "--server-bin", bin, "--sources", "4"];
    argv.extend_from_slice(args);
    // Bounded: a hung scenario fails the test instead of stalling CI.
    tokio::time::timeout(Duration::from_secs(120), presence_bench::run(argv))
        .await
        .unwrap_or_else(|_| panic!("{args:?} did not finish within 120 s"))
        .unwrap_or_else(|e| panic!("{args:?}: {e:#}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections() {
    bench(&[
        "connections",
        "--devices",
        "200",
        "--hold-secs",
        "1",
        "--chatter-ms",
        "100",
    ])
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refresh() {
    bench(&["refresh", "--devices", "100", "--secs", "1"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transitions() {
    bench(&[
        "transitions",
        "--rate",
        "200",
        "--secs",
        "1",
        "--hold-ms",
        "200",
    ])
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry() {
    bench(&[
        "expiry",
        "--live",
        "2000",
        "--devices",
        "200",
        "--heartbeat-ms",
        "500",
    ])
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fanout() {
    bench(&["fanout", "--watchers", "200", "--transitions", "4"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cursors() {
    bench(&["cursors", "--devices", "6", "--hz", "30", "--secs", "1"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn online() {
    bench(&["online", "--online", "500", "--requests", "20"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn churn() {
    bench(&[
        "churn",
        "--churners",
        "2",
        "--swaps-per-sec",
        "100",
        "--settle-secs",
        "1",
        "--secs",
        "1",
    ])
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches() {
    bench(&[
        "watches",
        "--sessions",
        "20",
        "--watches",
        "50",
        "--give-back-secs",
        "1",
    ])
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rooms() {
    bench(&[
        "rooms",
        "--members",
        "20",
        "--rounds",
        "3",
        "--residents",
        "10",
        "--churn-rate",
        "50",
        "--churn-secs",
        "1",
        "--memberships",
        "200",
        "--memory-rooms",
        "10",
        "--state-bytes",
        "1024",
    ])
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn feed() {
    bench(&["feed", "--users", "200", "--wave", "100"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn feed_deliver() {
    bench(&["feed-deliver", "--users", "100", "--wave", "50"]).await;
}

/// Every phase of `rooms-attack` tiny: rooms of a few devices, one burst,
/// a second of queries, two seconds of crossing a list limit lowered to 10
/// users (so that 10 residents and 2 churners cross it both ways).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rooms_attack() {
    bench(&[
        "rooms-attack",
        "--page-devices",
        "20",
        "--bursts",
        "1",
        "--burst-size",
        "20",
        "--burst-secs",
        "1",
        "--hidden-members",
        "10",
        "--flood-secs",
        "1",
        "--announce-max",
        "10",
        "--residents",
        "10",
        "--resident-devices",
        "2",
        "--churners",
        "2",
        "--crossing-secs",
        "2",
    ])
    .await;
}

/// A tiny fleet: `backend` flags, then 30 users and 20 dying devices.
async fn fleet(backend: &[&str]) {
    let mut args = vec!["fleet"];
    args.extend_from_slice(backend);
    args.extend_from_slice(&[
        "--users",
        "30",
        "--rate",
        "100",
        "--hold-ms",
        "200",
        "--dying",
        "20",
        "--heartbeat-ms",
        "500",
    ]);
    bench(&args).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleet_on_a_cluster() {
    fleet(&[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleet_on_one_redis() {
    fleet(&["--primaries", "0", "--nodes", "2"]).await;
}

/// The storm tiny: 2 nodes on one Redis, 200 devices in two workers (tasks
/// of this process: the test binary cannot run itself as the bench), one
/// node killed; a 3 s TTL keeps the wait for late offline events short.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storm() {
    bench(&[
        "storm",
        "--nodes",
        "2",
        "--primaries",
        "0",
        "--devices",
        "200",
        "--per-worker",
        "100",
        "--in-process",
        "--hold-secs",
        "1",
        "--heartbeat-ms",
        "1000",
    ])
    .await;
}

#[test]
fn the_bench_places_users_in_the_servers_buckets() {
    let buckets = presence_server::keys::Buckets::default();
    assert_eq!(
        buckets.count(),
        presence_bench::fixture::BUCKETS,
        "the bench assumes the default number of buckets"
    );
    for i in 0..2_000 {
        let user = format!("user-{i}|x");
        assert_eq!(
            presence_bench::fixture::bucket_of(&user, buckets.count()),
            buckets.of(&user),
            "{user}"
        );
    }
}
