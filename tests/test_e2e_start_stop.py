"""Start and stop with real daemons: SIGTERM while writes stream in, SIGTERM with an
approval pending, and kill -9 around the moment the socket is moved into place."""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import spawn_ready
from e2e_helpers import Gate, add, entry_input
from rawclient import socket_client, write_ctx
from test_e2e_relay import _inotify, _wait_for_name

pytestmark = pytest.mark.anyio

STOPPING = {"code": "WRITE_DENIED", "message": "the daemon is stopping", "details": {"outcome": "cancelled"}}
WRITES = 3000


def _ledger(db: Path) -> list[tuple[str, str]]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute("SELECT action, text FROM audit WHERE action != 'recalled' ORDER BY seq").fetchall()
    finally:
        conn.close()


def _write_line(n: int) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": n, "method": "memory/add",
                       "params": {"input": entry_input(f"pipelined write {n:05d}"), "write": write_ctx()}}).encode()


async def _pipeline(path: Path, proc: subprocess.Popen[bytes]) -> tuple[dict[int, dict[str, Any]], float]:
    """Send WRITES memory/add lines without waiting; SIGTERM the daemon when the first
    reply arrives; collect every reply until the daemon closes the connection. Returns the
    replies by id and the moment the signal was sent."""
    replies: dict[int, dict[str, Any]] = {}
    first = anyio.Event()
    sent_at = 0.0
    stream = await anyio.connect_unix(str(path))
    async with stream, anyio.create_task_group() as tg:

        async def sender() -> None:
            await stream.send(json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {}}).encode()
                              + b"\n")
            payload = b"".join(_write_line(n) + b"\n" for n in range(1, WRITES + 1))
            try:
                for at in range(0, len(payload), 65536):
                    await stream.send(payload[at:at + 65536])
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass  # the daemon stopped reading and closed: the rest was never read

        tg.start_soon(sender)
        buf = b""
        while True:
            try:
                chunk = await stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                break
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                msg = json.loads(line)
                if msg.get("id"):
                    replies[msg["id"]] = msg
                    if not first.is_set():
                        first.set()
                        proc.send_signal(signal.SIGTERM)
                        sent_at = time.monotonic()
        tg.cancel_scope.cancel()
    return replies, sent_at


