//! Who is connecting: development ids from the query string, or verified
//! JSON Web Tokens; and which browser origins may open a WebSocket.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use actix_web::http::header;
use actix_web::HttpRequest;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, KeyAlgorithm};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::Value;

use crate::ids;

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
}

impl Default for JwtRules {
    fn default() -> Self {
        Self {
            audience: Vec::new(),
            issuer: None,
            user_claim: "sub".into(),
            leeway_secs: DEFAULT_LEEWAY_SECS,
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
    /// for ES256, Ed25519 for EdDSA), and/or the keys of `jwks`.
    pub fn new(
        secret: Option<&[u8]>,
        public_pem: Option<&[u8]>,
        jwks: Option<Jwks>,
        rules: JwtRules,
    ) -> anyhow::Result<Self> {
        let mut keys = Vec::new();
        if let Some(secret) = secret {
            if secret.len() < 32 {
                anyhow::bail!("the JWT secret must be at least 32 bytes");
            }
            keys.push((DecodingKey::from_secret(secret), Algorithm::HS256));
        }
        if let Some(pem) = public_pem {
            let key = DecodingKey::from_rsa_pem(pem)
                .map(|k| (k, Algorithm::RS256))
                .or_else(|_| DecodingKey::from_ec_pem(pem).map(|k| (k, Algorithm::ES256)))
                .or_else(|_| DecodingKey::from_ed_pem(pem).map(|k| (k, Algorithm::EdDSA)))
                .map_err(|e| {
                    anyhow::anyhow!(
                        "the JWT public key is neither an RSA, an EC P-256 nor an Ed25519 PEM key: {e}"
                    )
                })?;
            keys.push(key);
        }
        if keys.is_empty() && jwks.is_none() {
            anyhow::bail!(
                "--auth jwt needs --jwt-secret(-file), --jwt-public-key-file and/or --jwt-jwks-url"
            );
        }
        if rules.user_claim.is_empty() {
            anyhow::bail!("--jwt-user-claim must name a claim");
        }
        Ok(Self {
            keys,
            jwks: jwks.map(Arc::new),
            rules,
        })
    }

    /// Fetches the key set (if any) and keeps it fresh in the background.
    /// Fails when the first fetch does, so that a wrong URL stops start-up
    /// instead of refusing every token.
    pub async fn start(&self) -> anyhow::Result<()> {
        if let Some(jwks) = &self.jwks {
            let n = jwks.fetch().await?;
            log::info!("JWKS: {n} keys from {}", jwks.url);
            tokio::spawn(jwks.clone().refresh_loop());
        }
        Ok(())
    }

    /// The checks every token goes through for `alg`.
    fn validation(&self, alg: Algorithm) -> Validation {
        let mut v = Validation::new(alg);
        v.leeway = self.rules.leeway_secs;
        v.validate_nbf = true;
        let mut required = vec!["exp"];
        if self.rules.audience.is_empty() {
            // Without --jwt-audience `aud` is not checked at all: providers
            // set one on every token, and refusing all of them helps no one.
            v.validate_aud = false;
        } else {
            v.set_audience(&self.rules.audience);
            required.push("aud");
        }
        if let Some(iss) = &self.rules.issuer {
            v.set_issuer(&[iss]);
            required.push("iss");
        }
        v.set_required_spec_claims(&required);
        v
    }

    /// The user named by a valid `token`, and its expiry.
    pub async fn verify(&self, token: &str) -> Result<Verified, AuthError> {
        let header =
            jsonwebtoken::decode_header(token).map_err(|e| AuthError::Invalid(e.to_string()))?;
        let mut candidates: Vec<(DecodingKey, Algorithm)> = self
            .keys
            .iter()
            .filter(|(_, alg)| *alg == header.alg)
            .cloned()
            .collect();
        if let Some(jwks) = &self.jwks {
            candidates.extend(jwks.keys_for(header.kid.as_deref(), header.alg).await);
        }
        if candidates.is_empty() {
            return Err(AuthError::Invalid(match (&header.kid, &self.jwks) {
                (Some(kid), Some(_)) => format!("no key {kid:?} for {:?}", header.alg),
                _ => format!("no key for {:?}", header.alg),
            }));
        }
        let mut last = AuthError::Invalid("no key".into());
        for (key, alg) in &candidates {
            match jsonwebtoken::decode::<serde_json::Map<String, Value>>(
                token,
                key,
                &self.validation(*alg),
            ) {
                Ok(data) => return self.claims(&data.claims),
                Err(e) => last = AuthError::Invalid(e.to_string()),
            }
        }
        Err(last)
    }

    /// Verifies `token`, which must name `asked` when that is given.
    pub async fn verify_as(&self, token: &str, asked: Option<&str>) -> Result<Verified, AuthError> {
        let verified = self.verify(token).await?;
        match asked {
            Some(a) if a != verified.user => Err(AuthError::Mismatch {
                token: verified.user,
                asked: a.to_string(),
            }),
            _ => Ok(verified),
        }
    }

    /// Clock skew forgiven on `exp` and `nbf`: a session is closed this long
    /// after its token's `exp`.
    pub fn leeway(&self) -> Duration {
        Duration::from_secs(self.rules.leeway_secs)
    }

    /// The user and expiry of verified claims.
    fn claims(&self, claims: &serde_json::Map<String, Value>) -> Result<Verified, AuthError> {
        let name = &self.rules.user_claim;
        let user = match claims.get(name) {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Number(n)) if n.is_u64() || n.is_i64() => n.to_string(),
            Some(_) => {
                return Err(AuthError::Invalid(format!(
                    "claim {name:?} is not a string"
                )))
            }
            None => {
                return Err(AuthError::Invalid(format!(
                    "the token has no {name:?} claim"
                )))
            }
        };
        ids::validate("user", &user).map_err(|e| AuthError::Invalid(format!("{name}: {e}")))?;
        // Checked present and in the future by the validation.
        let exp = claims.get("exp").and_then(Value::as_f64).unwrap_or(0.0) as u64;
        Ok(Verified { user, exp })
    }
}

/// An identity provider's JSON Web Key Set, fetched from its URL and kept
/// by `kid`.
pub struct Jwks {
    /// Where the set is published (`https://<tenant>/.well-known/jwks.json`).
    url: reqwest::Url,
    /// Used for every fetch; no pooled connections, as the fetches are rare
    /// and may come from any worker's runtime.
    client: reqwest::Client,
    /// `kid` -> key and the one algorithm it verifies.
    keys: RwLock<HashMap<String, (DecodingKey, Algorithm)>>,
    /// When the set was last fetched; held across a fetch so that
    /// concurrent misses wait for one fetch instead of making their own.
    fetched: tokio::sync::Mutex<Option<Instant>>,
    /// Period of the background refresh.
    refresh: Duration,
    /// Shortest time between two fetches caused by an unknown `kid`.
    refetch_min: Duration,
}

impl Jwks {
    /// A key set at `url`: HTTPS, or plain HTTP on a loopback host only
    /// (a local test server or a sidecar).
    pub fn new(url: &str, refresh: Duration, refetch_min: Duration) -> anyhow::Result<Self> {
        let url: reqwest::Url = url
            .parse()
            .map_err(|e| anyhow::anyhow!("--jwt-jwks-url {url:?}: {e}"))?;
        let host = url.host_str().unwrap_or("");
        let loopback = host.eq_ignore_ascii_case("localhost")
            || host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback());
        match url.scheme() {
            "https" => {}
            "http" if loopback => {}
            _ => anyhow::bail!(
                "--jwt-jwks-url must be an https:// URL (plain http only on a loopback host), got {url}"
            ),
        }
        let client = reqwest::Client::builder()
            .timeout(JWKS_TIMEOUT)
            .pool_max_idle_per_host(0)
            .build()?;
        Ok(Self {
            url,
            client,
            keys: RwLock::default(),
            fetched: tokio::sync::Mutex::new(None),
            refresh,
            refetch_min,
        })
    }

