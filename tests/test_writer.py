"""The single writer, in process: a real store in a temporary directory, no daemon process.

A job is ``fn(tx)`` (or a generator function, yielding between its parts); the writer
commits whatever is queued as one transaction, always the same way: BEGIN IMMEDIATE on the
event loop (when another process holds the write lock, on the writer's thread, which waits
for it), each deferred step and each job in its own savepoint on the event loop (a failure
rolls that step and what it did to the Tx back, alone), the loop turning between steps and
parts once the batch has held it for TURN_AFTER_S (0 in the tests that check it), then the
usage counts, and COMMIT alone on the writer's thread. Here: those statements and threads,
failures of a step, of the whole transaction and of COMMIT, the ledger chained from the
Tx, the bookkeeping nobody awaits (kept ledger rows, the recall overlay), cancelled
callers, close and drain; ``atomic``; and ``Daemon.open`` letting go of everything when a
later step fails.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import sqlite3
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from memoryd import adapter_registry, foreign, ledger, queries, readers, store, storefile
from memoryd import writer as writer_module
from memoryd.adapter_registry import AdapterRegistryError
from memoryd.app import Daemon
from memoryd.atomic import atomic, begin, commit
from memoryd.config import Config
from memoryd.tx import Tx
from memoryd.writer import Steps, Writer, WriterClosed
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
Read = Callable[[Collection[str]], Awaitable[tuple[list[Entry], int, int]]]


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


@pytest.fixture
def turn_always(monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch lets the event loop turn after every step and at every yield of a job."""
    monkeypatch.setattr(writer_module, "TURN_AFTER_S", 0)


@contextlib.asynccontextmanager
async def wakers(names: list[str]) -> AsyncIterator[tuple[list[str], Callable[[str], None]]]:
    """A task waiting for each name; ``mark(name)`` (called in a step, on the event loop)
    logs the name and wakes its task, which logs ``woke name`` when the loop next turns."""
    log: list[str] = []
    events = {n: anyio.Event() for n in names}

    async def wait(n: str) -> None:
        await events[n].wait()
        log.append(f"woke {n}")

    def mark(n: str) -> None:
        log.append(n)
        events[n].set()

    async with anyio.create_task_group() as tg:
        for n in names:
            tg.start_soon(wait, n)
        await anyio.wait_all_tasks_blocked()
        yield log, mark


def page(reader: sqlite3.Connection) -> Read:
    """A query's read (every entry, rank order) as ``with_recalls`` takes it."""
    async def read(boosted: Collection[str]) -> tuple[list[Entry], int, int]:
        with atomic(reader, immediate=False):  # one snapshot, as readers.run takes it
            hits, total = queries.query_page(reader, track=None, scope=None, text=None, agent_key=None,
                                             workspace_key=None, limit=50, boosted=boosted)
            return hits, total, store.recall_seq(reader)

    return read


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


async def test_a_batch_runs_on_the_event_loop_and_commits_on_the_owner_thread(tmp_path: Path) -> None:
    """Every statement of a batch runs on the event loop's thread, BEGIN included (the
    write lock is free: no busy timeout is set for it); its COMMIT alone (the WAL's write
    and fsync) on the writer's own thread."""
    db, conn, writer = fresh(tmp_path)
    statements = traced(conn)
    loop_thread = threading.get_ident()
    seen: list[int] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(writer.run)
        for key in ("a", "b"):  # one after the other: four batches
            await writer.submit(where(seen))
            await writer.submit(put(key))
        writer.close()
    thread = writer.thread
    await writer.aclose()
    assert seen == [loop_thread] * 2 and thread.ident != loop_thread
    assert thread.name == "memoryd-writer"
    assert not thread.is_alive()  # aclose ended it
    assert [sql for sql, _ in statements if sql.split()[0] in ("BEGIN", "COMMIT")] == ["BEGIN IMMEDIATE", "COMMIT"] * 4
    assert [sql for sql, t in statements if t == thread.ident] == ["COMMIT"] * 4 + ["PRAGMA wal_checkpoint(PASSIVE)"]
    assert not [sql for sql, _ in statements if sql.startswith("PRAGMA busy_timeout")]
    assert rows(db) == [("t:a", "x"), ("t:b", "x")]


