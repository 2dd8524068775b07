//! Tokens as identity providers issue them: audience, issuer and `nbf`;
//! keys from a JWKS document (served here by a local HTTP server) with
//! rotation and unknown `kid`s; provider-style user ids; another user claim.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::common::jwt::{connect_with, hs, jwt_node, now, token_for, Key, SECRET};
use crate::common::*;
use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::Algorithm;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test]
async fn audience_is_checked_only_when_configured() {
    let redis = Redis::start();
    let exp = now() + 600;
    // No --jwt-audience: whatever `aud` a provider put in passes.
    let node = jwt_node(&redis, "n1", &[]);
    for aud in [json!("https://api.example.com"), json!(["a", "b"])] {
        let t = hs(json!({"sub": "alice", "exp": exp, "aud": aud}));
        assert_eq!(connect_with(&node, &t).await, 101, "aud {aud}");
    }
    drop(node);

    let node = jwt_node(
        &redis,
        "n1",
        &[
            "--jwt-audience",
            "https://api.example.com,presence",
            "--jwt-issuer",
            "https://tenant.example.com/",
        ],
    );
    let iss = "https://tenant.example.com/";
    let cases = [
        ("one audience", json!({"aud": "presence", "iss": iss}), 101),
        (
            "array holding one",
            json!({"aud": ["other", "https://api.example.com"], "iss": iss}),
            101,
        ),
        ("wrong audience", json!({"aud": "other", "iss": iss}), 401),
        ("no audience", json!({"iss": iss}), 401),
        (
            "wrong issuer",
            json!({"aud": "presence", "iss": "https://evil.example.com/"}),
            401,
        ),
        ("no issuer", json!({"aud": "presence"}), 401),
    ];
    for (what, mut claims, want) in cases {
        claims["sub"] = json!("alice");
        claims["exp"] = json!(exp);
        assert_eq!(connect_with(&node, &hs(claims)).await, want, "{what}");
    }
}

#[tokio::test]
async fn not_before_is_enforced_with_the_leeway() {
    let redis = Redis::start();
    let node = jwt_node(&redis, "n1", &[]);
    let t = |nbf: u64| hs(json!({"sub": "alice", "exp": now() + 3600, "nbf": nbf}));
    // Valid only 50 min from now.
    assert_eq!(connect_with(&node, &t(now() + 3000)).await, 401);
    // Past, or within the 60 s leeway for clock skew.
    assert_eq!(connect_with(&node, &t(now() - 10)).await, 101);
    assert_eq!(connect_with(&node, &t(now() + 30)).await, 101);
}

#[tokio::test]
async fn another_claim_can_name_the_user() {
    let redis = Redis::start();
    let node = jwt_node(&redis, "n1", &["--jwt-user-claim", "user_id"]);
    let t = hs(json!({"sub": "auth0|1", "user_id": "u-42", "exp": now() + 600}));
    let url = format!("ws://{}/ws?device=d&token={t}", node.addr);
    let mut c = Client::connect_raw(&url, "u-42", "d").await.unwrap();
    assert_eq!(c.expect("hello").await["user"], "u-42");
    let no_claim = hs(json!({"sub": "alice", "exp": now() + 600}));
    assert_eq!(connect_with(&node, &no_claim).await, 401);
}

