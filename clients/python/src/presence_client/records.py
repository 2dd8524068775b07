"""What the server answers, as frozen dataclasses built from its JSON
(docs/events.md has every field). Fields the server adds later are ignored,
so an older package keeps working against a newer server."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

#: What a user may set (``invisible`` hides it; the service view shows it).
SettableStatus = Literal["online", "away", "busy", "invisible"]
#: Who may see a user online, or its last seen.
Audience = Literal["everyone", "contacts", "nobody"]
#: A device's kind.
DeviceKind = Literal["web", "desktop", "mobile", "tablet", "bot", "other"]

Json = Mapping[str, Any]


@dataclass(frozen=True)
class Record:
    """A user as the reader may see it; with a key, the truth."""

    user: str
    #: ``online``, ``away``, ``busy``, ``offline``; ``invisible`` in the
    #: service view (and the user's own).
    status: str
    #: Live devices (``0`` when offline or hidden from this reader).
    devices: int
    #: When the user went offline, epoch ms; ``None`` while online or never seen.
    last_seen: int | None
    text: str | None
    #: When the chosen status ends (back to ``online``), epoch ms.
    until: int | None
    #: The sorted distinct kinds of the live devices.
    kinds: tuple[str, ...]
    #: Every live device is paused (present, but away from all of them).
    idle: bool

    @property
    def online(self) -> bool:
        """True unless the status is ``offline`` (``invisible`` is online)."""
        return self.status != "offline"

    @classmethod
    def from_json(cls, d: Json) -> Record:
        return cls(**_record_fields(d))


def _record_fields(d: Json) -> dict[str, Any]:
    return {
        "user": d["user"],
        "status": d["status"],
        "devices": d["devices"],
        "last_seen": d.get("last_seen"),
        "text": d.get("text"),
        "until": d.get("until"),
        "kinds": tuple(d.get("kinds") or ()),
        "idle": bool(d.get("idle", False)),
    }


@dataclass(frozen=True)
class DeviceInfo:
    """One live device of ``GET /api/presence/{user}``."""

    device: str
    #: The node holding its connection (``None`` for a moment after Redis lost its data).
    node: str | None
    #: When it connected (an HTTP device: its last heartbeat), epoch ms.
    connected_at: int | None
    #: Its lease's time left.
    expires_in_ms: int | None
    kind: str
    #: Paused: present until ``expires_in_ms`` (the rest of its grace).
    paused: bool = False

    @classmethod
    def from_json(cls, d: Json) -> DeviceInfo:
        return cls(
            device=d["device"],
            node=d.get("node"),
            connected_at=d.get("connected_at"),
            expires_in_ms=d.get("expires_in_ms"),
            kind=d.get("kind", "other"),
            paused=bool(d.get("paused", False)),
        )


@dataclass(frozen=True)
class UserPresence(Record):
    """``GET /api/presence/{user}``: the record and its live devices."""

    device_list: tuple[DeviceInfo, ...]
    #: ``"service"`` when read with a key (the truth); ``None`` for a viewer's view.
    view: str | None

    @classmethod
    def from_json(cls, d: Json) -> UserPresence:
        return cls(
            **_record_fields(d),
            device_list=tuple(DeviceInfo.from_json(x) for x in d.get("device_list") or ()),
            view=d.get("view"),
        )


@dataclass(frozen=True)
class OnlineUser(Record):
    """One user of ``GET /api/online``."""

    #: The last refresh of its most recently refreshed device (for a user
    #: listed by ``seen_within_ms``: its last seen), epoch ms.
    active_at: int

    @classmethod
    def from_json(cls, d: Json) -> OnlineUser:
        return cls(**_record_fields(d), active_at=d["active_at"])


@dataclass(frozen=True)
class OnlinePage:
    """One page of ``GET /api/online``."""

    users: list[OnlineUser]
    #: Pass it back for the next page; ``None`` on the last.
    next_cursor: str | None

    @classmethod
    def from_json(cls, d: Json) -> OnlinePage:
        return cls(
            users=[OnlineUser.from_json(u) for u in d["users"]],
            next_cursor=d.get("next_cursor"),
        )


@dataclass(frozen=True)
class RoomDevice:
    """A member's device in a room."""

    device: str
    #: Its state in the room (a JSON object).
    state: dict[str, Any]
    joined_at: int


@dataclass(frozen=True)
class RoomMember:
    """A user in a room, with its devices there."""

    user: str
    devices: tuple[RoomDevice, ...]

    @classmethod
    def from_json(cls, d: Json) -> RoomMember:
        return cls(
            user=d["user"],
            devices=tuple(
                RoomDevice(device=x["device"], state=x.get("state") or {}, joined_at=x["joined_at"])
                for x in d.get("devices") or ()
            ),
        )


@dataclass(frozen=True)
class RoomPage:
    """``GET /api/rooms/{room}``: the counts and one page of members, by user."""

    room: str
    users: int
    devices: int
    members: list[RoomMember]
    next_cursor: str | None
    view: str | None

    @classmethod
    def from_json(cls, d: Json) -> RoomPage:
        return cls(
            room=d["room"],
            users=d["users"],
            devices=d["devices"],
            members=[RoomMember.from_json(m) for m in d.get("members") or ()],
            next_cursor=d.get("next_cursor"),
            view=d.get("view"),
        )


@dataclass(frozen=True)
class RoomCounts:
    """One room of ``POST /api/rooms/query``."""

    room: str
    users: int
    devices: int

    @classmethod
    def from_json(cls, d: Json) -> RoomCounts:
        return cls(room=d["room"], users=d["users"], devices=d["devices"])


