//! A user's own settings (`PUT /api/users/{user}/privacy`) and the admin
//! API (contacts), with the bearer-key checks they share.

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use serde::{Deserialize, Serialize};

use super::reads::As;
use super::routes::PublicOnly;
use super::*;
use crate::auth::AuthError;
use crate::ids;
use crate::protocol::{parse_privacy, ErrorCode, ProtocolError};

/// Body of `PUT /api/users/{user}/privacy`.
#[derive(Deserialize, utoipa::ToSchema)]
pub(crate) struct PrivacyBody {
    online: Option<String>,
    last_seen: Option<String>,
}

/// `PUT /api/users/{user}/privacy`: the user itself (its token; in dev mode
/// anyone) or the admin changes who may see the user.
#[utoipa::path(put, path = "/api/users/{user}/privacy", tag = "users",
    params(("user" = String, Path, description = "The user id"), ("viewer" = Option<String>, Query, description = "Development auth: read as this user"),
        ("token" = Option<String>, Query, description = "JWT auth: the reader's token, instead of Authorization: Bearer")),
    request_body = PrivacyBody,
    responses(
        (status = 204, description = "Saved"),
        (status = 400, description = "Invalid value", body = ProtocolError),
        (status = 401, description = "JWT auth: missing or invalid token", body = ProtocolError),
        (status = 403, description = "Another user's token", body = ProtocolError),
    ),
    security((), ("bearer" = [])))]
pub(crate) async fn set_privacy(
    req: HttpRequest,
    user: web::Path<String>,
    body: web::Json<PrivacyBody>,
    who: web::Query<As>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let user = user.into_inner();
    ids::validate("user", &user)?;
    require_self_or_admin(&req, &state, &user, who.token.as_deref()).await?;
    let (online, last_seen) = parse_privacy(body.online.as_deref(), body.last_seen.as_deref())?;
    state
        .node
        .store
        .set_privacy(&user, online, last_seen)
        .await?;
    Ok(HttpResponse::NoContent().finish())
}

/// Checks that the request acts for `user`: the admin key (which acts for
/// any user), or the user's own token (`query_token` or the bearer; under
/// development auth, anyone). Another user's token is a 403. The write is
/// charged to the caller's read budget as one user (a `429` beyond it).
pub(super) async fn require_self_or_admin(
    req: &HttpRequest,
    state: &AppState,
    user: &str,
    query_token: Option<&str>,
) -> Result<(), ApiError> {
    if is_admin(req, state) {
        return state.charge_read(req, Payer::Service, 1);
    }
    let acting = state.auth.viewer(req, query_token, Some(user)).await?;
    if acting.as_deref() != Some(user) {
        return Err(AuthError::Mismatch {
            token: acting.unwrap_or_default(),
            asked: user.to_string(),
        }
        .into());
    }
    // A write is one Redis script: it counts as one user read against the
    // client's budget (its address's, and its token's user's).
    state.charge_read(req, Payer::Client(acting.as_deref()), 1)
}

/// Body of `PUT /api/users/{user}/contacts`.
#[derive(Deserialize, Serialize, utoipa::ToSchema)]
pub(crate) struct Contacts {
    contacts: Vec<String>,
}

/// True when the request carries the admin key.
pub(super) fn is_admin(req: &HttpRequest, state: &AppState) -> bool {
    let Some(key) = state.admin_key.as_deref() else {
        return false;
    };
    // With --internal-listen the admin key works only there.
    if req.app_data::<PublicOnly>().is_some() {
        return false;
    }
    bearer_is(req, key)
}

/// True when the request may read the service view: the admin key (where
/// it works) or the service key (on either listener: it reads, nothing more).
pub(super) fn is_service(req: &HttpRequest, state: &AppState) -> bool {
    is_admin(req, state)
        || state
            .service_key
            .as_deref()
            .is_some_and(|key| bearer_is(req, key))
}

/// True when the bearer token is `key`.
pub(super) fn bearer_is(req: &HttpRequest, key: &str) -> bool {
    use subtle::ConstantTimeEq;
    let given = crate::auth::bearer(req).unwrap_or("");
    // Same time whatever the key, so it cannot be guessed byte by byte
    // (a length mismatch is told at once, which gives away only the length).
    given.as_bytes().ct_eq(key.as_bytes()).into()
}

/// The service or admin key, or `401`.
pub(super) fn require_service(req: &HttpRequest, state: &AppState) -> Result<(), ApiError> {
    if is_service(req, state) {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::UNAUTHORIZED,
        ErrorCode::Unauthorized,
        "this read needs Authorization: Bearer <service key> (or the admin key)",
    ))
}

pub(super) fn require_admin(req: &HttpRequest, state: &AppState) -> Result<(), ApiError> {
    if state.admin_key.is_none() {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            ErrorCode::Forbidden,
            "the admin API is off: start the server with --admin-key",
        ));
    }
    if !is_admin(req, state) {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            ErrorCode::Unauthorized,
            "the admin API needs Authorization: Bearer <admin key>",
        ));
    }
    Ok(())
}

/// `PUT /api/users/{user}/contacts` (admin): replaces the users who count
/// as `user`'s contacts for its privacy settings.
#[utoipa::path(put, path = "/api/users/{user}/contacts", tag = "admin",
    params(("user" = String, Path, description = "The user id")),
    request_body = Contacts,
    responses(
        (status = 200, description = "The contacts now, sorted", body = Contacts),
        (status = 401, description = "No admin key", body = ProtocolError),
        (status = 403, description = "The admin API is off", body = ProtocolError),
        (status = 413, description = "More than 1,000 contacts", body = ProtocolError),
    ),
    security(("bearer" = [])))]
pub(crate) async fn put_contacts(
    req: HttpRequest,
    user: web::Path<String>,
    body: web::Json<Contacts>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    require_admin(&req, &state)?;
    let user = user.into_inner();
    ids::validate("user", &user)?;
    let mut contacts = body.into_inner().contacts;
    if contacts.len() > MAX_CONTACTS {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::TooManyUsers,
            format!("at most {MAX_CONTACTS} contacts"),
        ));
    }
    for c in &contacts {
        ids::validate("user", c)?;
    }
    contacts.sort();
    contacts.dedup();
    state.node.store.set_contacts(&user, &contacts).await?;
    Ok(HttpResponse::Ok().json(Contacts { contacts }))
}

/// `GET /api/users/{user}/contacts` (admin).
#[utoipa::path(get, path = "/api/users/{user}/contacts", tag = "admin",
    params(("user" = String, Path, description = "The user id")),
    responses(
        (status = 200, description = "The contacts, sorted", body = Contacts),
        (status = 401, description = "No admin key", body = ProtocolError),
        (status = 403, description = "The admin API is off", body = ProtocolError),
    ),
    security(("bearer" = [])))]
pub(crate) async fn get_contacts(
    req: HttpRequest,
    user: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    require_admin(&req, &state)?;
    let user = user.into_inner();
    ids::validate("user", &user)?;
    let contacts = state.node.store.contacts(&user).await?;
    Ok(HttpResponse::Ok().json(Contacts { contacts }))
}
