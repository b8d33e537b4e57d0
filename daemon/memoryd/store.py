"""The SQLite store: layout, opening (validate → migrate → WAL), and the SQL of every
operation. Synchronous on purpose: each function runs on the thread its caller uses the
connection on (the writer's statements on the event loop, its large batches and COMMITs on
its own thread; the readers'), inside a transaction the caller opened.

The layout is dsh-memento's ``memory.db`` schema v4, so either program can open the file.
memoryd's own table (``memoryd_snapshots``) is versioned by ``meta.memoryd_schema``; the
reference ignores both, and ``meta.schema_version`` stays 4.
"""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import stat
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import msgspec
from memoryd_protocol import ledger as ledger_format
from memoryd_protocol.constants import (
    DEFAULT_BUSY_TIMEOUT_MS,
    GRID,
    MEMORYD_SCHEMA_VERSION,
    STORE_SCHEMA_VERSION,
    StoreFault,
)
from memoryd_protocol.errors import StoreCorrupt, StoreUnavailable, StoreUnsupportedVersion
from memoryd_protocol.text import utf16_len
from memoryd_protocol.types import AuditRow, Entry, Proposal

from .atomic import atomic

SQLITE_MAGIC = b"SQLite format 3\x00"

ENTRY_COLUMNS = (
    "id, track, scope, workspace_key, text, source, created_at, updated_at, session_id, "
    "agent_key, last_recalled, recall_count, tags, version"
)
PROPOSAL_COLUMNS = ledger_format.PROPOSAL_COLUMNS
AUDIT_COLUMNS = "seq, ts, action, track, scope, entry_id, text, outcome, source, session_id"

# Step n creates schema n from schema n-1 (0 = empty file). Each runs in one transaction
# together with the meta row that records it.
MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (
        "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
        """CREATE TABLE IF NOT EXISTS entries (
            id TEXT PRIMARY KEY,
            track TEXT NOT NULL,
            scope TEXT NOT NULL,
            workspace_key TEXT NOT NULL DEFAULT '',
            text TEXT NOT NULL,
            source TEXT NOT NULL,
            created_at INTEGER NOT NULL,
            updated_at INTEGER NOT NULL,
            session_id TEXT
        )""",
        """CREATE TABLE IF NOT EXISTS audit (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            ts INTEGER NOT NULL,
            action TEXT NOT NULL,
            track TEXT,
            scope TEXT,
            entry_id TEXT,
            text TEXT,
            outcome TEXT,
            source TEXT,
            session_id TEXT
        )""",
        "CREATE INDEX IF NOT EXISTS entries_track_scope ON entries (track, scope)",
    ),
    2: (
        """CREATE TABLE IF NOT EXISTS proposals (
            id TEXT PRIMARY KEY,
            kind TEXT NOT NULL,
            track TEXT NOT NULL,
            scope TEXT NOT NULL,
            workspace_key TEXT NOT NULL DEFAULT '',
            text TEXT NOT NULL,
            source TEXT NOT NULL,
            session_id TEXT,
            status TEXT NOT NULL,
            created_at INTEGER NOT NULL,
            decided_at INTEGER,
            UNIQUE (session_id, kind)
        )""",
    ),
    3: (
        "ALTER TABLE entries ADD COLUMN agent_key TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE entries ADD COLUMN last_recalled INTEGER",
        "ALTER TABLE entries ADD COLUMN recall_count INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE proposals ADD COLUMN agent_key TEXT NOT NULL DEFAULT ''",
    ),
    4: (
        "ALTER TABLE entries ADD COLUMN tags TEXT NOT NULL DEFAULT '[]'",
        "ALTER TABLE entries ADD COLUMN version INTEGER NOT NULL DEFAULT 1",
    ),
}

