//! The one connection type the store calls Redis through.
//!
//! [`RedisConn`] is ours so that the store does not depend on which kind of
//! connection is behind it: one server through a [`PrimaryConn`] (a
//! multiplexed `ConnectionManager` created at start, cloned into every
//! actor, reconnecting by itself, and following a Sentinel failover), or a
//! Redis Cluster through the redis crate's
//! async cluster connection (one multiplexed connection per node, routing
//! each command by its key's slot, following failovers and resharding).
//! Every command and pipeline sent through it is timed into the node's
//! metrics, under the command's name or, for a script, the step's.
//!
//! # Pipelines on a cluster
//! The cluster connection sends a pipeline to one node and refuses one whose
//! keys span slots. The store's pipelines do span them (a refresh batch of
//! many users, the buckets of the online list), so a pipeline is split here:
//! its commands are grouped by their key's slot, the groups are sent side by
//! side, and the replies are put back in the pipeline's order. A group whose
//! node cannot be reached answers each of its commands with an error reply,
//! so that one shard in failover fails only its own users' steps (the
//! pipelines that ignore errors parse each reply on its own). Every step of
//! one user shares the `{<user>}` tag, so no script spans slots.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, RwLock};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, Slot, SlotAddr};
use redis::{Arg, Cmd, Pipeline, RedisFuture, RedisResult, Value};

use crate::redis::PrimaryConn;

/// The store's handle on Redis; cheap to clone.
#[derive(Clone)]
pub struct RedisConn {
    /// The connection doing the work.
    inner: Inner,
}

/// The kinds of connection behind a [`RedisConn`].
#[derive(Clone)]
enum Inner {
    /// One Redis server (behind Sentinel, the current primary).
    Single(PrimaryConn),
    /// A Redis Cluster.
    Cluster(Healing),
}

/// How long a cluster connection may answer nothing but timeouts before it
/// is replaced (on top of the response timeout that made the first one).
const STUCK_FOR: Duration = Duration::from_secs(2);

/// A cluster connection that is replaced by a fresh one from the same
/// client when it stops answering. Under load during a failover, the redis
/// crate's cluster connection was seen to stay stuck in a slot refresh,
/// every command timing out, for as long as the node ran, while a new
/// connection to the same cluster worked at once.
///
/// Waiting for the timeouts to show it takes the response timeout (5 s)
/// and [`STUCK_FOR`] more: longer than short leases live, and the
/// refreshes of every shard fail meanwhile (they share a batch). So it is
/// also replaced at once when `CLUSTER SHARDS` (read every second by the
/// expiry streams) names other primaries than the last time: a failover
/// happened, and the old connection may route the promoted shard's slots
/// to the dead node. In a failover test under load the stuck connection
/// answered nothing from the promotion until 5.5 s later.
#[derive(Clone)]
struct Healing {
    shared: Arc<HealingState>,
}

/// Makes a new cluster client (from the nodes last known).
type ClientMaker = Box<dyn Fn() -> RedisResult<redis::cluster::ClusterClient> + Send + Sync>;

struct HealingState {
    conn: RwLock<ClusterConnection>,
    /// Makes the replacement; `None` for a connection wrapped as it is.
    client: Option<ClientMaker>,
    /// Since when (ms after `epoch`, plus one) only timeouts came back; 0
    /// while the connection answers.
    failing_since: AtomicU64,
    epoch: Instant,
    /// A replacement is being made.
    replacing: AtomicBool,
    /// The primaries' node ids `CLUSTER SHARDS` named last, sorted.
    primaries: Mutex<Vec<String>>,
}

impl Healing {
    fn new(conn: ClusterConnection, client: Option<ClientMaker>) -> Self {
        Self {
            shared: Arc::new(HealingState {
                conn: RwLock::new(conn),
                client,
                failing_since: AtomicU64::new(0),
                epoch: Instant::now(),
                replacing: AtomicBool::new(false),
                primaries: Mutex::new(Vec::new()),
            }),
        }
    }

