"""MCP hosts that pipeline calls and never read, many at once, against a daemon serving its
real socket: the requests in flight over every connection together stay within
``max_inflight_total``, other clients are served meanwhile, and hosts that fall behind
are dropped by the socket's rule, with its log line, what they sent after never served."""

from __future__ import annotations

import asyncio
import json
import logging
import select
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from e2e_helpers import entry_input, state
from inprocess import InProcess
from mcp_support import INITIALIZE, INITIALIZED, PROJ, call, mcp_daemon
from rawclient import write_ctx

pytestmark = pytest.mark.anyio

WS = {"track": "user", "scope": "workspace"}
#: a write of no agent: its entries are in the layer every agent shares, which MCP sessions see
SHARED = {"agent": {"session": {"id": "s-0", "header": {"cwd": PROJ}}}}


def line(message: dict[str, Any]) -> bytes:
    return json.dumps(message).encode() + b"\n"


def hung_up(s: socket.socket) -> bool:
    """The daemon closed its end (a one-shot look, not a wait)."""
    p = select.poll()
    p.register(s, select.POLLHUP)
    return any(ev & select.POLLHUP for _, ev in p.poll(0))


async def read_reply(s: socket.socket, id_: Any) -> dict[str, Any]:
    """Read ``s`` up to the reply with ``id_`` (what follows it in the same read is let go)."""
    f = s.makefile("rb")
    try:
        while True:
            raw = await anyio.to_thread.run_sync(f.readline)
            assert raw.endswith(b"\n"), "the daemon closed the connection"
            msg = json.loads(raw)
            if msg.get("id") == id_:
                return msg  # type: ignore[no-any-return]
    finally:
        f.close()


async def hang_ups(socks: list[socket.socket], want: int, reader: Any) -> list[int]:
    """Wait until ``want`` of ``socks`` are hung up by the daemon, each in a thread blocked in
    ``poll`` (woken by a hang-up, or by the last one seen); the reader is served meanwhile."""
    wake_r, wake_w = socket.socketpair()
    seen: list[int] = []

    def wait(s: socket.socket) -> bool:
        p = select.poll()
        p.register(s, select.POLLHUP)
        p.register(wake_r, select.POLLIN)
        # the bound only keeps a failing run from hanging: a hang-up or the wake ends the wait
        return any(fd == s.fileno() and ev & select.POLLHUP for fd, ev in p.poll(60_000))

    async def one(k: int, s: socket.socket) -> None:
        if await anyio.to_thread.run_sync(wait, s):
            seen.append(k)
            if len(seen) == want:
                wake_w.send(b"!")

    try:
        async with anyio.create_task_group() as tg:
            for k, s in enumerate(socks):
                tg.start_soon(one, k, s)
            assert len(await reader.ok("memory/list", {})) == 100  # served while they stall
    finally:
        wake_r.close()
        wake_w.close()
    return seen


@asynccontextmanager
async def hosts(d: InProcess, n: int) -> AsyncIterator[list[socket.socket]]:
    """``n`` MCP sessions over the daemon's socket (``mcp/attach``, as ``memoryd mcp`` sends
    it), each initialized; the test then writes to them and reads nothing more."""
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(str(d.daemon.config.socket_path))
            socks.append(s)
            s.sendall(line({"jsonrpc": "2.0", "id": "attach", "method": "mcp/attach", "params": {"cwd": PROJ}}))
            assert "result" in await read_reply(s, "attach")
            s.sendall(line(INITIALIZE) + line(INITIALIZED))
            assert "result" in await read_reply(s, 0)
        yield socks
    finally:
        for s in socks:
            s.close()


async def test_hosts_that_pipeline_and_never_read_hold_at_most_max_inflight_total(
        tmp_path: Path, sock_dir: Path) -> None:
    """Eight hosts each pipeline 300 calls (more than a session's own window) and never read:
    the daemon holds at most ``max_inflight_total`` of them at once, over all eight, and a
    client that reads is served meanwhile, its write taking its turn for a place."""
    cap, n, calls = 64, 8, 300
    async with mcp_daemon(tmp_path, sock_dir, config=f"max_inflight_total = {cap}\n") as d, \
            d.connect() as reader, hosts(d, n) as socks:
        before = await state(reader)
        idle = len(asyncio.all_tasks())
        for s in socks:
            s.sendall(b"".join(line(call(i, "memory_list", {})) for i in range(1, calls + 1)))
        for s in socks:
            # its first reply, and nothing after: the daemon is taking its calls now, more of
            # them than there are places
            assert (await read_reply(s, 1))["result"]["isError"] is False
        # a write takes a place as every call does: answered while the hosts still wait for theirs
        added = await reader.ok("memory/add", {"input": entry_input("the reader's fact"), "write": write_ctx()})
        # Every call in flight is two tasks (the SDK's request and the session's call); the
        # sessions' own tasks are in ``idle``. Without the bound this is thousands.
        held = len(asyncio.all_tasks()) - idle
        assert held <= 2 * cap + 4, held
        outbound = d.daemon.outbound
        assert outbound.inflight_peak == cap
        entries, _, writes = await state(reader)
        assert [e["text"] for e in entries] == [*[e["text"] for e in before[0]], "the reader's fact"]
        assert writes == before[2] + 1 and added["entry"]["text"] == "the reader's fact"
        assert not any(hung_up(s) for s in socks)  # holding nothing, they are not dropped
    # every place came back once the hosts were gone
    assert d.daemon.outbound.inflight == 0


async def test_hosts_that_stop_reading_are_dropped_by_the_socket_s_rule_and_served_no_further(
        tmp_path: Path, sock_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Eight hosts each pipeline 60 lists of a 100-entry store (MBs of replies) and then a
    marked write, and never read. They fall behind, and are dropped as socket clients are
    (max_unsent_bytes_total), the first behind first, with the socket's log line; the one left
    holding the most is served. No dropped host's write is applied, and a reading client is
    answered throughout."""
    config = ("max_unsent_bytes_total = 1048576\nmax_inflight_total = 16\n"
              "[budgets.user]\nuser_global = 200000\nworkspace = 200000\n")
    n = 8
    caplog.set_level(logging.WARNING, "memoryd.transports")
    async with mcp_daemon(tmp_path, sock_dir, config=config) as d, d.connect() as reader:
        await reader.ok("memory/seed", {"inputs": [{"track": "user", "scope": "user-global", "text": f"fact {i} " * 12}
                                                    for i in range(100)], "write": SHARED})
        async with hosts(d, n) as socks:
            before = await state(reader)  # each session's first snapshot is in its ledger rows
            for k, s in enumerate(socks):
                s.sendall(b"".join(line(call(i, "memory_list", {})) for i in range(1, 61))
                          + line(call(61, "memory_add", {**WS, "text": f"marker {k}"})))
            dropped = await hang_ups(socks, n - 1, reader)
            left = sorted(set(range(n)) - set(dropped))
            assert len(left) == 1 and not hung_up(socks[left[0]])
            # the one left, holding the most, is served to its end: its write too
            reply = await read_reply(socks[left[0]], 61)
            assert reply["result"]["isError"] is False
        entries, _, writes = await state(reader)
        assert [e["text"] for e in entries[100:]] == [f"marker {left[0]}"]
        # the seeded entries as they were (a list records no recall), and one write more
        assert [(e["id"], e["text"]) for e in entries[:100]] == [(e["id"], e["text"]) for e in before[0]]
        assert writes == before[2] + 1
    lines = [r.getMessage() for r in caplog.records if r.name == "memoryd.transports"]
    assert lines and all(x.startswith("dropping a connection that stopped reading: ") for x in lines)
