//! Rooms against a client that would tie up the Redis every node shares
//! (issue 37, items 1, 2, 3 and 12): what Redis does for a read is bounded
//! by what the read asked for and was charged, whatever the room's size
//! and whoever is hidden in it, and a room switching between its list and
//! its counts costs one read per node, not one per member.
//!
//! Redis's own counters (`INFO stats`, `INFO commandstats`, which count the
//! commands scripts run too) say what a read cost it; the figures under
//! load are the bench's (`presence-bench rooms-attack`).

use std::collections::HashMap;
use std::time::Duration;

use crate::common::*;
use crate::rooms::{expect_event, expect_quiet, join, members, next_of};
use serde_json::{json, Value};

/// Redis's `INFO` section `section` as field -> value.
async fn info(redis: &Redis, section: &str) -> HashMap<String, String> {
    let mut c = redis.aconn().await;
    let text: String = redis::cmd("INFO")
        .arg(section)
        .query_async(&mut c)
        .await
        .unwrap();
    text.lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.to_string(), v.trim().to_string()))
        .collect()
}

/// Bytes Redis has sent to its clients so far.
async fn output_bytes(redis: &Redis) -> u64 {
    info(redis, "stats").await["total_net_output_bytes"]
        .parse()
        .unwrap()
}

/// Calls so far of each command in `cmds` (scripts' own calls included).
async fn calls(redis: &Redis, cmds: &[&str]) -> u64 {
    let stats = info(redis, "commandstats").await;
    cmds.iter()
        .filter_map(|c| stats.get(&format!("cmdstat_{c}")))
        .map(|v| {
            v.split(',')
                .find_map(|f| f.strip_prefix("calls="))
                .unwrap()
                .parse::<u64>()
                .unwrap()
        })
        .sum()
}

/// The commands that read a whole hash.
const WHOLE_READS: [&str; 3] = ["hgetall", "hkeys", "hvals"];

/// A state of about `bytes` serialized bytes.
fn big_state(bytes: usize) -> Value {
    json!({ "blob": "x".repeat(bytes.saturating_sub(12)) })
}

/// `n` users (`<prefix><i>`, one device each) in `room` with `state`.
async fn crowd(node: &Node, prefix: &str, n: usize, room: &str, state: Value) -> Vec<Client> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let mut c = Client::connect(node, &format!("{prefix}{i:03}"), "d").await;
        join(&mut c, room, state.clone()).await;
        out.push(c);
    }
    out
}

/// Turns `c`'s user invisible.
async fn go_invisible(c: &mut Client) {
    c.send(json!({"type": "status", "status": "invisible"}))
        .await;
    assert_eq!(next_of(c, "presence").await["status"], "invisible");
}

/// Item 1: `GET /api/rooms/{room}?limit=1` reads one page, not the room:
/// what Redis sends for it does not grow with the room's states.
#[tokio::test]
async fn a_room_page_reads_only_the_page() {
    let redis = Redis::start();
    let node = Node::start(&redis, "n1");
    let _members = crowd(&node, "m", 60, "doc:big", big_state(1_000)).await;
    let base = node.http();
    let before = output_bytes(&redis).await;
    let (status, page) = get(&format!("{base}/api/rooms/doc:big?viewer=x&limit=1")).await;
    let sent = output_bytes(&redis).await - before;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["users"], 60, "{page}");
    assert_eq!(page["members"].as_array().unwrap().len(), 1, "{page}");
    assert_eq!(page["next_cursor"], "m000", "{page}");
    // One member of about 1 KB, and the counts; the room's 60 KB stayed.
    assert!(
        sent < 8_000,
        "Redis sent {sent} bytes for a page of one member of a 60 KB room"
    );
    // The pages, followed to the end, list every member once.
    let mut seen = Vec::new();
    let mut cursor = String::new();
    loop {
        let (status, page) = get(&format!(
            "{base}/api/rooms/doc:big?viewer=x&limit=25{cursor}"
        ))
        .await;
        assert_eq!(status, 200, "{page}");
        for m in page["members"].as_array().unwrap() {
            seen.push(m["user"].as_str().unwrap().to_string());
        }
        match page["next_cursor"].as_str() {
            Some(next) => cursor = format!("&cursor={next}"),
            None => break,
        }
    }
    let expected: Vec<String> = (0..60).map(|i| format!("m{i:03}")).collect();
    assert_eq!(seen, expected);
}

