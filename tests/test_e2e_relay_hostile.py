"""``memoryd serve --stdio`` against harnesses that misbehave and daemons that go away:
real relay processes, real daemons (a stand-in only where a daemon cannot be made to
misbehave on cue), raw bytes."""

from __future__ import annotations

import fcntl
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Daemon

RELAY = [sys.executable, "-m", "memoryd", "serve", "--stdio"]


def _line(method: str, id_: Any = 1, params: Any = None) -> bytes:
    msg: dict[str, Any] = {"jsonrpc": "2.0", "id": id_, "method": method}
    if params is not None:
        msg["params"] = params
    return json.dumps(msg).encode() + b"\n"


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    # Unix socket paths are limited to ~107 bytes; pytest's tmp paths can be long.
    d = Path(tempfile.mkdtemp(prefix="rh-", dir="/tmp"))
    yield d
    for sock in d.glob("*.sock"):
        pid = _peer_pid(sock)
        if pid is not None:
            _stop_pid(pid)
    for p in sorted(d.rglob("*"), reverse=True):
        p.unlink() if not p.is_dir() else p.rmdir()
    d.rmdir()


def _peer_pid(sock: Path) -> int | None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
        try:
            c.connect(str(sock))
        except OSError:
            return None
        pid: int = struct.unpack("3i", c.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
        return pid


def _stop_pid(pid: int) -> None:
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        os.kill(pid, signal.SIGTERM)
        assert select.select([fd], [], [], 20)[0], f"pid {pid} did not exit"
    finally:
        os.close(fd)


# --- the harness's descriptors ------------------------------------------------------------

def test_a_closed_stdin_is_an_empty_session_not_a_loop_on_the_daemon_socket(daemon: Daemon) -> None:
    """With fd 0 closed, the relay's socket would become fd 0 and the relay would copy the
    daemon's bytes back to the daemon. A closed stdin is EOF: the session ends at once."""
    r = subprocess.run(["sh", "-c", 'exec "$@" <&-', "sh", *RELAY, "--socket", str(daemon.socket_path)],
                       capture_output=True, timeout=30)
    assert (r.returncode, r.stdout, r.stderr) == (0, b"", b"")


def test_a_non_blocking_stdin_is_read_as_lines_arrive(daemon: Daemon) -> None:
    """A harness may hand over a pipe whose file description is O_NONBLOCK (shared with its
    own end). EAGAIN on stdin is not EOF."""
    r, w = os.pipe()
    os.set_blocking(r, False)
    with subprocess.Popen([*RELAY, "--socket", str(daemon.socket_path)], stdin=r,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        os.close(r)
        assert proc.stdout is not None and proc.stderr is not None
        for i in range(1, 4):
            os.write(w, _line("memory/budgets", i))
            assert json.loads(proc.stdout.readline())["id"] == i
        os.close(w)
        assert proc.stdout.read() == b""
        assert proc.wait(10) == 0
        assert proc.stderr.read() == b""


def test_a_non_blocking_stdout_that_fills_up_waits_for_the_harness(daemon: Daemon) -> None:
    """EAGAIN on stdout means "the harness is behind", not a crash: every byte arrives."""
    r, w = os.pipe()
    fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 4096)
    os.set_blocking(w, False)
    big_id = "x" * 1_000_000
    with subprocess.Popen([*RELAY, "--socket", str(daemon.socket_path)], stdin=subprocess.PIPE,
                          stdout=w, stderr=subprocess.PIPE) as proc:
        os.close(w)
        assert proc.stdin is not None and proc.stderr is not None
        proc.stdin.write(_line("memory/budgets", big_id))
        proc.stdin.close()
        out = b""
        while chunk := os.read(r, 65536):
            out += chunk
        os.close(r)
        err = proc.stderr.read()
        assert proc.wait(10) == 0, err.decode()
    assert err == b""
    assert json.loads(out)["id"] == big_id


def test_with_stderr_closed_a_refusal_never_reaches_stdout(daemon: Daemon, tmp_path: Path) -> None:
    """fd 2 closed at start leaves sys.stderr None, and print(file=None) writes to stdout:
    the refusal would reach the harness as a protocol line."""
    other = tmp_path / "other.db"
    r = subprocess.run(["sh", "-c", 'exec "$@" 2>&-', "sh", *RELAY, "--socket", str(daemon.socket_path),
                        "--db", str(other)], input=_line("memory/list"), capture_output=True, timeout=30)
    assert (r.returncode, r.stdout) == (1, b"")
    assert not other.exists()