async def test_sigterm_while_writes_stream_in_commits_or_denies_each_and_exits_0_within_5s(
        daemon_factory: Any, tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("[budgets.user]\nuser_global = 10000000\n")
    d = daemon_factory("--config", str(cfg))
    replies, sent_at = await _pipeline(d.socket_path, d.proc)
    rc = await anyio.to_thread.run_sync(d.proc.wait, 5.0)
    assert rc == 0, d.stderr()
    assert time.monotonic() - sent_at < 5.0
    assert "Traceback" not in d.stderr()
    assert not d.socket_path.exists()

    committed = {n for n, r in replies.items() if "result" in r}
    denied = {n for n, r in replies.items() if "error" in r}
    for n in denied:
        assert replies[n]["error"]["data"] == STOPPING, replies[n]
    # the signal came while writes were still arriving: both kinds are there
    assert committed and denied
    # requests are served in the order sent: every commit precedes every denial
    assert max(committed) < min(denied)

    ledger = _ledger(d.db_path)
    text = {f"pipelined write {n:05d}": n for n in range(1, WRITES + 1)}
    adds = [text[t] for a, t in ledger if a == "add"]
    denials = [text[t] for a, t in ledger if a == "add-denied"]
    assert [a for a, _ in ledger] == ["add"] * len(adds) + ["add-denied"] * len(denials)
    assert set(adds) == committed and set(denials) == denied  # unanswered: never read, nothing written

    again = daemon_factory("--config", str(cfg), db=d.db_path, name="again")
    async with socket_client(again.socket_path) as raw:
        entries = await raw.ok("memory/list", {})
    assert {text[e["text"]] for e in entries} == committed


async def test_sigterm_with_an_approval_pending_denies_it_after_its_row_and_refuses_new_writes(
        ask_daemon: Any) -> None:
    async with socket_client(ask_daemon.socket_path) as raw, socket_client(ask_daemon.socket_path) as other:
        gate = Gate()
        raw.on_approval = gate
        await raw.send_line(json.dumps({"jsonrpc": "2.0", "id": "w", "method": "memory/add", "params": {
            "input": entry_input("pending at shutdown"), "write": write_ctx()}}).encode())
        with anyio.fail_after(10):
            await gate.arrived.wait()
        ask_daemon.proc.send_signal(signal.SIGTERM)
        reply = await raw.raw_reply()
        assert reply["error"]["data"] == STOPPING
        # the denied row was committed before the reply was sent
        assert _ledger(ask_daemon.db_path) == [("add-denied", "pending at shutdown")]
        assert gate.asked[0]["text"] == "pending at shutdown"
        resolved = await raw.notification("approval/resolved")
        assert resolved["params"] == {"id": gate.asked[0]["id"], "outcome": "cancelled"}
        with anyio.fail_after(10):
            await other.closed.wait()  # the drain ends by closing every connection
    assert await anyio.to_thread.run_sync(ask_daemon.proc.wait, 5.0) == 0
    conn = sqlite3.connect(ask_daemon.db_path)
    try:
        assert conn.execute("SELECT count(*) FROM entries").fetchone() == (0,)
        assert conn.execute("SELECT outcome FROM audit").fetchall() == [("cancelled (via approval, writePolicy ask)",)]
    finally:
        conn.close()
    assert not ask_daemon.socket_path.exists()


async def test_kill_9_after_ready_leaves_a_stale_socket_that_the_next_start_replaces(
        daemon_factory: Any, tmp_path: Path) -> None:
    d = daemon_factory()
    async with socket_client(d.socket_path) as raw:
        await add(raw, "before the kill")
    d.proc.kill()
    d.proc.wait()
    with socket.socket(socket.AF_UNIX) as probe, pytest.raises(ConnectionRefusedError):
        probe.connect(str(d.socket_path))  # the socket file is left, nobody serves it
    again = daemon_factory(db=d.db_path, name="again", socket_path=d.socket_path)
    async with socket_client(again.socket_path) as raw:
        assert [e["text"] for e in await raw.ok("memory/list", {})] == ["before the kill"]
    assert sorted(os.listdir(d.socket_path.parent)) == [d.socket_path.name]


def test_kill_9_while_binding_leaves_nothing_the_next_start_trips_on(sock_dir: Path, tmp_path: Path) -> None:
    """kill -9 the moment the temporary name appears: whatever it left (the temporary name,
    or the socket just moved into place), the next start serves on the path and removes
    the dead daemon's temporary name."""
    sock = sock_dir / "memoryd.sock"
    db = tmp_path / "m.db"
    with _inotify(sock_dir) as fd:
        proc = subprocess.Popen([sys.executable, "-m", "memoryd", "serve", "--socket", str(sock), "--db", str(db)],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait_for_name(fd, f".{sock.name}.{proc.pid}")
        proc.kill()
    proc.wait()
    again = spawn_ready(["--socket", str(sock), "--db", str(db)], tmp_path / "again.stderr")
    try:
        assert os.listdir(sock_dir) == [sock.name]
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(sock))
            s.sendall(b'{"jsonrpc":"2.0","id":1,"method":"memory/list"}\n')
            assert json.loads(s.makefile("rb").readline()) == {"jsonrpc": "2.0", "id": 1, "result": []}
    finally:
        again.terminate()
        assert again.wait(10) == 0
    assert os.listdir(sock_dir) == []


async def test_a_client_that_never_reads_its_replies_does_not_hold_the_stop_past_5s(daemon: Any) -> None:
    """The drain answers what each connection has read, but a peer that reads nothing back
    holds those replies forever: the drain gives up on it after its bound."""
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(daemon.socket_path))
        s.sendall(b'{"jsonrpc":"2.0","id":1,"method":"daemon/status"}\n' * 3000)  # ~1 MB of replies, never read
        daemon.proc.send_signal(signal.SIGTERM)
        sent_at = time.monotonic()
        assert await anyio.to_thread.run_sync(daemon.proc.wait, 5.0) == 0
        assert time.monotonic() - sent_at < 5.0
    assert not daemon.socket_path.exists()
    assert "Traceback" not in daemon.stderr()
