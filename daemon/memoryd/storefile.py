"""The store's file: its layout (dsh-memento's ``memory.db`` schema v4 and memoryd's own
tables beside it), the migrations, and opening it (validate → migrate → WAL).

The layout is the reference's, so either program can open the file. memoryd's own tables
are versioned by ``meta.memoryd_schema``; the reference ignores both, and
``meta.schema_version`` stays 4.
"""

from __future__ import annotations

import errno
import hashlib
import os
import sqlite3
import stat
from pathlib import Path

from memoryd_protocol import ledger as ledger_format
from memoryd_protocol.constants import DEFAULT_BUSY_TIMEOUT_MS, MEMORYD_SCHEMA_VERSION, STORE_SCHEMA_VERSION
from memoryd_protocol.errors import StoreCorrupt, StoreUnavailable, StoreUnsupportedVersion

from . import reference_ddl, store
from .atomic import atomic

SQLITE_MAGIC = b"SQLite format 3\x00"

# Step n creates schema n from schema n-1 (0 = empty file): the reference's own statements.
# Each runs in one transaction together with the meta row that records it.
MIGRATIONS = reference_ddl.MIGRATIONS

#: memoryd_usage (see MEMORYD_TABLES); created again by foreign.recount when another
#: program dropped it, since the entries hold everything it counts.
USAGE_TABLE = ("CREATE TABLE IF NOT EXISTS memoryd_usage (track TEXT NOT NULL, scope TEXT NOT NULL, "
               "entries INTEGER NOT NULL, used INTEGER NOT NULL, PRIMARY KEY (track, scope))")

#: memoryd_schema 7: each session's frozen snapshot names its text by digest, and the text
#: is stored once per digest (``share_snapshot_texts`` turns an older store's rows into these)
SNAPSHOTS_TABLE = """CREATE TABLE IF NOT EXISTS memoryd_snapshots (
        session_id TEXT PRIMARY KEY,
        digest TEXT NOT NULL,
        language TEXT NOT NULL,
        created_at INTEGER NOT NULL
    )"""

MEMORYD_TABLES = (
    SNAPSHOTS_TABLE,
    # digest: the sha256 of the UTF-8 text, lower-case hex; bytes: its UTF-8 length, what
    # max_snapshot_bytes caps (kept before the text, so summing it reads no overflow page)
    """CREATE TABLE IF NOT EXISTS memoryd_snapshot_texts (
        digest TEXT PRIMARY KEY,
        bytes INTEGER NOT NULL,
        text TEXT NOT NULL,
        created_at INTEGER NOT NULL
    )""",
    # memoryd_schema 2: the hash-chained ledger beside the reference's audit table
    ledger_format.TABLE,
    ledger_format.INDEX,
    # memoryd_schema 3: a trigram index of the entries' text, for query candidates. External
    # content (the text lives once, in entries) and no triggers: dsh-memento's SQLite need
    # not have FTS5, and a trigger it cannot run would break its writes. memoryd keeps the
    # index in step in its own write jobs, and rebuilds it at start unless the store is
    # ``trusted``, i.e. after another program wrote the entries.
    # memoryd_schema 4: columnsize=0, no row per entry in memoryd_fts_docsize (nothing
    # here ranks by length): one B-tree page less per write (see MEMORYD_MIGRATIONS).
    "CREATE VIRTUAL TABLE IF NOT EXISTS memoryd_fts USING fts5("
    "text, content='entries', content_rowid='rowid', tokenize='trigram', columnsize=0)",
    # ... and what memoryd knows of the entries without reading them all: their number and
    # each cell's usage (UTF-16 units), kept in step by memoryd's own writes in the same
    # transactions. A start counts the usage again (foreign.open_chain: the budgets are
    # enforced against it), and trusts the rest (no index rebuild, no tags scan) while
    # nobody else wrote: see ``trusted``.
    USAGE_TABLE,
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
    # memoryd_schema 5: the text index's mark (store.TEXT_MARK_KEY), which memoryd no longer
    # keeps: a store of schema 4 has every entry in the index.
    5: (),
    # memoryd_entries_rank ascending (see MEMORYD_TABLES)
    6: ("DROP INDEX IF EXISTS memoryd_entries_rank",),
    # snapshot texts stored once per digest: ``share_snapshot_texts`` moves the rows
    7: (),
    # the reference's definitions of its own tables and indexes: ``reference_ddl.adopt``
    8: (),
}

