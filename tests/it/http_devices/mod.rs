//! Issue 28: presence without a WebSocket (HTTP heartbeat devices beside
//! WebSocket devices), statuses that end (`until`, reset once in the fleet
//! even when the node that set it is SIGKILLed, and after a Redis restart),
//! device kinds, and the recently seen; with the privacy of each and bad
//! input.

mod cluster;
mod lists;
mod statuses;
mod taken;

use std::time::{Duration, Instant};

use crate::common::*;
use serde_json::{json, Value};

/// `POST /api/users/{user}/devices/{device}/heartbeat?kind=` on `node`.
pub async fn heartbeat(node: &Node, user: &str, device: &str, kind: &str) -> (u16, Value) {
    heartbeat_as(node, user, device, kind, None).await
}

/// [`heartbeat`] with a bearer (a token or the admin key).
pub async fn heartbeat_as(
    node: &Node,
    user: &str,
    device: &str,
    kind: &str,
    bearer: Option<&str>,
) -> (u16, Value) {
    let url = format!(
        "{}/api/users/{user}/devices/{device}/heartbeat?kind={kind}",
        node.http()
    );
    post_as(&url, &json!({}), bearer).await
}

/// `DELETE /api/users/{user}/devices/{device}` on `node`.
pub async fn leave(node: &Node, user: &str, device: &str, bearer: Option<&str>) -> (u16, Value) {
    let url = format!("{}/api/users/{user}/devices/{device}", node.http());
    let mut req = reqwest::Client::new().delete(url);
    if let Some(b) = bearer {
        req = req.bearer_auth(b);
    }
    let r = req.send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

/// `PUT /api/users/{user}/status` on `node` with `body`.
pub async fn put_status(
    node: &Node,
    user: &str,
    body: &Value,
    bearer: Option<&str>,
) -> (u16, Value) {
    let url = format!("{}/api/users/{user}/status", node.http());
    let mut req = reqwest::Client::new().put(url).json(body);
    if let Some(b) = bearer {
        req = req.bearer_auth(b);
    }
    let r = req.send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

/// `GET /api/presence/{user}` as `viewer` (dev auth).
pub async fn presence_as(node: &Node, user: &str, viewer: &str) -> Value {
    let (code, body) = get(&format!(
        "{}/api/presence/{user}?viewer={viewer}",
        node.http()
    ))
    .await;
    assert_eq!(code, 200, "{body}");
    body
}

/// Epoch ms now.
pub fn now() -> i64 {
    presence_server::store::now_ms()
}

/// A WebSocket device and an HTTP device of one user: online while either
/// holds, no flicker when one goes, kinds and the device list follow them,
/// and the HTTP device that stops heartbeating is offline within TTL + 1 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_and_websocket_devices_of_one_user_share_presence() {
    let redis = Redis::start();
    let a = Node::start(&redis, "a");
    let b = Node::start(&redis, "b");
    let mut watcher = Client::connect(&b, "watcher", "w").await;
    assert_eq!(watcher.watch(&["alice"]).await[0]["status"], "offline");

    // The HTTP device first, on node A: online, with its kind.
    let (code, hb) = heartbeat(&a, "alice", "bot1", "bot").await;
    assert_eq!(code, 200, "{hb}");
    assert_eq!(hb["ttl_ms"], 3 * HEARTBEAT_MS);
    assert_eq!(hb["heartbeat_ms"], HEARTBEAT_MS);
    let ev = watcher.expect_presence("alice", "online").await;
    assert_eq!(ev["kinds"], json!(["bot"]));
    assert_eq!(count(&redis, "alice").await, 1);

    // A socket on node B with kind=mobile beside it: no transition.
    let url = format!("{}&kind=mobile", b.ws_url("alice", "phone"));
    let mut phone = Client::connect_raw(&url, "alice", "phone").await.unwrap();
    assert_eq!(phone.expect("hello").await["device"], "phone");
    let p = presence_as(&a, "alice", "watcher").await;
    assert_eq!(p["devices"], 2, "{p}");
    assert_eq!(p["kinds"], json!(["bot", "mobile"]), "{p}");
    let kinds: Vec<(String, String)> = p["device_list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            let s = |k: &str| d[k].as_str().unwrap().to_string();
            (s("device"), s("kind"))
        })
        .collect();
    assert_eq!(
        kinds,
        [
            ("bot1".into(), "bot".into()),
            ("phone".into(), "mobile".into())
        ]
    );

    // Keep heartbeating the HTTP device while the socket leaves: online stays.
    let beat = |node: &Node| {
        let url = format!(
            "{}/api/users/alice/devices/bot1/heartbeat?kind=bot",
            node.http()
        );
        async move { post(&url, &json!({})).await.0 }
    };
    phone.close().await;
    wait_until("the socket's device is gone", DEADLINE, || async {
        count(&redis, "alice").await == 1
    })
    .await;
    for _ in 0..3 {
        assert_eq!(beat(&b).await, 200);
        if let Some(Incoming::Frame(f)) = watcher.next_within(Duration::from_millis(300)).await {
            panic!("no transition while the HTTP device holds: {f}");
        }
    }
    let p = presence_as(&b, "alice", "watcher").await;
    assert_eq!(
        (p["status"].as_str(), p["kinds"].clone()),
        (Some("online"), json!(["bot"]))
    );

    // The heartbeats stop: offline within TTL + 1 s of the last one.
    let last = Instant::now();
    assert_eq!(beat(&a).await, 200);
    let ev = watcher.expect_presence("alice", "offline").await;
    let took = last.elapsed();
    assert!(
        took <= TTL + Duration::from_secs(1),
        "offline after {took:?}"
    );
    assert!(
        took >= TTL - Duration::from_millis(100),
        "offline after {took:?}"
    );
    assert_eq!(ev["kinds"], json!([]));
    assert_eq!(count(&redis, "alice").await, 0);
}

