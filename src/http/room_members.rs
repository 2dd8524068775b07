//! The app's backend's say over rooms (admin key): the member list of a
//! room under `--room-policy members`, and removing a user from a room
//! under any policy, at once, on every node.

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use serde::{Deserialize, Serialize};

use super::access::{require_admin, require_service};
use super::{ApiError, AppState};
use crate::config::Policy;
use crate::ids;
use crate::protocol::{ErrorCode, ProtocolError};
use crate::store::rooms::{MembersSet, MAX_ROOM_MEMBERS};

/// Default users per page of `GET /api/rooms/{room}/members`.
const LIST_DEFAULT_LIMIT: usize = 1_000;
/// Largest page of `GET /api/rooms/{room}/members`.
const LIST_MAX_LIMIT: usize = 10_000;

/// Body of `PUT /api/rooms/{room}/members`.
#[derive(Deserialize, utoipa::ToSchema)]
pub(crate) struct MemberList {
    /// The users the room lets in, at most 10,000.
    users: Vec<String>,
}

/// A member list changed.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct MembersChanged {
    /// The room.
    room: String,
    /// Users on its member list now.
    users: u64,
    /// Devices that left the room with the change, as `user:device`.
    removed: Vec<String>,
}

/// A user removed from a room.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct UserRemoved {
    /// The room.
    room: String,
    /// The user.
    user: String,
    /// Its devices that were in the room and left it.
    devices: Vec<String>,
    /// Whether the user was on the room's member list (and is off it now).
    listed: bool,
}

/// Page of `GET /api/rooms/{room}/members`.
#[derive(Deserialize, utoipa::IntoParams)]
pub(crate) struct ListPage {
    /// Users per page (default 1,000, at most 10,000).
    limit: Option<usize>,
    /// The `next_cursor` of the page before.
    cursor: Option<String>,
}

/// `GET /api/rooms/{room}/members`.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct MembersPage {
    /// The room.
    room: String,
    /// Users on its member list.
    total: u64,
    /// This page of them, sorted.
    users: Vec<String>,
    /// Where the next page starts; `null` on the last.
    next_cursor: Option<String>,
}

/// The room id of the path, checked.
fn room_of(room: web::Path<String>) -> Result<String, ApiError> {
    let room = room.into_inner();
    ids::validate_room(&room)?;
    Ok(room)
}

/// Largest body of a member list: [`MAX_ROOM_MEMBERS`] ids of the longest
/// length, quoted and separated, and room to spare.
pub const MAX_MEMBERS_BODY: usize = MAX_ROOM_MEMBERS * (ids::MAX_ID_LEN + 3) + 1024;

/// `PUT /api/rooms/{room}/members` (admin): the member list is exactly
/// these users; the devices of users taken off it leave the room at once.
#[utoipa::path(put, path = "/api/rooms/{room}/members", tag = "admin",
    params(("room" = String, Path, description = "The room id")),
    request_body = MemberList,
    responses(
        (status = 200, description = "The list now, and the devices that left", body = MembersChanged),
        (status = 400, description = "Invalid room or user id", body = ProtocolError),
        (status = 401, description = "No admin key", body = ProtocolError),
        (status = 403, description = "The admin API is off", body = ProtocolError),
        (status = 413, description = "More than 10,000 users", body = ProtocolError),
        (status = 503, description = "Redis unavailable", body = ProtocolError),
    ),
    security(("bearer" = [])))]
pub(crate) async fn put_members(
    req: HttpRequest,
    room: web::Path<String>,
    body: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    require_admin(&req, &state)?;
    let room = room_of(room)?;
    // Its own limit, above the other bodies' 256 KiB: 10,000 ids of the
    // longest length must fit.
    let bytes = body.to_bytes_limited(MAX_MEMBERS_BODY).await.map_err(|_| {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::TooManyUsers,
            format!("a member list's body is at most {MAX_MEMBERS_BODY} bytes"),
        )
    })?;
    let bytes = bytes.map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            ErrorCode::BadRequest,
            e.to_string(),
        )
    })?;
    let list: MemberList = serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            ErrorCode::BadRequest,
            format!("the body is not {{\"users\":[...]}}: {e}"),
        )
    })?;
    let mut users = list.users;
    for u in &users {
        ids::validate("user", u)?;
    }
    users.sort_unstable();
    users.dedup();
    change(&state, room, &users, true).await
}

