//! The node's sharded subscriptions: `SSUBSCRIBE presence-events:{<user>}`
//! for exactly the users its sessions watch.
//!
//! One task owns a dedicated RESP3 connection (pushes arrive out of band)
//! and the set of channels the registry wants. It subscribes on request and
//! answers once Redis has confirmed, so that a watcher's snapshot is read
//! only after its events can no longer be missed. When the connection
//! drops it reconnects with backoff and subscribes to every wanted channel
//! again; when Redis drops one channel on its own (a `sunsubscribe` push:
//! the slot moved, a failover) it subscribes again. Either way the registry
//! is told, so that it re-reads what may have changed meanwhile.
//!
//! The redis crate offers SSUBSCRIBE on its cluster connection only. On one
//! server the task sends it in a pipeline closed by a PING: in RESP3 every
//! subscription confirmation is a push, not a reply, so the PING's reply is
//! the one reply the pipeline waits for, and it comes after Redis has
//! processed every SSUBSCRIBE before it.
//!
//! On a Redis Cluster the task holds a RESP3 cluster connection instead:
//! each channel is subscribed on the primary of its slot (the channels of
//! one slot in one command), and the connection resubscribes by itself
//! after a node's connection drops. When one does (a primary died and its
//! replica took over), the task subscribes to every wanted channel again,
//! so that each is confirmed on its slot's current primary, and then tells
//! the registry as after a reconnection: events published on the dead
//! primary meanwhile may be lost.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::Slot;
use redis::{AsyncConnectionConfig, ProtocolVersion, PushInfo, PushKind, RedisResult, Value};
use tokio::sync::{mpsc, oneshot};

use super::{shrink_if_sparse, Source};
use crate::ids::UserId;
use crate::keys;

/// The channel sets are shrunk only above this capacity: a million
/// channels' worth of slots stayed resident after a crowd of watchers left.
const SPARSE_CHANNELS_MIN: usize = 1024;

/// First wait before reconnecting after the connection broke.
const BACKOFF_MIN: Duration = Duration::from_millis(100);
/// Longest wait between reconnection attempts.
const BACKOFF_MAX: Duration = Duration::from_secs(1);
/// How long one subscribe round trip may take.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long connecting to a cluster node may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// What the subscription task reports.
#[derive(Debug)]
pub enum Notice {
    /// The connection is (again) up and every wanted channel subscribed.
    Ready,
    /// A message on one of the channels.
    Message {
        /// Its channel.
        channel: String,
        /// Its payload.
        payload: String,
    },
    /// Redis dropped these channels on its own; they are subscribed again,
    /// and what they carried meanwhile is lost.
    Dropped {
        /// The channels.
        channels: Vec<String>,
    },
}

/// One channel to subscribe to.
#[derive(Debug, Clone)]
pub enum Channel {
    /// A user's `presence-events:{<user>}`, held as the registry's shared
    /// id of the user: a node may want a million of them, and the name
    /// is written only when a command is (issue 29, memory per watch).
    Events(UserId),
    /// Any other channel (a room's), by name.
    Named(String),
}

impl Channel {
    /// The channel's name.
    fn name(&self) -> String {
        match self {
            Channel::Events(user) => keys::events(user),
            Channel::Named(name) => name.clone(),
        }
    }
}

/// A request to the subscription task.
enum Request {
    /// Subscribe; answer once confirmed.
    Subscribe {
        channels: Vec<Channel>,
        done: oneshot::Sender<RedisResult<()>>,
    },
    /// Unsubscribe (no answer).
    Unsubscribe { channels: Vec<Channel> },
}

/// Handle on the node's subscription task; cheap to clone. The task ends
/// when the last handle is dropped or `on_notice` returns false.
#[derive(Clone)]
pub struct Subscriptions {
    tx: mpsc::UnboundedSender<Request>,
}

impl Subscriptions {
    /// Starts the task on the current runtime: it connects through `source`
    /// (to the primary it names, asking again on every reconnection so that
    /// it follows a Sentinel failover; or to a cluster), as RESP3 whatever
    /// the URL says, and hands every [`Notice`] to `on_notice`. `held` are
    /// wanted from the start, for good: the first [`Notice::Ready`] comes
    /// once they are subscribed.
    pub fn start(
        source: &Source,
        held: Vec<Channel>,
        on_notice: impl FnMut(Notice) -> bool + Send + 'static,
    ) -> RedisResult<Self> {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(source.clone(), held, rx, on_notice));
        Ok(Self { tx })
    }

    /// Subscribes to `channels`; returns once Redis has confirmed.
    pub async fn subscribe(&self, channels: Vec<Channel>) -> RedisResult<()> {
        let (done, answer) = oneshot::channel();
        let gone = || redis::RedisError::from(std::io::Error::other("subscription task stopped"));
        self.tx
            .send(Request::Subscribe { channels, done })
            .map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }

    /// Unsubscribes from `channels`.
    pub fn unsubscribe(&self, channels: Vec<Channel>) {
        let _ = self.tx.send(Request::Unsubscribe { channels });
    }
}