def seed(entries: list[Entry], mark: Callable[[str], None] | None = None) -> Callable[[Tx], Steps[int]]:
    """A job that splits itself, as a seed does: one entry a part; its result, how many."""
    def job(tx: Tx) -> Steps[int]:
        for n, e in enumerate(entries):
            store.insert_entry(tx, e)
            if mark is not None:
                mark(f"seed {n}")
            yield
        return len(entries)

    return job


@pytest.mark.parametrize("turn_after", [0, float("inf")], ids=["turns", "straight-through"])
async def test_a_generator_job_runs_on_the_event_loop_and_lets_it_turn_between_its_parts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, turn_after: float) -> None:
    """A batch of a plain job, a generator job of three parts and another plain job: every
    part runs on the event loop, and once the batch has held the loop for TURN_AFTER_S the
    loop turns after each step and part, so what became ready meanwhile (here: a task each
    of them woke) runs there; before that it runs straight through, and what it woke runs
    at its COMMIT. Either way: one transaction, and the generator's return value is its
    caller's result."""
    monkeypatch.setattr(writer_module, "TURN_AFTER_S", turn_after)
    db, conn, writer = fresh(tmp_path)
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    loop_thread = threading.get_ident()
    threads: set[int] = set()
    names = ["job 0", "seed 0", "seed 1", "seed 2", "job 2"]
    try:
        async with wakers(names) as (log, mark):
            def plain(n: int) -> Callable[[Tx], int]:
                def job(tx: Tx) -> int:
                    threads.add(threading.get_ident())
                    mark(f"job {n}")
                    return n

                return job

            def marked(name: str) -> None:
                threads.add(threading.get_ident())
                mark(name)

            entries = [_entry(f"seeded {n}") for n in range(3)]
            results = await queued_then_run(writer, [plain(0), seed(entries, marked), plain(2)])
    finally:
        await writer.aclose()
    assert results == [0, 3, 2] and threads == {loop_thread}
    if turn_after == 0:
        assert log == [x for n in names for x in (n, f"woke {n}")]
    else:
        assert log == [*names, *(f"woke {n}" for n in names)]
    assert (statements.count("BEGIN IMMEDIATE"), statements.count("COMMIT")) == (1, 1)
    assert sorted(t for (t,) in rows(db, "SELECT text FROM entries")) == ["seeded 0", "seeded 1", "seeded 2"]


async def test_a_long_recall_flush_lets_the_event_loop_turn_between_its_parts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, turn_always: None) -> None:
    """The recall bookkeeping of queries in a row is one generator step: the counters,
    BUMPS_PER_STEP entries a part, then each recall's row, a part each; the loop turns
    after every part (TURN_AFTER_S 0), and the whole flush commits as one transaction."""
    per_part = writer_module.BUMPS_PER_STEP
    db = tmp_path / "w.db"
    statements: list[str] = []
    entries = [_entry(f"e{n}") for n in range(2 * per_part + 1)]
    names = ["bumps 32", "bumps 32 again", "bumps 1", "row 0", "row 1"]
    async with running(db, statements=statements) as writer:
        assert await writer.submit(seed(entries)) == len(entries)
        async with wakers(names) as (log, mark):
            bump = store.bump_recalls

            def counted(conn: sqlite3.Connection, recalls: list[tuple[str, int, int]]) -> None:
                bump(conn, recalls)
                name = f"bumps {len(recalls)}"
                mark(f"{name} again" if name in log else name)

            monkeypatch.setattr(store, "bump_recalls", counted)
            writer.record_recalls(entries, 1000, lambda tx: mark("row 0"))
            writer.record_recalls(entries[:1], 1001, lambda tx: mark("row 1"))
            statements.clear()
            await writer.settled()
    assert log == [x for n in names for x in (n, f"woke {n}")]
    assert (statements.count("BEGIN IMMEDIATE"), statements.count("COMMIT")) == (1, 1)
    assert rows(db, "SELECT count(*), sum(recall_count), max(last_recalled) FROM entries") == [
        (len(entries), len(entries) + 1, 1001)]


