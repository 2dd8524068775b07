//! An identity provider's JSON Web Key Set (`--jwt-jwks-url`): fetched,
//! kept by `kid`, refreshed on a period and refetched for an unknown `kid`.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, KeyAlgorithm};
use jsonwebtoken::{Algorithm, DecodingKey};
use serde_json::Value;

use super::*;

/// An identity provider's JSON Web Key Set, fetched from its URL and kept
/// by `kid`.
pub struct Jwks {
    /// Where the set is published (`https://<tenant>/.well-known/jwks.json`).
    pub(super) url: reqwest::Url,
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
    pub(super) async fn keys_for(
        &self,
        kid: Option<&str>,
        alg: Algorithm,
    ) -> Vec<(DecodingKey, Algorithm)> {
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
    pub(super) fn lookup(
        &self,
        kid: Option<&str>,
        alg: Algorithm,
    ) -> Vec<(DecodingKey, Algorithm)> {
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
    pub(super) async fn fetch(&self) -> anyhow::Result<usize> {
        let mut fetched = self.fetched.lock().await;
        *fetched = Some(Instant::now());
        self.fetch_unlocked().await
    }

    /// Fetches the set; the caller holds `fetched`.
    pub(super) async fn fetch_unlocked(&self) -> anyhow::Result<usize> {
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
    pub(super) async fn refresh_loop(self: Arc<Self>) {
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
pub(super) fn jwk_algorithm(jwk: &Jwk) -> Option<Algorithm> {
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
