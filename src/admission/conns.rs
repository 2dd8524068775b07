//! Caps on connections: open WebSockets per client address, and sockets
//! still waiting for their `auth` frame on this node.
//!
//! A WebSocket that has not authenticated yet costs the node a session, its
//! buffers and a file descriptor, and proves nothing; both caps refuse at
//! the upgrade, before any of that exists. Each admitted socket holds a
//! guard whose drop gives its place back, so no path can leak a count.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use dashmap::mapref::entry::Entry;
use dashmap::DashMap;

use super::address_key;

/// Why a connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// The client's address holds the most WebSockets allowed.
    #[error("this address holds {0} connections, the most allowed (--max-connections-per-ip)")]
    PerAddress(u32),
    /// The node holds the most sockets waiting for their auth frame.
    #[error("{0} connections are waiting to authenticate, the most allowed (--max-pending-auth); try again")]
    PendingAuth(u32),
    /// This address holds the most sockets waiting for their auth frame.
    #[error("this address has {0} connections waiting to authenticate, the most allowed; authenticate those first")]
    PendingAuthPerAddress(u32),
}

/// Most sockets one address (an IPv6 /64) may have waiting for their auth
/// frame: a few clients behind one NAT connect at once, but one address
/// must not fill the node's `--max-pending-auth` for everyone else.
pub const MAX_PENDING_AUTH_PER_ADDRESS: u32 = 64;

/// The node's connection counts and their caps.
#[derive(Debug, Default)]
pub struct ConnLimits {
    /// Most WebSockets per address key; 0: no cap.
    max_per_address: u32,
    /// Most sockets waiting for their auth frame; 0: no cap.
    max_pending: u32,
    /// Open WebSockets per address key (absent: none).
    per_address: DashMap<Key, u32>,
    /// Sockets waiting for their auth frame.
    pending: AtomicU32,
    /// Sockets waiting for their auth frame, per address key.
    pending_per_address: DashMap<Key, u32>,
}

/// An address key as 16 bytes (IPv4 mapped into IPv6): byte-aligned, so
/// that a guard, which every session holds, is 24 B.
type Key = [u8; 16];

/// The [`Key`] of `ip`'s address key.
fn key_of(ip: IpAddr) -> Key {
    match address_key(ip) {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// One admitted WebSocket's place in its address's count; dropping it (the
/// session ending) gives the place back.
#[derive(Debug)]
pub struct ConnGuard {
    limits: Arc<ConnLimits>,
    key: Key,
}

/// One socket's place among those waiting to authenticate; dropped once it
/// has (or once it closes).
#[derive(Debug)]
pub struct PendingGuard {
    limits: Arc<ConnLimits>,
    key: Key,
}

impl ConnLimits {
    /// Caps of `max_per_address` WebSockets per address and `max_pending`
    /// sockets awaiting auth; 0 turns a cap off.
    pub fn new(max_per_address: u32, max_pending: u32) -> Arc<Self> {
        Arc::new(Self {
            max_per_address,
            max_pending,
            ..Self::default()
        })
    }

    /// Counts one more WebSocket from `ip`, unless that address holds the
    /// most allowed.
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<ConnGuard, Refused> {
        let key = key_of(ip);
        let mut count = self.per_address.entry(key).or_insert(0);
        if self.max_per_address > 0 && *count >= self.max_per_address {
            return Err(Refused::PerAddress(self.max_per_address));
        }
        *count += 1;
        Ok(ConnGuard {
            limits: self.clone(),
            key,
        })
    }

    /// Counts one more socket from `ip` waiting for its auth frame, unless
    /// the node, or that address, holds the most allowed.
    pub fn await_auth(self: &Arc<Self>, ip: IpAddr) -> Result<PendingGuard, Refused> {
        let key = key_of(ip);
        let mut mine = self.pending_per_address.entry(key).or_insert(0);
        if self.max_pending > 0 && *mine >= MAX_PENDING_AUTH_PER_ADDRESS {
            return Err(Refused::PendingAuthPerAddress(MAX_PENDING_AUTH_PER_ADDRESS));
        }
        let max = self.max_pending;
        self.pending
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (max == 0 || n < max).then_some(n + 1)
            })
            .map_err(|_| Refused::PendingAuth(max))?;
        *mine += 1;
        Ok(PendingGuard {
            limits: self.clone(),
            key,
        })
    }

    /// WebSockets open from `ip`'s address key.
    pub fn open_from(&self, ip: IpAddr) -> u32 {
        self.per_address.get(&key_of(ip)).map_or(0, |c| *c)
    }

    /// Sockets waiting for their auth frame now.
    pub fn pending(&self) -> u32 {
        self.pending.load(Ordering::Acquire)
    }

    /// Addresses with at least one WebSocket open.
    pub fn addresses(&self) -> usize {
        self.per_address.len()
    }
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        if let Entry::Occupied(mut e) = self.limits.per_address.entry(self.key) {
            *e.get_mut() = e.get().saturating_sub(1);
            if *e.get() == 0 {
                e.remove();
            }
        }
    }
}

impl Drop for PendingGuard {
    fn drop(&mut self) {
        self.limits.pending.fetch_sub(1, Ordering::AcqRel);
        if let Entry::Occupied(mut e) = self.limits.pending_per_address.entry(self.key) {
            *e.get_mut() = e.get().saturating_sub(1);
            if *e.get() == 0 {
                e.remove();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_per_address_and_gives_places_back() {
        let limits = ConnLimits::new(2, 0);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let g1 = limits.admit(a).unwrap();
        let g2 = limits.admit(a).unwrap();
        assert_eq!(limits.admit(a).unwrap_err(), Refused::PerAddress(2));
        let _g3 = limits.admit(b).unwrap();
        drop(g1);
        let _g4 = limits.admit(a).unwrap();
        drop(g2);
        assert_eq!(limits.open_from(a), 1);
        drop(_g4);
        assert_eq!(limits.open_from(a), 0);
        assert_eq!(
            limits.addresses(),
            1,
            "an address with none open is forgotten"
        );
    }

    #[test]
    fn caps_pending_auth() {
        let limits = ConnLimits::new(0, 2);
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let p1 = limits.await_auth(ip).unwrap();
        let _p2 = limits.await_auth("10.0.0.2".parse().unwrap()).unwrap();
        assert_eq!(limits.await_auth(ip).unwrap_err(), Refused::PendingAuth(2));
        drop(p1);
        assert_eq!(limits.pending(), 1);
        let _p3 = limits.await_auth(ip).unwrap();
        // One address cannot take every place.
        let wide = ConnLimits::new(0, 1_000);
        let mine: Vec<_> = (0..MAX_PENDING_AUTH_PER_ADDRESS)
            .map(|_| wide.await_auth(ip).unwrap())
            .collect();
        assert_eq!(
            wide.await_auth(ip).unwrap_err(),
            Refused::PendingAuthPerAddress(MAX_PENDING_AUTH_PER_ADDRESS)
        );
        assert!(wide.await_auth("10.0.0.3".parse().unwrap()).is_ok());
        drop(mine);
        assert!(wide.await_auth(ip).is_ok());
        let unlimited = ConnLimits::new(0, 0);
        let held: Vec<_> = (0..10_000)
            .map(|_| unlimited.admit("10.0.0.1".parse().unwrap()).unwrap())
            .collect();
        assert_eq!(held.len(), 10_000);
    }
}
