//! Authentication, origins and privacy (design invariant 5).

use crate::common::jwt::{self, jwt_node, now, token, Key};
use crate::common::*;
use jsonwebtoken::Algorithm;
use serde_json::{json, Value};

#[tokio::test]
async fn jwt_handshakes_refuse_bad_tokens() {
    let redis = Redis::start();
    let node = jwt_node(&redis, "n1", &["--admin-key", ADMIN]);
    let base = format!("ws://{}/ws", node.addr);
    let expired = jwt::hs(json!({"sub": "alice", "exp": now() - 3600}));
    let forged = jwt::sign(
        "another-secret-another-secret-another",
        &json!({"sub": "alice", "exp": now() + 3600}),
    );
    let mut tampered = token("alice");
    // Flip one character of the signature.
    let last = tampered.pop().unwrap();
    tampered.push(if last == 'A' { 'B' } else { 'A' });
    // (Without any token the handshake upgrades and the first frame must
    // bring one: tests/it/identity.rs.)
    for (what, url) in [
        ("expired", format!("{base}?device=d&token={expired}")),
        ("forged", format!("{base}?device=d&token={forged}")),
        ("tampered", format!("{base}?device=d&token={tampered}")),
        ("garbage", format!("{base}?device=d&token=not.a.jwt")),
    ] {
        assert_eq!(handshake(&url, &[]).await, 401, "{what}");
    }
    // A token for alice cannot act as bob.
    let alice = token("alice");
    assert_eq!(
        handshake(&format!("{base}?device=d&user=bob&token={alice}"), &[]).await,
        403
    );
    // The token's user is the session's user, by query or by header.
    let mut c = Client::connect_raw(&format!("{base}?device=d&token={alice}"), "alice", "d")
        .await
        .unwrap();
    assert_eq!(c.expect("hello").await["user"], "alice");
    let bearer = format!("Bearer {}", token("bob"));
    assert_eq!(
        handshake(&format!("{base}?device=d"), &[("authorization", &bearer)]).await,
        101
    );

    // The HTTP API needs a token too, and reads as its user.
    let (status, body) = get(&format!("{}/api/presence/alice", node.http())).await;
    assert_eq!((status, body["code"].as_str()), (401, Some("unauthorized")));
    let (status, body) = get(&format!(
        "{}/api/presence/alice?token={expired}",
        node.http()
    ))
    .await;
    assert_eq!(status, 401, "{body}");
    // (presence_as sends the token in the header and checks the 200.)
    assert_eq!(
        presence_as(&node, "alice", "carol").await["status"],
        "online"
    );
}

#[tokio::test]
async fn es256_public_keys_verify_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let key = Key::generate(dir.path(), Algorithm::ES256, "es");
    let public = key.public_pem();
    let redis = Redis::start();
    let node = Node::start_with(
        &redis,
        "n1",
        &[
            "--auth",
            "jwt",
            "--jwt-public-key-file",
            public.to_str().unwrap(),
        ],
    );
    let t = key.sign(None, &json!({"sub": "alice", "exp": now() + 60}));
    let url = format!("ws://{}/ws?device=d&token={t}", node.addr);
    assert_eq!(handshake(&url, &[]).await, 101);
    // An HS256 token is not accepted by a node that only knows the key.
    let hs = token("alice");
    let url = format!("ws://{}/ws?device=d&token={hs}", node.addr);
    assert_eq!(handshake(&url, &[]).await, 401);
}

