"""The single writer: one task owns the write connection; every mutation runs there.

Jobs are plain synchronous functions ``fn(conn, usage) -> result`` executed on the write
connection's thread. The writer drains whatever is queued and commits it as one
transaction (group commit) with a savepoint per job, so one job's failure rolls back only
that job. A job's caller is answered only after COMMIT has returned, i.e. after the WAL
fsync (``synchronous=FULL``): an acknowledged write survives power loss.

Jobs marked ``durable=False`` (recall bookkeeping of queries) may commit with
``synchronous=NORMAL``: still atomic, made durable by the next full commit or checkpoint.

Store faults (busy past the busy timeout, disk full, read-only, I/O errors) reach the
caller as STORE_UNAVAILABLE. A fault that the job's savepoint contains fails that job
alone; one that takes the transaction with it (a failed BEGIN or COMMIT, or SQLite rolling
the whole transaction back, as it may on FULL, IOERR and BUSY) fails every job of the batch,
whatever each had computed: none of them committed. Either way the next batch starts on a
clean connection, so writes recover once the fault clears.
"""

from __future__ import annotations

import logging
import math
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import aiosqlite
import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from memoryd_protocol.errors import ProtocolError

from .ledger import Anchor
from .store import store_fault

log = logging.getLogger("memoryd.writer")

T = TypeVar("T")
Usage = dict[tuple[str, str], int]
JobFn = Callable[[sqlite3.Connection, Usage], T]
MAX_GROUP = 256
FLUSH_DELAY_S = 0.05


def _noop(conn: sqlite3.Connection, usage: Usage) -> None:
    return None


class WriterClosed(Exception):
    pass


@dataclass(eq=False)
class _Deferred:
    fn: Callable[[sqlite3.Connection], None]
    on_done: Callable[[], None]
    #: a ledger row: kept and written again with the next batch when a store fault loses it
    keep: bool


#: How many kept rows may wait for a store that cannot take writes; beyond it the oldest
#: are dropped, each with an error in the log, so a store that never recovers cannot grow
#: the daemon without bound.
MAX_KEPT = 10_000


@dataclass(eq=False)
class _Job(Generic[T]):
    fn: JobFn[T]
    durable: bool
    done: anyio.Event = field(default_factory=anyio.Event)
    result: Any = None
    error: BaseException | None = None


