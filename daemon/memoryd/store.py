"""The SQL of every operation on the store, and its faults (storefile.py has its layout and
opening). Synchronous: each function runs inside a transaction its caller opened, on the
caller's connection; a write takes the transaction's :class:`~memoryd.tx.Tx`.
"""

from __future__ import annotations

import errno
import json
import sqlite3
import time
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import msgspec
from memoryd_protocol import ledger as ledger_format
from memoryd_protocol import text_index
from memoryd_protocol.constants import (
    GRID,
    StoreFault,
)
from memoryd_protocol.errors import StoreCorrupt, StoreUnavailable
from memoryd_protocol.text import utf16_len
from memoryd_protocol.types import Entry, Proposal

from .tx import Tx

ENTRY_COLUMNS = (
    "id, track, scope, workspace_key, text, source, created_at, updated_at, session_id, "
    "agent_key, last_recalled, recall_count, tags, version"
)
PROPOSAL_COLUMNS = ledger_format.PROPOSAL_COLUMNS

#: The ``meta`` row of the text index's mark, which memoryd_schema 5 to 8 stores of an
#: earlier memoryd may hold: the entries above that rowid (its tail) were in no index yet.
#: Every write now indexes its entry in its own transaction, so a start indexes such a tail
#: and deletes the row (``sync_text_index``); a store without it has every entry indexed,
#: which is also how an earlier memoryd reads it.
TEXT_MARK_KEY = text_index.MARK_KEY

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


# --- rows --------------------------------------------------------------------------------


_tags_decoder = msgspec.json.Decoder(list[str])


def parse_tags(raw: Any) -> list[str] | None:
    """The tags column (JSON array of strings); None when it is anything else."""
    if raw is None:
        return []
    try:
        return _tags_decoder.decode(raw)
    except (msgspec.DecodeError, TypeError):
        return None


def dump_tags(tags: Iterable[str]) -> str:
    return json.dumps(list(tags), ensure_ascii=False, separators=(",", ":"))


def workspace_key_of(scope: str, column: str | None) -> str:
    """An entry's or a proposal's workspaceKey as memoryd reads its column. dsh-memento stores
    the writing session's cwd on user-global rows too; the wire's user-global entry has
    none, so a store it wrote reads (and is rewritten) with ''."""
    return "" if scope == "user-global" else column or ""


