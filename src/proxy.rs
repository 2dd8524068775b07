//! The client's address behind reverse proxies (`--trust-proxy`).
//!
//! Behind nginx every connection comes from the proxy, so the peer address
//! says nothing about the client. The proxy names the client in
//! `X-Forwarded-For`, but anyone can send that header: it is read only when
//! the peer is one of the listed proxies, and then from the right, skipping
//! further listed proxies, so that addresses a client wrote into the header
//! itself are never taken for its own.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::str::FromStr;

use actix_web::http::header::HeaderMap;

/// One `--trust-proxy` entry: an address or a CIDR block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Block {
    /// The network address, with the host bits cleared.
    net: IpAddr,
    /// Leading bits that must match.
    prefix: u8,
}

impl Block {
    fn contains(&self, ip: IpAddr) -> bool {
        match (self.net, canonical(ip)) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                mask32(u32::from(ip), self.prefix) == u32::from(net)
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                mask128(u128::from(ip), self.prefix) == u128::from(net)
            }
            _ => false,
        }
    }
}

fn mask32(v: u32, prefix: u8) -> u32 {
    if prefix == 0 {
        0
    } else {
        v & (u32::MAX << (32 - u32::from(prefix)))
    }
}

fn mask128(v: u128, prefix: u8) -> u128 {
    if prefix == 0 {
        0
    } else {
        v & (u128::MAX << (128 - u32::from(prefix)))
    }
}

/// `::ffff:10.0.0.1` (an IPv4 peer on a dual-stack socket) is `10.0.0.1`.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

/// A `--trust-proxy` value that is not an address or CIDR block.
#[derive(Debug, thiserror::Error)]
#[error("--trust-proxy: {0:?} is not an IP address or CIDR block (e.g. 127.0.0.1, 10.0.0.0/8, fd00::/8)")]
pub struct BadProxy(String);

impl FromStr for Block {
    type Err = BadProxy;

    fn from_str(s: &str) -> Result<Self, BadProxy> {
        let bad = || BadProxy(s.to_string());
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p.parse::<u8>().map_err(|_| bad())?)),
            None => (s, None),
        };
        let ip = canonical(addr.parse::<IpAddr>().map_err(|_| bad())?);
        let bits = if ip.is_ipv4() { 32 } else { 128 };
        let prefix = prefix.unwrap_or(bits);
        if prefix > bits {
            return Err(bad());
        }
        let net = match ip {
            IpAddr::V4(v) => IpAddr::V4(Ipv4Addr::from(mask32(u32::from(v), prefix))),
            IpAddr::V6(v) => IpAddr::V6(mask128(u128::from(v), prefix).into()),
        };
        Ok(Block { net, prefix })
    }
}

/// The proxies whose `X-Forwarded-For` is believed; empty (the default):
/// the header is ignored and the peer is the client.
#[derive(Debug, Clone, Default)]
pub struct TrustedProxies {
    blocks: Vec<Block>,
}

impl TrustedProxies {
    /// Parses `--trust-proxy` entries (addresses or CIDR blocks; blank
    /// entries are skipped).
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<Self, BadProxy> {
        let blocks = entries
            .iter()
            .map(|e| e.as_ref().trim())
            .filter(|e| !e.is_empty())
            .map(Block::from_str)
            .collect::<Result<_, _>>()?;
        Ok(Self { blocks })
    }

    /// True when `ip` is a listed proxy.
    pub fn trusts(&self, ip: IpAddr) -> bool {
        self.blocks.iter().any(|b| b.contains(ip))
    }

    /// The client's address: the peer's, unless the peer is a listed proxy;
    /// then the rightmost `X-Forwarded-For` entry that is not a listed proxy
    /// (or the leftmost, if all are). An entry that does not parse ends the
    /// walk at the last proxy that vouched for it.
    pub fn client_ip(&self, peer: Option<SocketAddr>, headers: &HeaderMap) -> Option<IpAddr> {
        let mut client = canonical(peer?.ip());
        if !self.trusts(client) {
            return Some(client);
        }
        // Several headers count as one list, in order (RFC 9110 5.3).
        let entries: Vec<&str> = headers
            .get_all("x-forwarded-for")
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .collect();
        for entry in entries.iter().rev() {
            let Some(ip) = parse_entry(entry) else {
                break;
            };
            client = ip;
            if !self.trusts(ip) {
                break;
            }
        }
        Some(client)
    }
}