/// The subscription connection: to one server, or to a cluster.
enum Link {
    /// One server.
    Single(MultiplexedConnection),
    /// A cluster.
    Cluster(ClusterConnection),
}

impl Link {
    /// Connects through `source`, pushes going to `pushes`.
    async fn connect(
        source: &Source,
        pushes: mpsc::UnboundedSender<PushInfo>,
    ) -> RedisResult<Self> {
        match source {
            Source::Single(source) => {
                let config = AsyncConnectionConfig::new()
                    .set_push_sender(pushes)
                    .set_response_timeout(Some(RESPONSE_TIMEOUT))
                    .set_connection_timeout(Some(RESPONSE_TIMEOUT));
                Ok(Self::Single(
                    resp3(source.client().await?)?
                        .get_multiplexed_async_connection_with_config(&config)
                        .await?,
                ))
            }
            Source::Cluster(seeds) => Ok(Self::Cluster(
                seeds
                    .builder(CONNECT_TIMEOUT, RESPONSE_TIMEOUT)
                    .use_protocol(ProtocolVersion::RESP3)
                    .push_sender(pushes)
                    .build()?
                    .get_async_connection()
                    .await?,
            )),
        }
    }

    /// Sends `command` (SSUBSCRIBE or SUNSUBSCRIBE) for each of `channels`
    /// and waits until Redis has processed them.
    async fn send_all(&mut self, command: &str, channels: &[String]) -> RedisResult<()> {
        match self {
            Self::Single(conn) => send_all(conn, command, channels).await,
            Self::Cluster(conn) => {
                // One command per slot: a command's channels must share one.
                let mut by_slot: HashMap<Slot, Vec<&String>> = HashMap::new();
                for channel in channels {
                    by_slot
                        .entry(Slot::for_key(channel))
                        .or_default()
                        .push(channel);
                }
                let subscribe = command.eq_ignore_ascii_case("SSUBSCRIBE");
                let sends = by_slot.into_values().map(|group| {
                    let mut conn = conn.clone();
                    async move {
                        if subscribe {
                            conn.ssubscribe(group).await
                        } else {
                            conn.sunsubscribe(group).await
                        }
                    }
                });
                futures_util::future::join_all(sends)
                    .await
                    .into_iter()
                    .collect()
            }
        }
    }
}

/// Sends `command` for each of `channels` and waits until Redis has
/// processed them (see the module docs).
async fn send_all(
    conn: &mut MultiplexedConnection,
    command: &str,
    channels: &[String],
) -> RedisResult<()> {
    if channels.is_empty() {
        return Ok(());
    }
    let mut pipe = redis::pipe();
    for channel in channels {
        pipe.cmd(command).arg(channel);
    }
    pipe.cmd("PING");
    let replies = conn.req_packed_commands(&pipe, 0, 1).await?;
    match replies.first() {
        Some(Value::ServerError(e)) => Err(e.clone().into()),
        _ => Ok(()),
    }
}

/// `client` speaking RESP3 (pushes out of band), TLS settings kept.
fn resp3(client: redis::Client) -> RedisResult<redis::Client> {
    let info = client.get_connection_info().clone();
    let settings = info
        .redis_settings()
        .clone()
        .set_protocol(ProtocolVersion::RESP3);
    redis::Client::open(info.set_redis_settings(settings))
}

/// What the inner loop does after one request batch or push.
enum Flow {
    /// Keep reading on this connection.
    Continue,
    /// The connection failed: reconnect and subscribe again.
    Reconnect,
    /// The registry is gone: end the task.
    Stop,
}

/// The channel and payload of a sharded message push.
fn message_of(push: PushInfo) -> Option<(String, String)> {
    let mut data = push.data.into_iter();
    let channel = data
        .next()
        .and_then(|v| redis::from_redis_value::<String>(v).ok())?;
    let payload = data
        .next()
        .and_then(|v| redis::from_redis_value::<String>(v).ok())?;
    Some((channel, payload))
}

