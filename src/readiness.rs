//! Whether a node should be sent new clients: what `/readyz` answers from,
//! apart from Redis's health (`crate::redis::RedisHealth`).
//!
//! Two facts, each kept where it happens and read without a lock:
//! - the expiry listener's deadline pass went through lately (the actor
//!   that turns lapsed leases into departures is alive, and Redis takes its
//!   writes);
//! - the node is draining: it got SIGTERM and is about to close its
//!   sessions, so a load balancer should stop sending it clients first.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The expiry listener counts as stopped when it has not ticked for this
/// many of its intervals (and at least [`MIN_SILENCE`]).
const SILENT_TICKS: u32 = 20;
/// Shortest silence that counts as stopped: a busy event loop may delay a
/// tick by a second without anything being wrong.
const MIN_SILENCE: Duration = Duration::from_secs(5);

/// A node's readiness, shared by the expiry listener, the signal handler
/// and the probes.
#[derive(Debug)]
pub struct Readiness {
    /// When the node started; ticks are kept as ms since then.
    started: Instant,
    /// The expiry listener's last tick, in ms since `started` (0: none yet).
    expiry_tick_ms: AtomicU64,
    /// SIGTERM arrived.
    draining: AtomicBool,
}

/// Why a node is not ready, as `/readyz` says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotReady {
    /// It got SIGTERM and is draining.
    Draining,
    /// The expiry listener's pass has not gone through for this long.
    ExpiryStalled(Duration),
}

impl std::fmt::Display for NotReady {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Draining => f.write_str("draining: the node got SIGTERM"),
            Self::ExpiryStalled(d) => write!(
                f,
                "the expiry listener's deadline pass has not gone through for {} ms",
                d.as_millis()
            ),
        }
    }
}

impl Default for Readiness {
    fn default() -> Self {
        Self::new()
    }
}

impl Readiness {
    pub fn new() -> Self {
        Self {
            started: Instant::now(),
            expiry_tick_ms: AtomicU64::new(0),
            draining: AtomicBool::new(false),
        }
    }

    /// The expiry listener's deadline pass went through now.
    pub fn expiry_ticked(&self) {
        let ms = self.started.elapsed().as_millis() as u64;
        // 0 means "never": a tick in the first ms counts as 1.
        self.expiry_tick_ms.store(ms.max(1), Ordering::Relaxed);
    }

    /// From now on the node is draining.
    pub fn drain(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// `Ok` when the node may be sent clients, given that the expiry
    /// listener ticks every `interval`. Before its first tick the listener
    /// counts from the node's start.
    pub fn check(&self, interval: Duration) -> Result<(), NotReady> {
        if self.draining() {
            return Err(NotReady::Draining);
        }
        let now = self.started.elapsed();
        let last = Duration::from_millis(self.expiry_tick_ms.load(Ordering::Relaxed));
        let silent = now.saturating_sub(last);
        if silent > (interval * SILENT_TICKS).max(MIN_SILENCE) {
            return Err(NotReady::ExpiryStalled(silent));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_until_drained() {
        let r = Readiness::new();
        r.expiry_ticked();
        assert_eq!(r.check(Duration::from_millis(250)), Ok(()));
        r.drain();
        assert_eq!(r.check(Duration::from_millis(250)), Err(NotReady::Draining));
    }

    #[test]
    fn a_silent_expiry_listener_is_not_ready() {
        let r = Readiness {
            started: Instant::now() - Duration::from_secs(60),
            expiry_tick_ms: AtomicU64::new(1),
            draining: AtomicBool::new(false),
        };
        assert!(matches!(
            r.check(Duration::from_millis(250)),
            Err(NotReady::ExpiryStalled(d)) if d >= Duration::from_secs(59)
        ));
        r.expiry_ticked();
        assert_eq!(r.check(Duration::from_millis(250)), Ok(()));
    }
}
