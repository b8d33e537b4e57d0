"""The in-process tier's own seam (Daemon.running / serve_stream / listen): leaving
``running()`` stops the daemon as SIGTERM does, and lets go of the store."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import start_thread_daemon
from e2e_helpers import Gate, add
from inprocess import InProcess, memory_daemon
from rawclient import socket_client

pytestmark = pytest.mark.anyio

PENDING = (b'{"jsonrpc":"2.0","id":"w","method":"memory/add","params":{"input":{"track":"user",'
           b'"scope":"user-global","text":"pending at shutdown"},"write":{"agent":{}}}}')


async def test_leaving_running_denies_a_pending_write_and_closes_the_store(tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    stop = anyio.Event()

    async def run(*, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        async with memory_daemon(["--db", str(db), "--write-policy", "ask"]) as d:
            task_status.started(d)
            await stop.wait()

    async with anyio.create_task_group() as tg:
        d: InProcess = await tg.start(run)
        async with d.connect() as raw:
            gate = Gate()
            raw.on_approval = gate
            await raw.send_line(PENDING)
            with anyio.fail_after(10):
                await gate.arrived.wait()
            stop.set()  # leave running(): the drain
            reply = await raw.raw_reply()
            assert reply["error"]["data"]["details"] == {"outcome": "cancelled"}
            with anyio.fail_after(10):
                await raw.closed.wait()  # the drain ends the connection
    conn = sqlite3.connect(db)
    rows = conn.execute("SELECT action, outcome FROM audit").fetchall()
    assert rows == [("add-denied", "cancelled (via approval, writePolicy ask)")]
    assert conn.execute("SELECT count(*) FROM entries").fetchone() == (0,)
    conn.close()
    # the store was let go of: a second daemon opens it
    async with memory_daemon(["--db", str(db), "--write-policy", "auto"]) as again, again.connect() as raw:
        assert (await add(raw, "after"))["entry"]["text"] == "after"


async def test_a_thread_daemon_serves_its_socket_and_stops_cleanly(tmp_path: Path) -> None:
    d = start_thread_daemon(tmp_path, name="t")
    try:
        async with socket_client(d.socket_path) as raw:
            await add(raw, "over the socket")
    finally:
        assert d.stop() == 0
    assert not d.socket_path.exists()  # the drain removed it, as a stopping daemon does
    assert d.stop() == 0  # a second stop does nothing
    conn = sqlite3.connect(d.db_path)
    assert conn.execute("SELECT text FROM entries").fetchall() == [("over the socket",)]
    conn.close()


async def test_a_seed_runs_on_the_writers_thread_while_the_event_loop_serves(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A seed's rows run on the writer's thread, as every write's do, all in one job: the
    event loop serves meanwhile (here: a task that the seed's first row wakes runs before its
    next row is written)."""
    import asyncio
    import threading

    from e2e_helpers import entry_input, write_ctx
    from memoryd import storefile

    events: list[tuple[str, int]] = []
    first = anyio.Event()
    served = threading.Event()
    opened = storefile.open_store
    loop = asyncio.get_running_loop()

    def inserted(sql: str) -> None:
        if sql.startswith("INSERT INTO entries"):
            events.append(("insert", threading.get_ident()))
            if len(events) == 1:
                loop.call_soon_threadsafe(first.set)
                assert served.wait(10), "the event loop did not run while the seed held the writer's thread"

    def traced(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn = opened(*args, **kwargs)
        conn.set_trace_callback(inserted)
        return conn

    monkeypatch.setattr(storefile, "open_store", traced)
    loop_thread = threading.get_ident()

    async def meanwhile() -> None:
        await first.wait()
        events.append(("meanwhile", threading.get_ident()))
        served.set()

    n = 5
    async with memory_daemon(["--db", str(tmp_path / "m.db"), "--write-policy", "auto"]) as d, d.connect() as raw:
        async with anyio.create_task_group() as tg:
            tg.start_soon(meanwhile)
            await anyio.wait_all_tasks_blocked()
            inputs = [entry_input(f"fact {k}") for k in range(n)]
            await raw.ok("memory/seed", {"inputs": inputs, "write": write_ctx()})
    writer_thread = events[0][1]
    assert writer_thread != loop_thread
    assert events == [("insert", writer_thread), ("meanwhile", loop_thread), *[("insert", writer_thread)] * (n - 1)]