/// An `X-Forwarded-For` entry: an address, maybe with a port
/// (`1.2.3.4:5678`, `[2001:db8::1]:443`).
fn parse_entry(entry: &str) -> Option<IpAddr> {
    if let Ok(ip) = entry.parse::<IpAddr>() {
        return Some(canonical(ip));
    }
    entry.parse::<SocketAddr>().ok().map(|a| canonical(a.ip()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::http::header::{HeaderName, HeaderValue};

    fn headers(xff: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in xff {
            h.append(
                HeaderName::from_static("x-forwarded-for"),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    fn peer(s: &str) -> Option<SocketAddr> {
        Some(SocketAddr::new(s.parse().unwrap(), 40000))
    }

    #[test]
    fn blocks_parse_and_match() {
        let t = TrustedProxies::parse(&["10.0.0.0/8", "192.168.1.7", "fd00::/8", " "]).unwrap();
        assert!(t.trusts("10.200.3.4".parse().unwrap()));
        assert!(t.trusts("192.168.1.7".parse().unwrap()));
        assert!(!t.trusts("192.168.1.8".parse().unwrap()));
        assert!(t.trusts("fd12::1".parse().unwrap()));
        assert!(!t.trusts("fe80::1".parse().unwrap()));
        assert!(t.trusts("::ffff:10.1.1.1".parse().unwrap()));
        let all = TrustedProxies::parse(&["0.0.0.0/0"]).unwrap();
        assert!(all.trusts("8.8.8.8".parse().unwrap()));
        for bad in ["10.0.0.0/33", "nginx", "10.0.0.1/x", "::/129"] {
            assert!(TrustedProxies::parse(&[bad]).is_err(), "{bad}");
        }
    }

    #[test]
    fn header_is_ignored_from_untrusted_peers() {
        let none = TrustedProxies::default();
        let h = headers(&["203.0.113.9"]);
        assert_eq!(
            none.client_ip(peer("127.0.0.1"), &h),
            Some("127.0.0.1".parse().unwrap())
        );
        let other = TrustedProxies::parse(&["10.0.0.1"]).unwrap();
        assert_eq!(
            other.client_ip(peer("127.0.0.1"), &h),
            Some("127.0.0.1".parse().unwrap())
        );
    }

    #[test]
    fn rightmost_untrusted_entry_is_the_client() {
        let t = TrustedProxies::parse(&["127.0.0.1", "10.0.0.0/8"]).unwrap();
        // The client forged the first entry; nginx appended the real one.
        let h = headers(&["198.51.100.1, 203.0.113.9", "10.1.2.3"]);
        assert_eq!(
            t.client_ip(peer("127.0.0.1"), &h),
            Some("203.0.113.9".parse().unwrap())
        );
        // Only proxies: the leftmost.
        let h = headers(&["10.0.0.5, 10.0.0.6"]);
        assert_eq!(
            t.client_ip(peer("127.0.0.1"), &h),
            Some("10.0.0.5".parse().unwrap())
        );
        // Garbage stops the walk at the last proxy that vouched.
        let h = headers(&["203.0.113.9, bogus, 10.0.0.6"]);
        assert_eq!(
            t.client_ip(peer("127.0.0.1"), &h),
            Some("10.0.0.6".parse().unwrap())
        );
        // Ports and brackets.
        let h = headers(&["[2001:db8::1]:443"]);
        assert_eq!(
            t.client_ip(peer("::ffff:127.0.0.1"), &h),
            Some("2001:db8::1".parse().unwrap())
        );
        // No header: the proxy itself.
        assert_eq!(
            t.client_ip(peer("127.0.0.1"), &HeaderMap::new()),
            Some("127.0.0.1".parse().unwrap())
        );
    }
}