MEMORYD_TABLES = (
    """CREATE TABLE IF NOT EXISTS memoryd_snapshots (
        session_id TEXT PRIMARY KEY,
        text TEXT NOT NULL,
        language TEXT NOT NULL,
        created_at INTEGER NOT NULL
    )""",
    # memoryd_schema 2: the hash-chained ledger beside the reference's audit table
    ledger_format.TABLE,
    ledger_format.INDEX,
    # memoryd_schema 3: a trigram index of the entries' text, for query candidates. External
    # content (the text lives once, in entries) and no triggers: dsh-memento's SQLite need
    # not have FTS5, and a trigger it cannot run would break its writes. memoryd keeps the
    # index in step in its own write jobs (its adds in a tail, memoryd_schema 5: see
    # TEXT_MARK_KEY), and rebuilds it at start unless the store is ``trusted``, i.e. after
    # another program wrote the entries.
    # memoryd_schema 4: columnsize=0, no row per entry in memoryd_fts_docsize (nothing
    # here ranks by length): one B-tree page less per write (see MEMORYD_MIGRATIONS).
    "CREATE VIRTUAL TABLE IF NOT EXISTS memoryd_fts USING fts5("
    "text, content='entries', content_rowid='rowid', tokenize='trigram', columnsize=0)",
    # ... and what memoryd knows of the entries without reading them all: their number and
    # each cell's usage (UTF-16 units), kept in step by memoryd's own writes in the same
    # transactions. A start trusts them (no index rebuild, no usage scan, no tags scan)
    # while nobody else wrote: see ``trusted``.
    "CREATE TABLE IF NOT EXISTS memoryd_usage (track TEXT NOT NULL, scope TEXT NOT NULL, "
    "entries INTEGER NOT NULL, used INTEGER NOT NULL, PRIMARY KEY (track, scope))",
    # A query's rank order as an index: a page without a text walks it, and stops at the
    # page's end. A plain index: dsh-memento's SQLite keeps it up to date unknowingly.
    # memoryd_schema 6: ascending, walked backwards for ORDER BY recall_count DESC,
    # updated_at DESC, id (the same order). A new entry (no recalls, the newest updated_at)
    # lands at the end of the recall_count = 0 run, next to the last add, instead of at its
    # head in the middle of the B-tree: fewer split and half-full pages per add.
    "CREATE INDEX IF NOT EXISTS memoryd_entries_rank ON entries (recall_count, updated_at, id DESC)",
)

#: What a store of memoryd_schema n-1 drops on its way to n, before MEMORYD_TABLES creates
#: the new definitions; a step that drops the text index rebuilds it from the entries.
MEMORYD_MIGRATIONS: dict[int, tuple[str, ...]] = {
    # memoryd_fts with columnsize=0, memoryd_ledger_ref partial: two B-tree pages less per write
    4: ("DROP TABLE IF EXISTS memoryd_fts", "DROP INDEX IF EXISTS memoryd_ledger_ref"),
    # memoryd_schema 5: the text index's mark (TEXT_MARK_KEY), which ``migrate`` sets for a
    # store from before it: a store of schema 4 has every entry in the index.
    5: (),
    # memoryd_entries_rank ascending (see MEMORYD_TABLES)
    6: ("DROP INDEX IF EXISTS memoryd_entries_rank",),
}

#: memoryd_schema 5: the ``meta`` row of the text index's mark, the highest entries rowid it
#: covers. Every entry up to the mark is in memoryd_fts with its current text; the entries
#: above it (the tail) are in no index, and a query takes them all as candidates. An add
#: writes no index row (about 7 of a commit's WAL pages); the writer indexes the tail in a
#: transaction of its own once it holds TAIL_MERGE_AT entries (``index_tail``), and the mark
#: moves in that transaction: a crash between the two loses nothing.
TEXT_MARK_KEY = "memoryd_fts_mark"
#: The first memoryd_schema with the tail.
TAIL_SCHEMA = 5
#: The mark in SQL (NULL in a store without one: there, every entry is indexed as written).
TEXT_MARK_SQL = f"(SELECT CAST(value AS INTEGER) FROM meta WHERE key = '{TEXT_MARK_KEY}')"
#: The tail the writer indexes at once: indexing a tail costs well under a WAL page per
#: add at any of the sizes measured (bench/results/PER-WRITE.md), and a smaller tail keeps
#: the wait of writes queued behind its merge short.
TAIL_MERGE_AT = 256

REQUIRED_COLUMNS: dict[int, dict[str, set[str]]] = {
    1: {"meta": {"key", "value"}, "entries": {"id", "track", "scope", "text"}, "audit": {"seq", "action"}},
}


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def new_id() -> str:
    return str(uuid.uuid4())


# --- store faults ------------------------------------------------------------------------

#: SQLite's primary result codes (the low byte of the extended code) that mean the store
#: cannot take a write right now: the machine's state, not a bug of ours, not corruption.
_FAULT_REASONS: dict[int, StoreFault] = {
    5: "busy",  # SQLITE_BUSY, and its BUSY_RECOVERY / BUSY_SNAPSHOT / BUSY_TIMEOUT variants
    8: "readonly",  # SQLITE_READONLY, and READONLY_DBMOVED / _DIRECTORY / _CANTLOCK / ...
    10: "io",  # SQLITE_IOERR_* (a failed read, write, fsync, truncate, lock, ...)
    13: "full",  # SQLITE_FULL
    14: "io",  # SQLITE_CANTOPEN (the -wal or -shm file cannot be created or opened)
}
#: STORE_UNAVAILABLE's message for each reason (English, stable).
FAULT_MESSAGES: dict[StoreFault, str] = {
    "busy": "the store is busy: another process held its write lock past the busy timeout",
    "full": "the store's file system is full",
    "readonly": "the store is read-only",
    "io": "the store had an I/O error",
}
_ERRNO_REASONS: dict[int, StoreFault] = {
    errno.EROFS: "readonly",
    errno.EACCES: "readonly",
    errno.EPERM: "readonly",
    errno.ENOSPC: "full",
    errno.EDQUOT: "full",
}