/// Item 1: one client may have only so many reads in flight; beyond them
/// it gets `429` at once, without waiting for Redis, while another
/// address's reads are not held up by its.
#[tokio::test]
async fn reads_in_flight_are_capped_per_client() {
    let redis = Redis::start();
    let node = Node::start_with(&redis, "n1", &["--http-reads-in-flight", "4"]);
    let mut alice = Client::connect(&node, "alice", "web").await;
    join(&mut alice, "doc:1", json!({})).await;
    let base = node.http();
    // Redis answers nothing for a while: the reads stay in flight.
    let mut c = redis.aconn().await;
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(1_000)
        .arg("ALL")
        .query_async(&mut c)
        .await
        .unwrap();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let url = format!("{base}/api/rooms/doc:1?viewer=x");
    let reads: Vec<_> = (0..12)
        .map(|_| {
            let (client, url) = (client.clone(), url.clone());
            tokio::spawn(async move {
                let started = std::time::Instant::now();
                let status = client.get(url).send().await.unwrap().status().as_u16();
                (status, started.elapsed())
            })
        })
        .collect();
    let mut refused_at_once = 0;
    let mut answered = Vec::new();
    for read in reads {
        let (status, took) = read.await.unwrap();
        if status == 429 && took < Duration::from_secs(1) {
            refused_at_once += 1;
        }
        answered.push(status);
    }
    // 4 in flight (answered once Redis is back, within the read's 1.5 s
    // deadline); the other 8 refused at once while Redis was paused.
    assert_eq!(refused_at_once, 8, "{answered:?}");
    assert_eq!(
        answered.iter().filter(|s| **s == 200).count(),
        4,
        "{answered:?}"
    );
    // Their places are given back: reads pass again.
    let (status, body) = get(&url).await;
    assert_eq!(status, 200, "{body}");
}

