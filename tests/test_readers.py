"""Reads (memoryd.readers): every read of the store runs on a reader's thread, so a long
read in flight there holds up nothing on the event loop."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest
from e2e_helpers import entry_input, write_ctx
from inprocess import memory_daemon
from memoryd import ledger, queries, readers, store
from test_query_plans import chain_newest_audit_row, entry, opened

pytestmark = pytest.mark.anyio

BIG = 100_000


def uuid_of(k: int) -> str:
    return f"00000000-0000-4000-8000-{k:012d}"


def seed(path: Path, n: int) -> None:
    """``n`` entries of agent/user-global, written as memoryd's own writes leave them (a
    trusted store); user/user-global stays empty, with room for a write."""
    with opened(path) as conn:
        with ledger.transaction(conn) as tx:
            for k in range(n):
                e = entry(k, f"fact number {k} of a large store", "agent")
                e.id = uuid_of(k)
                store.insert_entry(tx, e)
        chain_newest_audit_row(conn)


async def test_a_scan_of_100000_entries_in_flight_holds_up_no_approval_and_no_small_query(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The scan is held inside its read on a reader's thread. Meanwhile another connection's
    write asks for an approval, gets it and commits, and a small query on a third is
    answered: had the scan run on the event loop, neither could be. Once let go, the scan
    answers with every entry counted, the new one too."""
    db = tmp_path / "big.db"
    seed(db, BIG)
    scanning, release = threading.Event(), threading.Event()
    real = queries.query_page

    def held(conn: Any, **kw: Any) -> Any:
        if kw["text"] == "fact number":
            scanning.set()
            release.wait(60)
        return real(conn, **kw)

    monkeypatch.setattr(queries, "query_page", held)
    async with memory_daemon(["--db", str(db), "--write-policy", "ask"]) as d, \
            d.connect() as scanner, d.connect() as writer, d.connect() as other:
        async def allow(params: dict[str, Any]) -> str:
            return "allowed-once"

        writer.on_approval = allow
        scan: dict[str, Any] = {}
        async with anyio.create_task_group() as tg:
            async def run_scan() -> None:
                scan["reply"] = await scanner.ok("memory/query", {"filter": {"text": "fact number", "limit": 5}})

            tg.start_soon(run_scan)
            try:
                with anyio.fail_after(30):
                    await anyio.to_thread.run_sync(scanning.wait)
                added = await writer.ok("memory/add", {"input": entry_input("written while the scan runs"),
                                                      "write": write_ctx()})
                small = await other.ok("memory/query", {"filter": {"text": "number 4242 of", "limit": 1}})
                assert "reply" not in scan  # still held on its reader's thread
            finally:
                release.set()
        assert added["entry"]["text"] == "written while the scan runs"
        assert [e["id"] for e in small["entries"]] == [uuid_of(4242)]
        assert scan["reply"]["total"] == BIG and len(scan["reply"]["entries"]) == 5  # the add has no "fact number"


