//! Rooms under `--room-policy token` (issue 38): a room token from the
//! app's backend in the join frame, verified like a connection token and
//! bound to one user and one room exactly; fresh ones in `room_token`
//! frames; `room_token_expiring` before the end; the device out of the
//! room, with `token_expired`, when its token lapses; and the HTTP reads
//! with a `Room-Token` header. Real Redis, real nodes, real clients.

use std::time::Duration;

use base64::Engine as _;
use serde_json::{json, Value};

use crate::common::cluster::Cluster;
use jsonwebtoken::Algorithm;

use crate::common::jwt::{connect_with, hs, now, sign, token, Key, SECRET};
use crate::common::*;
use crate::rooms::{expect_event, expect_quiet, members, next_of};

/// The flags of these tests' nodes: `chat:` rooms take room tokens, the
/// others are open; no leeway, and the warning a second before the end,
/// so that tokens of a few seconds do.
const FLAGS: [&str; 12] = [
    "--jwt-leeway-secs",
    "0",
    "--room-token-expiring-ms",
    "1000",
    "--room-policy",
    "chat:*=token",
    "--room-policy",
    "*=open",
    "--admin-key",
    ADMIN,
    "--auth",
    "jwt",
];

/// A node of these tests on `redis`.
fn node(redis: &Redis, id: &str) -> Node {
    let mut flags = FLAGS.to_vec();
    flags.extend(["--jwt-secret", SECRET]);
    Node::start_with(redis, id, &flags)
}

/// A room token of `user` for `room`, valid for `secs` seconds.
fn room_token(user: &str, room: &str, secs: u64) -> String {
    hs(json!({"sub": user, "room": room, "exp": now() + secs}))
}

/// `user`/`device` connected to `node` with a connection token.
async fn connect(node: &Node, user: &str, device: &str) -> Client {
    let url = format!(
        "ws://{}/ws?device={device}&token={}",
        node.addr,
        token(user)
    );
    let mut c = Client::connect_raw(&url, user, device).await.unwrap();
    let hello = c.expect("hello").await;
    assert_eq!(hello["user"], user);
    c
}

/// Joins `room` with `token`: the `room` frame.
async fn join_with(c: &mut Client, room: &str, token: &str) -> Value {
    c.send(json!({"type": "join", "room": room, "token": token}))
        .await;
    let frame = next_of(c, "room").await;
    assert_eq!(frame["room"], room, "{frame}");
    frame
}

/// The error the next frame must be, about `room`.
async fn error_in(c: &mut Client, room: &str) -> Value {
    let e = c.expect("error").await;
    assert_eq!(e["room"], room, "{e}");
    e
}

/// Every key in Redis that names `room`.
async fn room_keys(redis: &Redis, room: &str) -> Vec<String> {
    let mut c = redis.aconn().await;
    redis::cmd("KEYS")
        .arg(format!("*{room}*"))
        .query_async(&mut c)
        .await
        .unwrap()
}

/// An unsigned token (`alg: none`) with `claims`.
fn unsigned(claims: &Value) -> String {
    let b64 = |v: &Value| {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string().as_bytes())
    };
    format!(
        "{}.{}.",
        b64(&json!({"alg": "none", "typ": "JWT"})),
        b64(claims)
    )
}

