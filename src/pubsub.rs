//! A subscription that survives Redis restarts: the dedicated pub/sub
//! connection behind the registry and the expiry listener.

use std::time::Duration;

use futures_util::StreamExt;

/// First wait before reconnecting after the subscription broke.
const BACKOFF_MIN: Duration = Duration::from_millis(100);
/// Longest wait between reconnection attempts.
const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Subscribes to `channel` and hands each payload to `on_message` until it
/// returns false (its actor is gone). Reconnects with exponential backoff
/// whenever the connection drops; `on_subscribed` runs after every
/// (re)subscription, so that a caller can repair what it missed meanwhile.
pub async fn run(
    client: redis::Client,
    channel: String,
    mut on_subscribed: impl FnMut(),
    mut on_message: impl FnMut(String) -> bool,
) {
    let mut backoff = BACKOFF_MIN;
    loop {
        match client.get_async_pubsub().await {
            Ok(mut pubsub) => match pubsub.subscribe(&channel).await {
                Ok(()) => {
                    log::info!("subscribed to {channel}");
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
                }
                Err(e) => log::warn!("cannot subscribe to {channel}: {e}"),
            },
            Err(e) => log::warn!("cannot connect for {channel}: {e}"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}
