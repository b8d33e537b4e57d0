"""``memoryd serve --stdio`` is a way in to the one daemon that owns the store: real
daemons, real relay processes, raw NDJSON lines."""

from __future__ import annotations

import ctypes
import json
import os
import select
import signal
import struct
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import Daemon
from e2e_helpers import add, state
from processes import peer_pid, stop
from rawclient import relay_client, socket_client, write_ctx

pytestmark = pytest.mark.anyio

LIST = b'{"jsonrpc":"2.0","id":1,"method":"memory/list"}\n'










def _shutdown(sock: Path) -> None:
    """Stop a detached daemon found by its socket."""
    pid = peer_pid(sock)
    assert pid is not None
    stop(pid)
    assert not sock.exists()


def relay(sock: Path, *extra: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "memoryd", "serve", "--stdio", "--socket", str(sock), *extra],
                          input=stdin, capture_output=True, timeout=30)


async def _status(sock: Path) -> dict[str, Any]:
    async with socket_client(sock) as raw:
        result: dict[str, Any] = await raw.ok("daemon/status", {})
        return result


async def test_two_relays_and_a_socket_session_share_one_store(daemon_factory: Any) -> None:
    """Each session sees the others' writes; each one's approval reaches only itself."""
    d: Daemon = daemon_factory(policy="ask")
    asked: dict[str, list[dict[str, Any]]] = {"r1": [], "r2": [], "sock": []}

    def allow(name: str) -> Any:
        async def answer(params: dict[str, Any]) -> str:
            asked[name].append(params)
            return "allowed-once"
        return answer

    async with relay_client(d.socket_path) as r1, relay_client(d.socket_path) as r2, \
            socket_client(d.socket_path) as s:
        r1.on_approval, r2.on_approval, s.on_approval = allow("r1"), allow("r2"), allow("sock")
        await add(r1, "written through relay one", session="r-1")
        await add(r2, "written through relay two", session="r-2")
        await add(s, "written over the socket", session="s-1")
        want = ["written through relay one", "written through relay two", "written over the socket"]
        for raw in (r1, r2, s):
            assert [e["text"] for e in await raw.ok("memory/list", {})] == want
        assert [a["text"] for a in asked["r1"]] == ["written through relay one"]
        assert [a["text"] for a in asked["r2"]] == ["written through relay two"]
        assert [a["text"] for a in asked["sock"]] == ["written over the socket"]
        # the relay passes events through unchanged: each writer got its own memory/added
        assert [n["params"]["entry"]["text"] for n in r1.notifications if n["method"] == "memory/added"] == [want[0]]
        assert [n["params"]["entry"]["text"] for n in r2.notifications if n["method"] == "memory/added"] == [want[1]]
        status = await s.ok("daemon/status", {})
        assert status["connections"] == 3
    assert r1.process.returncode == 0 and r2.process.returncode == 0


async def test_relay_starts_the_daemon_when_none_runs_and_the_next_one_attaches(
        sock_dir: Path, tmp_path: Path) -> None:
    sock = sock_dir / "memoryd.sock"
    db = tmp_path / "m.db"
    async with relay_client(sock, "--db", str(db), "--write-policy", "auto") as r:
        await add(r, "remembered by the daemon the relay started")
    # the daemon outlives the relay that started it, detached, with its log next to the socket
    assert r.process.returncode == 0
    pid = peer_pid(sock)
    assert pid is not None and pid != r.process.pid
    assert (await _status(sock))["store"]["path"] == str(db)
    async with relay_client(sock, "--db", str(db)) as r2:
        assert [e["text"] for e in await r2.ok("memory/list", {})] == ["remembered by the daemon the relay started"]
    assert peer_pid(sock) == pid
    assert (sock_dir / "memoryd.log").read_text().count("memoryd ready") == 1
    _shutdown(sock)


