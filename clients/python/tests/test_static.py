"""The package is typed: mypy in strict mode passes on it, on these tests
(which use it as an app would) and on the Flask example, against the
installed package and its py.typed marker. And ruff finds them formatted
and clean, as pyproject.toml configures it."""

from __future__ import annotations

import subprocess
import sys
from importlib import resources
from pathlib import Path

from conftest import REPO

HERE = Path(__file__).resolve().parent


def test_the_installed_package_is_marked_typed() -> None:
    assert resources.files("presence_client").joinpath("py.typed").is_file()


def mypy(*targets: str) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--python-version",
            "3.10",
            "--cache-dir",
            "/dev/null",
            *targets,
        ],
        cwd=HERE,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_mypy_strict_passes_on_the_package() -> None:
    mypy("-p", "presence_client")


def test_mypy_strict_passes_on_its_uses() -> None:
    mypy(str(HERE), str(REPO / "docs" / "examples" / "python_backend.py"))


def ruff(*args: str) -> None:
    config = str(HERE.parent / "pyproject.toml")
    targets = [str(HERE.parent), str(REPO / "docs" / "examples" / "python_backend.py")]
    out = subprocess.run(
        [sys.executable, "-m", "ruff", *args, "--config", config, *targets],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_ruff_finds_it_formatted() -> None:
    ruff("format", "--check", "--no-cache")


def test_ruff_finds_it_clean() -> None:
    ruff("check", "--no-cache")