/// `POST /api/rooms/{room}/members/{user}` (admin): the user is on the
/// room's member list.
#[utoipa::path(post, path = "/api/rooms/{room}/members/{user}", tag = "admin",
    params(("room" = String, Path, description = "The room id"), ("user" = String, Path, description = "The user id")),
    responses(
        (status = 200, description = "The list's size now", body = MembersChanged),
        (status = 400, description = "Invalid room or user id", body = ProtocolError),
        (status = 401, description = "No admin key", body = ProtocolError),
        (status = 403, description = "The admin API is off", body = ProtocolError),
        (status = 413, description = "The list holds 10,000 users", body = ProtocolError),
        (status = 503, description = "Redis unavailable", body = ProtocolError),
    ),
    security(("bearer" = [])))]
pub(crate) async fn add_member(
    req: HttpRequest,
    path: web::Path<(String, String)>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    require_admin(&req, &state)?;
    let (room, user) = path.into_inner();
    ids::validate_room(&room)?;
    ids::validate("user", &user)?;
    change(&state, room, &[user], false).await
}

/// Replaces (or adds to) `room`'s member list.
async fn change(
    state: &AppState,
    room: String,
    users: &[String],
    replace: bool,
) -> Result<HttpResponse, ApiError> {
    match state
        .node
        .store
        .set_room_members(&room, users, replace)
        .await?
    {
        MembersSet::Full => Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::TooManyUsers,
            format!("a room's member list holds at most {MAX_ROOM_MEMBERS} users"),
        )),
        MembersSet::Set { users, removed } => Ok(HttpResponse::Ok().json(MembersChanged {
            room,
            users,
            removed: removed
                .into_iter()
                .map(|(u, d)| format!("{u}:{d}"))
                .collect(),
        })),
    }
}

/// `DELETE /api/rooms/{room}/members/{user}` (admin): every device of the
/// user leaves the room at once, on every node, under any policy (the
/// others get `room_leave`, each removed device an error `removed`); under
/// `members` the user is also taken off the list.
#[utoipa::path(delete, path = "/api/rooms/{room}/members/{user}", tag = "admin",
    params(("room" = String, Path, description = "The room id"), ("user" = String, Path, description = "The user id")),
    responses(
        (status = 200, description = "The devices that left", body = UserRemoved),
        (status = 400, description = "Invalid room or user id", body = ProtocolError),
        (status = 401, description = "No admin key", body = ProtocolError),
        (status = 403, description = "The admin API is off", body = ProtocolError),
        (status = 503, description = "Redis unavailable", body = ProtocolError),
    ),
    security(("bearer" = [])))]
pub(crate) async fn remove_member(
    req: HttpRequest,
    path: web::Path<(String, String)>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    require_admin(&req, &state)?;
    let (room, user) = path.into_inner();
    ids::validate_room(&room)?;
    ids::validate("user", &user)?;
    let policy = state.node.config.rooms.policies.of(&room);
    let unlist = policy == Policy::Members;
    // A grant the nodes cached before the removal is no good afterwards,
    // as long as any node may hold it.
    let hold = match (&state.node.room_proxy, policy) {
        (Some(proxy), Policy::Proxy) => proxy.grants_kept(),
        _ => std::time::Duration::ZERO,
    };
    let (devices, listed) = state
        .node
        .store
        .remove_room_user(&room, &user, unlist, hold)
        .await?;
    Ok(HttpResponse::Ok().json(UserRemoved {
        room,
        user,
        devices,
        listed,
    }))
}

/// `GET /api/rooms/{room}/members` (admin or service key): the member list,
/// paged.
#[utoipa::path(get, path = "/api/rooms/{room}/members", tag = "admin",
    params(("room" = String, Path, description = "The room id"), ListPage),
    responses(
        (status = 200, description = "A page of the member list", body = MembersPage),
        (status = 400, description = "Invalid room id, limit or cursor", body = ProtocolError),
        (status = 401, description = "No admin or service key", body = ProtocolError),
        (status = 503, description = "Redis unavailable", body = ProtocolError),
    ),
    security(("bearer" = [])))]
pub(crate) async fn list_members(
    req: HttpRequest,
    room: web::Path<String>,
    page: web::Query<ListPage>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    require_service(&req, &state)?;
    let room = room_of(room)?;
    let limit = page.limit.unwrap_or(LIST_DEFAULT_LIMIT);
    if !(1..=LIST_MAX_LIMIT).contains(&limit) {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            ErrorCode::BadRequest,
            format!("limit must be 1 to {LIST_MAX_LIMIT}"),
        ));
    }
    if let Some(cursor) = &page.cursor {
        ids::validate("cursor", cursor)?;
    }
    let _permit = state.admit_read(&req, super::Payer::Service, limit)?;
    let (users, next_cursor, total) = state
        .node
        .store
        .room_members_page(&room, page.cursor.as_deref().unwrap_or(""), limit)
        .await?;
    Ok(HttpResponse::Ok().json(MembersPage {
        room,
        total,
        users,
        next_cursor,
    }))
}