/// Ids as Auth0, Google and friends write them work end to end: socket,
/// watch, REST, bulk and online list, and the Redis keys parse back.
#[tokio::test]
async fn provider_subjects_are_users() {
    let redis = Redis::start();
    let node = Node::start(&redis, "n1");
    let alice = "auth0|64f1c0ffee0123456789abcd";
    let bob = "google-oauth2|1234567890";
    let enc = |s: &str| s.replace('|', "%7C").replace('+', "%2B");
    let url = |u: &str, d: &str| format!("ws://{}/ws?user={}&device={}", node.addr, enc(u), enc(d));
    let mut a = Client::connect_raw(&url(alice, "phone|1"), alice, "phone|1")
        .await
        .unwrap();
    assert_eq!(a.expect("hello").await["user"], alice);
    let snap = a.watch(&[bob]).await;
    assert_eq!(snap[0]["status"], "offline");
    let mut b = Client::connect_raw(&url(bob, "tab+2"), bob, "tab+2")
        .await
        .unwrap();
    assert_eq!(b.expect("hello").await["device"], "tab+2");
    a.expect_presence(bob, "online").await;

    let (status, body) = get(&format!("{}/api/presence/{}", node.http(), enc(bob))).await;
    assert_eq!((status, body["status"].as_str()), (200, Some("online")));
    assert_eq!(body["device_list"][0]["device"], "tab+2", "{body}");
    let (status, body) = post(
        &format!("{}/api/presence/query", node.http()),
        &json!({"users": [alice, bob]}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(body["presence"][0]["user"], alice);
    assert_eq!(body["presence"][1]["status"], "online");
    let (_, body) = get(&format!("{}/api/online", node.http())).await;
    let mut online: Vec<&str> = body["users"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["user"].as_str().unwrap())
        .collect();
    online.sort();
    assert_eq!(online, [alice, bob]);
    let mut conn = redis.aconn().await;
    let lease: Option<String> = redis::cmd("GET")
        .arg(format!("presence:{{{bob}}}:tab+2"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(lease.is_some());

    // Still refused: what would break a key, and ids past 128 bytes.
    for bad in ["a%3Ab", "%7Ba%7D", "a%20b", "a%22b", &"x".repeat(129)] {
        let (status, body) = get(&format!("{}/api/presence/{bad}", node.http())).await;
        assert_eq!(status, 400, "{bad}: {body}");
    }
    let (status, _) = get(&format!("{}/api/presence/{}", node.http(), "x".repeat(128))).await;
    assert_eq!(status, 200);
    b.close().await;
    a.expect_presence(bob, "offline").await;
}

/// A JWKS document served over plain HTTP on loopback (which the server
/// allows only for loopback hosts); counts the fetches.
struct JwksServer {
    url: String,
    body: Arc<Mutex<String>>,
    fetches: Arc<AtomicUsize>,
}

impl JwksServer {
    async fn start(keys: &[Jwk]) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!(
            "http://{}/.well-known/jwks.json",
            listener.local_addr().unwrap()
        );
        let body = Arc::new(Mutex::new(String::new()));
        let fetches = Arc::new(AtomicUsize::new(0));
        let (b, f) = (body.clone(), fetches.clone());
        tokio::spawn(async move {
            loop {
                let Ok((mut sock, _)) = listener.accept().await else {
                    return;
                };
                let (b, f) = (b.clone(), f.clone());
                tokio::spawn(async move {
                    let mut req = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                        match sock.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => req.extend_from_slice(&buf[..n]),
                        }
                    }
                    f.fetch_add(1, Ordering::SeqCst);
                    let body = b.lock().unwrap().clone();
                    let resp = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = sock.write_all(resp.as_bytes()).await;
                    let _ = sock.shutdown().await;
                });
            }
        });
        let server = Self { url, body, fetches };
        server.publish(keys);
        server
    }

    fn publish(&self, keys: &[Jwk]) {
        let set = JwkSet {
            keys: keys.to_vec(),
        };
        *self.body.lock().unwrap() = serde_json::to_string(&set).unwrap();
    }

    fn fetches(&self) -> usize {
        self.fetches.load(Ordering::SeqCst)
    }
}

/// A token for `sub` as an identity provider issues it (the audience and
/// issuer the JWKS node checks), signed with `key` and naming `kid`.
fn provider_token(key: &Key, kid: &str, sub: &str) -> String {
    key.sign(
        Some(kid),
        &json!({
            "sub": sub, "exp": now() + 600,
            "aud": "presence", "iss": "https://tenant.example.com/",
        }),
    )
}

// Multi-threaded: the JWKS server task must answer while the test thread
// blocks on the node's start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jwks_keys_verify_rotate_and_unknown_kids_are_rate_limited() {
    let dir = tempfile::tempdir().unwrap();
    let rsa = Key::generate(dir.path(), Algorithm::RS256, "rsa-1");
    let ec = Key::generate(dir.path(), Algorithm::ES256, "ec-1");
    let ed = Key::generate(dir.path(), Algorithm::EdDSA, "ed-1");
    let next = Key::generate(dir.path(), Algorithm::RS256, "rsa-2");
    let jwks = JwksServer::start(&[rsa.jwk.clone(), ec.jwk.clone(), ed.jwk.clone()]).await;
    let redis = Redis::start();
    let node = Node::start_with(
        &redis,
        "n1",
        &[
            "--auth",
            "jwt",
            "--jwt-jwks-url",
            &jwks.url,
            "--jwt-audience",
            "presence",
            "--jwt-issuer",
            "https://tenant.example.com/",
            "--jwt-jwks-refetch-min-ms",
            "1000",
        ],
    );
    assert_eq!(jwks.fetches(), 1, "fetched once at start");
    let fetched_at = std::time::Instant::now();
    for key in [&rsa, &ec, &ed] {
        assert_eq!(
            connect_with(&node, &provider_token(key, key.kid(), "auth0|alice")).await,
            101,
            "{:?}",
            key.alg
        );
    }
    // A known kid is served from the cache.
    assert_eq!(jwks.fetches(), 1);
    // The right kid with another key's signature is refused.
    assert_eq!(
        connect_with(&node, &provider_token(&next, "rsa-1", "alice")).await,
        401
    );

    // Unknown kids: refused, and a flood of them costs the provider at
    // most one fetch per refetch period, not one per token. The flood
    // starts once the start's fetch is a period old, so that its first
    // unknown kid may refetch (on a fast run it came within the period,
    // and no refetch at all was right).
    tokio::time::sleep_until((fetched_at + std::time::Duration::from_millis(1100)).into()).await;
    let started = std::time::Instant::now();
    for i in 0..30 {
        let forged = provider_token(&next, &format!("forged-{i}"), "alice");
        assert_eq!(connect_with(&node, &forged).await, 401);
    }
    let periods = started.elapsed().as_millis() as usize / 1000 + 1;
    let refetches = jwks.fetches() - 1;
    assert!(
        (1..=periods).contains(&refetches),
        "{refetches} refetches for 30 unknown kids in {:?}",
        started.elapsed()
    );

    // The provider rotates: rsa-1 goes, rsa-2 comes. A token with the new
    // kid is accepted as soon as the refetch period allows a fetch.
    jwks.publish(&[next.jwk.clone(), ec.jwk.clone()]);
    let token = provider_token(&next, next.kid(), "auth0|alice");
    wait_until("a token with the rotated-in kid", DEADLINE, || {
        let token = token.clone();
        let node = &node;
        async move { connect_with(node, &token).await == 101 }
    })
    .await;
    // The retired key no longer verifies.
    assert_eq!(
        connect_with(&node, &provider_token(&rsa, rsa.kid(), "auth0|alice")).await,
        401
    );
}

