"""Nodes that serve the admin key only on --internal-listen: with admin_url
the admin calls, the user calls made with the admin key and the event feed
go there, and the reads stay on the public address."""

from __future__ import annotations

import pytest

from conftest import ADMIN_KEY, SERVICE_KEY, Redis, free_port, start_node, unique
from presence_client import NotFound, PresenceClient


def test_admin_url_takes_the_calls_the_public_address_does_not_serve(redis: Redis) -> None:
    internal = f"127.0.0.1:{free_port()}"
    with start_node(redis, "py-internal", ["--internal-listen", internal]) as node:
        client = PresenceClient(
            node.url,
            service_key=SERVICE_KEY,
            admin_key=ADMIN_KEY,
            admin_url=f"http://{internal}",
        )
        user = unique("split")
        start = client.events("now").next_cursor
        assert client.set_contacts(user, ["bob"]) == ["bob"]
        client.heartbeat(user, "d", kind="bot")  # the admin key, on the internal address
        assert client.presence(user).online  # the service key, on the public one
        assert client.members(unique("team:x")).total == 0
        assert [e.type for e in client.events(start).events if e.user == user] == ["online"]
        client.remove_device(user, "d")

        # Without admin_url: the public address has no admin API, nor the feed.
        public_only = PresenceClient(node.url, service_key=SERVICE_KEY, admin_key=ADMIN_KEY)
        with pytest.raises(NotFound) as e:
            public_only.set_contacts(user, [])
        assert e.value.code == "not_found"
        with pytest.raises(NotFound):
            public_only.events()
