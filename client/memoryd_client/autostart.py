"""Start a daemon on demand, as gpg-agent and watchman clients do.

When nothing answers on the socket, run ``python -m memoryd serve --detach --socket PATH``:
the daemon's own launcher starts it in its own session (stderr appended to ``memoryd.log``
next to the socket), waits for its ``READY=1`` and exits, printing the daemon's pid. It
holds the runtime directory's start lock meanwhile, shared with ``memoryd serve --stdio``,
so two clients (or a client and a harness's relay) that start at the same moment start one
daemon between them. The client does not import the daemon: it runs it, and so shares the
daemon's one start-and-wait helper (``memoryd.launch.spawn_ready``, no polling) with the
relay, the tests and the benchmark.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path
from typing import Final

from memoryd_protocol.paths import log_path_for

from .errors import ConnectFailed

#: errno values of a connect that means "no daemon there" (as opposed to, say, EACCES).
NO_DAEMON_ERRNOS: Final = frozenset({errno.ENOENT, errno.ECONNREFUSED})
WAIT_S: Final = 30.0


class AutostartFailed(ConnectFailed):
    """The daemon could not be started; ``details`` has ``log`` and its ``stderr`` line."""

    CODE = "AUTOSTART_FAILED"


def start_daemon(socket_path: str | Path, *, db: str | Path | None = None, config: str | Path | None = None
                 ) -> int | None:
    """Start ``memoryd serve`` on ``socket_path`` unless one already answers there.

    Returns the new daemon's pid, or ``None`` when another one answered first. Raises
    :class:`AutostartFailed` (with the daemon's one-line reason) when it exits early or is
    not ready in time (it is stopped then).
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
    args = [sys.executable, "-m", "memoryd", "serve", "--detach", "--socket", str(sock)]
    if db is not None:
        args += ["--db", str(Path(db).absolute())]
    if config is not None:
        args += ["--config", str(Path(config).absolute())]
    log = log_path_for(sock)
    try:
        # The launcher itself gives up (and stops the daemon) after its own readiness wait;
        # this bound is only for a launcher that hangs.
        r = subprocess.run(args, stdin=subprocess.DEVNULL, capture_output=True, timeout=WAIT_S, cwd="/",
                           env=dict(os.environ, PYTHONUNBUFFERED="1"))
    except subprocess.TimeoutExpired:
        raise AutostartFailed(f"memoryd did not start on {sock} within {WAIT_S:g}s (log: {log})",
                              {"log": str(log), "command": args}) from None
    stderr = r.stderr.decode("utf-8", "replace")
    if r.returncode != 0:
        raise AutostartFailed(
            f"memoryd exited with status {r.returncode} before it was ready (log: {log})",
            {"log": str(log), "returncode": r.returncode, "stderr": stderr, "command": args},
        )
    out = r.stdout.strip()
    return int(out) if out else None


__all__ = ["NO_DAEMON_ERRNOS", "AutostartFailed", "start_daemon"]
