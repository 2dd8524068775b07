//! `GET /api/online` for a viewer who may see few of the online users:
//! each request examines a bounded number of index entries and hands back
//! a cursor to go on, even on a short or empty page, without ever naming a
//! user the viewer may not see.

mod common;

use std::collections::HashSet;

use common::*;

/// `n` users online as a node writes them (lease, device set, counter,
/// index entry with `score`), hidden from everyone but themselves when
/// `hidden` (`show_online = nobody`).
async fn online_users(
    redis: &Redis,
    prefix: &str,
    n: usize,
    score: i64,
    hidden: bool,
) -> Vec<String> {
    let mut conn = redis.aconn().await;
    let mut pipe = redis::pipe();
    let mut users = Vec::new();
    for i in 0..n {
        let u = format!("{prefix}{i:03}");
        pipe.cmd("SET")
            .arg(format!("presence:{{{u}}}:d"))
            .arg("elsewhere 1 0")
            .arg("PX")
            .arg(600_000)
            .ignore();
        pipe.cmd("SADD")
            .arg(format!("presence-devices:{{{u}}}"))
            .arg("d")
            .ignore();
        pipe.cmd("SET")
            .arg(format!("presence-count:{{{u}}}"))
            .arg(1)
            .ignore();
        if hidden {
            pipe.cmd("HSET")
                .arg(format!("presence-status:{{{u}}}"))
                .arg("show_online")
                .arg("nobody")
                .ignore();
        }
        pipe.cmd("ZADD")
            .arg("presence-online")
            .arg(score)
            .arg(&u)
            .ignore();
        users.push(u);
    }
    pipe.query_async::<()>(&mut conn).await.unwrap();
    users
}

/// One page as `viewer`: the users listed and the next cursor.
async fn page(node: &Node, limit: usize, cursor: Option<&str>) -> (Vec<String>, Option<String>) {
    let mut url = reqwest::Url::parse(&format!("{}/api/online", node.http())).unwrap();
    url.query_pairs_mut()
        .append_pair("limit", &limit.to_string())
        .append_pair("viewer", "stranger");
    if let Some(c) = cursor {
        url.query_pairs_mut().append_pair("cursor", c);
    }
    let (status, body) = get(url.as_str()).await;
    assert_eq!(status, 200, "{body}");
    let users = body["users"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["user"].as_str().unwrap().to_string())
        .collect();
    (users, body["next_cursor"].as_str().map(str::to_string))
}

/// Pages to the end; returns every user listed and the number of requests.
async fn walk(node: &Node, limit: usize, hidden: &[String]) -> (Vec<String>, usize) {
    let (mut all, mut requests, mut cursor) = (Vec::new(), 0, None::<String>);
    loop {
        let (users, next) = page(node, limit, cursor.as_deref()).await;
        requests += 1;
        assert!(users.len() <= limit);
        all.extend(users);
        let Some(next) = next else {
            return (all, requests);
        };
        for h in hidden {
            assert!(
                !next.contains(h.as_str()),
                "cursor {next:?} names hidden {h}"
            );
        }
        assert!(requests < 1_000, "the cursor does not advance: {next}");
        cursor = Some(next);
    }
}

#[tokio::test]
async fn an_empty_page_still_hands_back_a_cursor() {
    let redis = Redis::start();
    let node = Node::start_with(&redis, "n1", &["--heartbeat-ms", "30000"]);
    let hidden = online_users(&redis, "h", 30, 1_000_000, true).await;
    // limit 2: at most 8 entries examined per request, so the first page
    // of 30 hidden users is empty, and not the last.
    let (users, next) = page(&node, 2, None).await;
    assert!(users.is_empty(), "{users:?}");
    let next = next.expect("a cursor while entries remain");
    assert!(hidden.iter().all(|h| !next.contains(h.as_str())), "{next}");
    let (all, requests) = walk(&node, 2, &hidden).await;
    assert!(all.is_empty(), "{all:?}");
    assert!(requests >= 30 / 8, "{requests} requests for 30 entries");
}

#[tokio::test]
async fn paging_lists_each_visible_user_once_across_ties() {
    let redis = Redis::start();
    let node = Node::start_with(&redis, "n1", &["--heartbeat-ms", "30000"]);
    // Ties: one refresh batch stamps many users with the same time.
    let mut hidden = online_users(&redis, "h", 40, 5_000, true).await;
    let shown_a = online_users(&redis, "s", 20, 5_000, false).await;
    let shown_b = online_users(&redis, "t", 7, 4_000, false).await;
    hidden.extend(online_users(&redis, "x", 25, 3_000, true).await);
    let want: HashSet<String> = shown_a.iter().chain(&shown_b).cloned().collect();
    for limit in [1, 3, 50] {
        let (all, _) = walk(&node, limit, &hidden).await;
        let unique: HashSet<String> = all.iter().cloned().collect();
        assert_eq!(unique.len(), all.len(), "limit {limit}: repeats in {all:?}");
        assert_eq!(unique, want, "limit {limit}");
    }

    // The user a cursor names moves (it refreshed) before the next page:
    // the next page goes on after its old place, without repeats.
    let (first, next) = page(&node, 3, None).await;
    let next = next.unwrap();
    let moved = first.last().unwrap();
    let mut conn = redis.aconn().await;
    let _: i64 = redis::cmd("ZADD")
        .arg("presence-online")
        .arg(9_000)
        .arg(moved)
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut seen: Vec<String> = first.clone();
    let mut cursor = Some(next);
    while let Some(c) = cursor {
        let (users, n) = page(&node, 3, Some(&c)).await;
        seen.extend(users);
        cursor = n;
    }
    let unique: HashSet<&String> = seen.iter().collect();
    assert_eq!(unique.len(), seen.len(), "repeats after a move: {seen:?}");
    assert_eq!(seen.len(), want.len());
}
