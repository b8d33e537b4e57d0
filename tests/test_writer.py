"""The single writer, in process: a real store in a temporary directory, no daemon process.

Group commit (a savepoint per job only once a job fails), the one owner thread, the bookkeeping nobody awaits
(kept ledger rows, the recall overlay), close and drain; ``atomic``; and ``Daemon.open``
letting go of everything when a later step fails.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from memoryd import adapter_registry, ledger, queries, store
from memoryd import writer as writer_module
from memoryd.adapter_registry import AdapterRegistryError
from memoryd.app import Daemon
from memoryd.atomic import atomic
from memoryd.config import Config
from memoryd.writer import Usage, Writer, WriterClosed
from memoryd_protocol.errors import BudgetExceeded, StoreUnavailable
from memoryd_protocol.ledger import consistent, read_report
from memoryd_protocol.types import Entry
from test_store_faults import run_batch

pytestmark = pytest.mark.anyio

CELL = ("user", "user-global")


def rows(db: Path, sql: str = "SELECT key, value FROM meta WHERE key LIKE 't:%' ORDER BY key",
         *args: Any) -> list[tuple[Any, ...]]:
    """What another connection sees committed."""
    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def put(key: str, delta: int = 0) -> Callable[[sqlite3.Connection, Usage], str]:
    def job(conn: sqlite3.Connection, usage: Usage) -> str:
        conn.execute("INSERT INTO meta VALUES (?, 'x')", (f"t:{key}",))
        if delta:
            usage[CELL] = usage.get(CELL, 0) + delta
        return key

    return job


@contextlib.asynccontextmanager
async def running(db: Path, *, statements: list[str] | None = None) -> AsyncIterator[Writer]:
    """A writer on a fresh store, running; closed, drained and its thread ended on exit.
    ``statements`` collects every statement the write connection runs."""
    conn = store.open_store(db, store.inspect(db), 0)
    if statements is not None:
        conn.set_trace_callback(statements.append)
    writer = Writer(conn, {}, db)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(writer.run)
            try:
                yield writer
            finally:
                writer.close()
    finally:
        await writer.aclose()


queued_then_run = run_batch  # queue every job before the writer runs (one batch), run, close


@contextlib.contextmanager
def write_lock(db: Path) -> Iterator[None]:
    other = sqlite3.connect(db, isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")
    try:
        yield
    finally:
        other.execute("ROLLBACK")
        other.close()


def fresh(tmp_path: Path) -> tuple[Path, sqlite3.Connection, Writer]:
    db = tmp_path / "w.db"
    conn = store.open_store(db, store.inspect(db), 0)
    return db, conn, Writer(conn, {}, db)


# --- group commit, savepoints, the thread -------------------------------------------------


async def test_queued_jobs_commit_as_one_transaction(tmp_path: Path) -> None:
    db, conn, writer = fresh(tmp_path)
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    try:
        assert await queued_then_run(writer, [put("a", 1), put("b", 2), put("c", 3)]) == ["a", "b", "c"]
    finally:
        await writer.aclose()
    assert statements.count("BEGIN IMMEDIATE") == 1 and statements.count("COMMIT") == 1
    assert [s for s in statements if s.startswith("SAVEPOINT")] == []  # none while no job fails
    assert rows(db) == [("t:a", "x"), ("t:b", "x"), ("t:c", "x")]
    assert writer.usage == {CELL: 6}


async def test_a_failing_job_is_rolled_back_to_its_savepoint_alone(tmp_path: Path) -> None:
    """Its rows and its usage change are undone; the jobs before and after it commit. The
    batch ran without savepoints first: the failure rolled it back whole, and it ran again
    with a savepoint per job."""
    db, conn, writer = fresh(tmp_path)
    statements: list[str] = []
    conn.set_trace_callback(statements.append)

    def over(conn: sqlite3.Connection, usage: Usage) -> None:
        put("over", 100)(conn, usage)
        raise BudgetExceeded("memory budget exceeded", {})

    try:
        first, failed, last = await queued_then_run(writer, [put("a", 1), over, put("c", 3)])
    finally:
        await writer.aclose()
    assert (first, last) == ("a", "c")
    assert isinstance(failed, BudgetExceeded)
    assert rows(db) == [("t:a", "x"), ("t:c", "x")]
    assert writer.usage == {CELL: 4}
    assert [s for s in statements if s.split()[0] in ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT")] == [
        "BEGIN IMMEDIATE", "ROLLBACK", "BEGIN IMMEDIATE", "SAVEPOINT job", "SAVEPOINT job", "ROLLBACK TO job",
        "SAVEPOINT job", "COMMIT"]


def traced(conn: sqlite3.Connection) -> list[tuple[str, int]]:
    """Every statement ``conn`` runs from now on, with the thread that ran it."""
    seen: list[tuple[str, int]] = []
    conn.set_trace_callback(lambda sql: seen.append((sql, threading.get_ident())))
    return seen


def where(seen: list[int]) -> Callable[[sqlite3.Connection, Usage], None]:
    def job(conn: sqlite3.Connection, usage: Usage) -> None:
        seen.append(threading.get_ident())

    return job


async def test_a_batch_runs_on_the_event_loop_and_commits_on_the_owner_thread(tmp_path: Path) -> None:
    """A batch's statements run on the event loop's thread, without waiting for the write
    lock there; its COMMIT alone (the WAL's write and fsync) on the writer's own thread."""
    db, conn, writer = fresh(tmp_path)
    statements = traced(conn)
    loop_thread = threading.get_ident()
    seen: list[int] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(writer.run)
        for _ in range(2):  # one after the other: two batches
            await writer.submit(where(seen))
            await writer.submit(put("a" if not seen[1:] else "b"))
        writer.close()
    thread = writer.thread
    await writer.aclose()
    assert seen == [loop_thread] * 2 and thread.ident != loop_thread
    assert thread.name == "memoryd-writer"
    assert not thread.is_alive()  # aclose ended it
    one = [("PRAGMA busy_timeout = 0", loop_thread), ("BEGIN IMMEDIATE", loop_thread),
           ("PRAGMA busy_timeout = 0", loop_thread)]  # the store's own timeout: 0 in these tests
    batches = [statements[i:i + 3] for i, (sql, _) in enumerate(statements) if sql == "PRAGMA busy_timeout = 0"
               and statements[i + 1][0] == "BEGIN IMMEDIATE"]
    assert batches == [one] * 4
    assert [t for sql, t in statements if sql == "COMMIT"] == [thread.ident] * 4
    assert {t for sql, t in statements if sql.startswith("INSERT INTO meta")} == {loop_thread}
    assert rows(db) == [("t:a", "x"), ("t:b", "x")]


async def test_a_heavy_job_or_a_large_batch_runs_on_the_owner_thread(tmp_path: Path) -> None:
    """A heavy job (a seed's batch), or more than LOOP_STEPS steps in one batch, would hold
    the event loop: that batch runs wholly on the writer's thread."""
    loop_thread = threading.get_ident()
    async with running(tmp_path / "w.db") as writer:
        seen: list[int] = []
        await writer.submit(where(seen), heavy=True)
        await writer.submit(where(seen))
        thread = writer.thread.ident
        assert seen == [thread, loop_thread]
        for steps, on in ((writer_module.LOOP_STEPS, loop_thread), (writer_module.LOOP_STEPS + 1, thread)):
            seen.clear()
            for _ in range(steps - 1):  # and the write's own job: the bookkeeping commits with it
                writer.defer(lambda conn: seen.append(threading.get_ident()))
            await writer.submit(where(seen))
            assert seen == [on] * steps


async def test_a_flush_of_bookkeeping_alone_lets_the_event_loop_turn_between_its_slices(tmp_path: Path) -> None:
    """Nobody waits for a flush of bookkeeping alone: it runs on the event loop, and what
    became ready meanwhile (a query) runs after each SLICE_STEPS of its steps, not after
    all of them; recall counters count as one step per BUMPS_PER_STEP entries. It commits
    as one transaction all the same."""
    slice_, per_step = writer_module.SLICE_STEPS, writer_module.BUMPS_PER_STEP
    db = tmp_path / "w.db"
    async with running(db) as writer:
        events: list[Any] = []
        ready = anyio.Event()

        def step(n: int) -> Callable[[sqlite3.Connection], None]:
            def run(conn: sqlite3.Connection) -> None:
                if n == 0:
                    ready.set()  # the query's turn comes once this slice is done
                events.append((n, threading.get_ident()))
                conn.execute("INSERT INTO meta VALUES (?, 'x')", (f"t:{n:03}",))

            return run

        async def query() -> None:
            await ready.wait()
            events.append("query")

        for n in range(2 * slice_ + 1):
            writer.defer(step(n))
        async with anyio.create_task_group() as tg:
            tg.start_soon(query)
            await anyio.wait_all_tasks_blocked()
            await writer.settled()
        loop_thread = threading.get_ident()
        assert events == [*((n, loop_thread) for n in range(slice_)), "query",
                          *((n, loop_thread) for n in range(slice_, 2 * slice_ + 1))]
        assert len(rows(db)) == 2 * slice_ + 1

        recalls = writer_module._Recalls()
        recalls.bumps = {f"e{n}": [1, 1000] for n in range(2 * per_step + 1)}
        recalls.rows = [step(100), step(101)]
        assert len(list(recalls.parts())) == 3 + 2


async def test_a_write_lock_held_elsewhere_is_waited_for_on_the_owner_thread_never_on_the_loop(
        tmp_path: Path) -> None:
    """Another process holds the write lock: the batch's BEGIN on the event loop gives up at
    once, and the writer's thread waits for the lock (the store's busy timeout), while the
    event loop serves everything else; the write commits once the lock is released."""
    db = tmp_path / "w.db"
    conn = store.open_store(db, store.inspect(db), 60_000)
    writer = Writer(conn, {}, db)
    statements: list[tuple[str, int]] = []
    waiting = threading.Event()

    def begun(sql: str) -> None:
        statements.append((sql, threading.get_ident()))
        if sql == "BEGIN IMMEDIATE" and threading.get_ident() == writer.thread.ident:
            waiting.set()  # its busy handler is about to wait

    conn.set_trace_callback(begun)
    seen: list[int] = []
    loop_thread = threading.get_ident()
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(writer.run)
            with write_lock(db):
                tg.start_soon(writer.submit, where(seen))
                await anyio.to_thread.run_sync(waiting.wait)
                assert seen == []  # the event loop runs (this test does), the write waits
            await writer.idle()
            writer.close()
    finally:
        await writer.aclose()
    assert seen == [writer.thread.ident]
    on_thread = [sql for sql, t in statements if t == writer.thread.ident]
    assert [sql for sql, t in statements if t == loop_thread] == [
        "PRAGMA busy_timeout = 0", "BEGIN IMMEDIATE", "PRAGMA busy_timeout = 60000"]
    assert on_thread[0] == "BEGIN IMMEDIATE" and on_thread[-2:] == ["COMMIT", "PRAGMA wal_checkpoint(PASSIVE)"]


async def test_writer_open_runs_migrations_and_the_chain_on_its_thread(tmp_path: Path) -> None:
    db = tmp_path / "w.db"
    writer = await Writer.open(db, store.inspect(db), 0)
    seen: list[int] = []
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(writer.run)
            await writer.submit(where(seen), heavy=True)
            writer.close()
    finally:
        await writer.aclose()
    assert seen == [writer.thread.ident]
    assert rows(db, "SELECT kind FROM memoryd_ledger") == [("start",)]
    assert rows(db, "SELECT value FROM meta WHERE key = 'schema_version'") == [("4",)]


# --- close and drain ------------------------------------------------------------------------


async def test_close_commits_what_is_queued_then_refuses_jobs(tmp_path: Path) -> None:
    db, conn, writer = fresh(tmp_path)
    results: list[str] = []

    async def one(key: str) -> None:
        results.append(await writer.submit(put(key)))

    async with anyio.create_task_group() as tg:
        tg.start_soon(one, "a")
        tg.start_soon(one, "b")
        await anyio.wait_all_tasks_blocked()
        writer.close()  # before the writer has run: what is queued still commits
        tg.start_soon(writer.run)
        await writer.idle()
    assert sorted(results) == ["a", "b"] and writer.depth == 0
    with pytest.raises(WriterClosed, match=r"^the store is closing$"):
        await writer.submit(put("late"))
    await writer.aclose()
    await writer.aclose()  # a second close does nothing
    assert not writer.thread.is_alive()
    with pytest.raises(sqlite3.ProgrammingError):
        conn.execute("SELECT 1")  # closed, on its thread
    assert rows(db) == [("t:a", "x"), ("t:b", "x")]


# --- logging: a failing job's traceback once ------------------------------------------------


async def test_a_failing_job_raises_to_its_caller_and_the_writer_logs_nothing(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The caller reports the error (the RPC layer logs an internal error's traceback): the
    writer logging it too put the same traceback in the log twice."""
    def bug(conn: sqlite3.Connection, usage: Usage) -> None:
        raise RuntimeError("a bug in a job")

    caplog.set_level(logging.DEBUG, logger="memoryd")
    async with running(tmp_path / "w.db") as writer:
        with pytest.raises(RuntimeError, match=r"^a bug in a job$") as info:
            await writer.submit(bug)
        assert await writer.submit(put("after")) == "after"
    assert any(frame.name == "bug" for frame in info.traceback)  # the traceback reaches the caller whole
    assert [r for r in caplog.records if r.name.startswith("memoryd")] == []


class Escapes(BaseException):
    """What a job's bug may raise that ``except Exception`` lets through (SystemExit, say)."""


@pytest.mark.parametrize("heavy", [False, True], ids=["on-the-loop", "on-the-thread"])
async def test_a_job_raising_past_except_exception_fails_every_job_of_its_batch(tmp_path: Path, heavy: bool) -> None:
    """Nothing of the batch committed: every caller is answered that the commit failed (and
    every on_error runs), none with the result its job had computed; the error ends ``run``.
    A job queued behind the batch fails too, every later one is refused (WriterClosed), and
    ``settled`` returns though on_error queued bookkeeping: nothing would ever run them."""
    db, _, writer = fresh(tmp_path)
    reported: list[BaseException] = []
    results: list[Any] = [None, None, None]
    queued = threading.Event()

    def escapes(conn: sqlite3.Connection, usage: Usage) -> None:
        if heavy:  # on the writer's thread: until the next job is queued
            queued.wait()
        raise Escapes()

    def failed_row(exc: BaseException) -> None:  # as the pipeline's on_error: a kept ledger row
        reported.append(exc)
        writer.defer(lambda conn: ledger.failed(conn, STAMP, "add", "INTERNAL_ERROR", "the commit failed", None),
                     keep=True)

    async def one(n: int, fn: Callable[[sqlite3.Connection, Usage], Any]) -> None:
        try:
            results[n] = await writer.submit(fn, heavy=heavy, on_error=failed_row)
        except (RuntimeError, WriterClosed) as exc:
            results[n] = exc

    async def run() -> None:
        with pytest.raises(Escapes):
            await writer.run()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(one, 0, put("a"))
            tg.start_soon(one, 1, escapes)
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(run)
            if heavy:  # the batch of both is held on the writer's thread: the next job waits behind it
                await anyio.wait_all_tasks_blocked()
                tg.start_soon(one, 2, put("c"))
                await anyio.wait_all_tasks_blocked()
                assert writer.depth == 3
                queued.set()
        if not heavy:  # the batch failed on the event loop at once: run has ended
            await one(2, put("c"))
        await writer.settled()
        with pytest.raises(WriterClosed):
            await writer.submit(put("d"))
    finally:
        await writer.aclose()
    assert [(type(r), str(r)) for r in results] == [(RuntimeError, "commit failed")] * 2 + [
        (RuntimeError, "commit failed") if heavy else (WriterClosed, "the store is closing")]
    assert [str(e) for e in reported] == ["commit failed"] * (3 if heavy else 2)  # refused: the caller's to report
    assert rows(db) == [] and rows(db, "SELECT kind FROM memoryd_ledger") == []


async def test_failing_bookkeeping_is_logged_once_with_its_traceback(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Nobody awaits deferred bookkeeping: the writer is the one that reports it."""
    def bug(conn: sqlite3.Connection) -> None:
        raise RuntimeError("a bug in bookkeeping")

    done = anyio.Event()
    caplog.set_level(logging.DEBUG, logger="memoryd")
    async with running(tmp_path / "w.db") as writer:
        writer.defer(bug, done.set)
        await writer.settled()
        assert done.is_set()
    records = [r for r in caplog.records if r.name.startswith("memoryd")]
    assert [(r.name, r.getMessage()) for r in records] == [("memoryd.writer", "deferred bookkeeping failed")]
    assert records[0].exc_info is not None and str(records[0].exc_info[1]) == "a bug in bookkeeping"


# --- deferred bookkeeping -------------------------------------------------------------------


async def test_kept_rows_outlive_a_store_fault_and_commit_once_it_clears(tmp_path: Path) -> None:
    """A busy store loses the batch: a kept row (the ledger's) waits for the next batch,
    a plain one is dropped (its on_done still runs). Neither is written twice."""
    db = tmp_path / "w.db"
    done: list[str] = []

    def row(key: str) -> Callable[[sqlite3.Connection], None]:
        def insert(conn: sqlite3.Connection) -> None:
            conn.execute("INSERT INTO meta VALUES (?, 'x')", (f"t:{key}",))

        return insert

    async with running(db) as writer:
        with write_lock(db):
            writer.defer(row("kept"), lambda: done.append("kept"), keep=True)
            writer.defer(row("plain"), lambda: done.append("plain"))
            with pytest.raises(StoreUnavailable) as info:
                await writer.submit(put("a"))
            assert info.value.details == {"reason": "busy", "path": str(db)}
            assert done == ["plain"]
            assert rows(db) == []
        assert await writer.submit(put("b")) == "b"
        assert done == ["plain", "kept"]
        await writer.settled()
    assert rows(db) == [("t:b", "x"), ("t:kept", "x")]


async def test_settled_waits_for_bookkeeping_queued_so_far(tmp_path: Path) -> None:
    db = tmp_path / "w.db"
    async with running(db) as writer:
        def insert(conn: sqlite3.Connection) -> None:
            conn.execute("INSERT INTO meta VALUES ('t:d', 'x')")

        writer.defer(insert)
        assert rows(db) == []
        await writer.settled()
        assert rows(db) == [("t:d", "x")]


async def test_the_recall_overlay_counts_queued_recalls_exactly_once(tmp_path: Path) -> None:
    db = tmp_path / "w.db"
    async with running(db) as writer:
        older = store.new_id()
        newer = store.new_id()

        def seed(conn: sqlite3.Connection, usage: Usage) -> None:
            for n, entry_id in enumerate((older, newer)):
                store.insert_entry(conn, Entry(
                    id=entry_id, track="user", scope="user-global", workspace_key="", agent_key="", text=f"text {n}",
                    source="user", tags=[], version=1, created_at=n + 1, updated_at=n + 1, last_recalled=None,
                    recall_count=0, session_id=None))

        await writer.submit(seed)
        reader = store.connect(db, 0)
        try:
            def read(boosted: Any) -> tuple[list[Any], int]:
                return queries.query_page(reader, track=None, scope=None, text=None, agent_key=None,
                                        workspace_key=None, limit=50, boosted=boosted)

            hits, _ = await writer.with_recalls(read)
            assert [e.id for e in hits] == [newer, older]  # by updated_at: neither recalled yet
            page = [hits[1]]
            writer.record_recalls(page, 1000)
            assert (page[0].recall_count, page[0].last_recalled) == (1, 1000)  # the reply's copy
            queued, _ = await writer.with_recalls(read)  # not committed yet: the overlay counts it
            assert [(e.id, e.recall_count, e.last_recalled) for e in queued] == [(older, 1, 1000), (newer, 0, None)]
            assert rows(db, "SELECT recall_count FROM entries WHERE id = ?", older) == [(0,)]
            await writer.settled()
            committed, _ = await writer.with_recalls(read)  # committed: the store counts it, the overlay no more
            assert [(e.id, e.recall_count, e.last_recalled) for e in committed] == [(older, 1, 1000), (newer, 0, None)]
        finally:
            reader.close()


def two_entries(conn: sqlite3.Connection, ids: tuple[str, str]) -> None:
    for n, entry_id in enumerate(ids):
        store.insert_entry(conn, Entry(
            id=entry_id, track="user", scope="user-global", workspace_key="", agent_key="", text=f"text {n}",
            source="user", tags=[], version=1, created_at=n + 1, updated_at=n + 1, last_recalled=None,
            recall_count=0, session_id=None))


async def test_recalls_of_queries_in_a_row_share_one_step_and_keep_every_row(tmp_path: Path) -> None:
    """Three queries' recalls: one UPDATE per entry in one commit, each recall's row written,
    in order; a step queued between recalls (a ledger row) keeps its place."""
    db = tmp_path / "w.db"
    statements: list[str] = []
    async with running(db, statements=statements) as writer:
        a, b = store.new_id(), store.new_id()
        await writer.submit(lambda conn, usage: two_entries(conn, (a, b)))
        reader = store.connect(db, 0)
        try:
            def read(boosted: Any) -> tuple[list[Any], int]:
                return queries.query_page(reader, track=None, scope=None, text=None, agent_key=None,
                                        workspace_key=None, limit=50, boosted=boosted)

            def row(key: str) -> Callable[[sqlite3.Connection], None]:
                return lambda conn: conn.execute("INSERT INTO meta VALUES (?, 'x')", (f"t:{key}",)) and None

            by_id = {e.id: e for e in (await writer.with_recalls(read))[0]}
            writer.record_recalls([by_id[a], by_id[b]], 1000, row("1"))
            writer.record_recalls([by_id[a]], 1001, row("2"))
            writer.defer(row("between"))
            writer.record_recalls([by_id[a]], 1002, row("3"))
            statements.clear()
            await writer.settled()
        finally:
            reader.close()
    updates = [s for s in statements if s.startswith("UPDATE entries")]
    assert len(updates) == 3  # a and b for the first two queries, a for the third
    inserts = [s.split("'t:")[1].split("'")[0] for s in statements if "INSERT INTO meta" in s]
    assert inserts == ["1", "2", "between", "3"]
    assert statements.count("COMMIT") == 1
    assert sorted(rows(db, "SELECT id, recall_count, last_recalled FROM entries")) == sorted([(a, 3, 1002),
                                                                                             (b, 1, 1000)])


async def test_a_query_during_a_recalls_commit_counts_them_without_waiting(tmp_path: Path) -> None:
    """While the commit carrying recalls is in flight: a row the store does not show it in
    counts its recalls at once; a row that shows its last_recalled may already be in it, and
    that query waits for the commit."""
    db = tmp_path / "w.db"
    async with running(db) as writer:
        a, b = store.new_id(), store.new_id()
        await writer.submit(lambda conn, usage: two_entries(conn, (a, b)))
        reader = store.connect(db, 0)
        release = threading.Event()
        try:
            def read(boosted: Any) -> tuple[list[Any], int]:
                return queries.query_page(reader, track=None, scope=None, text=None, agent_key=None,
                                        workspace_key=None, limit=50, boosted=boosted)

            first = (await writer.with_recalls(read))[0]
            writer.record_recalls([e for e in first if e.id == a], 1000)
            writer.record_recalls([e for e in first if e.id == a], 1000)
            async with anyio.create_task_group() as tg:
                # the recalls' step runs first in this batch, then the job holds the commit back
                # heavy: on the writer's thread (a job on the event loop would block it)
                tg.start_soon(functools.partial(writer.submit, lambda conn, usage: release.wait(), heavy=True))
                await anyio.wait_all_tasks_blocked()
                hits, _ = await writer.with_recalls(read)  # not in the store yet: counted
                assert [(e.id, e.recall_count, e.last_recalled) for e in hits] == [(a, 2, 1000), (b, 0, None)]

                def committed_look(boosted: Any) -> tuple[list[Any], int]:
                    hits, total = read(boosted)
                    for e in hits:
                        if e.id == a and e.recall_count == 0:
                            e.last_recalled = 1000  # the row as the commit leaves it, but for its count
                    return hits, total

                waited: list[Any] = []

                async def ambiguous() -> None:
                    waited.append(await writer.with_recalls(committed_look))

                tg.start_soon(ambiguous)
                await anyio.wait_all_tasks_blocked()
                assert waited == []  # it waits for the commit
                release.set()
            hits = waited[0][0]
            assert [(e.id, e.recall_count, e.last_recalled) for e in hits] == [(a, 2, 1000), (b, 0, None)]
        finally:
            release.set()
            reader.close()


# --- atomic ---------------------------------------------------------------------------------


def test_atomic_commits_or_rolls_back_and_reraises_the_original_error(tmp_path: Path) -> None:
    db = tmp_path / "a.db"
    conn = store.open_store(db, 0, 0)
    try:
        with atomic(conn):
            conn.execute("INSERT INTO meta VALUES ('t:a', 'x')")
        assert not conn.in_transaction and rows(db) == [("t:a", "x")]
        error = BudgetExceeded("memory budget exceeded", {})
        with pytest.raises(BudgetExceeded) as info, atomic(conn):
            conn.execute("INSERT INTO meta VALUES ('t:b', 'x')")
            raise error
        assert info.value is error and not conn.in_transaction
        assert rows(db) == [("t:a", "x")]
    finally:
        conn.close()


def test_atomic_inside_a_transaction_is_a_savepoint(tmp_path: Path) -> None:
    db = tmp_path / "a.db"
    conn = store.open_store(db, 0, 0)
    try:
        with atomic(conn):
            step = atomic(conn, "inner")
            with pytest.raises(KeyError), step:
                conn.execute("INSERT INTO meta VALUES ('t:undone', 'x')")
                raise KeyError("x")
            assert not step.lost and conn.in_transaction
            with atomic(conn, "inner"):
                conn.execute("INSERT INTO meta VALUES ('t:kept', 'x')")
        assert rows(db) == [("t:kept", "x")]
    finally:
        conn.close()


def test_atomic_says_lost_when_sqlite_rolled_the_whole_transaction_back(tmp_path: Path) -> None:
    """SQLITE_FULL (max_page_count) rolls the transaction back: the savepoint cannot be
    rolled back to, the original error is raised, and the caller learns the batch is gone."""
    db = tmp_path / "a.db"
    conn = store.open_store(db, 0, 0)
    try:
        (pages,) = conn.execute("PRAGMA page_count").fetchone()
        conn.execute(f"PRAGMA max_page_count = {pages + 4}")
        with pytest.raises(sqlite3.OperationalError) as outer, atomic(conn):
            conn.execute("INSERT INTO meta VALUES ('t:before', 'x')")
            step = atomic(conn, "big")
            with pytest.raises(sqlite3.OperationalError) as info, step:
                conn.execute("INSERT INTO meta VALUES ('t:big', ?)", ("x" * 200_000,))
            assert info.value.sqlite_errorname == "SQLITE_FULL"
            assert step.lost and not conn.in_transaction
            raise info.value
        assert outer.value.sqlite_errorname == "SQLITE_FULL"
        assert rows(db) == []
    finally:
        conn.close()


# --- Daemon.open: a later step fails --------------------------------------------------------


class BadEntryPoint:
    name = "broken"
    value = "broken_adapter:Adapter"

    def load(self) -> Any:
        raise ImportError("No module named 'broken_adapter'")


async def test_daemon_open_lets_go_of_the_lock_and_threads_when_a_later_step_fails(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = Config()
    cfg.db_path = tmp_path / "memory.db"
    cfg.socket_path = tmp_path / "memoryd.sock"
    threads = set(threading.enumerate())
    with monkeypatch.context() as m:
        m.setattr(adapter_registry, "discovered_entry_points", lambda: [BadEntryPoint()])
        with pytest.raises(AdapterRegistryError, match=r"refused: it failed to load: ImportError"):
            await Daemon.open(cfg)
    assert set(threading.enumerate()) == threads  # the writer's, the reader's and the scanner's threads ended
    assert not cfg.db_path.with_name("memory.db.memoryd-owner").exists()
    daemon = await Daemon.open(cfg)  # the lock was let go: a second open takes it
    try:
        started = [t.name for t in set(threading.enumerate()) - threads]
        # the writer's, the scanner's, and aiosqlite's (audit/list and export)
        assert len(started) == 3 and {"memoryd-writer", "memoryd-scanner"} <= set(started)
    finally:
        await daemon.close()
    assert set(threading.enumerate()) == threads
    await daemon.close()  # a second close does nothing


# --- the ledger's transaction scope -----------------------------------------------------------


def who(n: int) -> Any:
    from memoryd_protocol.types import LedgerConnection

    return LedgerConnection(ref=f"run-1/{n}", run="run-1", id=n, transport="socket", pid=None, uid=None, exe=None,
                            client=None, opened_at=1)


def audited(n: int, *, fail: bool = False) -> Callable[[sqlite3.Connection, Usage], int]:
    """An audit row (and its ledger rows) for connection ``n``; ``fail``: then raise."""
    from memoryd import ledger

    def job(conn: sqlite3.Connection, usage: Usage) -> int:
        ledger.Stamp(origin=who(n), session_id=None, label="allowed").audit(
            conn, "add", track="user", scope="user-global", entry_id=f"e-{n}", text=f"fact {n}", source="t")
        if fail:
            raise BudgetExceeded("memory budget exceeded", {})
        return n

    return job


# --- a batch run again after a failure: everything else applied exactly once ----------------


def _entry(text: str) -> Entry:
    return Entry(id=store.new_id(), track="user", scope="user-global", workspace_key="", agent_key="", text=text,
                 source="user", tags=[], version=1, created_at=1, updated_at=1, last_recalled=None, recall_count=0,
                 session_id="s-1")


STAMP = ledger.Stamp(origin=None, session_id="s-1", label="allowed-once (policy auto)")


def add_job(text: str, delta: int) -> Callable[[sqlite3.Connection, Usage], str]:
    """An add as the pipeline commits one: the entry, its audit row and ledger row, usage."""
    def job(conn: sqlite3.Connection, usage: Usage) -> str:
        e = _entry(text)
        e.created_at = e.updated_at = store.now_ms()
        store.insert_entry(conn, e)
        STAMP.audit(conn, "add", track=e.track, scope=e.scope, entry_id=e.id, text=e.text, source=e.source, entry=e,
                    ts=e.created_at)
        usage[CELL] = usage.get(CELL, 0) + delta
        return text

    return job


def chain(db: Path) -> list[tuple[int, str, str | None]]:
    """(n, kind, ref) of every ledger row, after checking that each hash chains on."""
    from memoryd_protocol.ledger import chain_hash

    out, prev = [], ""
    for n, ts, kind, ref, seq, body, p, h in rows(db, "SELECT n, ts, kind, ref, audit_seq, body, prev, hash "
                                                      "FROM memoryd_ledger ORDER BY n"):
        assert (p, h) == (prev, chain_hash(prev, n, ts, kind, ref, seq, body))
        out.append((n, kind, ref))
        prev = h
    return out


async def test_the_ledger_chains_in_memory_and_a_rolled_back_connection_row_is_written_again(
        tmp_path: Path) -> None:
    """A transaction reads the ledger's newest row once; its rows chain on in memory. A job
    rolled back to its savepoint takes its connection row with it, so the next job of that
    connection writes the row again; and a connection whose row has committed is not looked
    up again."""
    db = tmp_path / "w.db"
    store.open_store(db, store.inspect(db), 0).close()
    writer = await Writer.open(db, store.inspect(db), 0)
    statements: list[str] = []
    await writer._owned.run(lambda c: c.set_trace_callback(statements.append))
    head_reads = "SELECT n, hash FROM memoryd_ledger ORDER BY n DESC LIMIT 1"
    lookups = "SELECT 1 FROM memoryd_ledger WHERE kind = 'connection'"
    try:
        first, failed, last = await queued_then_run(writer, [audited(1), audited(2, fail=True), audited(2)])
        # the first run without savepoints, then again with them: one head read each
        assert sum(s.startswith(head_reads) for s in statements) == 2
        del statements[:]
        writer = Writer(writer._owned, writer.usage, db, writer.anchor)
        assert await queued_then_run(writer, [audited(1), audited(2)]) == [1, 2]
        assert sum(s.startswith(head_reads) for s in statements) == 1
        assert not [s for s in statements if s.startswith(lookups)]  # both rows committed in this run
    finally:
        await writer.aclose()
    assert (first, last) == (1, 2) and isinstance(failed, BudgetExceeded)
    assert chain(db) == [(1, "start", None), (2, "connection", "run-1/1"), (3, "audit", None),
                         (4, "connection", "run-1/2"), (5, "audit", None), (6, "audit", None), (7, "audit", None)]
    assert writer.anchor.head is not None and writer.anchor.head[0] == 7


async def test_a_ledger_written_by_another_forgets_the_connection_rows(tmp_path: Path) -> None:
    """Once the ledger's newest row is not the one this daemon's last commit left, the
    connection rows it wrote are looked up again (and written again when gone)."""
    db = tmp_path / "w.db"
    store.open_store(db, store.inspect(db), 0).close()
    writer = await Writer.open(db, store.inspect(db), 0)
    try:
        assert await queued_then_run(writer, [audited(1)]) == [1]
        with contextlib.closing(sqlite3.connect(db)) as other, other:
            other.execute("DELETE FROM memoryd_ledger WHERE n > 1")
        writer = Writer(writer._owned, writer.usage, db, writer.anchor)
        assert await queued_then_run(writer, [audited(1)]) == [1]
    finally:
        await writer.aclose()
    assert chain(db) == [(1, "start", None), (2, "connection", "run-1/1"), (3, "audit", None)]
    assert writer.anchor.lost



async def test_a_sliced_flush_keeps_its_ledger_scope_while_another_stores_writer_commits(tmp_path: Path) -> None:
    """Two stores' writers on one event loop (two daemons embedded in one process): while
    one's flush of bookkeeping alone lets the loop turn between its slices, the other's
    batch begins and ends its own transaction's scopes on the same thread. The flush's
    rows chain on in its own scope all the same, so its Anchor ends at its store's real
    newest row, and a deleted tail of those rows is reported."""
    dbs = [tmp_path / "a.db", tmp_path / "b.db"]
    for db in dbs:
        store.open_store(db, store.inspect(db), 0).close()
    a = await Writer.open(dbs[0], store.inspect(dbs[0]), 0)
    b = await Writer.open(dbs[1], store.inspect(dbs[1]), 0)
    steps = 4 * writer_module.SLICE_STEPS
    b_done: list[int] = []
    b_before_last: list[bool] = []
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(a.run)
            tg.start_soon(b.run)

            def b_job(conn: sqlite3.Connection, usage: Usage) -> int:
                b_done.append(audited(1)(conn, usage))
                return 1

            async def b_writes() -> None:
                await b.submit(b_job)

            def row(n: int) -> Callable[[sqlite3.Connection], None]:
                def run(conn: sqlite3.Connection) -> None:
                    if n == 0:
                        tg.start_soon(b_writes)  # its batch runs while this flush's loop turns
                    if n == steps - 1:
                        b_before_last.append(bool(b_done))
                    ledger.failed(conn, STAMP, "add", "STORE_UNAVAILABLE", f"kept {n}", None)

                return run

            for n in range(steps):
                a.defer(row(n), keep=True)
            await a.settled()
            a.close()
            b.close()
        head = a.anchor.head
    finally:
        await a.aclose()
        await b.aclose()
    assert b_before_last == [True]  # the other store's batch ran during the flush's slices
    assert chain(dbs[0]) == [(1, "start", None), *((n, "failed", None) for n in range(2, steps + 2))]
    assert chain(dbs[1]) == [(1, "start", None), (2, "connection", "run-1/1"), (3, "audit", None)]
    assert head is not None and head[0] == steps + 1
    with contextlib.closing(sqlite3.connect(dbs[0])) as other, other:
        other.execute("DELETE FROM memoryd_ledger WHERE n = ?", (steps + 1,))  # a same-uid forgery
    with contextlib.closing(sqlite3.connect(dbs[0])) as conn:
        report = consistent(conn, lambda fetch: read_report(fetch, head))
    assert not report.ok



async def test_queries_a_write_and_a_fault_during_a_sliced_flush(tmp_path: Path) -> None:
    """While a flush of bookkeeping alone (a query's recalls and row, then kept ledger
    rows) lets the event loop turn: queries count each recall once, theirs queued for the
    next commit; a write submitted meanwhile commits after the flush;
    a store fault in a later slice rolls the flush back and the writer's thread runs it
    again. Every row is written once, the flush's in order, and every recall counted once
    after."""
    db = tmp_path / "w.db"
    await seed_one(db)
    writer = await Writer.open(db, store.inspect(db), 0)
    slice_, steps = writer_module.SLICE_STEPS, 3 * writer_module.SLICE_STEPS
    loop_thread = threading.get_ident()
    reader = store.connect(db, 0)
    seen: list[int] = []
    wrote: list[str] = []
    faulted: list[int] = []
    done: list[int] = []

    def read(boosted: Any) -> tuple[list[Any], int]:
        return queries.query_page(reader, track=None, scope=None, text=None, agent_key=None, workspace_key=None,
                                  limit=50, boosted=boosted)

    def recalled(text: str, ts: int) -> Callable[[sqlite3.Connection], None]:
        return lambda conn: STAMP.audit(conn, "recalled", track=None, scope=None, entry_id=None, text=text,
                                        source=None, ts=ts)

    async def query(k: int) -> None:
        hits, _ = await writer.with_recalls(read)
        seen.append(hits[0].recall_count)
        writer.record_recalls(hits, 2000 + k, recalled(f"s{k}", 2000 + k))

    async def write() -> None:
        wrote.append(await writer.submit(add_job("w", 1)))

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(writer.run)

            def row(n: int) -> Callable[[sqlite3.Connection], None]:
                def run(conn: sqlite3.Connection) -> None:
                    if threading.get_ident() == loop_thread:  # not once the thread runs it again
                        if n % 8 == 0:
                            tg.start_soon(query, n)
                        if n == 4:
                            tg.start_soon(write)
                    if n == slice_ + 3 and not faulted:  # SQLITE_READONLY, once
                        faulted.append(n)
                        conn.execute("PRAGMA query_only = ON")
                        try:
                            conn.execute("INSERT INTO meta VALUES ('ro', 'x')")
                        finally:
                            conn.execute("PRAGMA query_only = OFF")
                    ledger.failed(conn, STAMP, "add", "STORE_UNAVAILABLE", f"kept {n}", None)

                return run

            hits, _ = await writer.with_recalls(read)
            writer.record_recalls(hits, 1000, recalled("q", 1000))
            for n in range(steps):
                writer.defer(row(n), functools.partial(done.append, n), keep=True)
            await writer.settled()
            await writer.idle()
            await writer.settled()
            hits, _ = await writer.with_recalls(read)
            after = [(e.text, e.recall_count) for e in hits]
            writer.close()
        head = writer.anchor.head
    finally:
        reader.close()
        await writer.aclose()
    assert faulted == [slice_ + 3]
    assert seen == [1, 2, 3] and wrote == ["w"]
    assert dict(after)["recalled one"] == 4
    assert rows(db, "SELECT recall_count, last_recalled FROM entries WHERE text = 'recalled one'") == [(4, 2016)]
    assert sorted(done) == list(range(steps))
    audit, kinds, report = ledger_state(db, head)
    # The flush's own recall first; then, in the commit after it, the write and the recalls
    # of the queries during the flush: a query may still be waiting for the flush's rerun on
    # the thread when the write's batch begins, so their order is not fixed.
    assert audit[0] == ("recalled", "q")
    assert sorted(audit[1:]) == [("add", "w"), ("recalled", "s0"), ("recalled", "s16"), ("recalled", "s8")]
    assert kinds == ["start", "audit", *["failed"] * steps, "audit", "audit", "audit", "audit"]
    assert report.ok, report.problems


def fails_after_its_rows(fault: bool) -> Callable[[sqlite3.Connection, Usage], None]:
    """Writes an entry, its rows and usage, then fails: a bug of the job's own, or a store
    fault SQLite confines to the statement (SQLITE_READONLY)."""
    def job(conn: sqlite3.Connection, usage: Usage) -> None:
        add_job("doomed", 1000)(conn, usage)
        if not fault:
            raise BudgetExceeded("memory budget exceeded", {})
        conn.execute("PRAGMA query_only = ON")
        try:
            conn.execute("INSERT INTO meta VALUES ('ro', 'x')")
        finally:
            conn.execute("PRAGMA query_only = OFF")

    return job


async def seed_one(db: Path) -> Entry:
    """A store with its ledger begun and one entry (inserted without rows: a start row
    lists it)."""
    seeded = _entry("recalled one")
    conn = store.open_store(db, store.inspect(db), 0)
    try:
        store.insert_entry(conn, seeded)
        conn.commit()
    finally:
        conn.close()
    return seeded


def ledger_state(db: Path, head: tuple[int, str] | None) -> tuple[list[tuple[str, str | None]], list[str], Any]:
    conn = sqlite3.connect(db)
    try:
        audit = conn.execute("SELECT action, text FROM audit ORDER BY seq").fetchall()
        kinds = [k for (k,) in conn.execute("SELECT kind FROM memoryd_ledger ORDER BY n")]
        report = consistent(conn, lambda fetch: read_report(fetch, head))
        assert ledger.head(conn) == head
    finally:
        conn.close()
    return audit, kinds, report


@pytest.mark.parametrize("fault", [False, True], ids=["job-error", "store-fault"])
async def test_a_job_failing_mid_batch_leaves_every_other_step_applied_once(tmp_path: Path, fault: bool) -> None:
    """A batch of bookkeeping (a kept ledger row, a query's recalls and its recalled row, a
    step with a bug) and five jobs, the second and fourth of which fail after writing rows:
    the batch runs again with savepoints. Every other step is applied once: one audit row
    and one ledger row each, in order, the usage of the three adds alone, the recall counted
    once, each on_done run once, and the ledger's head (the Anchor) the committed head."""
    db = tmp_path / "w.db"
    seeded = await seed_one(db)
    writer = await Writer.open(db, store.inspect(db), 0)
    done: list[str] = []
    try:
        before = writer.usage[CELL]
        writer.defer(lambda conn: ledger.failed(conn, STAMP, "add", "STORE_UNAVAILABLE", "kept", None),
                     lambda: done.append("kept"), keep=True)

        def bug(conn: sqlite3.Connection) -> None:
            raise RuntimeError("a bookkeeping bug")

        writer.defer(bug, lambda: done.append("bug"))
        writer.record_recalls([seeded], 5000, lambda conn: STAMP.audit(
            conn, "recalled", track=None, scope=None, entry_id=None, text="q", source=None, ts=5000))
        results = await run_batch(writer, [add_job("a", 1), fails_after_its_rows(fault), add_job("c", 2),
                                           fails_after_its_rows(fault), add_job("e", 4)])
        assert [r if isinstance(r, str) else type(r) for r in results] == [
            "a", StoreUnavailable if fault else BudgetExceeded, "c", StoreUnavailable if fault else BudgetExceeded, "e"]
        assert writer.usage[CELL] == before + 7
        assert sorted(done) == ["bug", "kept"]
        head = writer.anchor.head
    finally:
        await writer.aclose()
    audit, kinds, report = ledger_state(db, head)
    assert audit == [("recalled", "q"), ("add", "a"), ("add", "c"), ("add", "e")]
    assert kinds == ["start", "failed", "audit", "audit", "audit", "audit"]
    assert report.ok, report.problems
    assert rows(db, "SELECT recall_count, last_recalled FROM entries WHERE id = ?", seeded.id) == [(1, 5000)]
    assert sorted(t for (t,) in rows(db, "SELECT text FROM entries")) == ["a", "c", "e", "recalled one"]


@pytest.mark.parametrize("fail", [False, True], ids=["all-commit", "one-rolled-back"])
async def test_a_batch_writes_each_cells_counts_once_and_a_rolled_back_job_takes_its_counts_back(
        tmp_path: Path, fail: bool) -> None:
    """The counts memoryd keeps beside the entries (memoryd_usage) are added up per batch
    and written with one statement per cell before COMMIT, and the text index's mark is read
    once (store.Batch); a job rolled back to its savepoint takes its counts with it. Either
    way the counts are those of the entries committed, and a start trusts them."""
    db = tmp_path / "w.db"
    statements: list[str] = []
    conn = store.open_store(db, store.inspect(db), 0)
    conn.set_trace_callback(statements.append)
    writer = Writer(conn, {}, db)
    try:
        jobs = [add_job("a", 1), add_job("bb", 2)] + ([fails_after_its_rows(False)] if fail else []) + [add_job("ccc", 3)]
        statements.clear()
        results = await run_batch(writer, jobs)
        assert [r for r in results if isinstance(r, str)] == ["a", "bb", "ccc"]
    finally:
        await writer.aclose()
    upserts = [s for s in statements if s.startswith("INSERT INTO memoryd_usage")]
    marks = [s for s in statements if "memoryd_fts_mark" in s and s.startswith("SELECT (SELECT")]
    # one upsert and one mark read per transaction: the batch's, and once a job failed the
    # batch's run again with savepoints (the first transaction rolled back before its end)
    assert (len(upserts), len(marks)) == ((1, 2) if fail else (1, 1))
    assert rows(db, "SELECT track, scope, entries, used FROM memoryd_usage WHERE entries != 0") == [
        (*CELL, 3, 6)]
    check = sqlite3.connect(db)
    try:
        assert store.trusted(check)
    finally:
        check.close()


async def test_a_failing_recall_step_loses_only_its_recalls_and_clears_the_overlay(tmp_path: Path) -> None:
    """The recalled row of a query fails (a bug): that query-run's recall step is undone
    (its counters and rows, one step), the jobs and the other bookkeeping of the batch
    commit once, and no later query counts the lost recalls from the overlay."""
    db = tmp_path / "w.db"
    seeded = await seed_one(db)
    writer = await Writer.open(db, store.inspect(db), 0)
    try:
        writer.defer(lambda conn: ledger.failed(conn, STAMP, "add", "STORE_UNAVAILABLE", "kept", None), keep=True)

        def broken_row(conn: sqlite3.Connection) -> None:
            raise RuntimeError("a recalled row's bug")

        writer.record_recalls([seeded], 5000, broken_row)
        assert await run_batch(writer, [add_job("a", 1)]) == ["a"]
        reader = store.connect(db, 0)
        try:
            hits, _ = await writer.with_recalls(lambda boosted: queries.query_page(
                reader, track=None, scope=None, text=None, agent_key=None, workspace_key=None, limit=50,
                boosted=boosted))
        finally:
            reader.close()
        assert {e.text: e.recall_count for e in hits} == {"recalled one": 0, "a": 0}
        head = writer.anchor.head
    finally:
        await writer.aclose()
    audit, kinds, report = ledger_state(db, head)
    assert audit == [("add", "a")]
    assert kinds == ["start", "failed", "audit"]
    assert report.ok, report.problems


async def cancelled_mid_job(writer: Writer, fails: bool, heavy: bool) -> list[BaseException]:
    """Submit a job, cancel its caller while the job's batch is in flight, then let it end
    (failing, or committed); what ``on_error`` got. ``heavy``: the job runs on the writer's
    thread and is held there until the caller is cancelled; otherwise it runs on the event
    loop and cancels its caller itself, which is then cancelled during the COMMIT on the
    thread (or, for a failing job, during the batch's run again with savepoints there)."""
    started, release = threading.Event(), threading.Event()
    loop_thread = threading.get_ident()

    def job(conn: sqlite3.Connection, usage: Usage) -> str:
        if heavy:
            started.set()
            release.wait()
        elif threading.get_ident() == loop_thread:
            scope.cancel()
            release.set()
        conn.execute("INSERT INTO meta VALUES (?, 'x')", (f"t:{fails}{heavy}",))
        if fails:
            raise BudgetExceeded("memory budget exceeded", {})
        return "done"

    reported: list[BaseException] = []
    ended: list[bool] = []

    async def caller() -> None:
        try:
            await writer.submit(job, on_error=reported.append, heavy=heavy)
        finally:
            ended.append(release.is_set() and writer.depth == 0)

    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as tg:
            tg.start_soon(caller)
            if heavy:
                await anyio.to_thread.run_sync(started.wait)
                scope.cancel()
                release.set()
    assert scope.cancelled_caught and ended == [True]
    return reported


async def test_a_caller_cancelled_while_its_job_runs_waits_for_it_and_its_failure_is_still_reported(
        tmp_path: Path) -> None:
    """Cancelled while its job is in flight, the caller is cancelled only once the job has
    ended (committed, or failed); a failed job's ``on_error`` runs all the same (the
    pipeline's ``failed`` ledger row follows it), a committed one's does not; nothing is
    left waiting."""
    db = tmp_path / "w.db"
    async with running(db) as writer:
        for heavy in (True, False):
            assert [type(e) for e in await cancelled_mid_job(writer, True, heavy)] == [BudgetExceeded]
            assert await cancelled_mid_job(writer, False, heavy) == []
    assert rows(db) == [("t:FalseFalse", "x"), ("t:FalseTrue", "x")]


# --- a batch staged on the event loop whose COMMIT fails on the writer's thread -------------


def committed(db: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row another connection sees committed, table by table."""
    tables = ("entries", "audit", "memoryd_ledger", "meta", "memoryd_usage")
    return {t: rows(db, f"SELECT * FROM {t} ORDER BY rowid") for t in tables}


async def test_a_failed_commit_of_a_batch_staged_on_the_loop_fails_every_job_and_keeps_its_rows(
        tmp_path: Path) -> None:
    """No step fails on the event loop; the COMMIT on the writer's thread does (a full file
    system: the pages reach the WAL at COMMIT). Every job fails with STORE_UNAVAILABLE full
    and its on_error runs; nothing is committed, and neither the usage nor the ledger's head
    (the Anchor) moves; the connection is left with no transaction, its busy timeout and no
    ledger or batch scope on the loop's thread. Once space is back, the kept ledger row
    commits once, and the connection row the failed batch had written is written again."""
    from test_store_faults import fill, tmpfs

    with tmpfs(tmp_path / "mnt", "1m") as mnt:
        db = mnt / "w.db"
        store.open_store(db, store.inspect(db), 0).close()
        writer = await Writer.open(db, store.inspect(db), 250)
        conn = writer._owned.conn
        statements = traced(conn)
        loop_thread = threading.get_ident()
        head, usage, before = writer.anchor.head, dict(writer.usage), committed(db)
        done: list[str] = []
        reported: list[BaseException] = []
        results: list[Any] = [None] * 3
        try:
            writer.defer(lambda c: ledger.failed(c, STAMP, "add", "STORE_UNAVAILABLE", "kept", None),
                         lambda: done.append("kept"), keep=True)
            filler = fill(mnt)

            async def one(n: int, fn: Callable[[sqlite3.Connection, Usage], Any]) -> None:
                try:
                    results[n] = await writer.submit(fn, on_error=reported.append)
                except StoreUnavailable as exc:
                    results[n] = exc

            async with anyio.create_task_group() as tg:
                async with anyio.create_task_group() as callers:
                    for n, fn in enumerate([add_job("a" * 30_000, 1), audited(1), put("k")]):
                        callers.start_soon(one, n, fn)
                    await anyio.wait_all_tasks_blocked()
                    tg.start_soon(writer.run)
                assert [r.details for r in results] == [{"reason": "full", "path": str(db)}] * 3
                assert [type(e) for e in reported] == [StoreUnavailable] * 3
                began = [t for sql, t in statements if sql == "BEGIN IMMEDIATE"]
                assert began == [loop_thread] and [t for sql, t in statements if sql == "COMMIT"] == [
                    writer.thread.ident]
                assert committed(db) == before
                assert writer.usage == usage and writer.anchor.head == head and done == []
                assert not conn.in_transaction
                assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 250
                assert getattr(ledger._scope, "anchor", None) is None
                assert getattr(store._batch, "current", None) is None
                filler.unlink()
                assert await writer.submit(audited(1)) == 1
                await writer.settled()
                writer.close()
        finally:
            await writer.aclose()
        assert done == ["kept"]
        assert [(kind, ref) for _, kind, ref in chain(db)] == [
            ("start", None), ("failed", None), ("connection", "run-1/1"), ("audit", None)]
        audit, _, report = ledger_state(db, writer.anchor.head)
        assert audit == [("add", "fact 1")]
        assert report.ok, report.problems
