"""Reading a store's ledger without a daemon: ``memoryctl audit verify|explain --db PATH``.

The store is opened read-only (``file:...?mode=ro``) with the standard library's sqlite3,
and its rows are read in one read transaction by the same pure functions the daemon uses
(``memoryd_protocol.ledger.consistent`` with ``read_report`` or ``read_life``), so both give
the same verdict. A store that a daemon holds is refused: that daemon's answer is the one
to ask for, and it is what ``memoryctl audit verify`` without ``--db`` gives.

Imported only by those two commands (memoryctl's other verbs never load sqlite3).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from memoryd_protocol import text_index
from memoryd_protocol.ledger import Fetch, consistent
from memoryd_protocol.paths import read_owner_record
from memoryd_protocol.types import LedgerProblem

T = TypeVar("T")

#: What every memory store has (dsh-memento's layout); a file without them is not one.
STORE_TABLES = frozenset({"meta", "entries", "audit"})
NO_LEDGER = "this store has no ledger yet: memoryd has never written to it"


class OfflineError(Exception):
    """The store cannot be read offline: missing, not a memory store, or held by a daemon
    (memoryctl exit 2)."""


class StoreHeld(OfflineError):
    def __init__(self, message: str, pid: int | None, socket: str | None) -> None:
        super().__init__(message)
        self.pid = pid
        self.socket = socket


class NoLedger(Exception):
    """A memory store that memoryd never opened: nothing in it is chained (memoryctl exit 1)."""


def check_not_held(db: Path) -> None:
    """Refuse a store whose lock a daemon holds. The daemon holds an exclusive flock on the
    db file for its whole life (and records its pid and socket next to it); a shared flock
    that cannot be had right now means one does. The probe lets go at once, so a daemon
    that starts a moment later is not refused because of it."""
    try:
        fd = os.open(db, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise OfflineError(f"cannot open {db}: {exc.strerror or exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        record = read_owner_record(db)
        pid, socket = (None, None) if record is None else record[:2]
        holder = f"memoryd pid {pid}" if pid is not None else "a running memoryd"
        where = f", serving {socket}" if socket else ""
        raise StoreHeld(f"store {db} is held by {holder}{where}", pid, socket) from None
    finally:
        os.close(fd)  # closing lets go of the probe's lock too


@contextlib.contextmanager
def _read_only(db: Path) -> Iterator[sqlite3.Connection]:
    try:
        conn = sqlite3.connect(f"{db.absolute().as_uri()}?mode=ro", uri=True, isolation_level=None)
    except sqlite3.Error as exc:
        raise OfflineError(f"cannot open {db}: {exc}") from None
    try:
        yield conn
    finally:
        conn.close()


def read(db_path: str, reader: Callable[[Fetch], T]) -> T:
    """``reader`` (``read_report``, ``read_life``) on the store at ``db_path``, read-only,
    in one read transaction. Raises :class:`OfflineError` (missing, not a memory store,
    held by a daemon) or :class:`NoLedger`."""
    db = Path(db_path).expanduser()
    if not db.exists():
        raise OfflineError(f"{db} does not exist")
    if not db.is_file():
        raise OfflineError(f"{db} is not a file")
    check_not_held(db)
    with _read_only(db) as conn:
        try:
            tables = {str(r[0]) for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        except sqlite3.DatabaseError as exc:
            raise OfflineError(f"{db} is not a memory store: {exc}") from None
        if not STORE_TABLES <= tables:
            raise OfflineError(f"{db} is not a memory store (it has no entries and audit tables)")
        if "memoryd_ledger" not in tables:
            raise NoLedger(NO_LEDGER)
        try:
            return consistent(conn, reader)
        except sqlite3.Error as exc:
            raise OfflineError(f"cannot read {db}: {exc}") from None


def index_problems(db_path: str) -> list[LedgerProblem]:
    """Whether the text index agrees with the entries (text_index.agrees), checked on a copy
    of the store in memory: the check writes, in a savepoint it rolls back, and the store
    itself is only ever opened read-only."""
    db = Path(db_path).expanduser()
    with _read_only(db) as conn, contextlib.closing(sqlite3.connect(":memory:", isolation_level=None)) as copy:
        try:
            if not conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'memoryd_fts'").fetchone():
                return []
            conn.backup(copy)
            agrees = text_index.agrees(copy.execute, sqlite3.DatabaseError)
        except sqlite3.Error as exc:
            raise OfflineError(f"cannot read {db}: {exc}") from None
    return [] if agrees else [LedgerProblem(reason=text_index.PROBLEM)]


__all__ = ["NO_LEDGER", "NoLedger", "OfflineError", "StoreHeld", "check_not_held", "index_problems", "read"]
