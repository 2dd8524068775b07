//! The event feed (issue 39): every transition recorded by the step that
//! made it and read back by `GET /api/events` (service key), oldest first,
//! from a cursor; the same events the webhooks send; a feed a node left
//! behind (it died after its step) moved by another; what goes beyond the
//! bounds counted as lost. Real Redis, real nodes, real clients.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{json, Value};

use crate::common::cluster::Cluster;
use crate::common::*;
use crate::rooms::join;
use crate::webhooks::receiver::{node_with_hooks, Receiver};

/// Flags of a node whose webhooks come from the feed (on, whatever
/// `node_with_hooks` defaults to), sent every 50 ms, with the admin key.
const HOOKED: [&str; 6] = [
    "--admin-key",
    ADMIN,
    "--webhook-batch-ms",
    "50",
    "--event-retention-secs",
    "86400",
];

/// `GET /api/events` on `node` with the admin key; the page.
pub(crate) async fn page(node: &Node, query: &str) -> Value {
    let (status, page) = get_as(&format!("{}/api/events?{query}", node.http()), Some(ADMIN)).await;
    assert_eq!(status, 200, "{page}");
    page
}

/// Every event from `cursor` on (`""`: the oldest), a page of `limit` at a
/// time, until a page comes back empty; and the cursor after them.
pub(crate) async fn drain(node: &Node, cursor: &str, limit: usize) -> (Vec<Value>, String) {
    let mut cursor = cursor.to_string();
    let mut out = Vec::new();
    loop {
        let p = page(node, &format!("limit={limit}&cursor={cursor}")).await;
        cursor = p["next_cursor"].as_str().unwrap().to_string();
        let events = p["events"].as_array().unwrap().clone();
        if events.is_empty() {
            return (out, cursor);
        }
        out.extend(events);
    }
}

/// The `type`s of `user`'s (or the room's) events, in order.
fn kinds_of(events: &[Value], field: &str, who: &str) -> Vec<String> {
    events
        .iter()
        .filter(|e| e[field] == who)
        .map(|e| e["type"].as_str().unwrap().to_string())
        .collect()
}

/// Waits until the feed read from the start holds `n` events.
async fn wait_for_events(node: &Node, n: usize) -> Vec<Value> {
    wait_until(&format!("{n} events in the feed"), DEADLINE, || async {
        drain(node, "", 100).await.0.len() >= n
    })
    .await;
    drain(node, "", 100).await.0
}

/// A user's and a room's transitions are in the feed in their order, with
/// the webhook payloads; paging one at a time walks the same events; a
/// cursor from `now` sees only what came after; a bad cursor is `400` and
/// no key `401`.
#[tokio::test]
async fn every_transition_is_in_the_feed_in_order() {
    let redis = Redis::start();
    let node = Node::start_with(&redis, "n1", &["--admin-key", ADMIN]);
    let mut alice = Client::connect(&node, "alice", "web").await;
    join(&mut alice, "doc:1", json!({})).await;
    // A text that JSON must escape: the record is built by hand in Lua.
    let text = "deep \"work\" \\ a/b ünï 😀";
    alice
        .send(json!({"type": "status", "status": "busy", "text": text}))
        .await;
    alice.expect("presence").await;
    alice.close().await;
    let events = wait_for_events(&node, 7).await;
    let own: Vec<Value> = events
        .iter()
        .filter(|e| e.get("room").is_none())
        .cloned()
        .collect();
    assert_eq!(
        kinds_of(&own, "user", "alice"),
        ["online", "status", "offline"],
        "{events:#?}"
    );
    assert_eq!(
        kinds_of(&events, "room", "doc:1"),
        ["room_joined", "room_occupied", "room_left", "room_vacated"]
    );
    let status = events.iter().find(|e| e["type"] == "status").unwrap();
    assert_eq!(
        (
            status["status"].clone(),
            status["text"].clone(),
            status["devices"].clone()
        ),
        (json!("busy"), json!(text), json!(1)),
        "{status}"
    );
    assert_eq!(status["id"], format!("alice:{}", status["seq"]));
    // Per user, in seq order; ids unique.
    let seqs: Vec<u64> = events
        .iter()
        .filter(|e| e["user"] == "alice" && e.get("room").is_none())
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    let ids: BTreeSet<&str> = events.iter().map(|e| e["id"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), events.len());

    // One at a time: the same events.
    let (one_by_one, end) = drain(&node, "", 1).await;
    assert_eq!(one_by_one, events);
    // From the end, or from now: only what comes after.
    let now = page(&node, "cursor=now").await;
    assert_eq!(now["events"], json!([]));
    let _bob = Client::connect(&node, "bob", "web").await;
    wait_until("bob online in the feed", DEADLINE, || async {
        !drain(&node, now["next_cursor"].as_str().unwrap(), 10)
            .await
            .0
            .is_empty()
    })
    .await;
    for cursor in [now["next_cursor"].as_str().unwrap(), end.as_str()] {
        let (after, _) = drain(&node, cursor, 10).await;
        assert_eq!(kinds_of(&after, "user", "bob"), ["online"], "{after:?}");
        assert_eq!(after.len(), 1, "{after:?}");
    }

    let (status, e) = get_as(
        &format!("{}/api/events?cursor=junk", node.http()),
        Some(ADMIN),
    )
    .await;
    assert_eq!(
        (status, e["code"].clone()),
        (400, json!("bad_request")),
        "{e}"
    );
    let (status, _) = get(&format!("{}/api/events", node.http())).await;
    assert_eq!(status, 401);
    let (status, _) = get_as(
        &format!("{}/api/events?limit=1001", node.http()),
        Some(ADMIN),
    )
    .await;
    assert_eq!(status, 400);
}

