//! The HTTP API against real nodes and Redis.

use std::collections::HashSet;

use crate::common::*;
use serde_json::{json, Value};

#[tokio::test]
async fn presence_of_one_user_with_devices() {
    let redis = Redis::start();
    let node = Node::start(&redis, "n1");
    let base = node.http();

    let (status, body) = get(&format!("{base}/api/presence/alice")).await;
    assert_eq!(status, 200);
    assert_eq!(body["status"], "offline");
    assert_eq!(body["devices"], 0);
    assert_eq!(body["device_list"], json!([]));

    let mut phone = Client::connect(&node, "alice", "phone").await;
    let _laptop = Client::connect(&node, "alice", "laptop").await;
    phone
        .send(json!({"type":"status","status":"away","text":"lunch"}))
        .await;
    wait_until("status stored", DEADLINE, || async {
        get(&format!("{base}/api/presence/alice")).await.1["status"] == "away"
    })
    .await;
    let (_, body) = get(&format!("{base}/api/presence/alice")).await;
    assert_eq!(body["devices"], 2);
    assert_eq!(body["text"], "lunch");
    assert!(body["last_seen"].is_null());
    let list = body["device_list"].as_array().unwrap();
    let names: Vec<&str> = list.iter().map(|d| d["device"].as_str().unwrap()).collect();
    assert_eq!(names, ["laptop", "phone"]);
    for d in list {
        assert_eq!(d["node"], "n1");
        let left = d["expires_in_ms"].as_i64().unwrap();
        assert!(left > 0 && left <= TTL.as_millis() as i64, "{d}");
        assert!(d["connected_at"].as_i64().unwrap() > 0);
    }

    // Last seen survives going offline.
    phone.close().await;
    _laptop.close().await;
    wait_until("alice offline", DEADLINE, || async {
        get(&format!("{base}/api/presence/alice")).await.1["status"] == "offline"
    })
    .await;
    let (_, body) = get(&format!("{base}/api/presence/alice")).await;
    assert!(body["last_seen"].as_i64().unwrap() > 0, "{body}");
    assert_eq!(body["device_list"], json!([]));
}

#[tokio::test]
async fn bad_ids_are_400_with_a_code() {
    let redis = Redis::start();
    let node = Node::start(&redis, "n1");
    let base = node.http();
    let long = "x".repeat(129);
    for bad in ["b%3Aob", "%7Bbob%7D", "b%20ob", long.as_str(), "%C3%A9"] {
        let (status, body) = get(&format!("{base}/api/presence/{bad}")).await;
        assert_eq!(status, 400, "{bad}: {body}");
        assert_eq!(body["code"], "invalid_id", "{bad}: {body}");
        assert!(body["message"].as_str().unwrap().contains("user id"));
    }
    // The WebSocket handshake refuses bad ids before upgrading.
    for url in [
        format!("{base}/ws?user=a:b&device=d"),
        format!("{base}/ws?user=alice"),
        format!("{base}/ws?user=alice&device="),
    ] {
        let (status, body) = get(&url).await;
        assert_eq!(status, 400, "{url}: {body}");
    }
    let (status, body) = get(&format!("{base}/nope")).await;
    assert_eq!((status, body["code"].as_str()), (404, Some("not_found")));
}

#[tokio::test]
async fn bulk_query_keeps_order_and_refuses_oversize() {
    let redis = Redis::start();
    let node = Node::start(&redis, "n1");
    let url = format!("{}/api/presence/query", node.http());
    let _bob = Client::connect(&node, "bob", "phone").await;
    wait_until("bob counted", DEADLINE, || async {
        count(&redis, "bob").await == 1
    })
    .await;

    let (status, body) = post(&url, &json!({"users": ["zed", "bob", "alice", "bob"]})).await;
    assert_eq!(status, 200, "{body}");
    let recs = body["presence"].as_array().unwrap();
    let got: Vec<(&str, &str)> = recs
        .iter()
        .map(|r| (r["user"].as_str().unwrap(), r["status"].as_str().unwrap()))
        .collect();
    assert_eq!(
        got,
        [
            ("zed", "offline"),
            ("bob", "online"),
            ("alice", "offline"),
            ("bob", "online")
        ]
    );

    let full: Vec<String> = (0..1000).map(|i| format!("u{i}")).collect();
    let (status, body) = post(&url, &json!({ "users": full })).await;
    assert_eq!(status, 200);
    assert_eq!(body["presence"].as_array().unwrap().len(), 1000);
    assert_eq!(body["presence"][999]["user"], "u999");

    let over: Vec<String> = (0..1001).map(|i| format!("u{i}")).collect();
    let (status, body) = post(&url, &json!({ "users": over })).await;
    assert_eq!(status, 413, "{body}");
    assert_eq!(body["code"], "too_many_users");

    let (status, body) = post(&url, &json!({"users": ["ok", "n:o"]})).await;
    assert_eq!((status, body["code"].as_str()), (400, Some("invalid_id")));
    let (status, body) = post(&url, &json!({"people": []})).await;
    assert_eq!((status, body["code"].as_str()), (400, Some("bad_request")));
    let r = reqwest::Client::new()
        .post(&url)
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let huge = format!("{{\"users\":[\"{}\"]}}", "a".repeat(300_000));
    let r = reqwest::Client::new()
        .post(&url)
        .header("content-type", "application/json")
        .body(huge)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 413);
}

