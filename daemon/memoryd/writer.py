"""The single writer: one thread owns the write connection; every mutation runs there.

A job is a synchronous function of the transaction, ``fn(tx) -> result`` (tx.py). The
writer drains whatever is queued and runs it as one transaction (group commit), the whole
of it on the writer's own thread, one hop from the event loop per batch::

    event loop                                   writer's thread
    a request: decode, check, policy, approval (pipeline.py); submit(fn), await
    (another program wrote, and the spaced reconcile is not due yet: wait, foreign.Watch.due)
    the next MAX_GROUP jobs  ------------------> BEGIN IMMEDIATE (the lock held elsewhere:
                                                   wait for it up to busy_timeout)
                                                 what another program changed is reconciled
                                                   first (foreign.Watch.guard)
                                                 each deferred row, then each job:
                                                   SAVEPOINT; fn(tx); RELEASE
                                                   (a failure: ROLLBACK TO, that one alone)
                                                 the usage counts and text index rows
                                                   gathered in the Tx (store.flush)
                                                 COMMIT (the WAL's write and fsync)
    answer every caller  <---------------------- (a failed COMMIT fails every job of it)
    the reply, events and watchers

Where each request's work runs, then:

- a write (``pipeline.write``: add, replace, remove, consolidate, seed, import, a proposal
  approved): its checks, policy and approval on the event loop; its job, every row of it,
  on the writer's thread; its reply and events on the loop, once COMMIT has returned;
- a query: its read on a reader's thread (readers.py), its recall counts and ``recalled``
  row a job here (``durable=False``), its reply on the loop;
- a session's snapshot (snapshots.py): the look for its frozen text on a reader's thread;
  a new one's read of the entries, its rendering and its row one job here;
- any other read (a list, an export, audit/verify): a reader's thread;
- the ledger's approval rows (``defer``): at the head of the next batch, on this thread.

The loop runs no statement of a batch, and serves queries and approvals while a long batch
runs. ``fn`` therefore touches nothing of the loop's (no future, event or notify): it reads
and writes the store through ``tx`` and returns what its caller needs. A caller is answered
only after COMMIT has returned, i.e. after the fsync (``synchronous=FULL``): an
acknowledged write survives power loss.

Bookkeeping nobody awaits (``defer``: the ledger's approval and failure rows) runs at the
head of the next batch, as its first steps. A batch whose jobs are all ``durable=False``
(bookkeeping, a query's recall counts) commits with ``synchronous=NORMAL``. Store faults
reach callers as STORE_UNAVAILABLE.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, NamedTuple, TypeVar

import anyio
from memoryd_protocol.audit_types import WitnessedHead

from . import foreign, ledger, store, storefile
from .atomic import atomic, begin, commit, rollback
from .sqlthread import SqliteThread
from .store import store_fault
from .tx import Tx, Usage

log = logging.getLogger("memoryd.writer")

T = TypeVar("T")
MAX_GROUP = 256
FLUSH_DELAY_S = 0.05
#: How many kept rows may wait for a store that cannot take writes; beyond it the oldest
#: are dropped, each with an error in the log, so a store that never recovers cannot grow
#: the daemon without bound.
MAX_KEPT = 10_000


def _noop(tx: Tx) -> None:
    return None


class WriterClosed(Exception):
    pass


@dataclass(eq=False)
class _Deferred:
    fn: Callable[[Tx], object]
    on_done: Callable[[], None]
    #: a ledger row: kept and written again with the next batch when a store fault loses it
    keep: bool


@dataclass(eq=False)
class _Job(Generic[T]):
    fn: Callable[[Tx], T]
    durable: bool
    #: resolved (to None) once the job's batch has committed or failed; cancelled instead
    #: when its caller is cancelled meanwhile (``submit``)
    done: asyncio.Future[None]
    result: Any = None
    error: BaseException | None = None
    #: run on the event loop with ``error`` once the job has failed, whether or not its
    #: caller still waits (a caller cancelled meanwhile only sees its cancellation)
    on_error: Callable[[BaseException], None] | None = None
    #: set once the job's batch has committed or failed
    ended: bool = False
    #: what a caller cancelled while the job ran waits on instead of ``done`` (``submit``)
    end_waiter: asyncio.Future[None] | None = None


class _Done(NamedTuple):
    """What a batch's committed transaction hands back to the event loop."""

    tx: Tx
    #: the data_version the store is accounted for up to (foreign.Watch.reconciled)
    moved: int | None
    #: how many entries the batch added (net)
    added: int
    #: kept rows that a fault lost: written again with the next batch
    lost: list[_Deferred]


