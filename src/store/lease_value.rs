//! The value of a lease, which names the connection that owns it, and the
//! clock that stamps it. Read by the steps' parsers and by `records` as
//! well as written by `leases`.

use std::sync::atomic::{AtomicU64, Ordering};

/// Lease values count milliseconds from 2020-01-01T00:00:00Z: 41 bits of
/// them last until 2089.
const LEASE_EPOCH_MS: i64 = 1_577_836_800_000;
/// Bits of a stamp below its milliseconds: a count within the millisecond.
const STAMP_COUNT_BITS: u32 = 9;
/// Bits of a lease value below its stamp: the node's run number.
const LEASE_RUN_BITS: u32 = 13;

/// Hands out one node's lease stamps: milliseconds since
/// [`LEASE_EPOCH_MS`] times 512, plus a count within the millisecond;
/// strictly increasing, so no two connections of a node share one (past
/// 512 connections within a millisecond, the stamps run ahead of the clock
/// until it catches up).
#[derive(Debug, Default)]
pub struct LeaseClock(AtomicU64);

impl LeaseClock {
    /// The next stamp at `now` (epoch ms).
    pub fn next(&self, now: i64) -> u64 {
        let floor = ((now - LEASE_EPOCH_MS).max(0) as u64) << STAMP_COUNT_BITS;
        let mut last = self.0.load(Ordering::Relaxed);
        loop {
            let next = floor.max(last + 1);
            match self
                .0
                .compare_exchange_weak(last, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return next,
                Err(seen) => last = seen,
            }
        }
    }
}

/// The value of a lease, which names the connection that owns it.
///
/// Since key schema 5 it is one integer, `stamp << 13 | run`: the stamp of
/// the connection from its node's [`LeaseClock`] (when it was made, and a
/// count within that millisecond), then the node's run number, which no
/// two live nodes share (`presence-run:<run>`, claimed with `SET NX`). So
/// no two connections of a fleet get the same value. Redis keeps such a
/// value inside the key's value object (an integer encoding) instead of a
/// separate string: 32 B less per device than the value of schema 4 in the
/// bench, more with longer node ids. Which node holds the connection is the
/// device's field in the user's hash (its run number) and
/// `presence-run:<run>`. Values of schema 4 and older,
/// `<node> <connection> <connected_at>`, are still read (see
/// [`Self::parse`]).
///
/// The run also says where a socket holding the lease is: a node told that
/// one of its leases was taken away or over ([`Self::socket_run`]) looks
/// its session up by the whole value, which is the session's id on that
/// node. An HTTP heartbeat's value has run 0: no socket holds it, so nobody
/// is told when it is taken over (its values need no uniqueness: they are
/// never compared but to take the device over).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseOwner<'a> {
    /// Node id, written in the lease by schema 4 and older.
    pub node: Option<&'a str>,
    /// When the connection was made, epoch ms.
    pub connected_at: Option<i64>,
}

impl LeaseOwner<'_> {
    /// The lease value of a connection of node run `run` (1 to
    /// [`crate::keys::MAX_RUN`]) stamped `stamp` by its [`LeaseClock`].
    pub fn format(stamp: u64, run: u64) -> String {
        Self::value(stamp, run).to_string()
    }

    /// [`Self::format`] as the integer it is.
    pub fn value(stamp: u64, run: u64) -> u64 {
        (stamp << LEASE_RUN_BITS) | (run & crate::keys::MAX_RUN)
    }

    /// The run of the node whose socket holds a lease of value `value`;
    /// `None` when no socket does (an HTTP heartbeat's value, a
    /// tombstone), or the value is not one of [`Self::format`].
    pub fn socket_run(value: &str) -> Option<u64> {
        let run = value.parse::<u64>().ok()? & crate::keys::MAX_RUN;
        (run != 0).then_some(run)
    }

    /// Reads a lease value back: one of [`Self::format`], or of schema 4
    /// and older. Unknown shapes give nothing (the value is shown, never
    /// trusted: a lease is compared whole).
    pub fn parse(value: &str) -> LeaseOwner<'_> {
        if let Ok(v) = value.parse::<u64>() {
            let ms = v >> (LEASE_RUN_BITS + STAMP_COUNT_BITS);
            return LeaseOwner {
                node: None,
                connected_at: Some(ms as i64 + LEASE_EPOCH_MS),
            };
        }
        let mut parts = value.splitn(3, ' ');
        let node = parts.next().filter(|n| !n.is_empty());
        let _conn = parts.next();
        LeaseOwner {
            node,
            connected_at: parts.next().and_then(|s| s.parse().ok()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_owner_round_trips() {
        let clock = LeaseClock::default();
        let at = 1_763_970_000_123;
        let v = LeaseOwner::format(clock.next(at), 17);
        let o = LeaseOwner::parse(&v);
        assert_eq!((o.node, o.connected_at), (None, Some(at)));
        assert_eq!(v.parse::<u64>().unwrap() & crate::keys::MAX_RUN, 17);
        // Within one millisecond, a node's stamps differ; so do two runs'.
        let w = LeaseOwner::format(clock.next(at), 17);
        assert_ne!(v, w);
        assert_eq!(LeaseOwner::parse(&w).connected_at, Some(at));
        assert_ne!(w, LeaseOwner::format(clock.next(at) - 1, 18));
        // A clock stepping back never repeats a stamp.
        let before = clock.next(at);
        let earlier = clock.next(at - 5_000);
        assert!(earlier > before, "stamps increase");
        // Fits an i64, so Redis keeps it as an integer, until 2089.
        let late = LeaseOwner::format(
            ((1u64 << 41) - 1) << STAMP_COUNT_BITS | 511,
            crate::keys::MAX_RUN,
        );
        assert!(late.parse::<i64>().is_ok(), "{late}");
        // The run of a socket's value; none for an HTTP heartbeat's, the
        // tombstone of a DELETE, or a value of schema 4.
        assert_eq!(LeaseOwner::socket_run(&v), Some(17));
        assert_eq!(LeaseOwner::socket_run(&LeaseOwner::format(9, 0)), None);
        assert_eq!(LeaseOwner::socket_run("0"), None);
        assert_eq!(LeaseOwner::socket_run("n1 c42 1700"), None);
        // Schema 4 and older.
        let o = LeaseOwner::parse("n1 c42 1700");
        assert_eq!((o.node, o.connected_at), (Some("n1"), Some(1700)));
        assert_eq!(LeaseOwner::parse("junk").connected_at, None);
        assert_eq!(LeaseOwner::parse("").node, None);
    }
}