/// The channels the task holds.
#[derive(Default)]
struct Channels {
    /// Every channel the registry wants, across reconnects.
    wanted: Wanted,
    /// Our own SUNSUBSCRIBEs whose confirmation has not come yet: those
    /// pushes are not Redis dropping a channel.
    leaving: HashMap<String, u32>,
}

/// The channels the registry wants: users' events channels by user (the
/// registry's own `UserId`, 8 B a slot instead of a 24 B `String` and
/// its 32 B of name), any other by name.
#[derive(Default)]
struct Wanted {
    /// Users whose events channel is wanted.
    users: HashSet<UserId>,
    /// Other channels, by name.
    named: HashSet<String>,
}

impl Wanted {
    /// Adds `channel`.
    fn insert(&mut self, channel: Channel) {
        match channel {
            Channel::Events(user) => self.users.insert(user),
            Channel::Named(name) => self.named.insert(name),
        };
    }

    /// Removes `channel`; true if it was wanted.
    fn remove(&mut self, channel: &Channel) -> bool {
        match channel {
            Channel::Events(user) => self.users.remove(user),
            Channel::Named(name) => self.named.remove(name),
        }
    }

    /// Whether the channel named `name` is wanted.
    fn contains(&self, name: &str) -> bool {
        match keys::parse_events(name) {
            Some(user) => self.users.contains(user),
            None => self.named.contains(name),
        }
    }

    /// Every wanted channel's name.
    fn names(&self) -> Vec<String> {
        let users = self.users.iter().map(|u| keys::events(u));
        users.chain(self.named.iter().cloned()).collect()
    }

    /// Gives the tables' spare slots back once they are mostly empty.
    fn shrink_if_sparse(&mut self) {
        shrink_if_sparse(&mut self.users, SPARSE_CHANNELS_MIN);
        shrink_if_sparse(&mut self.named, SPARSE_CHANNELS_MIN);
    }
}

