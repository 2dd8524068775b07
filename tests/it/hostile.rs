//! Hostile clients (issue 30): what a viewer, a page doing DNS rebinding or
//! a token's issuer could get out of a node that it should not.

use crate::common::jwt::{connect_with, jwt_node, now, SECRET};
use crate::common::*;
use serde_json::{json, Value};

/// The arguments `Node::start_with` gives a node, without its environment
/// (which makes `/metrics` public for the other tests' scrapes).
fn args(redis: &Redis, id: &str, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "--listen",
        "127.0.0.1:0",
        "--redis-url",
        &redis.url,
        "--node-id",
        id,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// A node started with exactly `extra` besides its address and Redis.
fn bare_node(redis: &Redis, id: &str, extra: &[&str]) -> Node {
    Node::spawn(id, &args(redis, id, extra), &[])
        .unwrap_or_else(|logs| panic!("node {id} did not start:\n{logs}"))
}

/// Users `<prefix>0..n` online on device `d` of no node, their deadlines
/// `base + offset + i`; `invisible` ones hidden from every viewer.
async fn online_users(redis: &Redis, prefix: &str, n: usize, base: i64, invisible: bool) {
    let mut c = redis.aconn().await;
    presence_bench::fixture::live_leases(&mut c, prefix, n, "elsewhere 1 0", false)
        .await
        .unwrap();
    let mut pipe = redis::pipe();
    for i in 0..n {
        let user = format!("{prefix}{i}");
        pipe.cmd("ZADD")
            .arg(index_key("presence-leases", &user))
            .arg(base + i as i64)
            .arg(format!("{user}:d"))
            .ignore();
        if invisible {
            pipe.cmd("HSET")
                .arg(format!("presence-status:{{{user}}}"))
                .arg("status")
                .arg("invisible")
                .ignore();
        }
    }
    pipe.query_async::<()>(&mut c).await.unwrap();
}

/// Item 1: a viewer pages the online list past users hidden from it; the
/// cursors say nothing of them, a changed cursor is refused, and a cursor of
/// one node works on another.
#[tokio::test]
async fn online_cursors_are_opaque_and_authenticated() {
    let redis = Redis::start();
    let a = Node::start(&redis, "a");
    let b = Node::start(&redis, "b");
    let base = presence_server::store::now_ms() + 300_000;
    online_users(&redis, "v", 2, base, false).await;
    // Newer than the visible ones: the first page examines only them, and
    // (limit 1, four entries a request) stops among them.
    online_users(&redis, "hidden", 5, base + 1_000, true).await;
    let hidden: Vec<String> = (0..5).map(|i| (base + 1_000 + i).to_string()).collect();

    let mut cursors: Vec<String> = Vec::new();
    let mut seen: Vec<String> = Vec::new();
    let mut cursor: Option<String> = None;
    for page in 0.. {
        assert!(page < 10, "the walk does not end: {cursors:?}");
        // Pages alternate between the nodes.
        let node = if page % 2 == 0 { &a } else { &b };
        let mut url = format!("{}/api/online?viewer=eve&limit=1", node.http());
        if let Some(c) = &cursor {
            url.push_str(&format!("&cursor={c}"));
        }
        let (status, body) = get(&url).await;
        assert_eq!(status, 200, "page {page} on {}: {body}", node.id);
        for u in body["users"].as_array().unwrap() {
            seen.push(u["user"].as_str().unwrap().to_string());
        }
        cursor = body["next_cursor"].as_str().map(str::to_string);
        match &cursor {
            Some(c) => cursors.push(c.clone()),
            None => break,
        }
    }
    assert_eq!(seen, ["v1", "v0"], "cursors {cursors:?}");
    assert!(!cursors.is_empty());
    for c in &cursors {
        for h in &hidden {
            assert!(!c.contains(h.as_str()), "cursor {c} holds deadline {h}");
        }
        let head = c.split(['_', '~']).next().unwrap();
        assert!(head.parse::<f64>().is_err(), "cursor {c} reads as a score");
    }
    // A cursor changed by one character, or made up, is refused.
    let first = &cursors[0];
    let flip = if first.starts_with('2') { "3" } else { "2" };
    let changed = format!("{flip}{}", &first[1..]);
    let crafted = format!("{}_{}", hidden[0], vec!["0"; 16].join(","));
    for bad in [changed, crafted, "AAAA".to_string()] {
        let url = format!("{}/api/online?viewer=eve&limit=1&cursor={bad}", a.http());
        let (status, body) = get(&url).await;
        assert_eq!(status, 400, "cursor {bad}: {body}");
        assert_eq!(body["code"], "bad_request", "{body}");
    }
}

/// Item 6: `/metrics` on the public listener needs the admin or the service
/// key unless `--public-metrics`; on the internal listener it stays open.
#[tokio::test]
async fn metrics_need_a_key_unless_public() {
    let redis = Redis::start();
    let service = "service-key-for-tests-0123";
    let node = bare_node(
        &redis,
        "n1",
        &["--admin-key", ADMIN, "--service-key", service],
    );
    let http = reqwest::Client::new();
    let url = format!("{}/metrics", node.http());
    let scrape = |key: Option<&str>| {
        let mut r = http.get(&url);
        if let Some(key) = key {
            r = r.bearer_auth(key);
        }
        async move { r.send().await.unwrap().status().as_u16() }
    };
    assert_eq!(scrape(None).await, 401);
    assert_eq!(scrape(Some("wrong-key-0123456789")).await, 401);
    assert_eq!(scrape(Some(ADMIN)).await, 200);
    assert_eq!(scrape(Some(service)).await, 200);

    let open = bare_node(&redis, "n2", &["--public-metrics"]);
    let r = reqwest::get(format!("{}/metrics", open.http()))
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);

    let split = bare_node(&redis, "n3", &["--internal-listen", "127.0.0.1:0"]);
    let r = reqwest::get(format!("{}/metrics", internal_addr(&split)))
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200, "internal /metrics");
}

