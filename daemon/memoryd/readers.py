"""Every read of the store: ``await readers.read(fn)`` runs ``fn(conn)`` inside one read
transaction on a read-only connection and the thread that owns it (sqlthread.py), one of a few,
so that a long read (a whole-ledger verify, a 100,000-entry scan) holds one of them while
queries and approvals go on through the others.

Why not aiosqlite: its public API is statement-level, a thread hop for every statement,
where one hop per read runs the whole function.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import anyio

from . import queries, storefile
from .atomic import atomic
from .sqlthread import SqliteThread

T = TypeVar("T")

#: How many read connections with a thread of their own a daemon keeps.
READERS = 3


def _connect(path: Path, busy_timeout_ms: int) -> sqlite3.Connection:
    conn = storefile.connect(path, busy_timeout_ms)
    conn.execute("PRAGMA query_only = ON")
    queries.prepare_reader(conn)
    return conn


def _in_transaction(conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
    # one read transaction: every statement of the read sees one moment of the store, and
    # the WAL's read lock is taken once, not once per statement
    with atomic(conn, immediate=False):
        return fn(conn)


class Readers:
    def __init__(self, threads: list[SqliteThread]) -> None:
        self._all = threads
        self._free = list(threads)
        self._slots = anyio.Semaphore(len(threads))

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
        async with self._slots:
            thread = self._free.pop()
            try:
                # shielded: a connection handed back while its read still runs would make
                # the next read wait behind it
                with anyio.CancelScope(shield=True):
                    result = await thread.call(lambda c: _in_transaction(c, fn))
            finally:
                self._free.append(thread)
            return result

    async def aclose(self) -> None:
        for t in self._all:
            await t.aclose()