/// Every bad room token is refused with `forbidden`, naming the room and
/// saying why, and leaves nothing in Redis; a good one lets the user in.
/// A `room_token` frame for a room the device is not in, or for a room of
/// another policy, is an error; a room token does not open a connection.
#[tokio::test]
async fn bad_room_tokens_are_refused_and_write_nothing() {
    let redis = Redis::start();
    let node = node(&redis, "n1");
    let mut alice = connect(&node, "alice", "web").await;
    let exp = now() + 60;
    let room = "chat:1";
    let cases: Vec<(&str, Option<String>, &str)> = vec![
        ("no token", None, "takes a room token"),
        (
            "another user's",
            Some(hs(json!({"sub": "bob", "room": room, "exp": exp}))),
            "for user \"bob\", not \"alice\"",
        ),
        (
            "another room's",
            Some(room_token("alice", "chat:2", 60)),
            "not \"chat:1\"",
        ),
        (
            "a prefix",
            Some(room_token("alice", "chat:*", 60)),
            "never a prefix",
        ),
        (
            "a prefix of the id",
            Some(room_token("alice", "chat:", 60)),
            "not \"chat:1\"",
        ),
        (
            "a list",
            Some(hs(json!({"sub": "alice", "room": [room], "exp": exp}))),
            "list",
        ),
        (
            "expired",
            Some(hs(json!({"sub": "alice", "room": room, "exp": now() - 30}))),
            "expired",
        ),
        (
            "a bad signature",
            Some(sign(
                "another-secret-of-at-least-32-bytes-long",
                &json!({"sub": "alice", "room": room, "exp": exp}),
            )),
            "signature",
        ),
        (
            "alg none",
            Some(unsigned(&json!({"sub": "alice", "room": room, "exp": exp}))),
            "\"none\"",
        ),
        (
            "no exp",
            Some(hs(json!({"sub": "alice", "room": room}))),
            "\"exp\"",
        ),
        (
            "a connection token",
            Some(token("alice")),
            "no \"room\" claim",
        ),
    ];
    for (what, token, says) in cases {
        let mut frame = json!({"type": "join", "room": room, "state": {"x": 1}});
        if let Some(t) = token {
            frame["token"] = json!(t);
        }
        alice.send(frame).await;
        let e = error_in(&mut alice, room).await;
        assert_eq!(e["code"], "forbidden", "{what}: {e}");
        let message = e["message"].as_str().unwrap();
        assert!(message.contains(says), "{what}: {message}");
        assert_eq!(
            room_keys(&redis, room).await,
            Vec::<String>::new(),
            "{what}"
        );
    }
    // Refused, the device is not in the room.
    alice
        .send(json!({"type": "signal", "room": room, "data": 1}))
        .await;
    assert_eq!(error_in(&mut alice, room).await["code"], "not_in_room");
    alice
        .send(json!({"type": "room_token", "room": room, "token": room_token("alice", room, 60)}))
        .await;
    assert_eq!(error_in(&mut alice, room).await["code"], "not_in_room");
    alice
        .send(json!({"type": "room_token", "room": "lobby", "token": room_token("alice", "lobby", 60)}))
        .await;
    assert_eq!(error_in(&mut alice, "lobby").await["code"], "bad_request");
    // A good one lets in; an open room needs none.
    let frame = join_with(&mut alice, room, &room_token("alice", room, 60)).await;
    assert_eq!(members(&frame), ["alice:web"]);
    let frame = join_with(&mut alice, "lobby", "").await;
    assert_eq!(members(&frame), ["alice:web"]);
    // A room token is not a connection token.
    let status = connect_with(&node, &room_token("alice", room, 60)).await;
    assert_eq!(status, 401);
}