    /// The connection to send on now.
    fn get(&self) -> ClusterConnection {
        self.shared
            .conn
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Takes in one outcome: an answer clears the count; timeouts for
    /// longer than [`STUCK_FOR`] start the replacement.
    fn note<T>(&self, result: &RedisResult<T>) {
        let s = &self.shared;
        match result {
            Err(e) if e.is_timeout() => {
                let now = s.epoch.elapsed().as_millis() as u64 + 1;
                let since = match s.failing_since.compare_exchange(
                    0,
                    now,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => now,
                    Err(since) => since,
                };
                if now - since >= STUCK_FOR.as_millis() as u64 {
                    self.replace(Why::Stuck);
                }
            }
            Err(_) => {}
            Ok(_) => s.failing_since.store(0, Ordering::Release),
        }
    }

    /// Takes in the shards `CLUSTER SHARDS` named: other primaries than
    /// the last time (not the first time) start the replacement.
    fn saw(&self, shards: &[Shard]) {
        let changed = {
            let mut last = self
                .shared
                .primaries
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            other_primaries(&mut last, shards)
        };
        if changed {
            self.replace(Why::Failover);
        }
    }

    fn replace(&self, why: Why) {
        let Some(make) = &self.shared.client else {
            return;
        };
        if self.shared.replacing.swap(true, Ordering::AcqRel) {
            return;
        }
        let client = make();
        let me = self.clone();
        tokio::spawn(async move {
            let s = &me.shared;
            let conn = match client {
                Ok(client) => client.get_async_connection().await,
                Err(e) => Err(e),
            };
            match conn {
                Ok(conn) => {
                    *s.conn.write().unwrap_or_else(|e| e.into_inner()) = conn;
                    match why {
                        Why::Stuck => log::warn!(
                            "the redis cluster connection answered only timeouts for {STUCK_FOR:?}; replaced it with a new one"
                        ),
                        Why::Failover => log::info!(
                            "the redis cluster has other primaries; replaced the cluster connection with a new one"
                        ),
                    }
                }
                Err(e) => log::warn!("cannot replace the stuck redis cluster connection: {e}"),
            }
            s.failing_since.store(0, Ordering::Release);
            s.replacing.store(false, Ordering::Release);
        });
    }
}

/// Whether `shards` name other primaries than `last` (which they then
/// become); never on the first reading.
fn other_primaries(last: &mut Vec<String>, shards: &[Shard]) -> bool {
    let mut now: Vec<String> = shards.iter().map(|s| s.primary_id.clone()).collect();
    now.sort_unstable();
    let changed = !last.is_empty() && *last != now;
    *last = now;
    changed
}

/// Why a cluster connection is replaced.
#[derive(Debug, Clone, Copy)]
enum Why {
    /// It answered only timeouts for [`STUCK_FOR`].
    Stuck,
    /// `CLUSTER SHARDS` named other primaries.
    Failover,
}

/// One node a command can be sent to on its own (a SCAN walks one node's
/// keys): the one server, or one primary of a cluster.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NodeAddr(Option<(String, u16)>);

impl NodeAddr {
    /// The one server of a standalone deployment.
    pub fn single() -> Self {
        Self(None)
    }

    /// A cluster node by host and port.
    pub fn node(host: impl Into<String>, port: u16) -> Self {
        Self(Some((host.into(), port)))
    }

    /// Host and port of a cluster node; `None` for the one server.
    pub fn host_port(&self) -> Option<(&str, u16)> {
        self.0.as_ref().map(|(h, p)| (h.as_str(), *p))
    }
}

impl std::fmt::Display for NodeAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Some((host, port)) => write!(f, "{host}:{port}"),
            None => f.write_str("redis"),
        }
    }
}

impl RedisConn {
    /// Wraps a connection to the primary (or a plain connection manager).
    pub fn new(inner: impl Into<PrimaryConn>) -> Self {
        Self {
            inner: Inner::Single(inner.into()),
        }
    }

    /// Wraps a cluster connection as it is.
    pub fn cluster(inner: ClusterConnection) -> Self {
        Self {
            inner: Inner::Cluster(Healing::new(inner, None)),
        }
    }

    /// A cluster connection, replaced by a new one from a client `make`
    /// makes should it answer only timeouts (see [`STUCK_FOR`]).
    pub fn cluster_from(
        make: impl Fn() -> RedisResult<redis::cluster::ClusterClient> + Send + Sync + 'static,
        inner: ClusterConnection,
    ) -> Self {
        Self {
            inner: Inner::Cluster(Healing::new(inner, Some(Box::new(make)))),
        }
    }

