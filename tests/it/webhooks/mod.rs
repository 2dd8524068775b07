//! Webhooks against real nodes, Redis and a receiver HTTP server inside the
//! test: signatures, batching, retries after 500s, the bounded queue, and
//! each transition sent once by the fleet (clean closes, an expired lease of
//! a SIGKILLed node heard by two live nodes).

mod fairness;
pub(crate) mod receiver;

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use crate::common::*;
use receiver::{node_with_hooks, verify, Receiver, SECRET};
use serde_json::{json, Value};

/// Every batch is signed (and a wrong secret or a changed body fails the
/// check); a batch fills to `--webhook-batch-size` at once, and a lone event
/// goes after `--webhook-batch-ms`; online, status and offline each come
/// with the user's true state and an id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_are_signed_and_carry_each_transition() {
    let redis = Redis::start();
    let receiver = Receiver::start(0).await;
    let node = node_with_hooks(
        &redis,
        "n1",
        &receiver,
        &["--webhook-batch-size", "3", "--webhook-batch-ms", "1000"],
    );
    let mut alice = Client::connect(&node, "alice", "phone").await;
    let _bob = Client::connect(&node, "bob", "phone").await;
    let _carol = Client::connect(&node, "carol", "phone").await;
    wait_until("the first batch", DEADLINE, || async {
        !receiver.deliveries().is_empty()
    })
    .await;
    let first = receiver.deliveries().remove(0);
    let body = first.json();
    assert_eq!(body["node"], "n1");
    let users: Vec<&str> = body["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["user"].as_str().unwrap())
        .collect();
    assert_eq!(
        users,
        ["alice", "bob", "carol"],
        "one batch of three: {body}"
    );
    for e in body["events"].as_array().unwrap() {
        assert_eq!(e["type"], "online", "{e}");
        assert_eq!(e["status"], "online");
        assert_eq!(e["devices"], 1);
        assert_eq!(
            e["id"],
            format!("{}:{}", e["user"].as_str().unwrap(), e["seq"])
        );
    }

    // A status change: alone, so it waits for the interval. Invisible is
    // the truth a backend gets, never hidden.
    alice
        .send(json!({"type":"status","status":"invisible","text":"deep work"}))
        .await;
    let status = receiver.wait_for("alice", "status").await;
    assert_eq!(status["status"], "invisible", "{status}");
    assert_eq!(status["text"], "deep work");
    assert_eq!(status["devices"], 1);
    alice.close().await;
    let offline = receiver.wait_for("alice", "offline").await;
    assert_eq!(offline["devices"], 0, "{offline}");
    assert_eq!(offline["status"], "offline");

    let deliveries = receiver.deliveries();
    assert_eq!(deliveries.len(), 3, "{deliveries:?}");
    for d in &deliveries {
        assert!(
            verify(SECRET, &d.signature, &d.body),
            "bad signature {} on {}",
            d.signature,
            String::from_utf8_lossy(&d.body)
        );
        assert!(!verify(
            "whsec_some_other_secret_000",
            &d.signature,
            &d.body
        ));
        let mut changed = d.body.clone();
        changed.push(b' ');
        assert!(!verify(SECRET, &d.signature, &changed));
    }
    let ids: Vec<Value> = receiver.events().iter().map(|e| e["id"].clone()).collect();
    let distinct: std::collections::HashSet<String> = ids.iter().map(|i| i.to_string()).collect();
    assert_eq!(distinct.len(), 5, "{ids:?}");
}

/// A receiver that answers 500 gets the same events again, with backoff,
/// until it takes them; the failures are counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_receiver_gets_the_batch_again() {
    let redis = Redis::start();
    let receiver = Receiver::start(2).await;
    let node = node_with_hooks(&redis, "n1", &receiver, &["--webhook-batch-ms", "50"]);
    let _alice = Client::connect(&node, "alice", "phone").await;
    let online = receiver.wait_for("alice", "online").await;
    let deliveries = receiver.deliveries();
    assert_eq!(
        deliveries.iter().map(|d| d.answered).collect::<Vec<_>>(),
        [500, 500, 200]
    );
    for d in &deliveries {
        assert_eq!(d.json()["events"][0]["id"], online["id"], "the same event");
        assert!(verify(SECRET, &d.signature, &d.body));
    }
    assert_eq!(metric(&node, "presence_webhook_failures_total").await, 2.0);
    assert_eq!(metric(&node, "presence_webhook_delivered_total").await, 1.0);
    assert_eq!(metric(&node, "presence_webhook_queued").await, 0.0);
}