@dataclass(frozen=True)
class DeviceRooms:
    """The rooms one device of a user is in."""

    device: str
    rooms: tuple[str, ...]


@dataclass(frozen=True)
class UserRooms:
    """``GET /api/users/{user}/rooms``."""

    user: str
    devices: tuple[DeviceRooms, ...]

    @property
    def rooms(self) -> frozenset[str]:
        """Every room any of the user's devices is in."""
        return frozenset(r for d in self.devices for r in d.rooms)

    @classmethod
    def from_json(cls, d: Json) -> UserRooms:
        return cls(
            user=d["user"],
            devices=tuple(
                DeviceRooms(device=x["device"], rooms=tuple(x.get("rooms") or ()))
                for x in d.get("devices") or ()
            ),
        )


@dataclass(frozen=True)
class MembersPage:
    """``GET /api/rooms/{room}/members``: one page of a room's member list."""

    room: str
    #: Users on the list.
    total: int
    #: This page of them, sorted.
    users: list[str]
    next_cursor: str | None

    @classmethod
    def from_json(cls, d: Json) -> MembersPage:
        return cls(
            room=d["room"],
            total=d["total"],
            users=list(d["users"]),
            next_cursor=d.get("next_cursor"),
        )


@dataclass(frozen=True)
class MembersChanged:
    """A member list changed (``PUT`` or ``POST`` on ``/api/rooms/{room}/members``)."""

    room: str
    #: Users on the list now.
    users: int
    #: Devices that left the room with the change, as ``user:device``.
    removed: tuple[str, ...]

    @classmethod
    def from_json(cls, d: Json) -> MembersChanged:
        return cls(room=d["room"], users=d["users"], removed=tuple(d.get("removed") or ()))


@dataclass(frozen=True)
class UserRemoved:
    """``DELETE /api/rooms/{room}/members/{user}``."""

    room: str
    user: str
    #: The user's devices that were in the room and left it.
    devices: tuple[str, ...]
    #: Whether the user was on the room's member list (and is off it now).
    listed: bool

    @classmethod
    def from_json(cls, d: Json) -> UserRemoved:
        return cls(
            room=d["room"],
            user=d["user"],
            devices=tuple(d.get("devices") or ()),
            listed=bool(d.get("listed")),
        )


@dataclass(frozen=True)
class Heartbeat:
    """The answer to a heartbeat: the lease lasts ``ttl_ms``; heartbeat
    again within ``heartbeat_ms``."""

    ttl_ms: int
    heartbeat_ms: int


@dataclass(frozen=True)
class ServerInfo:
    """``GET /api/info``."""

    server: str
    version: str
    #: ``dev`` or ``jwt``.
    auth: str
    heartbeat_ms: int


@dataclass(frozen=True)
class Event:
    """One transition, as a webhook batch and the event feed carry it.

    ``online``, ``offline``, ``status`` and ``idle`` are a user's (``user``,
    ``status``, ``devices``, ``last_seen``, ``text``, ``since``, ``until``,
    ``kinds``, ``idle``); ``room_joined``, ``room_left``, ``room_occupied`` and
    ``room_vacated`` a room's (``room``, ``users``, ``devices``; ``user`` but
    on the last two). ``raw`` is the JSON object as received.
    """

    #: The same transition always has the same id: deduplicate by it.
    id: str
    type: str
    at: int
    #: Orders one user's (or room's) events: larger is later.
    seq: int
    user: str | None
    room: str | None
    status: str | None
    devices: int | None
    last_seen: int | None
    text: str | None
    since: int | None
    until: int | None
    kinds: tuple[str, ...]
    #: Users in the room after a room event.
    users: int | None
    raw: Mapping[str, Any]
    #: On ``idle`` events only: every live device of the user is paused
    #: (``True``), or one is back (``False``); ``None`` on other events.
    idle: bool | None = None

    @classmethod
    def from_json(cls, d: Json) -> Event:
        return cls(
            id=d["id"],
            type=d["type"],
            at=d["at"],
            seq=d["seq"],
            user=d.get("user"),
            room=d.get("room"),
            status=d.get("status"),
            devices=d.get("devices"),
            last_seen=d.get("last_seen"),
            text=d.get("text"),
            since=d.get("since"),
            until=d.get("until"),
            kinds=tuple(d.get("kinds") or ()),
            users=d.get("users"),
            raw=d,
            idle=d.get("idle"),
        )


@dataclass(frozen=True)
class EventsPage:
    """One page of ``GET /api/events``."""

    events: list[Event]
    #: Pass it back for the events after these.
    next_cursor: str
    #: Events that went (retention, bounds) between the cursor and these.
    lost: int

    @classmethod
    def from_json(cls, d: Json) -> EventsPage:
        return cls(
            events=[Event.from_json(e) for e in d["events"]],
            next_cursor=d["next_cursor"],
            lost=d.get("lost", 0),
        )


@dataclass(frozen=True)
class WebhookBatch:
    """The body of a webhook POST."""

    #: The node that sent it.
    node: str
    events: list[Event]
    #: Events the feed dropped before this URL took them: resync.
    lost: int

    @classmethod
    def from_json(cls, d: Json) -> WebhookBatch:
        return cls(
            node=d.get("node", ""),
            events=[Event.from_json(e) for e in d["events"]],
            lost=d.get("lost", 0),
        )
