//! `{"type":"watch","users":[...],"devices":true}`: a `presence` frame
//! whenever a watched user's device count changes, with the same status,
//! for the watchers who asked; the others see exactly what they saw before.

use crate::common::*;
use serde_json::json;

/// Watches `users` with device counts and returns the snapshot's records.
async fn watch_devices(c: &mut Client, users: &[&str]) -> Vec<serde_json::Value> {
    c.send(json!({"type": "watch", "users": users, "devices": true}))
        .await;
    let snap = c.expect("snapshot").await;
    snap["presence"].as_array().unwrap().clone()
}

/// The next frame of `c`: a `presence` of alice with `status` and `devices`.
async fn expect_alice(c: &mut Client, status: &str, devices: u64) {
    let ev = c.expect_presence("alice", status).await;
    assert_eq!(ev["devices"], devices, "{}: {ev}", c.user);
}

#[tokio::test]
async fn a_second_tab_is_news_only_to_watchers_who_asked_for_devices() {
    let redis = Redis::start();
    let a = Node::start(&redis, "a");
    let b = Node::start(&redis, "b");
    // alice's tabs are on node a; the watchers on node b, one with device
    // counts and one without, and one more without on node a.
    let mut counts = Client::connect(&b, "dana", "d").await;
    let mut plain = Client::connect(&b, "pat", "p").await;
    let mut plain_a = Client::connect(&a, "quinn", "q").await;
    let snap = watch_devices(&mut counts, &["alice"]).await;
    assert_eq!(snap[0]["status"], "offline");
    plain.watch(&["alice"]).await;
    plain_a.watch(&["alice"]).await;

    let mut tab1 = Client::connect(&a, "alice", "tab1").await;
    for c in [&mut counts, &mut plain, &mut plain_a] {
        expect_alice(c, "online", 1).await;
    }
    let tab2 = Client::connect(&a, "alice", "tab2").await;
    expect_alice(&mut counts, "online", 2).await;
    tab2.close().await;
    expect_alice(&mut counts, "online", 1).await;

    // Then a status change: for the watchers without device counts it is
    // the next frame, so they were told nothing about the second tab.
    tab1.send(json!({"type": "status", "status": "away"})).await;
    for c in [&mut counts, &mut plain, &mut plain_a] {
        expect_alice(c, "away", 1).await;
    }
    tab1.close().await;
    for c in [&mut counts, &mut plain, &mut plain_a] {
        expect_alice(c, "offline", 0).await;
    }
}

#[tokio::test]
async fn asking_for_devices_on_a_watched_user_reads_it_again() {
    let redis = Redis::start();
    let a = Node::start(&redis, "a");
    let b = Node::start(&redis, "b");
    let mut w = Client::connect(&b, "dana", "d").await;
    w.watch(&["alice"]).await;
    let _tab1 = Client::connect(&a, "alice", "tab1").await;
    expect_alice(&mut w, "online", 1).await;
    let _tab2 = Client::connect(&a, "alice", "tab2").await;
    wait_until("two devices counted", DEADLINE, || async {
        count(&redis, "alice").await == 2
    })
    .await;
    // The client's record still says one device: asking for counts now
    // brings the current one, and the changes that follow.
    let snap = watch_devices(&mut w, &["alice"]).await;
    assert_eq!(
        (snap.len(), &snap[0]["devices"]),
        (1, &json!(2)),
        "{snap:?}"
    );
    let tab3 = Client::connect(&a, "alice", "tab3").await;
    expect_alice(&mut w, "online", 3).await;
    tab3.close().await;
    expect_alice(&mut w, "online", 2).await;
}

#[tokio::test]
async fn asking_for_devices_while_the_first_watch_is_answered_still_counts() {
    let redis = Redis::start();
    let a = Node::start(&redis, "a");
    let b = Node::start(&redis, "b");
    let _tab1 = Client::connect(&a, "alice", "tab1").await;
    let mut w = Client::connect(&b, "dana", "d").await;
    // The second frame comes while the first one is still being answered
    // (hundreds of users to subscribe to and read take a while).
    let mut many: Vec<String> = (0..500).map(|i| format!("u{i}")).collect();
    many.push("alice".into());
    w.send(json!({"type": "watch", "users": many})).await;
    w.send(json!({"type": "watch", "users": ["alice"], "devices": true}))
        .await;
    for _ in 0..2 {
        let snap = w.expect("snapshot").await;
        for r in snap["presence"].as_array().unwrap() {
            if r["user"] == "alice" {
                assert_eq!(r["devices"], 1, "{r}");
            }
        }
    }
    let _tab2 = Client::connect(&a, "alice", "tab2").await;
    expect_alice(&mut w, "online", 2).await;
}

#[tokio::test]
async fn device_counts_of_a_user_hidden_from_the_watcher_stay_hidden() {
    let redis = Redis::start();
    let a = Node::start(&redis, "a");
    let b = Node::start(&redis, "b");
    let mut w = Client::connect(&b, "dana", "d").await;
    watch_devices(&mut w, &["alice"]).await;
    let mut tab1 = Client::connect(&a, "alice", "tab1").await;
    expect_alice(&mut w, "online", 1).await;
    tab1.send(json!({"type": "privacy", "online": "nobody"}))
        .await;
    expect_alice(&mut w, "offline", 0).await;
    let tab2 = Client::connect(&a, "alice", "tab2").await;
    tab2.close().await;
    // Shown again: the next frame is that, with the count as it is now,
    // and the counts flow again.
    tab1.send(json!({"type": "privacy", "online": "everyone"}))
        .await;
    expect_alice(&mut w, "online", 1).await;
    let _tab3 = Client::connect(&a, "alice", "tab3").await;
    expect_alice(&mut w, "online", 2).await;
}
