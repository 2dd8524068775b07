//! The routes of each listener, registered through one [`Router`] so that
//! the list the OpenAPI test checks ([`route_table`]) is the server's own.

use actix_web::http::{Method, StatusCode};
use actix_web::{web, ResponseError};

use super::access::{Internal, PublicOnly};
use super::ops::*;
use super::reads::*;
use super::upgrade::*;
use super::users::*;
use super::*;
use crate::protocol::ErrorCode;

/// Where routes go: the actix configuration of a listener, or the list of
/// [`route_table`]. Every route is registered through it, so that the list
/// the OpenAPI test checks is the server's own.
pub trait Router {
    /// Registers `route` for `method` on `path`.
    fn add(&mut self, method: Method, path: &'static str, route: actix_web::Route);
}

impl Router for web::ServiceConfig {
    fn add(&mut self, method: Method, path: &'static str, route: actix_web::Route) {
        self.route(path, route.method(method));
    }
}

impl Router for Vec<(Method, &'static str)> {
    fn add(&mut self, method: Method, path: &'static str, _: actix_web::Route) {
        self.push((method, path));
    }
}

/// Every route a node serves (one listener, no `--internal-listen`), as
/// (method, path) with actix's `{param}` placeholders.
pub fn route_table() -> Vec<(Method, &'static str)> {
    let mut table = Vec::new();
    api(&mut table);
    operations(&mut table);
    table
}

/// Registers every route on one listener (no `--internal-listen`).
pub fn routes(cfg: &mut web::ServiceConfig) {
    extractors(cfg);
    api(cfg);
    operations(cfg);
    static_files(cfg);
    not_found(cfg);
}

/// The public listener when `--internal-listen` is set: the WebSocket, the
/// read API and the demo page; metrics, health and the admin API are 404
/// and the admin key is not honoured.
pub fn public_routes(cfg: &mut web::ServiceConfig) {
    cfg.app_data(PublicOnly);
    extractors(cfg);
    api(cfg);
    static_files(cfg);
    not_found(cfg);
}

/// The `--internal-listen` listener: metrics, health and the admin API
/// (contacts, and privacy settings, statuses and HTTP devices with the
/// admin key).
pub fn internal_routes(cfg: &mut web::ServiceConfig) {
    cfg.app_data(Internal);
    extractors(cfg);
    operations(cfg);
    cfg.add(
        Method::PUT,
        "/api/users/{user}/privacy",
        web::route().to(set_privacy),
    );
    cfg.add(
        Method::PUT,
        "/api/users/{user}/status",
        web::route().to(super::devices::set_status),
    );
    cfg.add(
        Method::POST,
        "/api/users/{user}/devices/{device}/heartbeat",
        web::route().to(super::devices::heartbeat),
    );
    cfg.add(
        Method::DELETE,
        "/api/users/{user}/devices/{device}",
        web::route().to(super::devices::leave),
    );
    not_found(cfg);
}

/// Error mapping of the body, query and path extractors.
fn extractors(cfg: &mut web::ServiceConfig) {
    cfg.app_data(
        web::JsonConfig::default()
            .limit(MAX_QUERY_BODY)
            .error_handler(|err, _| {
                let status = match &err {
                    actix_web::error::JsonPayloadError::Overflow { .. }
                    | actix_web::error::JsonPayloadError::OverflowKnownLength { .. } => {
                        StatusCode::PAYLOAD_TOO_LARGE
                    }
                    _ => StatusCode::BAD_REQUEST,
                };
                ApiError::new(status, ErrorCode::BadRequest, err.to_string()).into()
            }),
    )
    .app_data(web::QueryConfig::default().error_handler(|err, _| bad_input(err)))
    .app_data(web::PathConfig::default().error_handler(|err, _| bad_input(err)));
}

/// What clients use: the WebSocket, the read API, privacy, the API's
/// description and `/api/info`. The demo page is served apart
/// ([`static_files`]): it is not API, and `--no-demo` turns it off.
fn api(r: &mut impl Router) {
    r.add(Method::GET, "/ws", web::route().to(websocket));
    reads(r);
    r.add(
        Method::PUT,
        "/api/users/{user}/privacy",
        web::route().to(set_privacy),
    );
    r.add(
        Method::PUT,
        "/api/users/{user}/status",
        web::route().to(super::devices::set_status),
    );
    r.add(
        Method::POST,
        "/api/users/{user}/devices/{device}/heartbeat",
        web::route().to(super::devices::heartbeat),
    );
    r.add(
        Method::DELETE,
        "/api/users/{user}/devices/{device}",
        web::route().to(super::devices::leave),
    );
    r.add(
        Method::GET,
        "/api/openapi.json",
        web::route().to(super::openapi::document),
    );
    r.add(Method::GET, "/api/info", web::route().to(info));
}

/// The read API.
fn reads(r: &mut impl Router) {
    r.add(Method::POST, "/api/presence/query", web::route().to(query));
    r.add(
        Method::GET,
        "/api/presence/{user}",
        web::route().to(presence),
    );
    r.add(Method::GET, "/api/online", web::route().to(online));
    r.add(
        Method::GET,
        "/api/rooms/{room}",
        web::route().to(super::rooms::room),
    );
    r.add(
        Method::POST,
        "/api/rooms/query",
        web::route().to(super::rooms::rooms_query),
    );
    r.add(
        Method::GET,
        "/api/users/{user}/rooms",
        web::route().to(super::rooms::user_rooms),
    );
}

/// The demo page, the operator's files or nothing: registered last, as it
/// matches any path (`crate::static_files`).
fn static_files(cfg: &mut web::ServiceConfig) {
    cfg.route("/{path:.*}", web::get().to(super::static_files::serve));
}

/// What operators use: the admin API, health and metrics.
fn operations(r: &mut impl Router) {
    r.add(
        Method::PUT,
        "/api/users/{user}/contacts",
        web::route().to(put_contacts),
    );
    r.add(
        Method::GET,
        "/api/users/{user}/contacts",
        web::route().to(get_contacts),
    );
    r.add(
        Method::PUT,
        "/api/rooms/{room}/members",
        web::route().to(super::room_members::put_members),
    );
    r.add(
        Method::GET,
        "/api/rooms/{room}/members",
        web::route().to(super::room_members::list_members),
    );
    r.add(
        Method::GET,
        "/api/events",
        web::route().to(super::events::events),
    );
    r.add(
        Method::POST,
        "/api/rooms/{room}/members/{user}",
        web::route().to(super::room_members::add_member),
    );
    r.add(
        Method::DELETE,
        "/api/rooms/{room}/members/{user}",
        web::route().to(super::room_members::remove_member),
    );
    r.add(Method::GET, "/healthz", web::route().to(healthz));
    r.add(Method::GET, "/livez", web::route().to(super::ops::livez));
    r.add(Method::GET, "/readyz", web::route().to(super::ops::readyz));
    r.add(Method::GET, "/metrics", web::route().to(metrics));
}

fn not_found(cfg: &mut web::ServiceConfig) {
    cfg.default_service(web::to(|| async {
        ApiError::new(StatusCode::NOT_FOUND, ErrorCode::NotFound, "no such route").error_response()
    }));
}