def unavailable(reason: StoreFault, path: Path, message: str | None = None) -> StoreUnavailable:
    return StoreUnavailable(message or FAULT_MESSAGES[reason], {"reason": reason, "path": str(path)})


def fault_reason(exc: BaseException) -> StoreFault | None:
    """The STORE_UNAVAILABLE reason of an sqlite3 error, or None when it is not a store
    fault (a constraint, a bad statement, corruption: those stay what they are)."""
    code = getattr(exc, "sqlite_errorcode", None) if isinstance(exc, sqlite3.Error) else None
    if not isinstance(code, int):
        return None
    return _FAULT_REASONS.get(code & 0xFF)


def store_fault(exc: BaseException, path: Path) -> StoreUnavailable | None:
    """``exc`` as the STORE_UNAVAILABLE error a client gets, when it is a store fault."""
    reason = fault_reason(exc)
    return None if reason is None else unavailable(reason, path)


def os_fault(exc: OSError, path: Path) -> StoreUnavailable:
    reason = _ERRNO_REASONS.get(exc.errno or 0, "io")
    return unavailable(reason, path, f"{FAULT_MESSAGES[reason]}: {exc.strerror or exc}")


# --- opening -----------------------------------------------------------------------------


def _no_write(p: Path, st: os.stat_result) -> bool:
    """A mode without any write bit is read-only even for root, who may write it anyway:
    it says what the owner meant, and memoryd never changes another's modes."""
    return not os.access(p, os.W_OK) or st.st_mode & 0o222 == 0


def refuse_read_only(path: Path) -> None:
    """Raise STORE_UNAVAILABLE (reason readonly) for a store memoryd must not write: its
    file, the directory it lives in (SQLite creates the -wal and -shm files there) or their
    file system is read-only. Checked before anything is created, opened or locked."""
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent  # the store's directory will be made in here
    for p, what in ((path, "file"), (parent, "directory")):
        try:
            st = p.stat()
            ro_mount = os.statvfs(p).f_flag & os.ST_RDONLY
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise os_fault(exc, path) from None
        if ro_mount:
            raise unavailable("readonly", path, "the store is read-only: its file system is mounted read-only")
        if what == "directory" and not os.access(p, os.X_OK):
            raise unavailable("readonly", path, f"the store is read-only: its directory {p} cannot be entered")
        if _no_write(p, st):
            raise unavailable("readonly", path,
                              f"the store is read-only: its {what} {'' if p == path else f'{p} '}"
                              f"has mode {stat.S_IMODE(st.st_mode):04o}")