/// The subscription task.
async fn run(
    source: Source,
    held: Vec<Channel>,
    mut requests: mpsc::UnboundedReceiver<Request>,
    mut on_notice: impl FnMut(Notice) -> bool,
) {
    let mut channels = Channels::default();
    held.into_iter().for_each(|c| channels.wanted.insert(c));
    let mut backoff = BACKOFF_MIN;
    loop {
        let (push_tx, mut pushes) = mpsc::unbounded_channel::<PushInfo>();
        let mut conn = match Link::connect(&source, push_tx).await {
            Ok(conn) => conn,
            Err(e) => {
                // Said once per outage, not once per attempt.
                if backoff == BACKOFF_MIN {
                    log::warn!("cannot connect for the event subscriptions (retrying): {e}");
                } else {
                    log::debug!("cannot connect for the event subscriptions yet: {e}");
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
                continue;
            }
        };
        let all = channels.wanted.names();
        if let Err(e) = conn.send_all("SSUBSCRIBE", &all).await {
            log::warn!("cannot subscribe to the watched users' events: {e}");
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(BACKOFF_MAX);
            continue;
        }
        channels.leaving.clear();
        backoff = BACKOFF_MIN;
        log::info!("subscribed to the events of {} watched users", all.len());
        if !on_notice(Notice::Ready) {
            return;
        }
        loop {
            let flow = tokio::select! {
                request = requests.recv() => match request {
                    None => Flow::Stop,
                    Some(first) => requested(&mut conn, &mut channels, first, &mut requests).await,
                },
                push = pushes.recv() => match push {
                    None => Flow::Reconnect,
                    Some(push) => {
                        pushed(push, &mut conn, &mut channels, &mut pushes, &mut on_notice).await
                    }
                },
            };
            match flow {
                Flow::Continue => {}
                Flow::Reconnect => break,
                Flow::Stop => return,
            }
        }
        log::warn!("event subscriptions lost; reconnecting");
        tokio::time::sleep(backoff).await;
    }
}

/// Runs `first` and every request queued meanwhile, in order; consecutive
/// subscribes share one round trip.
async fn requested(
    conn: &mut Link,
    channels: &mut Channels,
    first: Request,
    requests: &mut mpsc::UnboundedReceiver<Request>,
) -> Flow {
    let mut queued = vec![first];
    while let Ok(more) = requests.try_recv() {
        queued.push(more);
    }
    let mut batch: Vec<(Vec<Channel>, oneshot::Sender<RedisResult<()>>)> = Vec::new();
    let mut failed = false;
    for request in queued {
        match request {
            Request::Subscribe { channels: c, done } => batch.push((c, done)),
            Request::Unsubscribe { channels: c } => {
                failed |= !join(conn, &mut channels.wanted, std::mem::take(&mut batch)).await;
                leave(conn, &mut channels.wanted, &mut channels.leaving, c).await;
            }
        }
    }
    failed |= !join(conn, &mut channels.wanted, batch).await;
    if failed {
        Flow::Reconnect
    } else {
        Flow::Continue
    }
}

/// Handles one push from Redis: a message, a dropped channel, or (on a
/// cluster) one node's connection dropping.
async fn pushed(
    push: PushInfo,
    conn: &mut Link,
    channels: &mut Channels,
    pushes: &mut mpsc::UnboundedReceiver<PushInfo>,
    on_notice: &mut impl FnMut(Notice) -> bool,
) -> Flow {
    match push.kind {
        PushKind::SMessage => match message_of(push) {
            Some((channel, payload)) => {
                if on_notice(Notice::Message { channel, payload }) {
                    Flow::Continue
                } else {
                    Flow::Stop
                }
            }
            None => Flow::Continue,
        },
        PushKind::SUnsubscribe => {
            let Some(channel) = push
                .data
                .into_iter()
                .next()
                .and_then(|v| redis::from_redis_value::<String>(v).ok())
            else {
                return Flow::Continue;
            };
            if let Some(n) = channels.leaving.get_mut(&channel) {
                *n -= 1;
                if *n == 0 {
                    channels.leaving.remove(&channel);
                    shrink_if_sparse(&mut channels.leaving, SPARSE_CHANNELS_MIN);
                }
                return Flow::Continue;
            }
            if !channels.wanted.contains(&channel) {
                return Flow::Continue;
            }
            log::info!("redis dropped the subscription to {channel}; subscribing again");
            let dropped = vec![channel];
            if conn.send_all("SSUBSCRIBE", &dropped).await.is_err() {
                return Flow::Reconnect;
            }
            if !on_notice(Notice::Dropped { channels: dropped }) {
                return Flow::Stop;
            }
            Flow::Continue
        }
        PushKind::Disconnection => {
            let Link::Cluster(_) = conn else {
                return Flow::Reconnect;
            };
            // One node's connection dropped; see the module docs.
            while let Ok(more) = pushes.try_recv() {
                if let PushKind::SMessage = more.kind {
                    if let Some((channel, payload)) = message_of(more) {
                        if !on_notice(Notice::Message { channel, payload }) {
                            return Flow::Stop;
                        }
                    }
                }
            }
            let all = channels.wanted.names();
            log::info!(
                "a redis cluster node's connection dropped; confirming the {} subscriptions",
                all.len()
            );
            if let Err(e) = conn.send_all("SSUBSCRIBE", &all).await {
                log::warn!("cannot renew the subscriptions: {e}");
                return Flow::Reconnect;
            }
            if !on_notice(Notice::Ready) {
                return Flow::Stop;
            }
            Flow::Continue
        }
        _ => Flow::Continue,
    }
}

/// Subscribes to every channel of `batch` in one round trip and answers
/// each request; false when the round trip failed (the connection is then
/// replaced, and the channels stay wanted for the next one).
async fn join(
    conn: &mut Link,
    wanted: &mut Wanted,
    batch: Vec<(Vec<Channel>, oneshot::Sender<RedisResult<()>>)>,
) -> bool {
    if batch.is_empty() {
        return true;
    }
    let mut channels = Vec::new();
    let mut answers = Vec::with_capacity(batch.len());
    for (c, done) in batch {
        channels.extend(c.iter().map(Channel::name));
        c.into_iter().for_each(|c| wanted.insert(c));
        answers.push(done);
    }
    let result = conn.send_all("SSUBSCRIBE", &channels).await;
    let ok = result.is_ok();
    for done in answers {
        let _ = done.send(result.clone());
    }
    ok
}

/// Unsubscribes from `channels`, remembering the confirmations to expect.
async fn leave(
    conn: &mut Link,
    wanted: &mut Wanted,
    leaving: &mut HashMap<String, u32>,
    channels: Vec<Channel>,
) {
    let channels: Vec<String> = channels
        .into_iter()
        .filter(|c| wanted.remove(c))
        .map(|c| c.name())
        .collect();
    wanted.shrink_if_sparse();
    for channel in &channels {
        *leaving.entry(channel.clone()).or_default() += 1;
    }
    if let Err(e) = conn.send_all("SUNSUBSCRIBE", &channels).await {
        // The connection is going; a new one subscribes only to `wanted`.
        log::debug!("unsubscribe failed: {e}");
    }
}
