"""The parts the tests run against, all real: a redis-server on a free port
with the repository's redis.conf, a presence-server node (the binary of
``PRESENCE_SERVER_BIN``, default ``<repo>/target/debug/presence-server``)
with an admin key, a service key, dev auth and two webhook URLs: a small
receiver in this process and the Flask example of docs/examples."""

from __future__ import annotations

import contextlib
import http.server
import importlib.util
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import pytest

from presence_client import PresenceClient

REPO = Path(__file__).resolve().parents[3]
BINARY = Path(os.environ.get("PRESENCE_SERVER_BIN", REPO / "target" / "debug" / "presence-server"))
ADMIN_KEY = "py-test-admin-key-0123456789"
SERVICE_KEY = "py-test-service-key-0123456789"
WEBHOOK_SECRET = "py-test-webhook-secret-0123456789"
HEARTBEAT_MS = 500
#: How long a test waits for what it expects.
DEADLINE = 15.0

T = TypeVar("T")


def wait_for(what: str, probe: Callable[[], T | None], deadline: float = DEADLINE) -> T:
    """Calls ``probe`` until it answers something truthy; fails after ``deadline`` s."""
    end = time.monotonic() + deadline
    while True:
        got = probe()
        if got:
            return got
        if time.monotonic() > end:
            pytest.fail(f"waited {deadline} s for {what}")
        time.sleep(0.02)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def unique(name: str) -> str:
    """An id no other test uses: the tests share one node."""
    return f"{name}-{uuid.uuid4().hex[:8]}"


@dataclass
class Redis:
    process: subprocess.Popen[bytes]
    port: int
    dir: Path

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"


def _pings(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@pytest.fixture(scope="session")
def redis() -> Iterator[Redis]:
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server must be on the PATH (apt-get install -y redis-server)")
    for _ in range(5):  # the free port may be taken before redis binds it
        tmp = Path(tempfile.mkdtemp(prefix="presence-py-redis-"))
        shutil.copy(REPO / "redis.conf", tmp / "redis.conf")
        port = free_port()
        process = subprocess.Popen(
            [
                "redis-server",
                str(tmp / "redis.conf"),
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(tmp),
                "--logfile",
                str(tmp / "redis.log"),
                "--appendonly",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        end = time.monotonic() + DEADLINE
        while process.poll() is None and not _pings(port) and time.monotonic() < end:
            time.sleep(0.02)
        if process.poll() is None and _pings(port):
            yield Redis(process, port, tmp)
            process.kill()
            process.wait()
            shutil.rmtree(tmp, ignore_errors=True)
            return
        process.kill()
        process.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    pytest.fail("redis-server did not start on any of 5 ports")


@dataclass
class Delivery:
    signature: str | None
    body: bytes


@dataclass
class Receiver:
    """A webhook endpoint that keeps every POST and answers 204."""

    url: str
    deliveries: list[Delivery] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def received(self) -> list[Delivery]:
        with self.lock:
            return list(self.deliveries)


@pytest.fixture(scope="session")
def receiver() -> Iterator[Receiver]:
    box: list[Receiver] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            with box[0].lock:
                box[0].deliveries.append(Delivery(self.headers.get("Presence-Signature"), body))
            self.send_response(204)
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    box.append(Receiver(f"http://127.0.0.1:{server.server_address[1]}/hooks"))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield box[0]
    server.shutdown()


def load_example() -> ModuleType:
    """docs/examples/python_backend.py, imported from its path."""
    path = REPO / "docs" / "examples" / "python_backend.py"
    spec = importlib.util.spec_from_file_location("python_backend", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass
class Example:
    """The example's app, served on a port of its own."""

    url: str
    module: ModuleType
    app: Any
    database: Path


@pytest.fixture(scope="session")
def node_port() -> int:
    """The node's port, chosen before it starts: the example app, which the
    node sends webhooks to, starts first and needs the node's URL."""
    return free_port()


@pytest.fixture(scope="session")
def example(node_port: int, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Example]:
    """docs/examples/python_backend.py served on a port of its own. It
    starts before the node, so its catch-up at start finds no node (and
    says so)."""
    from werkzeug.serving import make_server

    module = load_example()
    database = tmp_path_factory.mktemp("example") / "last_seen.sqlite3"
    app = module.create_app(
        f"http://127.0.0.1:{node_port}", SERVICE_KEY, WEBHOOK_SECRET, str(database)
    )
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield Example(f"http://127.0.0.1:{server.server_port}", module, app, database)
    server.shutdown()


@dataclass
class Node:
    process: subprocess.Popen[bytes]
    url: str
    logs: list[str]

    def tail(self, n: int = 60) -> str:
        return "\n".join(self.logs[-n:])


@contextlib.contextmanager
def start_node(
    redis: Redis, node_id: str, flags: list[str], listen: str = "127.0.0.1:0"
) -> Iterator[Node]:
    """A node on ``redis`` with both keys and ``flags``, killed at the end."""
    if not BINARY.exists():
        pytest.fail(
            f"no presence-server binary at {BINARY}: run cargo build, or set PRESENCE_SERVER_BIN"
        )
    args = [
        str(BINARY),
        "--listen",
        listen,
        "--redis-url",
        redis.url,
        "--node-id",
        node_id,
        "--admin-key",
        ADMIN_KEY,
        "--service-key",
        SERVICE_KEY,
        *flags,
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PRESENCE_", "REDIS_URL"))}
    # The tests read far faster than a client would (a flag beats this).
    env.update(PRESENCE_HTTP_READS_PER_SEC="10000000", RUST_LOG="info")
    process = subprocess.Popen(
        args, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    logs: list[str] = []
    found: list[str] = []

    def read() -> None:
        assert process.stderr is not None
        for raw in process.stderr:
            line = raw.decode("utf-8", "replace").rstrip()
            logs.append(line)
            if "listening on http://" in line and not found:
                found.append(line.split("listening on http://", 1)[1].split()[0])

    threading.Thread(target=read, daemon=True).start()
    try:
        addr = wait_for(
            "the node's 'listening on' line",
            lambda: found[0] if found else process.poll() is not None and "exited",
        )
        if addr == "exited":
            pytest.fail("presence-server exited:\n" + "\n".join(logs))
        yield Node(process, f"http://{addr}", logs)
    finally:
        process.kill()
        process.wait()


@pytest.fixture(scope="session")
def node(redis: Redis, receiver: Receiver, example: Example, node_port: int) -> Iterator[Node]:
    """The node of the tests: dev auth, webhooks to the receiver and the
    example, a heartbeat of 500 ms, and member lists for team:* rooms."""
    flags = [
        "--webhook-url",
        receiver.url,
        "--webhook-url",
        f"{example.url}/hooks/presence",
        "--webhook-secret",
        WEBHOOK_SECRET,
        "--webhook-batch-ms",
        "20",
        "--heartbeat-ms",
        str(HEARTBEAT_MS),
        "--room-policy",
        "team:*=members",
    ]
    with start_node(redis, "py-test", flags, listen=f"127.0.0.1:{node_port}") as started:
        yield started


@pytest.fixture(scope="session")
def client(node: Node) -> PresenceClient:
    """The backend's client: both keys."""
    return PresenceClient(node.url, service_key=SERVICE_KEY, admin_key=ADMIN_KEY)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test shows the node's last log lines."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    funcargs: dict[str, Any] = getattr(item, "funcargs", {})
    if report.failed and isinstance(funcargs.get("node"), Node):
        report.sections.append(("presence-server log (tail)", funcargs["node"].tail()))
