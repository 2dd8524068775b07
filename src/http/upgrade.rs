//! `GET /ws`: the WebSocket upgrade. Checks the origin and the handshake's
//! credentials, then starts a [`Session`] actor for the device.

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use actix_http::ws::Codec;

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use actix_web_actors::ws;
use serde::Deserialize;

use super::*;
use crate::auth::{Auth, AuthError, Handshake};
use crate::conn::ConnHandle;
use crate::ids;
use crate::model::{DeviceKind, Status};
use crate::protocol::{ErrorCode, ProtocolError};
use crate::session::{Identity, PreAuth, Refused, Session, TokenState};

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
    /// The device's kind: web, desktop, mobile, tablet, bot or other.
    kind: Option<String>,
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
        ("kind" = Option<String>, Query, description = "The device's kind: web, desktop, mobile, tablet, bot or other (default)"),
    ),
    responses(
        (status = 101, description = "Upgraded: the frames are in docs/events.md"),
        (status = 400, description = "Missing or invalid ids, or an unknown kind", body = ProtocolError),
        (status = 401, description = "Missing or invalid token", body = ProtocolError),
        (status = 403, description = "Refused host, or token for another user (a refused origin is upgraded, then closed with 1008 and a reason naming --allowed-origins)", body = ProtocolError),
        (status = 429, description = "The client's address holds the most connections allowed (--max-connections-per-ip)", body = ProtocolError),
        (status = 503, description = "Too many connections awaiting their auth frame (--max-pending-auth); Retry-After says when to try again", body = ProtocolError),
    ))]
pub(crate) async fn websocket(
    req: HttpRequest,
    stream: web::Payload,
    query: web::Query<Connect>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, actix_web::Error> {
    let ip = client_ip(&req, &state.node.config);
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
    if let Err(refused) = state.origins.check(&req) {
        // Upgraded, then closed with 1008 and the reason: a browser shows a
        // 403 as a bare 1006, and its client would retry it for ever.
        log::info!("websocket from {ip} refused: {refused}");
        return ws::WsResponseBuilder::new(Refused::new(refused.to_string()), &req, stream).start();
    }
    // Before any work: a refused connection costs nothing.
    let admitted = match client_addr(&req, &state.node.config) {
        Some(ip) => Some(state.node.conns.admit(ip).map_err(ApiError::from)?),
        None => None,
    };
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
    let kind = DeviceKind::parse(query.kind.as_deref())
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, ErrorCode::BadRequest, e))?;
    if let Some(user) = &query.user {
        ids::validate("user", user).map_err(ApiError::from)?;
    }
    let (user, token, rooms) = match handshake {
        Handshake::User { user, exp, rooms } => {
            ids::validate("user", &user).map_err(ApiError::from)?;
            (user, exp.map(TokenState::Valid), rooms)
        }
        Handshake::FirstFrame => (
            String::new(),
            Some(TokenState::Awaited {
                asked: query.user.clone(),
            }),
            Vec::new(),
        ),
    };
    let (pre_auth, codec) = pre_auth(token.as_ref(), state, client_addr(&req, &state.node.config))?;
    let status = match query.status.as_deref() {
        None | Some("") => None,
        Some(s) => Some(Status::parse(s).map_err(|e| ApiError::from(ProtocolError::from(e)))?),
    };
    crate::metrics::METRICS.sessions_opened.inc();
    // The lease value is unique on the node, so it is the session's id
    // too: a node told that a lease was taken from one of its sockets finds
    // the session by the value alone (`store/devices.rs`).
    let id = state.node.store.lease_value();
    let owner = id.to_string();
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
        kind,
        token: token.map(|t| (state.auth.clone(), t)),
        rooms,
        admitted,
        pre_auth,
    };
    let session = Session::new(
        who,
        state.node.clone(),
        req.conn_data::<ConnHandle>().cloned(),
    );
    let answer = protocol.as_ref().map(|p| p.answer.as_str());
    let protocols: Vec<&str> = answer.into_iter().collect();
    ws::WsResponseBuilder::new(session, &req, stream)
        .codec(codec)
        .protocols(&protocols)
        .start()
}

/// For a connection that must still send its token (`--auth jwt`, none on
/// the handshake): its place among the sockets awaiting auth, and a codec
/// whose frame limit is `--max-auth-frame-bytes` until the session raises
/// it. Otherwise none, and the codec of `--max-frame-bytes`.
fn pre_auth(
    token: Option<&TokenState>,
    state: &AppState,
    ip: Option<std::net::IpAddr>,
) -> Result<(Option<PreAuth>, Codec), ApiError> {
    let config = &state.node.config;
    if !matches!(token, Some(TokenState::Awaited { .. })) {
        return Ok((None, Codec::new().max_size(config.max_frame_bytes)));
    }
    let pre = PreAuth {
        pending: state
            .node
            .conns
            .await_auth(ip.unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED)))?,
        frame_limit: Arc::new(AtomicUsize::new(config.admission.max_auth_frame_bytes)),
    };
    let codec = Codec::new().max_size_shared(pre.frame_limit.clone());
    Ok((Some(pre), codec))
}
