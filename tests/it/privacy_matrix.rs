//! The privacy matrix: for an invisible user and for each last-seen
//! setting, every surface (live events, snapshots, REST single, bulk query,
//! online list, metrics) shows each kind of viewer exactly what it may see,
//! before, while and after the user is there invisibly.

use crate::common::*;
use serde_json::{json, Value};

/// What `viewer` reads of `user` on the three HTTP surfaces; asserts they
/// agree and returns the record.
async fn http_view(node: &Node, user: &str, viewer: Option<&str>) -> Value {
    let q = viewer.map_or(String::new(), |v| format!("?viewer={v}"));
    let (status, single) = get(&format!("{}/api/presence/{user}{q}", node.http())).await;
    assert_eq!(status, 200, "{single}");
    let (status, bulk) = post(
        &format!("{}/api/presence/query{q}", node.http()),
        &json!({ "users": [user] }),
    )
    .await;
    assert_eq!(status, 200, "{bulk}");
    let bulk = bulk["presence"][0].clone();
    for field in ["user", "status", "devices", "last_seen", "text"] {
        assert_eq!(
            single[field], bulk[field],
            "{field}: single {single}, bulk {bulk}"
        );
    }
    let sep = if q.is_empty() { "?" } else { "&" };
    let (_, online) = get(&format!("{}/api/online{q}{sep}limit=1000", node.http())).await;
    let listed = online["users"]
        .as_array()
        .unwrap()
        .iter()
        .any(|u| u["user"] == user);
    assert_eq!(
        listed,
        single["status"] != "offline",
        "{user} listed {listed} for {viewer:?} but reads {single}"
    );
    bulk
}

/// Connects a visible device and closes it; returns the owner's last seen.
async fn seen_once(node: &Node, redis: &Redis, user: &str) -> i64 {
    let c = Client::connect(node, user, "old").await;
    c.close().await;
    wait_until("user offline", DEADLINE, || async {
        count(redis, user).await == 0
    })
    .await;
    let me = http_view(node, user, Some(user)).await;
    me["last_seen"]
        .as_i64()
        .expect("last seen after a visible visit")
}

/// A snapshot read now: a user already watched is not read again, so
/// unwatch it first.
async fn fresh_snapshot(c: &mut Client, user: &str) -> Value {
    c.send(json!({"type": "unwatch", "users": [user]})).await;
    c.watch(&[user]).await.remove(0)
}

/// A marker user comes online (or leaves): each watcher's next frame must
/// be that event, so nothing about anyone else came before it.
async fn marker_moves(watchers: &mut [&mut Client], node: &Node, marker: &str) -> Client {
    for w in watchers.iter_mut() {
        w.watch(&[marker]).await;
    }
    let c = Client::connect(node, marker, "m").await;
    for w in watchers.iter_mut() {
        w.expect_presence(marker, "online").await;
    }
    c
}