def prepare_path(path: Path) -> None:
    """Create the directory (0700) and the file (0600) when they do not exist yet. An
    existing store keeps its modes: memoryd never changes them."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        return
    except OSError as exc:
        raise os_fault(exc, path) from None
    os.close(fd)


def inspect(path: Path, busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS) -> int:
    """The store's schema version (0 for a new, empty file), read without writing a byte.

    Raises StoreCorrupt for anything that is not a readable memory store and
    StoreUnsupportedVersion for a newer schema.
    """
    details = {"path": str(path)}
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return 0
    if size == 0:
        return 0
    try:
        with path.open("rb") as f:
            magic = f.read(len(SQLITE_MAGIC))
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EPERM):  # a file we may not read is not a corrupt one
            raise unavailable("io", path, f"the store cannot be read: {exc.strerror}") from None
        raise StoreCorrupt(f"store is unreadable: {exc.strerror}", details) from None
    if magic != SQLITE_MAGIC:
        raise StoreCorrupt("store is not an SQLite database", details)
    try:
        conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, timeout=busy_timeout_ms / 1000)
    except sqlite3.Error as exc:
        raise _unreadable(exc, path) or StoreCorrupt(f"store cannot be opened: {exc}", details) from None
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if not tables:
            return 0
        if "meta" not in tables:
            raise StoreCorrupt("store has no meta table", details)
        row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if row is None:
            raise StoreCorrupt("store has no schema_version", details)
        try:
            version = int(row[0])
        except (TypeError, ValueError):
            raise StoreCorrupt("store schema_version is not a number", details) from None
        if version > STORE_SCHEMA_VERSION:
            raise StoreUnsupportedVersion(
                f"store schema version {version} is newer than supported version {STORE_SCHEMA_VERSION}", details
            )
        if version < 1:
            raise StoreCorrupt(f"store schema_version {version} is invalid", details)
        # memoryd's own tables too: a newer memoryd's store may hold what this one would get
        # wrong (an index tail it does not know is unindexed), so it is refused, not
        # written over with this version's number
        own = conn.execute("SELECT value FROM meta WHERE key = 'memoryd_schema'").fetchone()
        if own is not None and str(own[0]).isdigit() and int(own[0]) > MEMORYD_SCHEMA_VERSION:
            raise StoreUnsupportedVersion(
                f"store memoryd_schema {own[0]} is newer than supported version {MEMORYD_SCHEMA_VERSION}", details
            )
        for table, cols in REQUIRED_COLUMNS[1].items():
            if table not in tables:
                raise StoreCorrupt(f"store has no {table} table", details)
            have = {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}
            if not cols <= have:
                raise StoreCorrupt(f"store table {table} lacks columns {sorted(cols - have)}", details)
        if trusted(conn):
            # Nobody but memoryd wrote since its last run: its rows need no second reading.
            # The full checks below cost a pass over the whole file (a 100,000-entry store's
            # start would take them many times over).
            return version
        if version >= 4:
            for (raw,) in conn.execute("SELECT tags FROM entries"):
                if parse_tags(raw) is None:
                    raise StoreCorrupt("store has an entry whose tags column is not a JSON array of strings", details)
        check = conn.execute("PRAGMA quick_check").fetchone()
        if check is None or check[0] != "ok":
            raise StoreCorrupt("store failed its integrity check", details)
        return version
    except sqlite3.DatabaseError as exc:
        # Busy, I/O and can't-open (a -shm that a read-only directory cannot hold) are the
        # machine's state, not the file's: STORE_UNAVAILABLE, never STORE_CORRUPT.
        raise _unreadable(exc, path) or StoreCorrupt(f"store is unreadable: {exc}", details) from None
    finally:
        conn.close()


def _unreadable(exc: sqlite3.Error, path: Path) -> StoreUnavailable | None:
    """A store fault met while inspecting: a -shm that cannot be made beside a WAL store
    (SQLITE_CANTOPEN) in a read-only directory is reason readonly, as it is at start."""
    fault = store_fault(exc, path)
    if fault is not None:
        try:
            refuse_read_only(path)
        except StoreUnavailable as readonly:
            return readonly
    return fault


def configure(conn: sqlite3.Connection, busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS) -> None:
    # How long a write waits for another process's write lock (dsh-memento's, say) before
    # it fails with STORE_UNAVAILABLE reason busy.
    conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
    conn.execute("PRAGMA journal_mode = WAL")
    # An acknowledged write must survive power loss: fsync the WAL at every commit.
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("PRAGMA foreign_keys = OFF")


def connect(path: Path, busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS) -> sqlite3.Connection:
    # isolation_level=None: we issue BEGIN/COMMIT ourselves (group commit, savepoints).
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        configure(conn, busy_timeout_ms)
    except BaseException:
        conn.close()
        raise
    return conn


def migrate(conn: sqlite3.Connection, from_version: int) -> None:
    """Bring the store to schema v4 one step at a time, each step atomic with its record."""
    for target in range(from_version + 1, STORE_SCHEMA_VERSION + 1):
        with atomic(conn):
            for sql in MIGRATIONS[target]:
                conn.execute(sql)
            conn.execute(
                "INSERT INTO meta (key, value) VALUES ('schema_version', ?) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (str(target),),
            )
    row = conn.execute("SELECT value FROM meta WHERE key = 'memoryd_schema'").fetchone()
    if row is not None and row[0] == str(MEMORYD_SCHEMA_VERSION):
        return  # nothing to do: opening an up-to-date store writes nothing
    # None: memoryd never opened it (its tables are all new)
    was = int(row[0]) if row is not None and str(row[0]).isdigit() else None
    with atomic(conn):
        steps = [] if was is None else [MEMORYD_MIGRATIONS.get(v, ()) for v in range(was + 1, MEMORYD_SCHEMA_VERSION + 1)]
        for step in steps:
            for sql in step:
                conn.execute(sql)
        for sql in MEMORYD_TABLES:
            conn.execute(sql)
        # Before the tail (memoryd_schema 5) every entry was indexed as written. A mark in
        # such a store: a memoryd of schema 4 or older wrote over a store of 5+, and never
        # indexed the tail it found above the mark.
        before_tail = was is not None and was < TAIL_SCHEMA
        rebuild = any("DROP TABLE IF EXISTS memoryd_fts" in step for step in steps) or (
            before_tail and text_mark(conn) is not None)
        if rebuild:
            # the counts and the ledger may be trusted (sync_text_index would not rebuild)
            conn.execute("INSERT INTO memoryd_fts (memoryd_fts) VALUES ('rebuild')")
        if was is None or before_tail or rebuild:
            # The index holds every entry now: a store of schema 4 indexed each as written,
            # one rebuilt just now holds them all, and a store memoryd never opened (an empty
            # index beside its entries) is not ``trusted``, so sync_text_index rebuilds it
            # next. (A store of schema 5+ keeps its mark, and its tail.)
            _save_mark(conn, rebuilt=True)
        conn.execute(
            "INSERT INTO meta (key, value) VALUES ('memoryd_schema', ?) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (str(MEMORYD_SCHEMA_VERSION),),
        )


def open_store(path: Path, version: int, busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS) -> sqlite3.Connection:
    """Open a store that ``inspect`` found at ``version`` for writing, migrating it forward.
    A store fault on the way (busy, full, read-only, I/O) is STORE_UNAVAILABLE."""
    try:
        conn = connect(path, busy_timeout_ms)
    except sqlite3.Error as exc:
        raise store_fault(exc, path) or exc from None
    try:
        migrate(conn, version)
        with atomic(conn):
            sync_text_index(conn)
        if tail_full(conn):  # left by a bulk write, or a daemon killed before its merge
            try:
                with atomic(conn):
                    index_tail(conn)
            except sqlite3.Error as exc:
                # Optional, as the writer's merge is: queries find the tail where it is, and
                # the writer indexes it after its next commit. A store that is busy (or full)
                # right now still opens, as it would with a shorter tail.
                if fault_reason(exc) is None:
                    raise
    except sqlite3.Error as exc:
        conn.close()
        raise store_fault(exc, path) or exc from None
    except BaseException:
        conn.close()
        raise
    return conn


# --- rows --------------------------------------------------------------------------------


_tags_decoder = msgspec.json.Decoder(list[str])


def parse_tags(raw: Any) -> list[str] | None:
    """The tags column (JSON array of strings); None when it is anything else."""
    if raw is None:
        return []
    if raw == "[]":
        return []
    try:
        return _tags_decoder.decode(raw)
    except (msgspec.DecodeError, TypeError):
        return None


def dump_tags(tags: Iterable[str]) -> str:
    tags = list(tags)
    if not tags:
        return "[]"  # most writes: what json.dumps gives, without calling it
    return json.dumps(tags, ensure_ascii=False, separators=(",", ":"))


def row_to_entry(row: Sequence[Any]) -> Entry:
    tags = parse_tags(row[12])
    if tags is None:
        raise StoreCorrupt("an entry's tags column is not a JSON array of strings", {"entryId": row[0]})
    return Entry(
        id=row[0],
        track=row[1],
        scope=row[2],
        workspace_key=row[3] or "",
        text=row[4],
        source=row[5],
        created_at=row[6],
        updated_at=row[7],
        session_id=row[8],
        agent_key=row[9] or "",
        last_recalled=row[10],
        recall_count=row[11] or 0,
        tags=tags,
        version=row[13] or 1,
    )


def row_to_proposal(row: Sequence[Any]) -> Proposal:
    [proposal] = ledger_format.proposals_from([row])
    return proposal


def row_to_audit(row: Sequence[Any]) -> AuditRow:
    return AuditRow(
        seq=row[0],
        ts=row[1],
        action=row[2],
        track=row[3],
        scope=row[4],
        entry_id=row[5],
        text=row[6],
        outcome=row[7],
        source=row[8],
        session_id=row[9],
    )


# --- reads -------------------------------------------------------------------------------


LIST_ENTRIES_SQL = f"SELECT {ENTRY_COLUMNS} FROM entries ORDER BY created_at, rowid"
#: newest first; one parameter, the limit
AUDIT_LIST_SQL = f"SELECT {AUDIT_COLUMNS} FROM audit ORDER BY seq DESC LIMIT ?"


def list_entries(conn: sqlite3.Connection) -> list[Entry]:
    return [row_to_entry(r) for r in conn.execute(LIST_ENTRIES_SQL).fetchall()]


def layer_texts(conn: sqlite3.Connection) -> list[tuple[str, str, str, str, str]]:
    """``(track, scope, workspace_key, agent_key, text)`` of every entry in creation order:
    what a snapshot renders from, without making an Entry of each row."""
    return conn.execute("SELECT track, scope, workspace_key, agent_key, text FROM entries "
                        "ORDER BY created_at, rowid").fetchall()


def get_entry(conn: sqlite3.Connection, entry_id: str) -> Entry | None:
    row = conn.execute(f"SELECT {ENTRY_COLUMNS} FROM entries WHERE id = ?", (entry_id,)).fetchone()
    return row_to_entry(row) if row else None


def cell_entries(conn: sqlite3.Connection, track: str, scope: str) -> list[Entry]:
    rows = conn.execute(
        f"SELECT {ENTRY_COLUMNS} FROM entries WHERE track = ? AND scope = ? ORDER BY created_at, rowid",
        (track, scope),
    ).fetchall()
    return [row_to_entry(r) for r in rows]


# --- what a start may trust ------------------------------------------------------------


def trusted(conn: sqlite3.Connection) -> bool:
    """Whether the entries are as memoryd's own writes left them, told without reading them
    all: the counts memoryd keeps match the entries' number, and the newest audit row is one
    memoryd chained. dsh-memento writes an audit row with every write, so its writes, like
    a first open, make this False. (An entry edited in place with a raw SQL shell, leaving
    no audit row, is not seen here; ``audit verify`` reports it.)"""
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if not {"memoryd_usage", "memoryd_ledger", "memoryd_fts", "entries", "audit"} <= tables:
        return False
    (kept,) = conn.execute("SELECT total(entries) FROM memoryd_usage").fetchone()
    (n,) = conn.execute("SELECT count(*) FROM entries").fetchone()
    if int(kept) != n or conn.execute("SELECT 1 FROM memoryd_usage WHERE entries < 0 OR used < 0").fetchone():
        return False
    (newest,) = conn.execute("SELECT max(seq) FROM audit").fetchone()
    (chained,) = conn.execute("SELECT max(audit_seq) FROM memoryd_ledger").fetchone()
    return newest == chained or (newest is None and n == 0)


def sync_text_index(conn: sqlite3.Connection) -> bool:
    """At start: unless the store is ``trusted``, rebuild the text index and the counts
    from the entries. True when it rebuilt. Runs in the caller's transaction."""
    if trusted(conn):
        return False
    conn.execute("INSERT INTO memoryd_fts (memoryd_fts) VALUES ('rebuild')")
    _save_mark(conn, rebuilt=True)
    conn.execute("DELETE FROM memoryd_usage")
    counts: dict[tuple[str, str], list[int]] = {}
    for track, scope, text in conn.execute("SELECT track, scope, text FROM entries"):
        c = counts.setdefault((track, scope), [0, 0])
        c[0] += 1
        c[1] += utf16_len(text)
    conn.executemany("INSERT INTO memoryd_usage (track, scope, entries, used) VALUES (?, ?, ?, ?)",
                     [(t, sc, n, u) for (t, sc), (n, u) in counts.items()])
    return True


