//! Webhooks: every transition this node makes (a user comes online, goes
//! offline, changes status), POSTed to the backend's URLs in signed batches.
//!
//! Once per fleet: an event is queued only by the node whose atomic Lua step
//! made the transition. The steps report the event they published (see
//! `reporting!` in `src/store/scripts.rs`), and a step that found the
//! transition already made (another node's expiry listener, deadline pass
//! or reconciliation got there first) reports none. So an expired lease that
//! two nodes both hear about is announced by the one whose `depart.lua`
//! removed it.
//!
//! Per URL, a bounded queue and one sender task: it waits until
//! [`WebhookConfig::batch_size`] events are queued or the oldest has waited
//! [`WebhookConfig::batch_interval`], POSTs them, and on a failure (no
//! answer, or any status but 2xx) retries the front of the queue with
//! exponential backoff. One user cannot crowd the others out: only its
//! latest status event waits (a newer one replaces it), and it may have at
//! most [`MAX_QUEUED_PER_USER`] events waiting, the room events it causes
//! included (a room's `room_occupied` and `room_vacated` count for the user
//! whose join or leave made them). What gives way, to a user over that
//! share (among its own events) or to a full queue (among all), goes by
//! class (`queue::Class`): room events first, then status changes, and
//! online and offline only when nothing else waits; oldest first within a
//! class, and a new event of a class that would give way first is itself
//! dropped (`presence_webhook_dropped_total` counts each event that will
//! not be sent). Delivery is at least once while the node lives; what is
//! queued when it dies is lost, and a node stopped with
//! SIGTERM delivers its queue first (docs/http-api.md, "Webhooks").

mod queue;

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use serde::Serialize;
use sha2::Sha256;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::metrics::METRICS;
use crate::model::Event;
use queue::{Class, Owner, Queue};

/// Default most events in one POST.
pub const DEFAULT_BATCH_SIZE: usize = 100;
/// Default longest time an event waits for its batch to fill.
pub const DEFAULT_BATCH_INTERVAL: Duration = Duration::from_millis(200);
/// Default most events waiting per URL; beyond it the oldest are dropped.
pub const DEFAULT_QUEUE_LIMIT: usize = 10_000;
/// Most events of one user waiting per URL (the room events it causes
/// included); at most half the queue.
pub const MAX_QUEUED_PER_USER: usize = 64;
/// First wait before a failed POST is retried; doubled on each failure.
pub const RETRY_MIN: Duration = Duration::from_millis(250);
/// Longest wait between two attempts.
pub const RETRY_MAX: Duration = Duration::from_secs(30);
/// A POST that takes longer has failed.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Shortest secret accepted: HMAC keys shorter than this are guessable.
pub const MIN_SECRET_BYTES: usize = 16;
/// The signature header: `t=<unix seconds>,v1=<hex HMAC-SHA256>`.
pub const SIGNATURE_HEADER: &str = "Presence-Signature";

/// What to send where (`--webhook-*` flags).
#[derive(Clone)]
pub struct WebhookConfig {
    /// Receivers; each gets every event, with its own queue.
    pub urls: Vec<String>,
    /// HMAC-SHA256 key of the signature header.
    pub secret: Vec<u8>,
    /// Most events in one POST.
    pub batch_size: usize,
    /// Longest time the oldest queued event waits before a POST.
    pub batch_interval: Duration,
    /// Most events waiting per URL.
    pub queue_limit: usize,
}

impl std::fmt::Debug for WebhookConfig {
    /// Without the secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookConfig")
            .field("urls", &self.urls)
            .field("batch_size", &self.batch_size)
            .field("batch_interval", &self.batch_interval)
            .field("queue_limit", &self.queue_limit)
            .finish_non_exhaustive()
    }
}

impl WebhookConfig {
    /// Refuses what cannot work: no URL, a URL that is not http(s), a short
    /// secret, a zero batch or queue.
    pub fn validate(&self) -> anyhow::Result<()> {
        for url in &self.urls {
            let parsed = reqwest::Url::parse(url)
                .map_err(|e| anyhow::anyhow!("--webhook-url {url:?} is not a URL: {e}"))?;
            if !matches!(parsed.scheme(), "http" | "https") {
                anyhow::bail!("--webhook-url {url:?} must be http:// or https://");
            }
        }
        if self.secret.len() < MIN_SECRET_BYTES {
            anyhow::bail!(
                "--webhook-url needs --webhook-secret (or --webhook-secret-file) of at least {MIN_SECRET_BYTES} bytes: receivers check every batch's signature with it"
            );
        }
        if self.batch_size == 0 || self.queue_limit == 0 {
            anyhow::bail!("--webhook-batch-size and --webhook-queue-limit must be at least 1");
        }
        Ok(())
    }
}

