"""Errors: each refusal is an exception of its status that carries the
server's code and message."""

from __future__ import annotations

import datetime

import pytest

import presence_client
from conftest import ADMIN_KEY, SERVICE_KEY, Node, Redis, free_port, start_node, unique
from presence_client import (
    BadRequest,
    ConnectionFailed,
    NotFound,
    PresenceClient,
    PresenceError,
    RateLimited,
    TooLarge,
    Unauthorized,
    Unavailable,
)


def test_bad_input_is_a_bad_request_with_the_servers_code(client: PresenceClient) -> None:
    with pytest.raises(BadRequest) as e:
        client.presence("has:colon")
    assert (e.value.status, e.value.code) == (400, "invalid_id")
    assert "found ':'" in e.value.message
    assert isinstance(e.value, PresenceError) and str(e.value).startswith("400 invalid_id: ")

    past = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=1)
    with pytest.raises(BadRequest) as e:
        client.set_status(unique("late"), "busy", until=past)
    assert e.value.code == "invalid_status"

    with pytest.raises(BadRequest) as e:
        client.online(limit=0)
    assert e.value.code == "bad_request"

    with pytest.raises(ValueError):
        client.set_status("u", "busy", until=datetime.datetime(2030, 1, 1))  # naive


def test_missing_or_wrong_keys_are_unauthorized(node: Node) -> None:
    for key in [None, "not-the-service-key-000"]:
        with pytest.raises(Unauthorized) as e:
            PresenceClient(node.url, service_key=key).events()
        assert (e.value.status, e.value.code) == (401, "unauthorized")
    # The service key reads; it is no admin key.
    reader = PresenceClient(node.url, service_key=SERVICE_KEY)
    assert reader.members(unique("team:x")).total == 0
    with pytest.raises(Unauthorized) as e:
        reader.set_contacts(unique("u"), [])
    assert e.value.code == "unauthorized"
    # The admin key alone reads too.
    admin = PresenceClient(node.url, admin_key=ADMIN_KEY)
    assert admin.presence(unique("u")).view == "service"


def test_too_many_is_too_large(client: PresenceClient) -> None:
    with pytest.raises(TooLarge) as e:
        client.set_members(unique("team:big"), [f"u{i}" for i in range(10_001)])
    assert (e.value.status, e.value.code) == (413, "too_many_users")


def test_beyond_the_read_budget_is_rate_limited_with_retry_after(redis: Redis) -> None:
    # Service reads: 1 user a second, and bursts of 1,000 (the least a burst
    # is): of a query of 2,000 users, the second request of 1,000 is over.
    with start_node(redis, "py-budget", ["--service-reads-per-sec", "1"]) as small:
        reader = PresenceClient(small.url, service_key=SERVICE_KEY)
        with pytest.raises(RateLimited) as e:
            reader.query([f"u{i}" for i in range(2_000)])
    assert (e.value.status, e.value.code) == (429, "rate_limited")
    assert e.value.retry_after is not None and e.value.retry_after > 0


def test_an_unknown_route_is_not_found(client: PresenceClient) -> None:
    with pytest.raises(NotFound) as e:
        client._public.request("GET", "/api/no-such-route")
    assert e.value.code == "not_found"


def test_no_server_is_a_connection_failure_like_unavailable() -> None:
    gone = PresenceClient(f"http://127.0.0.1:{free_port()}", timeout=2)
    with pytest.raises(Unavailable) as e:
        gone.presence("alice")
    assert isinstance(e.value, ConnectionFailed)
    assert (e.value.status, e.value.code) == (None, "unavailable")


def test_every_exception_is_exported() -> None:
    for name in [
        "BadRequest",
        "Unauthorized",
        "Forbidden",
        "NotFound",
        "Conflict",
        "TooLarge",
        "RateLimited",
        "Unavailable",
        "ConnectionFailed",
    ]:
        assert issubclass(getattr(presence_client, name), PresenceError)