def stored_usage(conn: sqlite3.Connection) -> dict[tuple[str, str], int]:
    """Usage per track × scope as memoryd keeps it (valid once ``sync_text_index`` ran)."""
    used: dict[tuple[str, str], int] = dict.fromkeys(GRID, 0)
    for track, scope, n in conn.execute("SELECT track, scope, used FROM memoryd_usage"):
        used[(track, scope)] = int(n)
    return used


def proposals(conn: sqlite3.Connection, status: str | None) -> list[Proposal]:
    if status is None:
        rows = conn.execute(f"SELECT {PROPOSAL_COLUMNS} FROM proposals ORDER BY created_at, rowid").fetchall()
    else:
        rows = conn.execute(
            f"SELECT {PROPOSAL_COLUMNS} FROM proposals WHERE status = ? ORDER BY created_at, rowid", (status,)
        ).fetchall()
    return [row_to_proposal(r) for r in rows]


def get_proposal(conn: sqlite3.Connection, proposal_id: str) -> Proposal | None:
    row = conn.execute(f"SELECT {PROPOSAL_COLUMNS} FROM proposals WHERE id = ?", (proposal_id,)).fetchone()
    return row_to_proposal(row) if row else None


def frozen_snapshot(conn: sqlite3.Connection, session_id: str) -> str | None:
    row = conn.execute("SELECT text FROM memoryd_snapshots WHERE session_id = ?", (session_id,)).fetchone()
    return row[0] if row else None


