//! One page of `GET /api/online`, with the recently seen after the users
//! online now when `seen_within_ms` is given: the online list's own walk
//! first, then, once it is over, the walk of the recently seen
//! ([`crate::store::seen`]), on the same page if it has room, or from the
//! `next_cursor` of the last online page.

use crate::store::seen::is_seen_cursor;
use crate::store::{Cursor, OnlinePage, Reader, Store, StoreResult};

/// The page of `GET /api/online` at `cursor`; `seen_since` (epoch ms)
/// when the recently seen follow.
pub(super) async fn online_page(
    store: &Store,
    limit: usize,
    cursor: Option<&Cursor>,
    seen_since: Option<i64>,
    reader: Reader<'_>,
    contacts_only: bool,
) -> StoreResult<OnlinePage> {
    let Some(since) = seen_since else {
        return store.online_as(limit, cursor, reader, contacts_only).await;
    };
    if let Some(c) = cursor.filter(|c| is_seen_cursor(c)) {
        return store
            .recently_seen(limit, Some(c), since, reader, contacts_only)
            .await;
    }
    let mut page = store
        .online_as(limit, cursor, reader, contacts_only)
        .await?;
    if page.next_cursor.is_some() {
        return Ok(page);
    }
    if page.users.len() >= limit {
        page.next_cursor = Some(store.seen_start_cursor());
        return Ok(page);
    }
    let rest = store
        .recently_seen(limit - page.users.len(), None, since, reader, contacts_only)
        .await?;
    page.users.extend(rest.users);
    page.next_cursor = rest.next_cursor;
    Ok(page)
}
