"""Unsent output, per connection and over all of them (max_unsent_bytes_total), against a
real daemon: a peer that does not read holds one reply and is served nothing more until it
reads; peers that stopped reading are dropped, the longest behind first, once together they
hold more than the cap; a client that reads is served throughout."""

from __future__ import annotations

import array
import fcntl
import json
import os
import select
import socket
import sqlite3
import subprocess
import sys
import termios
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest
from e2e_helpers import entry_input, state
from memoryd.transports import stdio_stream
from rawclient import socket_client, write_ctx

pytestmark = pytest.mark.anyio

CELLS = [("user", "user-global"), ("user", "workspace"), ("agent", "user-global"), ("agent", "workspace")]
BUDGETS = "[budgets.user]\nuser_global = 1000000\nworkspace = 1000000\n" \
          "[budgets.agent]\nuser_global = 1000000\nworkspace = 1000000\n"
#: 1000 audit rows of about 1.5 kB of text each: an audit/list of them is a reply of MBs
ROWS, TEXT = 1000, 1500
#: the cap these tests set: a few such replies
CAP = 8 * 1024 * 1024


def config(tmp_path: Path, text: str) -> Path:
    cfg = tmp_path / "memoryd.toml"
    cfg.write_text(text + BUDGETS)
    return cfg


