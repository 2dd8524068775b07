//! The read API: one user's record, a bulk query, and the online list, each
//! as the viewer may see it (`?viewer=` under development auth, a token
//! under JWT, or the admin or service key for the truth).

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use serde::{Deserialize, Serialize};

use super::access::{is_service, As};
use super::*;
use crate::admission::ReadPermit;
use crate::config::MAX_QUERY_USERS;
use crate::ids;
use crate::model::Record;
use crate::protocol::{ErrorCode, ProtocolError};
use crate::store::{DeviceInfo, OnlinePage, Reader};

/// Who an API read is for: a viewer (`None`: anonymous, dev mode only), or
/// the service (the admin or service key as the bearer), which reads the
/// truth. The keys are checked first, so that under JWT auth a key is never
/// taken for a malformed token.
enum ReadAs {
    /// A user, or anonymous.
    Viewer(Option<String>),
    /// The backend.
    Service,
}

impl ReadAs {
    fn reader(&self) -> Reader<'_> {
        match self {
            ReadAs::Viewer(v) => Reader::Viewer(v.as_deref()),
            ReadAs::Service => Reader::Service,
        }
    }

    /// `"service"` on a service view, absent otherwise.
    fn view(&self) -> Option<&'static str> {
        matches!(self, ReadAs::Service).then_some("service")
    }
}

/// Who reads, once its read of `cost` users is admitted: charged to its
/// budget, with a place among its reads in flight, held by the permit.
async fn read_as(
    req: &HttpRequest,
    state: &AppState,
    who: &As,
    cost: usize,
) -> Result<(ReadAs, ReadPermit), ApiError> {
    if is_service(req, state) {
        let permit = state.admit_read(req, Payer::Service, cost)?;
        return Ok((ReadAs::Service, permit));
    }
    let viewer = state.auth.viewer(req, who.token(), who.viewer()).await?;
    if let Some(v) = &viewer {
        ids::validate("user", v)?;
    }
    let permit = state.admit_read(req, Payer::Client(viewer.as_deref()), cost)?;
    Ok((ReadAs::Viewer(viewer), permit))
}

/// `GET /api/presence/{user}`: what the viewer may see, with a device list.
#[utoipa::path(get, path = "/api/presence/{user}", tag = "read",
    params(("user" = String, Path, description = "The user id"), ("viewer" = Option<String>, Query, description = "Development auth: read as this user"),
        ("token" = Option<String>, Query, description = "JWT auth: the reader's token, instead of Authorization: Bearer")),
    responses(
        (status = 200, description = "What the reader may see; the truth with the admin or service key", body = UserPresence),
        (status = 400, description = "Invalid user id", body = ProtocolError),
        (status = 401, description = "JWT auth: missing or invalid token", body = ProtocolError),
        (status = 503, description = "Redis unavailable", body = ProtocolError),
    ),
    security((), ("bearer" = [])))]
pub(crate) async fn presence(
    req: HttpRequest,
    user: web::Path<String>,
    who: web::Query<As>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let user = user.into_inner();
    ids::validate("user", &user)?;
    let (reader, _permit) = read_as(&req, &state, &who, 1).await?;
    let record = state
        .node
        .store
        .records_as(
            std::slice::from_ref(&user),
            reader.reader(),
            state.node.config.contacts_only,
        )
        .await?
        .remove(0);
    // Devices only of a user the viewer may see online.
    let devices = if record.devices > 0 {
        state.node.store.devices(&user).await?
    } else {
        Vec::new()
    };
    Ok(HttpResponse::Ok().json(UserPresence {
        view: reader.view(),
        record,
        device_list: devices,
    }))
}

/// `GET /api/presence/{user}`: a record with its device detail.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct UserPresence {
    /// `"service"` when read with the admin or service key (the truth);
    /// absent for a viewer's view.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, example = "service")]
    view: Option<&'static str>,
    #[serde(flatten)]
    record: Record,
    /// The live devices; empty unless the reader may see the user online.
    device_list: Vec<DeviceInfo>,
}

/// `POST /api/presence/query`: records in request order.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct QueryResult {
    /// `"service"` on a service view, absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, example = "service")]
    view: Option<&'static str>,
    presence: Vec<Record>,
}

/// `GET /api/online`: one page of the online list.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct OnlineResult {
    /// `"service"` on a service view, absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, example = "service")]
    view: Option<&'static str>,
    #[serde(flatten)]
    page: OnlinePage,
}

/// Body of `POST /api/presence/query`.
#[derive(Deserialize, utoipa::ToSchema)]
pub(crate) struct Query {
    users: Vec<String>,
}