# --- writes (inside the writer's transaction) --------------------------------------------


class Batch:
    """A transaction of the writer's batch, on the thread running it (``with Batch(conn):``), so that
    what its writes keep beside the entries costs one statement per batch, not one per
    write: the counts (``_count``) are added up here and written once per cell by
    ``flush``, before COMMIT, and the text index's mark (``text_mark``) is read once.
    Outside a batch (start-up, tests, the bench's seeding) each is its statement, as written.

    A savepoint rolled back takes its writes' counts back out too (``save``, ``restore``).
    Two statements less per add after a batch's first, each of them one more release and
    retake of the GIL while the event loop is busy."""

    __slots__ = ("_conn", "_counts", "_mark", "_mark_read")

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self._counts: dict[tuple[str, str], tuple[int, int]] = {}
        self._mark: int | None = None
        self._mark_read = False

    def __enter__(self) -> Batch:
        _batch.current = self
        return self

    def __exit__(self, *exc: object) -> None:
        _batch.current = None

    def save(self) -> dict[tuple[str, str], tuple[int, int]]:
        return dict(self._counts)

    def restore(self, saved: dict[tuple[str, str], tuple[int, int]]) -> None:
        self._counts = dict(saved)

    def flush(self) -> None:
        """Write the counts added up so far (one upsert per cell), in the transaction."""
        counts = [(t, s, n, u) for (t, s), (n, u) in self._counts.items() if n or u]
        self._counts = {}
        if counts:
            self._conn.executemany(_COUNT_SQL, counts)