/// The feed holds exactly what the webhooks send: the same ids and the same
/// payloads, but for `at`, which the webhook takes when it queues the event.
#[tokio::test]
async fn the_feed_says_what_the_webhooks_say() {
    let redis = Redis::start();
    let receiver = Receiver::start(0).await;
    let node = node_with_hooks(&redis, "n1", &receiver, &HOOKED);
    for (user, room) in [("alice", "r:1"), ("bob", "r:1"), ("carol", "r:2")] {
        let mut c = Client::connect(&node, user, "web").await;
        join(&mut c, room, json!({})).await;
        c.send(json!({"type": "status", "status": "away"})).await;
        c.expect("presence").await;
        c.close().await;
    }
    // 3 users x (online, status, offline, joined, left) and each room's
    // occupied and vacated.
    let events = wait_for_events(&node, 19).await;
    wait_until("19 webhook events", DEADLINE, || async {
        receiver.events().len() >= 19
    })
    .await;
    let without_at = |mut e: Value| {
        e.as_object_mut().unwrap().remove("at");
        e.as_object_mut().unwrap().remove("_node");
        e
    };
    let mut hooked: Vec<Value> = receiver.events().into_iter().map(without_at).collect();
    let mut fed: Vec<Value> = events.into_iter().map(without_at).collect();
    let key = |e: &Value| e["id"].as_str().unwrap().to_string();
    hooked.sort_by_key(key);
    fed.sort_by_key(key);
    assert_eq!(fed, hooked);
}

/// On one Redis (no cluster) a step writes its event into the bucket's log
/// itself: nothing waits in a feed list or the due index for a node to
/// move it, users' and rooms' alike.
#[tokio::test]
async fn on_one_redis_the_step_writes_the_log_itself() {
    let redis = Redis::start();
    let node = Node::start_with(&redis, "n1", &["--admin-key", ADMIN]);
    let mut c = Client::connect(&node, "gus", "web").await;
    join(&mut c, "porch", json!({})).await;
    c.close().await;
    let events = wait_for_events(&node, 6).await;
    assert_eq!(
        kinds_of(&events, "user", "gus"),
        ["online", "room_joined", "room_left", "offline"]
    );
    let mut conn = redis.conn();
    let left: Vec<String> = redis::cmd("KEYS")
        .arg("presence-feed:*")
        .query(&mut conn)
        .unwrap();
    assert!(left.is_empty(), "feed lists: {left:?}");
    let due: Vec<String> = redis::cmd("KEYS")
        .arg("presence-feed-due:*")
        .query(&mut conn)
        .unwrap();
    assert!(due.is_empty(), "due index: {due:?}");
}