    /// Whether this is a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self.inner, Inner::Cluster(_))
    }

    /// The nodes holding the data, each to be walked on its own by a SCAN:
    /// the one server, or every primary of the cluster (`CLUSTER SHARDS`).
    pub async fn data_nodes(&self) -> RedisResult<Vec<NodeAddr>> {
        match &self.inner {
            Inner::Single(_) => Ok(vec![NodeAddr::single()]),
            Inner::Cluster(_) => Ok(self
                .shards()
                .await?
                .into_iter()
                .map(|shard| shard.primary)
                .collect()),
        }
    }

    /// The cluster's shards that serve slots, as `CLUSTER SHARDS` tells;
    /// empty on one server.
    pub async fn shards(&self) -> RedisResult<Vec<Shard>> {
        let Inner::Cluster(healing) = &self.inner else {
            return Ok(Vec::new());
        };
        let result = healing
            .get()
            .route_command(
                redis::cmd("CLUSTER").arg("SHARDS").clone(),
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::RandomPrimary),
            )
            .await;
        healing.note(&result);
        let shards = parse_shards(&result?);
        healing.saw(&shards);
        Ok(shards)
    }

    /// Sends `cmd` to `node` (a cluster node by address; the one server as
    /// any command).
    pub async fn query_on(&self, node: &NodeAddr, cmd: &Cmd) -> RedisResult<Value> {
        match (&self.inner, node.host_port()) {
            (Inner::Cluster(healing), Some((host, port))) => {
                let started = Instant::now();
                let result = healing
                    .get()
                    .route_command(
                        cmd.clone(),
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                            host: host.to_string(),
                            port,
                        }),
                    )
                    .await;
                healing.note(&result);
                observe(label(Some(cmd)), started, &result);
                result
            }
            _ => self.clone().req_packed_command(cmd).await,
        }
    }
}

/// One shard of a cluster: its primary and every node's address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shard {
    /// The primary's node id.
    pub primary_id: String,
    /// The primary's address.
    pub primary: NodeAddr,
    /// Every node of the shard, primary and replicas, reachable or not.
    pub nodes: Vec<NodeAddr>,
}

/// The fields of a `CLUSTER SHARDS` map, RESP2 (a flat array of pairs) or
/// RESP3 (a map).
fn fields(v: &Value) -> Vec<(String, &Value)> {
    match v {
        Value::Map(pairs) => pairs
            .iter()
            .filter_map(|(k, v)| Some((redis::from_redis_value_ref::<String>(k).ok()?, v)))
            .collect(),
        Value::Array(items) => items
            .chunks(2)
            .filter_map(|pair| match pair {
                [k, v] => Some((redis::from_redis_value_ref::<String>(k).ok()?, v)),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// The shards of a `CLUSTER SHARDS` reply that serve slots and have a
/// healthy primary.
fn parse_shards(reply: &Value) -> Vec<Shard> {
    let Value::Array(shards) = reply else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for shard in shards {
        let shard = fields(shard);
        let get = |name: &str| shard.iter().find(|(k, _)| k == name).map(|(_, v)| *v);
        let has_slots = matches!(get("slots"), Some(Value::Array(s)) if !s.is_empty());
        let Some(Value::Array(nodes)) = get("nodes") else {
            continue;
        };
        let mut primary = None;
        let mut addrs = Vec::new();
        for node in nodes {
            let node = fields(node);
            let text = |name: &str| {
                node.iter()
                    .find(|(k, _)| k == name)
                    .and_then(|(_, v)| redis::from_redis_value_ref::<String>(v).ok())
            };
            let (Some(ip), Some(port)) = (
                text("ip").or_else(|| text("endpoint")),
                text("port").and_then(|p| p.parse::<u16>().ok()),
            ) else {
                continue;
            };
            let addr = NodeAddr::node(ip, port);
            addrs.push(addr.clone());
            if text("role").as_deref() == Some("master")
                && text("health").as_deref() == Some("online")
            {
                primary = text("id").map(|id| (id, addr));
            }
        }
        if let (true, Some((primary_id, primary))) = (has_slots, primary) {
            out.push(Shard {
                primary_id,
                primary,
                nodes: addrs,
            });
        }
    }
    out.sort_by(|a, b| a.primary_id.cmp(&b.primary_id));
    out
}

impl From<ConnectionManager> for RedisConn {
    fn from(inner: ConnectionManager) -> Self {
        Self::new(inner)
    }
}

impl From<ClusterConnection> for RedisConn {
    fn from(inner: ClusterConnection) -> Self {
        Self::cluster(inner)
    }
}

impl ConnectionLike for RedisConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let started = Instant::now();
            let result = match &mut self.inner {
                Inner::Single(conn) => conn.req_packed_command(cmd).await,
                Inner::Cluster(healing) => {
                    let result = healing.get().req_packed_command(cmd).await;
                    healing.note(&result);
                    result
                }
            };
            observe(label(Some(cmd)), started, &result);
            result
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let started = Instant::now();
            let result = match &mut self.inner {
                Inner::Single(conn) => conn.req_packed_commands(pipeline, offset, count).await,
                Inner::Cluster(healing) => split_pipeline(healing, pipeline, offset, count).await,
            };
            observe(label(pipeline.cmd_iter().next()), started, &result);
            result
        })
    }

    fn get_db(&self) -> i64 {
        match &self.inner {
            Inner::Single(conn) => conn.get_db(),
            Inner::Cluster(healing) => healing.get().get_db(),
        }
    }
}