/// The kind of transition a webhook event announces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// The user's first device arrived.
    Online,
    /// The user's last device left (closed, dropped, or its lease lapsed).
    Offline,
    /// An online user chose another status or text.
    Status,
    /// An online user's idle mark flipped: every device of it is paused
    /// now (`idle: true`), or one is back (`idle: false`).
    Idle,
}

/// One transition as a webhook receiver gets it: the user's true state
/// after it (an invisible user is `invisible` here, never hidden).
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct WebhookEvent {
    /// `<user>:<seq>`: the same transition always has the same id, so a
    /// receiver drops a retried delivery by it.
    #[schema(example = "alice:1732412345678")]
    pub id: String,
    /// What happened.
    #[serde(rename = "type")]
    pub kind: Kind,
    /// When this node made the transition, epoch ms.
    pub at: i64,
    /// The user.
    pub user: String,
    /// online, away, busy, invisible or offline: the truth, not a viewer's view.
    #[schema(example = "online")]
    pub status: String,
    /// Live devices after the transition.
    pub devices: u32,
    /// When the user was last seen, epoch ms; null when never (for a user
    /// who was invisible, the time shown to others).
    pub last_seen: Option<i64>,
    /// Status text.
    pub text: Option<String>,
    /// When the chosen status was set, epoch ms (0 when never).
    pub since: i64,
    /// When the chosen status ends (back to `online`), epoch ms; null when
    /// it does not.
    pub until: Option<i64>,
    /// The sorted distinct kinds of the live devices.
    #[schema(example = json!(["mobile"]))]
    pub kinds: Vec<String>,
    /// On `idle` events only: every live device of the user is paused
    /// (`true`), or one is back (`false`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idle: Option<bool>,
    /// The user's transition sequence number: increases with each
    /// transition of that user, so a receiver can order them.
    pub seq: u64,
}

impl WebhookEvent {
    /// The event of a transition `kind` published as `event`, at `at`.
    pub fn new(kind: Kind, event: Event, at: i64) -> Self {
        let p = event.presence;
        Self {
            id: format!("{}:{}", p.user, event.seq),
            kind,
            at,
            status: p.status,
            devices: p.devices,
            last_seen: p.last_seen,
            text: p.text,
            since: p.since,
            until: p.until,
            kinds: p.kinds,
            idle: (kind == Kind::Idle).then_some(p.idle),
            seq: event.seq,
            user: p.user,
        }
    }
}

/// The kind of a room event a webhook announces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RoomKind {
    /// A user's first device joined the room.
    RoomJoined,
    /// A user's last device left the room (a leave, a close, or its
    /// membership lapsed).
    RoomLeft,
    /// The room's first user joined: it was empty.
    RoomOccupied,
    /// The room's last user left: it is empty.
    RoomVacated,
}

/// One room event as a webhook receiver gets it. Invisible users' comings
/// and goings in rooms are not announced: they are not in the room for
/// its members.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct RoomWebhookEvent {
    /// `<room>:<seq>`, with `:occupied` or `:vacated` for those: the same
    /// event always has the same id.
    pub id: String,
    /// What happened.
    #[serde(rename = "type")]
    pub kind: RoomKind,
    /// When this node's step made it, epoch ms.
    pub at: i64,
    /// The room.
    pub room: String,
    /// The user who joined or left (absent for occupied and vacated).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Users in the room after it.
    pub users: u64,
    /// Devices in the room after it.
    pub devices: u64,
    /// The room's event clock: increases with each of its events.
    pub seq: u64,
}

/// The JSON body of one POST.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct WebhookBatch {
    /// The node that made these transitions.
    pub node: String,
    /// Oldest first.
    pub events: Vec<WebhookEvent>,
}