async def test_a_write_lock_held_elsewhere_is_waited_for_on_the_owner_thread_never_on_the_loop(
        tmp_path: Path) -> None:
    """Another process holds the write lock: the batch's BEGIN on the event loop gives up at
    once (the connection's busy timeout is 0), and the writer's thread runs BEGIN again,
    waiting for the lock with the store's busy timeout, while the event loop serves
    everything else; then the batch runs on the loop as usual and commits once the lock is
    released."""
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
            tg.start_soon(writer.run)
            with write_lock(db):
                tg.start_soon(writer.submit, where(seen))
                await anyio.to_thread.run_sync(waiting.wait)
                assert seen == []  # the event loop runs (this test does), the write waits
                assert rows(db, "SELECT count(*) FROM meta WHERE key = 'schema_version'") == [(1,)]
            await writer.idle()
            writer.close()
    finally:
        await writer.aclose()
    assert seen == [loop_thread]
    on_thread = [sql for sql, t in statements if t == writer.thread.ident]
    assert on_thread == ["PRAGMA busy_timeout", "PRAGMA busy_timeout = 60000", "BEGIN IMMEDIATE",
                         "PRAGMA busy_timeout = 0", "COMMIT", "PRAGMA wal_checkpoint(PASSIVE)"]
    on_loop = [sql for sql, t in statements if t == loop_thread]
    # the BEGIN that gave up, then the batch: its Tx (the ledger's head), whether another
    # program wrote or changed the schema, its one job, the tail count
    assert on_loop[:6] == ["BEGIN IMMEDIATE", HEAD_READ, "PRAGMA data_version", "PRAGMA schema_version",
                           "SAVEPOINT step", "RELEASE step"]
    assert len(on_loop) == 7 and on_loop[6].startswith("SELECT max(rowid)")


