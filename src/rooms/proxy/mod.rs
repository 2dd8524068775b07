//! The `proxy` room policy: the node asks the app's backend whether a user
//! may join a room (`--room-join-url`), with a POST signed like the
//! webhooks, and fails closed: no answer in time is `unavailable`, any
//! answer but `200 {"allow":true}` is a refusal.
//!
//! - Bounded: at most `--room-join-max-in-flight` requests are out at once
//!   on a node; a question beyond it is `unavailable` at once, so a flood
//!   of joins costs the node nothing that grows. Questions about the same
//!   (user, room) asked while its request is out wait for that request.
//! - Cached per (user, room) ([`cache`]): allowed answers for
//!   `--room-join-cache-ms`, refusals only as long as the backend's own
//!   `Cache-Control` says. A refusal, even one not to be kept, ends an
//!   earlier grant.
//! - Members are not thrown out by a blip: a member's own rejoin (Redis
//!   lost its membership) and its join again of a room it is in may use
//!   an allowed answer for one more `--room-join-cache-ms` after it expired
//!   when the backend cannot be asked; after that, they are `unavailable`
//!   like anyone's.
//!
//! The request runs in a task of its own: a join cancelled meanwhile (its
//! session closed, an HTTP read's deadline passed) leaves the answer to
//! the cache and to whoever else waits for it.

mod ask;
pub mod cache;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::value::RawValue;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

use crate::metrics::METRICS;
pub use cache::Grant;
use cache::{key, Cache, Kept, Lookup};

/// Default longest wait for the backend's answer.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(2_000);
/// Default time an allowed answer is kept.
pub const DEFAULT_CACHE: Duration = Duration::from_millis(60_000);
/// Default most requests to the backend in flight on one node.
pub const DEFAULT_MAX_IN_FLIGHT: u32 = 64;
/// What the `device` of a question is when no device asks: an HTTP read
/// of a room (`GET /api/rooms/{room}`, `POST /api/rooms/query`). No
/// device id is empty.
pub const READ_DEVICE: &str = "";

/// Where and how to ask (`--room-join-*` flags).
#[derive(Clone)]
pub struct RoomJoinConfig {
    /// The backend's endpoint.
    pub url: String,
    /// HMAC-SHA256 key of the `Presence-Signature` header.
    pub secret: Vec<u8>,
    /// Longest wait for an answer.
    pub timeout: Duration,
    /// How long an allowed answer is kept (and, past that, how long it
    /// still holds for a member the backend cannot be asked about).
    pub cache: Duration,
    /// Most requests in flight at once.
    pub max_in_flight: u32,
}

impl std::fmt::Debug for RoomJoinConfig {
    /// Without the secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RoomJoinConfig")
            .field("url", &self.url)
            .field("timeout", &self.timeout)
            .field("cache", &self.cache)
            .field("max_in_flight", &self.max_in_flight)
            .finish_non_exhaustive()
    }
}

impl RoomJoinConfig {
    /// Refuses what cannot work: a URL that is not http(s), a short secret,
    /// no time to answer, no request allowed.
    pub fn validate(&self) -> anyhow::Result<()> {
        let parsed = reqwest::Url::parse(&self.url)
            .map_err(|e| anyhow::anyhow!("--room-join-url {:?} is not a URL: {e}", self.url))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            anyhow::bail!("--room-join-url {:?} must be http:// or https://", self.url);
        }
        let min = crate::webhooks::MIN_SECRET_BYTES;
        if self.secret.len() < min {
            anyhow::bail!(
                "--room-join-url needs --room-join-secret (or --room-join-secret-file) of at least {min} bytes: the backend checks every question's signature with it"
            );
        }
        if self.timeout.is_zero() || self.max_in_flight == 0 {
            anyhow::bail!(
                "--room-join-timeout-ms and --room-join-max-in-flight must be at least 1"
            );
        }
        Ok(())
    }
}