/// `t=<unix>,v1=<hex>`: HMAC-SHA256 with `secret` over `<unix>.<body>`.
pub fn sign(secret: &[u8], unix: u64, body: &[u8]) -> String {
    // HMAC takes keys of any length.
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC accepts any key length");
    mac.update(unix.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    let hex: String = mac
        .finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("t={unix},v1={hex}")
}

/// Handle on the node's webhook queues; cheap to clone. Queuing never
/// waits and never fails: the Lua step it follows is done.
#[derive(Clone)]
pub struct Webhooks {
    sinks: Arc<[Arc<Sink>]>,
}

/// One receiver: its queue and the sender task's wake-up.
struct Sink {
    url: String,
    queue: Mutex<Queue>,
    /// Rung on each queued event, so the sender can fill a batch.
    wake: Notify,
    limit: usize,
}

impl Webhooks {
    /// Starts one sender task per URL on the current tokio runtime.
    pub fn start(config: WebhookConfig, node: &str) -> anyhow::Result<Self> {
        config.validate()?;
        let client = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .user_agent(concat!("presence-server/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| anyhow::anyhow!("cannot build the webhook HTTP client: {e}"))?;
        let sinks: Vec<Arc<Sink>> = config
            .urls
            .iter()
            .map(|url| {
                Arc::new(Sink {
                    url: url.clone(),
                    queue: Mutex::new(Queue::default()),
                    wake: Notify::new(),
                    limit: config.queue_limit,
                })
            })
            .collect();
        let config = Arc::new(config);
        let node: Arc<str> = node.into();
        for sink in &sinks {
            tokio::spawn(send_loop(
                sink.clone(),
                client.clone(),
                config.clone(),
                node.clone(),
            ));
        }
        Ok(Self {
            sinks: sinks.into(),
        })
    }

    /// Queues the transition that this node's step published as the JSON
    /// `published` (the `presence-events` payload): a status change when
    /// `status_step`, else the user came online or went offline.
    pub fn transition(&self, status_step: bool, published: &str) {
        let event = match serde_json::from_str::<Event>(published) {
            Ok(e) => e,
            Err(e) => {
                log::warn!("webhook: cannot read the published event ({e}): {published}");
                return;
            }
        };
        let kind = match (status_step, event.presence.devices) {
            (true, _) => Kind::Status,
            _ if event.idle_flip => Kind::Idle,
            (false, 0) => Kind::Offline,
            (false, _) => Kind::Online,
        };
        let event = WebhookEvent::new(kind, event, crate::clock::now_ms());
        let json: Arc<str> = match serde_json::to_string(&event) {
            Ok(j) => j.into(),
            Err(e) => {
                log::warn!("webhook: cannot encode {event:?}: {e}");
                return;
            }
        };
        let owner = Owner {
            key: event.user.as_str().into(),
            class: match kind {
                Kind::Status | Kind::Idle => Class::Status,
                Kind::Online | Kind::Offline => Class::Transition,
            },
        };
        self.push(json, owner);
    }

    /// Queues a room event this node's step made; `by` is the user whose
    /// join or leave made it. Occupied and vacated name no user, yet count
    /// for `by` too: otherwise a user joining and leaving rooms of its own
    /// makes events of a new owner with each room, beyond any share.
    pub fn room(&self, event: &RoomWebhookEvent, by: &str) {
        match serde_json::to_string(event) {
            Ok(json) => {
                let owner = Owner {
                    key: by.into(),
                    class: Class::Room,
                };
                self.push(json.into(), owner);
            }
            Err(e) => log::warn!("webhook: cannot encode {event:?}: {e}"),
        }
    }

    fn push(&self, json: Arc<str>, owner: Owner) {
        for sink in self.sinks.iter() {
            sink.push(json.clone(), owner.clone());
        }
    }

    /// Events waiting, over every URL.
    pub fn queued(&self) -> usize {
        self.sinks.iter().map(|s| s.lock().events.len()).sum()
    }

    /// Waits (at most `timeout`) until every queue is delivered, for a node
    /// that is stopping; logs what is left behind.
    pub async fn drain(&self, timeout: Duration) {
        let give_up = Instant::now() + timeout;
        while self.queued() > 0 && Instant::now() < give_up {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let left = self.queued();
        if left > 0 {
            log::warn!("stopping with {left} webhook event(s) undelivered");
        }
    }
}

impl Sink {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        // A panic while holding the lock could leave the indexes of the
        // queue behind its events, which costs at most a wrong drop.
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn push(&self, json: Arc<str>, owner: Owner) {
        let mut q = self.lock();
        let (keep, dropped) = q.make_room(&owner, self.limit);
        if keep {
            q.push_back(json, owner);
        }
        drop(q);
        METRICS.webhooks.dropped.inc_by(dropped + u64::from(!keep));
        METRICS
            .webhooks
            .queued
            .sub(i64::try_from(dropped).unwrap_or(i64::MAX));
        METRICS.webhooks.events.inc();
        if keep {
            METRICS.webhooks.queued.inc();
            self.wake.notify_one();
        }
    }

    /// Up to `max` events from the front, and the number of the last.
    fn front(&self, max: usize) -> Option<(Vec<Arc<str>>, u64)> {
        let q = self.lock();
        let last = q
            .events
            .get(q.events.len().min(max).checked_sub(1)?)?
            .number;
        Some((
            q.events.iter().take(max).map(|e| e.json.clone()).collect(),
            last,
        ))
    }

    /// Removes the delivered events, up to number `last` (some may have
    /// been dropped meanwhile).
    fn delivered(&self, last: u64) {
        let mut q = self.lock();
        while q.events.front().is_some_and(|e| e.number <= last) {
            q.pop_front();
            METRICS.webhooks.delivered.inc();
            METRICS.webhooks.queued.dec();
        }
    }

    /// How many are queued, and since when the oldest has waited.
    fn state(&self) -> (usize, Option<Instant>) {
        let q = self.lock();
        (q.events.len(), q.events.front().map(|e| e.since))
    }
}

/// One receiver's sender: fill a batch, POST it, retry the front until it
/// is taken.
async fn send_loop(
    sink: Arc<Sink>,
    client: reqwest::Client,
    config: Arc<WebhookConfig>,
    node: Arc<str>,
) {
    let mut backoff = RETRY_MIN;
    loop {
        // Wait for a full batch, or for the oldest event's time to run out.
        loop {
            let (len, oldest) = sink.state();
            match oldest {
                Some(_) if len >= config.batch_size => break,
                Some(since) => {
                    let due = since + config.batch_interval;
                    if Instant::now() >= due {
                        break;
                    }
                    tokio::select! {
                        _ = sink.wake.notified() => {}
                        _ = tokio::time::sleep_until(due) => {}
                    }
                }
                None => sink.wake.notified().await,
            }
        }
        let Some((events, last)) = sink.front(config.batch_size) else {
            continue;
        };
        let body = format!(
            "{{\"node\":{},\"events\":[{}]}}",
            serde_json::Value::String(node.to_string()),
            events.join(",")
        );
        match post(&client, &sink.url, &config.secret, body).await {
            Ok(()) => {
                sink.delivered(last);
                backoff = RETRY_MIN;
            }
            Err(e) => {
                METRICS.webhooks.failures.inc();
                log::warn!(
                    "webhook {}: {e}; {} event(s) waiting, retrying in {backoff:?}",
                    sink.url,
                    sink.state().0
                );
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(RETRY_MAX);
            }
        }
    }
}

/// A POST of the JSON `body` to `url`, signed now with `secret` in the
/// [`SIGNATURE_HEADER`]: the one way this node signs what it sends to the
/// app's backend (webhook batches, and the questions of the `proxy` room
/// policy), so that a receiver checks both with the same recipe.
pub fn signed_post(
    client: &reqwest::Client,
    url: &str,
    secret: &[u8],
    body: String,
) -> reqwest::RequestBuilder {
    let unix = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let signature = sign(secret, unix, body.as_bytes());
    client
        .post(url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .header(SIGNATURE_HEADER, signature)
        .body(body)
}

/// One signed POST; `Err` says why it did not count as delivered.
async fn post(
    client: &reqwest::Client,
    url: &str,
    secret: &[u8],
    body: String,
) -> Result<(), String> {
    let res = signed_post(client, url, secret, body)
        .send()
        .await
        .map_err(|e| format!("POST failed: {e}"))?;
    let status = res.status();
    if status.is_success() {
        Ok(())
    } else {
        Err(format!("answered {status}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signature_matches_a_known_vector() {
        // printf '%s' '1700000000.{"a":1}' | openssl dgst -sha256 -hmac 'whsec_0123456789abcdef'
        assert_eq!(
            sign(b"whsec_0123456789abcdef", 1_700_000_000, br#"{"a":1}"#),
            "t=1700000000,v1=9f5e37cdc7ea587c7c02062d93283cad000d66a831b2a1676418696db47ed6c2"
        );
    }

    #[test]
    fn config_is_checked() {
        let ok = WebhookConfig {
            urls: vec!["http://127.0.0.1:9/hook".into()],
            secret: b"0123456789abcdef".to_vec(),
            batch_size: 1,
            batch_interval: Duration::from_millis(1),
            queue_limit: 1,
        };
        assert!(ok.validate().is_ok());
        let short = WebhookConfig {
            secret: b"short".to_vec(),
            ..ok.clone()
        };
        assert!(format!("{:#}", short.validate().unwrap_err()).contains("--webhook-secret"));
        let ftp = WebhookConfig {
            urls: vec!["ftp://example.com/".into()],
            ..ok.clone()
        };
        assert!(ftp.validate().is_err());
        let junk = WebhookConfig {
            urls: vec!["not a url".into()],
            ..ok
        };
        assert!(junk.validate().is_err());
    }
}
