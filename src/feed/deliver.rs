//! Webhooks from the log: each `--webhook-url` is sent every bucket's
//! events by whichever node holds the bucket's feed lock, from where that
//! URL is in the log (kept in Redis: `presence-feed-sent:{b<k>}`). A node
//! that dies leaves its buckets, and where each URL is in them, to the
//! others; a receiver that is down gets the events when it is back, for as
//! long as the log keeps them; what the log dropped before a URL took it is
//! counted in the next batch's `lost`. A place Redis lost (it came back
//! empty, the log with it) starts again from the start of the log.
//!
//! Per bucket and URL, batches go one at a time, oldest first, so one
//! user's (or room's) events arrive in `seq` order. At least once: a node
//! that dies after a POST and before recording it, or two nodes around a
//! lock's handover, send a batch again; receivers deduplicate by `id`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::metrics::METRICS;
use crate::store::Store;
use crate::webhooks::WebhookConfig;

/// Shortest wait after a failed POST, doubled to [`RETRY_MAX`].
const RETRY_MIN: Duration = Duration::from_millis(250);
/// Longest wait after a failed POST.
const RETRY_MAX: Duration = Duration::from_secs(30);
/// Longest wait for a receiver's answer.
const POST_TIMEOUT: Duration = Duration::from_secs(10);

/// Starts one sender per URL, sending the buckets `held` says this node
/// holds.
pub fn spawn(store: Store, node: String, config: WebhookConfig, held: Arc<Vec<AtomicBool>>) {
    let client = reqwest::Client::builder()
        .timeout(POST_TIMEOUT)
        .user_agent(concat!("presence-server/", env!("CARGO_PKG_VERSION")))
        .build()
        .expect("a default reqwest client builds");
    let config = Arc::new(config);
    for url in config.urls.clone() {
        tokio::spawn(sender(
            store.clone(),
            node.clone(),
            url,
            config.clone(),
            held.clone(),
            client.clone(),
        ));
    }
}

/// One URL's sender: every `--webhook-batch-ms`, each held bucket's new
/// events, a batch at a time, until none is left or a POST fails (then it
/// waits, doubling from 0.25 s to 30 s, and tries the same batch again).
async fn sender(
    store: Store,
    node: String,
    url: String,
    config: Arc<WebhookConfig>,
    held: Arc<Vec<AtomicBool>>,
    client: reqwest::Client,
) {
    let tick = config
        .batch_interval
        .clamp(Duration::from_millis(20), Duration::from_secs(1));
    let mut backoff = RETRY_MIN;
    loop {
        tokio::time::sleep(tick).await;
        for (bucket, mine) in held.iter().enumerate() {
            if !mine.load(Ordering::Relaxed) {
                continue;
            }
            loop {
                match send_one(&store, &node, &url, &config, &client, bucket as u32).await {
                    Ok(true) => backoff = RETRY_MIN,
                    Ok(false) => break,
                    Err(e) => {
                        METRICS.webhooks.failures.inc();
                        // The URL's password and query may hold secrets.
                        let shown = crate::redis::redact(url.split('?').next().unwrap_or(&url));
                        log::warn!("webhook {shown}: {e}; retrying in {backoff:?}");
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(RETRY_MAX);
                        break;
                    }
                }
            }
        }
    }
}

/// Sends `bucket`'s next batch to `url`; `Ok(true)` when it sent one (there
/// may be more), `Ok(false)` when there was none.
async fn send_one(
    store: &Store,
    node: &str,
    url: &str,
    config: &WebhookConfig,
    client: &reqwest::Client,
    bucket: u32,
) -> Result<bool, String> {
    let Some(at) = store
        .feed_sent(bucket, url)
        .await
        .map_err(|e| e.to_string())?
    else {
        // Set when the node started (start_feed_sent); gone only if Redis
        // lost it, and with it the bucket's log (same slot): what the log
        // holds now was recorded since, and none of it was sent. From the
        // end, the events recorded before this look (leases claimed again,
        // rooms joined again) would never be.
        store
            .restart_feed_sent(bucket, url)
            .await
            .map_err(|e| e.to_string())?;
        return Ok(true);
    };
    let entries = store
        .feed_read_bucket(bucket, &at.0, config.batch_size)
        .await
        .map_err(|e| e.to_string())?;
    let Some(last) = entries.last() else {
        return Ok(false);
    };
    let lost = entries
        .first()
        .map_or(0, |first| first.n.saturating_sub(at.1 + 1));
    let events: Vec<serde_json::Value> =
        entries.iter().flat_map(super::events::events_of).collect();
    let mut body = serde_json::json!({"node": node, "events": events});
    if lost > 0 {
        body["lost"] = serde_json::json!(lost);
        METRICS.webhooks.dropped.inc_by(lost);
    }
    let res = crate::webhooks::signed_post(client, url, &config.secret, body.to_string())
        .send()
        .await
        // Without the URL: its user info or query may hold a secret.
        .map_err(|e| format!("POST failed: {}", e.without_url()))?;
    if !res.status().is_success() {
        return Err(format!("answered {}", res.status()));
    }
    METRICS.webhooks.delivered.inc_by(events.len() as u64);
    store
        .set_feed_sent(bucket, url, &last.id, last.n)
        .await
        .map_err(|e| e.to_string())?;
    Ok(true)
}