/// A full queue drops its oldest events and counts them; the newest are
/// delivered once the receiver is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_drops_the_oldest_and_counts_them() {
    let redis = Redis::start();
    // Down for a long while: every attempt fails until it is told otherwise.
    let receiver = Receiver::start(usize::MAX).await;
    let node = node_with_hooks(
        &redis,
        "n1",
        &receiver,
        &["--webhook-queue-limit", "2", "--webhook-batch-ms", "0"],
    );
    let mut clients = Vec::new();
    for user in ["u1", "u2", "u3", "u4", "u5"] {
        clients.push(Client::connect(&node, user, "phone").await);
    }
    wait_until("three dropped", DEADLINE, || async {
        metric(&node, "presence_webhook_dropped_total").await == 3.0
    })
    .await;
    receiver.fail.store(0, Ordering::SeqCst);
    receiver.wait_for("u5", "online").await;
    wait_until("the queue empty", DEADLINE, || async {
        metric(&node, "presence_webhook_queued").await == 0.0
    })
    .await;
    let users: Vec<String> = receiver
        .events()
        .iter()
        .map(|e| e["user"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(users, ["u4", "u5"], "the two newest, once each");
    assert_eq!(metric(&node, "presence_webhook_dropped_total").await, 3.0);
}

/// Three nodes send to one receiver: each transition arrives once, from
/// the node that made it. Devices of one user on two nodes give one online
/// and one offline; a status change one event; a SIGKILLed node's lapsed
/// lease, which both surviving nodes hear about (expired event, deadline
/// pass), one offline from one of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_transition_is_sent_once_by_the_fleet() {
    let redis = Redis::start();
    let receiver = Receiver::start(0).await;
    let fast = ["--webhook-batch-ms", "20"];
    let mut a = node_with_hooks(&redis, "a", &receiver, &fast);
    let b = node_with_hooks(&redis, "b", &receiver, &fast);
    let c = node_with_hooks(&redis, "c", &receiver, &fast);

    // alice on two nodes at once.
    let phone = Client::connect(&a, "alice", "phone").await;
    let mut laptop = Client::connect(&b, "alice", "laptop").await;
    receiver.wait_for("alice", "online").await;
    laptop.send(json!({"type":"status","status":"busy"})).await;
    let status = receiver.wait_for("alice", "status").await;
    assert_eq!(status["_node"], "b");
    // bob comes and goes on c.
    let bob = Client::connect(&c, "bob", "phone").await;
    receiver.wait_for("bob", "online").await;
    bob.close().await;
    receiver.wait_for("bob", "offline").await;
    // carol on a, which dies with alice's phone.
    let _carol = Client::connect(&a, "carol", "phone").await;
    let online = receiver.wait_for("carol", "online").await;
    assert_eq!(online["_node"], "a");
    a.kill();
    drop(phone);
    let offline = receiver.wait_for("carol", "offline").await;
    assert!(
        offline["_node"] == "b" || offline["_node"] == "c",
        "a live node announces the lapse: {offline}"
    );
    wait_until("alice's phone lapsed", DEADLINE, || async {
        count(&redis, "alice").await == 1
    })
    .await;
    laptop.close().await;
    let offline = receiver.wait_for("alice", "offline").await;
    assert_eq!(offline["_node"], "b");

    // Whatever b and c still had queued went before these, and the
    // reconciliation and deadline passes had a lease TTL to repeat anything.
    tokio::time::sleep(TTL).await;
    let _z1 = Client::connect(&b, "zed1", "x").await;
    let _z2 = Client::connect(&c, "zed2", "x").await;
    receiver.wait_for("zed1", "online").await;
    receiver.wait_for("zed2", "online").await;

    let mut seen: HashMap<(String, String), usize> = HashMap::new();
    let mut ids: HashMap<String, usize> = HashMap::new();
    for e in receiver.events() {
        *seen
            .entry((
                e["user"].as_str().unwrap().to_string(),
                e["type"].as_str().unwrap().to_string(),
            ))
            .or_default() += 1;
        *ids.entry(e["id"].as_str().unwrap().to_string())
            .or_default() += 1;
    }
    let expected: HashMap<(String, String), usize> = [
        ("alice", "online"),
        ("alice", "status"),
        ("alice", "offline"),
        ("bob", "online"),
        ("bob", "offline"),
        ("carol", "online"),
        ("carol", "offline"),
        ("zed1", "online"),
        ("zed2", "online"),
    ]
    .into_iter()
    .map(|(u, t)| ((u.to_string(), t.to_string()), 1))
    .collect();
    assert_eq!(seen, expected, "events: {:#?}", receiver.events());
    assert!(ids.values().all(|&n| n == 1), "{ids:?}");
    for d in receiver.deliveries() {
        assert!(verify(SECRET, &d.signature, &d.body));
    }
}