def test_concurrent_relays_start_exactly_one_daemon(sock_dir: Path, tmp_path: Path) -> None:
    sock = sock_dir / "memoryd.sock"
    db = tmp_path / "m.db"
    procs = [subprocess.Popen([sys.executable, "-m", "memoryd", "serve", "--stdio", "--socket", str(sock),
                               "--db", str(db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE) for _ in range(3)]
    outs = [p.communicate(b'{"jsonrpc":"2.0","id":1,"method":"daemon/status"}\n', timeout=30) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [o[1] for o in outs]
    assert [json.loads(o[0])["result"]["store"]["path"] for o in outs] == [str(db)] * 3
    log = (sock_dir / "memoryd.log").read_text()
    assert log.count("memoryd ready") == 1
    _shutdown(sock)


async def test_eof_on_stdin_denies_the_pending_approval_as_unavailable(daemon_factory: Any) -> None:
    d: Daemon = daemon_factory(policy="ask")
    async with socket_client(d.socket_path) as watcher:
        before = await state(watcher)
        proc = await anyio.open_process([sys.executable, "-m", "memoryd", "serve", "--stdio",
                                         "--socket", str(d.socket_path)])
        async with proc:
            assert proc.stdin is not None and proc.stdout is not None
            line = {"jsonrpc": "2.0", "id": 7, "method": "memory/add",
                    "params": {"input": {"track": "user", "scope": "user-global", "text": "never approved"},
                               "write": write_ctx()}}
            await proc.stdin.send(json.dumps(line).encode() + b"\n")
            buf = b""
            with anyio.fail_after(10):
                while b"approval/asked" not in buf:
                    buf += await proc.stdout.receive()
            await proc.stdin.aclose()  # the harness went away mid-approval
            with anyio.fail_after(10):
                async for chunk in proc.stdout:
                    buf += chunk
                await proc.wait()
        assert proc.returncode == 0
        replies = [json.loads(x) for x in buf.splitlines() if b'"id":7' in x]
        assert replies[0]["error"]["data"] == {"code": "WRITE_DENIED", "message": "write denied: unavailable",
                                               "details": {"outcome": "unavailable"}}
        entries, budgets, writes = await state(watcher)
        assert (entries, budgets) == before[:2]
        assert writes == before[2] + 1
        denied = (await watcher.ok("audit/list", {"limit": 1}))[0]
        assert denied["action"] == "add-denied"
        assert denied["outcome"] == "unavailable (via approval, writePolicy ask)"


def test_daemon_death_gives_eof_on_stdout_and_one_line_on_stderr(daemon_factory: Any) -> None:
    d: Daemon = daemon_factory()
    with subprocess.Popen([sys.executable, "-m", "memoryd", "serve", "--stdio", "--socket", str(d.socket_path)],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        proc.stdin.write(b'{"jsonrpc":"2.0","id":1,"method":"memory/budgets"}\n')
        proc.stdin.flush()
        assert json.loads(proc.stdout.readline())["id"] == 1  # attached and relaying
        d.proc.kill()
        d.proc.wait()
        assert proc.stdout.read() == b""  # EOF for the harness
        err = proc.stderr.read().decode()
        assert proc.wait(10) == 1
    assert err.count("\n") == 1 and err.startswith("memoryd: the daemon closed the connection"), err
    assert str(d.socket_path) in err


async def test_a_different_db_is_refused_naming_both_stores(daemon_factory: Any, tmp_path: Path) -> None:
    d: Daemon = daemon_factory()
    async with socket_client(d.socket_path) as raw:
        await add(raw, "kept")
        before = await state(raw)
    other = tmp_path / "other.db"
    r = relay(d.socket_path, "--db", str(other), stdin=LIST)
    assert r.returncode == 1
    assert r.stdout == b""
    err = r.stderr.decode()
    assert err.count("\n") == 1
    assert str(d.db_path) in err and str(other) in err
    assert not other.exists()  # never opened, never created
    async with socket_client(d.socket_path) as raw:
        assert await state(raw) == before


async def test_a_store_served_on_another_socket_is_named_with_its_owner(daemon_factory: Any,
                                                                       sock_dir: Path) -> None:
    d: Daemon = daemon_factory()
    elsewhere = sock_dir / "elsewhere.sock"
    r = relay(elsewhere, "--db", str(d.db_path), stdin=LIST)
    assert r.returncode == 1
    err = r.stderr.decode()
    assert err.count("\n") == 1
    assert "STORE_LOCKED" in err
    assert f"memoryd pid {d.proc.pid}" in err
    assert str(d.socket_path) in err and str(elsewhere) in err and str(d.db_path) in err
    assert not elsewhere.exists()


async def test_a_write_policy_that_differs_from_the_daemons_is_refused(daemon_factory: Any) -> None:
    d: Daemon = daemon_factory(policy="auto")
    r = relay(d.socket_path, "--write-policy", "ask", stdin=LIST)
    assert r.returncode == 1
    assert "runs write policy 'auto', not 'ask'" in r.stderr.decode()


def test_the_relay_does_not_import_the_daemon_stack(daemon_factory: Any) -> None:
    """Nor what only a daemon's start, a key or a config file needs: the relay's start is
    a harness's wait for its tools."""
    d: Daemon = daemon_factory()
    code = ("import sys, memoryd.cli as c\n"
            f"rc = c.main(['serve', '--stdio', '--socket', {str(d.socket_path)!r}])\n"
            "heavy = ('anyio', 'jsonrpcserver', 'msgspec', 'sqlite3', 'memoryd.app', 'memoryd.store',\n"
            "         'subprocess', 'dataclasses', 'hashlib', 'secrets', 'tomllib')\n"
            "print(rc, [m for m in heavy if m in sys.modules], file=sys.stderr)\n")
    r = subprocess.run([sys.executable, "-c", code], input=LIST, capture_output=True, timeout=30)
    assert r.stderr.decode().strip().splitlines()[-1] == "0 []"
    assert json.loads(r.stdout)["id"] == 1


def test_a_standalone_start_reads_no_distributions(tmp_path: Path) -> None:
    """``serve --stdio --standalone --db D``: with no third-party adapter installed,
    importlib.metadata is never imported (adapter_registry.may_register). The daemon serves
    its store on stdio all the same."""
    argv = ["serve", "--stdio", "--standalone", "--db", str(tmp_path / "m.db"), "--log-level", "warning"]
    code = ("import sys, memoryd.cli as c\n"
            f"rc = c.main({argv!r})\n"
            "heavy = ('importlib.metadata', 'email', 'zipfile')\n"
            "print(rc, [m for m in heavy if m in sys.modules], file=sys.stderr)\n")
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_RUNTIME_DIR", "MEMORYD_SOCKET")}
    r = subprocess.run([sys.executable, "-c", code], input=LIST, capture_output=True, timeout=30,
                       env={**env, "XDG_CONFIG_HOME": str(tmp_path / "no-config")})
    assert r.stderr.decode().strip().splitlines()[-1] == "0 []"
    assert json.loads(r.stdout) == {"jsonrpc": "2.0", "id": 1, "result": []}


def test_detach_starts_once_and_reports_a_running_daemon(sock_dir: Path, tmp_path: Path) -> None:
    sock = sock_dir / "memoryd.sock"
    args = [sys.executable, "-m", "memoryd", "serve", "--detach", "--socket", str(sock), "--db", str(tmp_path / "m.db")]
    first = subprocess.run(args, capture_output=True, timeout=30)
    assert first.returncode == 0, first.stderr
    pid = int(first.stdout)
    assert peer_pid(sock) == pid
    second = subprocess.run(args, capture_output=True, timeout=30)
    assert second.returncode == 0
    assert second.stdout == b""
    assert second.stderr.decode() == f"memoryd: already running on {sock}\n"
    stop(pid)
    assert not sock.exists()


# --- SIGTERM in the first moment the socket exists ------------------------------------

_IN_MOVED_TO = 0x00000080
_IN_CREATE = 0x00000100


@contextmanager
def _inotify(directory: Path) -> Iterator[int]:
    """An inotify descriptor watching ``directory`` for new names (Linux)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_CLOEXEC)
    assert fd >= 0, os.strerror(ctypes.get_errno())
    try:
        assert libc.inotify_add_watch(fd, str(directory).encode(), _IN_MOVED_TO | _IN_CREATE) >= 0
        yield fd
    finally:
        os.close(fd)


def _wait_for_name(fd: int, name: str, timeout: float = 20) -> None:
    while True:
        readable, _, _ = select.select([fd], [], [], timeout)
        assert readable, f"{name} did not appear within {timeout}s"
        buf = os.read(fd, 65536)
        while buf:
            _wd, _mask, _cookie, length = struct.unpack_from("iIII", buf)
            if buf[16:16 + length].rstrip(b"\0").decode() == name:
                return
            buf = buf[16 + length:]


def test_sigterm_the_moment_the_socket_appears_drains_and_exits_0(sock_dir: Path, tmp_path: Path) -> None:
    """The signal handlers are in place before the socket exists, so a SIGTERM that
    arrives while it is being bound (the temporary name appears, then moves into place)
    ends in a clean exit, socket removed. Before the fix this always died of the signal."""
    sock = sock_dir / "memoryd.sock"
    with _inotify(sock_dir) as fd:
        proc = subprocess.Popen([sys.executable, "-m", "memoryd", "serve", "--socket", str(sock),
                                 "--db", str(tmp_path / "m.db")],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _wait_for_name(fd, f".{sock.name}.{proc.pid}")  # bind_unix binds a temporary name first
        proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err.decode()
    assert os.listdir(sock_dir) == []  # neither the socket nor its temporary name is left
    assert b"Traceback" not in err


@pytest.mark.parametrize(("args", "message"), [
    (["--standalone"], "--standalone needs --stdio"),
    (["--stdio", "--standalone", "--socket", "/tmp/x.sock"], "--socket has no meaning with --standalone"),
    (["--detach", "--stdio"], "--detach cannot be combined with --stdio"),
])
def test_serve_option_combinations_that_mean_nothing_are_usage_errors(args: list[str], message: str) -> None:
    r = subprocess.run([sys.executable, "-m", "memoryd", "serve", *args], capture_output=True, timeout=30)
    assert r.returncode == 2
    assert message in r.stderr.decode()


def test_a_process_that_accepts_but_never_answers_does_not_hang_the_relay(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket as socketlib

    from memoryd import relay as relay_mod

    monkeypatch.setattr(relay_mod, "PROBE_TIMEOUT_S", 0.2)
    ours, silent = socketlib.socketpair()
    with ours, silent:
        with pytest.raises(relay_mod.RelayError, match=r"did not answer within 0.2s"):
            relay_mod.check_store(ours, Path("/x/memoryd.sock"), None, None)
        assert silent.recv(4096).startswith(b'{"jsonrpc": "2.0", "id": "memoryd-relay-probe"')


def test_a_socket_path_too_long_to_bind_is_one_line_before_the_store_is_made(tmp_path: Path) -> None:
    sock = Path("/tmp") / ("s" * 100) / "memoryd.sock"
    db = tmp_path / "never.db"
    r = subprocess.run([sys.executable, "-m", "memoryd", "serve", "--socket", str(sock), "--db", str(db)],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1 and "is too long for a Unix socket" in r.stderr, r.stderr
    assert not db.exists() and not sock.parent.exists()
