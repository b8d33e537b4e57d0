"""``memoryd serve --stdio`` against harnesses that misbehave and daemons that go away:
real relay processes, real daemons (a stand-in only where a daemon cannot be made to
misbehave on cue), raw bytes."""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import select
import signal
import socket
import sqlite3
import struct
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from conftest import Daemon, spawn_ready
from rawclient import write_ctx

RELAY = [sys.executable, "-m", "memoryd", "serve", "--stdio"]


def _line(method: str, id_: Any = 1, params: Any = None) -> bytes:
    msg: dict[str, Any] = {"jsonrpc": "2.0", "id": id_, "method": method}
    if params is not None:
        msg["params"] = params
    return json.dumps(msg).encode() + b"\n"








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


# --- a relay that arrives while the daemon drains -------------------------------------------

_IN_MODIFY, _IN_CREATE, _IN_DELETE = 0x002, 0x100, 0x200


@contextmanager
def _inotify(directory: Path, mask: int) -> Iterator[int]:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_CLOEXEC)
    assert fd >= 0, os.strerror(ctypes.get_errno())
    try:
        assert libc.inotify_add_watch(fd, str(directory).encode(), mask) >= 0
        yield fd
    finally:
        os.close(fd)


def _names(fd: int, timeout: float = 30) -> list[str]:
    """The names of the next batch of inotify events (waits for one)."""
    assert select.select([fd], [], [], timeout)[0], f"no inotify event within {timeout}s"
    buf, names = os.read(fd, 65536), []
    while buf:
        _wd, _mask, _cookie, length = struct.unpack_from("iIII", buf)
        names.append(buf[16:16 + length].rstrip(b"\0").decode())
        buf = buf[16 + length:]
    return names


def _read_lines_until(sock: socket.socket, needle: bytes) -> None:
    buf = b""
    while needle not in buf:
        data = sock.recv(65536)
        assert data, f"closed before {needle!r}"
        buf += data