/// A fresh `room_token` keeps the device in past its first token's end; a
/// bad one is refused and the device leaves. `room_token_expiring`
/// comes before each end; at the end the device leaves (the other member
/// sees `room_leave` once) and is told `token_expired`.
#[tokio::test]
async fn a_fresh_room_token_keeps_the_device_in_and_expiry_leaves() {
    let redis = Redis::start();
    let node = node(&redis, "n1");
    let room = "chat:7";
    let mut alice = connect(&node, "alice", "web").await;
    join_with(&mut alice, room, &room_token("alice", room, 600)).await;
    let mut bob = connect(&node, "bob", "phone").await;
    let first_exp = now() + 3;
    let first = hs(json!({"sub": "bob", "room": room, "exp": first_exp}));
    join_with(&mut bob, room, &first).await;
    expect_event(&mut alice, "room_join", room, "bob", "phone").await;

    // Warned before the end, with the moment.
    let warn = bob.expect("room_token_expiring").await;
    assert_eq!(
        (warn["room"].as_str(), warn["expires_at"].as_i64()),
        (Some(room), Some(first_exp as i64 * 1000)),
        "{warn}"
    );
    assert!(now_ms() < first_exp as i64 * 1000, "warned late: {warn}");
    // A good one, before the end.
    let second_exp = first_exp + 3;
    let second = hs(json!({"sub": "bob", "room": room, "exp": second_exp}));
    bob.send(json!({"type": "room_token", "room": room, "token": second}))
        .await;
    // Past the first end: still in, nobody saw it leave.
    let past_first =
        Duration::from_millis((first_exp as i64 * 1000 + 500 - now_ms()).max(0) as u64);
    expect_quiet(&mut alice, past_first).await;
    bob.send(json!({"type": "signal", "room": room, "data": "in past the first"}))
        .await;
    assert_eq!(alice.expect("signal").await["data"], "in past the first");
    // Warned again about the second, then out.
    let warn = bob.expect("room_token_expiring").await;
    assert_eq!(warn["expires_at"], second_exp * 1000, "{warn}");
    let e = error_in(&mut bob, room).await;
    assert_eq!(e["code"], "token_expired", "{e}");
    let out_at = now_ms();
    assert!(
        out_at >= second_exp as i64 * 1000 && out_at < second_exp as i64 * 1000 + 2000,
        "out at {out_at}, the token ended at {}",
        second_exp * 1000
    );
    let left = expect_event(&mut alice, "room_leave", room, "bob", "phone").await;
    assert_eq!(left["last"], true, "{left}");
    expect_quiet(&mut alice, Duration::from_millis(500)).await;
    bob.send(json!({"type": "signal", "room": room, "data": 1}))
        .await;
    assert_eq!(error_in(&mut bob, room).await["code"], "not_in_room");
    // Joining again takes a fresh token.
    join_with(&mut bob, room, &room_token("bob", room, 60)).await;
    expect_event(&mut alice, "room_join", room, "bob", "phone").await;
    // A bad refresh: refused, and the device is out at once (as with a
    // connection token whose claim no longer covers the room), so that a
    // client that ends the room on `forbidden` agrees with the others.
    bob.send(json!({"type": "room_token", "room": room, "token": room_token("bob", "chat:8", 60)}))
        .await;
    let e = error_in(&mut bob, room).await;
    assert_eq!(e["code"], "forbidden", "{e}");
    let left = expect_event(&mut alice, "room_leave", room, "bob", "phone").await;
    assert_eq!(left["last"], true, "{left}");
    bob.send(json!({"type": "signal", "room": room, "data": 2}))
        .await;
    assert_eq!(error_in(&mut bob, room).await["code"], "not_in_room");
}

/// Two nodes: a member on node B sees the device that joined with a token
/// on node A, and the reverse; the HTTP reads take a `Room-Token` header
/// (repeated or comma-separated) of the reader, and the admin key none.
#[tokio::test]
async fn token_rooms_span_nodes_and_http_reads_take_the_header() {
    let redis = Redis::start();
    let a = node(&redis, "a");
    let b = node(&redis, "b");
    let (room, other) = ("chat:x", "chat:y");
    let mut alice = connect(&a, "alice", "web").await;
    join_with(&mut alice, room, &room_token("alice", room, 60)).await;
    let mut bob = connect(&b, "bob", "phone").await;
    let frame = join_with(&mut bob, room, &room_token("bob", room, 60)).await;
    assert_eq!(members(&frame), ["alice:web", "bob:phone"]);
    expect_event(&mut alice, "room_join", room, "bob", "phone").await;
    join_with(&mut bob, other, &room_token("bob", other, 60)).await;

    let bob_token = token("bob");
    let read = |base: String, room: &str, tokens: &[String]| {
        let url = format!("{base}/api/rooms/{room}");
        let mut req = reqwest::Client::new().get(url).bearer_auth(&bob_token);
        for t in tokens {
            req = req.header("Room-Token", t.as_str());
        }
        async move {
            let r = req.send().await.unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    };
    let (status, page) = read(b.http(), room, &[room_token("bob", room, 60)]).await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["users"], 2);
    for (what, tokens) in [
        ("no header", vec![]),
        ("another room's", vec![room_token("bob", other, 60)]),
        ("another user's", vec![room_token("alice", room, 60)]),
        ("a prefix", vec![room_token("bob", "chat:*", 60)]),
        (
            "expired",
            vec![hs(json!({"sub": "bob", "room": room, "exp": now() - 30}))],
        ),
    ] {
        let (status, body) = read(a.http(), room, &tokens).await;
        assert_eq!(status, 403, "{what}: {body}");
        assert_eq!(body["code"], "forbidden", "{what}: {body}");
    }
    // Repeated, among others.
    let tokens = [room_token("bob", other, 60), room_token("bob", room, 60)];
    let (status, _) = read(a.http(), room, &tokens).await;
    assert_eq!(status, 200);
    // The counts of two token rooms: both tokens in one header.
    let query = |tokens: String| {
        reqwest::Client::new()
            .post(format!("{}/api/rooms/query", a.http()))
            .bearer_auth(&bob_token)
            .header("Room-Token", tokens)
            .json(&json!({"rooms": [room, other, "lobby"]}))
            .send()
    };
    let both = format!(
        "{}, {}",
        room_token("bob", room, 60),
        room_token("bob", other, 60)
    );
    let r = query(both).await.unwrap();
    assert_eq!(r.status(), 200);
    let counts: Value = r.json().await.unwrap();
    assert_eq!(
        counts["rooms"],
        json!([
            {"room": room, "users": 2, "devices": 2},
            {"room": other, "users": 1, "devices": 1},
            {"room": "lobby", "users": 0, "devices": 0},
        ])
    );
    let r = query(room_token("bob", room, 60)).await.unwrap();
    assert_eq!(r.status(), 403, "one of the two rooms has no token");
    // The admin key reads any room.
    let (status, page) = get_as(&format!("{}/api/rooms/{room}", a.http()), Some(ADMIN)).await;
    assert_eq!((status, page["users"].clone()), (200, json!(2)), "{page}");
}

