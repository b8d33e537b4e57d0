"""Shared fixtures: a real memoryd process on a temporary socket and database."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
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


def spawn_ready(args: list[str], err: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """``python -m memoryd serve <args>``, returned once it sent READY=1 (the store is open
    and the socket accepts): the daemon's own readiness signal, not a connect loop."""
    from memoryd.launch import LaunchFailed
    from memoryd.launch import spawn_ready as launch

    try:
        return launch(args, log=err, env=env or daemon_env())
    except LaunchFailed as exc:
        raise RuntimeError(f"memoryd failed to start: {exc}\n{err.read_text(errors='replace')}") from None


def start_daemon(tmp: Path, *extra: str, policy: str | None = "auto", db: Path | None = None,
                 name: str = "d", socket_path: Path | None = None) -> Daemon:
    tmp.mkdir(parents=True, exist_ok=True)
    # Unix socket paths are limited to ~107 bytes; pytest's tmp paths can be long.
    sock_dir = Path(os.environ.get("MEMORYD_TEST_SOCKDIR", "/tmp"))
    sock = socket_path or Path(tempfile_dir(sock_dir)) / f"{name}.sock"
    db_path = db or tmp / f"{name}.db"
    err = tmp / f"{name}.stderr"
    args = ["--socket", str(sock), "--db", str(db_path)]
    if policy is not None:
        args += ["--write-policy", policy]
    args += list(extra)
    proc = spawn_ready(args, err)
    return Daemon(sock, db_path, proc, err, [sys.executable, "-m", "memoryd", "serve", *args])


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


@pytest.fixture
def any_approvers(tmp_path: Path) -> Path:
    """A config file with ``approvers = "any"``: subscribed approvers need no terminal
    (the test process has none)."""
    path = tmp_path / "any-approvers.toml"
    path.write_text('approvers = "any"\n')
    return path


@pytest.fixture
def ask_any_daemon(daemon_factory, any_approvers: Path) -> Daemon:  # type: ignore[no-untyped-def]
    """Write policy ``ask``, and approvers without a terminal may subscribe."""
    return daemon_factory("--config", str(any_approvers), policy="ask")  # type: ignore[operator,no-any-return]


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    """A short directory under /tmp for sockets (a Unix socket path has at most 107 bytes,
    and pytest's tmp paths can be longer); every daemon still serving in it is stopped."""
    from processes import peer_pid, stop

    d = Path(tempfile_dir(Path("/tmp")))
    yield d
    for sock in d.rglob("*.sock"):
        pid = peer_pid(sock)
        if pid is not None:
            stop(pid)
    shutil.rmtree(d, ignore_errors=True)
