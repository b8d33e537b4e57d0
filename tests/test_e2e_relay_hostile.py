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


# --- the daemon going away ----------------------------------------------------------------

def test_daemon_death_noticed_first_by_a_write_still_gives_rc_1_and_one_line(daemon: Daemon) -> None:
    """The daemon dies while the relay is behind on stdout and the harness writes the next
    line: the relay's send fails first, then it reads the daemon's EOF. That is the daemon
    going away, not the harness closing stdin."""
    big_id = "y" * 2_000_000
    with subprocess.Popen([*RELAY, "--socket", str(daemon.socket_path)], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        proc.stdin.write(_line("memory/budgets", big_id))
        proc.stdin.flush()
        # The reply has begun: the daemon read the whole request (nothing unread at its end).
        assert os.read(proc.stdout.fileno(), 1) == b"{"
        daemon.proc.kill()
        daemon.proc.wait()
        proc.stdin.write(_line("memory/budgets", 2))  # the relay's send of this one fails
        proc.stdin.flush()
        rest = proc.stdout.read()
        err = proc.stderr.read().decode()
        assert proc.wait(10) == 1, err
    assert len(rest) < len(big_id)  # cut short: the daemon died mid-reply
    assert err.count("\n") == 1 and err.startswith("memoryd: the daemon closed the connection"), err


def test_a_peer_that_resets_the_connection_before_answering_is_one_line(sock_dir: Path) -> None:
    """Something accepts on the socket, then drops the connection with the relay's probe
    unread (a daemon closing its listener with connections still queued does this): one
    line, rc 1, not a traceback."""
    path = sock_dir / "reset.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as srv:
        srv.bind(str(path))
        srv.listen(1)
        with subprocess.Popen([*RELAY, "--socket", str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
            conn, _ = srv.accept()
            assert select.select([conn], [], [], 20)[0]  # the probe is there, unread
            conn.close()  # unread data: the relay's recv gets ECONNRESET
            out, err = proc.communicate(_line("memory/budgets"), timeout=20)
    assert proc.returncode == 1
    assert out == b""
    text = err.decode()
    assert text == f"memoryd: lost the connection to the daemon on {path}: Connection reset by peer\n"


# --- store identity -----------------------------------------------------------------------

@pytest.mark.parametrize("how", ["symlink", "relative", "hard link"])
def test_another_name_for_the_served_store_attaches(daemon: Daemon, tmp_path: Path, how: str) -> None:
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    if how == "symlink":
        db = cwd / "link.db"
        db.symlink_to(daemon.db_path)
    elif how == "hard link":
        db = cwd / "hard.db"
        os.link(daemon.db_path, db)
    else:
        db = Path(os.path.relpath(daemon.db_path, cwd))
    r = subprocess.run([*RELAY, "--socket", str(daemon.socket_path), "--db", str(db)], cwd=cwd,
                       input=_line("daemon/status"), capture_output=True, timeout=30)
    assert r.returncode == 0, r.stderr.decode()
    assert r.stderr == b""
    assert json.loads(r.stdout)["result"]["store"]["path"] == str(daemon.db_path)


def test_a_daemon_that_cannot_start_is_named_once_in_one_line(daemon: Daemon, sock_dir: Path) -> None:
    """The daemon's own line already says "memoryd: "; the relay's line says it once."""
    elsewhere = sock_dir / "elsewhere.sock"
    r = subprocess.run([*RELAY, "--socket", str(elsewhere), "--db", str(daemon.db_path)],
                       input=_line("memory/list"), capture_output=True, timeout=30)
    assert (r.returncode, r.stdout) == (1, b"")
    assert r.stderr.decode() == (
        f"memoryd: could not start a daemon on {elsewhere}: STORE_LOCKED: store {daemon.db_path} is owned by "
        f"memoryd pid {daemon.proc.pid}, serving {daemon.socket_path} (log: {sock_dir / 'memoryd.log'})\n")
