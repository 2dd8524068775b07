"""docs/examples/python_backend.py, run: the node's webhooks reach its
endpoint, which verifies them and keeps last seen; its route reads presence
through the package; a forged webhook is refused; and a fresh copy catches
up from the event feed alone."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from conftest import SERVICE_KEY, WEBHOOK_SECRET, Example, Node, unique, wait_for
from presence_client import PresenceClient, sign


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as res:
        return json.loads(res.read())


def post(url: str, body: bytes, signature: str | None) -> int:
    headers = {"Content-Type": "application/json"}
    if signature is not None:
        headers["Presence-Signature"] = signature
    req = urllib.request.Request(url, data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as res:
            return int(res.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def test_the_example_keeps_last_seen_from_the_webhooks(
    client: PresenceClient, example: Example, node: Node
) -> None:
    user = unique("carol")
    client.heartbeat(user, "phone", kind="mobile")
    rows = example.app.extensions["last_seen"]
    wait_for("the webhook's online row", lambda: (rows.row(user) or {}).get("status") == "online")
    assert rows.row(user)["last_seen"] is None
    shown = get(f"{example.url}/users/{user}/presence")
    assert shown == {
        "user": user,
        "online": True,
        "status": "online",
        "kinds": ["mobile"],
        "last_seen": None,
    }

    client.remove_device(user, "phone")
    truth = client.presence(user).last_seen
    assert truth is not None
    wait_for(
        "the webhook's offline row",
        lambda: get(f"{example.url}/users/{user}/presence")["last_seen"] == truth,
    )
    assert get(f"{example.url}/users/{user}/presence")["online"] is False

    # An id the server refuses comes back as the server's code.
    req = urllib.request.Request(f"{example.url}/users/bad:id/presence")
    try:
        urllib.request.urlopen(req, timeout=10)
        raise AssertionError("a bad id was read")
    except urllib.error.HTTPError as e:
        assert e.code == 400 and json.loads(e.read())["error"] == "invalid_id"


def test_the_example_refuses_forged_webhooks(example: Example) -> None:
    user = unique("forged")
    body = json.dumps(
        {
            "node": "x",
            "events": [
                {
                    "id": f"{user}:99",
                    "type": "online",
                    "at": 1,
                    "seq": 99,
                    "user": user,
                    "status": "online",
                    "devices": 1,
                    "last_seen": None,
                    "text": None,
                    "since": 0,
                    "until": None,
                    "kinds": [],
                }
            ],
        }
    ).encode()
    hook = f"{example.url}/hooks/presence"
    assert post(hook, body, None) == 401
    assert post(hook, body, sign(body, "not-the-webhook-secret")) == 401
    tampered = body.replace(b'"online"', b'"busy"', 1)
    assert post(hook, tampered, sign(body, WEBHOOK_SECRET)) == 401
    assert example.app.extensions["last_seen"].row(user) is None
    # Signed with the secret: taken.
    assert post(hook, body, sign(body, WEBHOOK_SECRET)) == 204
    assert example.app.extensions["last_seen"].row(user)["seq"] == 99


def test_a_fresh_example_catches_up_from_the_feed(
    client: PresenceClient, example: Example, node: Node, tmp_path: Path
) -> None:
    user = unique("dave")
    client.heartbeat(user, "laptop")
    client.remove_device(user, "laptop")
    truth = client.presence(user).last_seen
    # A new app on an empty database, with the node up: it reads the whole feed.
    app = example.module.create_app(
        node.url, SERVICE_KEY, WEBHOOK_SECRET, str(tmp_path / "fresh.sqlite3")
    )
    last_seen = app.extensions["last_seen"]
    row = last_seen.row(user)
    assert row is not None and (row["status"], row["last_seen"]) == ("offline", truth)
    # The cursor is stored: a second catch-up reads only what came since,
    # not the whole feed again.
    assert last_seen.catch_up(client) < len(list(client.feed(follow=False)))
    client.heartbeat(user, "laptop")
    assert last_seen.catch_up(client) >= 1
    assert last_seen.row(user)["status"] == "online"
    client.remove_device(user, "laptop")
    # The route works on the test client too.
    res = app.test_client().get(f"/users/{user}/presence")
    assert res.status_code == 200 and res.get_json()["online"] is False
