//! The HTTP reads one client may have in flight at once, per address and
//! per token's user: a budget charged up front bounds what a client's reads
//! cost over time, and this bounds what they hold at once (Redis's reply
//! buffers, the node's futures) when Redis is slow to answer them. A read
//! holds its place from its charge until it answers, or until it is
//! cancelled (its future dropped), whichever comes first. The admin and
//! service keys, a backend's, have no cap.

use std::net::IpAddr;
use std::sync::Arc;

use dashmap::DashMap;

use super::{address_key, Charge};

/// One place counted in the map.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Key {
    /// A client address (an IPv6 address by its /64).
    Address(IpAddr),
    /// A token's user.
    User(Box<str>),
}

/// The reads in flight, per address and per user.
#[derive(Debug)]
pub struct InFlight {
    /// Most reads in flight for one address or one user; 0: no cap.
    cap: u32,
    /// Reads in flight now; an entry goes when its count is back to 0.
    held: Arc<DashMap<Key, u32>>,
}

/// A read's place in flight, given back when dropped.
#[derive(Debug)]
#[must_use = "the place is held only while the permit lives"]
pub struct ReadPermit {
    held: Option<Arc<DashMap<Key, u32>>>,
    keys: Vec<Key>,
}

impl Drop for ReadPermit {
    fn drop(&mut self) {
        let Some(held) = &self.held else {
            return;
        };
        for key in &self.keys {
            held.remove_if_mut(key, |_, n| {
                *n = n.saturating_sub(1);
                *n == 0
            });
        }
    }
}

impl InFlight {
    /// At most `cap` reads in flight per address and per user (0: none).
    pub fn new(cap: u32) -> Self {
        Self {
            cap,
            held: Arc::new(DashMap::new()),
        }
    }

    /// The cap.
    pub fn cap(&self) -> u32 {
        self.cap
    }

    /// A place for one more read of `who`, or `None` when its address or
    /// its user has `cap` in flight already (nothing is taken then).
    pub fn enter(&self, who: Charge<'_>) -> Option<ReadPermit> {
        let keys = match who {
            Charge::Service => Vec::new(),
            Charge::Client { .. } if self.cap == 0 => Vec::new(),
            Charge::Client { ip, user } => {
                let mut keys = vec![Key::Address(address_key(ip))];
                keys.extend(user.map(|u| Key::User(u.into())));
                keys
            }
        };
        let mut taken = ReadPermit {
            held: Some(self.held.clone()),
            keys: Vec::with_capacity(keys.len()),
        };
        for key in keys {
            let mut n = self.held.entry(key.clone()).or_insert(0);
            if *n >= self.cap {
                // Dropping `taken` gives back what was taken so far.
                return None;
            }
            *n += 1;
            drop(n);
            taken.keys.push(key);
        }
        Some(taken)
    }

    /// Addresses and users with a read in flight now.
    pub fn tracked(&self) -> usize {
        self.held.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(ip: &str, user: Option<&'static str>) -> Charge<'static> {
        Charge::Client {
            ip: ip.parse().unwrap(),
            user,
        }
    }

    #[test]
    fn a_client_holds_at_most_cap_and_gets_them_back() {
        let f = InFlight::new(2);
        let a = f.enter(client("10.0.0.1", None)).unwrap();
        let b = f.enter(client("10.0.0.1", None)).unwrap();
        assert!(f.enter(client("10.0.0.1", None)).is_none());
        // Another address has its own places; the service has no cap.
        let c = f.enter(client("10.0.0.2", None)).unwrap();
        let s: Vec<_> = (0..10).map(|_| f.enter(Charge::Service).unwrap()).collect();
        drop(a);
        let d = f.enter(client("10.0.0.1", None)).unwrap();
        drop((b, c, d, s));
        assert_eq!(f.tracked(), 0, "every place given back");
    }

    #[test]
    fn a_user_is_capped_on_every_address_and_a_refusal_takes_nothing() {
        let f = InFlight::new(1);
        let a = f.enter(client("10.0.0.1", Some("ann"))).unwrap();
        // From another address, ann has none left; that address keeps its own.
        assert!(f.enter(client("10.0.0.2", Some("ann"))).is_none());
        let b = f.enter(client("10.0.0.2", None)).unwrap();
        drop((a, b));
        assert_eq!(f.tracked(), 0);
    }
}