/// A heartbeat for a device id a socket holds takes it over as a reconnect
/// would: the socket closes with 4001 and the user never goes offline;
/// DELETE then makes the device leave at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_takes_over_a_socket_and_delete_leaves_at_once() {
    let redis = Redis::start();
    let a = Node::start(&redis, "a");
    let b = Node::start(&redis, "b");
    let mut watcher = Client::connect(&b, "watcher", "w").await;
    watcher.watch(&["alice"]).await;
    // One who sees the kinds (they come with the device counts).
    let mut counts = Client::connect(&a, "counts", "w").await;
    counts
        .send(json!({"type": "watch", "users": ["alice"], "devices": true}))
        .await;
    counts.expect("snapshot").await;
    let mut laptop = Client::connect(&a, "alice", "laptop").await;
    watcher.expect_presence("alice", "online").await;
    assert_eq!(
        counts.expect_presence("alice", "online").await["kinds"],
        json!(["other"])
    );

    let (code, _) = heartbeat(&b, "alice", "laptop", "desktop").await;
    assert_eq!(code, 200);
    let closed = laptop.expect_closed().await;
    assert_eq!(closed.map(|c| c.0), Some(4001));
    // The device came back as another kind: news to who sees the kinds.
    let ev = counts.expect("presence").await;
    assert_eq!(
        (ev["devices"].as_u64(), ev["kinds"].clone()),
        (Some(1), json!(["desktop"])),
        "{ev}"
    );
    // Held by the heartbeat now: still one device, desktop.
    let p = presence_as(&a, "alice", "watcher").await;
    assert_eq!(
        (p["devices"].as_u64(), p["kinds"].clone()),
        (Some(1), json!(["desktop"]))
    );
    assert_eq!(count(&redis, "alice").await, 1);

    // DELETE: offline at once, well before the lease would lapse.
    let asked = Instant::now();
    let (code, _) = leave(&a, "alice", "laptop", None).await;
    assert_eq!(code, 204);
    watcher.expect_presence("alice", "offline").await;
    assert!(asked.elapsed() < TTL, "{:?}", asked.elapsed());
    assert_eq!(count(&redis, "alice").await, 0);
    // Nothing more comes (no second offline when the tombstone lapses).
    if let Some(Incoming::Frame(f)) = watcher.next_within(TTL + Duration::from_millis(500)).await {
        panic!("nothing after the DELETE: {f}");
    }
    // Deleting again is harmless.
    assert_eq!(leave(&b, "alice", "laptop", None).await.0, 204);

    // DELETE of a device a socket holds: the socket is told with 4001.
    let mut tab = Client::connect(&a, "alice", "tab").await;
    watcher.expect_presence("alice", "online").await;
    assert_eq!(leave(&b, "alice", "tab", None).await.0, 204);
    watcher.expect_presence("alice", "offline").await;
    assert_eq!(tab.expect_closed().await.map(|c| c.0), Some(4001));
    if let Some(Incoming::Frame(f)) = watcher.next_within(Duration::from_millis(500)).await {
        panic!("the socket does not claim it back: {f}");
    }
}

/// A refused heartbeat: user, device, kind, bearer, HTTP status, code.
type BadHeartbeat<'a> = (&'a str, &'a str, &'a str, Option<&'a str>, u16, &'a str);

