"""SQLite transactions, one way: ``with atomic(conn): ...``.

Outside a transaction, ``atomic`` opens one (``BEGIN IMMEDIATE`` for writes, a plain
``BEGIN`` for a read that must see one moment of the store) and commits it on success.
Inside one, it is a savepoint, released on success. On an error the block's changes are
undone (the transaction rolled back, or the store rolled back to the savepoint) and the
ORIGINAL error is re-raised, never one from the undo.

SQLite may roll the whole transaction back by itself on some faults (SQLITE_FULL, IOERR,
BUSY: https://sqlite.org/lang_transaction.html, "Response To Errors Within A
Transaction"). A savepoint can then not be rolled back to: its ``lost`` is true (as it is
when the undo itself fails), and the caller must treat the enclosing transaction as gone,
not just this block.
"""

from __future__ import annotations

import logging
import sqlite3
from types import TracebackType

log = logging.getLogger("memoryd.store")


class atomic:  # as contextlib's context managers: named for the ``with`` it is used in
    """A transaction (outside one) or a savepoint named ``name`` (inside one) around a
    ``with`` block; ``immediate=False`` for a read transaction. ``lost`` says, after an
    error, that the enclosing transaction is gone too (see the module's docstring)."""

    def __init__(self, conn: sqlite3.Connection, name: str = "atomic", *, immediate: bool = True) -> None:
        self._conn = conn
        self._name = name
        self._immediate = immediate
        self._outer = False
        self.lost = False

    def __enter__(self) -> atomic:
        self._outer = not self._conn.in_transaction
        if self._outer:
            begin(self._conn, immediate=self._immediate)
        else:
            self._conn.execute(f"SAVEPOINT {self._name}")
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        conn = self._conn
        if exc is None:
            if not self._outer:
                conn.execute(f"RELEASE {self._name}")
                return
            commit(conn)
            return
        if self._outer:
            rollback(conn, f"after {type(exc).__name__}")
            return  # the original error propagates
        if not conn.in_transaction:
            self.lost = True  # SQLite rolled the whole transaction back
            return
        try:
            conn.execute(f"ROLLBACK TO {self._name}")
            conn.execute(f"RELEASE {self._name}")
        except sqlite3.Error as undo:
            # The savepoint cannot be undone: neither can the transaction be committed.
            log.error("rollback to savepoint %s failed: %s", self._name, undo)
            self.lost = True
            rollback(conn, "after a failed rollback to a savepoint")


def rollback(conn: sqlite3.Connection, why: str) -> None:
    """Roll back the transaction in progress, if any; a failed ROLLBACK is logged, not
    raised (the error that made it needed is the one to report)."""
    if not conn.in_transaction:
        return
    try:
        conn.execute("ROLLBACK")
    except sqlite3.Error as exc:
        # left open: the writer's next batch rolls it back before it begins
        log.error("rollback %s failed: %s", why, exc)


def begin(conn: sqlite3.Connection, *, immediate: bool = True) -> None:
    """BEGIN a transaction (IMMEDIATE: take the write lock now)."""
    conn.execute("BEGIN IMMEDIATE" if immediate else "BEGIN")


def commit(conn: sqlite3.Connection) -> None:
    """COMMIT the transaction in progress; on failure roll it back and raise the COMMIT's
    error. (Also for a transaction begun with ``begin``: the writer's batch.)"""
    try:
        conn.execute("COMMIT")
    except BaseException:
        rollback(conn, "after a failed commit")
        raise
