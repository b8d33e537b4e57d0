"""Identity and provenance against real processes: another uid is refused at accept, a
socket directory another user controls is never used, and ``daemon/status`` lists who is
connected (the kernel's view beside the client's claim)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import spawn_ready
from e2e_helpers import add, state
from rawclient import socket_client, stdio_client

pytestmark = pytest.mark.anyio

NOBODY = 65534
AS_ROOT = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                             reason="another uid needs root and setpriv (CI runs as root)")


def not_private(path: Path, uid: int, mode: int) -> str:
    return (f"memoryd: the socket directory {path} is not private: owned by uid {uid} with mode {mode:04o}, not by "
            f"uid {os.geteuid()} with mode 0700; another user could replace the socket (remove the directory, or "
            "fix its owner and mode)\n")


def _world_executable(path: str) -> bool:
    """Whether uid 65534 can run ``path``: o+x on it and on every directory above it."""
    p = Path(path)
    return all(os.stat(q).st_mode & stat.S_IXOTH for q in [p, *p.parents])


def other_users_python() -> str:
    for candidate in (os.path.realpath(sys.executable), "/usr/bin/python3"):
        if os.path.exists(candidate) and _world_executable(candidate):
            return candidate
    pytest.skip("no python that uid 65534 may run")


#: Connects, sends one request, says so, then reports what it reads: the bytes, or the error.
PEER = """
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
s.sendall(b'{"jsonrpc":"2.0","id":1,"method":"memory/list"}\\n')
print("sent", flush=True)
sys.stdin.readline()
try:
    print(repr(s.recv(65536)), flush=True)
except OSError as exc:
    print(type(exc).__name__, flush=True)
