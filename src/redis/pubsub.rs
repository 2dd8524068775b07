//! A subscription that survives Redis restarts and failovers: the dedicated
//! pub/sub connection behind the registry and the expiry listener.

use std::time::Duration;

use futures_util::StreamExt;

use crate::redis::RedisSource;

/// First wait before reconnecting after the subscription broke.
const BACKOFF_MIN: Duration = Duration::from_millis(100);
/// Longest wait between reconnection attempts.
const BACKOFF_MAX: Duration = Duration::from_secs(1);
/// How long opening the pub/sub connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Subscribes to `channel` and hands each payload to `on_message` until it
/// returns false (its actor is gone). Reconnects with exponential backoff
/// whenever the connection drops, asking `source` for the primary again
/// (behind Sentinel, the new primary after a failover); `on_subscribed`
/// runs after every (re)subscription, so that a caller can repair what it
/// missed meanwhile. A failure is logged once until the subscription is
/// back.
pub async fn run(
    source: RedisSource,
    channel: String,
    mut on_subscribed: impl FnMut(),
    mut on_message: impl FnMut(String) -> bool,
) {
    let mut backoff = BACKOFF_MIN;
    let mut failing = false;
    loop {
        let result = async {
            let client = source.client().await?;
            let mut pubsub = tokio::time::timeout(CONNECT_TIMEOUT, client.get_async_pubsub())
                .await
                .map_err(|_| {
                    redis::RedisError::from((redis::ErrorKind::Io, "connect timed out"))
                })??;
            pubsub.subscribe(&channel).await?;
            Ok::<_, redis::RedisError>(pubsub)
        }
        .await;
        match result {
            Ok(mut pubsub) => {
                if failing {
                    log::info!("subscribed to {channel} again");
                } else {
                    log::info!("subscribed to {channel}");
                }
                backoff = BACKOFF_MIN;
                on_subscribed();
                let mut messages = pubsub.on_message();
                while let Some(msg) = messages.next().await {
                    match msg.get_payload::<String>() {
                        Ok(payload) => {
                            if !on_message(payload) {
                                return;
                            }
                        }
                        Err(e) => log::warn!("{channel}: unreadable message: {e}"),
                    }
                }
                log::warn!("subscription to {channel} lost; reconnecting");
                failing = true;
            }
            Err(e) if failing => log::debug!("cannot subscribe to {channel} yet: {e}"),
            Err(e) => {
                log::warn!("cannot subscribe to {channel} (retrying): {e}");
                failing = true;
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}
