//! [`PrimaryConn`], the command connection behind the store's `RedisConn`
//! on one server: a `ConnectionManager`, and behind Sentinel one that is
//! replaced by a connection to the new primary when the old one stops
//! answering.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};

use super::source::primary_may_have_moved;
use super::*;

/// The command connection to the current primary; cheap to clone,
/// reconnects by itself (and behind Sentinel, follows a failover).
#[derive(Clone)]
pub struct PrimaryConn {
    inner: ConnKind,
}

#[derive(Clone)]
enum ConnKind {
    /// One address: the manager reconnects to it.
    Direct(ConnectionManager),
    /// Behind Sentinel: replaced when the primary moves.
    Following(Arc<Following>),
}

/// A connection that follows the primary named by the sentinels.
struct Following {
    /// The connection to the primary as last named.
    current: RwLock<ConnectionManager>,
    /// Where to ask for the next one.
    source: RedisSource,
    /// A search for the new primary is running.
    searching: AtomicBool,
}

impl From<ConnectionManager> for PrimaryConn {
    fn from(manager: ConnectionManager) -> Self {
        Self {
            inner: ConnKind::Direct(manager),
        }
    }
}

impl PrimaryConn {
    /// Wraps `manager`, made from `source`; behind Sentinel it is replaced
    /// when the primary moves.
    pub(super) fn new(manager: ConnectionManager, source: &RedisSource) -> Self {
        if !source.follows_failover() {
            return manager.into();
        }
        Self {
            inner: ConnKind::Following(Arc::new(Following {
                current: RwLock::new(manager),
                source: source.clone(),
                searching: AtomicBool::new(false),
            })),
        }
    }

    fn manager(&self) -> ConnectionManager {
        match &self.inner {
            ConnKind::Direct(m) => m.clone(),
            ConnKind::Following(f) => f
                .current
                .read()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .clone(),
        }
    }

    /// After a failed command behind Sentinel: looks for the primary in the
    /// background (one search at a time) and swaps the connection for one to
    /// it. Commands meanwhile fail fast and their callers retry as usual.
    fn after<T>(&self, result: &RedisResult<T>) {
        let ConnKind::Following(f) = &self.inner else {
            return;
        };
        match result {
            Err(e) if primary_may_have_moved(e) => {}
            _ => return,
        }
        if f.searching.swap(true, Ordering::AcqRel) {
            return;
        }
        let f = f.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let mut backoff = Duration::from_millis(100);
            let mut said = false;
            loop {
                match f.source.manager().await {
                    Ok(manager) => {
                        *f.current
                            .write()
                            .unwrap_or_else(|poisoned| poisoned.into_inner()) = manager;
                        log::info!(
                            "connected to the primary of {} after {:?}",
                            f.source.display(),
                            started.elapsed()
                        );
                        break;
                    }
                    Err(e) => {
                        if !said {
                            log::warn!(
                                "lost the primary of {}; asking the sentinels until they name a new one: {e}",
                                f.source.display()
                            );
                            said = true;
                        }
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(1));
                    }
                }
            }
            f.searching.store(false, Ordering::Release);
        });
    }
}

impl ConnectionLike for PrimaryConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let result = self.manager().req_packed_command(cmd).await;
            self.after(&result);
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
            let result = self
                .manager()
                .req_packed_commands(pipeline, offset, count)
                .await;
            self.after(&result);
            result
        })
    }

    fn get_db(&self) -> i64 {
        match &self.inner {
            ConnKind::Direct(m) => m.get_db(),
            ConnKind::Following(f) => f.source.db(),
        }
    }
}
