"""The event feed's pull API as an iterator that keeps its cursor."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from .records import Event

if TYPE_CHECKING:
    from .client import PresenceClient


class EventFeed(Iterator[Event]):
    """Yields the feed's events one by one, oldest first, reading a page of
    ``limit`` at a time from ``GET /api/events``.

    ``cursor`` is where to resume after the event just yielded has been
    handled: store it with what you did with the event, and pass it to
    :meth:`PresenceClient.feed` after a restart. It moves a page at a time
    (the cursor a page was read from, then its ``next_cursor`` once its last
    event is yielded), so a resume may repeat the rest of a page (drop an
    ``id`` you have already handled) and never skips an event.

    With ``follow`` (the default) it waits ``poll_interval`` seconds when it
    is caught up and asks again, until :meth:`close`; without, it stops at
    the first empty page. An error (the node down, a bad cursor) ends the
    iteration with the exception; ``cursor`` still says where to resume.
    """

    def __init__(
        self,
        client: PresenceClient,
        cursor: str | None,
        *,
        limit: int,
        follow: bool,
        poll_interval: float,
        on_lost: Callable[[int], None] | None,
    ) -> None:
        #: Where to resume after the event last yielded: ``None`` is the
        #: oldest event kept, ``"now"`` the events from the first read on.
        self.cursor = cursor
        #: Events that went before this iterator read them (retention,
        #: bounds), summed over its pages: resync the users you care about.
        self.lost = 0
        self._client = client
        self._limit = limit
        self._follow = follow
        self._poll = poll_interval
        self._on_lost = on_lost
        self._closed = threading.Event()
        self._events = self._run()

    def __iter__(self) -> EventFeed:
        return self

    def __next__(self) -> Event:
        return next(self._events)

    def close(self) -> None:
        """Ends the iteration (from any thread): at once if it waits for
        events, else after the page under way."""
        self._closed.set()

    def _run(self) -> Iterator[Event]:
        while not self._closed.is_set():
            page = self._client.events(self.cursor, limit=self._limit)
            if page.lost:
                self.lost += page.lost
                if self._on_lost is not None:
                    self._on_lost(page.lost)
            if not page.events:
                self.cursor = page.next_cursor
                if not self._follow or self._closed.wait(self._poll):
                    return
                continue
            last = len(page.events) - 1
            for i, event in enumerate(page.events):
                if i == last:
                    # Handled once the caller asks for the next: past the page.
                    self.cursor = page.next_cursor
                yield event
