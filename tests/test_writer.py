"""The single writer, in process: a real store in a temporary directory, no daemon process.

A job is ``fn(tx)``; the writer commits whatever is queued as one transaction, always the
same way, the whole of it on the writer's thread: BEGIN IMMEDIATE (when another process
holds the write lock, waiting for it), each deferred step and each job in its own savepoint
(a failure rolls that step and what it did to the Tx back, alone), the usage counts, and
COMMIT; the event loop runs on meanwhile. Here: those statements and threads,
failures of a step, of the whole transaction and of COMMIT, the ledger chained from the
Tx, the bookkeeping nobody awaits (kept ledger rows, the recall overlay), cancelled
callers, close and drain; ``atomic``; and ``Daemon.open`` letting go of everything when a
later step fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from memoryd import adapter_registry, foreign, ledger, readers, store, storefile
from memoryd.adapter_registry import AdapterRegistryError
from memoryd.app import Daemon
from memoryd.atomic import atomic
from memoryd.config import Config
from memoryd.tx import Tx
from memoryd.writer import Writer, WriterClosed
from memoryd_protocol.errors import BudgetExceeded, StoreUnavailable
from memoryd_protocol.ledger import chain_hash, consistent
from memoryd_protocol.ledger_check import read_report
from memoryd_protocol.types import Entry, LedgerConnection
from test_store_faults import fill, read_only_job, run_batch, tmpfs

pytestmark = pytest.mark.anyio

CELL = ("user", "user-global")
#: the ledger's newest row, read once per transaction (its Tx's tip)
HEAD_READ = "SELECT n, hash FROM memoryd_ledger ORDER BY n DESC LIMIT 1"
#: a connection row looked up before it is written
LOOKUP = "SELECT 1 FROM memoryd_ledger WHERE kind = 'connection'"


def rows(db: Path, sql: str = "SELECT key, value FROM meta WHERE key LIKE 't:%' ORDER BY key",
         *args: Any) -> list[tuple[Any, ...]]:
    """What another connection sees committed."""
    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def put(key: str, delta: int = 0) -> Callable[[Tx], str]:
    def job(tx: Tx) -> str:
        tx.conn.execute("INSERT INTO meta VALUES (?, 'x')", (f"t:{key}",))
        if delta:
            tx.usage[CELL] = tx.usage.get(CELL, 0) + delta
        return key

    return job


@contextlib.asynccontextmanager
async def running(db: Path, *, statements: list[str] | None = None) -> AsyncIterator[Writer]:
    """A writer on a fresh store, running; closed, drained and its thread ended on exit.
    ``statements`` collects every statement the write connection runs."""
    conn = storefile.open_store(db, storefile.inspect(db), 0)
    if statements is not None:
        conn.set_trace_callback(statements.append)
    writer = Writer(conn, {}, db)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(writer.serve)
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
    conn = storefile.open_store(db, storefile.inspect(db), 0)
    return db, conn, Writer(conn, {}, db)


def traced(conn: sqlite3.Connection) -> list[tuple[str, int]]:
    """Every statement ``conn`` runs from now on, with the thread that ran it."""
    seen: list[tuple[str, int]] = []
    conn.set_trace_callback(lambda sql: seen.append((sql, threading.get_ident())))
    return seen


def control(statements: list[str]) -> list[str]:
    """The statements that begin, end or split a transaction."""
    return [s for s in statements if s.split()[0] in ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE")]


def where(seen: list[int]) -> Callable[[Tx], None]:
    def job(tx: Tx) -> None:
        seen.append(threading.get_ident())

    return job


# --- group commit, savepoints, the thread -------------------------------------------------


async def test_queued_jobs_commit_as_one_transaction_each_in_its_savepoint(tmp_path: Path) -> None:
    db, conn, writer = fresh(tmp_path)
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    try:
        assert await queued_then_run(writer, [put("a", 1), put("b", 2), put("c", 3)]) == ["a", "b", "c"]
    finally:
        await writer.aclose()
    assert control(statements) == ["BEGIN IMMEDIATE", *["SAVEPOINT step", "RELEASE step"] * 3, "COMMIT"]
    assert rows(db) == [("t:a", "x"), ("t:b", "x"), ("t:c", "x")]
    assert writer.usage == {CELL: 6}


async def test_a_failing_job_is_rolled_back_to_its_savepoint_alone(tmp_path: Path) -> None:
    """Its rows and its usage change are undone; the jobs before and after it commit, in
    the same transaction: nothing runs twice."""
    db, conn, writer = fresh(tmp_path)
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    ran: list[str] = []

    def over(tx: Tx) -> None:
        ran.append("over")
        put("over", 100)(tx)
        raise BudgetExceeded("memory budget exceeded", {})

    try:
        first, failed, last = await queued_then_run(writer, [put("a", 1), over, put("c", 3)])
    finally:
        await writer.aclose()
    assert (first, last) == ("a", "c") and ran == ["over"]
    assert isinstance(failed, BudgetExceeded)
    assert rows(db) == [("t:a", "x"), ("t:c", "x")]
    assert writer.usage == {CELL: 4}
    assert control(statements) == [
        "BEGIN IMMEDIATE", "SAVEPOINT step", "RELEASE step", "SAVEPOINT step", "ROLLBACK TO step", "RELEASE step",
        "SAVEPOINT step", "RELEASE step", "COMMIT"]


async def test_a_batch_runs_whole_on_the_writers_thread(tmp_path: Path) -> None:
    """Every statement of a batch runs on the writer's own thread, BEGIN to COMMIT, and so
    does every job; the event loop runs none of them."""
    db, conn, writer = fresh(tmp_path)
    statements = traced(conn)
    loop_thread = threading.get_ident()
    seen: list[int] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(writer.serve)
        for key in ("a", "b"):  # one after the other: four batches
            await writer.submit(where(seen))
            await writer.submit(put(key))
        writer.close()
    thread = writer.thread
    await writer.aclose()
    assert seen == [thread.ident] * 2 and thread.ident != loop_thread
    assert thread.name == "memoryd-writer"
    assert not thread.is_alive()  # aclose ended it
    assert [sql for sql, _ in statements if sql.split()[0] in ("BEGIN", "COMMIT")] == ["BEGIN IMMEDIATE", "COMMIT"] * 4
    assert statements and {t for _, t in statements} == {thread.ident}
    assert rows(db) == [("t:a", "x"), ("t:b", "x")]


async def test_the_event_loop_serves_while_a_batch_runs(tmp_path: Path) -> None:
    """A job that holds the writer's thread (a long seed, say) does not hold the event loop:
    a task on the loop runs to its end while the job waits for it, and the batch commits
    once the job returns."""
    db, _, writer = fresh(tmp_path)
    running_job, served = threading.Event(), threading.Event()

    def long_job(tx: Tx) -> str:
        put("long")(tx)
        running_job.set()
        assert served.wait(10), "the event loop did not run while the job held the writer's thread"
        return "long"

    async def meanwhile() -> None:
        await anyio.to_thread.run_sync(running_job.wait)
        served.set()  # reached only if the loop turns while the batch runs

    results: list[str] = []

    async def one() -> None:
        results.append(await writer.submit(long_job))

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(writer.serve)
            tg.start_soon(one)
            await meanwhile()
            await writer.idle()
            writer.close()
    finally:
        await writer.aclose()
    assert results == ["long"] and rows(db) == [("t:long", "x")]


async def test_a_write_lock_held_elsewhere_is_waited_for_on_the_owner_thread_never_on_the_loop(
        tmp_path: Path) -> None:
    """Another process holds the write lock: the batch's BEGIN, on the writer's thread, waits
    for it with the store's busy timeout while the event loop serves everything else; then
    the batch runs and commits once the lock is released."""
    db = tmp_path / "w.db"
    conn = storefile.open_store(db, storefile.inspect(db), 60_000)
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
            tg.start_soon(writer.serve)
            with write_lock(db):
                tg.start_soon(writer.submit, where(seen))
                await anyio.to_thread.run_sync(waiting.wait)
                assert seen == []  # the event loop runs (this test does), the write waits
                assert rows(db, "SELECT count(*) FROM meta WHERE key = 'schema_version'") == [(1,)]
            await writer.idle()
            writer.close()
    finally:
        await writer.aclose()
    assert seen == [writer.thread.ident]
    assert not [sql for sql, t in statements if t == loop_thread]
    on_thread = [sql for sql, t in statements if t == writer.thread.ident]
    # the BEGIN that waited, then the batch: its Tx (the ledger's head), whether another
    # program wrote or changed the schema, its one job, COMMIT
    assert on_thread == ["BEGIN IMMEDIATE", HEAD_READ, "PRAGMA data_version", "PRAGMA schema_version",
                         "SAVEPOINT step", "RELEASE step", "COMMIT", "PRAGMA wal_checkpoint(PASSIVE)"]


async def test_writer_open_runs_migrations_and_the_chain_on_its_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The store is opened (and migrated) and the ledger's chain begun on the writer's own
    thread, and jobs run there too."""
    db = tmp_path / "w.db"
    where_: dict[str, int] = {}
    open_store, open_chain = storefile.open_store, foreign.open_chain

    def opening(*args: Any) -> sqlite3.Connection:
        where_["open_store"] = threading.get_ident()
        return open_store(*args)

    def chaining(conn: sqlite3.Connection, stop: Any = None, *, untouched: bool = False) -> None:
        where_["open_chain"] = threading.get_ident()
        open_chain(conn, stop, untouched=untouched)

    monkeypatch.setattr(storefile, "open_store", opening)
    monkeypatch.setattr(foreign, "open_chain", chaining)
    writer = await Writer.open(db, storefile.inspect(db), 250)
    seen: list[int] = []
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(writer.serve)
            await writer.submit(where(seen))
            writer.close()
    finally:
        await writer.aclose()
    assert where_ == {"open_store": writer.thread.ident, "open_chain": writer.thread.ident}
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
        tg.start_soon(writer.serve)
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


