//! HTTP routes: the WebSocket upgrade, the query API, health and the demo page.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use actix::Addr;
use actix_web::http::{Method, StatusCode};
use actix_web::{web, HttpRequest, HttpResponse, ResponseError};
use actix_web_actors::ws;
use serde::{Deserialize, Serialize};

use crate::auth::{Auth, AuthError, DevHosts, Handshake, Origins};
use crate::config::{Config, MAX_QUERY_USERS};
use crate::conn::ConnHandle;
use crate::ids;
use crate::model::{Record, Status};
use crate::protocol::{parse_privacy, ErrorCode, ProtocolError};
use crate::refresh::Refresher;
use crate::registry::{GetStats, Registry};
use crate::session::{Identity, NodeParts, Session, TokenState};
use crate::store::{Cursor, DeviceInfo, OnlinePage, Reader, Store, StoreError};

/// Default page size of `GET /api/online`.
const ONLINE_DEFAULT_LIMIT: usize = 50;
/// Largest page size of `GET /api/online`.
const ONLINE_MAX_LIMIT: usize = 1_000;
/// Most contacts one user may have.
const MAX_CONTACTS: usize = 1_000;
/// Largest JSON body accepted by `POST /api/presence/query`: room for
/// [`MAX_QUERY_USERS`] ids of the longest length, and then some.
const MAX_QUERY_BODY: usize = 256 * 1024;

/// Shared by every HTTP worker.
pub struct AppState {
    /// Redis state.
    pub store: Store,
    /// Batches the lease refreshes of this node's sessions.
    pub refresher: Refresher,
    /// This node's registry.
    pub registry: Addr<Registry>,
    /// Timings and limits.
    pub config: Arc<Config>,
    /// The same four, shared by every session of this node.
    pub sessions: Arc<NodeParts>,
    /// Next session id on this node.
    pub next_session: AtomicU64,
    /// How clients prove who they are; sessions keep it to verify the
    /// fresh tokens their clients send.
    pub auth: Arc<Auth>,
    /// Browser origins allowed to open a WebSocket.
    pub origins: Origins,
    /// Bearer key of the admin API (contacts); `None` turns it off.
    pub admin_key: Option<String>,
    /// Bearer key of the service view (truthful reads, nothing else);
    /// `None` turns it off. The admin key reads the same way.
    pub service_key: Option<String>,
    /// With development auth, the `Host` names `/ws` and `/api/*` answer to.
    pub dev_hosts: Option<DevHosts>,
    /// Redis's state as last checked, for `/healthz`.
    pub redis_health: Arc<crate::redis::RedisHealth>,
}

/// An HTTP error: a status and the same `{code, message}` as an error frame.
#[derive(Debug, thiserror::Error)]
#[error("{status}: {error}")]
pub struct ApiError {
    status: StatusCode,
    error: ProtocolError,
}

impl ApiError {
    fn new(status: StatusCode, code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            status,
            error: ProtocolError::new(code, message),
        }
    }
}

impl From<ProtocolError> for ApiError {
    /// Input the protocol refuses is a 400 with the same code.
    fn from(error: ProtocolError) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            error,
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
        HttpResponse::build(self.status).json(&self.error)
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
/// (contacts, and privacy settings with the admin key).
pub fn internal_routes(cfg: &mut web::ServiceConfig) {
    extractors(cfg);
    operations(cfg);
    cfg.add(
        Method::PUT,
        "/api/users/{user}/privacy",
        web::route().to(set_privacy),
    );
    not_found(cfg);
}

/// Marks the public listener of a node that serves operations elsewhere.
#[derive(Debug, Clone, Copy)]
struct PublicOnly;

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
        Method::GET,
        "/api/openapi.json",
        web::route().to(crate::openapi::document),
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
}

/// The demo page, the operator's files or nothing: registered last, as it
/// matches any path (`crate::static_files`).
fn static_files(cfg: &mut web::ServiceConfig) {
    cfg.route("/{path:.*}", web::get().to(crate::static_files::serve));
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
    r.add(Method::GET, "/healthz", web::route().to(healthz));
    r.add(Method::GET, "/metrics", web::route().to(metrics));
}