/// Bad webhook settings stop the node with a clear message.
#[test]
fn bad_webhook_settings_are_refused() {
    let redis = Redis::start();
    for (args, needle) in [
        (
            vec!["--webhook-url", "http://127.0.0.1:9/h"],
            "--webhook-secret",
        ),
        (
            vec![
                "--webhook-url",
                "http://127.0.0.1:9/h",
                "--webhook-secret",
                "short",
            ],
            "at least 16 bytes",
        ),
        (
            vec!["--webhook-url", "ftp://x/", "--webhook-secret", SECRET],
            "http:// or https://",
        ),
    ] {
        let mut all = vec![
            "--listen".to_string(),
            "127.0.0.1:0".into(),
            "--redis-url".into(),
            redis.url.clone(),
        ];
        all.extend(args.iter().map(|s| s.to_string()));
        let logs = match Node::spawn("bad", &all, &[]) {
            Ok(_) => panic!("started with {args:?}"),
            Err(logs) => logs,
        };
        assert!(logs.contains(needle), "{args:?}: {logs}");
    }
}

/// The settings can come from the config file; a node stopped with SIGTERM
/// first delivers what it has queued (here to a receiver that fails three
/// times before it takes the batch).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_node_delivers_its_queue_first() {
    let redis = Redis::start();
    let receiver = Receiver::start(3).await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("presence.toml");
    std::fs::write(
        &config,
        format!(
            "webhook-url = [{:?}]\nwebhook-secret = {SECRET:?}\nwebhook-batch-ms = 0\nevent-retention-secs = 0\n",
            receiver.url
        ),
    )
    .unwrap();
    let mut node = Node::start_with(&redis, "n1", &["--config", config.to_str().unwrap()]);
    let _alice = Client::connect(&node, "alice", "phone").await;
    wait_until("a first, failed, attempt", DEADLINE, || async {
        !receiver.deliveries().is_empty()
    })
    .await;
    assert!(receiver.events().is_empty());
    let status = node
        .signal_and_wait(libc::SIGTERM, DEADLINE)
        .await
        .unwrap_or_else(|| panic!("no exit after SIGTERM:\n{}", node.logs()));
    assert!(status.success(), "{status:?}\n{}", node.logs());
    let online = receiver.of("alice", "online");
    assert_eq!(
        online.len(),
        1,
        "{:?}\n{}",
        receiver.deliveries(),
        node.logs()
    );
    let answered: Vec<u16> = receiver.deliveries().iter().map(|d| d.answered).collect();
    assert_eq!(answered, [500, 500, 500, 200]);
}