"""


def connect_as_nobody(daemon: Any) -> tuple[int, int, str, str]:
    """Run :data:`PEER` as uid 65534 while the daemon is stopped, so that its request is
    queued in the kernel before the daemon can accept it; then let the daemon go on.
    Returns the peer's pid, exit status, stdout and stderr."""
    os.kill(daemon.proc.pid, signal.SIGSTOP)
    os.waitpid(daemon.proc.pid, os.WUNTRACED)  # stopped: it cannot accept until SIGCONT
    try:
        peer = subprocess.Popen(
            ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", other_users_python(), "-c", PEER,
             str(daemon.socket_path)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert peer.stdout is not None
        assert peer.stdout.readline() == "sent\n"
    finally:
        os.kill(daemon.proc.pid, signal.SIGCONT)
    out, err = peer.communicate("go\n", timeout=30)
    return peer.pid, peer.returncode, out, err


@AS_ROOT
@pytest.mark.exec  # waits for the daemon's SIGSTOP with waitpid: it must be our child
async def test_another_uid_is_refused_before_anything_is_read(daemon: Any) -> None:
    """With the socket opened up to everyone (0666 in a 0755 directory), uid 65534 still
    gets EOF and no reply: its request, sent before the daemon accepted it, is discarded
    unread. The refusal is logged once, with its pid and uid."""
    async with socket_client(daemon.socket_path) as raw:
        await add(raw, "the owner's memory")
        before = await state(raw)
    os.chmod(daemon.socket_path.parent, 0o755)
    os.chmod(daemon.socket_path, 0o666)
    pid, code, out, err = await anyio.to_thread.run_sync(connect_as_nobody, daemon)
    assert (code, out, err) == (0, "b''\n", "")  # EOF: no reply, and no reset either
    refusals = [ln for ln in daemon.stderr().splitlines() if "refused a connection" in ln]
    assert len(refusals) == 1
    assert refusals[0].endswith(f" WARNING memoryd.transports: refused a connection from pid {pid} uid {NOBODY}: "
                                "only the daemon's own uid (0) and root may connect")
    async with socket_client(daemon.socket_path) as raw:  # the owner is served as before
        assert await state(raw) == before
        status = await raw.ok("daemon/status", {})
        assert status["connections"] == 1 and [c["uid"] for c in status["connectionList"]] == [0]


# --- the socket directory ----------------------------------------------------------------


@pytest.fixture
def short() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="mdid-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def serve(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "memoryd", "serve", *args], env=env, capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)


def env_with(**changes: str | None) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("MEMORYD_SOCKET", None)
    for k, v in changes.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def test_a_runtime_dir_with_mode_0755_is_refused_at_start(short: Path) -> None:
    """$XDG_RUNTIME_DIR/memoryd, created beforehand with group and other access."""
    runtime = short / "memoryd"
    runtime.mkdir()
    os.chmod(runtime, 0o755)
    db = short / "m.db"
    r = serve(["--db", str(db)], env_with(XDG_RUNTIME_DIR=str(short)))
    assert (r.returncode, r.stdout, r.stderr) == (1, "", not_private(runtime, os.geteuid(), 0o755))
    assert not db.exists() and os.listdir(runtime) == []  # no store, no socket, nothing
    assert stat.S_IMODE(runtime.stat().st_mode) == 0o755  # and not repaired behind its owner's back


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_a_fallback_dir_that_another_user_made_first_is_refused(short: Path) -> None:
    """<tmp>/memoryd-<uid> without XDG_RUNTIME_DIR: another uid created it (mode 0700 even)."""
    runtime = short / f"memoryd-{os.getuid()}"
    runtime.mkdir(mode=0o700)
    os.chown(runtime, NOBODY, NOBODY)
    db = short / "m.db"
    env = env_with(XDG_RUNTIME_DIR=None, TMPDIR=str(short))
    r = serve(["--db", str(db)], env)
    assert (r.returncode, r.stdout, r.stderr) == (1, "", not_private(runtime, NOBODY, 0o700))
    r = serve(["--detach", "--db", str(db)], env)  # as memoryctl's autostart runs it
    assert (r.returncode, r.stdout, r.stderr) == (1, "", not_private(runtime, NOBODY, 0o700))
    assert not db.exists() and os.listdir(runtime) == []  # not even the start lock or the log


def test_a_private_runtime_dir_made_beforehand_is_served(short: Path) -> None:
    runtime = short / "memoryd"
    runtime.mkdir(mode=0o700)
    db = short / "m.db"
    proc = spawn_ready(["--db", str(db)], short / "err", env_with(XDG_RUNTIME_DIR=str(short)))
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(10)
            s.connect(str(runtime / "memoryd.sock"))
            s.sendall(b'{"jsonrpc":"2.0","id":1,"method":"daemon/status"}\n')
            status = json.loads(s.makefile("rb").readline())["result"]
        assert status["socket"] == str(runtime / "memoryd.sock") and status["store"]["path"] == str(db)
    finally:
        proc.terminate()
        assert proc.wait(10) == 0


def test_the_relay_never_connects_through_a_directory_another_user_controls(short: Path) -> None:
    """Something listens in a 0755 socket directory: the relay refuses before connecting,
    and starts nothing."""
    runtime = short / "run"
    runtime.mkdir()
    os.chmod(runtime, 0o755)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as impostor:
        impostor.bind(str(runtime / "memoryd.sock"))
        impostor.listen(8)
        r = subprocess.run([sys.executable, "-m", "memoryd", "serve", "--stdio", "--socket", str(runtime / "memoryd.sock")],
                           input='{"jsonrpc":"2.0","id":1,"method":"memory/list"}\n', capture_output=True, text=True,
                           timeout=60, env=env_with())
        assert (r.returncode, r.stdout, r.stderr) == (1, "", not_private(runtime, os.geteuid(), 0o755))
        impostor.setblocking(False)
        with pytest.raises(BlockingIOError):
            impostor.accept()  # nobody connected
    assert sorted(os.listdir(runtime)) == ["memoryd.sock"]  # no daemon, lock or log either


def test_memoryctls_autostart_shows_the_daemons_refusal(short: Path) -> None:
    runtime = short / "run"
    runtime.mkdir()
    os.chmod(runtime, 0o750)
    r = subprocess.run([sys.executable, "-m", "memoryd_client", "--socket", str(runtime / "memoryd.sock"), "--db",
                        str(short / "m.db"), "status"], capture_output=True, text=True, timeout=60,
                       stdin=subprocess.DEVNULL, start_new_session=True, env=env_with())
    assert (r.returncode, r.stdout) == (3, "")
    reason, error = r.stderr.splitlines()
    assert reason + "\n" == not_private(runtime, os.geteuid(), 0o750)
    assert error.startswith("error: AUTOSTART_FAILED: memoryd exited with status 1 before it was ready")
    assert os.listdir(runtime) == [] and not (short / "m.db").exists()


# --- daemon/status lists the live connections --------------------------------------------


async def test_status_lists_each_connection_with_the_kernels_view_and_the_clients_claim(
        daemon_factory: Any, any_approvers: Path) -> None:
    daemon = daemon_factory("--config", str(any_approvers))  # the approver here has no terminal
    me = {"pid": os.getpid(), "uid": os.geteuid(), "exe": os.readlink("/proc/self/exe"), "transport": "socket"}
    t0 = int(time.time() * 1000)
    async with socket_client(daemon.socket_path, initialize=False) as bare, \
            socket_client(daemon.socket_path) as approver:
        await approver.ok("approval/subscribe", {})
        await bare.ok("initialize", {"client": {"name": "t-harness", "version": "9.1"},
                                     "capabilities": {"approvals": False}})
        status = await bare.ok("daemon/status", {})
        t1 = int(time.time() * 1000)
        rows = status["connectionList"]
        assert status["connections"] == 2 and len(rows) == 2
        assert rows[0]["id"] < rows[1]["id"]
        assert [r["client"] for r in rows] == [{"name": "t-harness", "version": "9.1"}, {"name": "raw", "version": "0"}]
        assert [r["approver"] for r in rows] == [False, True]
        for r in rows:
            assert {k: r[k] for k in me} == me
            assert t0 <= r["openedAt"] <= t1
    async with socket_client(daemon.socket_path, initialize=False) as alone:
        (row,) = (await alone.ok("daemon/status", {}))["connectionList"]
        assert row["client"] is None and row["approver"] is False and row["id"] > rows[1]["id"]


async def test_status_on_stdio_lists_the_parent_process(tmp_path: Path) -> None:
    async with stdio_client(tmp_path / "m.db") as raw:
        (row,) = (await raw.ok("daemon/status", {}))["connectionList"]
        assert {k: row[k] for k in ("transport", "pid", "uid", "exe")} == {
            "transport": "stdio", "pid": os.getpid(), "uid": os.geteuid(), "exe": os.readlink("/proc/self/exe")}
        assert row["client"] == {"name": "raw", "version": "0"}