async def test_writer_open_runs_migrations_and_the_chain_on_its_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The store is opened (and migrated) and the ledger's chain begun on the writer's own
    thread; its connection is left with a busy timeout of 0 (the loop never waits for the
    write lock); jobs run on the loop."""
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
        assert writer._owned.conn.execute("PRAGMA busy_timeout").fetchone() == (0,)
        async with anyio.create_task_group() as tg:
            tg.start_soon(writer.run)
            await writer.submit(where(seen))
            writer.close()
    finally:
        await writer.aclose()
    assert where_ == {"open_store": writer.thread.ident, "open_chain": writer.thread.ident}
    assert seen == [threading.get_ident()]
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


@pytest.mark.parametrize("generator", [False, True], ids=["plain", "generator"])
async def test_a_job_raising_past_except_exception_fails_every_job_of_its_batch(
        tmp_path: Path, turn_always: None, generator: bool) -> None:
    """Nothing of the batch committed: every caller is answered that the commit failed (and
    every on_error runs), none with the result its job had computed; the error ends ``run``.
    A job queued while the batch ran (at a generator job's yield) fails too, every later one
    is refused (WriterClosed), and ``settled`` returns though on_error queued bookkeeping:
    nothing would ever run them."""
    db, _, writer = fresh(tmp_path)
    reported: list[BaseException] = []
    results: list[Any] = [None, None, None]
    yielded = anyio.Event()

    def escapes(tx: Tx) -> Steps[None]:
        yielded.set()  # its caller's neighbour submits a job now, while the loop turns
        yield
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

    async def run() -> None:
        with pytest.raises(Escapes):
            await writer.run()

    async def during() -> None:
        await yielded.wait()
        await one(2, put("c"))

    def plain(tx: Tx) -> None:
        raise Escapes()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(one, 0, put("a"))
            tg.start_soon(one, 1, escapes if generator else plain)
            if generator:
                tg.start_soon(during)
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(run)
        if not generator:  # the batch failed on the event loop at once: run has ended
            await one(2, put("c"))
        await writer.settled()
        with pytest.raises(WriterClosed):
            await writer.submit(put("d"))
    finally:
        await writer.aclose()
    assert [(type(r), str(r)) for r in results] == [(RuntimeError, "commit failed")] * 2 + [
        (RuntimeError, "commit failed") if generator else (WriterClosed, "the store is closing")]
    assert [str(e) for e in reported] == ["commit failed"] * (3 if generator else 2)  # refused: the caller's to report
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


async def cancelled_mid_job(writer: Writer, fails: bool, generator: bool) -> list[BaseException]:
    """Submit a job that cancels its caller, then ends (failing, or committed); what
    ``on_error`` got. A generator job's caller is cancelled at its yield, between its parts
    (TURN_AFTER_S 0); a plain job's during the batch's COMMIT on the writer's thread (the
    loop does not turn before: TURN_AFTER_S infinite)."""
    finished: list[bool] = []

    def end(tx: Tx) -> str:
        tx.conn.execute("INSERT INTO meta VALUES (?, 'x')", (f"t:{fails}-{'generator' if generator else 'plain'}",))
        finished.append(True)
        if fails:
            raise BudgetExceeded("memory budget exceeded", {})
        return "done"

    def parts(tx: Tx) -> Steps[str]:
        yield
        return end(tx)

    def job(tx: Tx) -> str | Steps[str]:
        scope.cancel()
        return parts(tx) if generator else end(tx)

    reported: list[BaseException] = []
    ended: list[bool] = []

    async def caller() -> None:
        try:
            await writer.submit(job, on_error=reported.append)
        finally:
            ended.append(bool(finished) and writer.depth == 0)

    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as tg:
            tg.start_soon(caller)
    assert scope.cancelled_caught and ended == [True]
    return reported


async def test_a_caller_cancelled_while_its_job_runs_waits_for_it_and_its_failure_is_still_reported(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Cancelled while its job is in flight, the caller is cancelled only once the job has
    ended (committed, or failed); a failed job's ``on_error`` runs all the same (the
    pipeline's ``failed`` ledger row follows it), a committed one's does not; nothing is
    left waiting."""
    db = tmp_path / "w.db"
    async with running(db) as writer:
        for generator in (True, False):
            monkeypatch.setattr(writer_module, "TURN_AFTER_S", 0 if generator else float("inf"))
            assert [type(e) for e in await cancelled_mid_job(writer, True, generator)] == [BudgetExceeded]
            assert await cancelled_mid_job(writer, False, generator) == []
    assert rows(db) == [("t:False-generator", "x"), ("t:False-plain", "x")]


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


def two_entries(tx: Tx, ids: tuple[str, str]) -> None:
    for n, entry_id in enumerate(ids):
        store.insert_entry(tx, Entry(
            id=entry_id, track="user", scope="user-global", workspace_key="", agent_key="", text=f"text {n}",
            source="user", tags=[], version=1, created_at=n + 1, updated_at=n + 1, last_recalled=None,
            recall_count=0, session_id=None))


async def test_the_recall_overlay_counts_queued_recalls_exactly_once(tmp_path: Path) -> None:
    db = tmp_path / "w.db"
    async with running(db) as writer:
        older, newer = store.new_id(), store.new_id()
        await writer.submit(lambda tx: two_entries(tx, (older, newer)))
        with contextlib.closing(storefile.connect(db, 0)) as reader:
            read = page(reader)
            hits, _ = await writer.with_recalls(read)
            assert [e.id for e in hits] == [newer, older]  # by updated_at: neither recalled yet
            picked = [hits[1]]
            writer.record_recalls(picked, 1000)
            assert (picked[0].recall_count, picked[0].last_recalled) == (1, 1000)  # the reply's copy
            queued, _ = await writer.with_recalls(read)  # not committed yet: the overlay counts it
            assert [(e.id, e.recall_count, e.last_recalled) for e in queued] == [(older, 1, 1000), (newer, 0, None)]
            assert rows(db, "SELECT recall_count FROM entries WHERE id = ?", older) == [(0,)]
            await writer.settled()
            committed, _ = await writer.with_recalls(read)  # committed: the store counts it, the overlay no more
            assert [(e.id, e.recall_count, e.last_recalled) for e in committed] == [(older, 1, 1000), (newer, 0, None)]


