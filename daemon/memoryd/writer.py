"""The single writer: one task owns the write connection; every mutation runs there.

Jobs are plain synchronous functions ``fn(conn, usage) -> result`` on the write
connection. The writer drains whatever is queued and commits it as one transaction (group
commit). A batch's statements run on the event loop's thread and its COMMIT on the
writer's own thread, or the whole batch on that thread when the event loop cannot run it
(see "a batch's transaction" below). One job's failure rolls back only that job: the batch
first runs without savepoints (two statements less per job); when a job fails, the whole
transaction is rolled back and the batch runs again with a savepoint per job. Jobs
are functions of the store (they re-read what they depend on), so running one again
computes it anew. A job's caller is answered only after COMMIT has returned, i.e. after the WAL
fsync (``synchronous=FULL``): an acknowledged write survives power loss.

Jobs marked ``durable=False`` (recall bookkeeping of queries) may commit with
``synchronous=NORMAL``: still atomic, made durable by the next full commit or checkpoint.

Store faults (busy past the busy timeout, disk full, read-only, I/O errors) reach the
caller as STORE_UNAVAILABLE. A fault that the job's savepoint contains fails that job
alone; one that takes the transaction with it (a failed BEGIN or COMMIT, or SQLite rolling
the whole transaction back, as it may on FULL, IOERR and BUSY) fails every job of the batch,
whatever each had computed: none of them committed. Either way the next batch starts on a
clean connection, so writes recover once the fault clears.

After the commit of a write that filled the text index's tail (store.TAIL_MERGE_AT adds
in no index yet), the writer indexes it in a transaction of its own before the next batch:
the batch's callers are answered first (``_index_tail``).

The writer owns its thread (owned.py: every COMMIT runs on that one thread), the
committed usage, and the bookkeeping nobody awaits: ``defer`` (the ledger's rows, kept
across a store fault), and the recall overlay of queries (``with_recalls`` /
``record_recalls``), settled by ``settled`` for readers that must see it.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import anyio
from memoryd_protocol.types import Entry

from . import ledger, queries, store
from .atomic import atomic, commit, rollback
from .owned import Owned
from .store import store_fault

log = logging.getLogger("memoryd.writer")

T = TypeVar("T")
Usage = dict[tuple[str, str], int]
JobFn = Callable[[sqlite3.Connection, Usage], T]
MAX_GROUP = 256
FLUSH_DELAY_S = 0.05
#: A batch with an acknowledged write and at most this many steps (jobs, and deferred rows
#: and recall counters), none of them heavy, runs its statements on the event loop's thread
#: and only its COMMIT on the writer's (``_stage``); a larger one runs wholly on the
#: writer's thread, so that it holds the event loop for a few milliseconds at most. A flush
#: of bookkeeping alone runs on the event loop whatever its size, in slices (SLICE_STEPS).
LOOP_STEPS = 256
#: A flush of bookkeeping alone runs on the event loop too, but lets it turn after every
#: SLICE_STEPS of its steps: the queries that arrive meanwhile are served first, not after
#: the whole flush (``_stage``). On the writer's thread instead, every statement of the
#: flush and of the queries hands the GIL back and forth; wholly on the event loop, the
#: queries wait for all of it.
SLICE_STEPS = 16
#: A write that adds or removes more entries than this (a seed, a large consolidate) is a
#: heavy job (``submit``): its own rows could hold the event loop past a few milliseconds.
HEAVY_ROWS = 16
BUMPS_PER_STEP = 32


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
    #: too large to run on the event loop (``LOOP_STEPS``): a seed's batch of entries
    heavy: bool = False


class _Recalls:
    """One bookkeeping step for the recalls of queries in a row: per entry, how many and the
    last one's ts; and each recall's ledger row, in order."""

    def __init__(self) -> None:
        self.bumps: dict[str, list[int]] = {}
        self.rows: list[Callable[[sqlite3.Connection], None]] = []

    def __len__(self) -> int:
        """Its statements: one per entry and one per row."""
        return len(self.bumps) + len(self.rows)

    def __call__(self, conn: sqlite3.Connection) -> None:
        for part in self.parts():
            part(conn)

    def parts(self) -> Iterator[Callable[[sqlite3.Connection], None]]:
        """Its statements in steps of a few hundred microseconds at most: the counters,
        BUMPS_PER_STEP entries a step, then each row."""
        bumps = [(i, n, ts) for i, (n, ts) in self.bumps.items()]
        for k in range(0, len(bumps), BUMPS_PER_STEP):
            yield functools.partial(store.bump_recalls, recalls=bumps[k:k + BUMPS_PER_STEP])
        yield from self.rows


def _parts(fn: Callable[[sqlite3.Connection], None]) -> Iterable[Callable[[sqlite3.Connection], None]]:
    return fn.parts() if isinstance(fn, _Recalls) else (fn,)


class _StepFailed(Exception):
    """A job or a deferred step of a batch run without savepoints failed: run it again
    with them."""


class Writer:
    def __init__(self, conn: sqlite3.Connection | Owned, usage: Usage, path: Path,
                 anchor: ledger.Anchor | None = None) -> None:
        #: the write connection and its one thread (a bare connection gets a thread here)
        self._owned = conn if isinstance(conn, Owned) else Owned("memoryd-writer", conn)
        #: the ledger's head as this daemon wrote it (ledger.Anchor)
        self.anchor = anchor if anchor is not None else ledger.Anchor()
        #: the store, named in STORE_UNAVAILABLE's details
        self._path = path
        self._usage: Usage = dict(usage)
        #: queued jobs, and what wakes ``run`` for them (plain asyncio: one append and one
        #: future per job, where anyio's memory stream and Event cost several calls each)
        self._queue: deque[_Job[Any]] = deque()
        self._wake = asyncio.Event()
        self._closed = False
        self._full_sync = True
        self.depth = 0
        #: set while no job is queued or committing (depth 0): what a drain waits on. One
        #: asyncio Event, cleared and set again, not an anyio Event made anew whenever a job
        #: arrives at an idle writer
        self._idle = asyncio.Event()
        self._idle.set()
        self._deferred: list[_Deferred] = []
        self._flush_wanted = anyio.Event()
        #: set while no commit carrying deferred bookkeeping is between COMMIT and on_done
        self._bookkeeping_idle = anyio.Event()
        self._bookkeeping_idle.set()
        #: id → [recalls, the last one's ts] queued for a commit not begun yet, and those
        #: of the commit in flight (``with_recalls``)
        self._queued: dict[str, list[int]] = {}
        self._flying: dict[str, list[int]] = {}
        #: the text index's tail was full after the last commit of a write (store.tail_full)
        self._tail_full = False
        #: the write connection's busy timeout, which ``_stage`` sets to 0 around its BEGIN
        self._busy_ms: int = self._owned.conn.execute("PRAGMA busy_timeout").fetchone()[0]

    @classmethod
    async def open(cls, path: Path, version: int, busy_timeout_ms: int) -> Writer:
        """Open (and migrate) the store on the writer's own new thread, begin the ledger's
        chain if it has none, and read the committed usage."""
        owned = await Owned.open("memoryd-writer", lambda: store.open_store(path, version, busy_timeout_ms))
        try:
            try:
                await owned.run(ledger.open_chain)
            except sqlite3.Error as exc:
                raise store.store_fault(exc, path) or exc from None
            usage = await owned.run(store.stored_usage)
            head = await owned.run(ledger.head)
        except BaseException:
            await owned.aclose()
            raise
        return cls(owned, usage, path, ledger.Anchor(head))

    @property
    def usage(self) -> Usage:
        """Committed usage per track × scope; replaced (never mutated) after each commit,
        so readers on the event loop always see a committed state."""
        return self._usage

    @property
    def thread(self) -> threading.Thread:
        """The thread every transaction of this writer runs on."""
        return self._owned.thread

    async def aclose(self) -> None:
        """Once ``run`` has returned: checkpoint (best effort), close the connection, end
        the thread. (A writer that never ran closes its queue here.)"""
        self.close()
        await self._owned.aclose(lambda c: c.execute("PRAGMA wal_checkpoint(PASSIVE)"))

    async def submit(self, fn: JobFn[T], *, durable: bool = True,
                     on_error: Callable[[BaseException], None] | None = None, heavy: bool = False) -> T:
        """Run ``fn`` in the next group commit; return its result once COMMIT has returned.
        Its error (a store fault as STORE_UNAVAILABLE) is raised here, to the one caller
        who reports it: the writer logs only what nobody awaits. A caller cancelled while
        its job runs gets its cancellation once the job has ended; what must follow a
        failure whatever happens to the caller (a ledger row) goes in ``on_error``. A
        ``heavy`` job (many rows) makes its batch run on the writer's thread alone."""
        if self._closed:
            raise WriterClosed("the store is closing")
        loop = asyncio.get_running_loop()
        job: _Job[T] = _Job(fn, durable, loop.create_future(), on_error=on_error, heavy=heavy)
        self._queue.append(job)
        self._wake.set()
        self.depth += 1
        self._idle.clear()
        # Once queued, the job runs whatever happens to the caller: a cancelled caller
        # waits for its end all the same, shielded, so it cannot mistake a committed write
        # for a failed one. (Its cancellation cancels ``done``, which the writer then
        # leaves alone, and it waits on ``end_waiter`` instead: not asyncio.shield around
        # every job, which costs each write a future, a callback and a turn of the event
        # loop more; the shielded cancel scope is entered only once cancelled.)
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

    # --- recall bookkeeping -----------------------------------------------------------

    async def with_recalls(self, read: Callable[[Collection[str]], tuple[list[Entry], int]]
                           ) -> tuple[list[Entry], int]:
        """``read(boosted)`` (entries off the store, and a count) with every recall not
        committed yet counted in, ranked again if any is. ``boosted`` are the ids with such
        recalls, which ``read`` must include if they match (``queries.query_page``).

        Recalls queued for a commit not begun yet are not in the store: each counts. Those
        of the commit in flight may or may not be in what ``read`` saw: a row that is not
        shows another ``last_recalled`` than the commit sets, so its recalls count; a row
        that shows that one may be either (or a recall of the same millisecond before it),
        and only then does the query wait for the commit and read again. A query never
        waits for a commit in the common case, where the store has not taken it yet."""
        while True:
            queued, flying = self._queued, self._flying
            hits, total = read(queued.keys() | flying.keys() if flying else queued.keys())
            if flying and any((f := flying.get(e.id)) is not None and e.last_recalled == f[1] for e in hits):
                await self._bookkeeping_committed()
                continue
            moved = False
            for overlay in (flying, queued):
                if not overlay:
                    continue
                pending_of = overlay.get
                for e in hits:
                    pending = pending_of(e.id)
                    if pending is not None:
                        moved = True
                        e.recall_count += pending[0]
                        if e.last_recalled is None or e.last_recalled < pending[1]:
                            e.last_recalled = pending[1]
            if moved:
                hits.sort(key=queries.rank)
            return hits, total

    def record_recalls(self, entries: list[Entry], ts: int,
                       row: Callable[[sqlite3.Connection], None] | None = None) -> None:
        """``entries`` (a query's page) were recalled at ``ts``: each of these copies shows
        it now, later queries count it until it commits (``with_recalls``), and its commit
        (the counters, and ``row``: the recall's audit row) is queued as bookkeeping.

        The recalls of queries in a row share one bookkeeping step (one UPDATE per entry
        for all of them, however many times it was recalled), each recall's row kept, in
        order: a burst of queries costs its next commit a few statements, not a few per
        query. A step queued after them (a ledger row of an approval) starts the next."""
        shared = self._deferred[-1].fn if self._deferred else None
        if not isinstance(shared, _Recalls):
            shared = _Recalls()
            self.defer(shared)
        bumps, queued = shared.bumps, self._queued
        for e in entries:
            e.recall_count += 1
            e.last_recalled = ts
            for overlay in (bumps, queued):
                pending = overlay.get(e.id)
                if pending is None:
                    overlay[e.id] = [1, ts]
                else:
                    pending[0] += 1
                    pending[1] = ts
        if row is not None:
            shared.rows.append(row)

    async def settled(self) -> None:
        """Return once all deferred bookkeeping queued so far has committed, or failed (for
        readers that must see it, such as the audit ledger). A store that cannot take
        writes does not fail the read: the bookkeeping is lost (and logged), the read served."""
        if self._deferred:
            await self._flush()
        await self._bookkeeping_committed()

    async def idle(self) -> None:
        """Return once no job is queued or committing (``depth`` 0)."""
        if self.depth:
            await self._idle.wait()

    async def _flush(self) -> None:
        try:
            await self.submit(_noop, durable=False)
        except Exception:  # _commit logged it; recall bookkeeping is not an acknowledged write
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
        """Accept no more jobs; ``run`` returns once the queued ones are committed."""
        self._closed = True
        self._wake.set()

    async def run(self) -> None:
        try:
            await self._serve()
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

    async def _serve(self) -> None:
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
            if self._tail_full:
                await self._index_tail()

    async def _index_tail(self) -> None:
        """Index the text index's tail (store.index_tail) in a transaction of its own, once
        the batch that grew it is answered: no acknowledged write waits for it, though
        writes queued meanwhile commit after it. Not durable (``synchronous=NORMAL``): a
        crash may lose it, and the mark with it (one transaction), so nothing is lost; the
        next full commit makes it durable. On a failure the tail stays as it is, a query
        still finds it, and the next commit of a write (which counts the tail again) tries
        again."""
        self._tail_full = False
        try:
            with anyio.CancelScope(shield=True):
                await self._owned.run(self._run_index_tail)
        except Exception as exc:
            fault = store_fault(exc, self._path)
            if fault is None:
                log.exception("indexing the text index's tail failed")
            else:
                log.error("indexing the text index's tail failed: %s (%s): %s", fault.code,
                          fault.details["reason"], exc)

    def _run_index_tail(self, conn: sqlite3.Connection) -> None:
        if conn.in_transaction:
            conn.execute("ROLLBACK")  # left open by a ROLLBACK that failed in an earlier batch
        if self._full_sync:
            conn.execute("PRAGMA synchronous = NORMAL")
            self._full_sync = False
        started = time.perf_counter()
        with atomic(conn):
            n = store.index_tail(conn)
        log.debug("indexed the text index's tail of %d entries in %.1f ms", n, (time.perf_counter() - started) * 1e3)

    async def _commit(self, batch: list[_Job[Any]]) -> None:
        durable = any(j.durable for j in batch)
        deferred, self._deferred = self._deferred, []
        lost: list[_Deferred] = []
        if deferred:
            self._bookkeeping_idle = anyio.Event()
            # every queued recall is in this commit (its steps are never kept)
            self._flying, self._queued = self._queued, {}
        try:
            with anyio.CancelScope(shield=True):
                staged = await self._stage(batch, durable, deferred) if self._fits_loop(batch, durable, deferred) else False
                if isinstance(staged, tuple):
                    await self._commit_staged(*staged)
                else:
                    self._usage = await self._owned.run(
                        lambda c: self._run_batch(c, batch, durable, deferred, lost, tried=staged))
        except BaseException as exc:
            # Nothing of this batch committed: every job fails, whatever it had computed
            # (a result, or an error judged against rows that are gone now). Also on what
            # ``except Exception`` lets through (a job's SystemExit, say), which then ends
            # ``run``: answered with its result, a caller would think its write committed.
            fault = store_fault(exc, self._path)
            if fault is None:
                log.exception("group commit of %d job(s) failed", len(batch))
            else:
                log.error("group commit of %d job(s) failed: %s (%s): %s", len(batch), fault.code,
                          fault.details["reason"], exc)
            for j in batch:
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
            # committed (the store counts them now) or failed (lost): no longer counted here
            self._flying = {}
            self._bookkeeping_idle.set()
            for j in batch:
                self._end(j)

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

    # --- a batch's transaction ------------------------------------------------------------
    #
    # Its statements run on the event loop's thread when they can (``_stage``), and only its
    # COMMIT (the WAL's write and fsync) on the writer's (``_commit_staged``). Each statement
    # the writer's thread runs releases the GIL and must take it back from a busy event loop:
    # under 16 clients that wait, not the statements, was most of a batch's time. The loop
    # runs them in a few microseconds each, at no such cost, and is free while the thread
    # commits. The thread runs a whole batch (``_run_batch``) when the loop cannot: the write
    # lock is held by another process (the thread waits for it, the loop never), a step
    # failed (it runs again, each step in its own savepoint), or the batch is large.

    def _fits_loop(self, batch: list[_Job[Any]], durable: bool, deferred: list[_Deferred]) -> bool:
        if not durable:
            return True  # bookkeeping alone: in slices (SLICE_STEPS)
        steps = len(batch)
        for d in deferred:
            steps += len(d.fn) if isinstance(d.fn, _Recalls) else 1
        return steps <= LOOP_STEPS and not any(j.heavy for j in batch)

    def _prepare(self, conn: sqlite3.Connection, durable: bool) -> None:
        if conn.in_transaction:
            conn.execute("ROLLBACK")  # left open by a ROLLBACK that failed in an earlier batch
        if durable != self._full_sync:
            conn.execute(f"PRAGMA synchronous = {'FULL' if durable else 'NORMAL'}")
            self._full_sync = durable

    async def _stage(self, batch: list[_Job[Any]], durable: bool, deferred: list[_Deferred]
                     ) -> tuple[Usage, bool] | bool:
        """On the event loop: BEGIN IMMEDIATE, the deferred bookkeeping (in slices when it
        is all the batch has, SLICE_STEPS), then every job, without savepoints, leaving the
        transaction open for ``_commit_staged``: the usage it commits, and whether it fills
        the text index's tail. Otherwise the thread runs the batch, and nothing of it is
        left: False when the write lock is held elsewhere, True when a step failed here
        (``_run_batch``'s ``tried``)."""
        conn = self._owned.conn
        self._prepare(conn, durable)
        # Never wait for the write lock here: that would hold the event loop.
        conn.execute("PRAGMA busy_timeout = 0")
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            if store.fault_reason(exc) == "busy":
                return False  # the thread waits for it, up to the busy timeout
            raise
        finally:
            conn.execute(f"PRAGMA busy_timeout = {self._busy_ms}")
        usage = dict(self._usage)
        try:
            with store.Batch(conn) as kept:
                self.anchor.check(conn)
                if durable:
                    for d in deferred:
                        d.fn(conn)
                else:
                    # Nobody waits for it: the event loop turns between its slices. (The
                    # transaction's scopes, ledger._scope and store._batch, are one of each
                    # per thread: another writer on this event loop, a second store's, may
                    # set and end its own meanwhile. The ledger's is set again after each
                    # turn, or the rows after it would not move this Anchor; a batch scope
                    # lost only writes a count as it comes, and bookkeeping counts none.
                    # Nothing else writes on this connection until the batch ends.)
                    for n, step in enumerate(part for d in deferred for part in _parts(d.fn)):
                        if n and n % SLICE_STEPS == 0:
                            await asyncio.sleep(0)
                            self.anchor.resume()
                        step(conn)
                for job in batch:
                    job.result = job.fn(conn, usage)
                kept.flush()
                full = self._tail_is_full(conn, durable)
        except Exception:
            # Rolled back: the thread runs every step again, each in its own savepoint, and
            # finds this error again (a store fault fails the batch there, as it would have).
            self.anchor.leave()
            rollback(conn, "of a batch on the event loop")
            for job in batch:
                job.result = None
            return True
        return usage, full

    async def _commit_staged(self, usage: Usage, full: bool) -> None:
        """COMMIT what ``_stage`` left open, on the writer's thread (rolled back if it fails)."""
        try:
            await self._owned.run(commit)
        except BaseException:
            self.anchor.leave()
            raise
        self.anchor.advance(self._owned.conn)  # committed: the head this daemon wrote moves on
        self._tail_full = full
        self._usage = usage

    def _run_batch(self, conn: sqlite3.Connection, batch: list[_Job[Any]], durable: bool,
                   deferred: list[_Deferred], lost: list[_Deferred], *, tried: bool = False) -> Usage:
        """On the writer's thread: the deferred bookkeeping, then every job, all in one
        transaction; first without savepoints (unless ``tried`` already on the event loop),
        and if a step fails, again with one per step (``_run_steps``)."""
        self._prepare(conn, durable)
        try:
            if tried:
                return self._run_steps(conn, batch, durable, deferred, lost)
            return self._run_batch_in_scope(conn, batch, durable, deferred, lost)
        finally:
            self.anchor.leave()  # committed or not, the transaction's ledger scope ends with it

    def _tail_is_full(self, conn: sqlite3.Connection, durable: bool) -> bool:
        """At the end of a batch's transaction, before its COMMIT: whether the text index's
        tail is full (what the commit leaves; ``run`` indexes it once the batch is
        answered). Counted inside the transaction, not after it: a statement after COMMIT
        opens a read transaction of its own, at a cost to every batch
        (bench/results/PER-WRITE.md)."""
        if not durable:  # recall bookkeeping adds no entry
            return False
        try:
            return store.tail_full(conn)
        except sqlite3.Error:  # the batch commits all the same; the next commit looks again
            log.debug("counting the text index's tail failed", exc_info=True)
            return False

    def _run_batch_in_scope(self, conn: sqlite3.Connection, batch: list[_Job[Any]], durable: bool,
                            deferred: list[_Deferred], lost: list[_Deferred]) -> Usage:
        usage = dict(self._usage)
        try:
            with atomic(conn), store.Batch(conn) as kept:
                self.anchor.check(conn)
                for d in deferred:
                    try:
                        d.fn(conn)
                    except Exception:
                        raise _StepFailed() from None
                for job in batch:
                    try:
                        job.result = job.fn(conn, usage)
                    except Exception:
                        raise _StepFailed() from None
                kept.flush()
                full = self._tail_is_full(conn, durable)
        except _StepFailed:
            pass  # rolled back: every step again, each in its own savepoint
        else:
            self.anchor.advance(conn)  # committed: the head this daemon wrote moves on
            self._tail_full = full
            return usage
        self.anchor.leave()
        if conn.in_transaction:
            conn.execute("ROLLBACK")  # left open by a ROLLBACK that failed just now
        for job in batch:
            job.result = None
        return self._run_steps(conn, batch, durable, deferred, lost)

    def _run_steps(self, conn: sqlite3.Connection, batch: list[_Job[Any]], durable: bool,
                   deferred: list[_Deferred], lost: list[_Deferred]) -> Usage:
        """The deferred bookkeeping, then every job, each in its own savepoint, all in one
        transaction. A savepoint that SQLite took the transaction with (``lost``) fails the
        batch: none of it is committed."""
        usage = dict(self._usage)
        with atomic(conn), store.Batch(conn) as kept:
            self.anchor.check(conn)
            for d in deferred:
                step = atomic(conn, "bookkeeping")
                mark, counts = self.anchor.mark(), kept.save()
                try:
                    with step:
                        d.fn(conn)
                except Exception as exc:
                    if step.lost:
                        raise
                    self.anchor.undo(mark)  # its ledger rows were rolled back with it
                    kept.restore(counts)  # and its counts
                    fault = store_fault(exc, self._path)
                    if fault is not None and d.keep:
                        lost.append(d)
                    if fault is None:
                        log.exception("deferred bookkeeping failed")
                    else:
                        log.error("deferred bookkeeping failed: %s (%s): %s", fault.code, fault.details["reason"], exc)
            for job in batch:
                before = dict(usage)
                step = atomic(conn, "job")
                mark, counts = self.anchor.mark(), kept.save()
                try:
                    with step:
                        job.result = job.fn(conn, usage)
                except Exception as exc:
                    usage = before
                    if step.lost:
                        raise
                    self.anchor.undo(mark)  # its ledger rows were rolled back with it
                    kept.restore(counts)  # and its counts
                    fault = store_fault(exc, self._path)
                    if fault is not None:
                        log.error("write job failed: %s (%s): %s", fault.code, fault.details["reason"], exc)
                    # Not logged otherwise: submit raises it to the caller, who reports it.
                    job.error = fault if fault is not None else exc
            kept.flush()
            full = self._tail_is_full(conn, durable)
        self.anchor.advance(conn)  # committed: the head this daemon wrote moves on
        self._tail_full = full
        return usage