/// A node that dies right after a step that recorded an event, before it
/// moved it (here: a store with the feed on and no mover, in this process),
/// leaves it to the others: a live node's feed pass moves it.
#[tokio::test]
async fn a_feed_a_dead_node_left_is_moved_by_another() {
    use presence_server::store::feed::FeedSettings;
    use presence_server::store::Store;
    let redis = Redis::start();
    let node = Node::start_with(&redis, "n1", &["--admin-key", ADMIN]);
    let client = redis::Client::open(redis.url.as_str()).unwrap();
    let dead = Store::new(
        client.get_connection_manager().await.unwrap(),
        Duration::from_secs(45),
    )
    .with_feed(
        FeedSettings {
            retention: Duration::from_secs(3600),
            max_per_owner: 10_000,
        },
        None,
    );
    dead.load_scripts().await.unwrap();
    let dead = dead.load_deployment().await.unwrap();
    // Online on the live node: her status change is a transition.
    let _dora = Client::connect(&node, "dora", "web").await;
    wait_for_events(&node, 1).await;
    dead.set_status("dora", presence_server::model::Status::Busy, None, None)
        .await
        .unwrap();
    let mut c = redis.conn();
    let held: Vec<String> = redis::cmd("LRANGE")
        .arg("presence-feed:{dora}")
        .arg(0)
        .arg(-1)
        .query(&mut c)
        .unwrap();
    assert_eq!(
        held.len(),
        1,
        "recorded in dora's feed by the step: {held:?}"
    );
    let events = wait_for_events(&node, 2).await;
    assert_eq!(kinds_of(&events, "user", "dora"), ["online", "status"]);
    wait_until("dora's feed emptied", DEADLINE, || async {
        let n: usize = redis::cmd("LLEN")
            .arg("presence-feed:{dora}")
            .query(&mut redis.conn())
            .unwrap();
        n == 0
    })
    .await;
}

/// A feed holds at most 256 events no node moved (all nodes down, say):
/// beyond, the oldest go, and a reader that had a cursor before is told
/// how many it lost.
#[tokio::test]
async fn what_goes_beyond_the_bounds_is_counted_as_lost() {
    use presence_server::model::Status;
    use presence_server::store::feed::FeedSettings;
    use presence_server::store::Store;
    let redis = Redis::start();
    let node = Node::start_with(&redis, "n1", &["--admin-key", ADMIN]);
    let _erin = Client::connect(&node, "erin", "web").await;
    wait_for_events(&node, 1).await;
    let from = page(&node, "cursor=now").await["next_cursor"]
        .as_str()
        .unwrap()
        .to_string();
    let client = redis::Client::open(redis.url.as_str()).unwrap();
    let dead = Store::new(
        client.get_connection_manager().await.unwrap(),
        Duration::from_secs(45),
    )
    .with_feed(
        FeedSettings {
            retention: Duration::from_secs(3600),
            max_per_owner: 10_000,
        },
        None,
    )
    .load_deployment()
    .await
    .unwrap();
    dead.load_scripts().await.unwrap();
    // 300 status changes that no node moves at once.
    for i in 0..300 {
        let status = if i % 2 == 0 {
            Status::Busy
        } else {
            Status::Away
        };
        dead.set_status("erin", status, None, None).await.unwrap();
    }
    wait_until("the pass moved erin's feed", DEADLINE, || async {
        let p = page(&node, &format!("limit=1&cursor={from}")).await;
        !p["events"].as_array().unwrap().is_empty()
    })
    .await;
    let p = page(&node, &format!("limit=1000&cursor={from}")).await;
    assert_eq!(p["events"].as_array().unwrap().len(), 256);
    assert_eq!(p["lost"], 44, "{}", p["lost"]);
    // The newest are the ones kept.
    let last = p["events"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["status"], "away", "{last}");
}

/// On a Redis Cluster the feed works across slots: each step records in
/// its user's or room's slot, each bucket's log is in its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_feed_on_a_cluster() {
    let cluster = Cluster::start();
    let a = cluster.node_with("a", &["--admin-key", ADMIN]);
    let b = cluster.node_with("b", &["--admin-key", ADMIN]);
    for (i, user) in ["u1", "u2", "u3", "u4"].iter().enumerate() {
        let node = if i % 2 == 0 { &a } else { &b };
        let mut c = Client::connect(node, user, "web").await;
        join(&mut c, &format!("room:{i}"), json!({})).await;
        c.close().await;
    }
    // 4 x (online, joined, occupied, offline, left, vacated), read on b.
    let events = wait_for_events(&b, 24).await;
    for (i, user) in ["u1", "u2", "u3", "u4"].iter().enumerate() {
        let own: Vec<Value> = events
            .iter()
            .filter(|e| e.get("room").is_none())
            .cloned()
            .collect();
        assert_eq!(kinds_of(&own, "user", user), ["online", "offline"]);
        assert_eq!(
            kinds_of(&events, "room", &format!("room:{i}")),
            ["room_joined", "room_occupied", "room_left", "room_vacated"],
            "{events:#?}"
        );
    }
}

