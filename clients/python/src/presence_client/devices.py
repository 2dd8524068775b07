"""An HTTP heartbeat device kept online by a background thread."""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING

from .errors import PresenceError
from .records import DeviceKind, Heartbeat

if TYPE_CHECKING:
    from .client import PresenceClient


class HeartbeatDevice:
    """A device that holds no WebSocket (a bot, a backend acting for a
    user, a phone app in the background), kept online by heartbeats every
    ``heartbeat_ms`` the server asks for, from a daemon thread.

    Use it as a context manager, or call :meth:`start` and :meth:`stop`.
    :meth:`start` sends the first heartbeat itself and raises its error; a
    later heartbeat that fails is kept in ``error``, passed to ``on_error``,
    and tried again a second later (the lease outlives two lost heartbeats).
    :meth:`stop` ends the thread and, unless ``leave=False``, makes the
    device leave at once (``DELETE``); otherwise it goes offline when its
    lease lapses, ``ttl_ms`` after the last heartbeat.
    """

    def __init__(
        self,
        client: PresenceClient,
        user: str,
        device: str,
        *,
        kind: DeviceKind | None = None,
        token: str | None = None,
        on_error: Callable[[PresenceError], None] | None = None,
    ) -> None:
        self.user = user
        self.device = device
        self.kind: DeviceKind | None = kind
        #: The last heartbeat's error, ``None`` once one succeeds again.
        self.error: PresenceError | None = None
        #: The last answer: the lease's TTL and the heartbeat period.
        self.lease: Heartbeat | None = None
        self._client = client
        self._token = token
        self._on_error = on_error
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def beat(self) -> Heartbeat:
        """Sends one heartbeat now."""
        self.lease = self._client.heartbeat(
            self.user, self.device, kind=self.kind, token=self._token
        )
        self.error = None
        return self.lease

    def start(self) -> HeartbeatDevice:
        """Brings the device online (raising the first heartbeat's error)
        and keeps it so."""
        if self._thread is not None:
            return self
        self.beat()
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, name=f"presence-heartbeat-{self.user}/{self.device}", daemon=True
        )
        self._thread.start()
        return self

    def stop(self, leave: bool = True) -> None:
        """Stops the heartbeats; with ``leave``, the device leaves at once."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if leave:
            self._client.remove_device(self.user, self.device, token=self._token)

    def _run(self) -> None:
        while True:
            period = (self.lease.heartbeat_ms if self.lease else 15_000) / 1000
            wait = period if self.error is None else min(1.0, period)
            if self._stop.wait(wait):
                return
            try:
                self.beat()
            except PresenceError as e:
                self.error = e
                if self._on_error is not None:
                    self._on_error(e)

    def __enter__(self) -> HeartbeatDevice:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