async def test_recalls_of_queries_in_a_row_share_one_step_and_keep_every_row(tmp_path: Path) -> None:
    """Three queries' recalls: one UPDATE per entry in one commit, each recall's row written,
    in order; a step queued between recalls (a ledger row) keeps its place."""
    db = tmp_path / "w.db"
    statements: list[str] = []
    async with running(db, statements=statements) as writer:
        a, b = store.new_id(), store.new_id()
        await writer.submit(lambda tx: two_entries(tx, (a, b)))
        with contextlib.closing(storefile.connect(db, 0)) as reader:
            def row(key: str) -> Callable[[Tx], None]:
                return lambda tx: tx.conn.execute("INSERT INTO meta VALUES (?, 'x')", (f"t:{key}",)) and None

            by_id = {e.id: e for e in (await writer.with_recalls(page(reader)))[0]}
            writer.record_recalls([by_id[a], by_id[b]], 1000, row("1"))
            writer.record_recalls([by_id[a]], 1001, row("2"))
            writer.defer(row("between"))
            writer.record_recalls([by_id[a]], 1002, row("3"))
            statements.clear()
            await writer.settled()
    updates = [s for s in statements if s.startswith("UPDATE entries")]
    assert len(updates) == 3  # a and b for the first two queries, a for the third
    inserts = [s.split("'t:")[1].split("'")[0] for s in statements if "INSERT INTO meta VALUES" in s]
    assert inserts == ["1", "2", "between", "3"]
    assert statements.count("COMMIT") == 1
    assert sorted(rows(db, "SELECT id, recall_count, last_recalled FROM entries")) == sorted([(a, 3, 1002),
                                                                                             (b, 1, 1000)])


def held_commit(monkeypatch: pytest.MonkeyPatch, *, committed_first: bool) -> tuple[threading.Event, threading.Event]:
    """From now on the writer's COMMIT, on its thread, sets ``holding`` and waits for
    ``release``: before it commits, or (``committed_first``) once it has committed, before
    the writer learns of it."""
    holding, release = threading.Event(), threading.Event()
    loop_thread = threading.get_ident()

    def held(conn: sqlite3.Connection) -> None:
        if threading.get_ident() == loop_thread:  # waiting here would block the event loop for good
            holding.set()
            raise AssertionError("COMMIT on the event loop")
        if committed_first:
            commit(conn)
        holding.set()
        release.wait()
        if not committed_first:
            commit(conn)

    monkeypatch.setattr(writer_module, "commit", held)
    return holding, release


@pytest.mark.parametrize("committed_first", [False, True], ids=["before-commit", "after-commit"])
async def test_a_query_during_a_recalls_commit_counts_them_without_waiting(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, committed_first: bool) -> None:
    """While the commit carrying recalls is in flight (held before its COMMIT, or after it
    before the writer learns of it), a query counts each recall exactly once, without
    waiting: the sequence number its read sees says whether the store holds them."""
    db = tmp_path / "w.db"
    async with running(db) as writer:
        a, b = store.new_id(), store.new_id()
        await writer.submit(lambda tx: two_entries(tx, (a, b)))
        with contextlib.closing(storefile.connect(db, 0)) as reader:
            read = page(reader)
            first = (await writer.with_recalls(read))[0]
            writer.record_recalls([e for e in first if e.id == a], 1000)
            writer.record_recalls([e for e in first if e.id == a], 1000)
            holding, release = held_commit(monkeypatch, committed_first=committed_first)
            async with anyio.create_task_group() as tg:
                try:  # released before the task group waits for the commit, whatever happens
                    tg.start_soon(writer.settled)
                    await anyio.to_thread.run_sync(holding.wait)
                    hits, _ = await writer.with_recalls(read)
                    assert [(e.id, e.recall_count, e.last_recalled) for e in hits] == [(a, 2, 1000), (b, 0, None)]
                finally:
                    release.set()
            monkeypatch.undo()
            hits, _ = await writer.with_recalls(read)  # committed: the store counts them, the overlay no more
            assert [(e.id, e.recall_count) for e in hits] == [(a, 2), (b, 0)]


