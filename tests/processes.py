"""Processes the end-to-end tests drive: those that are not our children (detached daemons),
found and stopped by events (the socket's peer credentials name the daemon, its pidfd says
when it is gone); sockets held by a process of their own; a headless agent's write; and
what a terminal shows."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def peer_pid(path: Path) -> int | None:
    """The pid of whoever accepts on the Unix socket ``path`` (SO_PEERCRED), or None."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(str(path))
        except OSError:
            return None
        pid: int = _UCRED.unpack(s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))[0]
        return pid


def wait_exit(pid: int, timeout: float = 10) -> None:
    """Wait for ``pid`` to exit (a zombie not yet reaped by init counts as exited)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        assert select.select([fd], [], [], timeout)[0], f"pid {pid} did not exit within {timeout}s"
    finally:
        os.close(fd)


def stop(pid: int, timeout: float = 10) -> bool:
    """SIGTERM ``pid`` and wait for it to exit (through its pidfd, so a reused pid is never
    hit); SIGKILL when it outlives ``timeout``. True when SIGTERM was enough."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        signal.pidfd_send_signal(pidfd, signal.SIGTERM)
        if select.select([pidfd], [], [], timeout)[0]:
            return True
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        select.select([pidfd], [], [], timeout)
        return False
    except ProcessLookupError:
        return True
    finally:
        os.close(pidfd)


_CONNECT_AND_PASS = (
    "import socket, sys\n"
    "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
    "s.connect(sys.argv[1])\n"
    "socket.send_fds(socket.socket(fileno=int(sys.argv[2])), [b'c'], [s.fileno()])\n"
)


def foreign_socket(path: Path | str) -> socket.socket:
    """A connection to the Unix socket ``path`` made by another process: a short-lived
    child connects and passes the socket back over SCM_RIGHTS, so the daemon's
    SO_PEERCRED names the child's pid, not ours (a write "from another process")."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        subprocess.run([sys.executable, "-I", "-S", "-c", _CONNECT_AND_PASS, str(path), str(theirs.fileno())],
                       pass_fds=[theirs.fileno()], check=True, timeout=30)
        _, fds, _, _ = socket.recv_fds(ours, 1, 1)
    return socket.socket(fileno=fds[0])


_DETACHED = (
    "import os, select, socket, sys\n"
    "theirs = socket.socket(fileno=int(sys.argv[2]))\n"
    "middle = os.getpid()\n"
    "if os.fork():\n"
    "    os._exit(0)\n"
    "try:\n"
    "    pidfd = os.pidfd_open(middle)\n"
    "except ProcessLookupError:\n"
    "    pass\n"
    "else:\n"
    "    select.select([pidfd], [], [])  # the middle process exited: this one was reparented\n"
    "    os.close(pidfd)\n"
    "assert os.getppid() != middle\n"
    "daemon = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
    "daemon.connect(sys.argv[1])\n"
    "other = {theirs: daemon, daemon: theirs}\n"
    "reading = {theirs, daemon}\n"
    "while reading:\n"
    "    for s in select.select(list(reading), [], [])[0]:\n"
    "        try:\n"
    "            data = s.recv(65536)\n"
    "        except OSError:\n"
    "            data = b''\n"
    "        if data:\n"
    "            try:\n"
    "                other[s].sendall(data)\n"
    "                continue\n"
    "            except OSError:\n"
    "                pass\n"
    "        reading.discard(s)\n"
    "        try:\n"
    "            other[s].shutdown(socket.SHUT_WR)\n"
    "        except OSError:\n"
    "            pass\n"
)


def detached_socket(path: Path | str) -> socket.socket:
    """A connection to the Unix socket ``path`` that a live process of its own holds: a
    grandchild, reparented once its parent exited, so neither this process's ancestor nor
    its descendant, connects and copies bytes between that connection and the returned
    socket (EOF and half-close too). The daemon sees that process on the connection, as it
    would a headless agent or an approver in another terminal; it exits when both ends
    are closed."""
    ours, theirs = socket.socketpair()
    with theirs:
        subprocess.run([sys.executable, "-I", "-S", "-c", _DETACHED, str(path), str(theirs.fileno())],
                       pass_fds=[theirs.fileno()], check=True, timeout=30)
    return ours


#: A headless agent's write: prints its pid, then the entry's text, or the denial's outcome.
HEADLESS_ADD = """
import json, os, sys
import memoryd_client as mc
print(os.getpid(), flush=True)
with mc.connect_sync(sys.argv[1], session=sys.argv[2], approvals=False, timeout=30) as c:
    try:
        r = c.add({"track": "user", "scope": "user-global", "text": sys.argv[3]})
    except mc.WriteDenied as exc:
        print(json.dumps({"denied": exc.details["outcome"]}))
    else:
        print(json.dumps({"text": r.entry.text}))
"""


class HeadlessAdd:
    """:data:`HEADLESS_ADD` as a subprocess in a session of its own (no terminal): ``pid``
    once it runs, ``result()`` once it is done."""

    def __init__(self, socket_path: Path | str, session: str, text: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", HEADLESS_ADD, str(socket_path), session, text],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, start_new_session=True)
        assert self.proc.stdout is not None
        self.pid = int(self.proc.stdout.readline())

    def result(self) -> dict[str, Any]:
        out, err = self.proc.communicate(timeout=30)
        assert self.proc.returncode == 0, err
        reply: dict[str, Any] = json.loads(out)
        return reply


def read_pty_until(master: int, needle: bytes) -> bytes:
    """What the terminal showed, up to ``needle`` (bounded: each read waits at most 30 s)."""
    buf = b""
    while needle not in buf:
        assert select.select([master], [], [], 30)[0], buf
        chunk = os.read(master, 65536)
        assert chunk, buf
        buf += chunk
    return buf
