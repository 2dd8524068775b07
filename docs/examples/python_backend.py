"""python_backend.py: a Flask backend that keeps each user's last seen from
presence-server's signed webhooks, catches up from the event feed after its
own downtime, and reads presence through the presence_client package.

    pip install flask ./clients/python
    PRESENCE_URL=http://presence:8080 PRESENCE_SERVICE_KEY=... \
    PRESENCE_WEBHOOK_SECRET=... LAST_SEEN_DB=last_seen.sqlite3 \
    flask --app python_backend run --port 3001

with the nodes started with --service-key (the same key), --webhook-secret
(the same secret) and --webhook-url http://<this host>:3001/hooks/presence.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Iterable, Iterator
from typing import Any

from flask import Flask, jsonify, request

import presence_client
from presence_client import Event, PresenceClient

SCHEMA = """
CREATE TABLE IF NOT EXISTS user_last_seen (
  user_id   TEXT PRIMARY KEY,
  last_seen INTEGER,         -- epoch ms the user last went offline (kept while online)
  status    TEXT NOT NULL,   -- online, away, busy, invisible or offline
  seq       INTEGER NOT NULL -- the user's seq of the transition this row shows
);
CREATE TABLE IF NOT EXISTS feed_cursor (
  id     INTEGER PRIMARY KEY CHECK (id = 1),
  cursor TEXT
);
INSERT OR IGNORE INTO feed_cursor (id, cursor) VALUES (1, NULL);
"""


class LastSeen:
    """The last-seen table, written by the webhook and by the feed alike:
    a row only moves to a larger seq, so a repeated or late event changes
    nothing."""

    def __init__(self, path: str) -> None:
        self.db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self.db.row_factory = sqlite3.Row
        self.lock = threading.Lock()  # one connection, shared by the server's threads
        self.catching = threading.Lock()  # one catch-up at a time
        with self.lock:
            self.db.executescript(SCHEMA)

    def _apply(self, events: Iterable[Event]) -> None:
        for e in events:
            if e.type not in ("online", "offline", "status"):
                continue  # room events
            self.db.execute(
                """INSERT INTO user_last_seen (user_id, last_seen, status, seq)
                   VALUES (?, ?, ?, ?)
                   ON CONFLICT (user_id) DO UPDATE
                     SET last_seen = excluded.last_seen, status = excluded.status,
                         seq = excluded.seq
                     WHERE user_last_seen.seq < excluded.seq""",
                (e.user, e.last_seen, e.status, e.seq),
            )

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        with self.lock:
            self.db.execute("BEGIN")
            try:
                yield
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            self.db.execute("COMMIT")

    def apply(self, events: Iterable[Event]) -> None:
        """Writes a webhook batch in one transaction."""
        with self._transaction():
            self._apply(events)

    def row(self, user: str) -> dict[str, Any] | None:
        with self.lock:
            row = self.db.execute(
                "SELECT last_seen, status, seq FROM user_last_seen WHERE user_id = ?", (user,)
            ).fetchone()
        return dict(row) if row else None

    def catch_up(self, client: PresenceClient) -> int:
        """Reads the feed from the stored cursor until it is caught up: each
        event and the cursor after it in one transaction, so a crash resumes
        where the last commit left off. Returns how many events it read
        (0 when another catch-up is under way)."""
        if not self.catching.acquire(blocking=False):
            return 0
        try:
            return self._catch_up(client)
        finally:
            self.catching.release()

    def _catch_up(self, client: PresenceClient) -> int:
        with self.lock:
            cursor = self.db.execute("SELECT cursor FROM feed_cursor").fetchone()["cursor"]
        # No cursor yet: from the oldest event the feed keeps.
        feed = client.feed(cursor, limit=1000, follow=False)
        read = 0
        for event in feed:
            with self._transaction():
                self._apply([event])
                self.db.execute("UPDATE feed_cursor SET cursor = ?", (feed.cursor,))
            read += 1
        return read


def create_app(
    presence_url: str | None = None,
    service_key: str | None = None,
    webhook_secret: str | None = None,
    database: str | None = None,
) -> Flask:
    """The app; each argument defaults to its environment variable (which
    is how `flask --app python_backend run` calls it)."""
    env = os.environ
    client = PresenceClient(
        presence_url or env.get("PRESENCE_URL", "http://127.0.0.1:8080"),  # any node
        service_key=service_key or env["PRESENCE_SERVICE_KEY"],
    )
    secret = webhook_secret or env["PRESENCE_WEBHOOK_SECRET"]
    last_seen = LastSeen(database or env.get("LAST_SEEN_DB", "last_seen.sqlite3"))
    app = Flask(__name__)
    app.extensions["last_seen"] = last_seen
    try:
        # What happened while this app was down, before it takes webhooks.
        last_seen.catch_up(client)
    except presence_client.Unavailable as e:
        app.logger.warning("presence feed: %s; the webhooks will bring what comes", e)

    @app.post("/hooks/presence")
    def hook() -> Any:
        body = request.get_data()  # the raw bytes: the signature is over them
        header = request.headers.get(presence_client.SIGNATURE_HEADER)
        if not presence_client.verify(body, header, secret, 300):
            return "", 401
        batch = presence_client.parse_webhook(body)
        last_seen.apply(batch.events)
        if batch.lost:
            # Events went before they were sent: read what the feed still has.
            last_seen.catch_up(client)
        return "", 204  # only now: a failure above answers 500 and the batch comes again

    @app.get("/users/<user>/presence")
    def user_presence(user: str) -> Any:
        record = client.presence(user)  # the truth: the service view
        row = last_seen.row(user)
        return jsonify(
            user=record.user,
            online=record.online,
            status=record.status,
            kinds=list(record.kinds),
            last_seen=row["last_seen"] if row else None,
        )

    @app.errorhandler(presence_client.Unavailable)
    def presence_down(e: presence_client.Unavailable) -> Any:
        return jsonify(error=e.code, message=e.message), 503

    @app.errorhandler(presence_client.BadRequest)
    def bad_id(e: presence_client.BadRequest) -> Any:
        return jsonify(error=e.code, message=e.message), 400

    return app


if __name__ == "__main__":
    create_app().run(port=int(os.environ.get("PORT", "3001")))