/// What the backend (or the cache) decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Let in; with the state (serialized) that replaces the device's own,
    /// and when it was asked.
    Allow(Grant),
    /// Refused (`forbidden`), and why.
    Refuse(Arc<str>),
    /// No answer (`unavailable`), and why.
    Unavailable(Arc<str>),
}

/// One question: may `user` (on `device`) join `room` with `state`?
#[derive(Serialize)]
pub struct Question<'a> {
    /// The user.
    pub user: &'a str,
    /// Its device ([`READ_DEVICE`] for an HTTP read).
    pub device: &'a str,
    /// The room.
    pub room: &'a str,
    /// The state the device joins with: a JSON object, as it sent it.
    pub state: &'a RawValue,
}

/// The node's asker: its client, its bound and its cache; shared by every
/// session and HTTP handler of the node.
pub struct RoomProxy {
    /// Where and how.
    config: RoomJoinConfig,
    /// Largest state an answer may carry (`--max-room-state-bytes`).
    max_state_bytes: usize,
    /// One client, so that connections to the backend are kept and reused.
    client: reqwest::Client,
    /// One per request in flight.
    permits: Arc<Semaphore>,
    /// The answers, and the requests out.
    inner: Mutex<Inner>,
}

/// What the lock guards: looking up, joining a request out and starting
/// one are one step, so that two questions never start two requests.
struct Inner {
    /// The answers kept.
    cache: Cache,
    /// The requests out, by key; their answer comes on the channel.
    flights: HashMap<Arc<str>, watch::Receiver<Option<Verdict>>>,
}

/// A question whose answer is on its way.
pub struct Waiting {
    /// The asker, for a member's fallback.
    proxy: Arc<RoomProxy>,
    /// The (user, room).
    key: Arc<str>,
    /// Where the answer comes.
    answer: watch::Receiver<Option<Verdict>>,
    /// The asker is a member of the room already.
    member: bool,
}

