//! Who may join which room. Under `--room-policy claim` (the default with
//! JWT auth) a token's rooms claim lists room ids and prefixes ending in
//! `*` (`["doc:42", "team:7:*"]`); a join outside it is `forbidden`.

/// Whether `room` is one of `grants`: an id equal to it, or a prefix
/// ending in `*` that it starts with. A lone `*` grants every room.
pub fn allows(grants: &[String], room: &str) -> bool {
    grants.iter().any(|g| match g.strip_suffix('*') {
        Some(prefix) => room.starts_with(prefix),
        None => g == room,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_prefixes_grant_rooms() {
        let grants = ["doc:42".to_string(), "team:7:*".to_string()];
        assert!(allows(&grants, "doc:42"));
        assert!(!allows(&grants, "doc:421"));
        assert!(!allows(&grants, "doc:4"));
        assert!(allows(&grants, "team:7:general"));
        assert!(allows(&grants, "team:7:"));
        assert!(!allows(&grants, "team:70:general"));
        assert!(!allows(&[], "doc:42"));
        assert!(allows(&["*".to_string()], "anything"));
    }
}
