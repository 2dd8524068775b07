//! Service reads: the admin key or `--service-key` reads the REST API as
//! the truth (an invisible user's real status, exact devices), marked
//! `"view":"service"`, under development auth and JWT auth alike.

use crate::common::jwt::{jwt_node, token};
use crate::common::*;
use serde_json::json;

const SERVICE: &str = "service-key-for-tests-456";

/// alice, invisible on two devices, as the service sees her on `base`
/// with `key`: every read surface says so.
async fn assert_service_view(base: &str, key: &str) {
    let (status, one) = get_as(&format!("{base}/api/presence/alice"), Some(key)).await;
    assert_eq!(status, 200, "{one}");
    assert_eq!(one["view"], "service", "{one}");
    assert_eq!(one["status"], "invisible", "{one}");
    assert_eq!(one["devices"], 2);
    assert_eq!(one["text"], "hiding");
    let devices: Vec<&str> = one["device_list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["device"].as_str().unwrap())
        .collect();
    assert_eq!(devices, ["laptop", "phone"]);

    let (status, many) = post_as(
        &format!("{base}/api/presence/query"),
        &json!({"users": ["alice", "nobody"]}),
        Some(key),
    )
    .await;
    assert_eq!(status, 200, "{many}");
    assert_eq!(many["view"], "service");
    assert_eq!(many["presence"][0]["status"], "invisible");
    assert_eq!(many["presence"][0]["devices"], 2);
    assert_eq!(many["presence"][1]["status"], "offline");

    let (status, page) = get_as(&format!("{base}/api/online"), Some(key)).await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["view"], "service");
    let users: Vec<&str> = page["users"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["user"].as_str().unwrap())
        .collect();
    assert!(users.contains(&"alice"), "{page}");
}

/// Makes alice invisible on two devices of `node` (dev auth).
async fn hide_alice(node: &Node) -> (Client, Client) {
    let mut phone = Client::connect(node, "alice", "phone").await;
    let laptop = Client::connect(node, "alice", "laptop").await;
    phone
        .send(json!({"type":"status","status":"invisible","text":"hiding"}))
        .await;
    phone.expect_presence("alice", "invisible").await;
    (phone, laptop)
}

/// Development auth: both keys read the truth; without a key (or with a
/// wrong one) the read is anonymous, as before, and not marked.
#[tokio::test]
async fn keys_read_the_truth_under_dev_auth() {
    let redis = Redis::start();
    let node = Node::start_with(
        &redis,
        "n1",
        &["--admin-key", ADMIN, "--service-key", SERVICE],
    );
    let base = node.http();
    let _alice = hide_alice(&node).await;
    assert_service_view(&base, SERVICE).await;
    assert_service_view(&base, ADMIN).await;
    for bearer in [None, Some("not-the-key-0123456789")] {
        let (status, body) = get_as(&format!("{base}/api/presence/alice"), bearer).await;
        assert_eq!(status, 200);
        assert_eq!(body["status"], "offline", "{bearer:?}: {body}");
        assert_eq!(body["devices"], 0);
        assert!(body.get("view").is_none(), "{body}");
        let (_, page) = get_as(&format!("{base}/api/online"), bearer).await;
        assert_eq!(page["users"], json!([]), "{page}");
    }
}

/// JWT auth: the keys are not taken for tokens (they were: 401 "invalid
/// token"); a user's token still reads as that user; anything else is 401.
#[tokio::test]
async fn keys_read_the_truth_under_jwt_auth() {
    let redis = Redis::start();
    let node = jwt_node(
        &redis,
        "n1",
        &["--admin-key", ADMIN, "--service-key", SERVICE],
    );
    let base = node.http();
    let alice = token("alice");
    let ws = |device: &str| format!("ws://{}/ws?device={device}&token={alice}", node.addr);
    let mut phone = Client::connect_raw(&ws("phone"), "alice", "phone")
        .await
        .unwrap();
    phone.expect("hello").await;
    let mut laptop = Client::connect_raw(&ws("laptop"), "alice", "laptop")
        .await
        .unwrap();
    laptop.expect("hello").await;
    phone
        .send(json!({"type":"status","status":"invisible","text":"hiding"}))
        .await;
    phone.expect_presence("alice", "invisible").await;

    assert_service_view(&base, SERVICE).await;
    assert_service_view(&base, ADMIN).await;
    let (status, body) = get_as(&format!("{base}/api/presence/alice"), Some(&token("bob"))).await;
    assert_eq!(status, 200);
    assert_eq!(body["status"], "offline", "bob sees alice hidden: {body}");
    assert!(body.get("view").is_none(), "{body}");
    let (status, body) = get_as(
        &format!("{base}/api/presence/alice"),
        Some("not-the-key-0123456789"),
    )
    .await;
    assert_eq!(status, 401, "{body}");
}

/// With `--internal-listen` the admin key is worth nothing on the public
/// port (reads there are anonymous); the read-only service key works.
#[tokio::test]
async fn with_an_internal_listener_the_service_key_reads_on_the_public_port() {
    let redis = Redis::start();
    let node = Node::start_with(
        &redis,
        "n1",
        &[
            "--internal-listen",
            "127.0.0.1:0",
            "--admin-key",
            ADMIN,
            "--service-key",
            SERVICE,
        ],
    );
    let _alice = hide_alice(&node).await;
    assert_service_view(&node.http(), SERVICE).await;
    let (_, body) = get_as(&format!("{}/api/presence/alice", node.http()), Some(ADMIN)).await;
    assert_eq!(body["status"], "offline", "{body}");
    assert!(body.get("view").is_none(), "{body}");
}
