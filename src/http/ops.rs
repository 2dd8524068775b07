//! Operations: the probes `/livez` and `/readyz`, `/healthz` (both in one,
//! kept for compatibility), `/metrics` (Prometheus text) and `/api/info`.

use actix_web::{web, HttpResponse};

use super::*;
use crate::auth::Auth;
use crate::registry::GetStats;

/// `GET /healthz`: 200 when the process is up and Redis answered the last
/// health check (at most about a second ago), else 503. Answers from that
/// cached state, so it is as fast with Redis down as up. 503 too from the
/// moment the node gets SIGTERM (`"status":"draining"`). Not a liveness
/// probe (it depends on Redis): use `/livez` and `/readyz`.
#[utoipa::path(get, path = "/healthz", tag = "operations",
    responses(
        (status = 200, description = "Up, Redis reachable", body = Object),
        (status = 503, description = "Redis unreachable, or the node is draining (SIGTERM)", body = Object),
    ))]
pub(crate) async fn healthz(state: web::Data<AppState>) -> HttpResponse {
    let stats = state.node.registry.send(GetStats).await.unwrap_or_default();
    let redis = state.redis_health.report();
    if state.readiness.draining() {
        // A load balancer that still checks /healthz stops sending clients.
        HttpResponse::ServiceUnavailable().json(serde_json::json!({
            "status": "draining", "node": state.node.config.node_id,
            "redis": if redis.up { "up" } else { "down" }, "registry": stats,
        }))
    } else if redis.up {
        HttpResponse::Ok().json(serde_json::json!({
            "status": "ok", "node": state.node.config.node_id, "redis": "up", "registry": stats,
            "counters": crate::metrics::METRICS.health_counters(),
            "redis_details": redis.details,
        }))
    } else {
        HttpResponse::ServiceUnavailable().json(serde_json::json!({
            "status": "unavailable", "node": state.node.config.node_id, "redis": "down",
            "error": redis.details["error"], "redis_details": redis.details,
        }))
    }
}

/// `GET /livez`: 200 while the process and its event loop answer. It
/// never depends on Redis: a liveness probe that did would restart every
/// node of a fleet during a Redis incident and turn it into a reconnect
/// storm.
#[utoipa::path(get, path = "/livez", tag = "operations",
    responses((status = 200, description = "The process answers", body = Object)))]
pub(crate) async fn livez(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok().json(serde_json::json!({
        "status": "ok", "node": state.node.config.node_id,
    }))
}

/// A Redis health check older than this counts as failed for `/readyz`
/// (it runs every 0.5 s).
const STALE_HEALTH: std::time::Duration = std::time::Duration::from_secs(5);

/// `GET /readyz`: 200 when the node may be sent new clients: Redis answered
/// the last health check, the expiry listener runs and the node is not
/// draining. 503 otherwise, with the reasons; 503 from the moment the node
/// gets SIGTERM (`--drain-delay-ms` keeps it serving while a load balancer
/// takes it out).
#[utoipa::path(get, path = "/readyz", tag = "operations",
    responses(
        (status = 200, description = "Ready", body = Object),
        (status = 503, description = "Not ready: Redis unreachable, expiry listener stalled or draining", body = Object),
    ))]
pub(crate) async fn readyz(state: web::Data<AppState>) -> HttpResponse {
    let mut reasons = Vec::new();
    let redis = state.redis_health.report();
    if !redis.up {
        reasons.push(format!("redis unreachable: {}", redis.details["error"]));
    } else if redis.checked_ago > STALE_HEALTH {
        // The checker itself is stuck (a PING that does not come back).
        reasons.push(format!(
            "redis health not checked for {} ms",
            redis.checked_ago.as_millis()
        ));
    }
    if let Err(e) = state.readiness.check(state.node.config.reaper_interval()) {
        reasons.push(e.to_string());
    }
    let node = &state.node.config.node_id;
    if reasons.is_empty() {
        HttpResponse::Ok().json(serde_json::json!({"status": "ready", "node": node}))
    } else {
        HttpResponse::ServiceUnavailable().json(serde_json::json!({
            "status": "unavailable", "node": node, "reasons": reasons,
            "draining": state.readiness.draining(),
        }))
    }
}

/// `GET /metrics`: Prometheus text exposition; answers even when Redis does
/// not. On the public listener it needs the admin or the service key,
/// unless `--public-metrics`; on `--internal-listen` it is open.
#[utoipa::path(get, path = "/metrics", tag = "operations",
    responses(
        (status = 200, description = "Prometheus text exposition", content_type = "text/plain", body = String),
        (status = 401, description = "Public listener without --public-metrics: no admin or service key", body = ProtocolError),
    ),
    security((), ("bearer" = [])))]
pub(crate) async fn metrics(
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let open = state.public_metrics || req.app_data::<super::access::Internal>().is_some();
    if !open && !super::access::is_service(&req, &state) {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            ErrorCode::Unauthorized,
            "/metrics needs Authorization: Bearer <admin key or service key> (or --public-metrics)",
        ));
    }
    let stats = state.node.registry.send(GetStats).await.unwrap_or_default();
    Ok(HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(crate::metrics::METRICS.render(stats.into())))
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
            "heartbeat_ms": state.node.config.heartbeat.as_millis() as u64,
        }))
}