fn not_found(cfg: &mut web::ServiceConfig) {
    cfg.default_service(web::to(|| async {
        ApiError::new(StatusCode::NOT_FOUND, ErrorCode::NotFound, "no such route").error_response()
    }));
}

/// Query string of the WebSocket handshake.
#[derive(Deserialize)]
pub(crate) struct Connect {
    /// The user (development auth; with JWT it must match the token if given).
    user: Option<String>,
    /// The device.
    device: Option<String>,
    /// A JWT (browsers cannot set headers on a WebSocket handshake).
    token: Option<String>,
    /// The status to arrive with if none is stored yet (e.g. `invisible`,
    /// so that a device never shows online before it can say so).
    status: Option<String>,
}

impl From<AuthError> for ApiError {
    fn from(e: AuthError) -> Self {
        let (status, code) = match e {
            AuthError::Missing | AuthError::Invalid(_) => {
                (StatusCode::UNAUTHORIZED, ErrorCode::Unauthorized)
            }
            AuthError::Mismatch { .. } | AuthError::Origin(_) | AuthError::Host(_) => {
                (StatusCode::FORBIDDEN, ErrorCode::Forbidden)
            }
        };
        ApiError::new(status, code, e.to_string())
    }
}

/// `GET /ws?user=&device=` (dev auth) or `GET /ws?device=` (JWT auth: the
/// token in `Sec-WebSocket-Protocol`, `?token=`, `Authorization`, or as the
/// first frame): upgrades to a session. Logs each one with the client's
/// address.
#[utoipa::path(get, path = "/ws", tag = "websocket",
    params(
        ("device" = String, Query, description = "The device id"),
        ("user" = Option<String>, Query, description = "Development auth: the user id"),
        ("token" = Option<String>, Query, description = "JWT auth: the token (prefer Sec-WebSocket-Protocol or the first frame)"),
        ("status" = Option<String>, Query, description = "Status to arrive with if none is stored: online, away, busy or invisible"),
    ),
    responses(
        (status = 101, description = "Upgraded: the frames are in docs/events.md"),
        (status = 400, description = "Missing or invalid ids", body = ProtocolError),
        (status = 401, description = "Missing or invalid token", body = ProtocolError),
        (status = 403, description = "Refused origin or host, or token for another user", body = ProtocolError),
    ))]
pub(crate) async fn websocket(
    req: HttpRequest,
    stream: web::Payload,
    query: web::Query<Connect>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, actix_web::Error> {
    let ip = client_ip(&req, &state.config);
    let opened = open_session(&req, stream, query.into_inner(), &state, &ip).await;
    if let Err(e) = &opened {
        log::info!("websocket from {ip} refused: {e}");
    }
    opened
}

/// The upgrade proper, for [`websocket`].
async fn open_session(
    req: &HttpRequest,
    stream: web::Payload,
    query: Connect,
    state: &AppState,
    ip: &str,
) -> Result<HttpResponse, actix_web::Error> {
    let req = req.clone();
    state.origins.check(&req).map_err(ApiError::from)?;
    let protocol = match *state.auth {
        Auth::Jwt(_) => crate::auth::protocol_token(&req),
        Auth::Dev => None,
    };
    let handshake = state
        .auth
        .handshake(
            &req,
            protocol.as_ref(),
            query.token.as_deref(),
            query.user.as_deref(),
        )
        .await
        .map_err(ApiError::from)?;
    let (Some(handshake), Some(device)) = (handshake, query.device) else {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            ErrorCode::BadRequest,
            "connect as /ws?user=<user>&device=<device> (or, with JWT auth, /ws?device=<device>)",
        )
        .into());
    };
    ids::validate("device", &device).map_err(ApiError::from)?;
    if let Some(user) = &query.user {
        ids::validate("user", user).map_err(ApiError::from)?;
    }
    let (user, token) = match handshake {
        Handshake::User { user, exp } => {
            ids::validate("user", &user).map_err(ApiError::from)?;
            (user, exp.map(TokenState::Valid))
        }
        Handshake::FirstFrame => (
            String::new(),
            Some(TokenState::Awaited {
                asked: query.user.clone(),
            }),
        ),
    };
    let status = match query.status.as_deref() {
        None | Some("") => None,
        Some(s) => Some(Status::parse(s).map_err(|e| ApiError::from(ProtocolError::from(e)))?),
    };
    crate::metrics::METRICS.sessions_opened.inc();
    let id = state.next_session.fetch_add(1, Ordering::Relaxed);
    let owner = state.store.lease_value();
    if user.is_empty() {
        log::info!("device {device}: websocket from {ip}, awaiting its auth frame");
    } else {
        log::info!("{user}/{device}: websocket from {ip}");
    }
    let who = Identity {
        id,
        user,
        device,
        owner,
        status,
        token: token.map(|t| (state.auth.clone(), t)),
    };
    let session = Session::new(
        who,
        state.sessions.clone(),
        req.conn_data::<ConnHandle>().cloned(),
    );
    let answer = protocol.as_ref().map(|p| p.answer.as_str());
    let protocols: Vec<&str> = answer.into_iter().collect();
    ws::WsResponseBuilder::new(session, &req, stream)
        .frame_size(state.config.max_frame_bytes)
        .protocols(&protocols)
        .start()
}

