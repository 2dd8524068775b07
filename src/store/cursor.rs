//! The online list's cursor as clients see it: sealed with a key the whole
//! fleet shares (`cursor-key` of `presence-meta`), so that a cursor handed
//! out by one node works on every other, and no one can read or make one.
//!
//! Why encrypted, not only signed: a [`Cursor`] is where a walk over the
//! index stopped, and that may be the entry of a user hidden from the
//! viewer (a walk that ran out of work among invisible users): its score is
//! that user's lease deadline, and its per-bucket ties tell the user's
//! bucket. An HMAC alone would stop forged cursors but leave all of that
//! readable. So the cursor is encrypted: a random 16-byte nonce, the
//! content XORed with HMAC-SHA256(enc key, nonce || block number) (a PRF in
//! counter mode), then an HMAC-SHA256 tag over nonce and ciphertext
//! (encrypt-then-MAC, a second key). With a fresh nonce two cursors of the
//! same position differ, and every cursor of a deployment has the same
//! length (the bucket count is fixed), so a cursor tells nothing at all.
//! What a page still tells, and must, is that it is short: entries the
//! viewer may not see were passed over (the work per request is bounded).

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::keys::Buckets;

type HmacSha256 = Hmac<Sha256>;

/// Position in `GET /api/online`: the score reached in the buckets of
/// `presence-leases` (a lease deadline, epoch ms; a claimed entry's ends in
/// `.5`) and, per bucket, how many entries with exactly that score were
/// already examined. Scores are shared (a batch of refreshes writes one
/// deadline), so a score alone cannot say where a page ended. Clients get
/// it sealed ([`CursorKey`]): it may be a hidden user's.
#[derive(Debug, Clone, PartialEq)]
pub struct Cursor {
    /// The score reached.
    pub score: f64,
    /// Per bucket, the entries at `score` already examined.
    pub ties: Vec<u32>,
}

/// Bytes of the nonce at the head of a sealed cursor.
const NONCE: usize = 16;
/// Bytes of the tag at its tail (HMAC-SHA256 cut to 128 bits).
const TAG: usize = 16;

/// The keys that seal cursors, derived from the fleet's shared key.
#[derive(Clone)]
pub struct CursorKey {
    /// Encrypts (keystream).
    enc: [u8; 32],
    /// Authenticates (tag).
    mac: [u8; 32],
}

impl std::fmt::Debug for CursorKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CursorKey(..)")
    }
}

/// HMAC-SHA256 of the concatenated `parts` under `key`.
fn hmac(key: &[u8], parts: &[&[u8]]) -> HmacSha256 {
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC accepts any key length");
    for p in parts {
        mac.update(p);
    }
    mac
}

impl CursorKey {
    /// The keys of the shared `secret` (32 random bytes, see
    /// [`super::Store::load_deployment`]).
    pub fn new(secret: &[u8]) -> Self {
        let derive =
            |label: &[u8]| -> [u8; 32] { hmac(secret, &[label]).finalize().into_bytes().into() };
        Self {
            enc: derive(b"presence online cursor: encryption"),
            mac: derive(b"presence online cursor: authentication"),
        }
    }

    /// Keys of a random secret: a store that never read its deployment's
    /// (its cursors work on this process only).
    pub fn random() -> Self {
        Self::new(&rand::random::<[u8; 32]>())
    }

    /// XORs `data` with the keystream of `nonce`.
    fn apply_keystream(&self, nonce: &[u8], data: &mut [u8]) {
        for (block, chunk) in data.chunks_mut(32).enumerate() {
            let pad = hmac(&self.enc, &[nonce, &(block as u32).to_be_bytes()]).finalize();
            chunk
                .iter_mut()
                .zip(pad.into_bytes())
                .for_each(|(b, p)| *b ^= p);
        }
    }

    /// The opaque string handed to clients for `cursor`.
    pub fn seal(&self, cursor: &Cursor) -> String {
        let mut out: Vec<u8> = rand::random::<[u8; NONCE]>().to_vec();
        out.extend(cursor.score.to_bits().to_be_bytes());
        out.extend(cursor.ties.iter().flat_map(|t| t.to_be_bytes()));
        let (nonce, body) = out.split_at_mut(NONCE);
        self.apply_keystream(nonce, body);
        let tag = hmac(&self.mac, &[&out]).finalize().into_bytes();
        out.extend(&tag[..TAG]);
        URL_SAFE_NO_PAD.encode(out)
    }