/// The slot of the key `cmd` works on; `None` for a command without a key
/// (it may go with any group).
fn slot_of(cmd: &Cmd) -> Option<Slot> {
    let mut args = cmd.args_iter().map(|a| match a {
        Arg::Simple(bytes) => Some(bytes),
        _ => None,
    });
    let name = args.next()??;
    let key = if name.eq_ignore_ascii_case(b"EVALSHA") || name.eq_ignore_ascii_case(b"EVAL") {
        let _script = args.next()?;
        let numkeys: usize = std::str::from_utf8(args.next()??).ok()?.parse().ok()?;
        if numkeys == 0 {
            return None;
        }
        args.next()??
    } else if name.eq_ignore_ascii_case(b"PING") || name.eq_ignore_ascii_case(b"ECHO") {
        return None;
    } else {
        args.next()??
    };
    Some(Slot::for_key(key))
}

/// Sends `pipeline` over a cluster: as it is when its keys share one slot
/// (or it is a transaction, which must), else split by slot (see the module
/// docs).
async fn split_pipeline(
    healing: &Healing,
    pipeline: &Pipeline,
    offset: usize,
    count: usize,
) -> RedisResult<Vec<Value>> {
    let cmds: Vec<&Cmd> = pipeline.cmd_iter().collect();
    let mut groups: Vec<(Option<Slot>, Vec<usize>)> = Vec::new();
    let mut by_slot: HashMap<Slot, usize> = HashMap::new();
    let mut unkeyed = Vec::new();
    for (i, cmd) in cmds.iter().enumerate() {
        match slot_of(cmd) {
            Some(slot) => {
                let g = *by_slot.entry(slot).or_insert_with(|| {
                    groups.push((Some(slot), Vec::new()));
                    groups.len() - 1
                });
                groups[g].1.push(i);
            }
            None => unkeyed.push(i),
        }
    }
    let conn = healing.get();
    if pipeline.is_transaction() || groups.len() <= 1 {
        let result = conn
            .clone()
            .req_packed_commands(pipeline, offset, count)
            .await;
        healing.note(&result);
        return result;
    }
    // Commands without a key ride with the first group.
    groups[0].1.extend(unkeyed);
    let sends = groups.iter().map(|(slot, members)| {
        let mut sub = redis::pipe();
        for &i in members {
            sub.add_command(cmds[i].clone());
        }
        let route = SingleNodeRoutingInfo::SpecificNode(Route::with_slot(
            slot.expect("only keyed groups are made"),
            SlotAddr::Master,
        ));
        let mut conn = conn.clone();
        async move {
            let n = sub.len();
            conn.route_pipeline(sub, 0, n, route).await
        }
    });
    let replies = futures_util::future::join_all(sends).await;
    for reply in &replies {
        healing.note(reply);
    }
    if let Some(Err(e)) = replies.iter().find(|r| r.is_err()) {
        if replies.iter().all(|r| r.is_err()) {
            return Err(e.clone());
        }
    }
    let mut out = vec![Value::Nil; cmds.len()];
    for ((_, members), reply) in groups.iter().zip(replies) {
        match reply {
            Ok(values) => {
                for (&i, value) in members.iter().zip(values) {
                    out[i] = value;
                }
            }
            Err(e) => {
                // This shard failed; the others answered. Its commands get
                // an error reply each (see the module docs).
                let msg = e.to_string().replace(['\r', '\n'], " ");
                let error = redis::parse_redis_value(
                    format!("-ERR {SHARD_UNREACHABLE}: {msg}\r\n").as_bytes(),
                )
                .unwrap_or(Value::Nil);
                for &i in members {
                    out[i] = error.clone();
                }
            }
        }
    }
    Ok(out)
}