/// `POST /api/presence/query`: records of up to 1,000 users, in request order.
#[utoipa::path(post, path = "/api/presence/query", tag = "read",
    params(("viewer" = Option<String>, Query, description = "Development auth: read as this user"),
        ("token" = Option<String>, Query, description = "JWT auth: the reader's token, instead of Authorization: Bearer")),
    request_body = Query,
    responses(
        (status = 200, description = "Records in request order", body = QueryResult),
        (status = 400, description = "Invalid body or user id", body = ProtocolError),
        (status = 401, description = "JWT auth: missing or invalid token", body = ProtocolError),
        (status = 413, description = "More than 1,000 users", body = ProtocolError),
        (status = 503, description = "Redis unavailable", body = ProtocolError),
    ),
    security((), ("bearer" = [])))]
pub(crate) async fn query(
    req: HttpRequest,
    body: web::Json<Query>,
    who: web::Query<As>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let users = body.into_inner().users;
    if users.len() > MAX_QUERY_USERS {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::TooManyUsers,
            format!(
                "at most {MAX_QUERY_USERS} users per query, got {}",
                users.len()
            ),
        ));
    }
    for user in &users {
        ids::validate("user", user)?;
    }
    let (reader, _permit) = read_as(&req, &state, &who, users.len()).await?;
    let presence = state
        .node
        .store
        .records_as(&users, reader.reader(), state.node.config.contacts_only)
        .await?;
    Ok(HttpResponse::Ok().json(QueryResult {
        view: reader.view(),
        presence,
    }))
}

/// Query string of `GET /api/online`.
#[derive(Deserialize)]
pub(crate) struct OnlineQuery {
    limit: Option<usize>,
    cursor: Option<String>,
    /// Also the users last seen within this many ms, after those online.
    seen_within_ms: Option<i64>,
    #[serde(flatten)]
    who: As,
}

/// `GET /api/online?limit=&cursor=[&seen_within_ms=]`: users the viewer may
/// see online now, most recently active first; then, with
/// `seen_within_ms`, those last seen within it.
#[utoipa::path(get, path = "/api/online", tag = "read",
    params(
        ("limit" = Option<usize>, Query, description = "Page size, 1 to 1000 (default 50)"),
        ("cursor" = Option<String>, Query, description = "next_cursor of the previous page"),
        ("seen_within_ms" = Option<i64>, Query, description = "After the users online now, the users last seen within this many ms (1 ms to 365 days), most recent first"),
        ("viewer" = Option<String>, Query, description = "Development auth: read as this user"),
        ("token" = Option<String>, Query, description = "JWT auth: the reader's token, instead of Authorization: Bearer")),
    responses(
        (status = 200, description = "Users online now, most recently active first", body = OnlineResult),
        (status = 400, description = "Bad limit or cursor", body = ProtocolError),
        (status = 401, description = "JWT auth: missing or invalid token", body = ProtocolError),
        (status = 503, description = "Redis unavailable", body = ProtocolError),
    ),
    security((), ("bearer" = [])))]
pub(crate) async fn online(
    req: HttpRequest,
    query: web::Query<OnlineQuery>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let limit = query.limit.unwrap_or(ONLINE_DEFAULT_LIMIT);
    if !(1..=ONLINE_MAX_LIMIT).contains(&limit) {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            ErrorCode::BadRequest,
            format!("limit must be between 1 and {ONLINE_MAX_LIMIT}"),
        ));
    }
    let cursor = match query.cursor.as_deref() {
        None | Some("") => None,
        Some(c) => Some(state.node.store.open_cursor(c).ok_or_else(|| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                ErrorCode::BadRequest,
                "cursor is not one this server handed out",
            )
        })?),
    };
    let seen_since = match query.seen_within_ms {
        None => None,
        Some(ms) if (1..=MAX_SEEN_WITHIN_MS).contains(&ms) => {
            Some(crate::clock::now_ms().saturating_sub(ms))
        }
        Some(_) => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                ErrorCode::BadRequest,
                format!("seen_within_ms must be between 1 and {MAX_SEEN_WITHIN_MS}"),
            ))
        }
    };
    // Recently seen users are a second list of up to `limit` after the
    // online ones: charged as such.
    let cost = if seen_since.is_some() {
        2 * limit
    } else {
        limit
    };
    let (reader, _permit) = read_as(&req, &state, &query.who, cost).await?;
    let page = super::seen::online_page(
        &state.node.store,
        limit,
        cursor.as_ref(),
        seen_since,
        reader.reader(),
        state.node.config.contacts_only,
    )
    .await?;
    Ok(HttpResponse::Ok().json(OnlineResult {
        view: reader.view(),
        page,
    }))
}