_batch = threading.local()


def _in_batch(conn: sqlite3.Connection) -> Batch | None:
    b: Batch | None = getattr(_batch, "current", None)
    return b if b is not None and b._conn is conn else None


def text_mark(conn: sqlite3.Connection) -> int | None:
    """The text index's mark (TEXT_MARK_KEY); None in a store without one."""
    b = _in_batch(conn)
    if b is not None and b._mark_read:
        return b._mark
    row = conn.execute(f"SELECT {TEXT_MARK_SQL}").fetchone()
    mark = None if row[0] is None else int(row[0])
    if b is not None:
        b._mark, b._mark_read = mark, True
    return mark


def _save_mark(conn: sqlite3.Connection, *, rebuilt: bool = False) -> None:
    """The index covers every entry now: the mark moves to the highest rowid. Only a rebuild
    moves it back (the index holds exactly the entries then); otherwise an entry inserted at
    or below it later, once the highest ones are gone, is indexed as written. Written only
    when it moves."""
    (top,) = conn.execute("SELECT coalesce(max(rowid), 0) FROM entries").fetchone()
    mark = text_mark(conn)
    if mark is None or top > mark or (rebuilt and top != mark):
        conn.execute("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = "
                     "excluded.value", (TEXT_MARK_KEY, str(top)))
        b = _in_batch(conn)
        if b is not None:
            b._mark_read = False


def text_tail(conn: sqlite3.Connection) -> int:
    """How many entries are above the mark (in no index yet)."""
    (n,) = conn.execute(f"SELECT count(*) FROM entries WHERE rowid > {TEXT_MARK_SQL}").fetchone()
    return int(n)


def tail_full(conn: sqlite3.Connection) -> bool:
    """Whether the tail holds TAIL_MERGE_AT entries or more. While the highest rowid is less
    than that far above the mark, the tail is shorter (its rowids are distinct and above
    the mark): one B-tree descent, not a count of the tail, after each commit."""
    top, mark = conn.execute(f"SELECT max(rowid), {TEXT_MARK_SQL} FROM entries").fetchone()
    if top is None or mark is None or top - mark < TAIL_MERGE_AT:
        return False
    return text_tail(conn) >= TAIL_MERGE_AT


def index_tail(conn: sqlite3.Connection) -> int:
    """Index the entries above the mark and move it, in the caller's transaction; how many.
    One statement: FTS5 writes what it indexed as one new segment at COMMIT (a statement
    savepoint flushes pending terms, but none are pending at its start)."""
    mark = text_mark(conn)
    if mark is None:
        return 0  # a store without a mark has no tail
    n = conn.execute("INSERT INTO memoryd_fts (rowid, text) SELECT rowid, text FROM entries WHERE rowid > ?",
                     (mark,)).rowcount
    if n:
        _save_mark(conn)
    return n


def _indexed(rowid: int, mark: int | None) -> bool:
    """Whether the entry at ``rowid`` is (or, just inserted, must be) in the text index."""
    return mark is None or rowid <= mark


def _unindex(conn: sqlite3.Connection, entry_id: str, mark: int | None) -> int | None:
    """Take the entry out of the text index (unless it is in the tail) and the counts; its
    rowid (None: no such entry). External content: FTS5's 'delete' needs the indexed text,
    i.e. the entry's text before this write."""
    row = conn.execute("SELECT rowid, text, track, scope FROM entries WHERE id = ?", (entry_id,)).fetchone()
    if row is None:
        return None
    rowid, text, track, scope = row
    if _indexed(rowid, mark):
        conn.execute("INSERT INTO memoryd_fts (memoryd_fts, rowid, text) VALUES ('delete', ?, ?)", (rowid, text))
    _count(conn, track, scope, -1, -utf16_len(text))
    return int(rowid)


def _index(conn: sqlite3.Connection, rowid: int, e: Entry, mark: int | None) -> None:
    # An entry in the tail (above the mark) waits for ``index_tail``. One at or below it (a
    # rowid reused: entries has no AUTOINCREMENT, so once the highest are deleted SQLite
    # hands out their rowids again) is indexed now, as are all of a store without a mark.
    # One row of VALUES, not INSERT ... SELECT FROM entries: a statement that may write
    # several rows opens a statement savepoint, and FTS5 flushes its pending terms to a
    # new segment at every savepoint. The text is the one the row was just written with.
    # Measured in batches of 16 adds: half the index's CPU, a quarter fewer WAL pages.
    if _indexed(rowid, mark):
        conn.execute("INSERT INTO memoryd_fts (rowid, text) VALUES (?, ?)", (rowid, e.text))
    _count(conn, e.track, e.scope, 1, utf16_len(e.text))