/// Who reads: `?viewer=` in dev mode, a token with JWT.
#[derive(Deserialize)]
pub(crate) struct As {
    viewer: Option<String>,
    token: Option<String>,
}

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

async fn read_as(req: &HttpRequest, state: &AppState, who: &As) -> Result<ReadAs, ApiError> {
    if is_service(req, state) {
        return Ok(ReadAs::Service);
    }
    let viewer = state
        .auth
        .viewer(req, who.token.as_deref(), who.viewer.as_deref())
        .await?;
    if let Some(v) = &viewer {
        ids::validate("user", v)?;
    }
    Ok(ReadAs::Viewer(viewer))
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
    let reader = read_as(&req, &state, &who).await?;
    let record = state
        .store
        .records_as(
            std::slice::from_ref(&user),
            reader.reader(),
            state.config.contacts_only,
        )
        .await?
        .remove(0);
    // Devices only of a user the viewer may see online.
    let devices = if record.devices > 0 {
        state.store.devices(&user).await?
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
    let reader = read_as(&req, &state, &who).await?;
    let presence = state
        .store
        .records_as(&users, reader.reader(), state.config.contacts_only)
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
    #[serde(flatten)]
    who: As,
}

/// `GET /api/online?limit=&cursor=`: users the viewer may see online now,
/// most recently active first.
#[utoipa::path(get, path = "/api/online", tag = "read",
    params(
        ("limit" = Option<usize>, Query, description = "Page size, 1 to 1000 (default 50)"),
        ("cursor" = Option<String>, Query, description = "next_cursor of the previous page"),
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
        Some(c) => Some(Cursor::decode(c, state.store.buckets()).ok_or_else(|| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                ErrorCode::BadRequest,
                "cursor is not one this server handed out",
            )
        })?),
    };
    let reader = read_as(&req, &state, &query.who).await?;
    let page = state
        .store
        .online_as(
            limit,
            cursor.as_ref(),
            reader.reader(),
            state.config.contacts_only,
        )
        .await?;
    Ok(HttpResponse::Ok().json(OnlineResult {
        view: reader.view(),
        page,
    }))
}

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
    if !is_admin(&req, &state) {
        let acting = state
            .auth
            .viewer(&req, who.token.as_deref(), Some(&user))
            .await?;
        if acting.as_deref() != Some(user.as_str()) {
            return Err(AuthError::Mismatch {
                token: acting.unwrap_or_default(),
                asked: user,
            }
            .into());
        }
    }
    let (online, last_seen) = parse_privacy(body.online.as_deref(), body.last_seen.as_deref())?;
    state.store.set_privacy(&user, online, last_seen).await?;
    Ok(HttpResponse::NoContent().finish())
}

