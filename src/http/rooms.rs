//! The rooms over HTTP: one room's members (paged by user), the counts of
//! many rooms, and the rooms of one user's devices (service key). A room
//! is read as a member would see it: an invisible user is absent but to
//! itself; only the service view (the admin or service key) sees it.

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use serde::{Deserialize, Serialize};

use super::access::{is_service, require_service};
use super::{ApiError, AppState, Payer};
use crate::admission::ReadPermit;
use crate::config::Policy;
use crate::ids;
use crate::protocol::{ErrorCode, ProtocolError};
use crate::rooms::allows;
use crate::store::rooms::{PageReader, RoomMember};

/// Default members (users) per page of `GET /api/rooms/{room}`.
const MEMBERS_DEFAULT_LIMIT: usize = 100;
/// Largest page of `GET /api/rooms/{room}`.
pub const ROOM_PAGE_MAX_LIMIT: usize = 1_000;
/// Most rooms one `POST /api/rooms/query` may name.
pub(crate) const MAX_QUERY_ROOMS: usize = 1_000;

/// Who reads a room, and the page.
#[derive(Deserialize, utoipa::IntoParams)]
pub(crate) struct RoomRead {
    /// Development auth: read as this user.
    viewer: Option<String>,
    /// JWT auth: the reader's token, instead of `Authorization: Bearer`.
    token: Option<String>,
    /// Users per page (default 100, at most 1,000).
    limit: Option<usize>,
    /// The `next_cursor` of the page before.
    cursor: Option<String>,
}

/// One device of a member.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct MemberDevice {
    /// The device.
    device: String,
    /// Its state in the room, passed on as stored (JSON the device sent,
    /// checked then): a page of 1,000 states of 1 KiB is not parsed into
    /// values and written out again.
    #[schema(value_type = Object)]
    state: Box<serde_json::value::RawValue>,
    /// When it joined, epoch ms.
    joined_at: i64,
}

/// One user of a room, with its devices.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct Member {
    /// The user.
    user: String,
    /// Its devices in the room, sorted.
    devices: Vec<MemberDevice>,
}

/// `GET /api/rooms/{room}`.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct RoomPage {
    /// The room.
    room: String,
    /// Users in the room (as the reader sees it).
    users: u64,
    /// Devices in the room.
    devices: u64,
    /// This page of members, sorted by user.
    members: Vec<Member>,
    /// Where the next page starts; `null` on the last.
    next_cursor: Option<String>,
    /// `"service"` when read with the admin or service key.
    #[serde(skip_serializing_if = "Option::is_none")]
    view: Option<&'static str>,
}

/// Body of `POST /api/rooms/query`.
#[derive(Deserialize, utoipa::ToSchema)]
pub(crate) struct RoomsQuery {
    /// Room ids, at most 1,000.
    rooms: Vec<String>,
}

/// One room's counts.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct RoomCounts {
    /// The room.
    room: String,
    /// Users in it.
    users: u64,
    /// Devices in it.
    devices: u64,
}

/// `POST /api/rooms/query`: the rooms in request order.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct RoomsResult {
    /// One entry per room asked for.
    rooms: Vec<RoomCounts>,
}

/// One device of `GET /api/users/{user}/rooms`.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct DeviceRooms {
    /// The device.
    device: String,
    /// The rooms it is in, sorted.
    rooms: Vec<String>,
}

/// `GET /api/users/{user}/rooms`.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct UserRooms {
    /// The user.
    user: String,
    /// Its devices that are in rooms, sorted.
    devices: Vec<DeviceRooms>,
}

/// Who reads: the service (every member, hidden ones too), or a user (its
/// own hidden members besides the visible ones) whose token's rooms claim,
/// under JWT, must cover every room read.
enum Reader {
    /// The admin or service key.
    Service,
    /// A user, or anonymous under development auth.
    Member(Option<String>),
}

impl Reader {
    /// What the store reads for this reader.
    fn page_reader(&self) -> PageReader<'_> {
        match self {
            Reader::Service => PageReader::Service,
            Reader::Member(user) => PageReader::Member(user.as_deref()),
        }
    }
}

