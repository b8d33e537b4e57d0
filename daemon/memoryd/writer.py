"""The single writer: one task owns the write connection; every mutation runs there.

A job is a synchronous function of the transaction, ``fn(tx) -> result`` (tx.py). The
writer drains whatever is queued and commits it as one transaction (group commit), always
the same way::

    event loop                                       writer's thread
    (another program wrote, and the spaced reconcile is not due yet: wait, foreign.Watch.due)
    BEGIN IMMEDIATE   (busy elsewhere: on the thread, waiting up to busy_timeout)
    two pragmas: what another program changed is reconciled first (foreign.Watch.guard, thread)
    for each deferred row, then each job:
        SAVEPOINT; fn(tx); RELEASE                   (a failure: ROLLBACK TO, that step alone)
        (the loop turns whenever the batch has held it for TURN_AFTER_S)
    the usage counts, the tail count
                                                     COMMIT (the WAL's write and fsync)
    answer every caller; a failed COMMIT fails every job of the batch

A job that writes many rows (a seed) is a generator function: it yields between its
parts, and the loop may turn there. A caller is answered only after COMMIT has returned,
i.e. after the fsync (``synchronous=FULL``): an acknowledged write survives power loss.

Bookkeeping nobody awaits (``defer``: recall counters and ledger rows) runs at the head of
the next batch; ``durable=False`` batches of it alone commit with ``synchronous=NORMAL``.
Store faults reach callers as STORE_UNAVAILABLE. After a commit that filled the text
index's tail, the writer indexes it in a transaction of its own on its thread
(``_index_tail``), once the batch's callers are answered.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import GeneratorType
from typing import Any, Generic, TypeVar

import anyio
from memoryd_protocol.audit_types import WitnessedHead
from memoryd_protocol.types import Entry

from . import foreign, ledger, queries, store, storefile
from .atomic import atomic, begin, commit, rollback
from .owned import Owned
from .store import store_fault
from .tx import Tx, Usage

log = logging.getLogger("memoryd.writer")

T = TypeVar("T")
#: What a job that splits itself returns: a generator that yields between its parts.
Steps = Generator[None, None, T]
JobFn = Callable[[Tx], "T | Steps[T]"]
MAX_GROUP = 256
FLUSH_DELAY_S = 0.05
#: How long a batch may hold the event loop before it lets the loop turn (between two
#: steps, or at a job's yield): long enough that a batch of small writes runs straight
#: through, short enough that a query or an approval never waits long behind a seed.
TURN_AFTER_S = 0.001
BUMPS_PER_STEP = 32
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


@dataclass(eq=False)
class _Overlay:
    """Recalls not committed yet: per entry, how many and the last one's ts."""

    counts: dict[str, list[int]] = field(default_factory=dict)
    #: the sequence number its commit saves (store.RECALL_SEQ_KEY), once that commit began
    seq: int | None = None
    #: its commit failed: its recalls are lost, in the store and here alike
    failed: bool = False

    def lose(self, step: _Recalls) -> None:
        """A step of its commit was rolled back: that step's recalls are lost."""
        for entry_id, (n, _ts) in step.bumps.items():
            pending = self.counts.get(entry_id)
            if pending is not None:
                pending[0] -= n
                if pending[0] <= 0:
                    del self.counts[entry_id]


class _Recalls:
    """One bookkeeping step for the recalls of queries in a row: per entry, how many and the
    last one's ts; and each recall's ledger row, in order."""

    def __init__(self) -> None:
        self.bumps: dict[str, list[int]] = {}
        self.rows: list[Callable[[Tx], None]] = []

    def __call__(self, tx: Tx) -> Iterator[None]:
        """Its statements, yielding between parts of a few hundred microseconds at most: the
        counters, BUMPS_PER_STEP entries a part, then each row."""
        bumps = [(i, n, ts) for i, (n, ts) in self.bumps.items()]
        for k in range(0, len(bumps), BUMPS_PER_STEP):
            store.bump_recalls(tx.conn, bumps[k:k + BUMPS_PER_STEP])
            yield
        for row in self.rows:
            row(tx)
            yield