_COUNT_SQL = ("INSERT INTO memoryd_usage (track, scope, entries, used) VALUES (?, ?, ?, ?) "
              "ON CONFLICT (track, scope) DO UPDATE SET entries = entries + excluded.entries, "
              "used = used + excluded.used")


def _count(conn: sqlite3.Connection, track: str, scope: str, entries: int, used: int) -> None:
    b = _in_batch(conn)
    if b is None:
        conn.execute(_COUNT_SQL, (track, scope, entries, used))
        return
    n, u = b._counts.get((track, scope), (0, 0))
    b._counts[(track, scope)] = (n + entries, u + used)


def insert_entry(conn: sqlite3.Connection, e: Entry) -> None:
    _index(conn, _insert_row(conn, e), e, text_mark(conn))


def _insert_row(conn: sqlite3.Connection, e: Entry) -> int:
    """The entry's row; its rowid."""
    cur = conn.execute(
        f"INSERT INTO entries ({ENTRY_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            e.id,
            e.track,
            e.scope,
            e.workspace_key,
            e.text,
            e.source,
            e.created_at,
            e.updated_at,
            e.session_id,
            e.agent_key,
            e.last_recalled,
            e.recall_count,
            dump_tags(e.tags),
            e.version,
        ),
    )
    assert cur.lastrowid is not None
    return cur.lastrowid


def update_entry(conn: sqlite3.Connection, e: Entry) -> None:
    mark = text_mark(conn)
    rowid = _unindex(conn, e.id, mark)
    conn.execute(
        "UPDATE entries SET text = ?, source = ?, updated_at = ?, session_id = ?, tags = ?, version = ? WHERE id = ?",
        (e.text, e.source, e.updated_at, e.session_id, dump_tags(e.tags), e.version, e.id),
    )
    if rowid is not None:
        _index(conn, rowid, e, mark)


def delete_entry(conn: sqlite3.Connection, entry_id: str) -> None:
    _unindex(conn, entry_id, text_mark(conn))
    conn.execute("DELETE FROM entries WHERE id = ?", (entry_id,))


def bump_recalls(conn: sqlite3.Connection, recalls: list[tuple[str, int, int]]) -> None:
    """``(id, times, ts)``: the entry was recalled ``times`` more times, the last at ``ts``."""
    conn.executemany(
        "UPDATE entries SET recall_count = recall_count + ?, last_recalled = ? WHERE id = ?",
        [(n, ts, i) for i, n, ts in recalls],
    )


def audit(
    conn: sqlite3.Connection,
    action: str,
    *,
    track: str | None,
    scope: str | None,
    entry_id: str | None,
    text: str | None,
    outcome: str | None,
    source: str | None,
    session_id: str | None,
    ts: int,
) -> int:
    """Insert one row of the reference's audit table; its seq. Only ledger.Stamp calls this,
    so that every audit row memoryd writes has its chained ledger row."""
    cur = conn.execute(
        "INSERT INTO audit (ts, action, track, scope, entry_id, text, outcome, source, session_id) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (ts, action, track, scope, entry_id, text, outcome, source, session_id),
    )
    assert cur.lastrowid is not None
    return cur.lastrowid


def insert_proposal(conn: sqlite3.Connection, p: Proposal) -> None:
    conn.execute(
        f"INSERT INTO proposals ({PROPOSAL_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            p.id,
            p.kind,
            p.track,
            p.scope,
            p.workspace_key,
            p.text,
            p.source,
            p.session_id,
            p.status,
            p.created_at,
            p.decided_at,
            p.agent_key,
        ),
    )


def decide_proposal(conn: sqlite3.Connection, proposal_id: str, status: str, ts: int) -> bool:
    """Pending → ``status``; False when it was not pending (someone else decided first)."""
    cur = conn.execute(
        "UPDATE proposals SET status = ?, decided_at = ? WHERE id = ? AND status = 'pending'",
        (status, ts, proposal_id),
    )
    return cur.rowcount == 1


def freeze_snapshot(conn: sqlite3.Connection, session_id: str, text: str, language: str, ts: int) -> str:
    """Store the session's snapshot unless one is already frozen; return the frozen text."""
    conn.execute(
        "INSERT INTO memoryd_snapshots (session_id, text, language, created_at) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (session_id) DO NOTHING",
        (session_id, text, language, ts),
    )
    frozen = frozen_snapshot(conn, session_id)
    assert frozen is not None
    return frozen
