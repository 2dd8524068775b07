"""Webhook signatures: ``Presence-Signature: t=<unix seconds>,v1=<hex>``,
where ``<hex>`` is HMAC-SHA256 with the secret over ``<t>.<raw body>``
(docs/events.md, "Verifying the signature"). The room-join questions of
``--room-policy proxy`` are signed the same way, with their own secret."""

from __future__ import annotations

import hashlib
import hmac
import json
import time

from .records import WebhookBatch

#: The header that carries the signature.
SIGNATURE_HEADER = "Presence-Signature"


def _secret_bytes(secret: str | bytes) -> bytes:
    return secret.encode() if isinstance(secret, str) else secret


def _hex(secret: str | bytes, t: str, body: bytes) -> str:
    mac = hmac.new(_secret_bytes(secret), t.encode() + b"." + body, hashlib.sha256)
    return mac.hexdigest()


def verify(
    body: bytes,
    header: str | None,
    secret: str | bytes,
    tolerance: int = 300,
    *,
    now: float | None = None,
) -> bool:
    """True when ``header`` (the ``Presence-Signature`` value) signs ``body``
    (the raw bytes, before any JSON parsing) with ``secret``, at a time
    within ``tolerance`` seconds of ``now`` (default: this clock), so that a
    captured request cannot be replayed later. The compare takes the same
    time whatever the signature. A missing or malformed header is False.
    """
    if not header or not isinstance(body, (bytes, bytearray, memoryview)):
        return False
    t = ""
    signatures = []
    for part in header.split(","):
        key, sep, value = part.strip().partition("=")
        if not sep:
            continue
        if key == "t":
            t = value
        elif key == "v1":
            signatures.append(value)
    if not (t.isascii() and t.isdigit()) or not signatures:
        return False
    clock = time.time() if now is None else now
    if abs(clock - int(t)) > tolerance:
        return False
    expected = _hex(secret, t, bytes(body))
    # Every v1 is compared, so a header with several tells nothing by its time.
    matched = False
    for sig in signatures:
        matched |= hmac.compare_digest(expected, sig)
    return matched


def sign(body: bytes, secret: str | bytes, t: int | None = None) -> str:
    """The ``Presence-Signature`` value the server would send for ``body``
    at ``t`` (default: now): to test your own webhook endpoint."""
    t = int(time.time()) if t is None else t
    return f"t={t},v1={_hex(secret, str(t), body)}"


def parse_webhook(body: bytes | str) -> WebhookBatch:
    """The batch of a webhook body. Verify it first."""
    return WebhookBatch.from_json(json.loads(body))
