//! The one connection type the store calls Redis through.
//!
//! [`RedisConn`] is ours so that the store does not depend on which kind of
//! connection is behind it: today one [`PrimaryConn`] (a multiplexed
//! `ConnectionManager` created at start, cloned into every actor,
//! reconnecting by itself, and following a Sentinel failover);
//! a cluster connection can be added as a second kind without touching any
//! caller. Every command and pipeline sent through it is timed into the
//! node's metrics, under the command's name or, for a script, the step's.

use std::collections::HashMap;
use std::sync::{LazyLock, RwLock};
use std::time::Instant;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::{Arg, Cmd, Pipeline, RedisFuture, Value};

use crate::redis_setup::PrimaryConn;

/// The store's handle on Redis; cheap to clone.
#[derive(Clone)]
pub struct RedisConn {
    /// The connection doing the work.
    inner: PrimaryConn,
}

impl RedisConn {
    /// Wraps a connection to the primary (or a plain connection manager).
    pub fn new(inner: impl Into<PrimaryConn>) -> Self {
        Self {
            inner: inner.into(),
        }
    }
}

impl From<ConnectionManager> for RedisConn {
    fn from(inner: ConnectionManager) -> Self {
        Self::new(inner)
    }
}

impl ConnectionLike for RedisConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let started = Instant::now();
            let result = self.inner.req_packed_command(cmd).await;
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
            let result = self
                .inner
                .req_packed_commands(pipeline, offset, count)
                .await;
            observe(label(pipeline.cmd_iter().next()), started, &result);
            result
        })
    }

    fn get_db(&self) -> i64 {
        self.inner.get_db()
    }
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
