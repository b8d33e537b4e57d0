"""Start a daemon on demand, as gpg-agent and watchman clients do.

When nothing answers on the socket, spawn ``python -m memoryd serve --socket PATH`` detached
(own session, stdin/stdout on /dev/null, stderr appended to ``memoryd.log`` next to the
socket) and wait until a connection succeeds. An advisory lock next to the socket keeps two
clients that start at the same moment from spawning two daemons.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from .errors import ConnectFailed

#: errno values of a connect that means "no daemon there" (as opposed to, say, EACCES).
NO_DAEMON_ERRNOS: Final = frozenset({errno.ENOENT, errno.ECONNREFUSED})
LOG_NAME: Final = "memoryd.log"
LOCK_NAME: Final = ".memoryd-autostart.lock"
DEFAULT_WAIT_S: Final = 10.0

#: Daemons this process spawned (kept referenced so they are not reaped as garbage).
SPAWNED: list[subprocess.Popen[bytes]] = []


class AutostartFailed(ConnectFailed):
    """The daemon could not be started; ``details`` has ``log`` and the ``stderr`` tail."""

    CODE = "AUTOSTART_FAILED"


def probe(path: Path) -> bool:
    """True when something accepts a connection on the socket."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        try:
            s.connect(str(path))
        except OSError:
            return False
    return True


def log_path_for(socket_path: Path) -> Path:
    return socket_path.parent / LOG_NAME


def _tail(path: Path, offset: int, lines: int = 20) -> str:
    try:
        with path.open("rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError:
        return ""
    text = data.decode("utf-8", "replace").rstrip("\n")
    return "\n".join(text.splitlines()[-lines:])


def _open(path: Path, flags: int, what: str) -> int:
    try:
        return os.open(path, flags, 0o600)
    except OSError as exc:
        raise AutostartFailed(
            f"cannot open {what} {path}: {exc.strerror or exc}", {"path": str(path), "errno": exc.errno}
        ) from None


def _lock(path: Path, deadline: float) -> int:
    fd = _open(path, os.O_RDWR | os.O_CREAT, "the autostart lock")
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() > deadline:
                os.close(fd)
                raise AutostartFailed(
                    f"another client holds {path} (starting memoryd?) for too long", {"lock": str(path)}
                ) from None
            time.sleep(0.05)


def start_daemon(
    socket_path: str | Path,
    *,
    db: str | Path | None = None,
    config: str | Path | None = None,
    extra_args: Sequence[str] = (),
    wait: float = DEFAULT_WAIT_S,
    python: str = sys.executable,
) -> int | None:
    """Start ``memoryd serve`` on ``socket_path`` unless one already answers there.

    Returns the new daemon's pid, or ``None`` when another one answered first. Raises
    :class:`AutostartFailed` (with the daemon's stderr tail) when it exits early or is not
    ready within ``wait`` seconds (it is stopped then).
    """
    sock = Path(socket_path).absolute()
    rundir = sock.parent
    try:
        rundir.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:  # a file in the way, a read-only parent, ...
        raise AutostartFailed(
            f"cannot create the socket directory {rundir}: {exc.strerror or exc}",
            {"path": str(rundir), "errno": exc.errno},
        ) from None
    deadline = time.monotonic() + wait
    lock_fd = _lock(rundir / LOCK_NAME, deadline)
    try:
        if probe(sock):
            return None
        args = [python, "-m", "memoryd", "serve", "--socket", str(sock)]
        if db is not None:
            args += ["--db", str(Path(db).absolute())]
        if config is not None:
            args += ["--config", str(Path(config).absolute())]
        args += list(extra_args)
        log = log_path_for(sock)
        log_fd = _open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, "the log")
        try:
            offset = os.lseek(log_fd, 0, os.SEEK_END)
            env = dict(os.environ, PYTHONUNBUFFERED="1")
            proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log_fd,
                start_new_session=True,
                close_fds=True,
                cwd="/",
                env=env,
            )
        finally:
            os.close(log_fd)
        SPAWNED.append(proc)
        delay = 0.01
        while True:
            if probe(sock):
                return proc.pid
            returncode = proc.poll()
            if returncode is not None:
                tail = _tail(log, offset)
                raise AutostartFailed(
                    f"memoryd exited with status {returncode} before it was ready (log: {log})",
                    {"log": str(log), "returncode": returncode, "stderr": tail, "command": args},
                )
            if time.monotonic() > deadline:
                proc.terminate()
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                raise AutostartFailed(
                    f"memoryd did not open {sock} within {wait:g}s; stopped it (log: {log})",
                    {"log": str(log), "stderr": _tail(log, offset), "command": args},
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.2)
    finally:
        os.close(lock_fd)


__all__ = ["NO_DAEMON_ERRNOS", "AutostartFailed", "log_path_for", "probe", "start_daemon"]
