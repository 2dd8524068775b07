//! Tokens for the tests of JWT auth: HS256 ones signed with the secret the
//! JWT nodes run with, and tokens of key pairs made by the openssl CLI.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

use jsonwebtoken::jwk::Jwk;
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::{json, Value};

use super::{Node, Redis};

/// The HS256 secret of [`jwt_node`]s.
pub const SECRET: &str = "0123456789abcdef0123456789abcdef-test-secret";

/// Seconds since the epoch, as `exp` and `nbf` count them.
pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// `claims` signed HS256 with `secret`.
pub fn sign(secret: &str, claims: &Value) -> String {
    encode(
        &Header::new(Algorithm::HS256),
        claims,
        &EncodingKey::from_secret(secret.as_bytes()),
    )
    .unwrap()
}

/// `claims` signed HS256 with [`SECRET`].
pub fn hs(claims: Value) -> String {
    sign(SECRET, &claims)
}

/// A token for `sub` that expires in `lifetime` seconds, signed with
/// [`SECRET`].
pub fn token_for(sub: &str, lifetime: u64) -> String {
    hs(json!({"sub": sub, "exp": now() + lifetime}))
}

/// A token for `sub` valid for an hour, signed with [`SECRET`].
pub fn token(sub: &str) -> String {
    token_for(sub, 3600)
}

/// Status of a handshake with `token` in the query string.
pub async fn connect_with(node: &Node, token: &str) -> u16 {
    super::handshake(
        &format!("ws://{}/ws?device=d&token={token}", node.addr),
        &[],
    )
    .await
}

/// A node `id` that takes HS256 tokens signed with [`SECRET`], with `extra`
/// flags.
pub fn jwt_node(redis: &Redis, id: &str, extra: &[&str]) -> Node {
    let mut args = vec!["--auth", "jwt", "--jwt-secret", SECRET];
    args.extend(extra);
    Node::start_with(redis, id, &args)
}

/// A private key made by the openssl CLI, its algorithm, and its public JWK
/// with `kid`.
pub struct Key {
    encoding: EncodingKey,
    pub alg: Algorithm,
    pub jwk: Jwk,
    /// The private key's PEM file.
    pem: PathBuf,
}

impl Key {
    /// A new RS256, ES256 or EdDSA key in `dir/<kid>.pem`.
    pub fn generate(dir: &Path, alg: Algorithm, kid: &str) -> Self {
        let pem = dir.join(format!("{kid}.pem"));
        let spec: &[&str] = match alg {
            Algorithm::RS256 => &["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"],
            Algorithm::ES256 => &["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"],
            Algorithm::EdDSA => &["-algorithm", "ed25519"],
            _ => unreachable!(),
        };
        let ok = Command::new("openssl")
            .arg("genpkey")
            .args(spec)
            .arg("-out")
            .arg(&pem)
            .stderr(Stdio::null())
            .status()
            .expect("openssl must be installed")
            .success();
        assert!(ok, "openssl could not make a {alg:?} key");
        let bytes = std::fs::read(&pem).unwrap();
        let encoding = match alg {
            Algorithm::RS256 => EncodingKey::from_rsa_pem(&bytes),
            Algorithm::ES256 => EncodingKey::from_ec_pem(&bytes),
            _ => EncodingKey::from_ed_pem(&bytes),
        }
        .unwrap();
        let mut jwk = Jwk::from_encoding_key(&encoding, alg).unwrap();
        jwk.common.key_id = Some(kid.to_string());
        Self {
            encoding,
            alg,
            jwk,
            pem,
        }
    }

    /// The `kid` of its JWK.
    pub fn kid(&self) -> &str {
        self.jwk.common.key_id.as_deref().unwrap()
    }

    /// Writes the public key as a PEM file beside the private one; its path.
    pub fn public_pem(&self) -> PathBuf {
        let public = self.pem.with_extension("pub.pem");
        let ok = Command::new("openssl")
            .args(["pkey", "-pubout", "-in"])
            .arg(&self.pem)
            .arg("-out")
            .arg(&public)
            .status()
            .expect("openssl must be installed")
            .success();
        assert!(ok, "openssl could not write the public key");
        public
    }

    /// `claims` signed with this key; the header names `kid`, if any.
    pub fn sign(&self, kid: Option<&str>, claims: &Value) -> String {
        let mut header = Header::new(self.alg);
        header.kid = kid.map(str::to_string);
        encode(&header, claims, &self.encoding).unwrap()
    }
}
