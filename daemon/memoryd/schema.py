"""The store's schema as memoryd makes it, and what another program added to it or changed.

A trigger runs inside memoryd's own transaction and can rewrite each write after memoryd
made it; a view, index, table or column can change what a statement does or reads. SQLite
moves ``PRAGMA schema_version`` with every change of the schema, so the writer compares it
before each batch (foreign.Watch) and only when it moved reads ``sqlite_master`` here,
against a store built in memory from memoryd's own DDL (storefile's migrations).

Each difference is an item naming the object and the sha256 of its definition, so that one
accepted and then changed again is a change again. A dropped object is not one: memoryd
creates its usage table again, and its writes fail on any other.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import sqlite3
from functools import cache

import msgspec
from memoryd_protocol import ledger as fmt

from . import storefile

#: the ref of a ``foreign`` row that names schema items, so that finding them is one
#: lookup of the ledger's ref index
REF = "schema"
#: ANALYZE's statistics: they change query plans, never what a statement writes
_STATISTICS = frozenset({"sqlite_stat1", "sqlite_stat2", "sqlite_stat3", "sqlite_stat4"})
#: Litestream's bookkeeping tables ([replicate]) as it creates them, which no statement of
#: memoryd's reads or writes; under another definition, or with an index or trigger, a change
_LITESTREAM = {("table", "_litestream_seq"): "CREATE TABLE _litestream_seq (id INTEGER PRIMARY KEY, seq INTEGER)",
               ("table", "_litestream_lock"): "CREATE TABLE _litestream_lock (id INTEGER)"}
#: a table's columns: name → (declared type, not null, default, primary key position)
Columns = dict[str, tuple[str, int, "str | None", int]]
#: a string literal, or an identifier quoted in any of SQLite's three ways (its name in a group)
_QUOTED = re.compile(r"'(?:[^']|'')*'|\"((?:[^\"]|\"\")*)\"|`((?:[^`]|``)*)`|\[([^\]]*)\]")
_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _columns(conn: sqlite3.Connection, table: str) -> Columns:
    # table_xinfo: table_info leaves out a generated column; one says so (hidden), so that
    # the columns of memoryd's own DDL keep the digests they were accepted under
    return {str(name): (str(kind).upper(), int(notnull), dflt, int(pk), *((int(hidden),) if hidden else ()))
            for _, name, kind, notnull, dflt, pk, hidden
            in conn.execute("SELECT * FROM pragma_table_xinfo(?)", (table,))}


def _objects(conn: sqlite3.Connection) -> dict[tuple[str, str], tuple[str, str, Columns]]:
    """(type, name) → (table, definition with its whitespace collapsed, columns of a table)."""
    found = {}
    for kind, name, table, sql in conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master"):
        if name in _STATISTICS:
            continue
        definition = " ".join(str(sql or "").split())
        if _LITESTREAM.get((str(kind), str(name))) == definition:
            continue
        plain = kind == "table" and not definition.upper().startswith("CREATE VIRTUAL")
        found[(str(kind), str(name))] = (str(table), definition, _columns(conn, name) if plain else {})
    return found


def _unquoted(definition: str) -> str:
    """The definition with each quoted identifier that is a plain word unquoted: ALTER TABLE
    RENAME writes the table's name quoted into each of its indexes and triggers, renamed back
    or not, and they name the same table as before."""
    def plain(m: re.Match[str]) -> str:
        name = next((g for g in m.groups() if g is not None), None)
        return name if name is not None and _PLAIN.fullmatch(name) else m.group(0)
    return _QUOTED.sub(plain, definition)


@cache
def _expected() -> dict[tuple[str, str], tuple[str, str, Columns]]:
    with contextlib.closing(sqlite3.connect(":memory:", isolation_level=None)) as conn:
        storefile.migrate(conn, 0)
        return _objects(conn)


def _digest(*parts: object) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def changes(conn: sqlite3.Connection) -> list[str]:
    """Each object or column the store has and memoryd's schema has not, or has otherwise:
    ``"trigger t on entries (sha256:…)"``, ``"column entries.c (sha256:…)"``, ``"index i on
    entries changed (sha256:…)"``."""
    want, items = _expected(), []
    for (kind, name), (table, definition, columns) in sorted(_objects(conn).items()):
        what = f"{kind} {name}" + (f" on {table}" if kind in ("trigger", "index") else "")
        expected = want.get((kind, name))
        if expected is None:
            items.append(f"{what} (sha256:{_digest(definition)})")
        elif (columns or expected[2]) and columns != expected[2]:
            for col in sorted(columns):
                if col not in expected[2]:
                    items.append(f"column {name}.{col} (sha256:{_digest(columns[col])})")
                elif columns[col] != expected[2][col]:
                    items.append(f"column {name}.{col} changed (sha256:{_digest(columns[col])})")
        elif _unquoted(definition) != _unquoted(expected[1]) or table != expected[0]:
            # the same columns under another constraint (ON CONFLICT REPLACE, a UNIQUE, a
            # CHECK): a table rebuilt with it changes what memoryd's own statements do
            items.append(f"{what} changed (sha256:{_digest(table, definition)})")
    return items


def named(item: str) -> str:
    """An item without its digest: what a log line or an error names."""
    return item.split(" (sha256:", 1)[0]


def unaccepted(conn: sqlite3.Connection) -> list[tuple[str, int | None]]:
    """Each of :func:`changes` that no accepted ``foreign`` row names, with the row that
    recorded it (None: none yet)."""
    items = changes(conn)
    if not items:
        return []
    recorded: dict[str, int] = {}
    for n, body in conn.execute("SELECT n, body FROM memoryd_ledger WHERE kind = 'foreign' AND ref = ? ORDER BY n",
                                (REF,)):
        try:
            for item in msgspec.json.decode(body, type=fmt.ForeignBody).schema:
                recorded.setdefault(item, int(n))
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue  # audit verify reports the row
    rows = sorted(set(recorded.values()))
    accepted = {int(ref) for (ref,) in conn.execute(
        f"SELECT ref FROM memoryd_ledger WHERE kind = 'accepted' AND ref IN ({','.join('?' * len(rows))})",
        [str(n) for n in rows])} if rows else set()
    return [(item, recorded.get(item)) for item in items if recorded.get(item) not in accepted]
