//! The HTTP API's read budget, counted in users (or rooms) read.
//!
//! One bulk query for 1,000 users costs Redis about 3,000 commands; a
//! client repeating it could hold a fleet's Redis at a full core. Each read
//! is charged, before any of its work, what it asks for (the users named,
//! the page size), to two token buckets: its address's and, when a token
//! names the reader, that user's. Both must have it; the refusal is `429`
//! with the time until they will. The admin and service keys, which a
//! backend uses for everyone, share one larger bucket instead.
//!
//! Buckets that have refilled to full hold no information and are dropped
//! by a sweep, so the maps hold only clients active in the last few
//! seconds.

use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use dashmap::DashMap;

use super::address_key;
use crate::bucket::TokenBucket;

/// How often the maps are swept of full buckets, at most.
const SWEEP_EVERY: Duration = Duration::from_secs(10);

/// A rate in units per second, with a burst.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    /// Units per second, sustained.
    pub per_sec: u32,
    /// Most units at once.
    pub burst: u32,
}

/// Who a read is charged to.
#[derive(Debug, Clone, Copy)]
pub enum Charge<'a> {
    /// A client: its address, and the user its token names (if any).
    Client {
        /// The client's address.
        ip: IpAddr,
        /// The user a verified token names.
        user: Option<&'a str>,
    },
    /// The admin or service key.
    Service,
}

/// The node's read budgets.
#[derive(Debug)]
pub struct Budgets {
    client: Rate,
    by_address: DashMap<IpAddr, TokenBucket>,
    by_user: DashMap<Box<str>, TokenBucket>,
    service_bucket: Mutex<TokenBucket>,
    last_sweep: Mutex<Instant>,
}

impl Budgets {
    /// Budgets of `client` per address and per user, and `service` for the keys.
    pub fn new(client: Rate, service: Rate) -> Self {
        Self {
            client,
            by_address: DashMap::new(),
            by_user: DashMap::new(),
            service_bucket: Mutex::new(TokenBucket::new(service.per_sec, service.burst)),
            last_sweep: Mutex::new(Instant::now()),
        }
    }

    /// The client budget.
    pub fn client_rate(&self) -> Rate {
        self.client
    }

    /// Takes `cost` from `who`'s budgets, or none of it and returns how long
    /// until it would pass.
    pub fn charge(&self, who: Charge<'_>, cost: u32) -> Result<(), Duration> {
        self.charge_at(who, cost, Instant::now())
    }

    /// [`Self::charge`] as of `now`.
    pub fn charge_at(&self, who: Charge<'_>, cost: u32, now: Instant) -> Result<(), Duration> {
        self.sweep(now);
        let cost = cost.max(1);
        match who {
            Charge::Service => self
                .service_bucket
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take_at(cost, now),
            Charge::Client { ip, user } => {
                let fresh = || TokenBucket::new_at(self.client.per_sec, self.client.burst, now);
                let mut by_ip = self.by_address.entry(address_key(ip)).or_insert_with(fresh);
                let Some(user) = user else {
                    return by_ip.take_at(cost, now);
                };
                let mut by_user = self.by_user.entry(user.into()).or_insert_with(fresh);
                // Both or neither: the longer wait of the two, and nothing taken.
                let wait = by_ip.wait_at(cost, now).max(by_user.wait_at(cost, now));
                if !wait.is_zero() {
                    return Err(wait);
                }
                by_ip.take_at(cost, now)?;
                by_user.take_at(cost, now)
            }
        }
    }

    /// Drops the buckets that have refilled to full, at most once per
    /// [`SWEEP_EVERY`].
    fn sweep(&self, now: Instant) {
        {
            let Ok(mut last) = self.last_sweep.try_lock() else {
                return;
            };
            if now.saturating_duration_since(*last) < SWEEP_EVERY {
                return;
            }
            *last = now;
        }
        self.by_address.retain(|_, b| !b.full_at(now));
        self.by_user.retain(|_, b| !b.full_at(now));
    }

    /// Addresses and users with a bucket held now.
    pub fn tracked(&self) -> (usize, usize) {
        (self.by_address.len(), self.by_user.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RATE: Rate = Rate {
        per_sec: 100,
        burst: 200,
    };

    fn client(ip: &str, user: Option<&'static str>) -> Charge<'static> {
        Charge::Client {
            ip: ip.parse().unwrap(),
            user,
        }
    }

    #[test]
    fn a_burst_then_429_with_the_wait() {
        let b = Budgets::new(
            RATE,
            Rate {
                per_sec: 1_000,
                burst: 2_000,
            },
        );
        let t = Instant::now();
        assert!(b.charge_at(client("10.0.0.1", None), 200, t).is_ok());
        let wait = b.charge_at(client("10.0.0.1", None), 50, t).unwrap_err();
        assert!((wait.as_secs_f64() - 0.5).abs() < 0.01, "{wait:?}");
        // Another address has its own.
        assert!(b.charge_at(client("10.0.0.2", None), 200, t).is_ok());
        // The service key has its own, larger.
        assert!(b.charge_at(Charge::Service, 2_000, t).is_ok());
        assert!(b.charge_at(Charge::Service, 1, t).is_err());
        // A second later the address has 100 again.
        assert!(b
            .charge_at(client("10.0.0.1", None), 100, t + Duration::from_secs(1))
            .is_ok());
    }

    #[test]
    fn a_token_is_charged_on_every_address_and_nothing_is_taken_on_refusal() {
        let b = Budgets::new(RATE, RATE);
        let t = Instant::now();
        assert!(b.charge_at(client("10.0.0.1", Some("ann")), 150, t).is_ok());
        // From another address, ann's own bucket has 50 left.
        assert!(b
            .charge_at(client("10.0.0.2", Some("ann")), 100, t)
            .is_err());
        // The refusal took nothing from 10.0.0.2: it still has its 200.
        assert!(b.charge_at(client("10.0.0.2", None), 200, t).is_ok());
    }

    #[test]
    fn full_buckets_are_swept() {
        let b = Budgets::new(RATE, RATE);
        let t = Instant::now();
        for i in 0..100 {
            let ip: IpAddr = format!("10.0.1.{i}").parse().unwrap();
            b.charge_at(
                Charge::Client {
                    ip,
                    user: Some("bob"),
                },
                1,
                t,
            )
            .unwrap();
        }
        assert_eq!(b.tracked(), (100, 1));
        b.charge_at(client("10.0.0.9", None), 1, t + Duration::from_secs(11))
            .unwrap();
        assert_eq!(b.tracked(), (1, 0));
    }

    #[test]
    fn ipv6_neighbours_share_a_budget() {
        let b = Budgets::new(RATE, RATE);
        let t = Instant::now();
        assert!(b.charge_at(client("2001:db8::1", None), 200, t).is_ok());
        assert!(b.charge_at(client("2001:db8::2", None), 1, t).is_err());
    }
}