#[tokio::test]
async fn online_list_pages_most_recent_first() {
    let redis = Redis::start();
    // A long heartbeat: no pong refreshes (and reorders) anyone while paging.
    let node = Node::start_with(&redis, "n1", &["--heartbeat-ms", "30000"]);
    let base = node.http();
    let mut clients = Vec::new();
    for i in 0..7 {
        clients.push(Client::connect(&node, &format!("user{i}"), "d").await);
        // Distinct activity times, so the order is known.
        tokio::time::sleep(std::time::Duration::from_millis(3)).await;
    }
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let url = match &cursor {
            Some(c) => format!("{base}/api/online?limit=3&cursor={c}"),
            None => format!("{base}/api/online?limit=3"),
        };
        let (status, page) = get(&url).await;
        assert_eq!(status, 200, "{page}");
        let users = page["users"].as_array().unwrap();
        assert!(users.len() <= 3);
        for u in users {
            assert_eq!(u["status"], "online");
            seen.push((
                u["user"].as_str().unwrap().to_string(),
                u["active_at"].as_i64().unwrap(),
            ));
        }
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    let names: Vec<&str> = seen.iter().map(|(u, _)| u.as_str()).collect();
    assert_eq!(
        names,
        ["user6", "user5", "user4", "user3", "user2", "user1", "user0"]
    );
    assert!(seen.windows(2).all(|w| w[0].1 >= w[1].1));

    // Offline users leave the list.
    let gone = clients.remove(6);
    gone.close().await;
    wait_until("user6 off the list", DEADLINE, || async {
        let (_, page) = get(&format!("{base}/api/online?limit=50")).await;
        let users: HashSet<String> = page["users"]
            .as_array()
            .unwrap()
            .iter()
            .map(|u| u["user"].as_str().unwrap().to_string())
            .collect();
        users.len() == 6 && !users.contains("user6")
    })
    .await;

    for bad in [
        "limit=0",
        "limit=1001",
        "limit=x",
        "cursor=garbage",
        "cursor=1.b:ad",
    ] {
        let (status, body) = get(&format!("{base}/api/online?{bad}")).await;
        assert_eq!(status, 400, "{bad}: {body}");
        assert_eq!(body["code"], "bad_request");
    }
}

#[tokio::test]
async fn healthz_reports_redis() {
    let redis = Redis::start();
    let node = Node::start(&redis, "n1");
    let (status, body) = get(&format!("{}/healthz", node.http())).await;
    assert_eq!(status, 200);
    assert_eq!(body["node"], "n1");
    assert_eq!(body["redis"], "up");
    drop(redis);
    // /healthz answers from a check made every 0.5 s: it says so within one.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    loop {
        let (status, body): (u16, Value) = get(&format!("{}/healthz", node.http())).await;
        if status == 503 {
            assert_eq!(body["redis"], "down", "{body}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still {status}: {body}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn demo_page_and_client_are_served() {
    let redis = Redis::start();
    let node = Node::start(&redis, "n1");
    let page = reqwest::get(format!("{}/", node.http())).await.unwrap();
    assert_eq!(page.status().as_u16(), 200);
    assert!(page.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/html"));
    assert!(page.text().await.unwrap().contains("presence-client.js"));
    let js = reqwest::get(format!("{}/presence-client.js", node.http()))
        .await
        .unwrap();
    assert_eq!(js.status().as_u16(), 200);
    assert!(js.text().await.unwrap().contains("class PresenceClient"));
}

/// Key schema 5: a lease's value is one integer, which Redis keeps inside
/// the key's value object, and the device detail still tells, from any
/// node, which node holds each device and since when: after the device
/// moved to another node, and for a lease of schema 4
/// (`<node> <connection> <connected_at>`) too.
#[tokio::test]
async fn the_device_detail_names_the_node_holding_it_from_any_node() {
    let redis = Redis::start();
    let n1 = Node::start(&redis, "n1");
    let n2 = Node::start(&redis, "n2");
    let device = |base: String, name: &'static str| async move {
        let (_, body) = get(&format!("{base}/api/presence/alice")).await;
        let list = body["device_list"].as_array().cloned().unwrap_or_default();
        list.into_iter().find(|d| d["device"] == name)
    };
    let before = now_ms();
    let _phone = Client::connect(&n1, "alice", "phone").await;
    let after = now_ms();
    let mut c = redis.aconn().await;
    let encoding: String = redis::cmd("OBJECT")
        .arg("ENCODING")
        .arg("presence:{alice}:phone")
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(encoding, "int", "the lease value is one integer");
    let phone = device(n2.http(), "phone").await.expect("phone listed");
    assert_eq!(phone["node"], "n1", "{phone}");
    let at = phone["connected_at"].as_i64().unwrap();
    assert!(
        (before..=after).contains(&at),
        "{before} <= {at} <= {after}"
    );

    // The device connects again, to n2: the detail follows it.
    let _moved = Client::connect(&n2, "alice", "phone").await;
    wait_until("the phone shown on n2", DEADLINE, || async {
        device(n1.http(), "phone")
            .await
            .is_some_and(|d| d["node"] == "n2")
    })
    .await;

    // A lease written by a node of schema 4.
    redis::pipe()
        .cmd("SET")
        .arg("presence:{alice}:tab")
        .arg("old-node 7 1700000000000")
        .arg("PX")
        .arg(60_000)
        .ignore()
        .cmd("HSET")
        .arg("presence-status:{alice}")
        .arg("d:tab")
        .arg(1)
        .ignore()
        .query_async::<()>(&mut c)
        .await
        .unwrap();
    let tab = device(n1.http(), "tab").await.expect("tab listed");
    assert_eq!(tab["node"], "old-node", "{tab}");
    assert_eq!(tab["connected_at"], 1_700_000_000_000_i64, "{tab}");
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}