/// Bad ids, an unknown kind, a token of another user, no token: 400, 403
/// or 401 with a JSON error, and nothing changes. The admin key acts for
/// anyone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_device_and_status_requests_change_nothing() {
    let redis = Redis::start();
    let node = jwt::jwt_node(&redis, "n1", &["--admin-key", ADMIN]);
    let alice = jwt::token("alice");
    let bob = jwt::token("bob");
    let checks: [BadHeartbeat; 6] = [
        ("al ice", "d", "web", Some(&alice), 400, "invalid_id"),
        ("alice", "d{1}", "web", Some(&alice), 400, "invalid_id"),
        ("alice", "d", "fridge", Some(&alice), 400, "bad_request"),
        ("alice", "d", "web", Some(&bob), 403, "forbidden"),
        ("alice", "d", "web", None, 401, "unauthorized"),
        (
            "alice",
            "d",
            "web",
            Some("not-a-token"),
            401,
            "unauthorized",
        ),
    ];
    for (user, device, kind, bearer, status, code) in checks {
        let user_enc = user.replace(' ', "%20");
        let device_enc = device.replace('{', "%7B").replace('}', "%7D");
        let (got, body) = heartbeat_as(&node, &user_enc, &device_enc, kind, bearer).await;
        assert_eq!(
            (got, body["code"].as_str()),
            (status, Some(code)),
            "{user}/{device}/{kind}: {body}"
        );
        assert!(body["message"].is_string(), "{body}");
    }
    assert_eq!(leave(&node, "alice", "d", Some(&bob)).await.0, 403);
    let (code, body) = put_status(&node, "alice", &json!({"status": "busy"}), Some(&bob)).await;
    assert_eq!((code, body["code"].as_str()), (403, Some("forbidden")));
    let t = now();
    for bad in [
        json!({"status": "busy", "until": t - 1_000}),
        json!({"status": "busy", "until": t + 31 * 24 * 3_600_000_i64}),
        json!({"status": "sleepy"}),
        json!({"status": "busy", "text": "a\u{202E}b"}),
    ] {
        let (code, body) = put_status(&node, "alice", &bad, Some(&alice)).await;
        assert_eq!(
            (code, body["code"].as_str()),
            (400, Some("invalid_status")),
            "{bad}: {body}"
        );
    }
    let (code, body) = put_status(&node, "alice", &json!({"status": 5}), Some(&alice)).await;
    assert_eq!(
        (code, body["code"].as_str()),
        (400, Some("bad_request")),
        "{body}"
    );
    // Nothing was written for alice.
    let mut c = redis.aconn().await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("presence*alice*")
        .query_async(&mut c)
        .await
        .unwrap();
    assert!(keys.is_empty(), "{keys:?}");
    let until: Vec<String> = redis::cmd("KEYS")
        .arg("presence-until*")
        .query_async(&mut c)
        .await
        .unwrap();
    assert!(until.is_empty(), "{until:?}");

    // The user's own token, and the admin key for anyone.
    assert_eq!(
        heartbeat_as(&node, "alice", "d", "web", Some(&alice))
            .await
            .0,
        200
    );
    assert_eq!(
        heartbeat_as(&node, "carol", "d", "", Some(ADMIN)).await.0,
        200
    );
    let (code, own) = put_status(
        &node,
        "carol",
        &json!({"status": "busy", "text": "call", "until": now() + 60_000}),
        Some(ADMIN),
    )
    .await;
    assert_eq!(code, 200, "{own}");
    assert_eq!(
        (own["status"].as_str(), own["text"].as_str()),
        (Some("busy"), Some("call"))
    );
    assert!(own["until"].as_i64().unwrap() > now());
    assert_eq!(own["kinds"], json!(["other"]));
    assert_eq!(leave(&node, "carol", "d", Some(ADMIN)).await.0, 204);
    assert_eq!(count(&redis, "carol").await, 0);

    // An unknown kind on the WebSocket is 400 before the upgrade; a status
    // frame with a past until is invalid_status.
    let url = format!("ws://{}/ws?device=d&kind=toaster&token={alice}", node.addr);
    assert_eq!(handshake(&url, &[]).await, 400);
    let url = format!("ws://{}/ws?device=w&kind=web&token={alice}", node.addr);
    let mut ws = Client::connect_raw(&url, "alice", "w").await.unwrap();
    ws.expect("hello").await;
    ws.send(json!({"type": "status", "status": "busy", "until": now() - 5}))
        .await;
    let err = ws.expect("error").await;
    assert_eq!(err["code"], "invalid_status");
}
