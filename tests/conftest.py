"""Shared fixtures: a memoryd on a temporary socket and database, in one of two tiers.

- **process** (the default): a real ``memoryd serve`` process (``daemon_factory`` and the
  fixtures built on it), or a ``--stdio --standalone`` child (rawclient.stdio_client).
- **in-process** (tests/inprocess.py): the daemon's real stack in the test process, no
  process spawned. A module marked ``pytest.mark.inprocess`` gets it from
  ``daemon_factory`` (and so ``daemon``, ``ask_daemon``, ``ask_any_daemon``): the same
  object shape, serving a real Unix socket at ``socket_path`` from an event loop in a
  thread of the test process (so tests that block, or call ``d.stop()``, are unchanged;
  ``stop()`` returns 0 once the daemon's own drain and close finished cleanly). A test
  in such a module that needs a real process (``.proc``, ``.stderr()``, signals, a pid
  that is not the test's) is marked ``pytest.mark.process``. ``MEMORYD_TEST_TIER=process``
  runs every test on processes, except those marked ``pytest.mark.inprocess_only`` (they
  patch the daemon's modules in the test process): it skips them.

``pair_factory`` runs one test over three transports: ``memory`` (the daemon in the test's
own event loop, over an in-memory pair of streams), ``socket`` (a daemon process) and
``stdio`` (a ``--standalone`` stdio child).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from rawclient import Raw, relay_client, socket_client, stdio_client

#: pair_factory's transports; a module may name its own in ``PAIR_KINDS``, e.g. add
#: "relay" (a stdio relay child to a socket daemon process), as test_e2e_core.py does
PAIRS = ("memory", "socket", "stdio")

#: ``pair_factory(policy="auto", config=None)`` → an async context manager yielding an
#: initialized Raw; ``config`` is TOML text for the daemon's config file
PairFactory = Callable[..., AbstractAsyncContextManager[Raw]]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "pair_factory" in metafunc.fixturenames:
        kinds = getattr(metafunc.module, "PAIR_KINDS", PAIRS)
        metafunc.parametrize("pair_factory", kinds, indirect=True, ids=list(kinds))


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # once per run, before any xdist worker starts
        import system_tools

        system_tools.ensure()
    # Every daemon a test starts witnesses its ledger's heads in $XDG_STATE_HOME/memoryd:
    # a directory of this run's, never the user's own.
    import tempfile

    os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="memoryd-test-state-")
    config.addinivalue_line("markers", "inprocess: daemon_factory's daemons run in the test process")
    config.addinivalue_line("markers", "process: this test needs a real daemon process (overrides inprocess)")
    config.addinivalue_line("markers", "inprocess_only: this test patches the daemon's modules in the test process, "
                            "so MEMORYD_TEST_TIER=process skips it")
    config.addinivalue_line("markers", "exec: this test's daemons are `python -m memoryd` children of the test "
                            "process, not forked from a preloaded one (tests/forked.py)")


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


def spawn_ready(args: list[str], err: Path, env: dict[str, str] | None = None, *,
                fork: bool = False) -> subprocess.Popen[bytes]:
    """``python -m memoryd serve <args>``, returned once it sent READY=1 (the store is open
    and the socket accepts): the daemon's own readiness signal, not a connect loop. With
    ``fork``, the same daemon forked from a preloaded interpreter (tests/forked.py), unless
    ``MEMORYD_TEST_SPAWN=exec``."""
    from memoryd.launch import LaunchFailed
    from memoryd.launch import spawn_ready as launch

    try:
        if fork and os.environ.get("MEMORYD_TEST_SPAWN") != "exec":
            from forked import spawn_ready as forked

            return forked(args, log=err, env=env or daemon_env())  # type: ignore[return-value]
        return launch(args, log=err, env=env or daemon_env())
    except LaunchFailed as exc:
        raise RuntimeError(f"memoryd failed to start: {exc}\n{err.read_text(errors='replace')}") from None


def start_daemon(tmp: Path, *extra: str, policy: str | None = "auto", db: Path | None = None,
                 name: str = "d", socket_path: Path | None = None, fork: bool = True) -> Daemon:
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
    proc = spawn_ready(args, err, fork=fork)
    return Daemon(sock, db_path, proc, err, [sys.executable, "-m", "memoryd", "serve", *args])


def tempfile_dir(base: Path) -> str:
    import tempfile

    return tempfile.mkdtemp(prefix="md-", dir=base)


def _inprocess(request: pytest.FixtureRequest) -> bool:
    if os.environ.get("MEMORYD_TEST_TIER") == "process":
        return False
    node = request.node
    return node.get_closest_marker("inprocess") is not None and node.get_closest_marker("process") is None


def start_thread_daemon(tmp: Path, *extra: str, policy: str | None = "auto", db: Path | None = None,
                        name: str = "d", socket_path: Path | None = None) -> Any:
    """start_daemon's in-process twin (inprocess.ThreadDaemon)."""
    from inprocess import ThreadDaemon

    tmp.mkdir(parents=True, exist_ok=True)
    sock = socket_path or Path(tempfile_dir(Path(os.environ.get("MEMORYD_TEST_SOCKDIR", "/tmp")))) / f"{name}.sock"
    db_path = db or tmp / f"{name}.db"
    args = ["--socket", str(sock), "--db", str(db_path)]
    if policy is not None:
        args += ["--write-policy", policy]
    args += list(extra)
    return ThreadDaemon.start(sock, db_path, args)