#: The first memoryd_schema whose memoryd kept a tail of the text index (store.TEXT_MARK_KEY).
TAIL_SCHEMA = 5
#: The first memoryd_schema whose stores hold the reference's DDL, not memoryd's own.
REFERENCE_DDL_SCHEMA = 8
#: the tables and columns without which a file is not a memory store at all
_REQUIRED_COLUMNS = {"meta": {"key", "value"}, "entries": {"id", "track", "scope", "text"}, "audit": {"seq", "action"}}


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
            raise store.os_fault(exc, path) from None
        if ro_mount:
            raise store.unavailable("readonly", path, "the store is read-only: its file system is mounted read-only")
        if what == "directory" and not os.access(p, os.X_OK):
            raise store.unavailable("readonly", path, f"the store is read-only: its directory {p} cannot be entered")
        if _no_write(p, st):
            raise store.unavailable("readonly", path,
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
        raise store.os_fault(exc, path) from None
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
            raise store.unavailable("io", path, f"the store cannot be read: {exc.strerror}") from None
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
        for table, cols in _REQUIRED_COLUMNS.items():
            if table not in tables:
                raise StoreCorrupt(f"store has no {table} table", details)
            have = {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}
            if not cols <= have:
                raise StoreCorrupt(f"store table {table} lacks columns {sorted(cols - have)}", details)
        if store.trusted(conn):
            # Nobody but memoryd wrote since its last run: its rows need no second reading.
            # The full checks below cost a pass over the whole file (a 100,000-entry store's
            # start would take them many times over).
            return version
        if version >= 4:
            for (raw,) in conn.execute("SELECT tags FROM entries"):
                if store.parse_tags(raw) is None:
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
    fault = store.store_fault(exc, path)
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
            store.set_meta(conn, "schema_version", str(target))
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
        if was is None or was < REFERENCE_DDL_SCHEMA:
            # None too: a store from before meta.memoryd_schema may hold an older memoryd's
            # DDL (one the reference made holds its own, and nothing changes)
            reference_ddl.adopt(conn)
        for sql in MEMORYD_TABLES:
            conn.execute(sql)
        # by its columns, not ``was``: a store memoryd never opened may hold an older
        # memoryd's snapshots table (one from before meta.memoryd_schema, say)
        share_snapshot_texts(conn)
        # Before the tail (memoryd_schema 5) every entry was indexed as written. A mark in
        # such a store: a memoryd of schema 4 or older wrote over a store of 5+, and never
        # indexed the tail it found above the mark.
        before_tail = was is not None and was < TAIL_SCHEMA
        if any("DROP TABLE IF EXISTS memoryd_fts" in step for step in steps) or (
                before_tail and store.text_mark(conn) is not None):
            # the counts and the ledger may be store.trusted (store.sync_text_index would not
            # rebuild); the index holds every entry now, and the mark goes
            conn.execute("INSERT INTO memoryd_fts (memoryd_fts) VALUES ('rebuild')")
            conn.execute("DELETE FROM meta WHERE key = ?", (store.TEXT_MARK_KEY,))
        store.set_meta(conn, "memoryd_schema", str(MEMORYD_SCHEMA_VERSION))


def share_snapshot_texts(conn: sqlite3.Connection) -> bool:
    """Turn a snapshots table of memoryd_schema 6 or older (each session's row holding its
    whole text) into the rows of 7: each distinct text once in memoryd_snapshot_texts, each
    session naming it by digest. Inside the caller's transaction; True when it did. The
    ledger rows stay as they are: ``named_digest`` reads an older row's text as its digest."""
    if "text" not in {r[1] for r in conn.execute("PRAGMA table_info(memoryd_snapshots)")}:
        return False
    conn.create_function("memoryd_sha256", 1, _sha256_hex, deterministic=True)
    conn.create_function("memoryd_utf8_bytes", 1, _utf8_bytes, deterministic=True)
    # the earliest session's created_at for each text: ORDER BY, and OR IGNORE the later ones
    conn.execute("INSERT OR IGNORE INTO memoryd_snapshot_texts (digest, bytes, text, created_at) "
                 "SELECT memoryd_sha256(text), memoryd_utf8_bytes(text), text, created_at FROM memoryd_snapshots "
                 "ORDER BY created_at, session_id")
    conn.execute("ALTER TABLE memoryd_snapshots RENAME TO memoryd_snapshots_unshared")
    conn.execute(SNAPSHOTS_TABLE)
    conn.execute("INSERT INTO memoryd_snapshots (session_id, digest, language, created_at) "
                 "SELECT session_id, memoryd_sha256(text), language, created_at FROM memoryd_snapshots_unshared")
    conn.execute("DROP TABLE memoryd_snapshots_unshared")
    return True


def _encoded(value: object) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


def _sha256_hex(value: object) -> str:
    """ledger.text_hash, for what SQLite hands a function (a BLOB, too, if one was written)."""
    return hashlib.sha256(_encoded(value)).hexdigest()


def _utf8_bytes(value: object) -> int:
    return len(_encoded(value))


def open_store(path: Path, version: int, busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS) -> sqlite3.Connection:
    """Open a store that ``inspect`` found at ``version`` for writing, migrating it forward.
    A store fault on the way (busy, full, read-only, I/O) is STORE_UNAVAILABLE."""
    try:
        conn = connect(path, busy_timeout_ms)
    except sqlite3.Error as exc:
        raise store.store_fault(exc, path) or exc from None
    try:
        # Every job runs in a savepoint, whose journal of the pages it changes goes to a
        # new temporary file (created, written and deleted) once it passes 64 KiB, as a
        # page of recalls does: kept in memory, it costs no system call. It holds one job's
        # changed pages at a time, which the caps on a job bound (an import's line and
        # entries, max_snapshot_bytes for a prune), or the store's own size for a rebuild
        # of the text index after another program's change.
        conn.execute("PRAGMA temp_store = MEMORY")
        migrate(conn, version)
        with atomic(conn):
            store.sync_text_index(conn)
    except sqlite3.Error as exc:
        conn.close()
        raise store.store_fault(exc, path) or exc from None
    except StoreCorrupt as exc:  # a row the upgrade to the reference's DDL cannot keep
        conn.close()
        exc.details.setdefault("path", str(path))
        raise
    except BaseException:
        conn.close()
        raise
    return conn


