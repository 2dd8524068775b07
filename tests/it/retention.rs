//! Last-seen retention: entries older than the retention are trimmed.

use std::time::Duration;

use crate::common::*;
use presence_server::store::{now_ms, Store};

const DAY_MS: i64 = 24 * 3600 * 1000;

#[tokio::test]
async fn trims_last_seen_older_than_the_retention() {
    let redis = Redis::start();
    let mut c = redis.aconn().await;
    let now = now_ms();
    let mut pipe = redis::pipe();
    for (user, age_days) in [("old", 100), ("recent", 1), ("back", 120)] {
        pipe.cmd("ZADD")
            .arg(index_key("presence-lastseen", user))
            .arg(now - age_days * DAY_MS)
            .arg(user)
            .ignore();
        pipe.cmd("HSET")
            .arg(format!("presence-status:{{{user}}}"))
            .arg("status")
            .arg("invisible")
            .arg("show_online")
            .arg("nobody")
            .arg("text")
            .arg("gone fishing")
            .arg("last_seen")
            .arg(now - age_days * DAY_MS)
            .ignore();
    }
    // "back" went offline long ago but is online again now.
    pipe.cmd("SET").arg("presence-count:{back}").arg(1).ignore();
    pipe.query_async::<()>(&mut c).await.unwrap();

    let client = redis::Client::open(redis.url.as_str()).unwrap();
    let store = Store::new(
        client.get_connection_manager().await.unwrap(),
        Duration::from_secs(45),
    );
    store.load_scripts().await.unwrap();
    let forgotten = store
        .trim_last_seen(Duration::from_secs(90 * 24 * 3600), 1000)
        .await
        .unwrap();
    assert_eq!(forgotten, 2);

    let left = index_members(&redis, "presence-lastseen").await;
    assert_eq!(left, ["recent"]);
    // Last seen and text are forgotten; the chosen status and privacy
    // settings stay, or an invisible user would show online when back.
    for (user, forgotten) in [("old", true), ("recent", false), ("back", false)] {
        let (status, show_online, text, last_seen): (
            Option<String>,
            Option<String>,
            Option<String>,
            Option<i64>,
        ) = redis::cmd("HMGET")
            .arg(format!("presence-status:{{{user}}}"))
            .arg(&["status", "show_online", "text", "last_seen"])
            .query_async(&mut c)
            .await
            .unwrap();
        assert_eq!(status.as_deref(), Some("invisible"), "{user}");
        assert_eq!(show_online.as_deref(), Some("nobody"), "{user}");
        assert_eq!(text.is_none(), forgotten, "{user}");
        assert_eq!(last_seen.is_none(), forgotten, "{user}");
    }

    // Nothing more to trim.
    assert_eq!(
        store
            .trim_last_seen(Duration::from_secs(90 * 24 * 3600), 1000)
            .await
            .unwrap(),
        0
    );
}
