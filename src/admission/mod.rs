//! Admission: what one client may hold and cost before and beside its
//! sessions. Per client address, a cap on open WebSockets; per node, a cap
//! on sockets still waiting for their `auth` frame ([`conns`]); and the HTTP
//! API's read budget, counted in users read, per address and per token, with
//! a larger one for the service key ([`budget`]), and a cap on the reads
//! one client has in flight at once ([`inflight`]).
//!
//! Everything is keyed by the client's address as the HTTP layer sees it
//! (with `--trust-proxy`, the address the trusted proxy names), an IPv6
//! address by its /64: one host is given a whole /64, so counting its
//! addresses apart would let it have 2^64 budgets.

pub mod budget;
pub mod conns;
pub mod inflight;

use std::net::IpAddr;

pub use budget::{Budgets, Charge};
pub use conns::{ConnGuard, ConnLimits, PendingGuard, Refused, MAX_PENDING_AUTH_PER_ADDRESS};
pub use inflight::{InFlight, ReadPermit};

/// What limits count a client by: an IPv4 address, or the /64 holding an
/// IPv6 one (IPv4-mapped IPv6 addresses count as IPv4).
pub fn address_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let prefix = u128::from(v6) & !((1u128 << 64) - 1);
                IpAddr::V6(prefix.into())
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv6_counts_by_its_64() {
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:bbbb::9".parse().unwrap();
        let c: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(address_key(a), address_key(b));
        assert_ne!(address_key(a), address_key(c));
        assert_eq!(address_key(a).to_string(), "2001:db8:1:2::");
        let mapped: IpAddr = "::ffff:10.1.2.3".parse().unwrap();
        assert_eq!(address_key(mapped).to_string(), "10.1.2.3");
        let v4: IpAddr = "10.1.2.3".parse().unwrap();
        assert_eq!(address_key(v4), v4);
    }
}
