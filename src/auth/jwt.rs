//! Verifying JSON Web Tokens: HS256 secrets, RS/ES/EdDSA public keys and
//! identity providers' key sets, with the audience, issuer, user-claim and
//! leeway rules of the flags.

use std::sync::Arc;
use std::time::Duration;

use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::Value;

use super::*;
use crate::ids;

/// The claim of a room token that names its one room (`--room-policy token`).
pub const ROOM_CLAIM: &str = "room";

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
    pub(super) fn validation(&self, alg: Algorithm) -> Validation {
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
        let claims = self.decode_claims(token).await?;
        if self.rules.room_tokens && claims.contains_key(ROOM_CLAIM) {
            // A room token names a user too: it must not open a connection
            // (or read as one) wherever it is shown.
            return Err(AuthError::Invalid(format!(
                "this is a room token (it has a {ROOM_CLAIM:?} claim), not a connection token"
            )));
        }
        self.claims(&claims)
    }

    /// The claims of `token` once its signature, `exp`, `nbf`, `aud` and
    /// `iss` pass: the checks every token goes through, connection and
    /// room tokens alike.
    pub(super) async fn decode_claims(
        &self,
        token: &str,
    ) -> Result<serde_json::Map<String, Value>, AuthError> {
        let header = jsonwebtoken::decode_header(token).map_err(|e| {
            AuthError::Invalid(if unsigned(token) {
                "tokens with alg \"none\" (unsigned) are refused".to_string()
            } else {
                e.to_string()
            })
        })?;
        // RFC 7515 4.1.11: a token whose `crit` names an extension the
        // receiver does not understand is invalid. This server understands
        // none, and an empty list is not allowed either.
        if let Some(crit) = &header.crit {
            return Err(AuthError::Invalid(format!(
                "the token's header marks {crit:?} critical; no extension is understood"
            )));
        }
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
                Ok(data) => return Ok(data.claims),
                Err(e) => last = AuthError::Invalid(in_words(&e)),
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
    pub(super) fn claims(
        &self,
        claims: &serde_json::Map<String, Value>,
    ) -> Result<Verified, AuthError> {
        let name = &self.rules.user_claim;
        let user = match claims.get(name) {
            // Only a string: a number `123` and the string "123" would
            // otherwise be one user, though the issuer may mean two.
            Some(Value::String(s)) => s.clone(),
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
        let rooms_claim = &self.rules.rooms_claim;
        let rooms = match claims.get(rooms_claim) {
            None => Vec::new(),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| match v {
                    Value::String(s) => Ok(s.clone()),
                    _ => Err(AuthError::Invalid(format!(
                        "claim {rooms_claim:?} must be a list of room ids"
                    ))),
                })
                .collect::<Result<_, _>>()?,
            Some(_) => {
                return Err(AuthError::Invalid(format!(
                    "claim {rooms_claim:?} must be a list of room ids"
                )))
            }
        };
        Ok(Verified { user, exp, rooms })
    }
}

/// Whether `token`'s header says `alg: none`: the token library has no such
/// algorithm and fails on it with a parse error, which says nothing useful.
fn unsigned(token: &str) -> bool {
    use base64::Engine as _;
    let Some(head) = token.split('.').next() else {
        return false;
    };
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(head.trim_end_matches('='))
        .ok()
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        .is_some_and(|h| {
            h["alg"]
                .as_str()
                .is_some_and(|a| a.eq_ignore_ascii_case("none"))
        })
}

/// A verification failure in words a client developer can act on.
fn in_words(e: &jsonwebtoken::errors::Error) -> String {
    use jsonwebtoken::errors::ErrorKind;
    match e.kind() {
        ErrorKind::ExpiredSignature => "the token has expired (exp)".into(),
        ErrorKind::ImmatureSignature => "the token is not valid yet (nbf)".into(),
        ErrorKind::InvalidSignature => "the token's signature does not verify".into(),
        ErrorKind::InvalidAudience => "the token's aud is not accepted".into(),
        ErrorKind::InvalidIssuer => "the token's iss is not accepted".into(),
        ErrorKind::MissingRequiredClaim(claim) => format!("the token has no {claim:?} claim"),
        _ => e.to_string(),
    }
}
