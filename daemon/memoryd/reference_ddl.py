"""The reference's DDL, text for text, and the upgrade of a store an older memoryd made.

dsh-memento 0.4.4 (``lib/store.mjs``) creates and migrates its store with four scripts;
memoryd runs the same statements, so that either program's store holds the same
definitions (SQLite keeps each CREATE statement's text, whitespace included, as the
object's definition). memoryd_schema 7 and older ran DDL of their own: no CHECKs on the
entries' track and scope, no default or CHECK on a proposal's status, and no ``audit_ts``
or ``proposals_status`` index. :func:`adopt` gives such a store the reference's.
"""

from __future__ import annotations

import contextlib
import sqlite3
from functools import cache

from memoryd_protocol.errors import StoreCorrupt

# The reference's BASE_SCHEMA_SQL, PROPOSALS_SCHEMA_SQL, V3_SCHEMA_SQL and V4_SCHEMA_SQL, as
# written there (tests/fixtures/reference/store-ddl.sql holds the copy a test compares).
_SCRIPTS = {
    1: """
  CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
  CREATE TABLE entries (
    id TEXT PRIMARY KEY,
    track TEXT NOT NULL CHECK (track IN ('user', 'agent')),
    scope TEXT NOT NULL CHECK (scope IN ('user-global', 'workspace')),
    workspace_key TEXT NOT NULL DEFAULT '',
    text TEXT NOT NULL,
    source TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    session_id TEXT
  );
  CREATE INDEX entries_track_scope ON entries (track, scope);
  CREATE TABLE audit (
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
  );
  CREATE INDEX audit_ts ON audit (ts);
""",
    2: """
  CREATE TABLE proposals (
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    track TEXT NOT NULL,
    scope TEXT NOT NULL,
    workspace_key TEXT NOT NULL DEFAULT '',
    text TEXT NOT NULL,
    source TEXT NOT NULL,
    session_id TEXT,
    status TEXT NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'approved', 'dismissed')),
    created_at INTEGER NOT NULL,
    decided_at INTEGER,
    UNIQUE (session_id, kind)
  );
  CREATE INDEX proposals_status ON proposals (status);
""",
    3: """
  ALTER TABLE entries ADD COLUMN agent_key TEXT NOT NULL DEFAULT '';
  ALTER TABLE entries ADD COLUMN last_recalled INTEGER;
  ALTER TABLE entries ADD COLUMN recall_count INTEGER NOT NULL DEFAULT 0;
  ALTER TABLE proposals ADD COLUMN agent_key TEXT NOT NULL DEFAULT '';
""",
    4: """
  ALTER TABLE entries ADD COLUMN tags TEXT NOT NULL DEFAULT '[]';
  ALTER TABLE entries ADD COLUMN version INTEGER NOT NULL DEFAULT 1;
""",
}

#: Step n creates the reference's schema n from n-1 (0 = empty file): its script's statements.
MIGRATIONS: dict[int, tuple[str, ...]] = {
    n: tuple(s.strip() for s in script.split(";") if s.strip()) for n, script in _SCRIPTS.items()}

#: The first row of each rebuilt table that the reference's CHECKs refuse, and how the error
#: names it: the copy would fail on it, so it is named first (its id and layer; never its text).
_REFUSED = {
    "entries": ("SELECT id, track, scope FROM entries WHERE NOT (track IN ('user', 'agent')) "
                "OR NOT (scope IN ('user-global', 'workspace')) ORDER BY rowid LIMIT 1",
                "store entry {0} has track {1!r} and scope {2!r}"),
    "proposals": ("SELECT id, status FROM proposals WHERE NOT (status IN ('pending', 'approved', 'dismissed')) "
                  "ORDER BY rowid LIMIT 1", "store proposal {0} has status {1!r}"),
}
#: The tables an older memoryd defined otherwise, rebuilt in this order: audit's definition
#: differed in whitespace only, but SQLite keeps the text, and the store is the reference's
#: text for text.
_REBUILT = ("entries", "proposals", "audit")
#: what a table is renamed to while its rows move into the reference's definition
_MOVING = "memoryd_rebuilding"


