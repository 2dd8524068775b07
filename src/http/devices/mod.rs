//! Presence without a WebSocket: HTTP heartbeat devices
//! (`POST /api/users/{user}/devices/{device}/heartbeat`, `DELETE
//! /api/users/{user}/devices/{device}`) and statuses set over HTTP
//! (`PUT /api/users/{user}/status`, in `status.rs`).
//!
//! An HTTP device is a WebSocket device without the socket: the same
//! lease, counter, transitions and webhooks (`arrive.lua`, `depart.lua`),
//! and the same expiry when its heartbeats stop. Each heartbeat claims the
//! lease as a new connection would, so it takes the device id over from a
//! socket that held it, whose node is told to close it with 4001 at once
//! (`store/devices.rs`).

mod status;

pub(crate) use status::*;

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use serde::{Deserialize, Serialize};

use super::access::require_self_or_admin;
use super::*;
use crate::model::DeviceKind;
use crate::protocol::ErrorCode;
use crate::store::{Arrival, ArriveMode};

/// Query string of the device routes.
#[derive(Deserialize)]
pub(crate) struct DeviceQuery {
    /// The device's kind (heartbeat only).
    kind: Option<String>,
    /// JWT auth: the user's token, instead of `Authorization: Bearer`.
    token: Option<String>,
}

/// Answer of a heartbeat: how long the lease lasts, and how often to
/// heartbeat.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct HeartbeatAnswer {
    /// The lease lasts this long after this heartbeat, ms: the device goes
    /// offline within this plus 1 s of its last heartbeat.
    #[schema(example = 45000)]
    ttl_ms: u64,
    /// Send the next heartbeat within this many ms (a third of the TTL:
    /// one or two heartbeats may be lost without the device going offline).
    #[schema(example = 15000)]
    heartbeat_ms: u64,
}

/// The user and device of a device route, checked.
fn ids_of(path: (String, String)) -> Result<(String, String), ApiError> {
    let (user, device) = path;
    ids::validate("user", &user)?;
    ids::validate("device", &device)?;
    Ok((user, device))
}

/// `POST /api/users/{user}/devices/{device}/heartbeat[?kind=]`: claims or
/// refreshes the device's lease.
#[utoipa::path(post, path = "/api/users/{user}/devices/{device}/heartbeat", tag = "devices",
    params(("user" = String, Path, description = "The user id"),
        ("device" = String, Path, description = "The device id"),
        ("kind" = Option<String>, Query, description = "web, desktop, mobile, tablet, bot or other (default)"),
        ("token" = Option<String>, Query, description = "JWT auth: the user's token, instead of Authorization: Bearer")),
    responses(
        (status = 200, description = "The lease is held; heartbeat again within heartbeat_ms", body = HeartbeatAnswer),
        (status = 400, description = "Invalid id or unknown kind", body = ProtocolError),
        (status = 401, description = "JWT auth: missing or invalid token", body = ProtocolError),
        (status = 403, description = "Another user's token", body = ProtocolError),
        (status = 409, description = "The user has the most devices allowed", body = ProtocolError),
        (status = 503, description = "Redis unavailable", body = ProtocolError),
    ),
    security((), ("bearer" = [])))]
pub(crate) async fn heartbeat(
    req: HttpRequest,
    path: web::Path<(String, String)>,
    query: web::Query<DeviceQuery>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let (user, device) = ids_of(path.into_inner())?;
    let kind = DeviceKind::parse(query.kind.as_deref())
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, ErrorCode::BadRequest, e))?;
    require_self_or_admin(&req, &state, &user, query.token.as_deref()).await?;
    let store = &state.node.store;
    // No socket holds it: a later takeover of it has nobody to tell.
    let owner = store.http_lease_value();
    let arrival = store
        .arrive(
            &user,
            &device,
            &owner,
            ArriveMode::Connect,
            None,
            Some(kind),
        )
        .await?;
    match arrival {
        Arrival::Held { took_over, .. } => {
            if let Some(socket) = took_over {
                // The lease is ours either way; a socket that missed the
                // word finds it replaced at its next refresh.
                if let Err(e) = store.tell_taken(&user, &device, socket).await {
                    log::warn!("{user}/{device}: taken over, but telling its socket failed: {e}");
                }
            }
            crate::metrics::METRICS.http_heartbeats.inc();
            let config = &state.node.config;
            Ok(HttpResponse::Ok().json(HeartbeatAnswer {
                ttl_ms: store.ttl_ms(),
                heartbeat_ms: config.heartbeat.as_millis() as u64,
            }))
        }
        Arrival::TooManyDevices => Err(ApiError::new(
            StatusCode::CONFLICT,
            ErrorCode::TooManyDevices,
            "the user has the most devices allowed",
        )),
        // A connect claim takes the lease whoever held it.
        Arrival::Replaced => Err(ApiError::new(
            StatusCode::CONFLICT,
            ErrorCode::Unavailable,
            "the device was claimed meanwhile; try again",
        )),
    }
}

/// `DELETE /api/users/{user}/devices/{device}`: the device leaves at once,
/// its rooms too (a socket holding the id is closed with 4001, on whichever
/// node it is).
#[utoipa::path(delete, path = "/api/users/{user}/devices/{device}", tag = "devices",
    params(("user" = String, Path, description = "The user id"),
        ("device" = String, Path, description = "The device id"),
        ("token" = Option<String>, Query, description = "JWT auth: the user's token, instead of Authorization: Bearer")),
    responses(
        (status = 204, description = "The device is gone (or was)"),
        (status = 400, description = "Invalid id", body = ProtocolError),
        (status = 401, description = "JWT auth: missing or invalid token", body = ProtocolError),
        (status = 403, description = "Another user's token", body = ProtocolError),
        (status = 503, description = "Redis unavailable", body = ProtocolError),
    ),
    security((), ("bearer" = [])))]
pub(crate) async fn leave(
    req: HttpRequest,
    path: web::Path<(String, String)>,
    query: web::Query<DeviceQuery>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let (user, device) = ids_of(path.into_inner())?;
    require_self_or_admin(&req, &state, &user, query.token.as_deref()).await?;
    state.node.store.take_device(&user, &device).await?;
    Ok(HttpResponse::NoContent().finish())
}