    /// The cursor sealed in `s` for `buckets`; `None` when it is not one
    /// this fleet handed out (made up, changed, or of another bucket count).
    pub fn open(&self, s: &str, buckets: Buckets) -> Option<Cursor> {
        let raw = URL_SAFE_NO_PAD.decode(s).ok()?;
        let count = buckets.count() as usize;
        if raw.len() != NONCE + 8 + 4 * count + TAG {
            return None;
        }
        let (sealed, tag) = raw.split_at(raw.len() - TAG);
        hmac(&self.mac, &[sealed]).verify_truncated_left(tag).ok()?;
        let (nonce, body) = sealed.split_at(NONCE);
        let mut body = body.to_vec();
        self.apply_keystream(nonce, &mut body);
        let (score, ties) = body.split_at(8);
        let score = f64::from_bits(u64::from_be_bytes(score.try_into().ok()?));
        let ties = ties
            .chunks_exact(4)
            .map(|t| u32::from_be_bytes([t[0], t[1], t[2], t[3]]))
            .collect();
        score.is_finite().then_some(Cursor { score, ties })
    }
}

impl CursorKey {
    /// Seals `data` as an opaque cursor of its own `kind` (one byte: a
    /// cursor of one kind does not open as another): encrypted and
    /// authenticated as the online list's.
    pub fn seal_raw(&self, kind: u8, data: &[u8]) -> String {
        let mut out: Vec<u8> = rand::random::<[u8; NONCE]>().to_vec();
        out.push(kind);
        out.extend(data);
        let (nonce, body) = out.split_at_mut(NONCE);
        self.apply_keystream(nonce, body);
        let tag = hmac(&self.mac, &[&out]).finalize().into_bytes();
        out.extend(&tag[..TAG]);
        URL_SAFE_NO_PAD.encode(out)
    }

    /// The data of a cursor [`Self::seal_raw`] sealed with `kind`; `None`
    /// for anything else.
    pub fn open_raw(&self, kind: u8, s: &str) -> Option<Vec<u8>> {
        let raw = URL_SAFE_NO_PAD.decode(s).ok()?;
        if raw.len() < NONCE + 1 + TAG {
            return None;
        }
        let (sealed, tag) = raw.split_at(raw.len() - TAG);
        hmac(&self.mac, &[sealed]).verify_truncated_left(tag).ok()?;
        let (nonce, body) = sealed.split_at(NONCE);
        let mut body = body.to_vec();
        self.apply_keystream(nonce, &mut body);
        (body.first() == Some(&kind)).then(|| body[1..].to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_refuse_junk() {
        let key = CursorKey::new(&[7; 32]);
        let b = Buckets::new(3).unwrap();
        for score in [17.0, 1_732_421_234_567.0, 1_732_421_235_567.5] {
            let c = Cursor {
                score,
                ties: vec![0, 2, 1],
            };
            let sealed = key.seal(&c);
            assert_eq!(key.open(&sealed, b), Some(c.clone()));
            // Fresh each time, and unreadable.
            assert_ne!(key.seal(&c), sealed);
            // (A long number only: "17" turns up in random base64 about
            // once in 60 cursors.)
            if score > 1e9 {
                assert!(!sealed.contains(&(score as i64).to_string()), "{sealed}");
            }
            // Another fleet's, another bucket count, or one bit changed.
            assert_eq!(CursorKey::new(&[8; 32]).open(&sealed, b), None);
            assert_eq!(key.open(&sealed, Buckets::new(4).unwrap()), None);
            let mut raw = URL_SAFE_NO_PAD.decode(&sealed).unwrap();
            for i in [0, NONCE, raw.len() - 1] {
                raw[i] ^= 1;
                assert_eq!(key.open(&URL_SAFE_NO_PAD.encode(&raw), b), None, "bit {i}");
                raw[i] ^= 1;
            }
        }
        for junk in ["", "17_0,2,1", "x_0,0,0", "nodot", "17~0,2,1", "AAAA", "!!"] {
            assert_eq!(key.open(junk, b), None, "{junk}");
        }
    }
}
