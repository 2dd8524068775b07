//! Who is connecting: development ids from the query string, or verified
//! JSON Web Tokens; and which browser origins may open a WebSocket.

mod jwks;
mod jwt;
mod origins;
mod room_token;

pub use jwks::{parse_jwks, Jwks};
pub use jwt::ROOM_CLAIM;
pub use origins::{DevHosts, Origins};
pub use room_token::{room_token_header, RoomGrant, ROOM_TOKEN_HEADER};

use std::sync::Arc;
use std::time::Duration;

use actix_web::http::header;
use actix_web::HttpRequest;
use jsonwebtoken::{Algorithm, DecodingKey};

/// Default clock skew forgiven on `exp` and `nbf`, in seconds.
pub const DEFAULT_LEEWAY_SECS: u64 = 60;
/// Default period of the background JWKS refresh.
pub const DEFAULT_JWKS_REFRESH: Duration = Duration::from_secs(600);
/// Default shortest time between two fetches of the key set caused by
/// tokens naming an unknown `kid`: a stream of forged `kid`s costs the
/// provider one request per period, not one per token.
pub const DEFAULT_JWKS_REFETCH_MIN: Duration = Duration::from_secs(10);
/// How long one JWKS fetch may take.
const JWKS_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest key set accepted, in bytes.
const JWKS_MAX_BYTES: usize = 1024 * 1024;

/// How clients prove who they are.
pub enum Auth {
    /// Ids taken from the query string (`user=`, `viewer=`): for the demo
    /// page, wscat and tests. Anyone can be anyone.
    Dev,
    /// A claim (`sub` by default) of a verified token is the user.
    Jwt(JwtVerifier),
}

/// What a token must carry besides a valid signature.
#[derive(Debug, Clone)]
pub struct JwtRules {
    /// Accepted `aud` values (any one suffices); empty: `aud` is not checked.
    pub audience: Vec<String>,
    /// Required `iss`; `None`: `iss` is not checked.
    pub issuer: Option<String>,
    /// The claim that names the user (`sub` unless told otherwise).
    pub user_claim: String,
    /// Clock skew forgiven on `exp` and `nbf`, in seconds.
    pub leeway_secs: u64,
    /// The claim that lists the rooms the user may join (`rooms`).
    pub rooms_claim: String,
    /// Some room takes room tokens (`--room-policy token`): a token with a
    /// `room` claim is one, and is refused as a connection token.
    pub room_tokens: bool,
}

impl Default for JwtRules {
    fn default() -> Self {
        Self {
            audience: Vec::new(),
            issuer: None,
            user_claim: "sub".into(),
            leeway_secs: DEFAULT_LEEWAY_SECS,
            rooms_claim: "rooms".into(),
            room_tokens: false,
        }
    }
}

/// Verifies tokens with a static HS256 secret, a static public key and/or
/// the keys of an identity provider's JWKS document.
pub struct JwtVerifier {
    /// Keys given on the command line, each with the one algorithm it takes.
    keys: Vec<(DecodingKey, Algorithm)>,
    /// The provider's key set, when `--jwt-jwks-url` is given.
    jwks: Option<Arc<Jwks>>,
    /// Claims checked on every token.
    rules: JwtRules,
}

/// A verified token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// The user it names.
    pub user: String,
    /// Its `exp`, epoch seconds.
    pub exp: u64,
    /// The room ids and prefixes (ending in `*`) its rooms claim lists.
    pub rooms: Vec<String>,
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No token where one is required.
    #[error("a token is required: send {{\"type\":\"auth\",\"token\":\"<JWT>\"}} as the first frame, or Authorization: Bearer <JWT>")]
    Missing,
    /// The token did not verify (signature, expiry, shape).
    #[error("invalid token: {0}")]
    Invalid(String),
    /// The token is valid but names another user than the request.
    #[error("the token is for {token:?}, not {asked:?}")]
    Mismatch {
        /// The user of the token.
        token: String,
        /// What the request asked for.
        asked: String,
    },
    /// The browser page comes from an origin not allowed to connect.
    #[error("{}", origin_refusal(.0))]
    Origin(String),
    /// Development auth reached under a host name that is not loopback or
    /// allowed with `--allowed-host` (DNS rebinding).
    #[error("host {0:?} is not allowed with --auth dev: use localhost, 127.0.0.1, [::1] or a name given with --allowed-host")]
    Host(String),
}

/// Most bytes of a refused origin that the log line and the reason show.
const MAX_ORIGIN_SHOWN: usize = 100;