/// Rooms' webhooks, once per fleet with three nodes, one SIGKILLed:
/// `room_occupied` and `room_joined` when the first user joins, `room_joined`
/// for each further user (not for a second device), `room_left` when a
/// user's last device leaves, whatever the way, and `room_vacated` with the
/// last one; an invisible user's comings and goings are not announced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn room_events_are_sent_once_by_the_fleet() {
    let redis = Redis::start();
    let receiver = Receiver::start(0).await;
    let fast = ["--webhook-batch-ms", "20"];
    let mut a = node_with_hooks(&redis, "a", &receiver, &fast);
    let b = node_with_hooks(&redis, "b", &receiver, &fast);
    let c = node_with_hooks(&redis, "c", &receiver, &fast);
    let join = |room: &'static str| json!({"type": "join", "room": room});

    let mut alice = Client::connect(&b, "alice", "web").await;
    alice.send(join("r")).await;
    alice.expect("room").await;
    let mut alice2 = Client::connect(&c, "alice", "phone").await;
    alice2.send(join("r")).await;
    alice2.expect("room").await;
    let mut bob = Client::connect(&a, "bob", "laptop").await;
    bob.send(join("r")).await;
    bob.expect("room").await;
    let mut carol = Client::connect(&c, "carol", "tab").await;
    carol
        .send(json!({"type": "status", "status": "invisible"}))
        .await;
    carol.expect("presence").await;
    carol.send(join("r")).await;
    carol.expect("room").await;
    receiver.wait_for("bob", "room_joined").await;

    // bob's node dies: his membership lapses, announced by a live node.
    a.kill();
    let left = receiver.wait_for("bob", "room_left").await;
    assert!(left["_node"] == "b" || left["_node"] == "c", "{left}");
    alice2.close().await;
    alice.close().await;
    carol.close().await;
    let vacated = |e: &Value| e["type"] == "room_vacated";
    wait_until("room r vacated", DEADLINE, || async {
        receiver.events().iter().any(vacated)
    })
    .await;
    // Late duplicates would have had time to arrive with the vacancy.
    let events: Vec<Value> = receiver
        .events()
        .into_iter()
        .filter(|e| e["room"] == "r")
        .collect();
    let kinds: Vec<(String, String)> = events
        .iter()
        .map(|e| {
            (
                e["type"].as_str().unwrap().to_string(),
                e["user"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    let expected = [
        ("room_occupied", ""),
        ("room_joined", "alice"),
        ("room_joined", "bob"),
        ("room_left", "bob"),
        ("room_left", "alice"),
        ("room_vacated", ""),
    ];
    let mut sorted = kinds.clone();
    sorted.sort();
    let mut want: Vec<(String, String)> = expected
        .iter()
        .map(|(k, u)| (k.to_string(), u.to_string()))
        .collect();
    want.sort();
    assert_eq!(sorted, want, "{events:?}");
    let ids: std::collections::HashSet<&str> =
        events.iter().map(|e| e["id"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), events.len(), "every event has its own id");
    assert_eq!(events.iter().find(|e| vacated(e)).unwrap()["users"], 0);

    // Occupied again: new ids, a later seq.
    let mut dave = Client::connect(&b, "dave", "web").await;
    dave.send(join("r")).await;
    dave.expect("room").await;
    let occupied = |e: &Value| e["type"] == "room_occupied";
    wait_until("room r occupied again", DEADLINE, || async {
        receiver.events().iter().filter(|e| occupied(e)).count() == 2
    })
    .await;
    let again: Vec<Value> = receiver.events().into_iter().filter(occupied).collect();
    assert_ne!(again[0]["id"], again[1]["id"], "{again:?}");
    assert!(
        again[1]["seq"].as_u64() > again[0]["seq"].as_u64(),
        "{again:?}"
    );
}

/// Issue 30, item 5: one user flooding status changes cannot push other
/// users' transitions out of a full queue. Its queued status events are
/// coalesced (the latest is the one delivered), and a full queue drops
/// status events before any online or offline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_flood_does_not_push_others_transitions_out() {
    let redis = Redis::start();
    // Down until the flood is queued.
    let receiver = Receiver::start(usize::MAX).await;
    let node = node_with_hooks(
        &redis,
        "n1",
        &receiver,
        &[
            "--webhook-queue-limit",
            "12",
            "--webhook-batch-ms",
            "0",
            "--max-frames-per-sec",
            "1000",
        ],
    );
    let mut flooder = Client::connect(&node, "flooder", "phone").await;
    let mut last = String::new();
    for user in ["u1", "u2", "u3", "u4"] {
        let other = Client::connect(&node, user, "phone").await;
        flood(&mut flooder, &format!("{user}-on")).await;
        other.close().await;
        wait_until(&format!("{user} offline"), DEADLINE, || async {
            count(&redis, user).await == 0
        })
        .await;
        last = flood(&mut flooder, &format!("{user}-off")).await;
    }
    receiver.fail.store(0, Ordering::SeqCst);
    wait_until("the flooder's last status", DEADLINE, || async {
        receiver
            .of("flooder", "status")
            .last()
            .is_some_and(|e| e["text"] == last.as_str())
    })
    .await;
    wait_until("the queue empty", DEADLINE, || async {
        metric(&node, "presence_webhook_queued").await == 0.0
    })
    .await;
    for user in ["u1", "u2", "u3", "u4"] {
        for kind in ["online", "offline"] {
            assert_eq!(receiver.of(user, kind).len(), 1, "{kind} of {user}");
        }
    }
    let statuses = receiver.of("flooder", "status");
    assert_eq!(statuses.last().unwrap()["text"], last.as_str());
    assert!(metric(&node, "presence_webhook_dropped_total").await > 0.0);
}

/// 15 status changes of `c`, each with its own text; returns the last
/// text, once the node answered it.
async fn flood(c: &mut Client, tag: &str) -> String {
    let last = format!("{tag}-14");
    for n in 0..15 {
        c.send(json!({"type": "status", "status": "busy", "text": format!("{tag}-{n}")}))
            .await;
    }
    while c.expect("presence").await["text"] != last.as_str() {}
    last
}

/// Issue 28: an HTTP heartbeat device's transitions carry its kind, a
/// status set over HTTP carries its `until`, and when the node that set it
/// is SIGKILLed the reset at `until` is sent once by the fleet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_devices_kinds_and_a_status_end_are_sent_once() {
    let redis = Redis::start();
    let receiver = Receiver::start(0).await;
    let fast = ["--webhook-batch-ms", "20"];
    let mut a = node_with_hooks(&redis, "a", &receiver, &fast);
    let b = node_with_hooks(&redis, "b", &receiver, &fast);
    let _c = node_with_hooks(&redis, "c", &receiver, &fast);
    let url = format!(
        "{}/api/users/alice/devices/hb/heartbeat?kind=mobile",
        b.http()
    );
    let beating = tokio::spawn(async move {
        loop {
            assert_eq!(post(&url, &json!({})).await.0, 200);
            tokio::time::sleep(std::time::Duration::from_millis(HEARTBEAT_MS / 2)).await;
        }
    });
    let online = receiver.wait_for("alice", "online").await;
    assert_eq!(online["kinds"], json!(["mobile"]), "{online}");
    let until = presence_server::store::now_ms() + 1_500;
    let r = reqwest::Client::new()
        .put(format!("{}/api/users/alice/status", a.http()))
        .json(&json!({"status": "busy", "text": "call", "until": until}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let status = receiver.wait_for("alice", "status").await;
    assert_eq!(
        (status["_node"].as_str(), status["until"].as_i64()),
        (Some("a"), Some(until))
    );
    a.kill();
    wait_until("the reset's webhook", DEADLINE, || async {
        receiver.of("alice", "status").len() >= 2
    })
    .await;
    // A lease TTL more for any second announcement to show.
    tokio::time::sleep(TTL).await;
    let statuses = receiver.of("alice", "status");
    assert_eq!(statuses.len(), 2, "{statuses:?}");
    let reset = &statuses[1];
    assert_eq!(
        (
            reset["status"].as_str(),
            reset["text"].clone(),
            reset["until"].clone()
        ),
        (Some("online"), Value::Null, Value::Null)
    );
    assert_ne!(reset["_node"], "a", "{reset}");
    assert!(reset["at"].as_i64().unwrap() >= until, "{reset}");
    beating.abort();
}
