//! Which browser origins may open a WebSocket, and which `Host` names a
//! development-auth node answers to (DNS rebinding).

use std::collections::HashSet;

use actix_web::http::header;
use actix_web::HttpRequest;

use super::*;

/// Which browser origins may open a WebSocket (cross-site WebSocket
/// hijacking: a page elsewhere would otherwise connect with the user's
/// cookies or a token it got hold of).
#[derive(Debug, Clone, Default)]
pub struct Origins {
    allowed: HashSet<String>,
}

impl Origins {
    /// Allows the given origins (`https://chat.example.com`) besides the
    /// server's own.
    pub fn new<I: IntoIterator<Item = String>>(allowed: I) -> Self {
        Self {
            allowed: allowed
                .into_iter()
                .map(|o| o.trim().trim_end_matches('/').to_ascii_lowercase())
                .filter(|o| !o.is_empty())
                .collect(),
        }
    }

    /// Requests without `Origin` (not from a browser) pass; a browser's
    /// must be the server's own origin or an allowed one.
    pub fn check(&self, req: &HttpRequest) -> Result<(), AuthError> {
        let Some(origin) = req.headers().get(header::ORIGIN) else {
            return Ok(());
        };
        let origin = origin
            .to_str()
            .map_err(|_| AuthError::Origin("<not text>".into()))?
            .to_ascii_lowercase();
        if self.allowed.contains("*") || self.allowed.contains(&origin) {
            return Ok(());
        }
        let host = req
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or("")
            .to_ascii_lowercase();
        let same = origin
            .strip_prefix("http://")
            .or_else(|| origin.strip_prefix("https://"))
            .is_some_and(|o| !host.is_empty() && o == host);
        if same {
            Ok(())
        } else {
            Err(AuthError::Origin(origin))
        }
    }
}

/// Which `Host` names may reach the WebSocket and the HTTP API under
/// development auth. Dev auth trusts the query string, so a page on any
/// domain that resolves to 127.0.0.1 (DNS rebinding) could otherwise act as
/// anyone: its requests carry its own name as `Host`.
#[derive(Debug, Clone)]
pub struct DevHosts {
    allowed: HashSet<String>,
}

impl DevHosts {
    /// Loopback names plus `extra` (`--allowed-host`), ports ignored.
    pub fn new<I: IntoIterator<Item = String>>(extra: I) -> Self {
        let mut allowed: HashSet<String> = ["localhost", "127.0.0.1", "[::1]"]
            .into_iter()
            .map(str::to_string)
            .collect();
        allowed.extend(
            extra
                .into_iter()
                .map(|h| host_name(&h))
                .filter(|h| !h.is_empty()),
        );
        Self { allowed }
    }

    /// Ok when the request's `Host` names an allowed host.
    pub fn check(&self, req: &HttpRequest) -> Result<(), AuthError> {
        let host = req
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or("");
        if self.allowed.contains(&host_name(host)) {
            Ok(())
        } else {
            Err(AuthError::Host(host.to_string()))
        }
    }
}

/// The name of a `Host` value, without port or trailing dot, lowercased:
/// `LocalHost.:8080` -> `localhost`, `[::1]:80` -> `[::1]`.
pub(super) fn host_name(host: &str) -> String {
    let host = host.trim().to_ascii_lowercase();
    let name = match host.strip_prefix('[') {
        Some(rest) => rest
            .split_once(']')
            .map_or(host.clone(), |(ip, _)| format!("[{ip}]")),
        None => host.split(':').next().unwrap_or("").to_string(),
    };
    name.trim_end_matches('.').to_string()
}

#[cfg(test)]
mod host_tests {
    use super::host_name;

    #[test]
    fn host_names_drop_port_dot_and_case() {
        assert_eq!(host_name("LocalHost.:8080"), "localhost");
        assert_eq!(host_name("127.0.0.1"), "127.0.0.1");
        assert_eq!(host_name("[::1]:9000"), "[::1]");
        assert_eq!(host_name("evil.example:80"), "evil.example");
        assert_eq!(host_name(""), "");
    }
}