async def test_a_failed_recall_step_takes_only_its_own_recalls_out_of_the_overlay(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two recall steps in one commit (a row queued between them starts the second); the
    second fails and is rolled back. While the commit is in flight a query counts the first
    step's recall, which commits, and not the second's, which is lost."""
    db = tmp_path / "w.db"
    async with running(db) as writer:
        a, b = store.new_id(), store.new_id()
        await writer.submit(lambda tx: two_entries(tx, (a, b)))
        with contextlib.closing(storefile.connect(db, 0)) as reader:
            read = page(reader)
            hits = (await writer.with_recalls(read))[0]
            writer.record_recalls([e for e in hits if e.id == a], 1000)
            writer.defer(lambda tx: None)

            def broken(tx: Tx) -> None:
                raise RuntimeError("a bug of ours")

            writer.record_recalls([e for e in hits if e.id == b], 1001, broken)
            holding, release = held_commit(monkeypatch, committed_first=False)
            async with anyio.create_task_group() as tg:
                try:
                    tg.start_soon(writer.settled)
                    await anyio.to_thread.run_sync(holding.wait)
                    during = {e.id: e.recall_count for e in (await writer.with_recalls(read))[0]}
                finally:
                    release.set()
            monkeypatch.undo()
            after = {e.id: e.recall_count for e in (await writer.with_recalls(read))[0]}
    assert during == after == {a: 1, b: 0}


@pytest.mark.parametrize("ends", [False, True], ids=["began", "began-and-ended"])
async def test_a_recalls_commit_during_a_read_is_counted_once_and_the_read_is_not_repeated(
        tmp_path: Path, ends: bool) -> None:
    """A read (async: on a reader's thread in the daemon) during which the commit carrying
    queued recalls began, or began and ended: the read happens once, and each recall counts
    once, whether the snapshot it took holds the commit or not."""
    db = tmp_path / "w.db"
    async with running(db) as writer:
        a, b = store.new_id(), store.new_id()
        await writer.submit(lambda tx: two_entries(tx, (a, b)))
        with contextlib.closing(storefile.connect(db, 0)) as reader:
            first = (await writer.with_recalls(page(reader)))[0]
            writer.record_recalls([e for e in first if e.id == a], 1000)
            gate = anyio.Event()
            reads: list[int] = []
            got: list[list[Entry]] = []

            async def read(boosted: Collection[str]) -> tuple[list[Entry], int, int]:
                reads.append(len(reads))
                await gate.wait()  # the read's snapshot is taken once the gate opens
                return await page(reader)(boosted)

            async def query() -> None:
                got.append((await writer.with_recalls(read))[0])

            async with anyio.create_task_group() as tg:
                tg.start_soon(query)
                await anyio.wait_all_tasks_blocked()
                if ends:
                    await writer.settled()  # the commit began and ended: the snapshot holds it
                    gate.set()
                else:
                    tg.start_soon(writer.settled)
                    await anyio.wait_all_tasks_blocked()  # begun; its COMMIT on the thread
                    gate.set()
    assert reads == [0]
    assert [(e.id, e.recall_count, e.last_recalled) for e in got[0]] == [(a, 1, 1000), (b, 0, None)]


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


def test_begin_with_a_busy_timeout_puts_the_connections_own_back(tmp_path: Path) -> None:
    """The writer's BEGIN on its thread waits with the store's timeout; the connection's own
    (0: the event loop never waits) is back after it, whether BEGIN took the lock or not."""
    db = tmp_path / "a.db"
    conn = storefile.open_store(db, 0, 0)
    try:
        conn.execute("PRAGMA busy_timeout = 7")
        with write_lock(db), pytest.raises(sqlite3.OperationalError) as info:
            begin(conn, busy_timeout_ms=0)
        assert store.fault_reason(info.value) == "busy"
        assert conn.execute("PRAGMA busy_timeout").fetchone() == (7,) and not conn.in_transaction
        begin(conn, busy_timeout_ms=1000)
        assert conn.in_transaction and conn.execute("PRAGMA busy_timeout").fetchone() == (7,)
        conn.execute("ROLLBACK")
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
    writer._owned.conn.set_trace_callback(statements.append)
    try:
        first, failed, last = await queued_then_run(writer, [audited(1), audited(2, fail=True), audited(2)])
        assert sum(s.startswith(HEAD_READ) for s in statements) == 1
        assert sum(s.startswith(LOOKUP) for s in statements) == 3  # 1, 2, and 2 again after its rollback
        del statements[:]
        writer = Writer(writer._owned, writer.usage, db, writer.anchor)
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
    writer._owned.conn.set_trace_callback(statements.append)
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
        writer = Writer(writer._owned, writer.usage, db, writer.anchor)
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


async def test_two_stores_writers_interleave_their_batches_and_each_chains_its_own_ledger(
        tmp_path: Path, turn_always: None) -> None:
    """Two stores' writers on one event loop (two daemons embedded in one process), the loop
    turning after every step: their batches' steps interleave one for one, and each batch's
    ledger rows chain on from its own Tx, so each Anchor ends at its store's real newest
    row; a deleted tail of those rows is reported."""
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
            tg.start_soon(a.run)
            tg.start_soon(b.run)
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
    assert order == [x for n in range(steps) for x in (f"a{n}", f"b{n}")] + ["a job", "b job"]
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


async def test_a_long_flush_serves_queries_and_a_write_and_keeps_a_row_a_fault_lost(
        tmp_path: Path, turn_always: None) -> None:
    """While a flush of bookkeeping alone (a query's recalls and row, then kept ledger rows)
    lets the event loop turn after every step: queries count each recall once, theirs
    queued for the next commit; a write submitted meanwhile commits in the next batch; a
    store fault in one step rolls that step alone back, and its kept row is written at the
    head of the next batch. Every row is written once, and every recall counted once."""
    db = tmp_path / "w.db"
    await seed_one(db)
    writer = await Writer.open(db, storefile.inspect(db), 0)
    steps, fault_at = 24, 11
    seen: list[int] = []
    wrote: list[str] = []
    faulted: list[int] = []
    done: list[int] = []
    with contextlib.closing(storefile.connect(db, 0)) as reader:
        read = page(reader)

        async def query(k: int) -> None:
            hits, _ = await writer.with_recalls(read)
            seen.append(hits[0].recall_count)
            writer.record_recalls(hits, 2000 + k, recalled(f"s{k}", 2000 + k))

        async def write() -> None:
            wrote.append(await writer.submit(add_job("w", 1)))

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(writer.run)

                def row(n: int) -> Callable[[Tx], None]:
                    def run(tx: Tx) -> None:
                        if n % 8 == 0:
                            tg.start_soon(query, n)  # it runs at the loop's next turn, before the next step
                        if n == 4:
                            tg.start_soon(write)
                        if n == fault_at and not faulted:  # once
                            faulted.append(n)
                            read_only_job(tx)
                        kept_row(f"kept {n}")(tx)

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
            await writer.aclose()
    assert faulted == [fault_at] and seen == [1, 2, 3] and wrote == ["w"]
    assert dict(after)["recalled one"] == 4
    assert rows(db, "SELECT recall_count, last_recalled FROM entries WHERE text = 'recalled one'") == [(4, 2016)]
    order = [*range(fault_at), *range(fault_at + 1, steps), fault_at]
    assert done == order
    audit, kinds, report = ledger_state(db, head)
    # the flush: the first query's recall, the rows but the faulted one; the next batch: that
    # row (kept), the recalls of the queries during the flush, then the write
    assert audit == [("recalled", "q"), ("recalled", "s0"), ("recalled", "s8"), ("recalled", "s16"), ("add", "w")]
    assert kinds == ["start", "audit", *["failed"] * steps, "audit", "audit", "audit", "audit"]
    messages = [json.loads(body)["message"] for (body,) in rows(db, "SELECT body FROM memoryd_ledger WHERE kind = "
                                                                    "'failed' ORDER BY n")]
    assert messages == [f"kept {n}" for n in order]
    assert report.ok, report.problems


def fails_after_its_rows(how: str) -> Callable[[Tx], Any]:
    """Writes an entry, its rows and usage, then fails: a bug of the job's own, a store
    fault SQLite confines to the statement (SQLITE_READONLY), or a bug in a generator job's
    second part, after the loop turned at its yield."""
    def job(tx: Tx) -> None:
        add_job("doomed", 1000)(tx)
        if how == "store-fault":
            read_only_job(tx)
        raise BudgetExceeded("memory budget exceeded", {})

    def parts(tx: Tx) -> Steps[None]:
        add_job("doomed", 1000)(tx)
        yield
        raise BudgetExceeded("memory budget exceeded", {})

    return parts if how == "generator" else job


@pytest.mark.parametrize("how", ["job-error", "store-fault", "generator"])
async def test_a_job_failing_mid_batch_leaves_every_other_step_applied_once(
        tmp_path: Path, turn_always: None, how: str) -> None:
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
        writer.record_recalls([seeded], 5000, recalled("q", 5000))
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
    and written with one statement per cell before COMMIT, and the text index's mark is
    read once per transaction; a job rolled back to its savepoint takes its counts with it.
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
    marks = [s for s in statements if "memoryd_fts_mark" in s and s.startswith("SELECT (SELECT")]
    assert (len(upserts), len(marks)) == (1, 1)
    assert rows(db, "SELECT track, scope, entries, used FROM memoryd_usage WHERE entries != 0") == [
        (*CELL, 3, 6)]
    with contextlib.closing(sqlite3.connect(db)) as check:
        assert store.trusted(check)


async def test_a_failing_recall_step_loses_only_its_recalls_and_clears_the_overlay(tmp_path: Path) -> None:
    """The recalled row of a query fails (a bug): that query-run's recall step is undone
    (its counters and rows, one step), the jobs and the other bookkeeping of the batch
    commit once, and no later query counts the lost recalls from the overlay."""
    db = tmp_path / "w.db"
    seeded = await seed_one(db)
    writer = await Writer.open(db, storefile.inspect(db), 0)
    try:
        writer.defer(kept_row("kept"), keep=True)

        def broken_row(tx: Tx) -> None:
            raise RuntimeError("a recalled row's bug")

        writer.record_recalls([seeded], 5000, broken_row)
        assert await run_batch(writer, [add_job("a", 1)]) == ["a"]
        with contextlib.closing(storefile.connect(db, 0)) as reader:
            hits, _ = await writer.with_recalls(page(reader))
        assert {e.text: e.recall_count for e in hits} == {"recalled one": 0, "a": 0}
        head = writer.anchor.head
    finally:
        await writer.aclose()
    audit, kinds, report = ledger_state(db, head)
    assert audit == [("add", "a")]
    assert kinds == ["start", "failed", "audit"]
    assert report.ok, report.problems


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
        conn = writer._owned.conn
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
                    tg.start_soon(writer.run)
                assert [r.details for r in results] == [{"reason": "full", "path": str(db)}] * 3
                assert [type(e) for e in reported] == [StoreUnavailable] * 3
                assert [t for sql, t in statements if sql == "BEGIN IMMEDIATE"] == [loop_thread]
                assert [t for sql, t in statements if sql == "COMMIT"] == (
                    [writer.thread.ident] if where_lost == "at-commit" else [])
                assert committed(db) == before
                assert writer.usage == usage and writer.anchor.head == head and done == []
                assert not conn.in_transaction and conn.execute("PRAGMA busy_timeout").fetchone() == (0,)
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