#[tokio::test]
async fn foreign_origins_are_refused() {
    let redis = Redis::start();
    let node = Node::start_with(
        &redis,
        "n1",
        &["--allowed-origins", "https://chat.example.com"],
    );
    let url = node.ws_url("alice", "d");
    // Refused in a close frame a browser shows its page (a 403 shows as a
    // bare 1006), naming the flag that would let the origin in; no session.
    let (code, reason) = refusal(&url, "https://evil.example").await;
    assert_eq!(code, 1008, "{reason}");
    assert_eq!(
        reason,
        "origin not allowed: start the server with --allowed-origins https://evil.example"
    );
    node.wait_log(
        "refused: origin not allowed: start the server with --allowed-origins https://evil.example",
    )
    .await;
    let (code, reason) = refusal(&url, "null").await;
    assert_eq!(code, 1008, "{reason}");
    assert!(reason.contains("--allowed-origins"), "{reason}");
    assert!(!reason.contains("--allowed-origins null"), "{reason}");
    // An origin too long for a close frame: cut, still naming the flag.
    let long = format!("https://{}.example", "a".repeat(200));
    let (code, reason) = refusal(&url, &long).await;
    assert_eq!((code, reason.len() <= 123), (1008, true), "{reason}");
    assert!(reason.contains("--allowed-origins https://aaa"), "{reason}");
    let (_, online) = get(&format!("{}/api/presence/alice", node.http())).await;
    assert_eq!(
        online["status"], "offline",
        "a refused origin made a session"
    );
    assert_eq!(
        handshake(&url, &[("origin", "https://chat.example.com")]).await,
        101
    );
    let own = format!("http://{}", node.addr);
    assert_eq!(handshake(&url, &[("origin", &own)]).await, 101);
    // Not a browser: no Origin header.
    assert_eq!(handshake(&url, &[]).await, 101);
}

/// The close code and reason of a WebSocket to `url` opened with `origin`,
/// before any other frame.
async fn refusal(url: &str, origin: &str) -> (u16, String) {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let mut request = url.into_client_request().unwrap();
    request
        .headers_mut()
        .insert("origin", origin.parse().unwrap());
    let (ws, _) = tokio_tungstenite::connect_async(request)
        .await
        .unwrap_or_else(|e| panic!("{origin}: {e}"));
    let mut client = Client::from_stream(ws, "alice", "d");
    match client.next_within(DEADLINE).await {
        Some(Incoming::Closed(Some(closed))) => closed,
        other => panic!("{origin}: not closed with a reason but {other:?}"),
    }
}

#[test]
fn dev_auth_is_refused_off_loopback() {
    let redis = Redis::start();
    let args = |extra: &[&str]| -> Vec<String> {
        ["--listen", "0.0.0.0:0", "--redis-url", &redis.url]
            .iter()
            .chain(extra)
            .map(|s| s.to_string())
            .collect()
    };
    let logs = match Node::spawn("n1", &args(&[]), &[]) {
        Ok(_) => panic!("dev auth served on 0.0.0.0"),
        Err(logs) => logs,
    };
    assert!(logs.contains("--allow-insecure-dev-auth"), "{logs}");
    let node = Node::spawn("n1", &args(&["--allow-insecure-dev-auth"]), &[]).expect("starts");
    assert!(node.logs().contains("anyone can connect as any user"));
}