/// Body of `PUT /api/users/{user}/contacts`.
#[derive(Deserialize, Serialize, utoipa::ToSchema)]
pub(crate) struct Contacts {
    contacts: Vec<String>,
}

/// True when the request carries the admin key.
fn is_admin(req: &HttpRequest, state: &AppState) -> bool {
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
fn is_service(req: &HttpRequest, state: &AppState) -> bool {
    is_admin(req, state)
        || state
            .service_key
            .as_deref()
            .is_some_and(|key| bearer_is(req, key))
}

/// True when the bearer token is `key`.
fn bearer_is(req: &HttpRequest, key: &str) -> bool {
    let given = crate::auth::bearer(req).unwrap_or("");
    // Same time whatever the key, so it cannot be guessed byte by byte.
    given.len() == key.len()
        && given
            .bytes()
            .zip(key.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

fn require_admin(req: &HttpRequest, state: &AppState) -> Result<(), ApiError> {
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
    state.store.set_contacts(&user, &contacts).await?;
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
    let contacts = state.store.contacts(&user).await?;
    Ok(HttpResponse::Ok().json(Contacts { contacts }))
}

/// `GET /healthz`: 200 when the process is up and Redis answered the last
/// health check (at most about a second ago), else 503. Answers from that
/// cached state, so it is as fast with Redis down as up.
#[utoipa::path(get, path = "/healthz", tag = "operations",
    responses(
        (status = 200, description = "Up, Redis reachable", body = Object),
        (status = 503, description = "Redis unreachable", body = Object),
    ))]
pub(crate) async fn healthz(state: web::Data<AppState>) -> HttpResponse {
    let stats = state.registry.send(GetStats).await.unwrap_or_default();
    let redis = state.redis_health.report();
    if redis.up {
        HttpResponse::Ok().json(serde_json::json!({
            "status": "ok", "node": state.config.node_id, "redis": "up", "registry": stats,
            "counters": crate::metrics::METRICS.health_counters(),
            "redis_details": redis.details,
        }))
    } else {
        HttpResponse::ServiceUnavailable().json(serde_json::json!({
            "status": "unavailable", "node": state.config.node_id, "redis": "down",
            "error": redis.details["error"], "redis_details": redis.details,
        }))
    }
}

/// `GET /metrics`: Prometheus text exposition; answers even when Redis does not.
#[utoipa::path(get, path = "/metrics", tag = "operations",
    responses((status = 200, description = "Prometheus text exposition", content_type = "text/plain", body = String)))]
pub(crate) async fn metrics(state: web::Data<AppState>) -> HttpResponse {
    let stats = state.registry.send(GetStats).await.unwrap_or_default();
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(crate::metrics::METRICS.render(stats.into()))
}

/// `GET /api/info`: what a client needs to know before it connects (the
/// demo page asks it whether to show a token field).
#[utoipa::path(get, path = "/api/info", tag = "presence",
    responses((status = 200, description = "The server, its version, its auth mode (dev or jwt) and heartbeat", body = Object)))]
pub(crate) async fn info(state: web::Data<AppState>) -> HttpResponse {
    // Public facts: a page served from elsewhere (`?server=`) may read them.
    HttpResponse::Ok()
        .insert_header(("access-control-allow-origin", "*"))
        .json(serde_json::json!({
            "server": "presence-server",
            "version": env!("CARGO_PKG_VERSION"),
            "auth": match *state.auth { Auth::Dev => "dev", Auth::Jwt(_) => "jwt" },
            "heartbeat_ms": state.config.heartbeat.as_millis() as u64,
        }))
}

/// The client's address: the peer, or with `--trust-proxy` the one its
/// proxy names ([`crate::proxy`]). The one source of the client's address:
/// logs use it, and so must any per-IP limit.
pub fn client_ip(req: &HttpRequest, config: &Config) -> String {
    config
        .trust_proxy
        .client_ip(req.peer_addr(), req.headers())
        .map_or_else(|| "unknown".to_string(), |ip| ip.to_string())
}