impl RoomProxy {
    /// The asker of `config`; answers carry states of at most
    /// `max_state_bytes`.
    pub fn new(config: RoomJoinConfig, max_state_bytes: usize) -> anyhow::Result<Arc<Self>> {
        config.validate()?;
        let client = reqwest::Client::builder()
            .connect_timeout(config.timeout)
            // A redirect would carry the signed question elsewhere: it is
            // an answer like any other but 200, a refusal.
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("presence-server/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| anyhow::anyhow!("cannot build the room-join HTTP client: {e}"))?;
        Ok(Arc::new(Self {
            permits: Arc::new(Semaphore::new(config.max_in_flight as usize)),
            config,
            max_state_bytes,
            client,
            inner: Mutex::new(Inner {
                cache: Cache::new(cache::MAX_ENTRIES),
                flights: HashMap::new(),
            }),
        }))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // The cache and the flights stay consistent whatever panicked.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The answer to `question` at once when the cache has it (or none can
    /// be had: too many requests out); else the answer on its way, from a
    /// request started now or one already out for the same (user, room).
    /// `member`: the asker is in the room already (its own rejoin, or a
    /// join again), and may be let in on an expired grant while the
    /// backend cannot be asked.
    pub fn decide(
        self: &Arc<Self>,
        question: &Question<'_>,
        member: bool,
    ) -> Result<Verdict, Waiting> {
        let key = key(question.user, question.room);
        let mut inner = self.lock();
        let stale = match inner.cache.lookup(&key, Instant::now()) {
            Lookup::Fresh(kept) => {
                let (answer, verdict) = match kept {
                    Kept::Allowed(grant) => ("allowed", Verdict::Allow(grant)),
                    Kept::Refused(why) => ("refused", Verdict::Refuse(why)),
                };
                METRICS
                    .room_join
                    .cache_hits
                    .with_label_values(&[answer])
                    .inc();
                return Ok(verdict);
            }
            Lookup::Stale(grant) => Some(grant),
            Lookup::Missing => None,
        };
        if let Some(answer) = inner.flights.get(&key) {
            METRICS.room_join.shared.inc();
            return Err(Waiting {
                proxy: self.clone(),
                key,
                answer: answer.clone(),
                member,
            });
        }
        let Ok(permit) = self.permits.clone().try_acquire_owned() else {
            drop(inner);
            METRICS.room_join.shed.inc();
            let why = format!(
                "{} requests to it are in flight already (--room-join-max-in-flight)",
                self.config.max_in_flight
            );
            return Ok(fallback(member, stale, why.into()));
        };
        let (tx, answer) = watch::channel(None);
        inner.flights.insert(key.clone(), answer.clone());
        drop(inner);
        let body = serde_json::to_string(question).unwrap_or_default();
        tokio::spawn(self.clone().fly(key.clone(), body, tx, permit));
        Err(Waiting {
            proxy: self.clone(),
            key,
            answer,
            member,
        })
    }

    /// One request: sent, answered (or not), kept, told to every waiter.
    async fn fly(
        self: Arc<Self>,
        key: Arc<str>,
        body: String,
        tx: watch::Sender<Option<Verdict>>,
        permit: OwnedSemaphorePermit,
    ) {
        let started = Instant::now();
        METRICS.room_join.in_flight.inc();
        let answer = ask::ask(
            &self.client,
            &self.config.url,
            &self.config.secret,
            body,
            self.config.timeout,
            self.max_state_bytes,
            crate::clock::now_ms(),
        )
        .await;
        METRICS.room_join.in_flight.dec();
        drop(permit);
        METRICS
            .room_join
            .latency
            .observe(started.elapsed().as_secs_f64());
        METRICS
            .room_join
            .requests
            .with_label_values(&[answer.outcome.label()])
            .inc();
        if answer.outcome != ask::Outcome::Allowed {
            log::debug!("room-join backend on {key}: {:?}", answer.verdict);
        }
        {
            let mut inner = self.lock();
            if let Some((kept, fresh)) = ask::keep_for(&answer, self.config.cache) {
                inner
                    .cache
                    .store(key.clone(), kept, fresh, self.config.cache, Instant::now());
            }
            inner.flights.remove(&key);
        }
        // No one may be waiting any more: nothing to tell then.
        let _ = tx.send(Some(answer.verdict));
    }

    /// How long a node may hold a grant, its grace included: a removal
    /// voids the grants asked before it for this long.
    pub fn grants_kept(&self) -> Duration {
        2 * self.config.cache
    }

    /// Forgets the answer kept for `user` in `room`: the join step found
    /// it older than the user's removal.
    pub fn forget(&self, user: &str, room: &str) {
        self.lock().cache.forget(&key(user, room));
    }

    /// A stale grant of `key` for a member the backend could not be asked
    /// about; `None` past its grace.
    fn stale(&self, key: &str) -> Option<Grant> {
        match self.lock().cache.lookup(key, Instant::now()) {
            Lookup::Stale(grant) => Some(grant),
            // Answered meanwhile by another request.
            Lookup::Fresh(Kept::Allowed(grant)) => Some(grant),
            Lookup::Fresh(Kept::Refused(_)) | Lookup::Missing => None,
        }
    }
}

impl Waiting {
    /// The answer, once it came; a member's fallback when it is no answer.
    pub async fn answer(mut self) -> Verdict {
        let verdict = match self.answer.wait_for(Option::is_some).await {
            Ok(v) => v.clone().unwrap_or_else(lost),
            // The request's task ended without a word (it panicked).
            Err(_) => lost(),
        };
        match verdict {
            Verdict::Unavailable(why) => {
                let stale = self.proxy.stale(&self.key);
                fallback(self.member, stale, why)
            }
            verdict => verdict,
        }
    }
}

/// The verdict when the backend gave none.
fn lost() -> Verdict {
    Verdict::Unavailable("the request to it was lost".into())
}

/// No answer: `unavailable`, but a member with a grant within its grace is
/// let back in.
fn fallback(member: bool, stale: Option<Grant>, why: Arc<str>) -> Verdict {
    match stale {
        Some(grant) if member => {
            METRICS.room_join.stale.inc();
            Verdict::Allow(grant)
        }
        _ => Verdict::Unavailable(why),
    }
}