/// With the feed on, the webhooks come from its log, sent by whichever
/// node holds each bucket: a receiver down for a while gets every event
/// once it is back, and so it does when the node that made the transitions
/// was SIGKILLed meanwhile. What the receiver ends with, deduplicated by
/// `id`, is exactly the feed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_come_from_the_log_whichever_node_lives() {
    use std::sync::atomic::Ordering;
    let redis = Redis::start();
    let receiver = Receiver::start(usize::MAX).await;
    let flags = [
        HOOKED[0],
        HOOKED[1],
        HOOKED[2],
        HOOKED[3],
        HOOKED[4],
        HOOKED[5],
        "--ttl-ms",
        "3000",
        "--heartbeat-ms",
        "1000",
    ];
    let mut a = node_with_hooks(&redis, "a", &receiver, &flags);
    let b = node_with_hooks(&redis, "b", &receiver, &flags);
    // On a: users come, one goes, one joins a room; the receiver refuses
    // every batch meanwhile.
    let mut held = Vec::new();
    for user in ["u1", "u2", "u3", "u4"] {
        let mut c = Client::connect(&a, user, "web").await;
        join(&mut c, "hall", json!({})).await;
        held.push(c);
    }
    held.pop().unwrap().close().await;
    let _on_b = Client::connect(&b, "u5", "web").await;
    wait_until("a refused batch", DEADLINE, || async {
        receiver.deliveries().iter().any(|d| d.answered != 200)
    })
    .await;
    // a dies with its undelivered events and its devices; b is left.
    a.kill();
    drop(held);
    // Its devices lapse (offline, left), recorded by b.
    let feed_has_all = || async {
        let (events, _) = drain(&b, "", 100).await;
        let own: Vec<Value> = events
            .iter()
            .filter(|e| e.get("room").is_none())
            .cloned()
            .collect();
        ["u1", "u2", "u3", "u4"]
            .iter()
            .all(|u| kinds_of(&own, "user", u) == ["online", "offline"])
    };
    wait_until(
        "every device of a lapsed, in the feed",
        DEADLINE,
        feed_has_all,
    )
    .await;
    wait_until("the hall vacated, in the feed", DEADLINE, || async {
        let (events, _) = drain(&b, "", 100).await;
        kinds_of(&events, "room", "hall").contains(&"room_vacated".to_string())
    })
    .await;
    receiver.fail.store(0, Ordering::Relaxed);
    let ids = |events: &[Value]| -> BTreeSet<String> {
        events
            .iter()
            .map(|e| e["id"].as_str().unwrap().to_string())
            .collect()
    };
    let want = ids(&drain(&b, "", 100).await.0);
    wait_until("every event of the feed delivered", DEADLINE, || async {
        want.is_subset(&ids(&receiver.events()))
    })
    .await;
    assert_eq!(
        ids(&receiver.events()),
        ids(&drain(&b, "", 100).await.0),
        "the receiver has the feed, no more"
    );
    // Per user, in seq order.
    for user in ["u1", "u2", "u3", "u4", "u5"] {
        let seqs: Vec<u64> = receiver
            .events()
            .iter()
            .filter(|e| e["user"] == user && e.get("room").is_none())
            .map(|e| e["seq"].as_u64().unwrap())
            .collect();
        let mut sorted = seqs.clone();
        sorted.dedup();
        assert!(sorted.windows(2).all(|w| w[0] < w[1]), "{user}: {seqs:?}");
    }
}