/// Who reads `rooms`, once its read of `cost` members or rooms is
/// admitted: charged up front, with a place among its reads in flight,
/// held by the permit until the read answers or is cancelled.
async fn reader(
    req: &HttpRequest,
    state: &AppState,
    viewer: Option<&str>,
    token: Option<&str>,
    rooms: &[&str],
    cost: usize,
) -> Result<(Reader, ReadPermit), ApiError> {
    if is_service(req, state) {
        let permit = state.admit_read(req, Payer::Service, cost)?;
        return Ok((Reader::Service, permit));
    }
    let (user, grants) = state.auth.room_reader(req, token, viewer).await?;
    if let Some(user) = &user {
        ids::validate("user", user)?;
    }
    // A room is read as it is joined: by its policy.
    let policies = &state.node.config.rooms.policies;
    let mut listed = Vec::new();
    let mut proxied = Vec::new();
    let mut tokened = Vec::new();
    for room in rooms {
        match policies.of(room) {
            Policy::Open => {}
            Policy::Claim => {
                if grants.as_ref().is_some_and(|g| !allows(g, room)) {
                    return Err(forbidden(format!(
                        "the token's rooms claim does not include {room:?}"
                    )));
                }
            }
            Policy::Members => listed.push(*room),
            Policy::Proxy => proxied.push(*room),
            Policy::Token => tokened.push(*room),
        }
    }
    let permit = state.admit_read(req, Payer::Client(user.as_deref()), cost)?;
    if !tokened.is_empty() {
        // A `Room-Token` header for each, of this user (room_token.rs).
        let checked = state.auth.check_room_tokens(req, user.as_deref(), &tokened);
        checked.await.map_err(|e| forbidden(e.to_string()))?;
    }
    if !listed.is_empty() {
        let Some(user) = &user else {
            return Err(forbidden(format!(
                "{:?} lets in only the users on its member list: read as one",
                listed[0]
            )));
        };
        let store = &state.node.store;
        let checks = listed.iter().map(|room| store.is_room_member(room, user));
        for (room, on) in listed
            .iter()
            .zip(futures_util::future::join_all(checks).await)
        {
            if !on? {
                return Err(forbidden(format!(
                    "{user:?} is not on the member list of {room:?}"
                )));
            }
        }
    }
    if !proxied.is_empty() {
        ask_backend(state, user.as_deref(), &proxied).await?;
    }
    Ok((Reader::Member(user), permit))
}

/// Most questions one read has out to the app's backend at once, so that
/// a read of many `proxy` rooms takes its turn beside the joins
/// (`--room-join-max-in-flight` bounds them all).
const READ_QUESTIONS_AT_ONCE: usize = 8;

/// `--room-policy proxy`: the app's backend (or its cached answer) lets
/// `user` read each of `rooms`, as it would let it join; the first refusal
/// is `403`, no answer `503`. The question names no device
/// ([`READ_DEVICE`](crate::rooms::proxy::READ_DEVICE)) and an empty state.
async fn ask_backend(state: &AppState, user: Option<&str>, rooms: &[&str]) -> Result<(), ApiError> {
    use crate::rooms::proxy::{Question, Verdict, READ_DEVICE};
    use futures_util::{StreamExt, TryStreamExt};
    let Some(user) = user else {
        return Err(forbidden(format!(
            "{:?} lets in only the users the app's backend allows: read as one",
            rooms[0]
        )));
    };
    let Some(proxy) = state.node.room_proxy.clone() else {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::Unavailable,
            "no --room-join-url is set",
        ));
    };
    let empty = serde_json::value::RawValue::from_string("{}".to_string()).expect("{} is JSON");
    futures_util::stream::iter(rooms)
        .map(Ok)
        .try_for_each_concurrent(READ_QUESTIONS_AT_ONCE, |room| {
            let question = Question {
                user,
                device: READ_DEVICE,
                room,
                state: &empty,
            };
            let proxy = proxy.clone();
            async move {
                let mut verdict = ask(&proxy, &question).await;
                if let Verdict::Allow(grant) = &verdict {
                    // A grant from before the user's removal is void: ask
                    // again, once (as a join does).
                    if state
                        .node
                        .store
                        .removed_since(room, user, grant.asked_at)
                        .await?
                    {
                        proxy.forget(user, room);
                        verdict = match ask(&proxy, &question).await {
                            Verdict::Allow(grant)
                                if state
                                    .node
                                    .store
                                    .removed_since(room, user, grant.asked_at)
                                    .await? =>
                            {
                                Verdict::Refuse("removed from the room".into())
                            }
                            v => v,
                        };
                    }
                }
                match verdict {
                    Verdict::Allow(_) => Ok(()),
                    Verdict::Refuse(why) => Err(forbidden(format!(
                        "the app's backend does not let {user:?} into {room:?} ({why})"
                    ))),
                    Verdict::Unavailable(why) => Err(ApiError::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        ErrorCode::Unavailable,
                        format!(
                            "the app's backend did not answer about {room:?} ({why}); try again"
                        ),
                    )),
                }
            }
        })
        .await
}

