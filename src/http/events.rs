//! `GET /api/events`: the event feed by pull (issue 39), for the app's
//! backend with the service key: every recorded transition of the fleet,
//! oldest first, from an opaque cursor it keeps.

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use serde::{Deserialize, Serialize};

use super::access::require_service;
use super::{ApiError, AppState};
use crate::protocol::{ErrorCode, ProtocolError};
use crate::store::feed::FeedCursor;

/// Default page size.
pub const EVENTS_DEFAULT_LIMIT: usize = 100;
/// Largest page size.
pub const EVENTS_MAX_LIMIT: usize = 1_000;

/// Query string of `GET /api/events`.
#[derive(Deserialize, utoipa::IntoParams)]
pub(crate) struct EventsQuery {
    /// `next_cursor` of the page before; none: from the oldest event kept;
    /// `now`: no events, and a cursor from this moment on.
    cursor: Option<String>,
    /// Events per page, 1 to 1,000 (default 100).
    limit: Option<usize>,
}

/// One page of the feed.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct EventsPage {
    /// The events, oldest first: the webhook payloads (`type` online,
    /// offline, status, room_joined, room_left, room_occupied,
    /// room_vacated), each with its `id` and `seq`.
    #[schema(value_type = Vec<Object>)]
    events: Vec<serde_json::Value>,
    /// Pass it back for the events after these (an empty page: none yet).
    next_cursor: String,
    /// Events that went (retention, bounds) between the cursor and these.
    lost: u64,
}

/// `GET /api/events?cursor=&limit=` (service or admin key).
#[utoipa::path(get, path = "/api/events", tag = "service",
    params(EventsQuery),
    responses(
        (status = 200, description = "A page of the feed, oldest first", body = EventsPage),
        (status = 400, description = "Bad limit or cursor", body = ProtocolError),
        (status = 401, description = "No service or admin key", body = ProtocolError),
        (status = 404, description = "The feed is off (--event-retention-secs 0)", body = ProtocolError),
        (status = 503, description = "Redis unavailable", body = ProtocolError),
    ),
    security(("bearer" = [])))]
pub(crate) async fn events(
    req: HttpRequest,
    query: web::Query<EventsQuery>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    require_service(&req, &state)?;
    if state.node.config.event_retention.is_zero() {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            ErrorCode::NotFound,
            "the event feed is off (--event-retention-secs 0)",
        ));
    }
    let limit = query.limit.unwrap_or(EVENTS_DEFAULT_LIMIT);
    if !(1..=EVENTS_MAX_LIMIT).contains(&limit) {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            ErrorCode::BadRequest,
            format!("limit must be 1 to {EVENTS_MAX_LIMIT}"),
        ));
    }
    let store = &state.node.store;
    let _permit = state.admit_read(&req, super::Payer::Service, limit)?;
    let cursor = match query.cursor.as_deref() {
        None | Some("") => FeedCursor::start(store.bucket_count()),
        Some("now") => {
            let at = store.feed_heads().await?;
            let next_cursor = store.seal_feed_cursor(&FeedCursor { at });
            return Ok(HttpResponse::Ok().json(EventsPage {
                events: Vec::new(),
                next_cursor,
                lost: 0,
            }));
        }
        Some(c) => store.open_feed_cursor(c).ok_or_else(|| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                ErrorCode::BadRequest,
                "cursor is not one this fleet handed out",
            )
        })?,
    };
    let (entries, next, lost) = store.feed_page(&cursor, limit).await?;
    let events = entries
        .iter()
        .flat_map(crate::feed::events::events_of)
        .collect();
    Ok(HttpResponse::Ok().json(EventsPage {
        events,
        next_cursor: store.seal_feed_cursor(&next),
        lost,
    }))
}