/// One account cannot fill Redis through the feed: past
/// `--event-max-per-user` events in the retention window, its events are
/// dropped and counted as lost, and another user's are kept.
#[tokio::test]
async fn one_account_cannot_fill_the_log() {
    let redis = Redis::start();
    let node = Node::start_with(
        &redis,
        "n1",
        &["--admin-key", ADMIN, "--event-max-per-user", "5"],
    );
    let from = page(&node, "cursor=now").await["next_cursor"]
        .as_str()
        .unwrap()
        .to_string();
    let mut alice = Client::connect(&node, "alice", "web").await;
    for i in 0..20 {
        let status = if i % 2 == 0 { "busy" } else { "away" };
        alice
            .send(json!({"type": "status", "status": status}))
            .await;
        alice.expect("presence").await;
    }
    // A reader sees a gap when the next event of the same bucket comes: bob
    // is in alice's bucket.
    let buckets = presence_server::keys::Buckets::default();
    let bob = (0..)
        .map(|i| format!("bob{i}"))
        .find(|u| buckets.of(u) == buckets.of("alice"))
        .unwrap();
    let _bob = Client::connect(&node, &bob, "web").await;
    wait_until("bob online in the feed", DEADLINE, || async {
        let (events, _) = drain(&node, &from, 100).await;
        kinds_of(&events, "user", &bob) == ["online"]
    })
    .await;
    let (mut events, mut lost, mut cursor) = (Vec::new(), 0, from.clone());
    loop {
        let p = page(&node, &format!("limit=100&cursor={cursor}")).await;
        lost += p["lost"].as_u64().unwrap();
        cursor = p["next_cursor"].as_str().unwrap().to_string();
        let got = p["events"].as_array().unwrap().clone();
        if got.is_empty() {
            break;
        }
        events.extend(got);
    }
    assert_eq!(
        kinds_of(&events, "user", "alice"),
        ["online", "status", "status", "status", "status"],
        "{events:#?}"
    );
    assert_eq!(kinds_of(&events, "user", &bob), ["online"]);
    assert_eq!(lost, 16, "alice's 16 status changes past the bound");
}

/// Waits until `recorder` has recorded alice `online` in a log Redis
/// emptied (503 until the node is back on Redis); that event's id.
async fn online_again(recorder: &Node) -> String {
    let url = format!("{}/api/events?limit=100", recorder.http());
    wait_until("alice online again in the new log", DEADLINE, || async {
        let (status, page) = get_as(&url, Some(ADMIN)).await;
        status == 200 && kinds_of(page["events"].as_array().unwrap(), "user", "alice") == ["online"]
    })
    .await;
    let (events, _) = drain(recorder, "", 100).await;
    events[0]["id"].as_str().unwrap().to_string()
}

/// Redis restarting empty loses each webhook URL's place in the log with
/// the log itself (same slot). The events recorded once it is back, before
/// a node that sends the webhooks looks for that place, are sent all the
/// same: the URL starts again from the start of the new log, not from its
/// end. Here the sending node is frozen (SIGSTOP) across the restart while
/// another node, with no webhooks, records alice's lease claimed again
/// (`online`) in the new log; then that node dies and the frozen one,
/// resumed, takes the buckets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_send_what_was_recorded_before_a_lost_place_was_looked_for() {
    let mut redis = Redis::start();
    let receiver = Receiver::start(0).await;
    let mut sender = node_with_hooks(&redis, "sender", &receiver, &HOOKED);
    let mut recorder = Node::start_with(&redis, "recorder", &["--admin-key", ADMIN]);
    let _alice = Client::connect(&recorder, "alice", "web").await;
    let first = receiver.wait_for("alice", "online").await;
    unsafe {
        libc::kill(sender.pid() as i32, libc::SIGSTOP);
    }
    redis.restart_empty();
    // The recorder's session claims alice's lease again: `online`, in the
    // new log.
    let again = online_again(&recorder).await;
    assert_ne!(again, first["id"].as_str().unwrap());
    recorder.kill();
    unsafe {
        libc::kill(sender.pid() as i32, libc::SIGCONT);
    }
    wait_until(&format!("{again} delivered"), DEADLINE, || async {
        receiver.events().iter().any(|e| e["id"] == again.as_str())
    })
    .await;
    sender.kill();
}

/// The same loss, met by a node that starts after it: Redis restarted
/// empty, a node that ran before recorded alice's lease claimed again in
/// the new log, and only then does a node with the webhooks start. It found
/// Redis without a deployment, so its URL starts at the start of the new
/// log, not at its end, and the event is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_starts_on_an_emptied_redis_sends_what_is_there() {
    let mut redis = Redis::start();
    let receiver = Receiver::start(0).await;
    let mut sender = node_with_hooks(&redis, "sender", &receiver, &HOOKED);
    let mut recorder = Node::start_with(&redis, "recorder", &["--admin-key", ADMIN]);
    let _alice = Client::connect(&recorder, "alice", "web").await;
    receiver.wait_for("alice", "online").await;
    sender.kill();
    redis.restart_empty();
    let again = online_again(&recorder).await;
    let _late = node_with_hooks(&redis, "late", &receiver, &HOOKED);
    // The recorder, sending nothing itself, goes: the late node takes every
    // bucket once the recorder's locks lapse.
    recorder.kill();
    wait_until(&format!("{again} delivered"), DEADLINE, || async {
        receiver.events().iter().any(|e| e["id"] == again.as_str())
    })
    .await;
}
