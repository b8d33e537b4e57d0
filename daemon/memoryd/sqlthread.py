"""A sqlite3 connection and the one plain thread that uses it.

Every call handed to a :class:`SqliteThread` runs on its thread, one at a time, in the
order handed over: a whole read (readers.py) is one hop, and so is a whole batch of the
writer's, BEGIN to COMMIT (writer.py). The result goes back to the event loop with ``loop.call_soon_threadsafe``, which does
not wait for the loop: anyio's ``from_thread.run_sync`` would hold the owner thread until
the loop had run the callback, so the next call could not begin meanwhile.

Why not ``anyio.to_thread.run_sync`` with a limiter of one: that bounds how many calls run
at once, not which thread runs them, and a connection has one owner thread here.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import sqlite3
import threading
from collections.abc import Callable
from typing import TypeVar

import anyio

log = logging.getLogger("memoryd.store")

T = TypeVar("T")


def settle(done: asyncio.Future[T], result: T | None, error: BaseException | None) -> None:
    """A call's outcome into its future, unless its caller was cancelled: nobody waits then."""
    if done.done():
        return
    if error is not None:
        done.set_exception(error)
    else:
        done.set_result(result)  # type: ignore[arg-type]


class SqliteThread:
    """``await thread.call(fn)`` runs ``fn(conn)`` on the owner thread and returns its result
    (or raises its error). ``aclose`` closes the connection on that thread and ends it.

    The thread is a daemon thread: a close that never happens (a bug) cannot keep the
    process alive, and SQLite's journal makes a transaction cut off at exit harmless."""

    def __init__(self, name: str, conn: sqlite3.Connection | None = None) -> None:
        self.name = name
        self._conn = conn
        self._calls: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    @classmethod
    async def open(cls, name: str, connect: Callable[[], sqlite3.Connection]) -> SqliteThread:
        """A new thread, and the connection ``connect`` opens on it."""
        thread = cls(name)
        try:
            # shielded: a connection opened after its opener was cancelled would be nobody's
            with anyio.CancelScope(shield=True):
                thread._conn = await thread._call(connect)
        except BaseException:
            await thread.aclose()
            raise
        return thread

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    @property
    def conn(self) -> sqlite3.Connection:
        """The connection itself, for a caller that uses it while no call of this one runs
        (the writer's own set-up, before its first batch)."""
        assert self._conn is not None
        return self._conn

    def _serve(self) -> None:
        while (call := self._calls.get()) is not None:
            call()

    async def _call(self, fn: Callable[[], T]) -> T:
        done: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._post(fn, lambda result, error: settle(done, result, error))
        return await done

    def _post(self, fn: Callable[[], T], then: Callable[[T | None, BaseException | None], object]) -> None:
        if self._closed:
            raise RuntimeError(f"{self.name}: the connection is closed")
        loop = asyncio.get_running_loop()

        def call() -> None:
            result: T | None = None
            error: BaseException | None = None
            try:
                result = fn()
            except BaseException as exc:
                error = exc
            try:
                loop.call_soon_threadsafe(then, result, error)
            except RuntimeError:  # the loop is closed: nobody waits for this call any more
                pass

        self._calls.put(call)

    async def call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn(conn)``'s result; a cancelled caller does not stop the call, whose result is then dropped."""
        conn = self._conn
        assert conn is not None
        return await self._call(lambda: fn(conn))

    def post(self, fn: Callable[[sqlite3.Connection], T],
             then: Callable[[T | None, BaseException | None], object]) -> None:
        """Hand ``fn(conn)`` over; once it has returned, ``then(result, None)`` (or ``then(None,
        error)``) runs on the event loop: no future and no task to wake, for a caller that
        goes on in a callback (a read's end, readers.py)."""
        conn = self._conn
        assert conn is not None
        self._post(lambda: fn(conn), then)

    async def aclose(self, last: Callable[[sqlite3.Connection], object] | None = None) -> None:
        """Run ``last`` (its error is logged at debug level and dropped), close the
        connection, end the thread. Calls handed over before run first; a second close
        does nothing."""
        if self._closed:
            return
        conn = self._conn

        def close() -> None:
            if conn is None:
                return
            if last is not None:
                try:
                    last(conn)
                except Exception as exc:
                    log.debug("%s: before closing: %s", self.name, exc)
            conn.close()

        with anyio.CancelScope(shield=True):
            try:
                await self._call(close)
            finally:
                self._closed = True
                self._calls.put(None)
                # The thread has handed its last result back: it only has to return now.
                self._thread.join()
