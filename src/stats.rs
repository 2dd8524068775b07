//! Process-wide counters, shown by `/healthz`.

use std::sync::atomic::{AtomicU64, Ordering};

/// A monotonically increasing counter.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds `n`.
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    /// The current value.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// What this node has done since it started.
#[derive(Debug, Default)]
pub struct Stats {
    /// Expired-lease events received from Redis.
    pub expired_events: Counter,
    /// Devices removed by the deadline pass.
    pub devices_reaped: Counter,
    /// Users repaired by the reconciliation pass.
    pub reconcile_repairs: Counter,
    /// Stale `presence-online` entries dropped by the reconciliation pass.
    pub online_pruned: Counter,
    /// Sessions disconnected because their client read too slowly.
    pub slow_consumers: Counter,
    /// Sessions closed for flooding.
    pub floods: Counter,
}

/// The node's counters.
pub static STATS: Stats = Stats {
    expired_events: Counter(AtomicU64::new(0)),
    devices_reaped: Counter(AtomicU64::new(0)),
    reconcile_repairs: Counter(AtomicU64::new(0)),
    online_pruned: Counter(AtomicU64::new(0)),
    slow_consumers: Counter(AtomicU64::new(0)),
    floods: Counter(AtomicU64::new(0)),
};

impl Stats {
    /// The counters as JSON.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "expired_events": self.expired_events.get(),
            "devices_reaped": self.devices_reaped.get(),
            "reconcile_repairs": self.reconcile_repairs.get(),
            "online_pruned": self.online_pruned.get(),
            "slow_consumers": self.slow_consumers.get(),
            "floods": self.floods.get(),
        })
    }
}