/// One device in two token rooms: each lapses at its own token's end (one
/// timer serves them all); a join again with a token replaces the room's
/// token as `room_token` does.
#[tokio::test]
async fn each_token_room_of_a_device_lapses_on_its_own() {
    let redis = Redis::start();
    let node = node(&redis, "n1");
    let (a, b) = ("chat:a", "chat:b");
    let mut alice = connect(&node, "alice", "web").await;
    join_with(&mut alice, a, &room_token("alice", a, 600)).await;
    join_with(&mut alice, b, &room_token("alice", b, 600)).await;
    let mut bob = connect(&node, "bob", "phone").await;
    let a_exp = now() + 2;
    join_with(
        &mut bob,
        a,
        &hs(json!({"sub": "bob", "room": a, "exp": a_exp})),
    )
    .await;
    join_with(&mut bob, b, &room_token("bob", b, 3)).await;
    // A join again of b with a later token, which replaces the first.
    let b_exp = now() + 5;
    join_with(
        &mut bob,
        b,
        &hs(json!({"sub": "bob", "room": b, "exp": b_exp})),
    )
    .await;
    let mut expired = Vec::new();
    while expired.len() < 2 {
        let v = bob.recv().await;
        if v["type"] == "error" {
            assert_eq!(v["code"], "token_expired", "{v}");
            expired.push((v["room"].as_str().unwrap().to_string(), now_ms()));
        }
    }
    assert_eq!(expired[0].0, a);
    assert!(expired[0].1 >= a_exp as i64 * 1000, "{expired:?}");
    assert_eq!(expired[1].0, b);
    assert!(expired[1].1 >= b_exp as i64 * 1000, "{expired:?}");
    // Alice saw each leave once, a before b.
    let mut lefts = Vec::new();
    while lefts.len() < 2 {
        let v = next_of(&mut alice, "room_leave").await;
        lefts.push(v["room"].as_str().unwrap().to_string());
    }
    assert_eq!(lefts, [a, b]);
    expect_quiet(&mut alice, Duration::from_millis(300)).await;
}

/// Redis restarts empty: the session joins its token room again on the
/// token it holds, without asking its client; the members are back.
#[tokio::test]
async fn the_sessions_own_rejoin_reuses_the_room_token() {
    let mut redis = Redis::start();
    let node = node(&redis, "n1");
    let room = "chat:r";
    let mut alice = connect(&node, "alice", "web").await;
    join_with(&mut alice, room, &room_token("alice", room, 600)).await;
    let mut bob = connect(&node, "bob", "phone").await;
    join_with(&mut bob, room, &room_token("bob", room, 600)).await;
    expect_event(&mut alice, "room_join", room, "bob", "phone").await;
    redis.restart_empty();
    let url = format!("{}/api/rooms/{room}", node.http());
    wait_until("both members back in Redis", DEADLINE, || async {
        let (_, page) = get_as(&url, Some(ADMIN)).await;
        page["users"] == 2 && page["devices"] == 2
    })
    .await;
    // Neither device was told to leave.
    for c in [&mut alice, &mut bob] {
        while let Some(Incoming::Frame(v)) = c.next_within(Duration::from_millis(300)).await {
            assert_ne!(v["type"], "error", "{v}");
        }
    }
}

