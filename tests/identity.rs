//! Tokens as identity providers issue them: audience, issuer and `nbf`;
//! keys from a JWKS document (served here by a local HTTP server) with
//! rotation and unknown `kid`s; provider-style user ids; another user claim.

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use common::*;
use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const SECRET: &str = "0123456789abcdef0123456789abcdef-test-secret";

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// An HS256 token with these claims.
fn hs(claims: Value) -> String {
    encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(SECRET.as_bytes()),
    )
    .unwrap()
}

/// Status of a WebSocket handshake (101 when it upgrades).
async fn handshake(url: &str) -> u16 {
    match tokio_tungstenite::connect_async(url).await {
        Ok(_) => 101,
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => resp.status().as_u16(),
        Err(e) => panic!("{url}: {e}"),
    }
}

/// Status of a handshake with `token` in the query string.
async fn connect_with(node: &Node, token: &str) -> u16 {
    handshake(&format!("ws://{}/ws?device=d&token={token}", node.addr)).await
}

fn jwt_node(redis: &Redis, extra: &[&str]) -> Node {
    let mut args = vec!["--auth", "jwt", "--jwt-secret", SECRET];
    args.extend(extra);
    Node::start_with(redis, "n1", &args)
}

#[tokio::test]
async fn audience_is_checked_only_when_configured() {
    let redis = Redis::start();
    let exp = now() + 600;
    // No --jwt-audience: whatever `aud` a provider put in passes.
    let node = jwt_node(&redis, &[]);
    for aud in [json!("https://api.example.com"), json!(["a", "b"])] {
        let t = hs(json!({"sub": "alice", "exp": exp, "aud": aud}));
        assert_eq!(connect_with(&node, &t).await, 101, "aud {aud}");
    }
    drop(node);

    let node = jwt_node(
        &redis,
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
    let node = jwt_node(&redis, &[]);
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
    let node = jwt_node(&redis, &["--jwt-user-claim", "user_id"]);
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

/// A private key made by the openssl CLI, its algorithm, and its public JWK
/// with `kid`.
struct Key {
    encoding: EncodingKey,
    alg: Algorithm,
    jwk: Jwk,
}

impl Key {
    fn generate(dir: &Path, alg: Algorithm, kid: &str) -> Self {
        let path = dir.join(format!("{kid}.pem"));
        let spec: &[&str] = match alg {
            Algorithm::RS256 => &["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"],
            Algorithm::ES256 => &["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"],
            Algorithm::EdDSA => &["-algorithm", "ed25519"],
            _ => unreachable!(),
        };
        let ok = std::process::Command::new("openssl")
            .arg("genpkey")
            .args(spec)
            .arg("-out")
            .arg(&path)
            .status()
            .expect("openssl must be installed")
            .success();
        assert!(ok, "openssl could not make a {alg:?} key");
        let pem = std::fs::read(&path).unwrap();
        let encoding = match alg {
            Algorithm::RS256 => EncodingKey::from_rsa_pem(&pem),
            Algorithm::ES256 => EncodingKey::from_ec_pem(&pem),
            _ => EncodingKey::from_ed_pem(&pem),
        }
        .unwrap();
        let mut jwk = Jwk::from_encoding_key(&encoding, alg).unwrap();
        jwk.common.key_id = Some(kid.to_string());
        Self { encoding, alg, jwk }
    }

    /// A token for `sub` signed with this key, naming `kid`.
    fn token_as(&self, kid: &str, sub: &str) -> String {
        let mut header = Header::new(self.alg);
        header.kid = Some(kid.to_string());
        encode(
            &header,
            &json!({
                "sub": sub, "exp": now() + 600,
                "aud": "presence", "iss": "https://tenant.example.com/",
            }),
            &self.encoding,
        )
        .unwrap()
    }

    fn token(&self, sub: &str) -> String {
        let kid = self.jwk.common.key_id.clone().unwrap();
        self.token_as(&kid, sub)
    }
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
    for key in [&rsa, &ec, &ed] {
        assert_eq!(
            connect_with(&node, &key.token("auth0|alice")).await,
            101,
            "{:?}",
            key.alg
        );
    }
    // A known kid is served from the cache.
    assert_eq!(jwks.fetches(), 1);
    // The right kid with another key's signature is refused.
    assert_eq!(
        connect_with(&node, &next.token_as("rsa-1", "alice")).await,
        401
    );

    // Unknown kids: refused, and a flood of them costs the provider at
    // most one fetch per refetch period, not one per token.
    let started = std::time::Instant::now();
    for i in 0..30 {
        let forged = next.token_as(&format!("forged-{i}"), "alice");
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
    let token = next.token("auth0|alice");
    wait_until("a token with the rotated-in kid", DEADLINE, || {
        let token = token.clone();
        let node = &node;
        async move { connect_with(node, &token).await == 101 }
    })
    .await;
    // The retired key no longer verifies.
    assert_eq!(connect_with(&node, &rsa.token("auth0|alice")).await, 401);
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
