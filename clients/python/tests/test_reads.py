"""The service reads: a user, the bulk query, the online list and its
cursor, as the truth (the service view) and as an anonymous reader."""

from __future__ import annotations

import datetime

from conftest import Node, unique, wait_for
from presence_client import OnlineUser, PresenceClient, Record, UserPresence


def test_a_user_with_its_devices(client: PresenceClient) -> None:
    user = unique("reader")
    assert client.presence(user) == UserPresence(
        user=user,
        status="offline",
        devices=0,
        last_seen=None,
        text=None,
        until=None,
        kinds=(),
        idle=False,
        device_list=(),
        view="service",
    )
    client.heartbeat(user, "laptop", kind="desktop")
    client.heartbeat(user, "phone", kind="mobile")
    got = client.presence(user)
    assert got.online and got.status == "online" and got.devices == 2
    assert got.kinds == ("desktop", "mobile") and got.view == "service"
    assert [(d.device, d.kind, d.node) for d in got.device_list] == [
        ("laptop", "desktop", "py-test"),
        ("phone", "mobile", "py-test"),
    ]
    assert all(d.expires_in_ms and d.expires_in_ms > 0 for d in got.device_list)
    client.remove_device(user, "laptop")
    client.remove_device(user, "phone")
    gone = client.presence(user)
    assert not gone.online and gone.devices == 0 and gone.last_seen is not None


def test_ids_that_need_escaping_in_a_path(client: PresenceClient) -> None:
    user = unique("a/b?c#d%e")
    client.heartbeat(user, "dev/1")
    got = client.presence(user)
    assert got.user == user and [d.device for d in got.device_list] == ["dev/1"]
    client.remove_device(user, "dev/1")
    assert client.presence(user).devices == 0


def test_the_bulk_query_keeps_the_order_and_splits_long_lists(client: PresenceClient) -> None:
    on, off = unique("q-on"), unique("q-off")
    client.heartbeat(on, "d")
    got = client.query([off, on])
    assert [r.user for r in got] == [off, on]
    assert [r.status for r in got] == ["offline", "online"]
    assert isinstance(got[0], Record)
    # 2,500 users: three requests of at most 1,000 (the server refuses more).
    many = [unique("q") for _ in range(2_499)] + [on]
    records = client.query(many)
    assert [r.user for r in records] == many
    assert records[-1].online and not any(r.online for r in records[:-1])
    client.remove_device(on, "d")


def test_the_online_list_pages_with_its_cursor(client: PresenceClient) -> None:
    users = [unique(f"listed{i}") for i in range(5)]
    for u in users:
        client.heartbeat(u, "d")
    first = client.online(limit=2)
    assert len(first.users) <= 2 and first.next_cursor is not None
    assert all(isinstance(u, OnlineUser) and u.active_at > 0 for u in first.users)
    second = client.online(limit=2, cursor=first.next_cursor)
    assert not {u.user for u in first.users} & {u.user for u in second.users}
    everyone = [u.user for u in client.iter_online(limit=2)]
    assert len(everyone) == len(set(everyone))
    assert set(users) <= set(everyone)
    for u in users:
        client.remove_device(u, "d")
    # Recently seen: after the ones online, those last seen within the window.
    seen = {u.user: u for u in client.iter_online(limit=3, seen_within_ms=60_000)}
    assert set(users) <= set(seen)
    assert all(seen[u].status == "offline" and seen[u].last_seen for u in users)
    assert not set(users) & {u.user for u in client.iter_online()}


def test_privacy_hides_from_viewers_not_from_the_service(
    client: PresenceClient, node: Node
) -> None:
    user = unique("private")
    client.heartbeat(user, "d")
    anonymous = PresenceClient(node.url)  # dev auth: an anonymous viewer
    assert anonymous.presence(user).online and anonymous.presence(user).view is None
    client.set_privacy(user, online="nobody", last_seen="nobody")
    hidden = anonymous.presence(user)
    assert hidden.status == "offline" and hidden.devices == 0 and hidden.device_list == ()
    assert client.presence(user).online  # the truth
    client.set_privacy(user, online="everyone")
    assert anonymous.presence(user).online
    client.remove_device(user, "d")
    assert anonymous.presence(user).last_seen is None  # last_seen: still nobody


def test_contacts_and_privacy_for_contacts(client: PresenceClient, node: Node) -> None:
    user, friend, stranger = unique("owner"), unique("friend"), unique("stranger")
    assert client.contacts(user) == []
    assert client.set_contacts(user, [friend, friend, "zed"]) == sorted([friend, "zed"])
    assert client.contacts(user) == sorted([friend, "zed"])
    client.heartbeat(user, "d")
    client.set_privacy(user, online="contacts")
    # Under dev auth a viewer is ?viewer=: read as the friend and as a stranger.
    read = PresenceClient(node.url)._public.request
    assert read("GET", f"/api/presence/{user}", query={"viewer": friend})["status"] == "online"
    assert read("GET", f"/api/presence/{user}", query={"viewer": stranger})["status"] == "offline"
    client.remove_device(user, "d")


def test_status_with_until_returns_to_online(client: PresenceClient) -> None:
    user = unique("busy")
    client.heartbeat(user, "d")
    ends = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=1)
    own = client.set_status(user, "busy", "in a call", until=ends)
    assert (own.status, own.text) == ("busy", "in a call")
    assert own.until == int(ends.timestamp() * 1000)
    assert client.presence(user).status == "busy"

    def ended() -> UserPresence | None:
        record = client.presence(user)
        return record if record.status == "online" else None

    back = wait_for("the status to end", ended)
    assert back.text is None and back.until is None
    # An int is epoch ms; invisible is the service view's truth.
    far = int(
        (datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=1)).timestamp()
        * 1000
    )
    assert client.set_status(user, "invisible", until=far).until == far
    assert client.presence(user).status == "invisible"
    assert client.query([user])[0].status == "invisible"
    client.remove_device(user, "d")


def test_info(client: PresenceClient) -> None:
    info = client.info()
    assert (info.server, info.auth, info.heartbeat_ms) == ("presence-server", "dev", 500)


def test_the_idle_mark_is_read() -> None:
    from presence_client.records import DeviceInfo, Record

    d = {
        "user": "bob",
        "status": "online",
        "devices": 1,
        "last_seen": None,
        "text": None,
        "until": None,
        "kinds": ["mobile"],
        "idle": True,
    }
    assert Record.from_json(d).idle is True
    assert Record.from_json({**d, "idle": False}).idle is False
    del d["idle"]
    assert Record.from_json(d).idle is False
    phone = {
        "device": "phone",
        "node": "n1",
        "connected_at": 1,
        "expires_in_ms": 900,
        "kind": "mobile",
        "paused": True,
    }
    assert DeviceInfo.from_json(phone).paused is True