/// How the error reply of a command whose shard failed in a pipeline
/// begins (after `ERR`); the cause follows.
const SHARD_UNREACHABLE: &str = "shard unreachable";

/// Whether `e` is that error reply for a shard that did not answer in
/// time (redis's timeout error, "timed out", as its cause), as opposed to
/// one that refused or broke.
pub fn shard_timed_out(e: &redis::RedisError) -> bool {
    e.to_string()
        .contains(&format!("{SHARD_UNREACHABLE}: timed out"))
}

fn observe<T>(label: &'static str, started: Instant, result: &redis::RedisResult<T>) {
    crate::metrics::redis_call(label, started.elapsed(), result.is_err());
}

/// Names of the store's Lua scripts by SHA1, so that an EVALSHA is timed
/// under the step it runs rather than under one opaque label.
static SCRIPT_NAMES: LazyLock<RwLock<HashMap<String, &'static str>>> =
    LazyLock::new(Default::default);

/// Tells the latency labels the names of `scripts` (the store calls this
/// as it creates them).
pub(crate) fn name_scripts<'a>(
    scripts: impl IntoIterator<Item = (&'a redis::Script, &'static str)>,
) {
    let mut names = SCRIPT_NAMES.write().unwrap_or_else(|e| e.into_inner());
    for (script, name) in scripts {
        names.insert(script.get_hash().to_string(), name);
    }
}

/// The latency label of a command: its name in upper case, or for EVALSHA
/// the script's name; anything unexpected becomes "OTHER" so that the number
/// of series stays small.
fn label(cmd: Option<&Cmd>) -> &'static str {
    let Some(cmd) = cmd else {
        return "EMPTY";
    };
    let mut args = cmd.args_iter();
    let name = match args.next() {
        Some(Arg::Simple(name)) => name,
        _ => return "OTHER",
    };
    if name.eq_ignore_ascii_case(b"EVALSHA") {
        if let Some(Arg::Simple(sha)) = args.next() {
            let names = SCRIPT_NAMES.read().unwrap_or_else(|e| e.into_inner());
            if let Some(script) = std::str::from_utf8(sha).ok().and_then(|sha| names.get(sha)) {
                return script;
            }
        }
        return "EVALSHA";
    }
    const KNOWN: &[&str] = &[
        "PING",
        "GET",
        "SET",
        "DEL",
        "EXPIRE",
        "EXISTS",
        "MGET",
        "SCAN",
        "SSCAN",
        "SMEMBERS",
        "HGETALL",
        "HMGET",
        "ZADD",
        "ZREM",
        "ZRANGE",
        "ZRANGEBYSCORE",
        "ZREVRANGEBYSCORE",
        "ZSCORE",
        "ZMSCORE",
        "ZCARD",
        "CONFIG",
        "SCRIPT",
        "EVAL",
        "PUBLISH",
        "SPUBLISH",
        "CLUSTER",
        "INFO",
        "CLIENT",
    ];
    KNOWN
        .iter()
        .find(|k| name.eq_ignore_ascii_case(k.as_bytes()))
        .copied()
        .unwrap_or("OTHER")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_primary_is_seen_but_not_the_first_reading() {
        let shard = |id: &str| Shard {
            primary_id: id.to_string(),
            primary: NodeAddr::node("127.0.0.1", 7000),
            nodes: Vec::new(),
        };
        let mut last = Vec::new();
        assert!(!other_primaries(&mut last, &[shard("a"), shard("b")]));
        assert!(!other_primaries(&mut last, &[shard("b"), shard("a")]));
        // b's replica c took over.
        assert!(other_primaries(&mut last, &[shard("a"), shard("c")]));
        assert!(!other_primaries(&mut last, &[shard("c"), shard("a")]));
    }

    #[test]
    fn labels_name_commands_and_scripts() {
        assert_eq!(label(Some(&redis::cmd("ping"))), "PING");
        assert_eq!(label(Some(&redis::cmd("FLUSHALL"))), "OTHER");
        let arrive = redis::Script::new("return 1");
        name_scripts([(&arrive, "arrive")]);
        let mut evalsha = redis::cmd("EVALSHA");
        evalsha.arg(arrive.get_hash()).arg(0);
        assert_eq!(label(Some(&evalsha)), "arrive");
        let mut unknown = redis::cmd("EVALSHA");
        unknown.arg("0123").arg(0);
        assert_eq!(label(Some(&unknown)), "EVALSHA");
    }
}