/// `PUT /api/users/{user}/privacy` with `bearer`; the status code.
async fn put_privacy(node: &Node, user: &str, bearer: &str, body: Value) -> u16 {
    reqwest::Client::new()
        .put(format!("{}/api/users/{user}/privacy", node.http()))
        .bearer_auth(bearer)
        .json(&body)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

async fn admin_put(node: &Node, user: &str, contacts: &[&str]) {
    let r = reqwest::Client::new()
        .put(format!("{}/api/users/{user}/contacts", node.http()))
        .bearer_auth(ADMIN)
        .json(&json!({ "contacts": contacts }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
}

async fn presence_as(node: &Node, user: &str, viewer: &str) -> Value {
    let r = reqwest::Client::new()
        .get(format!("{}/api/presence/{user}", node.http()))
        .bearer_auth(token(viewer))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    r.json().await.unwrap()
}

async fn query_as(node: &Node, users: &[&str], viewer: &str) -> Vec<Value> {
    let r = reqwest::Client::new()
        .post(format!("{}/api/presence/query", node.http()))
        .bearer_auth(token(viewer))
        .json(&json!({ "users": users }))
        .send()
        .await
        .unwrap();
    let v: Value = r.json().await.unwrap();
    v["presence"].as_array().unwrap().clone()
}

async fn online_as(node: &Node, viewer: &str) -> Vec<String> {
    let r = reqwest::Client::new()
        .get(format!("{}/api/online?limit=1000", node.http()))
        .bearer_auth(token(viewer))
        .send()
        .await
        .unwrap();
    let v: Value = r.json().await.unwrap();
    v["users"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["user"].as_str().unwrap().to_string())
        .collect()
}

async fn ws(node: &Node, user: &str, device: &str) -> Client {
    let url = format!(
        "ws://{}/ws?device={device}&token={}",
        node.addr,
        token(user)
    );
    let mut c = Client::connect_raw(&url, user, device).await.unwrap();
    c.expect("hello").await;
    c
}

/// An invisible user is offline to everyone else on every surface, across
/// nodes, and sees its own truth; switching looks like leaving and coming back.
#[tokio::test]
async fn invisible_never_leaks() {
    let redis = Redis::start();
    let a = jwt_node(&redis, "a", &["--admin-key", ADMIN]);
    let b = jwt_node(&redis, "b", &["--admin-key", ADMIN]);
    let mut watcher = ws(&b, "watcher", "w").await;
    watcher.watch(&["alice"]).await;
    let mut alice = ws(&a, "alice", "phone").await;
    assert_eq!(alice.watch(&["alice"]).await[0]["status"], "online");
    assert_eq!(watcher.expect("presence").await["status"], "online");

    alice
        .send(json!({"type":"status","status":"invisible","text":"secret"}))
        .await;
    let ev = watcher.expect("presence").await;
    assert_eq!(
        (
            ev["status"].as_str(),
            ev["devices"].as_i64(),
            ev["text"].is_null()
        ),
        (Some("offline"), Some(0), true),
        "{ev}"
    );
    let hidden_at = ev["last_seen"]
        .as_i64()
        .expect("looks like leaving: last seen set");
    let own = alice.expect("presence").await;
    assert_eq!(
        (own["status"].as_str(), own["devices"].as_i64()),
        (Some("invisible"), Some(1))
    );

    // A second device of the invisible user arrives on the other node: no
    // event for others, snapshot and every REST surface show offline.
    let _laptop = ws(&b, "alice", "laptop").await;
    let mut late = ws(&b, "late", "w").await;
    let snap = late.watch(&["alice"]).await;
    assert_eq!(snap[0]["status"], "offline");
    assert_eq!(snap[0]["last_seen"], hidden_at);
    for node in [&a, &b] {
        let single = presence_as(node, "alice", "someone").await;
        assert_eq!(single["status"], "offline", "{single}");
        assert_eq!(single["devices"], 0);
        assert_eq!(single["device_list"], json!([]));
        assert!(single["text"].is_null());
        let bulk = query_as(node, &["alice"], "someone").await;
        assert_eq!(bulk[0]["status"], "offline");
        assert!(!online_as(node, "someone")
            .await
            .contains(&"alice".to_string()));
        // Her own view is the truth.
        let mine = presence_as(node, "alice", "alice").await;
        assert_eq!(
            (mine["status"].as_str(), mine["devices"].as_i64()),
            (Some("invisible"), Some(2))
        );
        assert_eq!(mine["device_list"].as_array().unwrap().len(), 2);
        assert!(online_as(node, "alice")
            .await
            .contains(&"alice".to_string()));
    }

    // Back to online: others see her come back.
    alice.send(json!({"type":"status","status":"online"})).await;
    let ev = watcher.expect("presence").await;
    assert_eq!(
        (ev["status"].as_str(), ev["devices"].as_i64()),
        (Some("online"), Some(2)),
        "{ev}"
    );
    assert_eq!(late.expect("presence").await["status"], "online");
}

/// show_online / show_last_seen: everyone, contacts, nobody, on every surface.
#[tokio::test]
async fn privacy_settings_hold_on_every_surface() {
    let redis = Redis::start();
    let node = jwt_node(&redis, "n1", &["--admin-key", ADMIN]);
    admin_put(&node, "bob", &["carol"]).await;
    let mut carol = ws(&node, "carol", "c").await; // a contact of bob
    let mut dave = ws(&node, "dave", "d").await; // not a contact
    carol.watch(&["bob"]).await;
    dave.watch(&["bob"]).await;

    let mut bob = ws(&node, "bob", "phone").await;
    assert_eq!(carol.expect("presence").await["status"], "online");
    assert_eq!(dave.expect("presence").await["status"], "online");

    // Online only for contacts: dave sees bob leave, carol sees nothing.
    bob.send(json!({"type":"privacy","online":"contacts","last_seen":"contacts"}))
        .await;
    assert_eq!(dave.expect("presence").await["status"], "offline");
    assert_eq!(presence_as(&node, "bob", "carol").await["status"], "online");
    assert_eq!(presence_as(&node, "bob", "dave").await["status"], "offline");
    assert!(online_as(&node, "carol").await.contains(&"bob".to_string()));
    assert!(!online_as(&node, "dave").await.contains(&"bob".to_string()));

    // Bob leaves: carol sees the offline with last seen, dave nothing new.
    bob.close().await;
    let ev = carol.expect("presence").await;
    assert_eq!(ev["status"], "offline");
    let seen = ev["last_seen"].as_i64().expect("contact sees last seen");
    for (viewer, expected) in [
        ("carol", json!(seen)),
        ("dave", Value::Null),
        ("bob", json!(seen)),
    ] {
        assert_eq!(
            presence_as(&node, "bob", viewer).await["last_seen"],
            expected,
            "{viewer}"
        );
        assert_eq!(
            query_as(&node, &["bob"], viewer).await[0]["last_seen"],
            expected,
            "{viewer}"
        );
        if viewer != "bob" {
            // (Connecting as bob would bring him online.)
            let mut w = ws(&node, viewer, "snap").await;
            assert_eq!(
                w.watch(&["bob"]).await[0]["last_seen"],
                expected,
                "{viewer} snapshot"
            );
        }
    }

    // Nobody: not even a contact; bob's own view is still the truth.
    assert_eq!(
        put_privacy(&node, "bob", &token("bob"), json!({"last_seen": "nobody"})).await,
        204
    );
    assert!(presence_as(&node, "bob", "carol").await["last_seen"].is_null());
    assert_eq!(
        presence_as(&node, "bob", "bob").await["last_seen"],
        json!(seen)
    );
    // Nobody else may change bob's settings.
    assert_eq!(
        put_privacy(
            &node,
            "bob",
            &token("dave"),
            json!({"last_seen": "everyone"})
        )
        .await,
        403
    );

    // Everyone again.
    assert_eq!(
        put_privacy(
            &node,
            "bob",
            ADMIN,
            json!({"online": "everyone", "last_seen": "everyone"})
        )
        .await,
        204
    );
    assert_eq!(
        presence_as(&node, "bob", "dave").await["last_seen"],
        json!(seen)
    );
}

/// A contacts change applies to live watchers at once.
#[tokio::test]
async fn contacts_changes_reach_watchers() {
    let redis = Redis::start();
    let node = jwt_node(&redis, "n1", &["--admin-key", ADMIN]);
    let mut bob = ws(&node, "bob", "phone").await;
    bob.send(json!({"type":"privacy","online":"contacts"}))
        .await;
    wait_until("bob hidden", DEADLINE, || async {
        presence_as(&node, "bob", "carol").await["status"] == "offline"
    })
    .await;
    let mut carol = ws(&node, "carol", "c").await;
    assert_eq!(carol.watch(&["bob"]).await[0]["status"], "offline");
    admin_put(&node, "bob", &["carol"]).await;
    assert_eq!(carol.expect("presence").await["status"], "online");
    admin_put(&node, "bob", &[]).await;
    assert_eq!(carol.expect("presence").await["status"], "offline");
    // The admin API needs the key.
    let r = reqwest::Client::new()
        .get(format!("{}/api/users/bob/contacts", node.http()))
        .bearer_auth(token("bob"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
}

/// --watch-policy contacts: a watch on a non-contact shows offline without
/// last seen and no events, whether or not the user exists.
#[tokio::test]
async fn watch_policy_contacts() {
    let redis = Redis::start();
    let node = jwt_node(
        &redis,
        "n1",
        &["--admin-key", ADMIN, "--watch-policy", "contacts"],
    );
    admin_put(&node, "bob", &["carol"]).await;
    let _bob = ws(&node, "bob", "phone").await;
    let mut dave = ws(&node, "dave", "d").await;
    let snap = dave.watch(&["bob", "nobody-at-all"]).await;
    for r in &snap {
        assert_eq!(
            (r["status"].as_str(), r["last_seen"].is_null()),
            (Some("offline"), true),
            "{r}"
        );
    }
    assert_eq!(
        snap[0].as_object().unwrap().len(),
        snap[1].as_object().unwrap().len()
    );
    let mut carol = ws(&node, "carol", "c").await;
    assert_eq!(carol.watch(&["bob"]).await[0]["status"], "online");
    // Bob changes status: carol hears it; dave's next frame is his own.
    _bob_status(&node).await;
    assert_eq!(carol.expect("presence").await["status"], "away");
    dave.send(json!({"type":"watch","users":["dave"]})).await;
    let next = dave.recv().await;
    assert_eq!(next["type"], "snapshot", "dave heard about bob: {next}");
}

async fn _bob_status(node: &Node) {
    let mut bob2 = ws(node, "bob", "tablet").await;
    bob2.send(json!({"type":"status","status":"away"})).await;
    // Keep the tablet until the status is stored.
    wait_until("status stored", DEADLINE, || async {
        presence_as(node, "bob", "bob").await["status"] == "away"
    })
    .await;
}

/// A device may arrive already invisible (`?status=invisible`): a user with
/// no stored status never flashes online.
#[tokio::test]
async fn arriving_invisible_never_shows_online() {
    let redis = Redis::start();
    let node = Node::start(&redis, "n1");
    let mut w = Client::connect(&node, "watcher", "w").await;
    w.watch(&["newbie", "marker"]).await;
    let url = format!(
        "ws://{}/ws?user=newbie&device=d&status=invisible",
        node.addr
    );
    let mut newbie = Client::connect_raw(&url, "newbie", "d").await.unwrap();
    newbie.expect("hello").await;
    assert_eq!(newbie.watch(&["newbie"]).await[0]["status"], "invisible");
    // The next thing the watcher hears is the marker, not newbie.
    let _marker = Client::connect(&node, "marker", "m").await;
    let ev = w.expect("presence").await;
    assert_eq!(ev["user"], "marker", "{ev}");
    let (_, rec) = get(&format!("{}/api/presence/newbie", node.http())).await;
    assert_eq!(rec["status"], "offline");
    // A stored status wins over the parameter.
    let again = format!("ws://{}/ws?user=newbie&device=e&status=online", node.addr);
    let mut second = Client::connect_raw(&again, "newbie", "e").await.unwrap();
    second.expect("hello").await;
    let (_, rec) = get(&format!(
        "{}/api/presence/newbie?viewer=newbie",
        node.http()
    ))
    .await;
    assert_eq!(rec["status"], "invisible");
    let bad = format!("ws://{}/ws?user=x&device=d&status=sleepy", node.addr);
    assert_eq!(handshake(&bad, &[]).await, 400);
}
