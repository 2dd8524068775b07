"""The exceptions: one per HTTP status the server answers with, each
carrying the server's error ``code`` and ``message`` (docs/events.md,
"Error codes")."""

from __future__ import annotations


class PresenceError(Exception):
    """A request the server refused, or one that reached no server.

    ``status`` is the HTTP status (``None`` when no answer came), ``code``
    the server's error code (``invalid_id``, ``unauthorized``,
    ``too_many_users``...), ``message`` its text for humans.
    """

    def __init__(
        self,
        status: int | None,
        code: str,
        message: str,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"{code}: {message}" if status is None else f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        #: Seconds to wait before trying again (``Retry-After``), on a 429.
        self.retry_after = retry_after


class BadRequest(PresenceError):
    """400: bad input (``bad_request``, ``invalid_id``, ``invalid_status``...)."""


class Unauthorized(PresenceError):
    """401: no valid credentials (a missing or wrong key or token)."""


class Forbidden(PresenceError):
    """403: credentials that do not allow the call (another user's token,
    the admin API off, a room's policy)."""


class NotFound(PresenceError):
    """404: no such route (for example the event feed turned off)."""


class Conflict(PresenceError):
    """409: ``too_many_devices`` on a heartbeat, or a device claimed meanwhile."""


class TooLarge(PresenceError):
    """413: more users or rooms than one request may name, or a body too large."""


class RateLimited(PresenceError):
    """429: beyond a read budget; ``retry_after`` says when to try again."""


class Unavailable(PresenceError):
    """503: Redis unreachable, or the node not ready: retry later."""


class ConnectionFailed(Unavailable):
    """No answer at all: the node is down, unreachable, or did not answer in
    time. ``status`` is ``None`` and ``code`` is ``unavailable``: like a 503,
    the call may be tried again (on another node)."""


_BY_STATUS: dict[int, type[PresenceError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: TooLarge,
    429: RateLimited,
    503: Unavailable,
}


def error_for(
    status: int, code: str, message: str, retry_after: float | None = None
) -> PresenceError:
    """The exception for an answer of ``status``."""
    cls = _BY_STATUS.get(status, PresenceError)
    return cls(status, code, message, retry_after)