async def test_serve_cancelled_while_a_batch_runs_commits_what_is_queued_then_refuses_jobs(tmp_path: Path) -> None:
    """The batch in flight commits and so does the job queued behind it, each caller with
    its result; ``serve`` takes its cancellation only once both have; later jobs are refused."""
    db, _, writer = fresh(tmp_path)
    running_job, cancelled = threading.Event(), threading.Event()
    results: dict[str, Any] = {}

    def slow(tx: Tx) -> str:
        running_job.set()
        assert cancelled.wait(10)
        return put("slow")(tx)

    async def one(key: str, fn: Callable[[Tx], str]) -> None:
        try:
            results[key] = await writer.submit(fn)
        except RuntimeError as exc:
            results[key] = exc

    scope = anyio.CancelScope()
    ended: list[int] = []

    async def serve() -> None:
        with scope:
            try:
                await writer.serve()
            finally:
                ended.append(writer.depth)

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(serve)
            tg.start_soon(one, "slow", slow)
            await anyio.to_thread.run_sync(running_job.wait)
            tg.start_soon(one, "queued", put("queued"))
            await anyio.wait_all_tasks_blocked()
            scope.cancel()
            await anyio.wait_all_tasks_blocked()
            assert ended == []  # serve waits for the batch in flight
            cancelled.set()
        with pytest.raises(WriterClosed):
            await writer.submit(put("late"))
    finally:
        await writer.aclose()
    assert scope.cancelled_caught and ended == [0]
    assert results == {"slow": "slow", "queued": "queued"}
    assert rows(db) == [("t:queued", "x"), ("t:slow", "x")]

