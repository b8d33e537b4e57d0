"""Start a detached daemon and wait until it is ready, without polling.

The child gets a private ``NOTIFY_SOCKET``, as systemd gives a ``Type=notify`` service, and
we wait on that socket for ``READY=1`` (accepted only from the child's pid, by the
datagram's credentials) and on a pidfd for its exit: ready means the store is open and the
socket accepts. The one such helper, for the relay, ``serve --detach`` (memoryctl's
autostart runs that), the tests and the benchmark; stdlib only, on the relay's start-up path.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Protocol, TypeVar

from memoryd_protocol.paths import AUTOSTART_LOCK_NAME

from .rundir import check_private_dir

DEFAULT_WAIT_S = 15.0
_UCRED = struct.Struct("3i")


class LaunchFailed(Exception):
    """The daemon exited or stayed silent before it was ready; the message is one line
    (the daemon's own last stderr line when it left one)."""

    def __init__(self, message: str, returncode: int | None = None) -> None:
        super().__init__(message)
        self.returncode = returncode


def answers(path: Path) -> bool:
    """True when a daemon accepts connections on ``path``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(str(path))
        except OSError:
            return False
    return True


@contextlib.contextmanager
def start_lock(runtime_dir: Path) -> Iterator[None]:
    """Serialize starters of one runtime directory; the holder keeps it for at most its
    readiness wait. Only in a private directory (else :class:`memoryd.rundir.UnsafeDir`).
    The lock is memoryctl's autostart's too: everyone else waits, then finds it running."""
    check_private_dir(runtime_dir)
    fd = os.open(runtime_dir / AUTOSTART_LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _last_line(path: Path, offset: int) -> str:
    try:
        with path.open("rb") as f:
            f.seek(offset)
            lines = f.read().decode("utf-8", "replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1] if lines else ""


@contextlib.contextmanager
def _signals_as_fd(signums: Sequence[int]) -> Iterator[tuple[int | None, list[int]]]:
    """While inside: the signals in ``signums`` are recorded (not fatal) and make the
    returned descriptor readable, so a select() sees them, whenever they arrive."""
    if not signums:
        yield None, []
        return
    got: list[int] = []
    r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def record(signum: int, _frame: object) -> None:
        got.append(signum)

    old = {s: signal.signal(s, record) for s in signums}
    old_fd = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    try:
        yield r, got
    finally:
        signal.set_wakeup_fd(old_fd)
        for s, handler in old.items():
            signal.signal(s, handler)
        os.close(r)
        os.close(w)


class Child(Protocol):
    """What the readiness wait needs of a started daemon: ``subprocess.Popen``, or a test's
    forked process (tests/forked.py)."""

    @property
    def pid(self) -> int: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def terminate(self) -> None: ...

    def kill(self) -> None: ...


C = TypeVar("C", bound=Child)


def _stop(proc: Child) -> None:
    proc.terminate()
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _ready_from(notify: socket.socket, pid: int) -> bool:
    """One datagram: is it ``READY=1`` sent by ``pid``?"""
    msg, anc, _flags, _addr = notify.recvmsg(4096, socket.CMSG_SPACE(_UCRED.size))
    sender = None
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
            sender = _UCRED.unpack(data[: _UCRED.size])[0]
    return sender == pid and b"READY=1" in msg.split(b"\n")


def spawn_ready(
    serve_args: Sequence[str],
    *,
    log: Path | None,
    wait_s: float = DEFAULT_WAIT_S,
    python: str = sys.executable,
    env: dict[str, str] | None = None,
    cancel_on: Sequence[int] = (),
) -> subprocess.Popen[bytes]:
    """Run ``python -m memoryd serve <serve_args>`` in its own session (stderr appended to
    ``log``) and return once it said ``READY=1``. :class:`LaunchFailed` when it exits first,
    is not ready within ``wait_s``, or a signal in ``cancel_on`` arrives first: then it is
    stopped, since a daemon nobody waits for must not linger half-started."""

    def run(child_env: dict[str, str], stderr: int) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [python, "-m", "memoryd", "serve", *serve_args],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr,
            start_new_session=True, close_fds=True, cwd="/", env=child_env,
        )

    return start_ready(run, log=log, wait_s=wait_s, env=env, cancel_on=cancel_on)


def start_ready(
    start: Callable[[dict[str, str], int], C],
    *,
    log: Path | None,
    wait_s: float = DEFAULT_WAIT_S,
    env: dict[str, str] | None = None,
    cancel_on: Sequence[int] = (),
) -> C:
    """The readiness wait of :func:`spawn_ready`, for a daemon that ``start(env, stderr)``
    starts in a process of its own with that environment and stderr descriptor."""
    name = f"memoryd-launch-{os.getpid()}-{os.urandom(8).hex()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as notify, \
            _signals_as_fd(cancel_on) as (wake, got):
        notify.bind("\0" + name)
        notify.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        child_env = dict(os.environ if env is None else env, NOTIFY_SOCKET="@" + name, PYTHONUNBUFFERED="1")
        for var in ("LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES"):
            child_env.pop(var, None)
        offset = 0
        err: int = subprocess.DEVNULL
        if log is not None:
            err = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
            offset = os.lseek(err, 0, os.SEEK_END)
        try:
            proc = start(child_env, err)
        finally:
            if log is not None:
                os.close(err)
        pidfd = os.pidfd_open(proc.pid)
        try:
            deadline = time.monotonic() + wait_s
            watched = [notify.fileno(), pidfd] + ([] if wake is None else [wake])
            while True:
                left = deadline - time.monotonic()
                readable, _, _ = select.select(watched, [], [], max(left, 0))
                if got:
                    _stop(proc)
                    signame = signal.Signals(got[0]).name
                    raise LaunchFailed(f"interrupted by {signame} before memoryd was ready; stopped it",
                                       128 + got[0])
                if wake is not None and wake in readable:
                    os.read(wake, 512)  # another signal with a Python handler: not ours
                    continue
                if notify.fileno() in readable and _ready_from(notify, proc.pid):
                    return proc
                if pidfd in readable:
                    code = proc.wait()
                    reason = (_last_line(log, offset) if log is not None else "") or f"exit status {code}"
                    raise LaunchFailed(reason, code)
                if not readable:
                    _stop(proc)
                    raise LaunchFailed(f"memoryd was not ready within {wait_s:g}s; stopped it")
        finally:
            os.close(pidfd)