def status(pid: int, key: str) -> int:
    """A line of /proc/<pid>/status, in kB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {key} for pid {pid}")


def call(id_: int, method: str, params: dict[str, Any]) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": id_, "method": method, "params": params}).encode() + b"\n"


async def fill_audit(raw: Any) -> None:
    """ROWS audit rows (and as many entries), in seeds of 250."""
    for b in range(ROWS // 250):
        inputs = [entry_input(f"{b}.{i} " + "x" * TEXT, *CELLS[i % 4]) for i in range(250)]
        await raw.ok("memory/seed", {"inputs": inputs, "write": write_ctx()})


def reply_line(result: Any) -> int:
    """The length of the line that answers an id of one digit with ``result``."""
    return len(json.dumps({"jsonrpc": "2.0", "id": 1, "result": result}, separators=(",", ":"),
                          ensure_ascii=False).encode()) + 1


def queued(s: socket.socket) -> int:
    """Bytes the kernel holds for ``s`` to read: what the daemon sent and we did not read."""
    n = array.array("i", [0])
    fcntl.ioctl(s.fileno(), termios.FIONREAD, n)
    return n[0]


def hung_up(s: socket.socket) -> bool:
    """The daemon closed its end (a one-shot look, not a wait)."""
    p = select.poll()
    p.register(s, select.POLLHUP)
    return any(ev & select.POLLHUP for _, ev in p.poll(0))


def read_until_reply(s: socket.socket, id_: int) -> list[dict[str, Any]]:
    """Every message up to and including the reply with ``id_`` (blocking)."""
    got: list[dict[str, Any]] = []
    f = s.makefile("rb")
    while not got or got[-1].get("id") != id_:
        line = f.readline()
        assert line.endswith(b"\n"), "the daemon closed the connection"
        got.append(json.loads(line))
    return got


async def test_peers_that_stop_reading_hold_at_most_the_cap_and_a_reader_is_served(daemon_factory: Any,
                                                                                 tmp_path: Path) -> None:
    """100 connections each pipeline audit/list (a reply of MBs), a marked memory/add, and
    more audit/lists, and never read. Each is served its first request only; the longest
    behind are dropped while the rest hold more than the cap (never the one holding the
    most), and what a dropped one sent after is never served. A client that reads gets every
    answer meanwhile, and the daemon's memory stays bounded: without the cap the hundred
    replies alone would be hundreds of MB held."""
    d = daemon_factory("--config", str(config(tmp_path, f"max_unsent_bytes_total = {CAP}\n")))
    pid = d.proc.pid
    async with socket_client(d.socket_path) as reader:
        await fill_audit(reader)
        line = reply_line(await reader.ok("audit/list", {"limit": ROWS}))
        assert line > 2_500_000  # what each peer below is sent and never reads
        before = await state(reader)
        rss_before = status(pid, "VmRSS")
        peers: list[socket.socket] = []
        try:
            for n in range(100):
                if n % 25 == 12:
                    # The reading client is answered, a big reply too. While it reads, its
                    # reply counts as any (a peer left behind may be dropped for it); the
                    # peers that come after fill the cap again.
                    assert len(await reader.ok("audit/list", {"limit": ROWS})) == ROWS
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.connect(str(d.socket_path))
                s.sendall(call(1, "audit/list", {"limit": ROWS})
                          + call(2, "memory/add", {"input": entry_input(f"marker {n}"), "write": write_ctx(f"p-{n}")})
                          + b"".join(call(k, "audit/list", {"limit": ROWS}) for k in range(3, 6)))
                peers.append(s)
                with anyio.fail_after(30):
                    await anyio.wait_readable(s)  # its first reply is on its way: it is behind now
            await reader.ok("daemon/status", {})  # the daemon has seen to the last one's reply
            rss_after, hwm = status(pid, "VmRSS"), status(pid, "VmHWM")

            dropped = [hung_up(s) for s in peers]
            kept = dropped.count(False)
            # the oldest went first: the ones left are the newest
            assert dropped == [True] * (100 - kept) + [False] * kept
            unsent = [line - queued(s) for s in peers[100 - kept:]]
            # Each left holds what the kernel did not take of its one reply; apart from the
            # largest (one reply always goes out), the cap is as full as it can be.
            assert len(set(unsent)) == 1
            assert kept == 1 + CAP // unsent[0]
            # every reply a peer left behind counts: without the drops this would be 100 of them
            assert (rss_after - rss_before) * 1024 < 100 * 1024 * 1024
            assert hwm * 1024 < 300 * 1024 * 1024
            # no peer was served its marked write: the dropped never, the kept not yet
            assert await state(reader) == before
            # a kept peer that reads is served the rest of what it sent, in order
            messages = await anyio.to_thread.run_sync(read_until_reply, peers[-1], 2)
            replies = [m for m in messages if "id" in m]
            assert [r["id"] for r in replies] == [1, 2]
            assert replies[1]["result"]["entry"]["text"] == "marker 99"
            entries, _, writes = await state(reader)
            assert [e["text"] for e in entries[ROWS:]] == ["marker 99"] and writes == before[2] + 1
        finally:
            for s in peers:
                s.close()
    assert "dropping a connection that stopped reading" in d.stderr()


async def test_approvals_reach_an_approver_while_the_cap_is_full(daemon_factory: Any, tmp_path: Path) -> None:
    """Peers that stopped reading hold the cap full; a write asks its approval of a
    subscribed approver, which gets ``approval/asked`` at once and decides it: notifications
    never wait, and the peers holding the cap are not dropped for them."""
    d = daemon_factory("--config", str(config(tmp_path, f'approvers = "any"\nmax_unsent_bytes_total = {CAP}\n')),
                       policy="ask")
    peers: list[socket.socket] = []
    async with socket_client(d.socket_path) as approver, \
            socket_client(d.socket_path, approvals=False, foreign=True) as writer:
        async def allow(params: dict[str, Any]) -> str:
            return "allowed-once"

        approver.on_approval = allow
        await approver.ok("approval/subscribe", {})
        await fill_audit(writer)
        line = reply_line(await writer.ok("audit/list", {"limit": ROWS}))
        try:
            for _ in range(8):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.connect(str(d.socket_path))
                s.sendall(call(1, "audit/list", {"limit": ROWS}))
                peers.append(s)
                with anyio.fail_after(30):
                    await anyio.wait_readable(s)
            await writer.ok("daemon/status", {})  # the daemon has seen to the last one's reply
            held = [hung_up(s) for s in peers].count(False)
            unsent = line - queued(peers[-1])
            assert held == 1 + CAP // unsent  # the cap is as full as it can be
            added = await writer.ok("memory/add", {"input": entry_input("asked while full"), "write": write_ctx()})
            assert added["entry"]["text"] == "asked while full"
            asked = [n["params"] for n in approver.notifications if n["method"] == "approval/asked"]
            assert [a["action"] for a in asked] == ["seed"] * (ROWS // 250) + ["add"]
            assert asked[-1]["text"] == "asked while full"
            assert [hung_up(s) for s in peers].count(False) == held
        finally:
            for s in peers:
                s.close()


def test_stdio_serves_no_further_request_while_its_reply_waits_unsent(tmp_path: Path) -> None:
    """The stdio transport: a harness that does not read its stdout is served nothing more;
    once it reads, the rest follows in order. It is the only connection, so the cap never
    drops it, however long the reply."""
    db = tmp_path / "m.db"
    cfg = config(tmp_path, "max_unsent_bytes_total = 1048576\n")
    args = [sys.executable, "-m", "memoryd", "serve", "--stdio", "--standalone", "--db", str(db),
            "--write-policy", "auto", "--config", str(cfg)]
    with subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=dict(os.environ)) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        try:
            inputs = [entry_input(f"{i} " + "x" * TEXT, *CELLS[i % 4]) for i in range(250)]
            proc.stdin.write(call(1, "memory/seed", {"inputs": inputs, "write": write_ctx()}))
            proc.stdin.flush()
            while json.loads(proc.stdout.readline()).get("id") != 1:
                pass
            proc.stdin.write(call(2, "memory/list", {})
                             + call(3, "memory/add", {"input": entry_input("after the list"), "write": write_ctx()}))
            proc.stdin.flush()
            assert select.select([proc.stdout], [], [], 30)[0]  # the list's reply is on its way
            # its reply is larger than the pipe holds: the add cannot have been served
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as ro:
                assert ro.execute("SELECT count(*) FROM entries WHERE text = 'after the list'").fetchone() == (0,)
            got = []
            while not got or got[-1].get("id") != 3:
                got.append(json.loads(proc.stdout.readline()))
            replies = [m for m in got if "id" in m]
            assert [r["id"] for r in replies] == [2, 3]
            assert len(replies[0]["result"]) == 250
            assert replies[1]["result"]["entry"]["text"] == "after the list"
        finally:
            proc.stdin.close()
            proc.wait(30)


async def test_a_long_line_goes_out_whole_and_in_order_before_the_close() -> None:
    """A line longer than a transport takes at once is queued as posted (not copied) and fed
    as the peer reads; lines posted after it follow it, and ``finish`` sends them all before
    it closes."""
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    received = bytearray()

    def read() -> None:
        while chunk := os.read(out_r, 65536):
            received.extend(chunk)

    reader = threading.Thread(target=read)
    long = b"a" * (5 * 1024 * 1024) + b"\n"
    try:
        async with stdio_stream(in_r, out_w) as (_stdin, proto):
            proto.post(b"first\n")
            proto.post(long)
            assert proto.unsent() > 4 * 1024 * 1024  # the pipe took a little; nobody reads yet
            proto.post(b"after\n")
            reader.start()
            with anyio.fail_after(30):
                await proto.finish()
        os.close(out_w)  # the stream leaves its descriptors open: this is the reader's EOF
        out_w = -1
        reader.join(30)
        assert bytes(received) == b"first\n" + long + b"after\n"
    finally:
        for fd in (in_r, in_w, out_r, out_w):
            if fd >= 0:
                os.close(fd)