/// `s` cut to at most `max` bytes, on a character boundary.
fn cut(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Why a browser origin was refused, with the flag that lets it in: the
/// reason a refused page's client gets in its close frame, and the log line.
fn origin_refusal(origin: &str) -> String {
    // The origin is the client's to choose: a long one is cut, in the log
    // as in the close frame (which holds 123 bytes anyway).
    let origin = cut(origin, MAX_ORIGIN_SHOWN);
    if origin == "null" || origin.starts_with('<') {
        // file://, a sandboxed frame: no origin that could be listed safely.
        return format!("origin {origin} not allowed: serve the page over http(s) and add its origin to --allowed-origins");
    }
    format!("origin not allowed: start the server with --allowed-origins {origin}")
}

/// The token of a request: `?token=` (for wscat; it ends up in access logs)
/// or `Authorization: Bearer`.
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

/// Prefix of the Kubernetes form of a token in `Sec-WebSocket-Protocol`:
/// the token follows, base64url-encoded without padding.
const K8S_BEARER_PROTOCOL: &str = "base64url.bearer.authorization.k8s.io.";

/// A token carried in `Sec-WebSocket-Protocol` (browsers can set that
/// header, and it stays out of URLs and access logs).
#[derive(Clone, PartialEq, Eq)]
pub struct ProtocolToken {
    /// The JWT.
    pub token: String,
    /// The subprotocol the handshake must answer with: the first offered
    /// one that is not a token (e.g. `presence`), else the token's own
    /// entry, since a browser fails a handshake that answers none.
    pub answer: String,
}

impl std::fmt::Debug for ProtocolToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProtocolToken(<redacted>)")
    }
}

/// The token among the offered subprotocols: a bare JWT
/// (`new WebSocket(url, ["presence", token])`) or the Kubernetes form
/// `base64url.bearer.authorization.k8s.io.<base64url(token)>`.
pub fn protocol_token(req: &HttpRequest) -> Option<ProtocolToken> {
    use base64::Engine as _;
    let offered: Vec<&str> = req
        .headers()
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect();
    let mut found = None;
    let mut other = None;
    for p in &offered {
        let token = if let Some(enc) = p.strip_prefix(K8S_BEARER_PROTOCOL) {
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(enc.trim_end_matches('='))
                .ok()
                .and_then(|b| String::from_utf8(b).ok())
        } else if looks_like_jwt(p) {
            Some(p.to_string())
        } else {
            None
        };
        match token {
            Some(t) if found.is_none() => found = Some((t, p.to_string())),
            Some(_) => {}
            None if other.is_none() => other = Some(p.to_string()),
            None => {}
        }
    }
    let (token, own) = found?;
    Some(ProtocolToken {
        token,
        answer: other.unwrap_or(own),
    })
}

/// Three base64url parts, the first a JSON object (`eyJ` is `{"`).
fn looks_like_jwt(s: &str) -> bool {
    s.starts_with("eyJ")
        && s.split('.').count() == 3
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// Who a WebSocket handshake connects as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handshake {
    /// Known now: the user, and the token's `exp` (epoch s) with JWT auth.
    User {
        /// The user.
        user: String,
        /// The token's expiry; `None` in dev mode.
        exp: Option<u64>,
        /// The rooms its token's rooms claim lists (empty in dev mode).
        rooms: Vec<String>,
    },
    /// JWT auth without a token on the handshake: the client must send
    /// `{"type":"auth","token":...}` as its first frame.
    FirstFrame,
}

impl Auth {
    /// Who a WebSocket handshake connects as. In dev mode that is `asked`
    /// (the `user=` parameter, required); with JWT it is the token's user
    /// (from `Sec-WebSocket-Protocol`, `?token=` or `Authorization`), and an
    /// `asked` user that differs is refused; without a token the first
    /// frame must bring one.
    pub async fn handshake(
        &self,
        req: &HttpRequest,
        protocol: Option<&ProtocolToken>,
        query_token: Option<&str>,
        asked: Option<&str>,
    ) -> Result<Option<Handshake>, AuthError> {
        match self {
            Auth::Dev => Ok(asked.map(|u| Handshake::User {
                user: u.to_string(),
                exp: None,
                rooms: Vec::new(),
            })),
            Auth::Jwt(v) => {
                let Some(token) = protocol
                    .map(|p| p.token.as_str())
                    .or_else(|| token(req, query_token))
                else {
                    return Ok(Some(Handshake::FirstFrame));
                };
                let verified = v.verify_as(token, asked).await?;
                Ok(Some(Handshake::User {
                    user: verified.user,
                    exp: Some(verified.exp),
                    rooms: verified.rooms,
                }))
            }
        }
    }

    /// The reader of a room read: its user (as [`Auth::viewer`]) and, with
    /// JWT auth, the rooms its token's rooms claim lists (`None` under
    /// development auth, where every room is open).
    pub async fn room_reader(
        &self,
        req: &HttpRequest,
        query_token: Option<&str>,
        asked: Option<&str>,
    ) -> Result<(Option<String>, Option<Vec<String>>), AuthError> {
        match self {
            Auth::Dev => Ok((asked.map(str::to_string), None)),
            Auth::Jwt(v) => {
                let token = token(req, query_token).ok_or(AuthError::Missing)?;
                let verified = v.verify_as(token, asked).await?;
                Ok((Some(verified.user), Some(verified.rooms)))
            }
        }
    }

    /// Who is reading through the HTTP API: the token's user with JWT (a
    /// token is required); in dev mode `viewer=`, or anonymous.
    pub async fn viewer(
        &self,
        req: &HttpRequest,
        query_token: Option<&str>,
        asked: Option<&str>,
    ) -> Result<Option<String>, AuthError> {
        match self {
            Auth::Dev => Ok(asked.map(str::to_string)),
            Auth::Jwt(v) => {
                let token = token(req, query_token).ok_or(AuthError::Missing)?;
                Ok(Some(v.verify_as(token, asked).await?.user))
            }
        }
    }
}
