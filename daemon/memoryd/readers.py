"""Every read of the store: ``await readers.read(fn)`` runs ``fn(conn)`` inside one read
transaction on a read-only connection and the thread that owns it (sqlthread.py), one of a few,
so that a long read (a whole-ledger verify, a 100,000-entry scan) holds one of them while
queries and approvals go on through the others.

Why not aiosqlite: its public API is statement-level, a thread hop for every statement,
where one hop per read runs the whole function.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from . import storefile
from .atomic import atomic
from .sqlthread import SqliteThread, settle

T = TypeVar("T")

#: How many read connections with a thread of their own a daemon keeps.
READERS = 3


def _connect(path: Path, busy_timeout_ms: int) -> sqlite3.Connection:
    conn = storefile.connect(path, busy_timeout_ms)
    conn.execute("PRAGMA query_only = ON")
    return conn


def _in_transaction(conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
    # one read transaction: every statement of the read sees one moment of the store, and
    # the WAL's read lock is taken once, not once per statement
    with atomic(conn, immediate=False):
        return fn(conn)


class Readers:
    """The reader threads, each read taking a free one or waiting for one, oldest first.

    Plain asyncio futures, not anyio's Semaphore and a shielded CancelScope: those cost
    every read a turn of the event loop (the Semaphore's checkpoint) and a dozen calls."""

    def __init__(self, threads: list[SqliteThread]) -> None:
        self._all = threads
        self._free = list(threads)
        #: reads waiting for a thread (none while one is free), oldest first
        self._waiting: deque[asyncio.Future[SqliteThread]] = deque()

    @classmethod
    async def open(cls, path: Path, busy_timeout_ms: int, n: int = READERS) -> Readers:
        threads: list[SqliteThread] = []
        try:
            for k in range(n):
                threads.append(await SqliteThread.open(f"memoryd-reader-{k}", lambda: _connect(path, busy_timeout_ms)))
        except BaseException:
            for t in threads:
                await t.aclose()
            raise
        return cls(threads)

    async def read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        thread = self._free.pop() if self._free else await self._wait()
        done: asyncio.Future[T] = asyncio.get_running_loop().create_future()

        def then(result: T | None, error: BaseException | None) -> None:
            # The thread comes back once the read has ended, not when a caller cancelled
            # meanwhile goes: handed back while its read still ran, it would make the next
            # read wait behind it. The cancelled caller's result is dropped.
            self._hand_back(thread)
            settle(done, result, error)

        try:
            thread.post(lambda c: _in_transaction(c, fn), then)
        except BaseException:  # closed: the thread goes back as it came
            self._hand_back(thread)
            raise
        return await done

    async def _wait(self) -> SqliteThread:
        waiter: asyncio.Future[SqliteThread] = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():  # handed a thread, then cancelled
                self._hand_back(waiter.result())
            raise

    def _hand_back(self, thread: SqliteThread) -> None:
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():  # not cancelled meanwhile
                waiter.set_result(thread)
                return
        self._free.append(thread)

    async def aclose(self) -> None:
        for t in self._all:
            await t.aclose()