class Writer:
    def __init__(self, conn: sqlite3.Connection | Owned, usage: Usage, path: Path,
                 anchor: ledger.Anchor | None = None, recall_seq: int = 0, entries: int = 0,
                 owed: bool = False) -> None:
        #: the write connection and its one thread (a bare connection gets a thread here)
        self._owned = conn if isinstance(conn, Owned) else Owned("memoryd-writer", conn)
        #: the ledger's head as this daemon wrote it (ledger.Anchor)
        self.anchor = anchor if anchor is not None else ledger.Anchor()
        #: whether another program wrote since (``owed``: the start's check could not run)
        self._watch = foreign.Watch.of(self._owned.conn, path, owed=owed)
        #: the store, named in STORE_UNAVAILABLE's details
        self._path = path
        self._usage: Usage = dict(usage)
        #: how many entries the committed store holds (as memoryd's own writes count them)
        self.entries = entries
        #: queued jobs, and what wakes ``run`` for them (plain asyncio: one append and one
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
        #: recalls queued for a commit not begun yet, and those of the commit in flight
        #: (``with_recalls``); the sequence number of the last recalls' commit begun
        self._queued = _Overlay()
        self._flying = _Overlay()
        self._recall_seq = recall_seq
        #: the text index's tail was full after the last commit of a write (store.tail_full)
        self._tail_full = False
        #: when the batch in progress last let the event loop turn (``_turn``)
        self._since = 0.0
        #: the store's busy timeout: the event loop never waits for the write lock (its
        #: connection's timeout is 0); a BEGIN that finds it held waits on the thread
        conn = self._owned.conn
        self._busy_ms: int = conn.execute("PRAGMA busy_timeout").fetchone()[0]
        conn.execute("PRAGMA busy_timeout = 0")

    @classmethod
    async def open(cls, path: Path, version: int, busy_timeout_ms: int,
                   stop: WitnessedHead | None = None, *, untouched: bool = False) -> Writer:
        """Open (and migrate) the store on the writer's own new thread, begin or reconcile
        the ledger's chain (foreign.opened, with the last ``stop``), read the usage."""
        owned = await Owned.open("memoryd-writer", lambda: storefile.open_store(path, version, busy_timeout_ms))
        try:
            try:
                o = await owned.run(lambda c: foreign.opened(c, path, stop, untouched=untouched))
            except sqlite3.Error as exc:
                raise store.store_fault(exc, path) or exc from None
        except BaseException:
            await owned.aclose()
            raise
        writer = cls(owned, o.usage, path, ledger.Anchor(o.head), o.recall_seq, o.entries)
        writer._watch = o.watch  # as the check left the store, not as it is by now
        return writer

    @property
    def usage(self) -> Usage:
        """Committed usage per track × scope, replaced (never mutated) by each commit: always a committed state."""
        return self._usage

    @property
    def thread(self) -> threading.Thread:
        """The thread every COMMIT of this writer runs on."""
        return self._owned.thread

    async def aclose(self) -> None:
        """Once ``run`` has returned: checkpoint (best effort), close the connection, end
        the thread. (A writer that never ran closes its queue here.)"""
        self.close()
        await self._owned.aclose(lambda c: c.execute("PRAGMA wal_checkpoint(PASSIVE)"))

    async def submit(self, fn: JobFn[T], *, durable: bool = True,
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

    async def with_recalls(self, read: Callable[[Collection[str]], Awaitable[tuple[list[Entry], int, int]]]
                           ) -> tuple[list[Entry], int]:
        """``read(boosted)`` (entries off the store, a count, and the store's
        store.recall_seq, all from one read transaction) with every recall the read did not
        see counted in, ranked again if any is. ``boosted`` are the ids with such recalls,
        which ``read`` must include if they match (``queries.query_page``).

        A pending set of recalls is in what the read saw exactly when its commit saved a
        sequence number the read saw: never waited for, never read twice."""
        overlays = (self._flying, self._queued)
        hits, total, seen = await read(overlays[0].counts.keys() | overlays[1].counts.keys())
        moved = False
        for overlay in overlays:
            if overlay.failed or (overlay.seq is not None and overlay.seq <= seen) or not overlay.counts:
                continue
            for e in hits:
                pending = overlay.counts.get(e.id)
                if pending is not None:
                    moved = True
                    e.recall_count += pending[0]
                    e.last_recalled = max(e.last_recalled or 0, pending[1])
        if moved:
            hits.sort(key=queries.rank)
        return hits, total

    def record_recalls(self, entries: list[Entry], ts: int, row: Callable[[Tx], None] | None = None) -> None:
        """``entries`` (a query's page) were recalled at ``ts``: each of these copies shows
        it now, later queries count it until it commits (``with_recalls``), and its commit
        (the counters, and ``row``: the recall's audit row) is queued as bookkeeping.

        The recalls of queries in a row share one bookkeeping step (one UPDATE per entry
        for all of them, however many times it was recalled), each recall's row kept, in
        order. A step queued after them (a ledger row of an approval) starts the next."""
        shared = self._deferred[-1].fn if self._deferred else None
        if not isinstance(shared, _Recalls):
            shared = _Recalls()
            self.defer(shared)
        bumps, queued = shared.bumps, self._queued.counts
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
        """Index the text index's tail (store.index_tail) in a transaction of its own, on
        the writer's thread (one statement: it cannot let the loop turn), once the batch
        that grew it is answered. Not durable (``synchronous=NORMAL``): a crash may lose
        it, and the mark with it (one transaction), so nothing is lost. On a failure the
        tail stays as it is, a query still finds it, and a later commit tries again."""
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
        self._sync(conn, False)
        started = time.perf_counter()
        with atomic(conn, busy_timeout_ms=self._busy_ms):
            n = store.index_tail(conn)
        log.debug("indexed the text index's tail of %d entries in %.1f ms", n, (time.perf_counter() - started) * 1e3)

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
            # every queued recall is in this commit (its steps are never kept)
            self._flying, self._queued = self._queued, _Overlay()
            if self._flying.counts:
                self._recall_seq += 1
                self._flying.seq = self._recall_seq
        flying = self._flying
        conn = self._owned.conn
        try:
            with anyio.CancelScope(shield=True):
                await self._watch.due(conn)
                await self._begin(conn, durable)
                tx, head_n = self.anchor.begin(conn, self._usage), self.anchor.head[0] if self.anchor.head else 0
                moved, refused = await self._watch.guard(tx, head_n, self._owned.run)
                if refused is not None:  # nothing of the batch runs; its kept rows wait for the next
                    lost, flying.failed = [d for d in deferred if d.keep], True
                self._since = time.perf_counter()
                for d in deferred if refused is None else ():
                    error = (await self._step(tx, d.fn))[1]
                    if error is not None and isinstance(d.fn, _Recalls):
                        flying.lose(d.fn)
                    if error is not None:
                        fault = store_fault(error, self._path)
                        if fault is None:
                            log.error("deferred bookkeeping failed", exc_info=error)
                        else:
                            log.error("deferred bookkeeping failed: %s (%s): %s", fault.code,
                                      fault.details["reason"], error)
                            if d.keep:
                                lost.append(d)
                for job in batch:
                    job.result, error = await self._step(tx, job.fn) if foreign.runs(job.fn, refused) else (None, refused)
                    if error is not None:
                        fault = store_fault(error, self._path)
                        if fault is not None:
                            log.error("write job failed: %s (%s): %s", fault.code, fault.details["reason"], error)
                        # Not logged otherwise: submit raises it to the caller, who reports it.
                        job.error = fault if fault is not None else error
                if flying.seq is not None:
                    store.save_recall_seq(conn, flying.seq)
                added = sum(n for n, _ in tx.counts.values())
                store.flush(tx)
                full = durable and self._tail_is_full(conn)
                await self._owned.run(commit)
            self.anchor.committed(tx)
            self._watch.reconciled(moved)
            self._usage = tx.usage
            self.entries = (self.entries if tx.entries is None else tx.entries) + added
            self._tail_full = full
        except BaseException as exc:
            # Nothing of this batch committed: every job fails, whatever it had computed
            # (a result, or an error judged against rows that are gone now). Also on what
            # ``except Exception`` lets through (a job's SystemExit, say), which then ends
            # ``run``: answered with its result, a caller would think its write committed.
            rollback(conn, "of a failed batch")
            flying.failed = True
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
                # committed (the store counts them now) or failed (lost): no longer counted here
                self._flying = _Overlay()
                self._bookkeeping_idle.set()
            for j in batch:
                self._end(j)

    async def _begin(self, conn: sqlite3.Connection, durable: bool) -> None:
        """BEGIN IMMEDIATE on the event loop, which never waits; when another process holds the lock, on the thread."""
        self._sync(conn, durable)
        try:
            begin(conn)
        except sqlite3.Error as exc:
            if store.fault_reason(exc) != "busy":
                raise
            await self._owned.run(lambda c: begin(c, busy_timeout_ms=self._busy_ms))

    async def _step(self, tx: Tx, fn: Callable[[Tx], Any]) -> tuple[Any, Exception | None]:
        """One deferred row or job in its own savepoint: its result, or the error that
        rolled it (and what it did to ``tx``) back. An error that took the transaction
        with it (``lost``) is raised: the batch fails."""
        saved = tx.save()
        point = atomic(tx.conn, "step")
        try:
            with point:
                out = fn(tx)
                if isinstance(out, GeneratorType):
                    out = await self._drive(out)
        except Exception as exc:
            if point.lost:
                raise
            tx.restore(saved)
            return None, exc
        await self._turn()
        return out, None

    async def _drive(self, steps: Steps[T]) -> T:
        """Run a job that splits itself, letting the loop turn at its yields."""
        while True:
            try:
                next(steps)
            except StopIteration as done:
                result: T = done.value
                return result
            await self._turn()

    async def _turn(self) -> None:
        """Let the event loop turn once the batch has held it for TURN_AFTER_S."""
        if time.perf_counter() - self._since >= TURN_AFTER_S:
            await asyncio.sleep(0)
            self._since = time.perf_counter()

    def _tail_is_full(self, conn: sqlite3.Connection) -> bool:
        """Whether the commit leaves the index's tail full, counted before COMMIT (after it, a read would begin)."""
        try:
            return store.tail_full(conn)
        except sqlite3.Error:  # the batch commits all the same; the next commit looks again
            log.debug("counting the text index's tail failed", exc_info=True)
            return False

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
