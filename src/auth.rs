//! Who is connecting: development ids from the query string, or verified
//! JSON Web Tokens; and which browser origins may open a WebSocket.

use std::collections::HashSet;

use actix_web::http::header;
use actix_web::HttpRequest;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;

use crate::ids;

/// How clients prove who they are.
pub enum Auth {
    /// Ids taken from the query string (`user=`, `viewer=`): for the demo
    /// page, wscat and tests. Anyone can be anyone.
    Dev,
    /// `sub` of a verified token is the user.
    Jwt(JwtVerifier),
}

/// Verifies tokens with any of its keys.
pub struct JwtVerifier {
    keys: Vec<(DecodingKey, Validation)>,
}

/// The claims this server reads.
#[derive(Debug, Deserialize)]
struct Claims {
    /// The user.
    sub: String,
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No token where one is required.
    #[error("a token is required: pass ?token=<JWT> or Authorization: Bearer <JWT>")]
    Missing,
    /// The token did not verify (signature, expiry, shape).
    #[error("invalid token: {0}")]
    Invalid(String),
    /// The token is valid but names another user than the request.
    #[error("the token is for {token:?}, not {asked:?}")]
    Mismatch {
        /// `sub` of the token.
        token: String,
        /// What the request asked for.
        asked: String,
    },
    /// The browser page comes from an origin not allowed to connect.
    #[error("origin {0:?} is not allowed to connect")]
    Origin(String),
    /// Development auth reached under a host name that is not loopback or
    /// allowed with `--allowed-host` (DNS rebinding).
    #[error("host {0:?} is not allowed with --auth dev: use localhost, 127.0.0.1, [::1] or a name given with --allowed-host")]
    Host(String),
}

impl JwtVerifier {
    /// A verifier for HS256 tokens signed with `secret` and/or tokens
    /// signed with the private half of `public_pem` (RSA for RS256, EC P-256
    /// for ES256).
    pub fn new(secret: Option<&[u8]>, public_pem: Option<&[u8]>) -> anyhow::Result<Self> {
        let mut keys = Vec::new();
        if let Some(secret) = secret {
            if secret.len() < 32 {
                anyhow::bail!("the JWT secret must be at least 32 bytes");
            }
            keys.push((
                DecodingKey::from_secret(secret),
                Validation::new(Algorithm::HS256),
            ));
        }
        if let Some(pem) = public_pem {
            let key = DecodingKey::from_rsa_pem(pem)
                .map(|k| (k, Algorithm::RS256))
                .or_else(|_| DecodingKey::from_ec_pem(pem).map(|k| (k, Algorithm::ES256)))
                .map_err(|e| {
                    anyhow::anyhow!("the JWT public key is neither an RSA nor an EC PEM key: {e}")
                })?;
            keys.push((key.0, Validation::new(key.1)));
        }
        if keys.is_empty() {
            anyhow::bail!("--auth jwt needs --jwt-secret(-file) and/or --jwt-public-key-file");
        }
        for (_, v) in &mut keys {
            // `exp` is required and enforced (with the default 60 s leeway
            // for clock skew); `sub` is required.
            v.set_required_spec_claims(&["exp", "sub"]);
        }
        Ok(Self { keys })
    }

    /// The user named by a valid `token`.
    pub fn verify(&self, token: &str) -> Result<String, AuthError> {
        let mut last = AuthError::Invalid("no key".into());
        for (key, validation) in &self.keys {
            match jsonwebtoken::decode::<Claims>(token, key, validation) {
                Ok(data) => {
                    let sub = data.claims.sub;
                    ids::validate("user", &sub)
                        .map_err(|e| AuthError::Invalid(format!("sub: {e}")))?;
                    return Ok(sub);
                }
                Err(e) => last = AuthError::Invalid(e.to_string()),
            }
        }
        Err(last)
    }
}

/// The token of a request: `?token=` (browsers cannot set headers on a
/// WebSocket handshake) or `Authorization: Bearer`.
fn token<'a>(req: &'a HttpRequest, query_token: Option<&'a str>) -> Option<&'a str> {
    query_token
        .filter(|t| !t.is_empty())
        .or_else(|| bearer(req))
}

/// The credential of an `Authorization: Bearer <credential>` header.
pub fn bearer(req: &HttpRequest) -> Option<&str> {
    req.headers()
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
}

impl Auth {
    /// The user a WebSocket handshake connects as. In dev mode that is
    /// `asked` (the `user=` parameter, required); with JWT it is the
    /// token's `sub`, and an `asked` user that differs is refused.
    pub fn connecting_user(
        &self,
        req: &HttpRequest,
        query_token: Option<&str>,
        asked: Option<&str>,
    ) -> Result<Option<String>, AuthError> {
        match self {
            Auth::Dev => Ok(asked.map(str::to_string)),
            Auth::Jwt(v) => {
                let user = v.verify(token(req, query_token).ok_or(AuthError::Missing)?)?;
                match asked {
                    Some(a) if a != user => Err(AuthError::Mismatch {
                        token: user,
                        asked: a.to_string(),
                    }),
                    _ => Ok(Some(user)),
                }
            }
        }
    }

    /// Who is reading through the HTTP API: the token's user with JWT (a
    /// token is required); in dev mode `viewer=`, or anonymous.
    pub fn viewer(
        &self,
        req: &HttpRequest,
        query_token: Option<&str>,
        asked: Option<&str>,
    ) -> Result<Option<String>, AuthError> {
        self.connecting_user(req, query_token, asked)
    }
}

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
fn host_name(host: &str) -> String {
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