/// On a Redis Cluster, across two nodes: the token join is seen on the
/// other node, and so is the leave at the token's end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_rooms_work_on_a_cluster() {
    let cluster = Cluster::start();
    let mut flags = FLAGS.to_vec();
    flags.extend(["--jwt-secret", SECRET]);
    let a = cluster.node_with("a", &flags);
    let b = cluster.node_with("b", &flags);
    let room = "chat:c";
    let mut alice = connect(&a, "alice", "web").await;
    join_with(&mut alice, room, &room_token("alice", room, 600)).await;
    let mut bob = connect(&b, "bob", "phone").await;
    let frame = join_with(&mut bob, room, &room_token("bob", room, 3)).await;
    assert_eq!(members(&frame), ["alice:web", "bob:phone"]);
    expect_event(&mut alice, "room_join", room, "bob", "phone").await;
    next_of(&mut bob, "room_token_expiring").await;
    assert_eq!(error_in(&mut bob, room).await["code"], "token_expired");
    let left = expect_event(&mut alice, "room_leave", room, "bob", "phone").await;
    assert_eq!(left["last"], true, "{left}");
}

/// Room tokens pass the rules of connection tokens: a public key (ES256
/// here), the issuer and the audience; an HS256 token is refused where no
/// secret is configured.
#[tokio::test]
async fn room_tokens_follow_the_key_issuer_and_audience_rules() {
    const ISS: &str = "https://app.example.com/";
    let dir = tempfile::tempdir().unwrap();
    let key = Key::generate(dir.path(), Algorithm::ES256, "ec-1");
    let public = key.public_pem().to_str().unwrap().to_string();
    let redis = Redis::start();
    let mut flags = FLAGS.to_vec();
    flags.extend([
        "--jwt-public-key-file",
        &public,
        "--jwt-issuer",
        ISS,
        "--jwt-audience",
        "presence",
    ]);
    let node = Node::start_with(&redis, "n1", &flags);
    let room = "chat:k";
    let claims = |extra: Value| {
        let mut c = json!({"sub": "alice", "exp": now() + 3600, "iss": ISS, "aud": "presence"});
        for (k, v) in extra.as_object().unwrap() {
            match v {
                Value::Null => c.as_object_mut().unwrap().remove(k),
                v => c.as_object_mut().unwrap().insert(k.clone(), v.clone()),
            };
        }
        c
    };
    let url = format!(
        "ws://{}/ws?device=web&token={}",
        node.addr,
        key.sign(None, &claims(json!({})))
    );
    let mut alice = Client::connect_raw(&url, "alice", "web").await.unwrap();
    alice.expect("hello").await;
    for (what, token, says) in [
        (
            "no iss",
            key.sign(None, &claims(json!({"room": room, "iss": null}))),
            "\"iss\"",
        ),
        (
            "another audience",
            key.sign(None, &claims(json!({"room": room, "aud": "other"}))),
            "aud",
        ),
        (
            "HS256 without a secret",
            hs(claims(json!({"room": room}))),
            "no key",
        ),
    ] {
        alice
            .send(json!({"type": "join", "room": room, "token": token}))
            .await;
        let e = error_in(&mut alice, room).await;
        assert_eq!(e["code"], "forbidden", "{what}: {e}");
        assert!(e["message"].as_str().unwrap().contains(says), "{what}: {e}");
    }
    let good = key.sign(None, &claims(json!({"room": room})));
    let frame = join_with(&mut alice, room, &good).await;
    assert_eq!(members(&frame), ["alice:web"]);
}

/// Room tokens are verified with the keys of connection tokens: a node
/// with a token room does not start under development auth.
#[test]
fn token_rooms_need_jwt_auth() {
    let redis = Redis::start();
    let args: Vec<String> = [
        "--listen",
        "127.0.0.1:0",
        "--redis-url",
        &redis.url,
        "--room-policy",
        "chat:*=token",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let err = Node::spawn("dev", &args, &[]).err().expect("refused");
    assert!(
        err.contains("--room-policy token needs --auth jwt"),
        "{err}"
    );
}

/// Epoch ms now.
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}