#[tokio::test]
async fn jwks_url_must_be_https_off_loopback() {
    let redis = Redis::start();
    let args: Vec<String> = [
        "--listen",
        "127.0.0.1:0",
        "--redis-url",
        &redis.url,
        "--auth",
        "jwt",
        "--jwt-jwks-url",
        "http://idp.example.com/.well-known/jwks.json",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let logs = match Node::spawn("n1", &args, &[]) {
        Ok(_) => panic!("plain http JWKS URL accepted"),
        Err(logs) => logs,
    };
    assert!(logs.contains("https://"), "{logs}");
}

/// A JWT node that waits `auth_timeout_ms` for a first-frame token.
fn first_frame_node(redis: &Redis, extra: &[&str]) -> Node {
    let mut args = vec!["--auth-timeout-ms", "1000"];
    args.extend(extra);
    jwt_node(redis, "n1", &args)
}

/// Connects to `/ws?<query>` without a token on the handshake.
async fn bare(node: &Node, query: &str) -> Client {
    Client::connect_raw(&format!("ws://{}/ws?{query}", node.addr), "?", "d")
        .await
        .unwrap()
}

#[tokio::test]
async fn the_token_can_be_the_first_frame() {
    let redis = Redis::start();
    let node = first_frame_node(&redis, &[]);
    let mut c = bare(&node, "device=d").await;
    c.send(json!({"type": "auth", "token": token_for("auth0|alice", 600)}))
        .await;
    let hello = c.expect("hello").await;
    assert_eq!(hello["user"], "auth0|alice");
    assert_eq!(c.watch(&["bob"]).await[0]["status"], "offline");
    wait_until("alice counted", DEADLINE, || async {
        count(&redis, "auth0|alice").await == 1
    })
    .await;

    // No frame in time, another frame first, a bad token, or a token for
    // another user than the handshake asked for: closed with 1008.
    let mut silent = bare(&node, "device=s").await;
    let cases: Vec<(&str, Option<Value>, &str)> = vec![
        (
            "other frame first",
            Some(json!({"type": "watch", "users": ["bob"]})),
            "device=o",
        ),
        (
            "bad token",
            Some(json!({"type": "auth", "token": "not.a.jwt"})),
            "device=b",
        ),
        (
            "expired token",
            Some(json!({"type": "auth", "token": hs(json!({"sub": "alice", "exp": now() - 600}))})),
            "device=e",
        ),
        (
            "token for another user",
            Some(json!({"type": "auth", "token": token_for("alice", 600)})),
            "device=m&user=bob",
        ),
    ];
    for (what, frame, query) in cases {
        let mut c = bare(&node, query).await;
        c.send(frame.unwrap()).await;
        let closed = c.expect_closed().await;
        assert_eq!(closed.map(|c| c.0), Some(1008), "{what}");
    }
    let closed = silent.expect_closed().await;
    assert_eq!(closed.as_ref().map(|c| c.0), Some(1008), "{closed:?}");
    // None of them claimed a lease.
    assert_eq!(count(&redis, "alice").await, 0);
    assert_eq!(count(&redis, "bob").await, 0);
}

/// Handshake with `Sec-WebSocket-Protocol: <protocols>`; the protocol the
/// server answered with and the client.
async fn with_protocols(node: &Node, protocols: &str) -> (Option<String>, Client) {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let mut req = format!("ws://{}/ws?device=p", node.addr)
        .into_client_request()
        .unwrap();
    req.headers_mut()
        .insert("sec-websocket-protocol", protocols.parse().unwrap());
    let (ws, resp) = tokio_tungstenite::connect_async(req)
        .await
        .expect("handshake");
    let answered = resp
        .headers()
        .get("sec-websocket-protocol")
        .map(|v| v.to_str().unwrap().to_string());
    (answered, Client::from_stream(ws, "?", "p"))
}

#[tokio::test]
async fn the_token_can_be_the_websocket_protocol() {
    use base64::Engine as _;
    let redis = Redis::start();
    let node = first_frame_node(&redis, &[]);
    let token = token_for("alice", 600);
    // As browsers can send it: new WebSocket(url, ["presence", token]).
    let (answered, mut c) = with_protocols(&node, &format!("presence, {token}")).await;
    assert_eq!(answered.as_deref(), Some("presence"));
    assert_eq!(c.expect("hello").await["user"], "alice");
    // As Kubernetes clients send it.
    let k8s = format!(
        "base64url.bearer.authorization.k8s.io.{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(token_for("bob", 600))
    );
    let (answered, mut c) = with_protocols(&node, &k8s).await;
    assert_eq!(answered.as_deref(), Some(k8s.as_str()));
    assert_eq!(c.expect("hello").await["user"], "bob");
    // A bad one is refused before the upgrade.
    let forged = format!("presence, {}x", &token[..token.len() - 1]);
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let mut req = format!("ws://{}/ws?device=p", node.addr)
        .into_client_request()
        .unwrap();
    req.headers_mut()
        .insert("sec-websocket-protocol", forged.parse().unwrap());
    match tokio_tungstenite::connect_async(req).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => assert_eq!(r.status(), 401),
        other => panic!("forged protocol token: {:?}", other.map(|_| ())),
    }
}

