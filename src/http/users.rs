//! A user's own settings (`PUT /api/users/{user}/privacy`) and the admin
//! API (contacts); who may call them is [`super::access`]'s to say.

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use serde::{Deserialize, Serialize};

use super::access::{require_admin, require_self_or_admin, As};
use super::*;
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

/// Body of `PUT /api/users/{user}/contacts`.
#[derive(Deserialize, Serialize, utoipa::ToSchema)]
pub(crate) struct Contacts {
    contacts: Vec<String>,
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
