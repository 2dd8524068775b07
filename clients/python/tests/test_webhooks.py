"""Webhook signatures: the documented test vector, the checks verify makes,
and real webhooks of a node, received by a small receiver and verified."""

from __future__ import annotations

import json

import presence_client
from conftest import WEBHOOK_SECRET, Delivery, Receiver, unique, wait_for
from presence_client import PresenceClient, parse_webhook, sign, verify

# docs/events.md, "Verifying the signature".
VECTOR_SECRET = "whsec_0123456789abcdef"
VECTOR_BODY = b'{"a":1}'
VECTOR_HEADER = "t=1700000000,v1=9f5e37cdc7ea587c7c02062d93283cad000d66a831b2a1676418696db47ed6c2"


def test_the_documented_test_vector_verifies() -> None:
    assert verify(VECTOR_BODY, VECTOR_HEADER, VECTOR_SECRET, 300, now=1700000000)
    assert sign(VECTOR_BODY, VECTOR_SECRET, 1700000000) == VECTOR_HEADER
    assert verify(VECTOR_BODY, VECTOR_HEADER, VECTOR_SECRET.encode(), 300, now=1700000000)


def test_verify_refuses_what_does_not_match() -> None:
    now = 1700000000
    assert not verify(b'{"a":2}', VECTOR_HEADER, VECTOR_SECRET, 300, now=now)  # body
    assert not verify(VECTOR_BODY, VECTOR_HEADER, "whsec_another_secret", 300, now=now)
    assert not verify(
        VECTOR_BODY, VECTOR_HEADER.replace("v1=9f", "v1=8f"), VECTOR_SECRET, 300, now=now
    )
    # The time is signed: another t is another signature.
    assert not verify(
        VECTOR_BODY, VECTOR_HEADER.replace("1700000000", "1700000001"), VECTOR_SECRET, 300, now=now
    )
    # Replays: outside the tolerance, either way.
    assert verify(VECTOR_BODY, VECTOR_HEADER, VECTOR_SECRET, 300, now=now + 300)
    assert not verify(VECTOR_BODY, VECTOR_HEADER, VECTOR_SECRET, 300, now=now + 301)
    assert not verify(VECTOR_BODY, VECTOR_HEADER, VECTOR_SECRET, 300, now=now - 301)
    # Malformed or missing headers.
    for header in [
        None,
        "",
        "t=1700000000",
        "v1=9f5e",
        "t=abc,v1=9f5e",
        "t=-1700000000,v1=x",
        "garbage",
    ]:
        assert not verify(VECTOR_BODY, header, VECTOR_SECRET, 300, now=now), header
    # Several v1: any one that matches (a secret being rotated).
    two = f"t=1700000000,v1={'0' * 64},v1={VECTOR_HEADER.split('v1=')[1]}"
    assert verify(VECTOR_BODY, two, VECTOR_SECRET, 300, now=now)


def deliveries_for(receiver: Receiver, user: str, kind: str) -> list[Delivery]:
    return [
        d
        for d in receiver.received()
        if any(
            e.get("user") == user and e.get("type") == kind for e in json.loads(d.body)["events"]
        )
    ]


def test_a_real_webhook_verifies_and_a_tampered_one_does_not(
    client: PresenceClient, receiver: Receiver
) -> None:
    user = unique("hooked")
    client.heartbeat(user, "phone", kind="mobile")
    delivery = wait_for(
        f"a webhook with {user}'s online", lambda: deliveries_for(receiver, user, "online")
    )[0]
    assert delivery.signature is not None
    assert verify(delivery.body, delivery.signature, WEBHOOK_SECRET, 300)

    batch = parse_webhook(delivery.body)
    assert batch.node == "py-test"
    online = [e for e in batch.events if e.user == user]
    assert [e.type for e in online] == ["online"]
    assert online[0].status == "online" and online[0].kinds == ("mobile",)
    assert online[0].id == f"{user}:{online[0].seq}"

    tampered = delivery.body.replace(b'"status":"online"', b'"status":"busy"', 1)
    assert tampered != delivery.body
    assert not verify(tampered, delivery.signature, WEBHOOK_SECRET, 300)
    assert not verify(delivery.body, delivery.signature, "not-the-webhook-secret", 300)
    assert not verify(
        delivery.body,
        delivery.signature,
        WEBHOOK_SECRET,
        300,
        now=float(delivery.signature.split(",")[0][2:]) + 301,
    )

    client.remove_device(user, "phone")
    offline = wait_for(
        f"a webhook with {user}'s offline", lambda: deliveries_for(receiver, user, "offline")
    )[0]
    assert verify(offline.body, offline.signature, WEBHOOK_SECRET, 300)
    gone = [e for e in parse_webhook(offline.body).events if e.user == user]
    assert gone[0].type == "offline" and gone[0].devices == 0 and gone[0].last_seen
    assert gone[0].seq > online[0].seq


def test_the_header_name_is_the_servers() -> None:
    assert presence_client.SIGNATURE_HEADER == "Presence-Signature"
