"""HTTP heartbeat devices: one heartbeat, and a device kept online by the
package's thread past its lease, leaving at once when it stops."""

from __future__ import annotations

import time

import pytest

from conftest import HEARTBEAT_MS, unique, wait_for
from presence_client import BadRequest, PresenceClient, PresenceError


def test_a_heartbeat_claims_a_lease(client: PresenceClient) -> None:
    user = unique("beat")
    lease = client.heartbeat(user, "bot", kind="bot")
    assert (lease.heartbeat_ms, lease.ttl_ms) == (HEARTBEAT_MS, 3 * HEARTBEAT_MS)
    assert client.presence(user).kinds == ("bot",)
    # Without heartbeats the lease lapses: offline within ttl + 1 s.
    wait_for(
        "the lease to lapse",
        lambda: client.presence(user).devices == 0,
        deadline=lease.ttl_ms / 1000 + 5,
    )


def test_a_device_stays_online_while_its_thread_runs(client: PresenceClient) -> None:
    user = unique("kept")
    errors: list[PresenceError] = []
    with client.device(user, "background", kind="mobile", on_error=errors.append) as device:
        assert device.lease is not None and device.lease.heartbeat_ms == HEARTBEAT_MS
        # Three leases long: a device that missed its heartbeats would lapse.
        end = time.monotonic() + 3 * device.lease.ttl_ms / 1000
        while time.monotonic() < end:
            got = client.presence(user)
            assert got.online and [d.device for d in got.device_list] == ["background"]
            time.sleep(0.1)
        assert device.error is None and errors == []
    # Leaving is at once, not at the lease's end.
    got = client.presence(user)
    assert got.devices == 0 and got.last_seen is not None


def test_a_device_that_stops_without_leaving_lapses(client: PresenceClient) -> None:
    user = unique("lapse")
    device = client.device(user, "d").start()
    assert client.presence(user).online
    device.stop(leave=False)
    assert client.presence(user).online
    wait_for("the lease to lapse", lambda: client.presence(user).devices == 0)


def test_a_device_whose_first_heartbeat_fails_raises(client: PresenceClient) -> None:
    with pytest.raises(BadRequest) as refused:
        client.device(unique("bad"), "d", kind="toaster").start()  # type: ignore[arg-type]
    assert refused.value.code == "bad_request"