    /// The keys that may have signed a token with `kid` and `alg`. An
    /// unknown `kid` fetches the set again (the provider rotated its keys),
    /// at most once per `refetch_min`.
    async fn keys_for(&self, kid: Option<&str>, alg: Algorithm) -> Vec<(DecodingKey, Algorithm)> {
        let found = self.lookup(kid, alg);
        if !found.is_empty() {
            return found;
        }
        let Some(kid) = kid else {
            return found;
        };
        let mut fetched = self.fetched.lock().await;
        // Another request may have fetched it while this one waited.
        let found = self.lookup(Some(kid), alg);
        if !found.is_empty() {
            return found;
        }
        if fetched.is_some_and(|at| at.elapsed() < self.refetch_min) {
            log::debug!("JWKS: unknown kid {kid:?}; refetch rate-limited");
            return found;
        }
        *fetched = Some(Instant::now());
        match self.fetch_unlocked().await {
            Ok(n) => log::info!("JWKS: unknown kid {kid:?}; refetched {n} keys"),
            Err(e) => log::warn!("JWKS: unknown kid {kid:?}; refetch failed: {e:#}"),
        }
        self.lookup(Some(kid), alg)
    }

    /// Cached keys matching `kid` (all of them when the token names none)
    /// and `alg`.
    fn lookup(&self, kid: Option<&str>, alg: Algorithm) -> Vec<(DecodingKey, Algorithm)> {
        // A poisoned lock only means a panic elsewhere while swapping the
        // map; the map itself is always whole.
        let keys = self.keys.read().unwrap_or_else(|e| e.into_inner());
        let found: Vec<&(DecodingKey, Algorithm)> = match kid {
            Some(kid) => keys.get(kid).into_iter().collect(),
            None => keys.values().collect(),
        };
        found
            .into_iter()
            .filter(|(_, a)| *a == alg)
            .cloned()
            .collect()
    }