@cache
def _reference() -> tuple[dict[str, str], dict[str, list[tuple[str, str, int, int]]]]:
    """Each table's and index's definition as the reference's migrations leave it (the
    tables' ALTER-added columns spliced in by SQLite, as in every store it migrated), and
    the columns of the two tables :func:`adopt` rebuilds."""
    with contextlib.closing(sqlite3.connect(":memory:", isolation_level=None)) as conn:
        for n in sorted(MIGRATIONS):
            for sql in MIGRATIONS[n]:
                conn.execute(sql)
        return ({str(name): str(sql) for name, sql in conn.execute(
                    "SELECT name, sql FROM sqlite_master WHERE sql IS NOT NULL")},
                {table: _columns(conn, table) for table in _REBUILT})


def _columns(conn: sqlite3.Connection, table: str) -> list[tuple[str, str, int, int]]:
    """name, declared type, not null, primary key: what a rebuild must keep (the defaults and
    the constraints are what it changes)."""
    return [(str(name), str(kind).upper(), int(notnull), int(pk)) for _, name, kind, notnull, _, pk
            in conn.execute("SELECT * FROM pragma_table_info(?)", (table,))]


def adopt(conn: sqlite3.Connection) -> None:
    """Give a store the reference's definitions where an older memoryd made its own: the
    indexes it lacks, and ``entries``, ``proposals`` and ``audit`` rebuilt (SQLite's procedure
    for a change ALTER TABLE cannot make) when their columns are the reference's and only the
    text, defaults and constraints differ. Every row keeps its rowid and every value, so the text
    index and the ledger's replay still match them. Inside the caller's transaction.

    A table with columns of another program's is left as it is (the schema check names it).
    Raises StoreCorrupt for a row that the reference's CHECKs refuse."""
    want, columns = _reference()
    have = {str(name): str(sql or "") for name, sql in conn.execute("SELECT name, sql FROM sqlite_master")}
    for table in _REBUILT:
        if table in have and have[table] != want[table] and _columns(conn, table) == columns[table]:
            _rebuild(conn, table, want[table])
    for name, sql in want.items():
        if name not in have and sql.startswith("CREATE INDEX"):
            conn.execute(sql)


def _rebuild(conn: sqlite3.Connection, table: str, definition: str) -> None:
    if table in _REFUSED:
        query, named = _REFUSED[table]
        refused = conn.execute(query).fetchone()
        if refused is not None:
            raise StoreCorrupt(named.format(*refused) + ", which dsh-memento's schema does not allow: correct or "
                               "delete it (sqlite3 can), then start memoryd again")
    columns = ", ".join(f'"{name}"' for name, *_ in _columns(conn, table))
    # the table's indexes and triggers go with it: made again from their own text afterwards
    kept = [str(sql) for (sql,) in conn.execute(
        "SELECT sql FROM sqlite_master WHERE tbl_name = ? AND type IN ('index', 'trigger') AND sql IS NOT NULL "
        "ORDER BY rowid", (table,))]
    # an AUTOINCREMENT table's high-water mark, which dropping the renamed table takes along:
    # put back as it was, in its own row
    sequence = conn.execute("SELECT rowid, seq FROM sqlite_sequence WHERE name = ?", (table,)).fetchone() if (
        conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'sqlite_sequence'").fetchone()) else None
    # legacy: the rename leaves views and other triggers naming the table as they are, so
    # they name the new one once it has the old name
    (legacy,) = conn.execute("PRAGMA legacy_alter_table").fetchone()
    conn.execute("PRAGMA legacy_alter_table = ON")
    try:
        conn.execute(f'ALTER TABLE "{table}" RENAME TO {_MOVING}')
        conn.execute(definition)
        conn.execute(f'INSERT INTO "{table}" (rowid, {columns}) SELECT rowid, {columns} FROM {_MOVING}')
        conn.execute(f"DROP TABLE {_MOVING}")
    finally:
        conn.execute(f"PRAGMA legacy_alter_table = {int(legacy)}")
    if sequence is not None:
        conn.execute("DELETE FROM sqlite_sequence WHERE name = ?", (table,))
        conn.execute("INSERT INTO sqlite_sequence (rowid, name, seq) VALUES (?, ?, ?)", (sequence[0], table, sequence[1]))
    for sql in kept:
        conn.execute(sql)