/// Item 7: under development auth the internal listener answers `/api/*`
/// only to a loopback or allowed Host, as the public one does.
#[tokio::test]
async fn the_internal_listener_checks_the_host_under_dev_auth() {
    let redis = Redis::start();
    let node = bare_node(&redis, "n1", &["--internal-listen", "127.0.0.1:0"]);
    let base = internal_addr(&node);
    let internal = base.trim_start_matches("http://");
    let path = "/api/users/alice/privacy?viewer=alice";
    let body = r#"{"online":"nobody"}"#;
    let evil = status_with_host(internal, "PUT", path, "evil.example", body).await;
    assert_eq!(evil, 403, "PUT privacy with Host evil.example");
    let own = status_with_host(internal, "PUT", path, internal, body).await;
    assert_eq!(own, 204, "PUT privacy with Host {internal}");
}

/// Item 8: status text with control, bidi or noncharacter code points is
/// refused; emoji sequences joined with U+200D pass.
#[tokio::test]
async fn status_text_refuses_control_and_bidi_characters() {
    let redis = Redis::start();
    let node = Node::start(&redis, "n1");
    let mut c = Client::connect(&node, "alice", "phone").await;
    for text in [
        "a\u{202E}gnp.exe",
        "bell\u{7}",
        "c1\u{85}",
        "x\u{2066}y",
        "\u{FFFF}",
    ] {
        c.send(json!({"type": "status", "status": "busy", "text": text}))
            .await;
        let err = c.expect("error").await;
        assert_eq!(err["code"], "invalid_status", "{text:?}: {err}");
    }
    let family = "\u{1F468}\u{200D}\u{1F469}\u{200D}\u{1F467} home";
    c.send(json!({"type": "status", "status": "busy", "text": family}))
        .await;
    let ev = c.expect("presence").await;
    assert_eq!(ev["text"], family, "{ev}");
}