# --- logging: a failing job's traceback once ------------------------------------------------


async def test_a_failing_job_raises_to_its_caller_and_the_writer_logs_nothing(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The caller reports the error (the RPC layer logs an internal error's traceback): the
    writer logging it too put the same traceback in the log twice."""
    def bug(tx: Tx) -> None:
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


async def test_a_job_raising_past_except_exception_fails_every_job_of_its_batch(tmp_path: Path) -> None:
    """Nothing of the batch committed: every caller is answered that the commit failed (and
    every on_error runs), none with the result its job had computed; the error ends
    ``serve``. A job queued while the batch ran fails too, every later one is refused
    (WriterClosed), and ``settled`` returns though on_error queued bookkeeping: nothing
    would ever run them."""
    db, _, writer = fresh(tmp_path)
    reported: list[BaseException] = []
    results: list[Any] = [None, None, None]
    running_job, queued = threading.Event(), threading.Event()

    def escapes(tx: Tx) -> None:
        running_job.set()
        assert queued.wait(10)  # its neighbour is queued while this batch runs
        raise Escapes()

    def failed_row(exc: BaseException) -> None:  # as the pipeline's on_error: a kept ledger row
        reported.append(exc)
        writer.defer(lambda tx: ledger.failed(tx, STAMP, "add", "INTERNAL_ERROR", "the commit failed", None),
                     keep=True)

    async def one(n: int, fn: Callable[[Tx], Any]) -> None:
        try:
            results[n] = await writer.submit(fn, on_error=failed_row)
        except (RuntimeError, WriterClosed) as exc:
            results[n] = exc

    async def serve() -> None:
        with pytest.raises(Escapes):
            await writer.serve()

    async def during() -> None:
        await anyio.to_thread.run_sync(running_job.wait)
        async with anyio.create_task_group() as tg:
            tg.start_soon(one, 2, put("c"))
            await anyio.wait_all_tasks_blocked()
            queued.set()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(one, 0, put("a"))
            tg.start_soon(one, 1, escapes)
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(serve)
            await during()
        await writer.settled()
        with pytest.raises(WriterClosed):
            await writer.submit(put("d"))
    finally:
        await writer.aclose()
    assert [(type(r), str(r)) for r in results] == [(RuntimeError, "commit failed")] * 3
    assert [str(e) for e in reported] == ["commit failed"] * 3
    assert rows(db) == [] and rows(db, "SELECT kind FROM memoryd_ledger") == []


async def test_failing_bookkeeping_is_logged_once_with_its_traceback(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Nobody awaits deferred bookkeeping: the writer is the one that reports it."""
    def bug(tx: Tx) -> None:
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


# --- cancelled callers --------------------------------------------------------------------


async def cancelled_mid_job(writer: Writer, fails: bool) -> list[BaseException]:
    """Submit a job whose caller is cancelled while it runs on the writer's thread, which
    then ends (failing, or committed); what ``on_error`` got."""
    finished: list[bool] = []
    running_job, cancelled = threading.Event(), threading.Event()

    def job(tx: Tx) -> str:
        running_job.set()
        assert cancelled.wait(10)
        tx.conn.execute("INSERT INTO meta VALUES (?, 'x')", (f"t:{fails}",))
        finished.append(True)
        if fails:
            raise BudgetExceeded("memory budget exceeded", {})
        return "done"

    reported: list[BaseException] = []
    ended: list[bool] = []
    scope = anyio.CancelScope()

    async def caller() -> None:
        with scope:
            try:
                await writer.submit(job, on_error=reported.append)
            finally:
                ended.append(bool(finished) and writer.depth == 0)

    async with anyio.create_task_group() as tg:
        tg.start_soon(caller)
        await anyio.to_thread.run_sync(running_job.wait)
        scope.cancel()
        await anyio.wait_all_tasks_blocked()  # the caller took its cancellation, and waits for the job
        cancelled.set()
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
        assert [type(e) for e in await cancelled_mid_job(writer, True)] == [BudgetExceeded]
        assert await cancelled_mid_job(writer, False) == []
    assert rows(db) == [("t:False", "x")]


# --- deferred bookkeeping -------------------------------------------------------------------


async def test_kept_rows_outlive_a_store_fault_and_commit_once_it_clears(tmp_path: Path) -> None:
    """A busy store loses the batch: a kept row (the ledger's) waits for the next batch,
    a plain one is dropped (its on_done still runs). Neither is written twice."""
    db = tmp_path / "w.db"
    done: list[str] = []

    def row(key: str) -> Callable[[Tx], None]:
        def insert(tx: Tx) -> None:
            tx.conn.execute("INSERT INTO meta VALUES (?, 'x')", (f"t:{key}",))

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
        def insert(tx: Tx) -> None:
            tx.conn.execute("INSERT INTO meta VALUES ('t:d', 'x')")

        writer.defer(insert)
        assert rows(db) == []
        await writer.settled()
        assert rows(db) == [("t:d", "x")]


# --- atomic ---------------------------------------------------------------------------------


def test_atomic_commits_or_rolls_back_and_reraises_the_original_error(tmp_path: Path) -> None:
    db = tmp_path / "a.db"
    conn = storefile.open_store(db, 0, 0)
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
    conn = storefile.open_store(db, 0, 0)
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
    conn = storefile.open_store(db, 0, 0)
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
    assert set(threading.enumerate()) == threads  # the writer's and the readers' threads ended
    assert not cfg.db_path.with_name("memory.db.memoryd-owner").exists()
    daemon = await Daemon.open(cfg)  # the lock was let go: a second open takes it
    try:
        # anyio's worker threads (the heads file's I/O) are its pool's, kept idle for reuse
        started = [t.name for t in set(threading.enumerate()) - threads if t.name != "AnyIO worker thread"]
        assert sorted(started) == sorted(["memoryd-writer", *(f"memoryd-reader-{k}" for k in range(readers.READERS))])
    finally:
        await daemon.close()
    assert {t for t in threading.enumerate() if t.name != "AnyIO worker thread"} == threads
    await daemon.close()  # a second close does nothing


# --- the ledger, chained from the Tx ------------------------------------------------------------


def who(n: int) -> LedgerConnection:
    return LedgerConnection(ref=f"run-1/{n}", run="run-1", id=n, transport="socket", pid=None, uid=None, exe=None,
                            client=None, opened_at=1)


def audited(n: int, *, fail: bool = False) -> Callable[[Tx], int]:
    """An audit row (and its ledger rows) for connection ``n``; ``fail``: then raise."""
    def job(tx: Tx) -> int:
        ledger.Stamp(origin=who(n), session_id=None, label="allowed").audit(
            tx, "add", track="user", scope="user-global", entry_id=f"e-{n}", text=f"fact {n}", source="t")
        if fail:
            raise BudgetExceeded("memory budget exceeded", {})
        return n

    return job


def _entry(text: str) -> Entry:
    return Entry(id=store.new_id(), track="user", scope="user-global", workspace_key="", agent_key="", text=text,
                 source="user", tags=[], version=1, created_at=1, updated_at=1, last_recalled=None, recall_count=0,
                 session_id="s-1")


STAMP = ledger.Stamp(origin=None, session_id="s-1", label="allowed-once (policy auto)")


def add_job(text: str, delta: int) -> Callable[[Tx], str]:
    """An add as the pipeline commits one: the entry, its audit row and ledger row, usage."""
    def job(tx: Tx) -> str:
        e = _entry(text)
        e.created_at = e.updated_at = store.now_ms()
        store.insert_entry(tx, e)
        STAMP.audit(tx, "add", track=e.track, scope=e.scope, entry_id=e.id, text=e.text, source=e.source, entry=e,
                    ts=e.created_at)
        tx.usage[CELL] = tx.usage.get(CELL, 0) + delta
        return text

    return job


def kept_row(message: str) -> Callable[[Tx], None]:
    """A ledger row the writer keeps across a store fault (as the pipeline's ``failed``)."""
    return lambda tx: ledger.failed(tx, STAMP, "add", "STORE_UNAVAILABLE", message, None)


def chain(db: Path) -> list[tuple[int, str, str | None]]:
    """(n, kind, ref) of every ledger row, after checking that each hash chains on."""
    out, prev = [], ""
    for n, ts, kind, ref, seq, body, p, h in rows(db, "SELECT n, ts, kind, ref, audit_seq, body, prev, hash "
                                                      "FROM memoryd_ledger ORDER BY n"):
        assert (p, h) == (prev, chain_hash(prev, n, ts, kind, ref, seq, body))
        out.append((n, kind, ref))
        prev = h
    return out


def ledger_state(db: Path, head: tuple[int, str] | None) -> tuple[list[tuple[str, str | None]], list[str], Any]:
    """The audit rows (action, text), the ledger's kinds in order, and audit/verify's
    report against ``head``, which must be the store's newest row."""
    conn = sqlite3.connect(db)
    try:
        audit = conn.execute("SELECT action, text FROM audit ORDER BY seq").fetchall()
        kinds = [k for (k,) in conn.execute("SELECT kind FROM memoryd_ledger ORDER BY n")]
        report = consistent(conn, lambda fetch: read_report(fetch, head))
        assert ledger.head(conn) == head
    finally:
        conn.close()
    return audit, kinds, report


async def opened(db: Path) -> Writer:
    """A writer (not running) on a new store whose ledger has begun."""
    storefile.open_store(db, storefile.inspect(db), 0).close()
    return await Writer.open(db, storefile.inspect(db), 0)


async def test_the_ledger_chains_in_memory_and_a_rolled_back_connection_row_is_written_again(
        tmp_path: Path) -> None:
    """A transaction reads the ledger's newest row once (its Tx's tip); its rows chain on in
    memory. A job rolled back to its savepoint takes its connection row with it, so the next
    job of that connection writes the row again; and a connection whose row has committed
    is not looked up again."""
    db = tmp_path / "w.db"
    writer = await opened(db)
    statements: list[str] = []
    writer._sql.conn.set_trace_callback(statements.append)
    try:
        first, failed, last = await queued_then_run(writer, [audited(1), audited(2, fail=True), audited(2)])
        assert sum(s.startswith(HEAD_READ) for s in statements) == 1
        assert sum(s.startswith(LOOKUP) for s in statements) == 3  # 1, 2, and 2 again after its rollback
        del statements[:]
        writer = Writer(writer._sql, writer.usage, db, writer.anchor)
        assert await queued_then_run(writer, [audited(1), audited(2)]) == [1, 2]
        assert sum(s.startswith(HEAD_READ) for s in statements) == 1
        assert not [s for s in statements if s.startswith(LOOKUP)]  # both rows committed in this run
    finally:
        await writer.aclose()
    assert (first, last) == (1, 2) and isinstance(failed, BudgetExceeded)
    assert chain(db) == [(1, "start", None), (2, "connection", "run-1/1"), (3, "audit", None),
                         (4, "connection", "run-1/2"), (5, "audit", None), (6, "audit", None), (7, "audit", None)]
    assert writer.anchor.head is not None and writer.anchor.head[0] == 7 and writer.anchor.lost is None


@pytest.mark.parametrize("other", ["appended", "changed", "deleted"])
async def test_a_ledger_written_by_another_forgets_the_connection_rows(tmp_path: Path, other: str) -> None:
    """Once the ledger's newest row is not the one this daemon's last commit left, the
    connection rows it wrote are looked up again (and written again when gone). Another's
    row after the daemon's head leaves the head alone; a head row changed or deleted sets
    ``anchor.lost``, and the head stays where the daemon left it."""
    db = tmp_path / "w.db"
    writer = await opened(db)
    statements: list[str] = []
    writer._sql.conn.set_trace_callback(statements.append)
    try:
        assert await queued_then_run(writer, [audited(1)]) == [1]
        head = writer.anchor.head
        assert head is not None and head[0] == 3
        with contextlib.closing(sqlite3.connect(db, isolation_level=None)) as conn:
            if other == "appended":
                with ledger.transaction(conn) as tx:
                    kept_row("another's")(tx)
            elif other == "changed":
                conn.execute("UPDATE memoryd_ledger SET hash = 'forged' WHERE n = 3")
            else:
                conn.execute("DELETE FROM memoryd_ledger WHERE n > 1")
        del statements[:]
        writer = Writer(writer._sql, writer.usage, db, writer.anchor)
        assert await queued_then_run(writer, [audited(1)]) == [1]
        assert sum(s.startswith(LOOKUP) for s in statements) == 1
    finally:
        await writer.aclose()
    assert writer.anchor.lost == {"appended": None, "changed": "changed", "deleted": "missing"}[other]
    if other == "appended":
        assert chain(db) == [(1, "start", None), (2, "connection", "run-1/1"), (3, "audit", None),
                             (4, "failed", None), (5, "audit", None)]
        assert writer.anchor.head is not None and writer.anchor.head[0] == 5
    elif other == "changed":
        assert [(n, kind) for n, kind in rows(db, "SELECT n, kind FROM memoryd_ledger ORDER BY n")] == [
            (1, "start"), (2, "connection"), (3, "audit"), (4, "audit")]
        assert writer.anchor.head == head
    else:
        assert chain(db) == [(1, "start", None), (2, "connection", "run-1/1"), (3, "audit", None)]
        assert writer.anchor.head == head


async def test_two_stores_writers_run_their_batches_at_once_and_each_chains_its_own_ledger(
        tmp_path: Path) -> None:
    """Two stores' writers on one event loop (two daemons embedded in one process), each
    batch on its own writer's thread: each batch's ledger rows chain on from its own Tx, in
    order, so each Anchor ends at its store's real newest row; a deleted tail of those rows
    is reported."""
    dbs = [tmp_path / "a.db", tmp_path / "b.db"]
    a, b = [await opened(db) for db in dbs]
    steps = 8
    order: list[str] = []

    def row(name: str, n: int) -> Callable[[Tx], None]:
        def run(tx: Tx) -> None:
            order.append(f"{name}{n}")
            kept_row(f"{name} {n}")(tx)

        return run

    def job(name: str, n: int) -> Callable[[Tx], int]:
        def run(tx: Tx) -> int:
            order.append(f"{name} job")
            return audited(n)(tx)

        return run

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(a.serve)
            tg.start_soon(b.serve)
            for name, w in (("a", a), ("b", b)):
                for n in range(steps):
                    w.defer(row(name, n), keep=True)
            async with anyio.create_task_group() as writes:
                writes.start_soon(a.submit, job("a", 1))
                writes.start_soon(b.submit, job("b", 2))
            a.close()
            b.close()
        heads = [a.anchor.head, b.anchor.head]
    finally:
        await a.aclose()
        await b.aclose()
    for name in ("a", "b"):
        assert [x for x in order if x.startswith(name)] == [*(f"{name}{n}" for n in range(steps)), f"{name} job"]
    for db, n, head in ((dbs[0], 1, heads[0]), (dbs[1], 2, heads[1])):
        assert chain(db) == [(1, "start", None), *((k, "failed", None) for k in range(2, steps + 2)),
                             (steps + 2, "connection", f"run-1/{n}"), (steps + 3, "audit", None)]
        _, _, report = ledger_state(db, head)
        assert report.ok, report.problems
    with contextlib.closing(sqlite3.connect(dbs[0])) as other, other:
        other.execute("DELETE FROM memoryd_ledger WHERE n = ?", (steps + 3,))  # a same-uid forgery
    with contextlib.closing(sqlite3.connect(dbs[0])) as conn:
        report = consistent(conn, lambda fetch: read_report(fetch, heads[0]))
    assert not report.ok


# --- failures inside a batch: everything else applied exactly once ----------------------------


def recalled(text: str, ts: int) -> Callable[[Tx], None]:
    """A query's ``recalled`` audit row."""
    return lambda tx: STAMP.audit(tx, "recalled", track=None, scope=None, entry_id=None, text=text, source=None,
                                  ts=ts)


def recall(entry: Entry, ts: int, row: Callable[[Tx], None]) -> Callable[[Tx], None]:
    """A query's recall of ``entry``: its count, and its ``recalled`` row."""
    def job(tx: Tx) -> None:
        tx.conn.execute("UPDATE entries SET recall_count = recall_count + 1, last_recalled = ? WHERE id = ?",
                        (ts, entry.id))
        row(tx)

    return job


async def seed_one(db: Path) -> Entry:
    """A store with one entry (inserted without audit rows: the start row lists it)."""
    seeded = _entry("recalled one")
    conn = storefile.open_store(db, storefile.inspect(db), 0)
    try:
        with ledger.transaction(conn) as tx:
            store.insert_entry(tx, seeded)
    finally:
        conn.close()
    return seeded


async def test_a_long_flush_serves_a_write_and_keeps_a_row_a_fault_lost(tmp_path: Path) -> None:
    """While a flush of bookkeeping alone (kept ledger rows) runs on the writer's thread, the
    event loop serves: a write submitted meanwhile commits in the next batch; a store fault
    in one step rolls that step alone back, and its kept row is written at the head of the
    next batch. Every row is written once."""
    db = tmp_path / "w.db"
    await seed_one(db)
    writer = await Writer.open(db, storefile.inspect(db), 0)
    steps, fault_at = 24, 11
    wrote: list[str] = []
    faulted: list[int] = []
    done: list[int] = []

    async def write() -> None:
        wrote.append(await writer.submit(add_job("w", 1)))

    try:
        loop = asyncio.get_running_loop()
        async with anyio.create_task_group() as tg:
            tg.start_soon(writer.serve)

            def row(n: int) -> Callable[[Tx], None]:
                def run(tx: Tx) -> None:
                    if n == 4:  # on the writer's thread: the loop queues it before the flush ends
                        loop.call_soon_threadsafe(tg.start_soon, write)
                    if n == fault_at and not faulted:  # once
                        faulted.append(n)
                        read_only_job(tx)
                    kept_row(f"kept {n}")(tx)

                return run

            for n in range(steps):
                writer.defer(row(n), functools.partial(done.append, n), keep=True)
            await writer.settled()
            await writer.idle()
            await writer.settled()
            writer.close()
        head = writer.anchor.head
    finally:
        await writer.aclose()
    assert faulted == [fault_at] and wrote == ["w"]
    order = [*range(fault_at), *range(fault_at + 1, steps), fault_at]
    assert done == order
    audit, kinds, report = ledger_state(db, head)
    # the flush: the rows but the faulted one; the next batch: that row (kept), then the write
    assert audit == [("add", "w")]
    assert kinds == ["start", *["failed"] * steps, "audit"]
    messages = [json.loads(body)["message"] for (body,) in rows(db, "SELECT body FROM memoryd_ledger WHERE kind = "
                                                                    "'failed' ORDER BY n")]
    assert messages == [f"kept {n}" for n in order]
    assert report.ok, report.problems


def fails_after_its_rows(how: str) -> Callable[[Tx], Any]:
    """Writes an entry, its rows and usage, then fails: a bug of the job's own, or a store
    fault SQLite confines to the statement (SQLITE_READONLY)."""
    def job(tx: Tx) -> None:
        add_job("doomed", 1000)(tx)
        if how == "store-fault":
            read_only_job(tx)
        raise BudgetExceeded("memory budget exceeded", {})

    return job


@pytest.mark.parametrize("how", ["job-error", "store-fault"])
async def test_a_job_failing_mid_batch_leaves_every_other_step_applied_once(
        tmp_path: Path, how: str) -> None:
    """A batch of bookkeeping (a kept ledger row, a step with a bug, a query's recalls and
    its recalled row) and five jobs, the second and fourth of which fail after writing
    rows: each is rolled back to its savepoint alone, its entry, audit and ledger rows, its
    counts and usage with it. Every other step is applied once: one audit row and one
    ledger row each, in order, the usage and counts of the three adds alone, the recall
    counted once, each on_done run once, and the ledger's head (the Anchor) the committed
    head."""
    db = tmp_path / "w.db"
    seeded = await seed_one(db)
    writer = await Writer.open(db, storefile.inspect(db), 0)
    done: list[str] = []
    try:
        before = writer.usage[CELL]
        writer.defer(kept_row("kept"), lambda: done.append("kept"), keep=True)

        def bug(tx: Tx) -> None:
            raise RuntimeError("a bookkeeping bug")

        writer.defer(bug, lambda: done.append("bug"))
        writer.defer(recall(seeded, 5000, recalled("q", 5000)))
        results = await run_batch(writer, [add_job("a", 1), fails_after_its_rows(how), add_job("c", 2),
                                           fails_after_its_rows(how), add_job("e", 4)])
        failure = StoreUnavailable if how == "store-fault" else BudgetExceeded
        assert [r if isinstance(r, str) else type(r) for r in results] == ["a", failure, "c", failure, "e"]
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
    assert rows(db, "SELECT track, scope, entries, used FROM memoryd_usage WHERE entries != 0") == [
        (*CELL, 4, len("recalled one") + 3)]


@pytest.mark.parametrize("fail", [False, True], ids=["all-commit", "one-rolled-back"])
async def test_a_batch_writes_each_cells_counts_once_and_a_rolled_back_job_takes_its_counts_back(
        tmp_path: Path, fail: bool) -> None:
    """The counts memoryd keeps beside the entries (memoryd_usage) are added up in the Tx
    and written with one statement per cell before COMMIT; a job rolled back to its
    savepoint takes its counts with it.
    Either way the counts are those of the entries committed, and a start trusts them."""
    db = tmp_path / "w.db"
    statements: list[str] = []
    conn = storefile.open_store(db, storefile.inspect(db), 0)
    conn.set_trace_callback(statements.append)
    writer = Writer(conn, {}, db)
    try:
        jobs = [add_job("a", 1), add_job("bb", 2)] + ([fails_after_its_rows("job-error")] if fail else []) + [
            add_job("ccc", 3)]
        statements.clear()
        results = await run_batch(writer, jobs)
        assert [r for r in results if isinstance(r, str)] == ["a", "bb", "ccc"]
    finally:
        await writer.aclose()
    upserts = [s for s in statements if s.startswith("INSERT INTO memoryd_usage")]
    assert len(upserts) == 1
    assert rows(db, "SELECT track, scope, entries, used FROM memoryd_usage WHERE entries != 0") == [
        (*CELL, 3, 6)]
    with contextlib.closing(sqlite3.connect(db)) as check:
        assert store.trusted(check)


# --- a batch whose transaction is lost: in a step, or at COMMIT ------------------------------


def committed(db: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row another connection sees committed, table by table."""
    tables = ("entries", "audit", "memoryd_ledger", "meta", "memoryd_usage")
    return {t: rows(db, f"SELECT * FROM {t} ORDER BY rowid") for t in tables}


@pytest.mark.parametrize("where_lost", ["in-a-step", "at-commit"])
async def test_a_batch_whose_transaction_is_lost_fails_every_job_and_keeps_its_rows(
        tmp_path: Path, where_lost: str) -> None:
    """Either a step's fault makes SQLite roll the whole transaction back (SQLITE_FULL from
    max_page_count: the jobs after it never run), or no step fails and the COMMIT on the
    writer's thread does (a full file system: the pages reach the WAL at COMMIT). Every job
    fails with STORE_UNAVAILABLE full and its on_error runs; nothing is committed, neither
    the usage nor the ledger's head (the Anchor) moves, and the connection is left with no
    transaction. Once the fault clears, the kept ledger row commits once, and the
    connection row the lost batch had written is written again."""
    with contextlib.ExitStack() as stack:
        if where_lost == "at-commit":
            mnt = stack.enter_context(tmpfs(tmp_path / "mnt", "1m"))
        else:
            mnt = tmp_path
        db = mnt / "w.db"
        storefile.open_store(db, storefile.inspect(db), 0).close()
        writer = await Writer.open(db, storefile.inspect(db), 250)
        conn = writer._sql.conn
        statements = traced(conn)
        loop_thread = threading.get_ident()
        head, usage, before = writer.anchor.head, dict(writer.usage), committed(db)
        done: list[str] = []
        reported: list[BaseException] = []
        results: list[Any] = [None] * 3
        try:
            writer.defer(kept_row("kept"), lambda: done.append("kept"), keep=True)
            if where_lost == "at-commit":
                filler = fill(mnt)
            else:
                (pages,) = conn.execute("PRAGMA page_count").fetchone()
                conn.execute(f"PRAGMA max_page_count = {pages + 4}")

            async def one(n: int, fn: Callable[[Tx], Any]) -> None:
                try:
                    results[n] = await writer.submit(fn, on_error=reported.append)
                except StoreUnavailable as exc:
                    results[n] = exc

            async with anyio.create_task_group() as tg:
                async with anyio.create_task_group() as callers:
                    for n, fn in enumerate([add_job("a" * 30_000, 1), audited(1), put("k")]):
                        callers.start_soon(one, n, fn)
                    await anyio.wait_all_tasks_blocked()
                    tg.start_soon(writer.serve)
                assert [r.details for r in results] == [{"reason": "full", "path": str(db)}] * 3
                assert [type(e) for e in reported] == [StoreUnavailable] * 3
                assert [t for sql, t in statements if sql == "BEGIN IMMEDIATE"] == [writer.thread.ident]
                assert [t for sql, t in statements if sql == "COMMIT"] == (
                    [writer.thread.ident] if where_lost == "at-commit" else [])
                # the event loop ran only this test's own pragmas
                assert all(sql.startswith("PRAGMA") for sql, t in statements if t == loop_thread)
                assert committed(db) == before
                assert writer.usage == usage and writer.anchor.head == head and done == []
                assert not conn.in_transaction
                if where_lost == "at-commit":
                    filler.unlink()
                else:
                    conn.execute("PRAGMA max_page_count = 1073741823")
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
