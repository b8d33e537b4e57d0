"""Shared fixtures: a real memoryd process on a temporary socket and database."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class Daemon:
    """A running ``memoryd serve --socket`` subprocess."""

    socket_path: Path
    db_path: Path
    proc: subprocess.Popen[bytes]
    stderr_path: Path
    args: list[str] = field(default_factory=list)

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def stop(self, timeout: float = 10.0) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def daemon_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def wait_for_socket(path: Path, proc: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    """Ready means the daemon accepts a connection (it binds only once the store is open)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"memoryd exited early with {proc.returncode}")
        if path.exists():
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                try:
                    s.connect(str(path))
                    return
                except OSError:
                    pass
        time.sleep(0.01)
    raise TimeoutError(f"memoryd did not open {path} within {timeout}s")


def start_daemon(tmp: Path, *extra: str, policy: str | None = "auto", db: Path | None = None,
                 name: str = "d", socket_path: Path | None = None) -> Daemon:
    tmp.mkdir(parents=True, exist_ok=True)
    # Unix socket paths are limited to ~107 bytes; pytest's tmp paths can be long.
    sock_dir = Path(os.environ.get("MEMORYD_TEST_SOCKDIR", "/tmp"))
    sock = socket_path or Path(tempfile_dir(sock_dir)) / f"{name}.sock"
    db_path = db or tmp / f"{name}.db"
    err = tmp / f"{name}.stderr"
    args = [sys.executable, "-m", "memoryd", "serve", "--socket", str(sock), "--db", str(db_path)]
    if policy is not None:
        args += ["--write-policy", policy]
    args += list(extra)
    with err.open("wb") as errf:
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errf,
                                env=daemon_env())
    d = Daemon(sock, db_path, proc, err, args)
    try:
        wait_for_socket(sock, proc)
    except Exception:
        d.stop()
        raise RuntimeError(f"memoryd failed to start: {d.stderr()}") from None
    return d


def tempfile_dir(base: Path) -> str:
    import tempfile

    return tempfile.mkdtemp(prefix="md-", dir=base)


@pytest.fixture
def daemon_factory(tmp_path: Path) -> Iterator[object]:
    started: list[Daemon] = []

    def factory(*extra: str, policy: str | None = "auto", db: Path | None = None, name: str = "d",
                socket_path: Path | None = None) -> Daemon:
        d = start_daemon(tmp_path, *extra, policy=policy, db=db, name=name, socket_path=socket_path)
        started.append(d)
        return d

    yield factory
    for d in started:
        d.stop()
        if d.socket_path.parent.name.startswith("md-"):
            shutil.rmtree(d.socket_path.parent, ignore_errors=True)


@pytest.fixture
def daemon(daemon_factory) -> Daemon:  # type: ignore[no-untyped-def]
    """A daemon under write policy ``auto``."""
    return daemon_factory()  # type: ignore[operator,no-any-return]


@pytest.fixture
def ask_daemon(daemon_factory) -> Daemon:  # type: ignore[no-untyped-def]
    """A daemon under write policy ``ask``: every write sends approval/asked."""
    return daemon_factory(policy="ask")  # type: ignore[operator,no-any-return]
