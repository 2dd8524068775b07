"""One JSON request over the standard library's urllib, its errors mapped
to the package's exceptions."""

from __future__ import annotations

import http.client
import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

from .errors import ConnectionFailed, PresenceError, error_for

Query = Mapping[str, "str | int | None"]


def segment(value: str) -> str:
    """``value`` as one path segment: ids may hold ``/``, ``?``, ``#``, ``%``."""
    return urllib.parse.quote(value, safe="")


class Transport:
    """Sends requests to one base URL (``http://host:port``, optionally with a
    path prefix when the nodes sit behind a proxy under one)."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float,
        ssl_context: ssl.SSLContext | None,
        headers: Mapping[str, str],
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.ssl_context = ssl_context
        self.headers = dict(headers)

    def request(
        self,
        method: str,
        path: str,
        *,
        bearer: str | None = None,
        query: Query | None = None,
        body: Any = None,
    ) -> Any:
        """The answer's JSON (``None`` for an empty one, as ``204``); raises a
        :class:`PresenceError` for any other answer than ``2xx``."""
        url = self.base_url + path
        if query:
            pairs = {k: str(v) for k, v in query.items() if v is not None}
            if pairs:
                url += "?" + urllib.parse.urlencode(pairs)
        headers = {"Accept": "application/json", **self.headers}
        data = None
        if body is not None:
            data = json.dumps(body, separators=(",", ":")).encode()
            headers["Content-Type"] = "application/json"
        if bearer:
            headers["Authorization"] = f"Bearer {bearer}"
        req = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout, context=self.ssl_context) as res:
                raw = res.read()
        except urllib.error.HTTPError as e:
            raise _refusal(e) from None
        except (OSError, http.client.HTTPException) as e:
            # No answer, or half of one: refused, dropped, timed out (URLError is an OSError).
            reason = getattr(e, "reason", e)
            raise ConnectionFailed(None, "unavailable", f"{method} {url}: {reason}") from e
        return json.loads(raw) if raw else None


def _refusal(e: urllib.error.HTTPError) -> PresenceError:
    """The exception for an error answer: its JSON ``{code, message}``, or
    the status alone when the body is not one (a proxy's page)."""
    try:
        raw = e.read()
    except OSError:
        raw = b""
    code, message = f"http_{e.code}", raw.decode("utf-8", "replace")[:500] or str(e.reason)
    try:
        body = json.loads(raw)
        if isinstance(body, dict) and isinstance(body.get("code"), str):
            code, message = body["code"], str(body.get("message", ""))
    except ValueError:
        pass
    retry_after = None
    header = e.headers.get("Retry-After") if e.headers else None
    if header:
        try:
            retry_after = float(header)
        except ValueError:
            pass
    return error_for(e.code, code, message, retry_after)