async def run_on(conn: aiosqlite.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
    """Run ``fn`` on the connection's own thread: one thread hop for a whole transaction.

    aiosqlite exposes only statement-level calls; ``_execute`` is the primitive they are
    all built on, and it is the one way to keep a multi-statement transaction on the
    thread that owns the sqlite3 connection without a hop per statement.
    """
    raw = conn._conn  # the sqlite3.Connection; only touched from inside fn, on its thread
    result: T = await conn._execute(fn, raw)  # type: ignore[no-untyped-call]
    return result


class Writer:
    def __init__(self, conn: aiosqlite.Connection, usage: Usage, path: Path, anchor: Anchor | None = None) -> None:
        self._conn = conn
        #: the ledger's head as this daemon wrote it (ledger.Anchor)
        self.anchor = anchor if anchor is not None else Anchor()
        #: the store, named in STORE_UNAVAILABLE's details
        self._path = path
        #: committed usage per track × scope; replaced (never mutated) after each commit,
        #: so readers on the event loop always see a committed state.
        self.usage: Usage = dict(usage)
        self._send: MemoryObjectSendStream[_Job[Any]]
        self._recv: MemoryObjectReceiveStream[_Job[Any]]
        self._send, self._recv = anyio.create_memory_object_stream[_Job[Any]](math.inf)
        self._full_sync = True
        self.depth = 0
        #: set while no job is queued or committing (depth 0): what a drain waits on
        self._idle = anyio.Event()
        self._idle.set()
        self._deferred: list[_Deferred] = []
        self._flush_wanted = anyio.Event()
        #: set while no commit carrying deferred bookkeeping is between COMMIT and on_done
        self._bookkeeping_idle = anyio.Event()
        self._bookkeeping_idle.set()

    async def submit(self, fn: JobFn[T], *, durable: bool = True) -> T:
        job: _Job[T] = _Job(fn, durable)
        try:
            self._send.send_nowait(job)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            raise WriterClosed("the store is closing") from None
        self.depth += 1
        if self._idle.is_set():
            self._idle = anyio.Event()
        # Once queued, the job runs whatever happens to the caller; wait for it shielded
        # so a cancelled caller cannot mistake a committed write for a failed one.
        with anyio.CancelScope(shield=True):
            await job.done.wait()
        if job.error is not None:
            raise job.error
        result: T = job.result
        return result

    def defer(self, fn: Callable[[sqlite3.Connection], None], on_done: Callable[[], None] = lambda: None,
              *, keep: bool = False) -> None:
        """Queue bookkeeping that nobody awaits (recall counters, ``recalled`` rows, the
        ledger's approval rows).

        It is written at the head of the next transaction, or by a flush within
        FLUSH_DELAY_S, whichever comes first: a burst of queries costs one commit instead
        of one each, and because every later write commits after it, the ledger stays in
        order. ``on_done`` runs on the event loop once it has committed (or failed).
        ``keep``: a store fault does not lose it; it is written with the next batch.
        """
        self._deferred.append(_Deferred(fn, on_done, keep))
        self._flush_wanted.set()

    async def settled(self) -> None:
        """Return once all deferred bookkeeping queued so far has committed, or failed (for
        readers that must see it, such as the audit ledger). A store that cannot take
        writes does not fail the read: the bookkeeping is lost (and logged), the read served."""
        if self._deferred:
            await self._flush()
        await self.bookkeeping_committed()

    async def idle(self) -> None:
        """Return once no job is queued or committing (``depth`` 0)."""
        if self.depth:
            await self._idle.wait()

    async def _flush(self) -> None:
        try:
            await self.submit(_noop, durable=False)
        except Exception:  # _commit logged it; recall bookkeeping is not an acknowledged write
            pass

    async def bookkeeping_committed(self) -> None:
        """Return once no commit carrying deferred bookkeeping is in flight."""
        if not self._bookkeeping_idle.is_set():
            await self._bookkeeping_idle.wait()

    async def flusher(self) -> None:
        while True:
            await self._flush_wanted.wait()
            await anyio.sleep(FLUSH_DELAY_S)
            self._flush_wanted = anyio.Event()
            if self._deferred:
                await self._flush()

    def close(self) -> None:
        """Accept no more jobs; ``run`` returns once the queued ones are committed."""
        self._send.close()

    async def run(self) -> None:
        async with self._recv:
            async for job in self._recv:
                batch: list[_Job[Any]] = [job]
                while len(batch) < MAX_GROUP:
                    try:
                        batch.append(self._recv.receive_nowait())
                    except (anyio.WouldBlock, anyio.EndOfStream):
                        break
                await self._commit(batch)

    async def _commit(self, batch: list[_Job[Any]]) -> None:
        durable = any(j.durable for j in batch)
        deferred, self._deferred = self._deferred, []
        lost: list[_Deferred] = []
        if deferred:
            self._bookkeeping_idle = anyio.Event()
        try:
            with anyio.CancelScope(shield=True):
                self.usage = await run_on(self._conn, lambda c: self._run_batch(c, batch, durable, deferred, lost))
        except Exception as exc:
            # Nothing of this batch committed: every job fails, whatever it had computed
            # (a result, or an error judged against rows that are gone now).
            fault = store_fault(exc, self._path)
            if fault is None:
                log.exception("group commit of %d job(s) failed", len(batch))
            else:
                log.error("group commit of %d job(s) failed: %s (%s): %s", len(batch), fault.code,
                          fault.details["reason"], exc)
            for j in batch:
                j.error = fault if fault is not None else RuntimeError("commit failed")
            lost = [d for d in deferred if d.keep]
        finally:
            self.depth -= len(batch)
            if not self.depth:
                self._idle.set()
            self._keep(lost)
            for d in deferred:
                if d not in lost:
                    d.on_done()
            self._bookkeeping_idle.set()
            for j in batch:
                j.done.set()

    def _keep(self, lost: list[_Deferred]) -> None:
        """Put kept rows that a fault lost back at the head of the queue, oldest first."""
        if not lost:
            return
        queue = lost + self._deferred
        while len(queue) > MAX_KEPT:
            log.error("a ledger row was dropped: the store has not taken a write for %d of them", MAX_KEPT)
            queue.pop(0).on_done()
        self._deferred = queue
        self._flush_wanted.set()

    @staticmethod
    def _undo(conn: sqlite3.Connection, savepoint: str, exc: Exception) -> None:
        """Roll back to ``savepoint`` after ``exc`` inside it. When SQLite has already
        rolled the whole transaction back (it may, on a store fault), raise ``exc``: the
        batch is lost, not just this step."""
        if not conn.in_transaction:
            raise exc
        conn.execute(f"ROLLBACK TO {savepoint}")
        conn.execute(f"RELEASE {savepoint}")

    def _run_batch(self, conn: sqlite3.Connection, batch: list[_Job[Any]], durable: bool,
                   deferred: list[_Deferred], lost: list[_Deferred]) -> Usage:
        if conn.in_transaction:
            conn.execute("ROLLBACK")  # left open by a ROLLBACK that failed in an earlier batch
        if durable != self._full_sync:
            conn.execute(f"PRAGMA synchronous = {'FULL' if durable else 'NORMAL'}")
            self._full_sync = durable
        usage = dict(self.usage)
        conn.execute("BEGIN IMMEDIATE")
        try:
            self.anchor.check(conn)
            for d in deferred:
                conn.execute("SAVEPOINT bookkeeping")
                try:
                    d.fn(conn)
                    conn.execute("RELEASE bookkeeping")
                except Exception as exc:
                    self._undo(conn, "bookkeeping", exc)
                    fault = store_fault(exc, self._path)
                    if fault is not None and d.keep:
                        lost.append(d)
                    if fault is None:
                        log.exception("deferred bookkeeping failed")
                    else:
                        log.error("deferred bookkeeping failed: %s (%s): %s", fault.code, fault.details["reason"], exc)
            for job in batch:
                before = dict(usage)
                conn.execute("SAVEPOINT job")
                try:
                    job.result = job.fn(conn, usage)
                    conn.execute("RELEASE job")
                except Exception as exc:
                    usage = before
                    self._undo(conn, "job", exc)
                    fault = store_fault(exc, self._path)
                    if fault is not None:
                        log.error("write job failed: %s (%s): %s", fault.code, fault.details["reason"], exc)
                        job.error = fault
                    else:
                        if not isinstance(exc, ProtocolError):
                            log.error("write job failed", exc_info=exc)
                        job.error = exc
            conn.execute("COMMIT")
            self.anchor.advance(conn)
        except BaseException:
            if conn.in_transaction:
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error as exc:
                    log.error("rollback after a failed commit failed: %s", exc)  # the next batch retries it
            raise
        return usage