@pytest.fixture
def daemon_factory(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[object]:
    started: list[Any] = []
    inprocess = _inprocess(request)
    if not inprocess and request.node.get_closest_marker("inprocess_only") is not None:
        # A daemon process never sees the test's patches: run there, the test proves nothing.
        pytest.skip("it patches the daemon's modules in the test process, which a daemon process does not share")
    fork = request.node.get_closest_marker("exec") is None

    def factory(*extra: str, policy: str | None = "auto", db: Path | None = None, name: str = "d",
                socket_path: Path | None = None) -> Any:
        if inprocess:
            d = start_thread_daemon(tmp_path, *extra, policy=policy, db=db, name=name, socket_path=socket_path)
        else:
            d = start_daemon(tmp_path, *extra, policy=policy, db=db, name=name, socket_path=socket_path, fork=fork)
        started.append(d)
        return d

    yield factory
    _stop_all(started)


def _stop_all(started: list[Any]) -> None:
    for d in started:
        d.stop()
        if d.socket_path.parent.name.startswith("md-"):
            shutil.rmtree(d.socket_path.parent, ignore_errors=True)


@pytest.fixture
def pair_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[PairFactory]:
    """``pair_factory(policy=..., config=...)`` → a connected, initialized Raw over the
    parametrized transport: ``memory`` (inprocess.memory_pair: the daemon in this event
    loop), ``socket`` (a daemon process), ``stdio`` (a ``--standalone`` stdio child), or
    ``relay`` where a module asks for it (a stdio relay to a socket daemon process)."""
    from inprocess import memory_pair

    kind: str = request.param
    started: list[Daemon] = []

    def factory(policy: str = "auto", config: str | None = None) -> AbstractAsyncContextManager[Raw]:
        extra: list[str] = []
        if config is not None:
            cfg = tmp_path / f"cfg-{len(list(tmp_path.iterdir()))}.toml"
            cfg.write_text(config)
            extra = ["--config", str(cfg)]
        if kind in ("socket", "relay"):  # a process, whatever the module's tier
            d = start_daemon(tmp_path, *extra, policy=policy)
            started.append(d)
            return (socket_client if kind == "socket" else relay_client)(d.socket_path)
        if kind == "memory":
            return memory_pair(["--db", str(tmp_path / "memory.db"), "--write-policy", policy, *extra])
        return stdio_client(tmp_path / "stdio.db", "--write-policy", policy, *extra)

    yield factory
    _stop_all(started)


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
