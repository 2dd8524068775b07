//! `PUT /api/users/{user}/status`: a status set over HTTP, for calendar
//! and call integrations (the admin key) or a client without a socket (the
//! user's token): the same step as a `status` frame.

use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;

use super::super::access::require_self_or_admin;
use super::super::*;
use crate::model::Record;
use crate::privacy::{view, Relation};
use crate::protocol::check_status;

/// Body of `PUT /api/users/{user}/status`: the fields of a `status` frame.
#[derive(Deserialize, utoipa::ToSchema)]
pub(crate) struct StatusBody {
    /// online, away, busy or invisible.
    #[schema(example = "busy")]
    status: String,
    /// Optional free text.
    #[schema(example = "in a meeting")]
    text: Option<String>,
    /// When the status ends (back to `online`, text cleared), epoch ms:
    /// ahead, by at most 30 days.
    until: Option<i64>,
}

/// Query string of `PUT /api/users/{user}/status`.
#[derive(Deserialize)]
pub(crate) struct StatusQuery {
    /// JWT auth: the user's token, instead of `Authorization: Bearer`.
    token: Option<String>,
}

/// `PUT /api/users/{user}/status`: sets the user's status, text and
/// `until`; answers the user's own record.
#[utoipa::path(put, path = "/api/users/{user}/status", tag = "users",
    params(("user" = String, Path, description = "The user id"),
        ("token" = Option<String>, Query, description = "JWT auth: the user's token, instead of Authorization: Bearer")),
    request_body = StatusBody,
    responses(
        (status = 200, description = "The user's own record after the change", body = Record),
        (status = 400, description = "Invalid status, text or until (invalid_status), or id", body = ProtocolError),
        (status = 401, description = "JWT auth: missing or invalid token", body = ProtocolError),
        (status = 403, description = "Another user's token", body = ProtocolError),
        (status = 503, description = "Redis unavailable", body = ProtocolError),
    ),
    security((), ("bearer" = [])))]
pub(crate) async fn set_status(
    req: HttpRequest,
    user: web::Path<String>,
    body: web::Json<StatusBody>,
    query: web::Query<StatusQuery>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let user = user.into_inner();
    ids::validate("user", &user)?;
    let body = body.into_inner();
    let status = check_status(&body.status, body.text.as_deref(), body.until)?;
    require_self_or_admin(&req, &state, &user, query.token.as_deref()).await?;
    let store = &state.node.store;
    store
        .set_status(&user, status, body.text.as_deref(), body.until)
        .await?;
    let own = store
        .presences(std::slice::from_ref(&user), Some(&user))
        .await?;
    let record = own
        .first()
        .map(|o| view(&o.presence, Relation::Owner))
        .ok_or_else(|| crate::store::StoreError::reply(&user, "read: no record"))?;
    Ok(HttpResponse::Ok().json(record))
}
