//! User, device and node identifiers.
//!
//! Every id ends up inside a Redis key (`presence:{<user>}:<device>`) and in
//! JSON, so the alphabet is printable ASCII less ':' (the key separator),
//! braces (the hash tag), '"', whitespace and control characters: each key
//! parses back unambiguously, the `{<user>}` hash tag is always exactly the
//! user, and identity providers' subjects (`auth0|64f1...`,
//! `google-oauth2|1234`, `user+tag@example.com`) pass as they are.

/// A user's id as a node holds it while the user is watched: one copy per
/// user, shared by the registry's maps, the subscription task and every
/// watching session. A thin pointer (8 B in each table slot, where an
/// `Arc<str>` takes 16) to a counted string (issue 29, memory per watch).
pub type UserId = arcstr::ArcStr;

/// Longest accepted id, in bytes (all accepted characters are ASCII).
pub const MAX_ID_LEN: usize = 128;

/// Why an id was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    /// The id is empty.
    #[error("{what} id is empty")]
    Empty {
        /// "user", "device" or "node".
        what: &'static str,
    },
    /// The id is longer than [`MAX_ID_LEN`].
    #[error("{what} id is longer than {MAX_ID_LEN} bytes")]
    TooLong {
        /// "user", "device" or "node".
        what: &'static str,
    },
    /// A room id holds a character outside its alphabet.
    #[error(
        "room id may only contain printable ASCII other than {{ }} \" * and spaces (found {found:?}); `*` only ends a prefix in a rooms claim"
    )]
    RoomChar {
        /// The first offending character.
        found: char,
    },
    /// The id holds a character outside the alphabet.
    #[error(
        "{what} id may only contain printable ASCII other than : {{ }} \" and spaces (found {found:?})"
    )]
    BadChar {
        /// "user", "device" or "node".
        what: &'static str,
        /// The first offending character.
        found: char,
    },
}

/// Checks one id; `what` names it in the error ("user", "device", "node").
pub fn validate(what: &'static str, id: &str) -> Result<(), IdError> {
    if id.is_empty() {
        return Err(IdError::Empty { what });
    }
    if let Some(found) = id.chars().find(|c| !is_id_char(*c)) {
        return Err(IdError::BadChar { what, found });
    }
    if id.len() > MAX_ID_LEN {
        return Err(IdError::TooLong { what });
    }
    Ok(())
}

/// Checks a room id: the id alphabet, but `:` is allowed (`doc:42`,
/// `team:7:general`); a room's keys put it inside the `{r:<room>}` tag,
/// which holds no braces, so it still parses back. `*` is not: it ends a
/// prefix in a token's rooms claim (`team:7:*`), and a room named with it
/// would make a grant mean a room and a prefix at once.
pub fn validate_room(room: &str) -> Result<(), IdError> {
    let what = "room";
    if room.is_empty() {
        return Err(IdError::Empty { what });
    }
    if let Some(found) = room
        .chars()
        .find(|c| *c == '*' || (*c != ':' && !is_id_char(*c)))
    {
        return Err(IdError::RoomChar { found });
    }
    if room.len() > MAX_ID_LEN {
        return Err(IdError::TooLong { what });
    }
    Ok(())
}

/// Printable ASCII (`!` to `~`, so no space and no control character)
/// without the key separator, the hash-tag braces and the JSON quote.
fn is_id_char(c: char) -> bool {
    matches!(c, '!'..='~') && !matches!(c, ':' | '{' | '}' | '"')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_alphabet() {
        assert!(validate("user", "alice").is_ok());
        assert!(validate("user", "a.b-c_d@example.com").is_ok());
        assert!(validate("user", &"x".repeat(128)).is_ok());
    }

    #[test]
    fn accepts_identity_provider_subjects() {
        for id in [
            "auth0|64f1c0ffee0123456789abcd",
            "google-oauth2|1234567890",
            "user+tag@example.com",
            "samlp|acme|jane.doe",
            "a/b=c~!#$%&'()*,;<>?[]^`",
        ] {
            assert_eq!(validate("user", id), Ok(()), "{id:?} refused");
        }
    }

    #[test]
    fn room_ids_take_colons_but_no_star() {
        for ok in ["doc:42", "team:7:general", ":", "a/b=c~!#$%&'()+,;<>?[]^`"] {
            assert_eq!(validate_room(ok), Ok(()), "{ok:?} refused");
        }
        for bad in ["doc:abc*", "*", "team:7*", "a*b", "x{y}", "a b", "a\"b"] {
            let err = validate_room(bad).expect_err(bad);
            assert!(matches!(err, IdError::RoomChar { .. }), "{bad:?}: {err:?}");
        }
        assert!(validate_room("doc:*")
            .unwrap_err()
            .to_string()
            .contains("'*'"));
    }

    #[test]
    fn refuses_what_would_break_a_key() {
        assert_eq!(validate("user", ""), Err(IdError::Empty { what: "user" }));
        assert_eq!(
            validate("device", &"x".repeat(129)),
            Err(IdError::TooLong { what: "device" })
        );
        for bad in [
            "a:b", "{a}", "a}", "a\"b", "a b", "a\tb", "é", "a\n", "a\u{7f}", "a\0",
        ] {
            assert!(validate("user", bad).is_err(), "{bad:?} accepted");
        }
    }
}