/// The backend's answer (or its cached one) to `question`.
async fn ask(
    proxy: &std::sync::Arc<crate::rooms::proxy::RoomProxy>,
    question: &crate::rooms::proxy::Question<'_>,
) -> crate::rooms::proxy::Verdict {
    match proxy.decide(question, false) {
        Ok(v) => v,
        Err(waiting) => waiting.answer().await,
    }
}

/// A `403 forbidden` saying why.
fn forbidden(message: String) -> ApiError {
    ApiError::new(StatusCode::FORBIDDEN, ErrorCode::Forbidden, message)
}

/// The members of a page grouped by user (the page is sorted by user,
/// then device).
fn grouped(page: Vec<RoomMember>) -> Vec<Member> {
    let mut members: Vec<Member> = Vec::new();
    for m in page {
        let device = MemberDevice {
            device: m.device,
            state: serde_json::value::RawValue::from_string(m.state).unwrap_or_else(|_| {
                serde_json::value::RawValue::from_string("{}".to_string()).expect("{} is JSON")
            }),
            joined_at: m.joined_at,
        };
        match members.last_mut() {
            Some(last) if last.user == m.user => last.devices.push(device),
            _ => members.push(Member {
                user: m.user,
                devices: vec![device],
            }),
        }
    }
    members
}

/// `GET /api/rooms/{room}`: the members, paged by user.
#[utoipa::path(get, path = "/api/rooms/{room}", tag = "rooms",
    params(("room" = String, Path, description = "The room id"), RoomRead,
        ("Room-Token" = Option<String>, Header, description = "A room under --room-policy token: a room token of the reader for it (repeat the header, or separate tokens with commas)")),
    responses(
        (status = 200, description = "The room as a member sees it; the truth with the admin or service key", body = RoomPage),
        (status = 400, description = "Invalid room id, limit or cursor", body = ProtocolError),
        (status = 401, description = "JWT auth: missing or invalid token", body = ProtocolError),
        (status = 403, description = "The room's policy does not let the reader in: its token's rooms claim, the member list, or the app's backend (`proxy`) refused", body = ProtocolError),
        (status = 429, description = "The client's read budget is spent, or it has the most reads in flight", body = ProtocolError),
        (status = 503, description = "Redis unavailable, or the app's backend did not answer in time (`proxy`)", body = ProtocolError),
    ),
    security((), ("bearer" = [])))]
pub(crate) async fn room(
    req: HttpRequest,
    room: web::Path<String>,
    query: web::Query<RoomRead>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let room = room.into_inner();
    ids::validate_room(&room)?;
    let limit = query.limit.unwrap_or(MEMBERS_DEFAULT_LIMIT);
    if !(1..=ROOM_PAGE_MAX_LIMIT).contains(&limit) {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            ErrorCode::BadRequest,
            format!("limit must be 1 to {ROOM_PAGE_MAX_LIMIT}"),
        ));
    }
    if let Some(cursor) = &query.cursor {
        ids::validate("cursor", cursor)?;
    }
    // A page holds at most `limit` devices, but never splits a user, so
    // it may read up to one user's most devices: charged up front.
    let max_devices = state.node.config.max_devices_per_user as usize;
    let cost = limit.max(max_devices);
    let (reader, _permit) = reader(
        &req,
        &state,
        query.viewer.as_deref(),
        query.token.as_deref(),
        &[room.as_str()],
        cost,
    )
    .await?;
    let limit = u32::try_from(limit).unwrap_or(u32::MAX);
    let page = state
        .node
        .store
        .room_page(
            &room,
            query.cursor.as_deref().unwrap_or(""),
            limit,
            limit,
            reader.page_reader(),
        )
        .await?;
    Ok(HttpResponse::Ok().json(RoomPage {
        room,
        users: page.users,
        devices: page.devices,
        members: grouped(page.members),
        next_cursor: page.next,
        view: matches!(reader, Reader::Service).then_some("service"),
    }))
}