#[tokio::test]
async fn every_surface_for_invisible_users_and_each_last_seen_setting() {
    let redis = Redis::start();
    let node = Node::start_with(
        &redis,
        "n1",
        &["--admin-key", ADMIN, "--internal-listen", "127.0.0.1:0"],
    );
    let internal = {
        let logs = node.logs();
        let line = logs
            .lines()
            .find(|l| l.contains("admin API on http://"))
            .unwrap()
            .to_string();
        let rest = line.split("admin API on http://").nth(1).unwrap();
        format!("http://{}", rest.split_whitespace().next().unwrap())
    };
    let http = reqwest::Client::new();

    // Watchers: a contact of every subject, and a stranger.
    let mut carol = Client::connect(&node, "carol", "c").await;
    let mut dave = Client::connect(&node, "dave", "d").await;

    for (setting, contact_sees, stranger_sees) in [
        ("everyone", true, true),
        ("contacts", true, false),
        ("nobody", false, false),
    ] {
        let user = format!("bob-{setting}");
        let user = user.as_str();
        let seen = seen_once(&node, &redis, user).await;
        let r = http
            .put(format!("{internal}/api/users/{user}/contacts"))
            .bearer_auth(ADMIN)
            .json(&json!({ "contacts": ["carol"] }))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);
        let r = http
            .put(format!("{}/api/users/{user}/privacy", node.http()))
            .json(&json!({ "last_seen": setting }))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 204);

        let expect = |sees: bool| if sees { json!(seen) } else { Value::Null };
        let check = |record: &Value, sees: bool, when: &str| {
            assert_eq!(
                (
                    record["status"].as_str(),
                    record["devices"].as_u64(),
                    &record["last_seen"],
                    &record["text"]
                ),
                (Some("offline"), Some(0), &expect(sees), &Value::Null),
                "{user} {when}: {record}"
            );
        };
        let snap = carol.watch(&[user]).await;
        check(&snap[0], contact_sees, "in carol's snapshot before");
        let snap = dave.watch(&[user]).await;
        check(&snap[0], stranger_sees, "in dave's snapshot before");

        // The user arrives invisible: nothing moves for anyone else.
        let mut bob = Client::connect_raw(
            &format!("{}&status=invisible", node.ws_url(user, "phone")),
            user,
            "phone",
        )
        .await
        .unwrap();
        assert_eq!(bob.expect("hello").await["user"], user);
        let marker = marker_moves(
            &mut [&mut carol, &mut dave],
            &node,
            &format!("m1-{setting}"),
        )
        .await;
        // A text set while invisible is not shown either (checked below,
        // and by the marker: no frame may come before its next event).
        bob.send(json!({"type": "status", "status": "invisible", "text": "hiding"}))
            .await;
        check(
            &http_view(&node, user, Some("carol")).await,
            contact_sees,
            "to carol while there",
        );
        check(
            &http_view(&node, user, Some("dave")).await,
            stranger_sees,
            "to dave while there",
        );
        check(
            &http_view(&node, user, None).await,
            stranger_sees,
            "to anyone while there",
        );
        let snap = fresh_snapshot(&mut carol, user).await;
        check(&snap, contact_sees, "in carol's snapshot while there");

        // It leaves: still nothing, and its last seen has not moved.
        bob.close().await;
        wait_until("bob offline", DEADLINE, || async {
            count(&redis, user).await == 0
        })
        .await;
        marker.close().await;
        for w in [&mut carol, &mut dave] {
            w.expect_presence(&format!("m1-{setting}"), "offline").await;
        }
        check(
            &http_view(&node, user, Some("carol")).await,
            contact_sees,
            "to carol after",
        );
        check(
            &http_view(&node, user, Some("dave")).await,
            stranger_sees,
            "to dave after",
        );
        check(
            &http_view(&node, user, None).await,
            stranger_sees,
            "to anyone after",
        );
        let snap = fresh_snapshot(&mut dave, user).await;
        check(&snap, stranger_sees, "in dave's snapshot after");
    }

    // A user never seen before who arrives invisible: null while there and
    // after, on every surface.
    let newbie = "newbie";
    let snap = dave.watch(&[newbie]).await;
    assert_eq!(
        (snap[0]["status"].as_str(), &snap[0]["last_seen"]),
        (Some("offline"), &Value::Null)
    );
    let mut c = Client::connect_raw(
        &format!("{}&status=invisible", node.ws_url(newbie, "phone")),
        newbie,
        "phone",
    )
    .await
    .unwrap();
    c.expect("hello").await;
    let marker = marker_moves(&mut [&mut dave], &node, "m2").await;
    c.close().await;
    wait_until("newbie offline", DEADLINE, || async {
        count(&redis, newbie).await == 0
    })
    .await;
    marker.close().await;
    dave.expect_presence("m2", "offline").await;
    for viewer in [Some("dave"), None] {
        let r = http_view(&node, newbie, viewer).await;
        assert_eq!(
            (r["status"].as_str(), &r["last_seen"]),
            (Some("offline"), &Value::Null),
            "{r}"
        );
    }
    let snap = fresh_snapshot(&mut dave, newbie).await;
    assert_eq!(snap["last_seen"], Value::Null, "{snap}");

    // Metrics: not on the public port at all, and never a user id.
    let (status, _) = get(&format!("{}/metrics", node.http())).await;
    assert_eq!(status, 404);
    let text = reqwest::get(format!("{internal}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(text.contains("presence_sessions"));
    for id in ["bob-", "newbie", "carol"] {
        assert!(!text.contains(id), "{id} in /metrics");
    }
}
