//! HTTP routes: the WebSocket upgrade, the query API, health and the demo page.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use actix::Addr;
use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse, ResponseError};
use actix_web_actors::ws;
use serde::{Deserialize, Serialize};

use crate::config::{Config, MAX_QUERY_USERS};
use crate::conn::ConnHandle;
use crate::ids;
use crate::protocol::{ErrorCode, ProtocolError, Record};
use crate::registry::{GetStats, Registry};
use crate::session::{Identity, Session};
use crate::store::{now_ms, Cursor, DeviceInfo, LeaseOwner, Store, StoreError};

/// Default page size of `GET /api/online`.
const ONLINE_DEFAULT_LIMIT: usize = 50;
/// Largest page size of `GET /api/online`.
const ONLINE_MAX_LIMIT: usize = 1_000;
/// Largest JSON body accepted by `POST /api/presence/query`: room for
/// [`MAX_QUERY_USERS`] ids of the longest length, and then some.
const MAX_QUERY_BODY: usize = 128 * 1024;

/// Shared by every HTTP worker.
pub struct AppState {
    /// Redis state.
    pub store: Store,
    /// This node's registry.
    pub registry: Addr<Registry>,
    /// Timings and limits.
    pub config: Arc<Config>,
    /// Next session id on this node.
    pub next_session: AtomicU64,
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

impl From<ids::IdError> for ApiError {
    fn from(e: ids::IdError) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            error: e.into(),
        }
    }
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

/// Registers every route.
pub fn routes(cfg: &mut web::ServiceConfig) {
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
    .app_data(web::QueryConfig::default().error_handler(|err, _| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            ErrorCode::BadRequest,
            err.to_string(),
        )
        .into()
    }))
    .app_data(web::PathConfig::default().error_handler(|err, _| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            ErrorCode::BadRequest,
            err.to_string(),
        )
        .into()
    }))
    .route("/ws", web::get().to(websocket))
    .route("/api/presence/query", web::post().to(query))
    .route("/api/presence/{user}", web::get().to(presence))
    .route("/api/online", web::get().to(online))
    .route("/healthz", web::get().to(healthz))
    .route("/", web::get().to(index))
    .route("/presence-client.js", web::get().to(client_js))
    .default_service(web::to(|| async {
        ApiError::new(StatusCode::NOT_FOUND, ErrorCode::NotFound, "no such route").error_response()
    }));
}

/// Query string of the WebSocket handshake (development auth).
#[derive(Deserialize)]
struct Connect {
    user: Option<String>,
    device: Option<String>,
}

/// `GET /ws?user=&device=`: upgrades to a session.
async fn websocket(
    req: HttpRequest,
    stream: web::Payload,
    query: web::Query<Connect>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, actix_web::Error> {
    let query = query.into_inner();
    let (Some(user), Some(device)) = (query.user, query.device) else {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            ErrorCode::BadRequest,
            "connect as /ws?user=<user>&device=<device>",
        )
        .into());
    };
    ids::validate("user", &user).map_err(ApiError::from)?;
    ids::validate("device", &device).map_err(ApiError::from)?;
    let id = state.next_session.fetch_add(1, Ordering::Relaxed);
    let owner = LeaseOwner::format(&state.config.node_id, &id.to_string(), now_ms());
    let who = Identity {
        id,
        user,
        device,
        owner,
    };
    let session = Session::new(
        who,
        state.store.clone(),
        state.registry.clone(),
        state.config.clone(),
        req.conn_data::<ConnHandle>().cloned(),
    );
    ws::WsResponseBuilder::new(session, &req, stream)
        .frame_size(state.config.max_frame_bytes)
        .start()
}

/// `GET /api/presence/{user}`: the record with a device list.
async fn presence(
    user: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let user = user.into_inner();
    ids::validate("user", &user)?;
    let records = state.store.records(std::slice::from_ref(&user)).await?;
    let devices = state.store.devices(&user).await?;
    #[derive(Serialize)]
    struct Body<'a> {
        #[serde(flatten)]
        record: &'a Record,
        device_list: Vec<DeviceInfo>,
    }
    Ok(HttpResponse::Ok().json(Body {
        record: &records[0].0,
        device_list: devices,
    }))
}

/// Body of `POST /api/presence/query`.
#[derive(Deserialize)]
struct Query {
    users: Vec<String>,
}

/// `POST /api/presence/query`: records of up to 1,000 users, in request order.
async fn query(
    body: web::Json<Query>,
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
    #[derive(Serialize)]
    struct Body {
        presence: Vec<Record>,
    }
    let presence = state
        .store
        .records(&users)
        .await?
        .into_iter()
        .map(|(r, _)| r)
        .collect();
    Ok(HttpResponse::Ok().json(Body { presence }))
}

/// Query string of `GET /api/online`.
#[derive(Deserialize)]
struct OnlineQuery {
    limit: Option<usize>,
    cursor: Option<String>,
}

/// `GET /api/online?limit=&cursor=`: users online now, most recently active first.
async fn online(
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
        Some(c) => Some(Cursor::decode(c).ok_or_else(|| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                ErrorCode::BadRequest,
                "cursor is not one this server handed out",
            )
        })?),
    };
    let page = state.store.online(limit, cursor.as_ref()).await?;
    Ok(HttpResponse::Ok().json(page))
}

/// `GET /healthz`: 200 when the process is up and Redis answers, else 503.
async fn healthz(state: web::Data<AppState>) -> HttpResponse {
    let stats = state.registry.send(GetStats).await.unwrap_or_default();
    match state.store.ping().await {
        Ok(()) => HttpResponse::Ok().json(serde_json::json!({
            "status": "ok", "node": state.config.node_id, "redis": "up", "registry": stats,
            "counters": crate::stats::STATS.to_json(),
        })),
        Err(e) => HttpResponse::ServiceUnavailable().json(serde_json::json!({
            "status": "unavailable", "node": state.config.node_id, "redis": "down",
            "error": e.to_string(),
        })),
    }
}

/// `GET /`: the demo page.
async fn index() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .body(include_str!("../static/index.html"))
}

/// `GET /presence-client.js`: the JavaScript client used by the demo page.
async fn client_js() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/javascript; charset=utf-8")
        .body(include_str!("../static/presence-client.js"))
}