class Writer:
    def __init__(self, conn: sqlite3.Connection | SqliteThread, usage: Usage, path: Path,
                 anchor: ledger.Anchor | None = None, entries: int = 0,
                 watch: foreign.Watch | None = None) -> None:
        #: the write connection and its one thread (a bare connection gets a thread here)
        self._sql = conn if isinstance(conn, SqliteThread) else SqliteThread("memoryd-writer", conn)
        #: the ledger's head as this daemon wrote it (ledger.Anchor)
        self.anchor = anchor if anchor is not None else ledger.Anchor()
        #: whether another program wrote since (a bare connection is looked at here, before
        #: its thread runs anything)
        self._watch = watch if watch is not None else foreign.Watch.of(self._sql.conn, path)
        #: the store, named in STORE_UNAVAILABLE's details
        self._path = path
        self._usage: Usage = dict(usage)
        #: how many entries the committed store holds (as memoryd's own writes count them)
        self.entries = entries
        #: queued jobs, and what wakes ``serve`` for them (plain asyncio: one append and one
        #: future per job, where anyio's memory stream and Event cost several calls each)
        self._queue: deque[_Job[Any]] = deque()
        self._wake = asyncio.Event()
        self._closed = False
        self._full_sync = True
        self.depth = 0
        #: set while no job is queued or committing (depth 0): what a drain waits on
        self._idle = asyncio.Event()
        self._idle.set()
        self._deferred: list[_Deferred] = []
        self._flush_wanted = anyio.Event()
        #: set while no commit carrying deferred bookkeeping is between BEGIN and its end
        self._bookkeeping_idle = anyio.Event()
        self._bookkeeping_idle.set()

    @classmethod
    async def open(cls, path: Path, version: int, busy_timeout_ms: int,
                   stop: WitnessedHead | None = None, *, untouched: bool = False) -> Writer:
        """Open (and migrate) the store on the writer's own new thread, begin or reconcile
        the ledger's chain (foreign.opened, with the last ``stop``), read the usage."""
        sql = await SqliteThread.open("memoryd-writer", lambda: storefile.open_store(path, version, busy_timeout_ms))
        try:
            try:
                o = await sql.call(lambda c: foreign.opened(c, path, stop, untouched=untouched))
            except sqlite3.Error as exc:
                raise store.store_fault(exc, path) or exc from None
        except BaseException:
            await sql.aclose()
            raise
        # the watch as the check left the store, not as it is by now
        return cls(sql, o.usage, path, ledger.Anchor(o.head), o.entries, o.watch)

    @property
    def usage(self) -> Usage:
        """Committed usage per track × scope, replaced (never mutated) by each commit: always a committed state."""
        return self._usage

    @property
    def thread(self) -> threading.Thread:
        """The thread every batch of this writer runs on, BEGIN to COMMIT."""
        return self._sql.thread

    async def aclose(self) -> None:
        """Once ``serve`` has returned: checkpoint (best effort), close the connection, end
        the thread. (A writer that never ran closes its queue here.)"""
        self.close()
        await self._sql.aclose(lambda c: c.execute("PRAGMA wal_checkpoint(PASSIVE)"))

    async def submit(self, fn: Callable[[Tx], T], *, durable: bool = True,
                     on_error: Callable[[BaseException], None] | None = None) -> T:
        """Run ``fn`` in the next group commit; return its result once COMMIT has returned.
        Its error (a store fault as STORE_UNAVAILABLE) is raised here, to the one caller
        who reports it: the writer logs only what nobody awaits. A caller cancelled while
        its job runs gets its cancellation once the job has ended; what must follow a
        failure whatever happens to the caller (a ledger row) goes in ``on_error``."""
        if self._closed:
            raise WriterClosed("the store is closing")
        loop = asyncio.get_running_loop()
        job: _Job[T] = _Job(fn, durable, loop.create_future(), on_error=on_error)
        self._queue.append(job)
        self._wake.set()
        self.depth += 1
        self._idle.clear()
        # Once queued, the job runs whatever happens to the caller: a cancelled caller
        # waits for its end all the same, shielded, so it cannot mistake a committed write
        # for a failed one. (Its cancellation cancels ``done``, which the writer then
        # leaves alone, and it waits on ``end_waiter`` instead: cheaper than asyncio.shield
        # around every job, which costs each write a future and a turn of the loop more.)
        try:
            await job.done
        except asyncio.CancelledError:
            if not job.ended:
                job.end_waiter = loop.create_future()
                with anyio.CancelScope(shield=True):
                    await job.end_waiter
            raise
        if job.error is not None:
            raise job.error
        result: T = job.result
        return result

    def defer(self, fn: Callable[[Tx], object], on_done: Callable[[], None] = lambda: None,
              *, keep: bool = False) -> None:
        """Queue bookkeeping that nobody awaits (the ledger's approval and failure rows).

        It is written at the head of the next transaction, or by a flush within
        FLUSH_DELAY_S, whichever comes first: because every later write commits after it,
        the ledger stays in order. ``on_done`` runs on the event loop once it has committed (or failed).
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
        await self._bookkeeping_committed()

    async def look_outside(self, index: bool = False) -> None:
        """Return once a batch begun after this call has checked for others' writes (and the text ``index``)."""
        self._watch.look(index)
        await self._flush()

    async def idle(self) -> None:
        """Return once no job is queued or committing (``depth`` 0)."""
        if self.depth:
            await self._idle.wait()

    async def _flush(self) -> None:
        try:
            await self.submit(_noop, durable=False)
        except Exception:  # _commit logged it; bookkeeping is not an acknowledged write
            pass

    async def _bookkeeping_committed(self) -> None:
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
        """Accept no more jobs; ``serve`` returns once the queued ones are committed."""
        self._closed = True
        self._wake.set()

    async def serve(self) -> None:
        """The writer's task: commit batches until closed and drained."""
        try:
            await self._batches()
        except BaseException:
            # Ended by what no batch contains (``_commit`` raises it again), or cancelled:
            # no job will run any more. Later ones are refused and queued ones fail, whose
            # callers (and ``settled``'s flush) would otherwise wait for them forever.
            self._closed = True
            queued = list(self._queue)
            self._queue.clear()
            self.depth -= len(queued)
            if not self.depth:
                self._idle.set()
            for j in queued:
                j.error = RuntimeError("commit failed")
                self._end(j)
            raise

    async def _batches(self) -> None:
        queue = self._queue
        while True:
            if not queue:
                if self._closed:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            batch = [queue.popleft() for _ in range(min(len(queue), MAX_GROUP))]
            await self._commit(batch)

    def _sync(self, conn: sqlite3.Connection, durable: bool) -> None:
        """Before a transaction: roll back one a failed ROLLBACK left open; ``synchronous`` FULL, or NORMAL for bookkeeping."""
        rollback(conn, "left open by an earlier batch")
        if durable != self._full_sync:
            conn.execute(f"PRAGMA synchronous = {'FULL' if durable else 'NORMAL'}")
            self._full_sync = durable

    # --- a batch's transaction ----------------------------------------------------------

    async def _commit(self, batch: list[_Job[Any]]) -> None:
        durable = any(j.durable for j in batch)
        deferred, self._deferred = self._deferred, []
        lost: list[_Deferred] = []
        if deferred:
            self._bookkeeping_idle = anyio.Event()
        try:
            with anyio.CancelScope(shield=True):
                index = await self._watch.due(self._sql.call)
                tx, moved, added, lost = await self._sql.call(
                    lambda conn: self._transaction(conn, batch, deferred, durable, index))
            self.anchor.committed(tx)
            self._watch.reconciled(moved)
            self._usage = tx.usage
            self.entries = (self.entries if tx.entries is None else tx.entries) + added
        except BaseException as exc:
            # Nothing of this batch committed: every job fails, whatever it had computed
            # (a result, or an error judged against rows that are gone now). Also on what
            # ``except Exception`` lets through (a job's SystemExit, say), which then ends
            # ``serve``: answered with its result, a caller would think its write committed.
            fault = store_fault(exc, self._path)
            if fault is None:
                log.exception("group commit of %d job(s) failed", len(batch))
            else:
                log.error("group commit of %d job(s) failed: %s (%s): %s", len(batch), fault.code,
                          fault.details["reason"], exc)
            for j in batch:
                j.result = None
                j.error = fault if fault is not None else RuntimeError("commit failed")
            lost = [d for d in deferred if d.keep]
            if not isinstance(exc, Exception):
                raise
        finally:
            self.depth -= len(batch)
            if not self.depth:
                self._idle.set()
            self._keep(lost)
            for d in deferred:
                if d not in lost:
                    d.on_done()
            if deferred:
                self._bookkeeping_idle.set()
            for j in batch:
                self._end(j)

    def _transaction(self, conn: sqlite3.Connection, batch: list[_Job[Any]], deferred: list[_Deferred],
                     durable: bool, index: bool) -> _Done:
        """The batch's whole transaction, on the writer's thread: each job's result or error
        is set on it; what the event loop takes over once COMMIT has returned is returned.
        An error that takes the transaction with it is raised, the transaction rolled back."""
        self._sync(conn, durable)
        lost: list[_Deferred] = []
        try:
            begin(conn)
            tx, head_n = self.anchor.begin(conn, self._usage), self.anchor.head[0] if self.anchor.head else 0
            moved, refused = self._watch.guard(tx, head_n, index)
            if refused is not None:  # nothing of the batch runs; its kept rows wait for the next
                lost = [d for d in deferred if d.keep]
            for d in deferred if refused is None else ():
                error = self._step(tx, d.fn)[1]
                if error is None:
                    continue
                fault = store_fault(error, self._path)
                if fault is None:
                    log.error("deferred bookkeeping failed", exc_info=error)
                else:
                    log.error("deferred bookkeeping failed: %s (%s): %s", fault.code, fault.details["reason"], error)
                    if d.keep:
                        lost.append(d)
            for job in batch:
                job.result, error = self._step(tx, job.fn) if foreign.runs(job.fn, refused) else (None, refused)
                if error is not None:
                    fault = store_fault(error, self._path)
                    if fault is not None:
                        log.error("write job failed: %s (%s): %s", fault.code, fault.details["reason"], error)
                    # Not logged otherwise: submit raises it to the caller, who reports it.
                    job.error = fault if fault is not None else error
            added = sum(n for n, _ in tx.counts.values())
            store.flush(tx)
            commit(conn)
        except BaseException:
            rollback(conn, "of a failed batch")
            raise
        return _Done(tx, moved, added, lost)

    @staticmethod
    def _step(tx: Tx, fn: Callable[[Tx], Any]) -> tuple[Any, Exception | None]:
        """One deferred row or job in its own savepoint: its result, or the error that
        rolled it (and what it did to ``tx``) back. An error that took the transaction
        with it (``lost``) is raised: the batch fails."""
        saved = tx.save()
        point = atomic(tx.conn, "step")
        try:
            with point:
                return fn(tx), None
        except Exception as exc:
            if point.lost:
                raise
            tx.restore(saved)
            return None, exc

    @staticmethod
    def _end(j: _Job[Any]) -> None:
        """The job has committed or failed (``error``): its on_error, then its caller."""
        if j.error is not None and j.on_error is not None:
            try:
                j.on_error(j.error)
            except Exception:  # a bug of ours: it must not leave a caller waiting
                log.exception("on_error of a failed job failed")
        j.ended = True
        if not j.done.done():
            j.done.set_result(None)
        if j.end_waiter is not None and not j.end_waiter.done():
            j.end_waiter.set_result(None)

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