def row_to_entry(row: Sequence[Any]) -> Entry:
    tags = parse_tags(row[12])
    if tags is None:
        raise StoreCorrupt("an entry's tags column is not a JSON array of strings", {"entryId": row[0]})
    return Entry(
        id=row[0],
        track=row[1],
        scope=row[2],
        workspace_key=workspace_key_of(row[2], row[3]),
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
    proposal.workspace_key = workspace_key_of(proposal.scope, proposal.workspace_key)
    return proposal


# --- reads -------------------------------------------------------------------------------


LIST_ENTRIES_SQL = f"SELECT {ENTRY_COLUMNS} FROM entries ORDER BY created_at, rowid"
#: newest first, in ledger_format.SELECT_AUDIT's columns (for ``audit_from``); one parameter, the limit
AUDIT_LIST_SQL = ledger_format.SELECT_AUDIT + " DESC LIMIT ?"


def list_entries(conn: sqlite3.Connection) -> list[Entry]:
    return [row_to_entry(r) for r in conn.execute(LIST_ENTRIES_SQL).fetchall()]


def visible_texts(conn: sqlite3.Connection, agent_key: str, workspace_key: str) -> list[tuple[str, str, str]]:
    """``(track, scope, text)`` of every entry a session of ``agent_key`` in ``workspace_key``
    sees (``SessionView.sees``: its agent's or every agent's, user-global or its workspace's),
    in creation order: what its snapshot renders from, without making an Entry of each row."""
    return conn.execute("SELECT track, scope, text FROM entries WHERE agent_key IN ('', ?) "
                        "AND (scope = 'user-global' OR workspace_key = ?) ORDER BY created_at, rowid",
                        (agent_key, workspace_key)).fetchall()


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
    """At start: unless the store is ``trusted``, rebuild the text index from the entries
    (foreign.open_chain counts them again, and records why); a trusted store's tail (an
    earlier memoryd's, see TEXT_MARK_KEY) is indexed. Either way the mark goes. True when it
    rebuilt. Runs in the caller's transaction; a store with neither writes nothing."""
    rebuild = not trusted(conn)
    if rebuild:
        conn.execute("INSERT INTO memoryd_fts (memoryd_fts) VALUES ('rebuild')")
    mark = text_mark(conn)
    if mark is not None:
        if not rebuild:
            conn.execute("INSERT INTO memoryd_fts (rowid, text) SELECT rowid, text FROM entries WHERE rowid > ?",
                         (mark,))
        conn.execute("DELETE FROM meta WHERE key = ?", (TEXT_MARK_KEY,))
    return rebuild


def stored_usage(conn: sqlite3.Connection) -> dict[tuple[str, str], int]:
    """Usage per track × scope as memoryd keeps it (valid once foreign.open_chain ran)."""
    used: dict[tuple[str, str], int] = dict.fromkeys(GRID, 0)
    for track, scope, n in conn.execute("SELECT track, scope, used FROM memoryd_usage"):
        used[(track, scope)] = int(n)
    return used


def proposals(conn: sqlite3.Connection, status: str | None) -> list[Proposal]:
    if status is None:
        rows = conn.execute(f"SELECT {PROPOSAL_COLUMNS} FROM proposals ORDER BY created_at, rowid").fetchall()
    else:
        # its own statement: ``?1 IS NULL OR status = ?1`` would scan past the status index
        rows = conn.execute(
            f"SELECT {PROPOSAL_COLUMNS} FROM proposals WHERE status = ? ORDER BY created_at, rowid", (status,)
        ).fetchall()
    return [row_to_proposal(r) for r in rows]


def get_proposal(conn: sqlite3.Connection, proposal_id: str) -> Proposal | None:
    row = conn.execute(f"SELECT {PROPOSAL_COLUMNS} FROM proposals WHERE id = ?", (proposal_id,)).fetchone()
    return row_to_proposal(row) if row else None


def frozen_snapshot(conn: sqlite3.Connection, session_id: str) -> tuple[str, str | None] | None:
    """The session's frozen snapshot as ``(digest, text)``, the text None when the store no
    longer holds it; None when the session has none."""
    row = conn.execute("SELECT s.digest, t.text FROM memoryd_snapshots AS s LEFT JOIN memoryd_snapshot_texts AS t "
                       "ON t.digest = s.digest WHERE s.session_id = ?", (session_id,)).fetchone()
    return None if row is None else (str(row[0]), row[1])


def snapshot_text_matches(conn: sqlite3.Connection, digest: str, text: str) -> bool | None:
    """Whether the text stored under ``digest`` is ``text`` (compared in SQLite, without
    reading it out); None when none is stored."""
    row = conn.execute("SELECT text = ? FROM memoryd_snapshot_texts WHERE digest = ?", (text, digest)).fetchone()
    return None if row is None else bool(row[0])


def snapshot_totals(conn: sqlite3.Connection) -> tuple[int, int]:
    """The frozen snapshots the store holds, and the UTF-8 bytes of their distinct texts:
    what max_snapshots and max_snapshot_bytes cap."""
    sessions, size = conn.execute("SELECT (SELECT count(*) FROM memoryd_snapshots), "
                                  "(SELECT coalesce(sum(bytes), 0) FROM memoryd_snapshot_texts)").fetchone()
    return int(sessions), int(size)


# --- writes (inside the writer's transaction) --------------------------------------------


def text_mark(conn: sqlite3.Connection) -> int | None:
    """The text index's mark (TEXT_MARK_KEY); None in a store without one."""
    row = conn.execute("SELECT CAST(value AS INTEGER) FROM meta WHERE key = ?", (TEXT_MARK_KEY,)).fetchone()
    return None if row is None or row[0] is None else int(row[0])


def set_meta(conn: sqlite3.Connection, key: str, value: str) -> None:
    """Write one row of ``meta``, the key/value table both programs keep."""
    conn.execute("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                 (key, value))


def _unindex(tx: Tx, entry_id: str) -> int | None:
    """Take the entry out of the text index and the counts; its rowid (None: no such entry).
    An entry this transaction indexed is in no index yet: it leaves ``tx.index_rows``. Any other
    is the index's with its text as stored, which FTS5's 'delete' needs (external content)."""
    row = tx.conn.execute("SELECT rowid, text, track, scope FROM entries WHERE id = ?", (entry_id,)).fetchone()
    if row is None:
        return None
    rowid, text, track, scope = row
    if tx.index_rows.pop(rowid, None) is None:
        tx.unindex_rows[rowid] = text
    _count(tx, track, scope, -1, -utf16_len(text))
    return int(rowid)


def _index(tx: Tx, rowid: int, e: Entry) -> None:
    tx.index_rows[rowid] = e.text
    _count(tx, e.track, e.scope, 1, utf16_len(e.text))


_COUNT_SQL = ("INSERT INTO memoryd_usage (track, scope, entries, used) VALUES (?, ?, ?, ?) "
              "ON CONFLICT (track, scope) DO UPDATE SET entries = entries + excluded.entries, "
              "used = used + excluded.used")


def _count(tx: Tx, track: str, scope: str, entries: int, used: int) -> None:
    """Counted in the transaction, written once per cell by ``flush``: one statement per
    batch, not one per write."""
    n, u = tx.counts.get((track, scope), (0, 0))
    tx.counts[(track, scope)] = (n + entries, u + used)


def flush(tx: Tx) -> None:
    """Write what the transaction has gathered, before its COMMIT: the counts, added to
    memoryd_usage, and the text index's rows of the entries it wrote. Gathered, not written
    by each write: FTS5 writes its pending rows as a new segment at every savepoint (each
    job of a batch has one), and a batch's rows written together are one segment. One row
    of VALUES a statement, as a statement that may write several rows opens a savepoint."""
    counts = [(t, s, n, u) for (t, s), (n, u) in tx.counts.items() if n or u]
    tx.counts = {}
    if counts:
        tx.conn.executemany(_COUNT_SQL, counts)
    if tx.unindex_rows:
        tx.conn.executemany("INSERT INTO memoryd_fts (memoryd_fts, rowid, text) VALUES ('delete', ?, ?)",
                            tx.unindex_rows.items())
        tx.unindex_rows = {}
    if tx.index_rows:
        tx.conn.executemany("INSERT INTO memoryd_fts (rowid, text) VALUES (?, ?)", tx.index_rows.items())
        tx.index_rows = {}


def insert_entry(tx: Tx, e: Entry) -> None:
    cur = tx.conn.execute(
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
    _index(tx, cur.lastrowid, e)


def update_entry(tx: Tx, e: Entry) -> None:
    rowid = _unindex(tx, e.id)
    tx.conn.execute(
        "UPDATE entries SET text = ?, source = ?, updated_at = ?, session_id = ?, tags = ?, version = ?, "
        "workspace_key = ? WHERE id = ?",
        (e.text, e.source, e.updated_at, e.session_id, dump_tags(e.tags), e.version, e.workspace_key, e.id),
    )
    if rowid is not None:
        _index(tx, rowid, e)


def delete_entry(tx: Tx, entry_id: str) -> None:
    _unindex(tx, entry_id)
    tx.conn.execute("DELETE FROM entries WHERE id = ?", (entry_id,))


def recall(conn: sqlite3.Connection, ids: list[str], ts: int) -> dict[str, int]:
    """The entries of ``ids`` (a page's) recalled once more at ``ts``: their recall counts
    now. An entry removed since the page was read is not among them."""
    marks = ", ".join("?" * len(ids))
    return dict(conn.execute(f"UPDATE entries SET recall_count = recall_count + 1, last_recalled = ? "
                             f"WHERE id IN ({marks}) RETURNING id, recall_count", [ts, *ids]).fetchall())


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
    # each of the columns is named as the Proposal's attribute it stores
    names = PROPOSAL_COLUMNS.split(", ")
    conn.execute(f"INSERT INTO proposals ({PROPOSAL_COLUMNS}) VALUES ({', '.join('?' * len(names))})",
                 [getattr(p, name) for name in names])


def decide_proposal(conn: sqlite3.Connection, proposal_id: str, status: str, ts: int) -> bool:
    """Pending → ``status``; False when it was not pending (someone else decided first)."""
    # A decision stores a user-global proposal's workspace as memoryd reads it ('') so that
    # the row the ledger records of it is the row the store holds.
    cur = conn.execute(
        "UPDATE proposals SET status = ?, decided_at = ?, "
        "workspace_key = CASE WHEN scope = 'user-global' THEN '' ELSE workspace_key END "
        "WHERE id = ? AND status = 'pending'",
        (status, ts, proposal_id),
    )
    return cur.rowcount == 1


def prune_snapshots(conn: sqlite3.Connection, held: frozenset[str], before: int | None) -> tuple[list[str], int, int]:
    """Delete the frozen snapshots of the sessions not in ``held`` (frozen before ``before``,
    when given), oldest first, and the texts that only they named: ``(sessions, texts,
    bytes)``. A text no session named before stays (verify reports it if it was planted)."""
    where, args = ("WHERE created_at < ? ", (before,)) if before is not None else ("", ())
    found = conn.execute(f"SELECT session_id, digest FROM memoryd_snapshots {where}ORDER BY created_at, session_id",
                         args).fetchall()
    gone = [(str(sid), str(digest)) for sid, digest in found if sid not in held]
    conn.executemany("DELETE FROM memoryd_snapshots WHERE session_id = ?", [(sid,) for sid, _ in gone])
    texts = size = 0
    for digest in sorted({digest for _, digest in gone}):
        if conn.execute("SELECT 1 FROM memoryd_snapshots WHERE digest = ? LIMIT 1", (digest,)).fetchone() is None:
            row = conn.execute("DELETE FROM memoryd_snapshot_texts WHERE digest = ? RETURNING bytes",
                               (digest,)).fetchone()
            if row is not None:
                texts, size = texts + 1, size + int(row[0])
    return [sid for sid, _ in gone], texts, size


def freeze_snapshot(conn: sqlite3.Connection, session_id: str, digest: str, language: str, ts: int,
                    new_text: str | None = None) -> None:
    """Freeze the session's snapshot (it has none yet) as the text of ``digest``; ``new_text``:
    that text, when the store does not hold it yet (the caller checked)."""
    if new_text is not None:
        conn.execute("INSERT INTO memoryd_snapshot_texts (digest, bytes, text, created_at) VALUES (?, ?, ?, ?)",
                     (digest, len(new_text.encode()), new_text, ts))
    conn.execute("INSERT INTO memoryd_snapshots (session_id, digest, language, created_at) VALUES (?, ?, ?, ?)",
                 (session_id, digest, language, ts))
