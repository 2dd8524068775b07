//! User, device and node identifiers.
//!
//! Every id ends up inside a Redis key (`presence:{<user>}:<device>`), so the
//! alphabet leaves out ':' and braces: each key parses back unambiguously and
//! the `{<user>}` hash tag is always exactly the user.

/// Longest accepted id, in bytes (all accepted characters are ASCII).
pub const MAX_ID_LEN: usize = 64;

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
    #[error("{what} id is longer than {MAX_ID_LEN} characters")]
    TooLong {
        /// "user", "device" or "node".
        what: &'static str,
    },
    /// The id holds a character outside `[A-Za-z0-9_.@-]`.
    #[error("{what} id may only contain letters, digits and _ . @ - (found {found:?})")]
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

fn is_id_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '@' | '-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_alphabet() {
        assert!(validate("user", "alice").is_ok());
        assert!(validate("user", "a.b-c_d@example.com").is_ok());
        assert!(validate("user", &"x".repeat(64)).is_ok());
    }

    #[test]
    fn refuses_what_would_break_a_key() {
        assert_eq!(validate("user", ""), Err(IdError::Empty { what: "user" }));
        assert_eq!(
            validate("device", &"x".repeat(65)),
            Err(IdError::TooLong { what: "device" })
        );
        for bad in ["a:b", "{a}", "a b", "é", "a\n", "a/b"] {
            assert!(validate("user", bad).is_err(), "{bad:?} accepted");
        }
    }
}
