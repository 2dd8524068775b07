//! Recently seen: `GET /api/online?seen_within_ms=` lists, after the users
//! online now, those last seen within the window, most recent first, paged
//! with the same cursor, without users whose last seen is hidden from the
//! viewer.

use super::*;

/// The users of every page of `GET /api/online?<query>`, page by page.
async fn pages(node: &Node, query: &str, bearer: Option<&str>) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut url = format!("{}/api/online?{query}", node.http());
        if let Some(c) = &cursor {
            url.push_str(&format!("&cursor={c}"));
        }
        let (code, body) = get_as(&url, bearer).await;
        assert_eq!(code, 200, "{url}: {body}");
        let users: Vec<String> = body["users"]
            .as_array()
            .unwrap()
            .iter()
            .map(|u| u["user"].as_str().unwrap().to_string())
            .collect();
        out.push(users);
        match body["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => return out,
        }
        assert!(out.len() < 20, "too many pages: {out:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recently_seen_follow_the_online_users_paged_and_private() {
    let redis = Redis::start();
    let node = Node::start_with(&redis, "n1", &["--admin-key", ADMIN]);
    // u1..u5 come and go one after another: last seen increasing.
    for u in ["u1", "u2", "u3", "u4", "u5"] {
        assert_eq!(heartbeat(&node, u, "d", "web").await.0, 200);
        let before = now();
        assert_eq!(leave(&node, u, "d", None).await.0, 204);
        // Distinct last-seen times, so that the order is the test's.
        wait_until("the clock moves on", DEADLINE, || async {
            now() > before + 2
        })
        .await;
    }
    // `ho` left, hides being online from everyone, and is online again:
    // others are shown it offline, last seen at that departure, and find it
    // there in the recently seen too (its absence would give it away).
    assert_eq!(heartbeat(&node, "ho", "d", "web").await.0, 200);
    assert_eq!(leave(&node, "ho", "d", None).await.0, 204);
    let r = reqwest::Client::new()
        .put(format!("{}/api/users/ho/privacy", node.http()))
        .json(&json!({"online": "nobody"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 204);
    let before = now();
    wait_until("the clock moves on", DEADLINE, || async {
        now() > before + 2
    })
    .await;
    assert_eq!(heartbeat(&node, "ho", "d", "web").await.0, 200);
    // `inv` was online before, went invisible, then left: others are shown
    // the moment it went invisible as its last seen, never its departure,
    // and find it at that moment in the recently seen.
    assert_eq!(heartbeat(&node, "inv", "d", "web").await.0, 200);
    assert_eq!(leave(&node, "inv", "d", None).await.0, 204);
    assert_eq!(heartbeat(&node, "inv", "d", "web").await.0, 200);
    let body = json!({"status": "invisible"});
    assert_eq!(put_status(&node, "inv", &body, None).await.0, 200);
    assert_eq!(leave(&node, "inv", "d", None).await.0, 204);
    // u3 hides its last seen; `old` was last seen two hours ago.
    let r = reqwest::Client::new()
        .put(format!("{}/api/users/u3/privacy", node.http()))
        .json(&json!({"last_seen": "nobody"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 204);
    let old_seen = now() - 2 * 3_600_000;
    let mut c = redis.aconn().await;
    let _: () = redis::cmd("HSET")
        .arg("presence-status:{old}")
        .arg("last_seen")
        .arg(old_seen)
        .query_async(&mut c)
        .await
        .unwrap();
    let _: () = redis::cmd("ZADD")
        .arg(index_key("presence-lastseen", "old"))
        .arg(old_seen)
        .arg("old")
        .query_async(&mut c)
        .await
        .unwrap();
    // Two online now.
    let _a = Client::connect(&node, "on1", "d").await;
    let _b = Client::connect(&node, "on2", "d").await;

    let got = pages(&node, "seen_within_ms=600000&limit=2&viewer=x", None).await;
    let flat: Vec<String> = got.iter().flatten().cloned().collect();
    assert_eq!(flat.len(), 8, "{got:?}");
    let mut online: Vec<&str> = flat[..2].iter().map(String::as_str).collect();
    online.sort();
    assert_eq!(online, ["on1", "on2"], "{got:?}");
    assert_eq!(&flat[2..], ["inv", "ho", "u5", "u4", "u2", "u1"], "{got:?}");
    // Listed exactly when GET /api/presence shows the user offline with a
    // last seen in the window: the list tells no more than the record.
    let window_start = now() - 600_000;
    for user in ["inv", "ho", "u1", "u2", "u3", "u4", "u5", "old", "on1"] {
        let (_, r) = get(&format!("{}/api/presence/{user}?viewer=x", node.http())).await;
        let shown_recent = r["status"] == "offline"
            && r["last_seen"].as_i64().is_some_and(|ls| ls >= window_start);
        assert_eq!(
            flat[2..].contains(&user.to_string()),
            shown_recent,
            "{user}: {r} against {flat:?}"
        );
    }
    assert!(got.iter().all(|p| p.len() <= 2), "{got:?}");
    // Without the parameter: only those online.
    let plain: Vec<String> = pages(&node, "limit=2&viewer=x", None).await.concat();
    assert_eq!(plain.len(), 2, "{plain:?}");
    // u3 sees itself; the service sees everyone; a wider window finds `old`.
    let own: Vec<String> = pages(&node, "seen_within_ms=600000&limit=3&viewer=u3", None)
        .await
        .concat();
    assert_eq!(
        &own[2..],
        ["inv", "ho", "u5", "u4", "u3", "u2", "u1"],
        "{own:?}"
    );
    let inv: Vec<String> = pages(&node, "seen_within_ms=600000&limit=50&viewer=inv", None)
        .await
        .concat();
    assert_eq!(&inv[2..], ["inv", "ho", "u5", "u4", "u2", "u1"], "{inv:?}");
    let all: Vec<String> = pages(&node, "seen_within_ms=86400000&limit=50", Some(ADMIN))
        .await
        .concat();
    // The service view sees `ho` online, among the users online now.
    let mut online: Vec<&str> = all[..3].iter().map(String::as_str).collect();
    online.sort();
    assert_eq!(online, ["ho", "on1", "on2"], "{all:?}");
    assert_eq!(
        &all[3..],
        ["inv", "u5", "u4", "u3", "u2", "u1", "old"],
        "{all:?}"
    );
    // Each entry carries its record.
    let (_, body) = get(&format!(
        "{}/api/online?seen_within_ms=600000&limit=10&viewer=x",
        node.http()
    ))
    .await;
    let u5 = body["users"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["user"] == "u5")
        .unwrap();
    assert_eq!(
        (u5["user"].as_str(), u5["status"].as_str()),
        (Some("u5"), Some("offline"))
    );
    assert_eq!(u5["last_seen"], u5["active_at"], "{u5}");
    // A bad window is a 400.
    for bad in ["0", "-5", "99999999999999", "soon"] {
        let (code, body) = get(&format!("{}/api/online?seen_within_ms={bad}", node.http())).await;
        assert_eq!(
            (code, body["code"].as_str()),
            (400, Some("bad_request")),
            "{bad}: {body}"
        );
    }
}

/// The recently seen cost no more than the online list per request: a
/// viewer from whom every last seen is hidden gets short (here empty)
/// pages with a cursor, at most 4 x `limit` entries examined per request,
/// until the list is over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recently_seen_work_per_request_is_bounded() {
    let redis = Redis::start();
    let node = Node::start(&redis, "n1");
    let mut c = redis.aconn().await;
    let seen = now() - 60_000;
    for i in 0..30 {
        let user = format!("h{i:02}");
        let _: () = redis::cmd("HSET")
            .arg(format!("presence-status:{{{user}}}"))
            .arg("last_seen")
            .arg(seen + i)
            .arg("show_last_seen")
            .arg("nobody")
            .query_async(&mut c)
            .await
            .unwrap();
        let _: () = redis::cmd("ZADD")
            .arg(index_key("presence-lastseen", &user))
            .arg(seen + i)
            .arg(&user)
            .query_async(&mut c)
            .await
            .unwrap();
    }
    let got = pages(&node, "seen_within_ms=600000&limit=2&viewer=x", None).await;
    assert!(got.iter().all(|p| p.is_empty()), "{got:?}");
    // 30 entries at most 8 a request: at least 4 requests.
    assert!(
        got.len() >= 4,
        "{} pages: the work was not bounded",
        got.len()
    );
    // Each user sees its own last seen, and only that.
    let own = pages(&node, "seen_within_ms=600000&limit=50&viewer=h29", None)
        .await
        .concat();
    assert_eq!(own, ["h29"], "only its own last seen is shown to h29");
}
