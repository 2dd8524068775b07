//! Room tokens (`--room-policy token`): a JWT from the app's backend that
//! lets one user into one room until its `exp`. It is verified with the
//! keys and rules of connection tokens (secret, PEM or JWKS; `iss`, `aud`,
//! leeway; `alg: none` refused); its user claim must name the user and its
//! `room` claim the room, exactly: no prefixes, no lists.

use actix_web::HttpRequest;
use serde_json::Value;

use super::jwt::ROOM_CLAIM;
use super::{Auth, JwtVerifier};

/// The HTTP header that carries room tokens on the room reads: repeated,
/// or several tokens in one, separated by commas (a JWT has none).
pub const ROOM_TOKEN_HEADER: &str = "Room-Token";

/// Most room tokens one HTTP read has verified: every one costs a signature
/// check, and headers are small anyway.
const MAX_HEADER_TOKENS: usize = 100;

/// What a valid room token grants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoomGrant {
    /// Its `room` claim.
    pub room: String,
    /// Its `exp`, epoch seconds.
    pub exp: u64,
}

/// Why a room token was refused, in words for the client's developer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct RoomTokenRefused(pub String);

impl RoomGrant {
    /// Whether this grant is for `room`: its claim is the room id exactly.
    pub fn for_room(&self, room: &str) -> Result<(), RoomTokenRefused> {
        if self.room == room {
            return Ok(());
        }
        let prefix = if self.room.ends_with('*') {
            ": a room token names one room exactly, never a prefix"
        } else {
            ""
        };
        Err(RoomTokenRefused(format!(
            "the room token is for room {:?}, not {room:?}{prefix}",
            self.room
        )))
    }
}

impl JwtVerifier {
    /// The grant of a valid room token for `user`: the checks of a
    /// connection token, then its user claim and its `room` claim.
    pub async fn verify_room(
        &self,
        token: &str,
        user: &str,
    ) -> Result<RoomGrant, RoomTokenRefused> {
        let refused = |why: String| RoomTokenRefused(format!("room token refused: {why}"));
        let claims = self
            .decode_claims(token)
            .await
            .map_err(|e| refused(e.to_string()))?;
        let name = &self.rules.user_claim;
        match claims.get(name) {
            Some(Value::String(s)) if s == user => {}
            Some(Value::String(s)) => {
                return Err(refused(format!("it is for user {s:?}, not {user:?}")))
            }
            Some(_) => return Err(refused(format!("its {name:?} claim is not a string"))),
            None => return Err(refused(format!("it has no {name:?} claim"))),
        }
        let room = match claims.get(ROOM_CLAIM) {
            Some(Value::String(room)) => room.clone(),
            Some(Value::Array(_)) => {
                return Err(refused(format!(
                    "its {ROOM_CLAIM:?} claim is a list; it must name one room"
                )))
            }
            Some(_) => return Err(refused(format!("its {ROOM_CLAIM:?} claim is not a string"))),
            None => {
                return Err(refused(format!(
                    "it has no {ROOM_CLAIM:?} claim (a connection token is not a room token)"
                )))
            }
        };
        // Required and checked in the future by the validation.
        let exp = claims.get("exp").and_then(Value::as_f64).unwrap_or(0.0) as u64;
        Ok(RoomGrant { room, exp })
    }
}

impl Auth {
    /// The `exp` of `token` once it is a valid room token of `user` for
    /// `room`. Development auth has no keys to verify it with (the node
    /// refuses to start with a `token` room under it).
    pub async fn verify_room_token(
        &self,
        token: &str,
        user: &str,
        room: &str,
    ) -> Result<u64, RoomTokenRefused> {
        let Auth::Jwt(v) = self else {
            return Err(RoomTokenRefused("room tokens need --auth jwt".into()));
        };
        let grant = v.verify_room(token, user).await?;
        grant.for_room(room)?;
        Ok(grant.exp)
    }

    /// An HTTP read of `rooms` (all under `token`) by `user`: each needs a
    /// valid room token of the user in the `Room-Token` header.
    pub async fn check_room_tokens(
        &self,
        req: &HttpRequest,
        user: Option<&str>,
        rooms: &[&str],
    ) -> Result<(), RoomTokenRefused> {
        let (Auth::Jwt(v), Some(user)) = (self, user) else {
            return Err(RoomTokenRefused("room tokens need --auth jwt".into()));
        };
        let mut missing: Vec<&str> = rooms.to_vec();
        let mut reason = None;
        for token in room_token_header(req).into_iter().take(MAX_HEADER_TOKENS) {
            if missing.is_empty() {
                break;
            }
            match v.verify_room(token, user).await {
                Ok(grant) => missing.retain(|r| *r != grant.room),
                Err(e) => {
                    reason.get_or_insert(e);
                }
            }
        }
        match (missing.first(), reason) {
            (None, _) => Ok(()),
            (Some(_), Some(reason)) => Err(reason),
            (Some(room), None) => Err(RoomTokenRefused(format!(
                "{room:?} takes a room token: send one for it in a {ROOM_TOKEN_HEADER} header"
            ))),
        }
    }
}

/// The room tokens of a request's `Room-Token` headers, in order.
pub fn room_token_header(req: &HttpRequest) -> Vec<&str> {
    req.headers()
        .get_all(ROOM_TOKEN_HEADER)
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grant_is_for_its_room_exactly() {
        let grant = |room: &str| RoomGrant {
            room: room.into(),
            exp: 1,
        };
        assert!(grant("chat:42").for_room("chat:42").is_ok());
        assert!(grant("chat:42").for_room("chat:421").is_err());
        assert!(grant("chat:4").for_room("chat:42").is_err());
        let err = grant("chat:*").for_room("chat:42").unwrap_err();
        assert!(err.0.contains("never a prefix"), "{err}");
    }

    #[test]
    fn the_header_takes_repeats_and_commas() {
        let req = actix_web::test::TestRequest::default()
            .append_header((ROOM_TOKEN_HEADER, "a.b.c, d.e.f"))
            .append_header((ROOM_TOKEN_HEADER, "g.h.i"))
            .append_header((ROOM_TOKEN_HEADER, " "))
            .to_http_request();
        assert_eq!(room_token_header(&req), ["a.b.c", "d.e.f", "g.h.i"]);
    }
}
