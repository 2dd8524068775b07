//! The HTTP side of a node: the WebSocket upgrade, the read API, users'
//! settings and the admin API, HTTP heartbeat devices and statuses
//! (`devices/`), operations, the OpenAPI document and the
//! demo page, each in a file of its own; [`routes`] puts them on the
//! listeners. Who may call a handler (the keys, a user's token, the
//! charge of a read) is `access`'s to say, one module that every handler
//! asks and that imports none.

mod access;
mod devices;
mod events;
pub mod openapi;
mod ops;
mod reads;
mod room_members;
mod rooms;
pub mod routes;
mod seen;
pub mod static_files;
mod upgrade;
mod users;

pub(crate) use access::Payer;
pub use events::EVENTS_MAX_LIMIT;
pub use rooms::ROOM_PAGE_MAX_LIMIT;
pub use routes::{internal_routes, public_routes, route_table, routes, Router};

use std::sync::Arc;

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse, ResponseError};

use crate::auth::{Auth, DevHosts, Origins};
use crate::config::Config;
use crate::ids;
use crate::node::Node;
use crate::protocol::{ErrorCode, ProtocolError};
use crate::store::StoreError;

/// Default page size of `GET /api/online`.
const ONLINE_DEFAULT_LIMIT: usize = 50;
/// Largest page size of `GET /api/online`.
pub const ONLINE_MAX_LIMIT: usize = 1_000;
/// Most contacts one user may have.
pub const MAX_CONTACTS: usize = 1_000;
/// Largest JSON body accepted by `POST /api/presence/query`: room for
/// [`MAX_QUERY_USERS`] ids of the longest length, and then some.
pub const MAX_QUERY_BODY: usize = 256 * 1024;
/// Longest `seen_within_ms` of `GET /api/online`: 365 days.
pub const MAX_SEEN_WITHIN_MS: i64 = 365 * 24 * 3_600_000;

/// Shared by every HTTP worker.
pub struct AppState {
    /// The node's store, refresher, registry and settings, which every
    /// session shares too.
    pub node: Arc<Node>,
    /// How clients prove who they are; sessions keep it to verify the
    /// fresh tokens their clients send.
    pub auth: Arc<Auth>,
    /// Browser origins allowed to open a WebSocket.
    pub origins: Origins,
    /// The read budgets of the HTTP API.
    pub budgets: crate::admission::Budgets,
    /// The reads each client has in flight.
    pub in_flight: crate::admission::InFlight,
    /// Bearer key of the admin API (contacts); `None` turns it off.
    pub admin_key: Option<String>,
    /// Bearer key of the service view (truthful reads, nothing else);
    /// `None` turns it off. The admin key reads the same way.
    pub service_key: Option<String>,
    /// `/metrics` on the public listener answers without a key.
    pub public_metrics: bool,
    /// With development auth, the `Host` names `/ws` and `/api/*` answer to.
    pub dev_hosts: Option<DevHosts>,
    /// Redis's state as last checked, for `/healthz` and `/readyz`.
    pub redis_health: Arc<crate::redis::RedisHealth>,
    /// The expiry listener's pulse and the drain, for `/readyz`.
    pub readiness: Arc<crate::readiness::Readiness>,
}

/// An HTTP error: a status and the same `{code, message}` as an error frame.
#[derive(Debug, thiserror::Error)]
#[error("{status}: {error}")]
pub struct ApiError {
    status: StatusCode,
    error: ProtocolError,
    /// When to try again (`Retry-After`, whole seconds, at least 1).
    retry_after: Option<std::time::Duration>,
}

impl ApiError {
    fn new(status: StatusCode, code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            status,
            error: ProtocolError::new(code, message),
            retry_after: None,
        }
    }

    /// The same error, telling the client when to try again.
    fn retry_after(mut self, wait: std::time::Duration) -> Self {
        self.retry_after = Some(wait);
        self
    }
}

impl From<crate::admission::Refused> for ApiError {
    fn from(e: crate::admission::Refused) -> Self {
        use crate::admission::Refused;
        crate::metrics::METRICS.admission.connections_refused.inc();
        let (status, code, wait) = match e {
            Refused::PerAddress(_) => (StatusCode::TOO_MANY_REQUESTS, ErrorCode::RateLimited, 5),
            Refused::PendingAuth(_) => (StatusCode::SERVICE_UNAVAILABLE, ErrorCode::Unavailable, 1),
            Refused::PendingAuthPerAddress(_) => {
                (StatusCode::TOO_MANY_REQUESTS, ErrorCode::RateLimited, 1)
            }
        };
        ApiError::new(status, code, e.to_string()).retry_after(std::time::Duration::from_secs(wait))
    }
}

impl From<ProtocolError> for ApiError {
    /// Input the protocol refuses is a 400 with the same code.
    fn from(error: ProtocolError) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            error,
            retry_after: None,
        }
    }
}

impl From<ids::IdError> for ApiError {
    fn from(e: ids::IdError) -> Self {
        ProtocolError::from(e).into()
    }
}

/// Query-string and path errors: a 400 with `bad_request`.
fn bad_input(err: impl std::fmt::Display) -> actix_web::Error {
    ApiError::new(
        StatusCode::BAD_REQUEST,
        ErrorCode::BadRequest,
        err.to_string(),
    )
    .into()
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        log::warn!("request failed: {e}");
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::Unavailable,
            "presence store unavailable, try again",
        )
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        self.status
    }

    fn error_response(&self) -> HttpResponse {
        let mut res = HttpResponse::build(self.status);
        if let Some(wait) = self.retry_after {
            let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
            res.insert_header(("Retry-After", secs.clamp(1, 3_600).to_string()));
        }
        res.json(&self.error)
    }
}

/// Middleware: with development auth, `/ws` and `/api/*` answer 403 to a
/// `Host` that is not loopback or allowed (DNS rebinding, issue 12).
pub async fn dev_host_guard(
    req: actix_web::dev::ServiceRequest,
    next: actix_web::middleware::Next<impl actix_web::body::MessageBody>,
) -> Result<actix_web::dev::ServiceResponse<impl actix_web::body::MessageBody>, actix_web::Error> {
    let path = req.path();
    if path == "/ws" || path.starts_with("/api/") {
        if let Some(hosts) = req
            .app_data::<web::Data<AppState>>()
            .and_then(|s| s.dev_hosts.as_ref())
        {
            hosts.check(req.request()).map_err(ApiError::from)?;
        }
    }
    next.call(req).await
}

/// The client's address: the peer, or with `--trust-proxy` the one its
/// proxy names ([`crate::proxy`]). The one source of the client's address:
/// logs use it, and so must any per-IP limit.
pub fn client_ip(req: &HttpRequest, config: &Config) -> String {
    client_addr(req, config).map_or_else(|| "unknown".to_string(), |ip| ip.to_string())
}

/// [`client_ip`] as an address; `None` when the peer is unknown.
pub fn client_addr(req: &HttpRequest, config: &Config) -> Option<std::net::IpAddr> {
    config.trust_proxy.client_ip(req.peer_addr(), req.headers())
}