/// Item 9: the user claim must be a string, and a token naming a critical
/// header extension is refused (the server understands none).
#[tokio::test]
async fn tokens_with_a_numeric_user_or_a_crit_header_are_refused() {
    let redis = Redis::start();
    let node = jwt_node(&redis, "n1", &[]);
    let exp = now() + 3600;
    let key = jsonwebtoken::EncodingKey::from_secret(SECRET.as_bytes());
    let sign = |header: &jsonwebtoken::Header, claims: &Value| {
        jsonwebtoken::encode(header, claims, &key).unwrap()
    };
    let plain = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
    // The control: the same token with a string subject connects.
    let good = sign(&plain, &json!({"sub": "123", "exp": exp}));
    assert_eq!(connect_with(&node, &good).await, 101);
    let numeric = sign(&plain, &json!({"sub": 123, "exp": exp}));
    assert_eq!(connect_with(&node, &numeric).await, 401, "numeric sub");
    let mut crit = plain.clone();
    crit.crit = Some(vec!["exp".to_string()]);
    let critical = sign(&crit, &json!({"sub": "123", "exp": exp}));
    assert_eq!(connect_with(&node, &critical).await, 401, "crit header");
}

/// Item 2: a watcher removed from the contacts of a user who shows itself
/// online to contacts only sees that user offline at once, even when the
/// re-read that follows the contacts change fails (here: the contacts key
/// of the wrong type, deterministically; a full request queue did the
/// same), and none of the user's later changes reach it.
#[tokio::test]
async fn a_contacts_revocation_applies_even_when_the_reread_fails() {
    let redis = Redis::start();
    let node = Node::start_with(
        &redis,
        "n1",
        &["--admin-key", ADMIN, "--internal-listen", "127.0.0.1:0"],
    );
    let r = reqwest::Client::new()
        .put(format!("{}/api/users/alice/contacts", internal_addr(&node)))
        .bearer_auth(ADMIN)
        .json(&json!({ "contacts": ["bob"] }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let mut alice = Client::connect(&node, "alice", "phone").await;
    alice
        .send(json!({"type": "privacy", "online": "contacts"}))
        .await;
    let mut bob = Client::connect(&node, "bob", "b").await;
    wait_until("alice online to bob", DEADLINE, || async {
        let (_, r) = get(&format!("{}/api/presence/alice?viewer=bob", node.http())).await;
        r["status"] == "online"
    })
    .await;
    assert_eq!(bob.watch(&["alice"]).await[0]["status"], "online");
    // Bob is no longer a contact, and reading alice fails.
    let mut c = redis.aconn().await;
    let _: () = redis::pipe()
        .cmd("SET")
        .arg("presence-contacts:{alice}")
        .arg("not a set")
        .ignore()
        .cmd("SPUBLISH")
        .arg("presence-events:{alice}")
        .arg(json!({"user": "alice", "contacts_changed": true}).to_string())
        .ignore()
        .query_async(&mut c)
        .await
        .unwrap();
    for (status, text) in [("busy", "secret"), ("away", "public")] {
        alice
            .send(json!({"type": "status", "status": status, "text": text}))
            .await;
    }
    // The barrier: alice shows herself to everyone, which bob hears.
    alice
        .send(json!({"type": "privacy", "online": "everyone"}))
        .await;
    let mut heard = Vec::new();
    loop {
        let v = bob.recv().await;
        if v["type"] != "presence" || v["user"] != "alice" {
            continue;
        }
        if v["text"] == "public" {
            break;
        }
        heard.push(v);
    }
    assert!(
        heard.iter().all(|v| v["status"] == "offline"),
        "bob, no longer a contact, heard: {heard:?}"
    );
    assert!(
        !heard.is_empty(),
        "bob was not told alice went offline to him"
    );
}
