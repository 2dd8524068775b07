"""The event feed: one page, and the iterator that keeps its cursor, on a
real node and, for the exact cursor after each event, on scripted pages."""

from __future__ import annotations

import threading
from typing import Any, cast

import pytest

from conftest import unique, wait_for
from presence_client import BadRequest, Event, EventsPage, PresenceClient


def transitions(client: PresenceClient, user: str) -> None:
    """Five events of ``user``: online, three status changes, offline."""
    client.heartbeat(user, "d")
    client.set_status(user, "away", "lunch")
    client.set_status(user, "busy")
    client.set_status(user, "online")
    client.remove_device(user, "d")


def test_a_page_of_the_feed(client: PresenceClient) -> None:
    start = client.events("now")
    assert start.events == [] and start.next_cursor and start.lost == 0
    user = unique("paged")
    transitions(client, user)
    page = client.events(start.next_cursor, limit=1000)
    mine = [e for e in page.events if e.user == user]
    assert [(e.type, e.status) for e in mine] == [
        ("online", "online"),
        ("status", "away"),
        ("status", "busy"),
        ("status", "online"),
        ("offline", "offline"),
    ]
    assert mine[1].text == "lunch"
    assert [e.seq for e in mine] == sorted(e.seq for e in mine)
    assert all(e.id == f"{user}:{e.seq}" for e in mine)
    # The same cursor gives the same events: a lost answer can be asked again.
    again = client.events(start.next_cursor, limit=1000)
    assert [e.id for e in again.events if e.user == user] == [e.id for e in mine]


def test_the_iterator_resumes_from_its_cursor(client: PresenceClient) -> None:
    start = client.events("now").next_cursor
    user = unique("resumed")
    transitions(client, user)
    mine = [e.id for e in client.feed(start, follow=False) if e.user == user]
    assert len(mine) == 5

    # Read two at a time and stop after the third of the user's events.
    feed = client.feed(start, limit=2, follow=False)
    handled: list[str] = []
    for event in feed:
        if event.user == user:
            handled.append(event.id)
            if len(handled) == 3:
                break
    cursor = feed.cursor
    assert cursor and cursor != start

    # A new iterator from that cursor: nothing after the third is skipped,
    # and the pages already passed are not read again.
    resumed = [e.id for e in client.feed(cursor, limit=2, follow=False) if e.user == user]
    assert resumed[-2:] == mine[3:]
    assert mine[0] not in resumed
    assert set(resumed) <= set(mine[2:])

    # Caught up: the cursor after the last page gives nothing more...
    tail = client.feed(cursor, follow=False)
    assert [e.id for e in tail if e.user == user][-1] == mine[-1]
    assert [e for e in client.feed(tail.cursor, follow=False) if e.user == user] == []
    # ...until something happens.
    client.heartbeat(user, "again")
    later = [e for e in client.feed(tail.cursor, follow=False) if e.user == user]
    assert [e.type for e in later] == ["online"]
    client.remove_device(user, "again")


def test_a_following_iterator_waits_for_events_until_closed(client: PresenceClient) -> None:
    user = unique("followed")
    feed = client.feed("now", poll_interval=0.05)
    got: list[Event] = []
    errors: list[BaseException] = []

    def consume() -> None:
        try:
            for event in feed:
                if event.user == user:
                    got.append(event)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    wait_for("the first read", lambda: feed.cursor != "now")
    client.heartbeat(user, "d")
    client.remove_device(user, "d")
    wait_for("both events", lambda: len(got) == 2)
    assert [e.type for e in got] == ["online", "offline"]
    feed.close()
    thread.join(5)
    assert not thread.is_alive() and errors == []


def test_a_bad_cursor_ends_the_iteration_with_its_code(client: PresenceClient) -> None:
    feed = client.feed("not-a-cursor", follow=False)
    with pytest.raises(BadRequest) as refused:
        next(feed)
    assert refused.value.code == "bad_request" and refused.value.status == 400
    assert feed.cursor == "not-a-cursor"


class Scripted:
    """A stand-in for the client's events(): pages keyed by cursor."""

    def __init__(self, pages: dict[str | None, EventsPage]) -> None:
        self.pages = pages
        self.asked: list[str | None] = []

    def events(self, cursor: str | None, *, limit: int | None = None) -> EventsPage:
        self.asked.append(cursor)
        return self.pages[cursor]


def event(n: int) -> Event:
    raw: dict[str, Any] = {"id": f"u:{n}", "type": "status", "at": n, "seq": n, "user": "u"}
    return Event.from_json(raw)


def test_the_cursor_moves_a_page_at_a_time_and_counts_what_was_lost() -> None:
    from presence_client import EventFeed

    pages = {
        None: EventsPage([event(1), event(2)], "c2", 0),
        "c2": EventsPage([event(3)], "c3", 4),
        "c3": EventsPage([], "c3", 0),
    }
    fake = Scripted(pages)
    lost: list[int] = []
    # The feed asks its client for events() only: a stand-in will do.
    client = cast(PresenceClient, fake)
    feed = EventFeed(client, None, limit=2, follow=False, poll_interval=0, on_lost=lost.append)
    seen = []
    for e in feed:
        seen.append((e.id, feed.cursor))
    # Within a page the cursor stays where the page was read from (a resume
    # repeats the page); with its last event it moves past it.
    assert seen == [("u:1", None), ("u:2", "c2"), ("u:3", "c3")]
    assert fake.asked == [None, "c2", "c3"]
    assert feed.lost == 4 and lost == [4]