/// Item 2: reading a room's counts reads none of its hidden members: a
/// query naming a room of invisible members 1,000 times reads no member,
/// and is charged (and read) once.
#[tokio::test]
async fn counts_read_no_hidden_member_and_a_room_named_twice_is_read_once() {
    let redis = Redis::start();
    let node = Node::start_with(&redis, "n1", &["--http-reads-per-sec", "1"]);
    let mut hidden = Vec::new();
    for i in 0..30 {
        let mut c = Client::connect(&node, &format!("h{i:02}"), "d").await;
        go_invisible(&mut c).await;
        join(&mut c, "doc:ghosts", big_state(1_000)).await;
        hidden.push(c);
    }
    let base = node.http();
    let before = calls(&redis, &WHOLE_READS).await;
    let rooms: Vec<&str> = vec!["doc:ghosts"; 1_000];
    let (status, counts) = post(
        &format!("{base}/api/rooms/query?viewer=x"),
        &json!({ "rooms": rooms }),
    )
    .await;
    let whole = calls(&redis, &WHOLE_READS).await - before;
    assert_eq!(status, 200, "{counts}");
    assert_eq!(counts["rooms"].as_array().unwrap().len(), 1_000);
    assert_eq!(
        counts["rooms"][999],
        json!({"room": "doc:ghosts", "users": 0, "devices": 0})
    );
    // Whole-hash reads: none for the query (a few at most from the room
    // pass running meanwhile), where reading the hidden members for each
    // name would be 1,000.
    assert!(whole < 10, "{whole} whole-hash reads for one query");
    // A hidden member's own page shows itself, read by its own range
    // (charged a page: 100).
    let (_, own) = get(&format!("{base}/api/rooms/doc:ghosts?viewer=h07")).await;
    assert_eq!(
        (own["users"].as_u64(), own["devices"].as_u64()),
        (Some(1), Some(1))
    );
    assert_eq!(own["members"][0]["user"], "h07", "{own}");
    // The 1,000 names were charged once (1 of a budget of 1,000 per
    // burst): 899 other rooms still pass, and then no more (50 more would
    // take 50 s to refill).
    let others: Vec<String> = (0..899).map(|i| format!("r{i}")).collect();
    let (status, body) = post(
        &format!("{base}/api/rooms/query?viewer=x"),
        &json!({ "rooms": others }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = post(
        &format!("{base}/api/rooms/query?viewer=x"),
        &json!({ "rooms": (0..50).map(|i| format!("more{i}")).collect::<Vec<_>>() }),
    )
    .await;
    assert_eq!(status, 429, "{body}");
}

/// Item 3: a room crossing its list limit costs one read per node for all
/// its local members, not one per member; the limit counts devices too.
#[tokio::test]
async fn crossing_the_list_limit_reads_the_room_once_per_node() {
    let redis = Redis::start();
    let flags = ["--room-announce-max", "20", "--room-occupancy-ms", "200"];
    let a = Node::start_with(&redis, "a", &flags);
    let b = Node::start_with(&redis, "b", &flags);
    let mut residents = crowd(&a, "a", 9, "big", json!({"p": 1})).await;
    residents.extend(crowd(&b, "b", 9, "big", json!({"p": 1})).await);
    // Up: 18 + 4 = 22 users.
    let mut extra = crowd(&b, "x", 4, "big", json!({})).await;
    for r in residents.iter_mut() {
        let frame = next_of(r, "room").await;
        assert!(frame["members"].is_null(), "{frame}");
    }
    // Down: 18 users, at most 90 % of 20.
    let before = calls(&redis, &WHOLE_READS).await;
    for x in extra.drain(..) {
        x.close().await;
    }
    for r in residents.iter_mut() {
        let frame = next_of(r, "room").await;
        assert_eq!(members(&frame).len(), 18, "{frame}");
    }
    let whole = calls(&redis, &WHOLE_READS).await - before;
    // One read per node (a few more at most from the room pass), where
    // every member reading the room itself would be 18 and more.
    assert!(
        whole <= 5,
        "{whole} whole-hash reads to list the room again"
    );
    // Events flow again after the list.
    let mut late = Client::connect(&a, "late", "d").await;
    join(&mut late, "big", json!({})).await;
    for r in residents.iter_mut() {
        expect_event(r, "room_join", "big", "late", "d").await;
    }

    // Devices count too: one user with 6 devices where 5 are listed.
    let c = Node::start_with(&redis, "c", &["--room-announce-max-devices", "5"]);
    let mut devices = Vec::new();
    for d in 0..6 {
        let mut dev = Client::connect(&c, "many", &format!("d{d}")).await;
        let frame = join(&mut dev, "devices", json!({})).await;
        assert_eq!(frame["members"].is_null(), d >= 5, "{frame}");
        devices.push(dev);
    }
}

/// Item 12: a room in counts mode sends `occupancy` only when its counts
/// changed, not for every state change of a member.
#[tokio::test]
async fn occupancy_goes_out_only_when_the_counts_change() {
    let redis = Redis::start();
    let flags = ["--room-announce-max", "2", "--room-occupancy-ms", "100"];
    let node = Node::start_with(&redis, "n1", &flags);
    let mut people = crowd(&node, "p", 3, "big", json!({})).await;
    // Each got its room frame, then the crossing's; settle first.
    for p in people.iter_mut().take(2) {
        let frame = next_of(p, "room").await;
        assert!(frame["members"].is_null(), "{frame}");
    }
    expect_quiet(&mut people[0], Duration::from_millis(300)).await;
    for i in 0..15 {
        people[2]
            .send(json!({"type": "room_state", "room": "big", "state": {"i": i}}))
            .await;
    }
    // Fifteen updates over seven occupancy intervals: no frame at all.
    expect_quiet(&mut people[0], Duration::from_millis(700)).await;
    // A join moves the counts: one occupancy frame.
    let mut fourth = Client::connect(&node, "p9", "d").await;
    join(&mut fourth, "big", json!({})).await;
    let v = people[0].expect("occupancy").await;
    assert_eq!(
        (v["users"].as_u64(), v["devices"].as_u64()),
        (Some(4), Some(4))
    );
}

/// Pages hold whole users, at most `limit` devices (or one user with more),
/// in user order; a member sees its own hidden devices where they sort,
/// and the service view pages through the hidden members too.
#[tokio::test]
async fn pages_hold_whole_users_and_the_service_pages_the_hidden_too() {
    const SERVICE: &str = "service-key-for-pages-123";
    let redis = Redis::start();
    let node = Node::start_with(&redis, "n1", &["--service-key", SERVICE]);
    let base = node.http();
    let mut devices = Vec::new();
    // a0 and c0 with 3 devices, b0 and d0 hidden with 2, e0 with 1.
    for (user, n, hidden) in [
        ("a0", 3, false),
        ("b0", 2, true),
        ("c0", 3, false),
        ("d0", 2, true),
        ("e0", 1, false),
    ] {
        for d in 0..n {
            let mut c = Client::connect(&node, user, &format!("d{d}")).await;
            if hidden && d == 0 {
                go_invisible(&mut c).await;
            }
            join(&mut c, "paged", json!({ "d": d })).await;
            devices.push(c);
        }
    }
    // Follows the pages of `query`; each page's users with their devices.
    let pages = |query: String, bearer: Option<&'static str>| {
        let base = base.clone();
        async move {
            let mut out = Vec::new();
            let mut cursor = String::new();
            loop {
                let (status, page) =
                    get_as(&format!("{base}/api/rooms/paged?{query}{cursor}"), bearer).await;
                assert_eq!(status, 200, "{page}");
                out.push(members(&page));
                match page["next_cursor"].as_str() {
                    Some(next) => cursor = format!("&cursor={next}"),
                    None => return (out, page["users"].clone(), page["devices"].clone()),
                }
            }
        }
    };
    let (seen, users, devs) = pages("viewer=x&limit=4".into(), None).await;
    assert_eq!(
        seen,
        [
            vec!["a0:d0", "a0:d1", "a0:d2"],
            vec!["c0:d0", "c0:d1", "c0:d2", "e0:d0"],
        ]
    );
    assert_eq!((users, devs), (json!(3), json!(7)));
    // One user with more devices than the limit: whole, alone on its page.
    let (seen, ..) = pages("viewer=x&limit=2".into(), None).await;
    assert_eq!(seen[0], ["a0:d0", "a0:d1", "a0:d2"]);
    assert_eq!(seen.len(), 3, "{seen:?}");
    // b0 sees itself where it sorts, not d0.
    let (seen, users, devs) = pages("viewer=b0&limit=5".into(), None).await;
    let flat: Vec<String> = seen.concat();
    assert_eq!(
        flat,
        ["a0:d0", "a0:d1", "a0:d2", "b0:d0", "b0:d1", "c0:d0", "c0:d1", "c0:d2", "e0:d0"]
    );
    assert_eq!((users, devs), (json!(4), json!(9)));
    // The service sees everyone, in order, over pages.
    let (seen, users, devs) = pages("limit=3".into(), Some(SERVICE)).await;
    assert_eq!(seen.concat().len(), 11, "{seen:?}");
    assert_eq!(seen[1], ["b0:d0", "b0:d1"]);
    assert_eq!(seen[3], ["d0:d0", "d0:d1", "e0:d0"]);
    assert_eq!((users, devs), (json!(5), json!(11)));
}

/// A page also stops before 256 KiB of states (whole users, at least one):
/// what one read costs is bounded in bytes, whatever the states.
#[tokio::test]
async fn a_page_is_bounded_in_bytes_too() {
    let redis = Redis::start();
    let node = Node::start_with(&redis, "n1", &["--max-room-state-bytes", "8192"]);
    let _members = crowd(&node, "w", 40, "doc:wide", big_state(8_000)).await;
    let base = node.http();
    let (status, page) = get(&format!("{base}/api/rooms/doc:wide?viewer=x&limit=1000")).await;
    assert_eq!(status, 200, "{page}");
    let listed = page["members"].as_array().unwrap().len();
    // 32 states of 8 KB are 256 KB: the page holds 32 users at most.
    assert!((1..=32).contains(&listed), "{listed} users on a page");
    assert_eq!(page["next_cursor"], format!("w{:03}", listed - 1));
    let (_, rest) = get(&format!(
        "{base}/api/rooms/doc:wide?viewer=x&limit=1000&cursor=w{:03}",
        listed - 1
    ))
    .await;
    let more = rest["members"].as_array().unwrap().len();
    assert_eq!(listed + more, 40, "{rest}");
    assert!(rest["next_cursor"].is_null(), "{rest}");
}