def test_a_relay_that_arrives_while_the_daemon_drains_attaches_to_its_successor(
        sock_dir: Path, tmp_path: Path) -> None:
    """SIGTERM: the daemon removes its socket at once, but holds the store until it has
    drained. A relay arriving in between finds no daemon and starts one; that one must wait
    for its predecessor to let go of the store, not fail with STORE_LOCKED."""
    sock, db = sock_dir / "memoryd.sock", tmp_path / "m.db"
    old = spawn_ready(["--socket", str(sock), "--db", str(db), "--write-policy", "ask"], tmp_path / "old.stderr")
    asker = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    asker.connect(str(sock))
    asker.sendall(_line("initialize", 0, {"protocol": "dsh-memory-protocol/v1", "capabilities": {"approvals": True}})
                  + _line("memory/add", 1, {"input": {"track": "user", "scope": "user-global", "text": "pending"},
                                            "write": write_ctx()}))
    _read_lines_until(asker, b'"approval/asked"')
    # Hold SQLite's write lock: the drain's audited denial of that approval cannot commit,
    # so the old daemon stays between "socket removed" and "store released".
    blocker = sqlite3.connect(db, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    with _inotify(sock_dir, _IN_DELETE) as fd:
        old.send_signal(signal.SIGTERM)
        while sock.name not in _names(fd):
            pass
    old.send_signal(signal.SIGSTOP)  # frozen in the window; nothing of it moves until SIGCONT
    blocker.rollback()
    blocker.close()
    log = sock_dir / "memoryd.log"  # the successor's stderr (the old one's is old.stderr)
    try:
        with _inotify(sock_dir, _IN_CREATE | _IN_MODIFY) as fd, \
                subprocess.Popen([*RELAY, "--socket", str(sock), "--db", str(db), "--log-level", "info"],
                                 stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE) as relay:
            assert relay.stdin is not None and relay.stdout is not None and relay.stderr is not None
            relay.stdin.write(_line("daemon/status"))
            relay.stdin.flush()
            waiting = f"owned by memoryd pid {old.pid}, which is stopping; waiting for it to exit"
            while not (log.exists() and waiting in log.read_text()):
                readable, _, _ = select.select([fd, relay.stdout], [], [], 30)
                assert readable, "neither a waiting successor nor a relay exit within 30s"
                assert relay.stdout not in readable, relay.stderr.read().decode()
                os.read(fd, 65536)
            old.send_signal(signal.SIGCONT)
            assert old.wait(20) == 0
            status = json.loads(relay.stdout.readline())["result"]
            relay.stdin.close()
            assert relay.wait(20) == 0, relay.stderr.read().decode()
    finally:
        if old.poll() is None:
            old.send_signal(signal.SIGCONT)
            old.kill()
            old.wait()
        asker.close()
    assert status["store"]["path"] == str(db)
    assert status["pid"] not in (old.pid, relay.pid)



def test_a_live_owner_whose_socket_was_deleted_is_refused_at_once(daemon: Daemon) -> None:
    """Only an owner that has begun to stop is waited for: one whose socket a tmp cleaner
    deleted under it is alive and keeps the store, and the starter says so without delay."""
    sock = daemon.socket_path
    sock.unlink()
    r = subprocess.run([*RELAY, "--socket", str(sock), "--db", str(daemon.db_path), "--log-level", "info"],
                       input=_line("memory/list"), capture_output=True, timeout=30)
    log = sock.parent / "memoryd.log"
    assert (r.returncode, r.stdout) == (1, b"")
    assert r.stderr.decode() == (f"memoryd: could not start a daemon on {sock}: STORE_LOCKED: store {daemon.db_path} "
                                 f"is owned by memoryd pid {daemon.proc.pid}, serving {sock} (log: {log})\n")
    assert "waiting" not in log.read_text()


# --- a starter that gives up before the daemon is ready --------------------------------------

_NEVER_READY = """
import os, signal
fd = os.open(os.environ["FAKE_DAEMON_FIFO"], os.O_WRONLY)  # the test holds the other end
os.write(fd, f"{os.getpid()}\\n".encode())
signal.pause()  # never says READY=1
"""


@pytest.mark.parametrize("mode", ["--detach", "--stdio"])
def test_a_starter_stopped_before_the_daemon_is_ready_stops_that_daemon(sock_dir: Path, tmp_path: Path,
                                                                         mode: str) -> None:
    """Node's autostart gives up by SIGTERM to `memoryd serve --detach` (its wait is shorter
    than the launcher's); a harness gives up on a relay the same way. The daemon being
    started, in a session of its own, must not be left running half-started."""
    fifo = tmp_path / "started"
    os.mkfifo(fifo)
    fake = tmp_path / "never-ready-python"
    fake.write_text(f"#!{sys.executable}\n{_NEVER_READY}")
    fake.chmod(0o755)
    sock, db = sock_dir / "memoryd.sock", tmp_path / "m.db"
    code = (f"import sys\nsys.executable = {str(fake)!r}  # what the launcher runs as the daemon\n"
            "from memoryd.cli import main\n"
            f"raise SystemExit(main(['serve', {mode!r}, '--socket', {str(sock)!r}, '--db', {str(db)!r}]))\n")
    starter = subprocess.Popen([sys.executable, "-c", code], env=dict(os.environ, FAKE_DAEMON_FIFO=str(fifo)),
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    with open(fifo, "rb") as started:  # returns once the daemon opened its end
        pid = int(started.readline())
        try:
            starter.send_signal(signal.SIGTERM)
            out, err = starter.communicate(timeout=20)
            assert select.select([started], [], [], 20)[0], "the half-started daemon is still running"
            assert started.read() == b""  # its end closed: it is gone (the launcher reaped it)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert out == b""
    assert starter.returncode == (143 if mode == "--detach" else 1)
    where = "could not start on" if mode == "--detach" else "could not start a daemon on"
    assert err.decode() == (f"memoryd: {where} {sock}: interrupted by SIGTERM before memoryd was ready; "
                            f"stopped it (log: {sock_dir / 'memoryd.log'})\n")
    assert not db.exists()


def test_a_store_sqlite_cannot_open_is_the_daemons_one_line_not_a_traceback_tail(
        sock_dir: Path, tmp_path: Path) -> None:
    """The launcher reports the last line the daemon wrote. An SQLite error while opening
    the store was an uncaught traceback whose last line came from aiosqlite's thread
    ("RuntimeError: Event loop is closed"). A FIFO stands in for any store SQLite refuses."""
    sock, fifo = sock_dir / "memoryd.sock", tmp_path / "fifo.db"
    os.mkfifo(fifo)
    with subprocess.Popen([*RELAY, "--socket", str(sock), "--db", str(fifo)], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        with open(fifo, "wb"):  # returns once the daemon opened it; SQLite then fails on it
            out, err = proc.communicate(_line("memory/list"), timeout=30)
    assert (proc.returncode, out) == (1, b"")
    assert err.decode() == (f"memoryd: could not start a daemon on {sock}: STORE_UNAVAILABLE: the store had an I/O "
                            f"error: {fifo} (log: {sock_dir / 'memoryd.log'})\n")
    assert "Traceback" not in (sock_dir / "memoryd.log").read_text()


def test_a_socket_path_that_is_a_regular_file_is_refused_creating_no_store(sock_dir: Path, tmp_path: Path) -> None:
    sock, db = sock_dir / "memoryd.sock", tmp_path / "m.db"
    sock.write_text("not a socket")
    r = subprocess.run([*RELAY, "--socket", str(sock), "--db", str(db)], input=_line("memory/list"),
                       capture_output=True, timeout=30)
    assert (r.returncode, r.stdout) == (1, b"")
    assert r.stderr.decode() == (f"memoryd: could not start a daemon on {sock}: {sock} exists and is not a socket "
                                 f"(log: {sock_dir / 'memoryd.log'})\n")
    assert not db.exists()
    assert sock.read_text() == "not a socket"


def test_a_second_daemon_on_a_live_socket_is_refused_creating_no_store(daemon: Daemon, tmp_path: Path) -> None:
    other = tmp_path / "other.db"
    r = subprocess.run([sys.executable, "-m", "memoryd", "serve", "--socket", str(daemon.socket_path),
                        "--db", str(other)], stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
    assert (r.returncode, r.stdout) == (1, b"")
    assert r.stderr.decode() == f"memoryd: a memoryd is already serving on {daemon.socket_path}\n"
    assert not other.exists()


def test_a_socket_path_too_long_for_a_unix_socket_is_named_in_the_reason(tmp_path: Path) -> None:
    sock = tmp_path / ("m" * 120 + ".sock")  # sun_path holds 107 bytes; tmp_path is private (0700)
    r = subprocess.run([*RELAY, "--socket", str(sock), "--db", str(tmp_path / "m.db")],
                       input=_line("memory/list"), capture_output=True, timeout=30)
    assert (r.returncode, r.stdout) == (1, b"")
    assert r.stderr.decode() == f"memoryd: cannot connect to {sock}: AF_UNIX path too long\n"
    assert not (tmp_path / "m.db").exists()


_SPOOFER = """
import os, socket, sys
addr = "\\0" + os.environ["NOTIFY_SOCKET"][1:]
pid = os.fork()
if pid == 0:  # another process (any local one could find the name in /proc/net/unix)
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.sendto(b"READY=1", addr)
    os._exit(0)
os.waitpid(pid, 0)  # the forged READY=1 is queued before we exit
sys.stderr.write(f"forged READY=1 from pid {pid}\\n")
sys.exit(3)
"""


def test_ready_from_any_process_but_the_daemon_is_ignored(tmp_path: Path) -> None:
    """The launcher checks the sender's pid (SCM_CREDENTIALS) of READY=1: a forged one does
    not make it report a daemon that is not ready (this one then exits, rc 3)."""
    from memoryd.launch import LaunchFailed
    from memoryd.launch import spawn_ready as launch

    fake = tmp_path / "spoofing-python"
    fake.write_text(f"#!{sys.executable}\n{_SPOOFER}")
    fake.chmod(0o755)
    log = tmp_path / "memoryd.log"
    with pytest.raises(LaunchFailed) as failed:
        launch(["--socket", str(tmp_path / "s.sock")], log=log, python=str(fake), wait_s=30)
    assert failed.value.returncode == 3
    assert str(failed.value).startswith("forged READY=1 from pid ")