    /// Fetches the set now and replaces the cached keys.
    async fn fetch(&self) -> anyhow::Result<usize> {
        let mut fetched = self.fetched.lock().await;
        *fetched = Some(Instant::now());
        self.fetch_unlocked().await
    }

    /// Fetches the set; the caller holds `fetched`.
    async fn fetch_unlocked(&self) -> anyhow::Result<usize> {
        let resp = self
            .client
            .get(self.url.clone())
            .send()
            .await
            .map_err(|e| anyhow::anyhow!("cannot fetch {}: {e}", self.url))?;
        if !resp.status().is_success() {
            anyhow::bail!("{} answered {}", self.url, resp.status());
        }
        if resp.content_length().unwrap_or(0) > JWKS_MAX_BYTES as u64 {
            anyhow::bail!("{}: key set larger than {JWKS_MAX_BYTES} bytes", self.url);
        }
        let body = resp.bytes().await?;
        if body.len() > JWKS_MAX_BYTES {
            anyhow::bail!("{}: key set larger than {JWKS_MAX_BYTES} bytes", self.url);
        }
        let keys = parse_jwks(&body).map_err(|e| anyhow::anyhow!("{}: {e}", self.url))?;
        let n = keys.len();
        *self.keys.write().unwrap_or_else(|e| e.into_inner()) = keys;
        Ok(n)
    }

    /// Refetches the set every `refresh`; a failed fetch keeps the keys
    /// already known.
    async fn refresh_loop(self: Arc<Self>) {
        loop {
            tokio::time::sleep(self.refresh).await;
            match self.fetch().await {
                Ok(n) => log::debug!("JWKS: refreshed, {n} keys"),
                Err(e) => log::warn!("JWKS: refresh failed, keeping the known keys: {e:#}"),
            }
        }
    }
}

/// The usable keys of a JWKS document by `kid`. Keys this server cannot use
/// (encryption keys, unknown types or curves) are skipped, not fatal:
/// providers publish those beside the signing keys.
pub fn parse_jwks(body: &[u8]) -> anyhow::Result<HashMap<String, (DecodingKey, Algorithm)>> {
    #[derive(serde::Deserialize)]
    struct Set {
        keys: Vec<Value>,
    }
    let set: Set = serde_json::from_slice(body)
        .map_err(|e| anyhow::anyhow!("not a JWKS document ({{\"keys\":[...]}}): {e}"))?;
    let mut out = HashMap::new();
    for raw in set.keys {
        let Ok(jwk) = serde_json::from_value::<Jwk>(raw) else {
            continue;
        };
        if jwk
            .common
            .public_key_use
            .as_ref()
            .is_some_and(|u| *u != jsonwebtoken::jwk::PublicKeyUse::Signature)
        {
            continue;
        }
        let Some(alg) = jwk_algorithm(&jwk) else {
            continue;
        };
        let Ok(key) = DecodingKey::from_jwk(&jwk) else {
            continue;
        };
        out.insert(jwk.common.key_id.clone().unwrap_or_default(), (key, alg));
    }
    Ok(out)
}

/// The one algorithm a JWK verifies: RS256, ES256 or EdDSA, from its `alg`
/// when given, else from its key type; `None` for anything else.
fn jwk_algorithm(jwk: &Jwk) -> Option<Algorithm> {
    let by_type = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => Algorithm::RS256,
        AlgorithmParameters::EllipticCurve(p) if p.curve == EllipticCurve::P256 => Algorithm::ES256,
        AlgorithmParameters::OctetKeyPair(p) if p.curve == EllipticCurve::Ed25519 => {
            Algorithm::EdDSA
        }
        _ => return None,
    };
    match jwk.common.key_algorithm {
        None => Some(by_type),
        Some(KeyAlgorithm::RS256) if by_type == Algorithm::RS256 => Some(by_type),
        Some(KeyAlgorithm::ES256) if by_type == Algorithm::ES256 => Some(by_type),
        Some(KeyAlgorithm::EdDSA) if by_type == Algorithm::EdDSA => Some(by_type),
        Some(_) => None,
    }
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
                }))
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