/// `POST /api/rooms/query`: the counts of many rooms, in request order.
#[utoipa::path(post, path = "/api/rooms/query", tag = "rooms",
    params(("viewer" = Option<String>, Query, description = "Development auth: read as this user"),
        ("token" = Option<String>, Query, description = "JWT auth: the reader's token, instead of Authorization: Bearer"),
        ("Room-Token" = Option<String>, Header, description = "Rooms under --room-policy token: a room token of the reader for each (repeat the header, or separate tokens with commas)")),
    request_body = RoomsQuery,
    responses(
        (status = 200, description = "Each room's counts, in request order", body = RoomsResult),
        (status = 400, description = "Invalid room id", body = ProtocolError),
        (status = 403, description = "A room whose policy does not let the reader in: outside the token's rooms claim, off the member list, or refused by the app's backend (`proxy`)", body = ProtocolError),
        (status = 413, description = "More than 1,000 rooms", body = ProtocolError),
        (status = 429, description = "The client's read budget is spent, or it has the most reads in flight", body = ProtocolError),
        (status = 503, description = "Redis unavailable, or the app's backend did not answer in time (`proxy`)", body = ProtocolError),
    ),
    security((), ("bearer" = [])))]
pub(crate) async fn rooms_query(
    req: HttpRequest,
    who: web::Query<super::access::As>,
    body: web::Json<RoomsQuery>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let rooms = body.into_inner().rooms;
    if rooms.len() > MAX_QUERY_ROOMS {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::TooManyRooms,
            format!("at most {MAX_QUERY_ROOMS} rooms per query"),
        ));
    }
    for room in &rooms {
        ids::validate_room(room)?;
    }
    // Each room is read once however often it is named, and charged once:
    // its counts, which read no member.
    let mut unique: Vec<&str> = rooms.iter().map(String::as_str).collect();
    unique.sort_unstable();
    unique.dedup();
    let (reader, _permit) = reader(
        &req,
        &state,
        who.viewer(),
        who.token(),
        &unique,
        unique.len(),
    )
    .await?;
    let counts = state
        .node
        .store
        .room_counts(&unique, reader.page_reader())
        .await?;
    let out = rooms
        .iter()
        .map(|room| {
            // Sorted above: found, whichever room it is.
            let i = unique.binary_search(&room.as_str()).unwrap_or(0);
            let (users, devices) = counts.get(i).copied().unwrap_or_default();
            RoomCounts {
                room: room.clone(),
                users,
                devices,
            }
        })
        .collect();
    Ok(HttpResponse::Ok().json(RoomsResult { rooms: out }))
}

/// `GET /api/users/{user}/rooms` (the service or admin key): the rooms each
/// of the user's devices is in, hidden memberships included.
#[utoipa::path(get, path = "/api/users/{user}/rooms", tag = "rooms",
    params(("user" = String, Path, description = "The user id")),
    responses(
        (status = 200, description = "The rooms of each device", body = UserRooms),
        (status = 400, description = "Invalid user id", body = ProtocolError),
        (status = 401, description = "No service or admin key", body = ProtocolError),
        (status = 503, description = "Redis unavailable", body = ProtocolError),
    ),
    security(("bearer" = [])))]
pub(crate) async fn user_rooms(
    req: HttpRequest,
    user: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    require_service(&req, &state)?;
    let _permit = state.admit_read(&req, Payer::Service, 1)?;
    let user = user.into_inner();
    ids::validate("user", &user)?;
    let devices = state
        .node
        .store
        .user_rooms(&user)
        .await?
        .into_iter()
        .map(|(device, rooms)| DeviceRooms { device, rooms })
        .collect();
    Ok(HttpResponse::Ok().json(UserRooms { user, devices }))
}
