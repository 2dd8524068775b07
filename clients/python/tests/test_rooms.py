"""Rooms: the reads (members, counts, a user's rooms) and the admin calls
(member lists, removing a user), with real WebSocket devices in the rooms."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import websocket  # websocket-client, a test dependency only

from conftest import DEADLINE, Node, unique
from presence_client import Forbidden, PresenceClient, RoomPage


class Socket:
    """One WebSocket device under dev auth."""

    def __init__(self, node: Node, user: str, device: str) -> None:
        url = node.url.replace("http://", "ws://") + f"/ws?user={user}&device={device}"
        self.ws = websocket.create_connection(url, timeout=DEADLINE)
        assert self.next("hello")["user"] == user

    def send(self, frame: dict[str, Any]) -> None:
        self.ws.send(json.dumps(frame))

    def next(self, kind: str, **fields: Any) -> dict[str, Any]:
        """The next frame of type ``kind`` with these fields (others skipped)."""
        end = time.monotonic() + DEADLINE
        while time.monotonic() < end:
            frame = json.loads(self.ws.recv())
            if frame.get("type") == kind and all(frame.get(k) == v for k, v in fields.items()):
                return dict(frame)
        pytest.fail(f"no {kind} frame with {fields}")

    def join(self, room: str, state: dict[str, Any] | None = None) -> dict[str, Any]:
        self.send({"type": "join", "room": room, "state": state or {}})
        end = time.monotonic() + DEADLINE
        while time.monotonic() < end:
            frame = json.loads(self.ws.recv())
            if frame.get("room") == room and frame.get("type") in ("room", "error"):
                return dict(frame)
        pytest.fail(f"no answer to the join of {room}")

    def close(self) -> None:
        self.ws.close()


@pytest.fixture
def sockets(node: Node) -> Iterator[Any]:
    opened: list[Socket] = []

    def open_socket(user: str, device: str) -> Socket:
        s = Socket(node, user, device)
        opened.append(s)
        return s

    yield open_socket
    for s in opened:
        s.close()


def test_room_reads(client: PresenceClient, sockets: Any) -> None:
    room = unique("doc")
    alice, bob = unique("alice"), unique("bob")
    a = sockets(alice, "web")
    assert a.join(room, {"page": 1})["type"] == "room"
    b1, b2 = sockets(bob, "phone"), sockets(bob, "laptop")
    b1.join(room)
    b2.join(room, {"page": 7})

    page = client.room(room)
    assert isinstance(page, RoomPage) and page.view == "service"
    assert (page.room, page.users, page.devices, page.next_cursor) == (room, 2, 3, None)
    assert [m.user for m in page.members] == sorted([alice, bob])
    members = {m.user: m for m in page.members}
    assert [(d.device, d.state) for d in members[alice].devices] == [("web", {"page": 1})]
    assert [(d.device, d.state) for d in members[bob].devices] == [
        ("laptop", {"page": 7}),
        ("phone", {}),
    ]
    assert all(d.joined_at > 0 for m in page.members for d in m.devices)

    # Paged by user: one user a page.
    first = client.room(room, limit=2)
    assert len(first.members) == 1 and first.next_cursor is not None
    assert [m.user for m in client.iter_room(room, limit=2)] == sorted([alice, bob])

    empty = unique("empty")
    counts = client.rooms([room, empty, room])
    assert [(c.room, c.users, c.devices) for c in counts] == [
        (room, 2, 3),
        (empty, 0, 0),
        (room, 2, 3),
    ]
    assert client.user_rooms(bob).rooms == {room}
    assert {d.device for d in client.user_rooms(bob).devices} == {"phone", "laptop"}
    assert client.user_rooms(unique("nobody")).devices == ()


def test_member_lists_and_removal(client: PresenceClient, sockets: Any) -> None:
    room = unique("team:crew")  # --room-policy 'team:*=members'
    alice, bob = unique("alice"), unique("bob")
    changed = client.set_members(room, [alice, alice])
    assert (changed.room, changed.users, changed.removed) == (room, 1, ())
    a = sockets(alice, "web")
    assert a.join(room)["type"] == "room"
    b = sockets(bob, "web")
    refused = b.join(room)
    assert (refused["type"], refused["code"]) == ("error", "forbidden")

    assert client.add_member(room, bob).users == 2
    assert b.join(room)["type"] == "room"
    assert client.members(room).users == sorted([alice, bob])
    first = client.members(room, limit=1)
    assert first.total == 2 and len(first.users) == 1 and first.next_cursor is not None
    assert list(client.iter_members(room, limit=1)) == sorted([alice, bob])

    # A new list without bob: his device leaves the room at once.
    swapped = client.set_members(room, [alice])
    assert swapped.users == 1 and swapped.removed == (f"{bob}:web",)
    assert b.next("error", code="removed", room=room)
    assert [m.user for m in client.room(room).members] == [alice]

    # Removing a user: its devices leave, and it is off the list.
    removed = client.remove_member(room, alice)
    assert (removed.user, removed.devices, removed.listed) == (alice, ("web",), True)
    assert a.next("error", code="removed", room=room)
    assert client.room(room).users == 0 and client.members(room).total == 0


def test_a_room_read_without_a_key_follows_the_policy(node: Node) -> None:
    anonymous = PresenceClient(node.url)
    with pytest.raises(Forbidden) as refused:
        anonymous.room(unique("team:closed"))
    assert refused.value.code == "forbidden" and refused.value.status == 403
    assert anonymous.room(unique("doc")).view is None
