"""docs/python.md stays true: its example block is the example file, byte
for byte, and its other Python blocks run, in order, against the test node;
the documented command starts the example."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import (
    ADMIN_KEY,
    REPO,
    SERVICE_KEY,
    WEBHOOK_SECRET,
    Node,
    free_port,
    unique,
    wait_for,
)
from presence_client import PresenceClient

DOC = REPO / "docs" / "python.md"
BLOCK = re.compile(r"(?:<!-- ([^>]*) -->\n)?```python\n(.*?)```\n", re.S)


def blocks() -> list[tuple[str, str]]:
    """Each Python block of the page with the marker before it, if any."""
    return [(m.group(1) or "", m.group(2)) for m in BLOCK.finditer(DOC.read_text())]


def test_the_example_block_is_the_example_file() -> None:
    examples = [code for marker, code in blocks() if marker.startswith("example: ")]
    assert len(examples) == 1, "docs/python.md has no <!-- example: ... --> block"
    path = REPO / [m for m, _ in blocks() if m.startswith("example: ")][0].split(": ", 1)[1]
    assert examples[0] == path.read_text(), f"docs/python.md's copy of {path.name} differs"


def test_the_snippets_run(
    node: Node, client: PresenceClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PRESENCE_URL", node.url)
    monkeypatch.setenv("PRESENCE_SERVICE_KEY", SERVICE_KEY)
    monkeypatch.setenv("PRESENCE_ADMIN_KEY", ADMIN_KEY)
    monkeypatch.setenv("PRESENCE_WEBHOOK_SECRET", WEBHOOK_SECRET)
    # The users the page names, online for the reads to show something.
    for user in ["alice", "bob"]:
        client.heartbeat(user, "doc")
    snippets = [code for marker, code in blocks() if not marker]
    assert len(snippets) >= 8
    namespace: dict[str, object] = {"__name__": "docs_python_md"}
    for i, code in enumerate(snippets):
        try:
            exec(compile(code, f"docs/python.md block {i + 1}", "exec"), namespace)
        except Exception as e:  # pragma: no cover - the failure message
            pytest.fail(f"docs/python.md block {i + 1} failed: {e!r}\n{code}")
    # What the blocks did, seen from outside.
    assert client.contacts("alice") == ["bob", "carol"]
    assert client.presence("alice").status == "busy"
    assert list(client.iter_members("team:7")) == ["alice", "carol"]
    assert not client.presence("build-bot").online
    for user in ["alice", "bob"]:
        client.remove_device(user, "doc")


def test_the_documented_command_starts_the_example(node: Node, tmp_path: Path) -> None:
    port = free_port()
    env = {
        **os.environ,
        "PRESENCE_URL": node.url,
        "PRESENCE_SERVICE_KEY": SERVICE_KEY,
        "PRESENCE_WEBHOOK_SECRET": WEBHOOK_SECRET,
        "LAST_SEEN_DB": str(tmp_path / "last_seen.sqlite3"),
    }
    command = [
        sys.executable,
        "-m",
        "flask",
        "--app",
        "docs/examples/python_backend.py",
        "run",
        "--port",
        str(port),
    ]
    process = subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        import urllib.request

        user = unique("cli")

        def answers() -> bool:
            assert process.poll() is None, process.stderr.read().decode() if process.stderr else ""
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{port}/users/{user}/presence", timeout=2
                ) as res:
                    return bool(res.status == 200)
            except OSError:
                return False

        wait_for("the example's route", answers)
    finally:
        process.terminate()
        process.wait(10)