#[tokio::test]
async fn logs_never_hold_a_token() {
    let redis = Redis::start();
    let args: Vec<String> = [
        "--listen",
        "127.0.0.1:0",
        "--redis-url",
        &redis.url,
        "--node-id",
        "n1",
        "--auth",
        "jwt",
        "--jwt-secret",
        SECRET,
        "--auth-timeout-ms",
        "1000",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    // Everything every crate logs, at its most verbose.
    let node = Node::spawn("n1", &args, &[("RUST_LOG", "trace")]).expect("node starts");
    let mut tokens = Vec::new();
    let mut fresh = |sub: &str, exp: u64| {
        let t = hs(json!({"sub": sub, "exp": exp}));
        tokens.push(t.clone());
        t
    };
    let (query, first, refresh, expired, mismatch) = (
        fresh("q", now() + 600),
        fresh("f", now() + 600),
        fresh("f", now() + 900),
        fresh("x", now() - 600),
        fresh("y", now() + 600),
    );
    let mut c = Client::connect_raw(
        &format!("ws://{}/ws?device=d&token={query}", node.addr),
        "q",
        "d",
    )
    .await
    .unwrap();
    c.expect("hello").await;
    let mut c = bare(&node, "device=d").await;
    c.send(json!({"type": "auth", "token": first})).await;
    c.expect("hello").await;
    c.send(json!({"type": "auth", "token": refresh})).await;
    c.send(json!({"type": "auth", "token": mismatch})).await;
    assert_eq!(c.expect("error").await["code"], "forbidden");
    assert_eq!(
        connect_with(&node, &expired).await,
        401,
        "expired token in the query"
    );
    let (status, _) = get(&format!("{}/api/presence/q?token={expired}", node.http())).await;
    assert_eq!(status, 401);
    let mut bad = bare(&node, "device=b").await;
    bad.send(json!({"type": "auth", "token": expired})).await;
    bad.expect_closed().await;
    node.wait_log("auth frame refused").await;
    let logs = node.logs();
    for t in &tokens {
        // The signature alone is what makes a token usable.
        let sig = t.rsplit('.').next().unwrap();
        assert!(!logs.contains(sig), "a token is in the log:\n{logs}");
    }
}

#[tokio::test]
async fn sessions_close_when_their_token_expires_unless_refreshed() {
    let redis = Redis::start();
    let node = first_frame_node(
        &redis,
        &["--jwt-leeway-secs", "0", "--auth-expiring-ms", "1500"],
    );
    let mut watcher = bare(&node, "device=w").await;
    watcher
        .send(json!({"type": "auth", "token": token_for("watcher", 600)}))
        .await;
    watcher.expect("hello").await;
    watcher.watch(&["alice", "bob"]).await;

    // alice's token runs out: a warning first, then 4401.
    let mut alice = bare(&node, "device=a").await;
    alice
        .send(json!({"type": "auth", "token": token_for("alice", 3)}))
        .await;
    alice.expect("hello").await;
    watcher.expect_presence("alice", "online").await;
    let warn = alice.expect("auth_expiring").await;
    let in_ms = warn["in_ms"].as_u64().unwrap();
    assert!(in_ms <= 1500, "{warn}");
    let closed = alice.expect_closed().await;
    assert_eq!(closed, Some((4401, "token expired".to_string())));
    watcher.expect_presence("alice", "offline").await;

    // A token already inside the warning window: hello first, then the
    // warning, then the close.
    let mut carol = bare(&node, "device=c").await;
    carol
        .send(json!({"type": "auth", "token": token_for("carol", 1)}))
        .await;
    carol.expect("hello").await;
    carol.expect("auth_expiring").await;
    assert_eq!(carol.expect_closed().await.map(|c| c.0), Some(4401));

    // bob sends a fresh token when warned and stays; a token for someone
    // else is refused without ending the session.
    let exp = now() + 3;
    let mut bob = bare(&node, "device=b").await;
    bob.send(json!({"type": "auth", "token": hs(json!({"sub": "bob", "exp": exp}))}))
        .await;
    bob.expect("hello").await;
    watcher.expect_presence("bob", "online").await;
    bob.expect("auth_expiring").await;
    bob.send(json!({"type": "auth", "token": token_for("carol", 600)}))
        .await;
    assert_eq!(bob.expect("error").await["code"], "forbidden");
    bob.send(json!({"type": "auth", "token": token_for("bob", 600)}))
        .await;
    // Past the first token's expiry, bob is still connected and answered.
    let past = UNIX_EPOCH + std::time::Duration::from_millis(exp * 1000 + 500);
    while SystemTime::now() < past {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    bob.send(json!({"type": "watch", "users": ["alice"]})).await;
    assert_eq!(bob.expect("snapshot").await["presence"][0]["user"], "alice");
    assert_eq!(count(&redis, "bob").await, 1);
    assert!(watcher.try_next().is_none(), "bob flickered");
}

#[tokio::test]
async fn internal_listen_keeps_operations_off_the_public_port() {
    let redis = Redis::start();
    let node = Node::start_with(
        &redis,
        "n1",
        &["--internal-listen", "127.0.0.1:0", "--admin-key", ADMIN],
    );
    let public = node.http();
    let internal = internal_addr(&node);
    let http = reqwest::Client::new();
    let status = |r: reqwest::Response| r.status().as_u16();
    let _alice = Client::connect(&node, "alice", "d").await;

    // Public: no metrics, no health, no admin API, and the admin key is
    // worth nothing there.
    for path in ["/metrics", "/healthz", "/api/users/alice/contacts"] {
        let r = http
            .get(format!("{public}{path}"))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap();
        assert_eq!(status(r), 404, "public {path}");
    }
    let r = http
        .put(format!("{public}/api/users/alice/contacts"))
        .bearer_auth(ADMIN)
        .json(&json!({"contacts": ["bob"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(status(r), 404);
    // Privacy stays on the public port for the user itself (dev auth: anyone),
    // but the admin key is not what lets a call through there.
    let (code, body) = get(&format!("{public}/api/presence/alice")).await;
    assert_eq!((code, body["status"].as_str()), (200, Some("online")));

    // Internal: all of them, and nothing of the client API.
    let r = http
        .get(format!("{internal}/metrics"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert!(r.text().await.unwrap().contains("presence_"));
    let (code, body) = get(&format!("{internal}/healthz")).await;
    assert_eq!((code, body["redis"].as_str()), (200, Some("up")), "{body}");
    let r = http
        .put(format!("{internal}/api/users/alice/contacts"))
        .bearer_auth(ADMIN)
        .json(&json!({"contacts": ["bob"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(status(r), 200);
    let r = http
        .put(format!("{internal}/api/users/alice/privacy"))
        .bearer_auth(ADMIN)
        .json(&json!({"last_seen": "contacts"}))
        .send()
        .await
        .unwrap();
    assert_eq!(status(r), 204);
    for path in [
        "/api/presence/alice",
        "/api/online",
        "/",
        "/ws?user=a&device=d",
    ] {
        let (code, _) = get(&format!("{internal}{path}")).await;
        assert_eq!(code, 404, "internal {path}");
    }

    // Without --internal-listen everything stays on the one port.
    let plain = Node::start(&redis, "n2");
    let (code, _) = get(&format!("{}/healthz", plain.http())).await;
    assert_eq!(code, 200);
}

/// A session whose first-frame token is verified after SIGTERM joins the
/// registry after it told every session to go: it is told too (1001), like
/// the others, instead of claiming a lease on a node going away and being
/// cut without a close frame when the drain ends.
#[tokio::test]
async fn a_session_authenticated_after_sigterm_is_told_to_go() {
    let redis = Redis::start();
    let mut node = first_frame_node(&redis, &[]);
    let mut c = bare(&node, "device=d").await;
    unsafe {
        libc::kill(node.pid() as i32, libc::SIGTERM);
    }
    node.wait_log("shutting down: closed 0 sessions").await;
    c.send(json!({"type": "auth", "token": token_for("alice", 600)}))
        .await;
    let closed = c.expect_closed().await;
    assert_eq!(closed.map(|c| c.0), Some(1001), "{}", node.logs());
    assert!(node.wait_exit(DEADLINE).await.is_some(), "node exits");
}
