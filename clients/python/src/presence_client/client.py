"""The HTTP API of presence-server for the app's backend (docs/http-api.md)."""

from __future__ import annotations

import datetime
import ssl
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

from . import __version__
from ._http import Query, Transport, segment
from .devices import HeartbeatDevice
from .errors import PresenceError
from .feed import EventFeed
from .records import (
    Audience,
    DeviceKind,
    EventsPage,
    Heartbeat,
    MembersChanged,
    MembersPage,
    OnlinePage,
    OnlineUser,
    Record,
    RoomCounts,
    RoomMember,
    RoomPage,
    ServerInfo,
    SettableStatus,
    UserPresence,
    UserRemoved,
    UserRooms,
)

#: Most users (or rooms) one bulk query names; longer lists are split.
MAX_QUERY = 1_000

T = TypeVar("T")


class PresenceClient:
    """A client of one presence-server fleet, safe to share between threads
    (each call is one request; nothing is kept between them).

    ``url`` is any node (``http://presence:8080``). ``service_key`` is the
    nodes' ``--service-key``: the reads answer the truth with it (the
    service view). ``admin_key`` is their ``--admin-key``: the admin calls
    (contacts, member lists) need it, and it acts for any user on the user
    calls (privacy, status, HTTP devices); it reads too when there is no
    service key. ``admin_url`` is where the admin key works, when the nodes
    serve it on ``--internal-listen`` (the contacts, member lists and event
    feed are served only there then, and no reads: give a service key);
    by default ``url``.

    ``timeout`` bounds each request, in seconds; ``ssl_context`` is for an
    ``https`` URL with a private CA; ``headers`` are sent with every request.
    """

    def __init__(
        self,
        url: str,
        *,
        service_key: str | None = None,
        admin_key: str | None = None,
        admin_url: str | None = None,
        timeout: float = 10.0,
        ssl_context: ssl.SSLContext | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        all_headers = {"User-Agent": f"presence-client-python/{__version__}", **(headers or {})}
        self.service_key = service_key
        self.admin_key = admin_key
        self._public = Transport(url, timeout=timeout, ssl_context=ssl_context, headers=all_headers)
        self._admin = (
            Transport(admin_url, timeout=timeout, ssl_context=ssl_context, headers=all_headers)
            if admin_url
            else self._public
        )

    # ---- requests ------------------------------------------------------------------------

    def _read(self, method: str, path: str, *, query: Query | None = None, body: Any = None) -> Any:
        """A read of the public API, with the service key (else the admin
        key, where it works; with neither, anonymous: dev auth only)."""
        if self.service_key or not self.admin_key:
            return self._public.request(
                method, path, bearer=self.service_key, query=query, body=body
            )
        return self._admin.request(method, path, bearer=self.admin_key, query=query, body=body)

    def _operate(
        self,
        method: str,
        path: str,
        *,
        query: Query | None = None,
        body: Any = None,
        service: bool = False,
    ) -> Any:
        """A call of the operations routes (admin; with ``service``, the
        service key does too), where the admin key works."""
        key = self.admin_key or (self.service_key if service else None)
        return self._admin.request(method, path, bearer=key, query=query, body=body)

    def _act(
        self,
        method: str,
        path: str,
        token: str | None,
        *,
        query: Query | None = None,
        body: Any = None,
    ) -> Any:
        """A call for one user: with its ``token``, else the admin key."""
        if token:
            return self._public.request(method, path, bearer=token, query=query, body=body)
        return self._admin.request(method, path, bearer=self.admin_key, query=query, body=body)

    # ---- service reads -------------------------------------------------------------------

    def info(self) -> ServerInfo:
        """``GET /api/info``: the server's version, auth mode and heartbeat."""
        d = self._public.request("GET", "/api/info")
        return ServerInfo(
            server=d["server"], version=d["version"], auth=d["auth"], heartbeat_ms=d["heartbeat_ms"]
        )

    def presence(self, user: str) -> UserPresence:
        """``GET /api/presence/{user}``: the user's record and live devices."""
        return UserPresence.from_json(self._read("GET", f"/api/presence/{segment(user)}"))

    def query(self, users: Iterable[str]) -> list[Record]:
        """``POST /api/presence/query``: the records of ``users``, in their
        order; a list longer than 1,000 is asked 1,000 at a time."""
        path = "/api/presence/query"
        pages = (self._read("POST", path, body={"users": c}) for c in _chunks(users))
        return [Record.from_json(r) for page in pages for r in page["presence"]]

    def online(
        self, *, limit: int = 50, cursor: str | None = None, seen_within_ms: int | None = None
    ) -> OnlinePage:
        """``GET /api/online``: one page of the users online now, most
        recently active first (then, with ``seen_within_ms``, those last
        seen within it). Pass ``next_cursor`` back until it is ``None``."""
        d = self._read(
            "GET",
            "/api/online",
            query={"limit": limit, "cursor": cursor, "seen_within_ms": seen_within_ms},
        )
        return OnlinePage.from_json(d)

    def iter_online(
        self, *, limit: int = 200, seen_within_ms: int | None = None
    ) -> Iterator[OnlineUser]:
        """Every user of :meth:`online`, reading ``limit`` at a time."""

        def read(cursor: str | None) -> tuple[list[OnlineUser], str | None]:
            page = self.online(limit=limit, cursor=cursor, seen_within_ms=seen_within_ms)
            return page.users, page.next_cursor

        return _paged(read)

    def room(self, room: str, *, limit: int | None = None, cursor: str | None = None) -> RoomPage:
        """``GET /api/rooms/{room}``: the room's counts and a page of its
        members (by user, at most ``limit`` users and devices)."""
        d = self._read(
            "GET", f"/api/rooms/{segment(room)}", query={"limit": limit, "cursor": cursor}
        )
        return RoomPage.from_json(d)

    def iter_room(self, room: str, *, limit: int | None = None) -> Iterator[RoomMember]:
        """Every member of :meth:`room`, page after page."""

        def read(cursor: str | None) -> tuple[list[RoomMember], str | None]:
            page = self.room(room, limit=limit, cursor=cursor)
            return page.members, page.next_cursor

        return _paged(read)

    def rooms(self, rooms: Iterable[str]) -> list[RoomCounts]:
        """``POST /api/rooms/query``: the counts of ``rooms``, in their
        order; a list longer than 1,000 is asked 1,000 at a time."""
        pages = (self._read("POST", "/api/rooms/query", body={"rooms": c}) for c in _chunks(rooms))
        return [RoomCounts.from_json(r) for page in pages for r in page["rooms"]]

    def user_rooms(self, user: str) -> UserRooms:
        """``GET /api/users/{user}/rooms``: the rooms each device of the user is in."""
        return UserRooms.from_json(self._read("GET", f"/api/users/{segment(user)}/rooms"))

    # ---- admin: users ----------------------------------------------------------------------

    def set_privacy(
        self,
        user: str,
        *,
        online: Audience | None = None,
        last_seen: Audience | None = None,
        token: str | None = None,
    ) -> None:
        """``PUT /api/users/{user}/privacy``: who may see the user online,
        and its last seen (``everyone``, ``contacts`` or ``nobody``)."""
        body = {k: v for k, v in (("online", online), ("last_seen", last_seen)) if v is not None}
        self._act("PUT", f"/api/users/{segment(user)}/privacy", token, body=body)

    def set_contacts(self, user: str, contacts: Iterable[str]) -> list[str]:
        """``PUT /api/users/{user}/contacts`` (admin): the users who count as
        the user's contacts; answers them sorted, without repeats."""
        d = self._operate(
            "PUT", f"/api/users/{segment(user)}/contacts", body={"contacts": list(contacts)}
        )
        return list(d["contacts"])

    def contacts(self, user: str) -> list[str]:
        """``GET /api/users/{user}/contacts`` (admin)."""
        return list(self._operate("GET", f"/api/users/{segment(user)}/contacts")["contacts"])

    def set_status(
        self,
        user: str,
        status: SettableStatus,
        text: str | None = None,
        *,
        until: int | datetime.datetime | None = None,
        token: str | None = None,
    ) -> Record:
        """``PUT /api/users/{user}/status``: sets the status and text, as the
        user's own ``status`` frame does. At ``until`` (epoch ms, or an aware
        datetime; at most 30 days ahead) it returns to ``online``. Answers
        the user's own record after the change."""
        body: dict[str, Any] = {"status": status}
        if text is not None:
            body["text"] = text
        if until is not None:
            body["until"] = _epoch_ms(until)
        return Record.from_json(
            self._act("PUT", f"/api/users/{segment(user)}/status", token, body=body)
        )

    # ---- admin: rooms ------------------------------------------------------------------------

    def set_members(self, room: str, users: Iterable[str]) -> MembersChanged:
        """``PUT /api/rooms/{room}/members`` (admin): the room's member list
        (``--room-policy members``) is exactly ``users``; the devices of
        users taken off it leave the room at once."""
        d = self._operate("PUT", f"/api/rooms/{segment(room)}/members", body={"users": list(users)})
        return MembersChanged.from_json(d)

    def add_member(self, room: str, user: str) -> MembersChanged:
        """``POST /api/rooms/{room}/members/{user}`` (admin): the user is on the list."""
        d = self._operate("POST", f"/api/rooms/{segment(room)}/members/{segment(user)}")
        return MembersChanged.from_json(d)

    def remove_member(self, room: str, user: str) -> UserRemoved:
        """``DELETE /api/rooms/{room}/members/{user}`` (admin), under every
        policy: every device of the user leaves the room at once, on every
        node; under ``members`` the user is off the list too."""
        d = self._operate("DELETE", f"/api/rooms/{segment(room)}/members/{segment(user)}")
        return UserRemoved.from_json(d)

    def members(
        self, room: str, *, limit: int | None = None, cursor: str | None = None
    ) -> MembersPage:
        """``GET /api/rooms/{room}/members`` (admin or service key): one page
        of the member list, sorted."""
        d = self._operate(
            "GET",
            f"/api/rooms/{segment(room)}/members",
            query={"limit": limit, "cursor": cursor},
            service=True,
        )
        return MembersPage.from_json(d)

    def iter_members(self, room: str, *, limit: int | None = None) -> Iterator[str]:
        """Every user on the room's member list, page after page."""

        def read(cursor: str | None) -> tuple[list[str], str | None]:
            page = self.members(room, limit=limit, cursor=cursor)
            return page.users, page.next_cursor

        return _paged(read)

    # ---- HTTP heartbeat devices ----------------------------------------------------------------

    def heartbeat(
        self, user: str, device: str, *, kind: DeviceKind | None = None, token: str | None = None
    ) -> Heartbeat:
        """``POST /api/users/{user}/devices/{device}/heartbeat``: claims or
        refreshes the lease of a device that holds no WebSocket (a socket
        holding the id is closed with ``4001``). Heartbeat again within the
        answer's ``heartbeat_ms``, or use :meth:`device`."""
        d = self._act(
            "POST",
            f"/api/users/{segment(user)}/devices/{segment(device)}/heartbeat",
            token,
            query={"kind": kind},
        )
        return Heartbeat(ttl_ms=d["ttl_ms"], heartbeat_ms=d["heartbeat_ms"])

    def remove_device(self, user: str, device: str, *, token: str | None = None) -> None:
        """``DELETE /api/users/{user}/devices/{device}``: the device leaves at
        once (offline if it was the user's last, out of its rooms), whatever
        holds it, a socket included."""
        self._act("DELETE", f"/api/users/{segment(user)}/devices/{segment(device)}", token)

    def device(
        self,
        user: str,
        device: str,
        *,
        kind: DeviceKind | None = None,
        token: str | None = None,
        on_error: Callable[[PresenceError], None] | None = None,
    ) -> HeartbeatDevice:
        """A device kept online by heartbeats from a thread while it runs:
        ``with client.device("alice", "build-bot", kind="bot"): ...``."""
        return HeartbeatDevice(self, user, device, kind=kind, token=token, on_error=on_error)

    # ---- the event feed --------------------------------------------------------------------------

    def events(self, cursor: str | None = None, *, limit: int | None = None) -> EventsPage:
        """``GET /api/events`` (service or admin key): one page of the feed,
        oldest first. ``cursor``: ``None`` from the oldest event kept,
        ``"now"`` none and a cursor from now on, else a ``next_cursor``."""
        d = self._operate(
            "GET", "/api/events", query={"cursor": cursor, "limit": limit}, service=True
        )
        return EventsPage.from_json(d)

    def feed(
        self,
        cursor: str | None = None,
        *,
        limit: int = 100,
        follow: bool = True,
        poll_interval: float = 1.0,
        on_lost: Callable[[int], None] | None = None,
    ) -> EventFeed:
        """The feed's events one by one from ``cursor``, as an iterator whose
        ``cursor`` attribute says where to resume (see :class:`EventFeed`)."""
        return EventFeed(
            self, cursor, limit=limit, follow=follow, poll_interval=poll_interval, on_lost=on_lost
        )


def _chunks(ids: Iterable[str]) -> Iterator[list[str]]:
    """``ids`` in lists of at most :data:`MAX_QUERY`."""
    ids = list(ids)
    for i in range(0, len(ids), MAX_QUERY):
        yield ids[i : i + MAX_QUERY]


def _paged(read: Callable[[str | None], tuple[list[T], str | None]]) -> Iterator[T]:
    """The items of every page, from the first: ``read(cursor)`` gives a
    page's items and the next page's cursor, ``None`` after the last."""
    cursor: str | None = None
    while True:
        items, cursor = read(cursor)
        yield from items
        if cursor is None:
            return


def _epoch_ms(when: int | datetime.datetime) -> int:
    if isinstance(when, datetime.datetime):
        if when.tzinfo is None:
            raise ValueError("until: a naive datetime is ambiguous; give it a tzinfo")
        return int(when.timestamp() * 1000)
    return int(when)