async def test_every_read_a_small_stores_query_too_runs_on_a_reader_in_one_transaction(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A query of a one-entry store runs where every other read does: on a reader's thread,
    never on the event loop, inside one read transaction (one moment of the store)."""
    loop_thread = threading.get_ident()
    seen: list[tuple[bool, bool]] = []
    real = queries.query_page

    def watched(conn: Any, **kw: Any) -> Any:
        seen.append((threading.get_ident() == loop_thread, conn.in_transaction))
        return real(conn, **kw)

    monkeypatch.setattr(queries, "query_page", watched)
    async with memory_daemon(["--db", str(tmp_path / "m.db"), "--write-policy", "auto"]) as d, d.connect() as raw:
        await raw.ok("memory/add", {"input": entry_input("a small store"), "write": write_ctx()})
        got = await raw.ok("memory/query", {"filter": {"text": "small"}})
    assert [e["text"] for e in got["entries"]] == ["a small store"]
    assert seen == [(False, True)]


async def test_queries_in_flight_share_one_commit_of_their_recalls_and_reply_after_it(tmp_path: Path) -> None:
    """Eight queries whose recalls queue while the writer is busy: their recalls are one
    batch, one COMMIT under synchronous=NORMAL (no fsync), and each reply comes after it:
    by then the file holds every recall, and the replies show the counts 1 to 8, each once,
    as each query's own recall left it."""
    db = tmp_path / "m.db"
    async with memory_daemon(["--db", str(db), "--write-policy", "auto"]) as d, d.connect() as raw:
        added = await raw.ok("memory/add", {"input": entry_input("a recalled fact"), "write": write_ctx()})
        writer = d.daemon.service.writer
        statements: list[str] = []
        writer._sql.conn.set_trace_callback(statements.append)
        queued, all_queued, release = 0, anyio.Event(), threading.Event()
        real = writer.submit

        async def counted(fn: Any, **kw: Any) -> Any:
            nonlocal queued
            queued += 1
            if queued == 8:
                all_queued.set()
            return await real(fn, **kw)

        replies: list[Any] = []

        async def query() -> None:
            async with d.connect() as q:
                replies.append(await q.ok("memory/query", {"filter": {"text": "recalled"}}))

        async with anyio.create_task_group() as tg:
            tg.start_soon(real, lambda tx: release.wait(30))  # holds the writer's thread
            writer.submit = counted  # type: ignore[method-assign]
            for _ in range(8):
                tg.start_soon(query)
            await all_queued.wait()
            statements.clear()
            assert replies == []
            release.set()
        writer._sql.conn.set_trace_callback(None)
    # the busy batch's end, then one batch: every recall
    assert statements[:2] == ["RELEASE step", "COMMIT"]
    assert statements.count("BEGIN IMMEDIATE") == 1 and statements.count("COMMIT") == 2
    assert statements[2] == "PRAGMA synchronous = NORMAL" and "PRAGMA synchronous = FULL" not in statements
    assert sorted(r["entries"][0]["recallCount"] for r in replies) == list(range(1, 9))
    with contextlib.closing(sqlite3.connect(db)) as conn:
        assert conn.execute("SELECT recall_count FROM entries WHERE id = ?",
                            (added["entry"]["id"],)).fetchone() == (8,)


async def _blocked_read(readers: Any, started: anyio.Event, release: threading.Event) -> None:
    """A read that holds its reader's thread until ``release`` is set."""
    loop_set = started.set
    token = anyio.lowlevel.current_token()

    def held(conn: sqlite3.Connection) -> None:
        anyio.from_thread.run_sync(loop_set, token=token)
        release.wait()

    await readers.read(held)


async def test_a_cancelled_read_keeps_its_thread_until_the_read_ends_and_others_use_the_free_one(
        tmp_path: Path) -> None:
    """A caller cancelled while its read runs goes at once; its thread stays taken until the
    read ends, so the next read runs on the free thread instead of queueing behind it."""
    seed(tmp_path / "m.db", 3)
    rs = await readers.Readers.open(tmp_path / "m.db", 5000, n=2)
    release = threading.Event()
    try:
        async with anyio.create_task_group() as tg:
            started, cancelled = anyio.Event(), anyio.Event()

            async def cancelled_read() -> None:
                with anyio.CancelScope() as scope:
                    tg.start_soon(lambda: _cancel_when(started, scope))
                    await _blocked_read(rs, started, release)
                cancelled.set()

            tg.start_soon(cancelled_read)
            await cancelled.wait()
            with anyio.fail_after(10):  # queued behind the held thread, it would never run
                assert await rs.read(queries.entry_count) == 3
            release.set()
        with anyio.fail_after(10):  # both threads free again: two held reads run at once
            await _two_reads_at_once(rs)
    finally:
        release.set()
        await rs.aclose()


async def test_a_read_cancelled_while_waiting_for_a_thread_takes_none(tmp_path: Path) -> None:
    """A read waiting for a thread and cancelled meanwhile leaves the thread to the next
    read: the one thread serves it once the read holding it has ended."""
    seed(tmp_path / "m.db", 3)
    rs = await readers.Readers.open(tmp_path / "m.db", 5000, n=1)
    release = threading.Event()
    try:
        async with anyio.create_task_group() as tg:
            started = anyio.Event()
            tg.start_soon(_blocked_read, rs, started, release)
            await started.wait()
            with anyio.CancelScope() as waiting:
                waiting.cancel()  # delivered at its first wait: while it waits for a thread
                await rs.read(queries.entry_count)
            assert waiting.cancelled_caught
            release.set()
        with anyio.fail_after(10):
            assert await rs.read(queries.entry_count) == 3
    finally:
        release.set()
        await rs.aclose()


async def _cancel_when(started: anyio.Event, scope: anyio.CancelScope) -> None:
    await started.wait()
    scope.cancel()


async def _two_reads_at_once(rs: Any) -> None:
    both = threading.Barrier(2)

    def meet(conn: sqlite3.Connection) -> None:
        both.wait(timeout=10)  # one thread for both would wait here and raise BrokenBarrierError

    async with anyio.create_task_group() as tg:
        tg.start_soon(rs.read, meet)
        tg.start_soon(rs.read, meet)
