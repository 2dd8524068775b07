//! `GET /api/openapi.json`: the HTTP API described as OpenAPI, generated
//! from the handlers' `#[utoipa::path]` annotations in the HTTP handlers and
//! the types they answer with. The WebSocket frames and webhook payloads
//! are in `docs/events.md`; the webhook batch is here as a schema too.

use std::sync::LazyLock;

use actix_web::HttpResponse;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::{Modify, OpenApi};

use super::devices::{HeartbeatAnswer, StatusBody};
use super::reads::{OnlineResult, Query, QueryResult, UserPresence};
use super::room_members::{MemberList, MembersChanged, MembersPage, UserRemoved};
use super::rooms::{
    DeviceRooms, Member, MemberDevice, RoomCounts, RoomPage, RoomsQuery, RoomsResult, UserRooms,
};
use super::users::{Contacts, PrivacyBody};
use crate::model::Record;
use crate::protocol::{ErrorCode, ProtocolError};
use crate::store::{DeviceInfo, OnlinePage, OnlineUser};
use crate::webhooks::{Kind, RoomKind, RoomWebhookEvent, WebhookBatch, WebhookEvent};

/// The document.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "presence-server",
        description = "Who is online, on which devices, with which status. Reads take `?viewer=` (development auth) or a token (JWT auth); the admin key or `--service-key` as `Authorization: Bearer` reads the truth, marked `\"view\": \"service\"`. WebSocket frames and webhook payloads: docs/events.md."
    ),
    paths(
        super::upgrade::websocket,
        super::reads::presence,
        super::reads::query,
        super::reads::online,
        super::users::set_privacy,
        super::devices::set_status,
        super::devices::heartbeat,
        super::devices::leave,
        super::users::put_contacts,
        super::users::get_contacts,
        super::ops::healthz,
        super::ops::livez,
        super::ops::readyz,
        super::ops::metrics,
        super::ops::info,
        super::rooms::room,
        super::rooms::rooms_query,
        super::rooms::user_rooms,
        super::room_members::put_members,
        super::room_members::list_members,
        super::room_members::add_member,
        super::room_members::remove_member,
        super::events::events,
        document,
    ),
    components(schemas(
        Record, DeviceInfo, OnlinePage, OnlineUser, UserPresence, QueryResult, OnlineResult,
        Query, PrivacyBody, StatusBody, HeartbeatAnswer, Contacts, ProtocolError, ErrorCode, WebhookBatch, WebhookEvent, Kind,
        RoomWebhookEvent, RoomKind, RoomPage, Member, MemberDevice, RoomsQuery, RoomCounts, RoomsResult, UserRooms, DeviceRooms,
        MemberList, MembersChanged, UserRemoved, MembersPage, super::events::EventsPage,
    )),
    modifiers(&BearerKey),
    tags(
        (name = "read", description = "Presence records"),
        (name = "users", description = "A user's own settings"),
        (name = "devices", description = "Presence without a WebSocket: HTTP heartbeat devices"),
        (name = "rooms", description = "Presence in a place: who is in a room"),
        (name = "admin", description = "The admin API (--admin-key)"),
        (name = "service", description = "The app's backend: the event feed (--service-key)"),
        (name = "operations", description = "Health and metrics (--internal-listen)"),
        (name = "websocket", description = "The WebSocket upgrade"),
        (name = "demo", description = "The demo page"),
        (name = "meta", description = "This document"),
    )
)]
pub struct ApiDoc;

/// The `bearer` scheme: a JWT, the admin key or the service key.
struct BearerKey;

impl Modify for BearerKey {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
        );
    }
}

/// The document as JSON, made once.
static DOCUMENT: LazyLock<String> = LazyLock::new(|| {
    ApiDoc::openapi()
        .to_pretty_json()
        // Serializing a document of plain strings and maps cannot fail.
        .expect("the OpenAPI document serializes")
});

/// `GET /api/openapi.json`: this document.
#[utoipa::path(get, path = "/api/openapi.json", tag = "meta",
    responses((status = 200, description = "This document (OpenAPI 3.1)", body = Object)))]
pub(crate) async fn document() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/json")
        .body(DOCUMENT.as_str())
}
