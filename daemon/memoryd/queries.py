"""Queries: the plan of each (the trigram index's candidates, or a scan), the exact match
(LIKE, ASCII letters folded: the protocol's rule), and pages built from their candidates
only. Synchronous, on the connection the caller gives (the event loop's reader)."""

from __future__ import annotations

import sqlite3
from collections.abc import Collection
from typing import Any, Literal

from memoryd_protocol.types import Entry

from .store import ENTRY_COLUMNS, TEXT_MARK_SQL, row_to_entry

#: Below this many entries a query scans: the index would not pay for its extra statement.
INDEX_MIN_ENTRIES = 256
#: The index serves needles of at least this many code points (it holds trigrams).
INDEX_MIN_NEEDLE = 3
#: A needle whose candidates exceed this share of the store is common: scanning is cheaper.
COMMON_SHARE = 0.25

QueryPlan = Literal["auto", "scan", "index"]


def like_pattern(text: str) -> str:
    """``text`` as a LIKE pattern matching it anywhere, with ``\\``, ``%`` and ``_`` escaped.
    SQLite's LIKE folds ASCII letters only (no ICU here), exactly the protocol's rule, and
    costs about half of ``instr(lower(text), lower(?))``."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def fts_phrase(text: str) -> str:
    """``text`` as one FTS5 phrase (a substring, for the trigram tokenizer)."""
    return '"' + text.replace('"', '""') + '"'


#: The index plan's candidates: the index's matches, and every entry of its tail (above its
#: mark: in no index yet, see store.TEXT_MARK_KEY), a rowid range. One statement, so the
#: mark and the index are read at one moment (they move in one transaction). A store
#: without a mark has no tail. SQLite builds the list once and looks each rowid up
#: (tests/test_query_plans.py checks the plan: no scan of entries).
INDEX_CANDIDATES = ("rowid IN (SELECT rowid FROM memoryd_fts WHERE memoryd_fts MATCH ? UNION ALL "
                    f"SELECT rowid FROM entries WHERE rowid > {TEXT_MARK_SQL})")


def entry_count(conn: sqlite3.Connection) -> int:
    """The number of entries, from the counts memoryd keeps (no scan)."""
    (n,) = conn.execute("SELECT total(entries) FROM memoryd_usage").fetchone()
    return int(n)


def choose_plan(conn: sqlite3.Connection, text: str, entries: int) -> QueryPlan:
    """Scan or index, per query: the index for needles of 3+ code points in a store big
    enough, unless the needle is so common that its candidates (with the index's tail) are a
    large share of the store (counted up to that share only, so the probe stays cheap)."""
    if entries < INDEX_MIN_ENTRIES or len(text) < INDEX_MIN_NEEDLE:
        return "scan"
    cap = max(1, int(entries * COMMON_SHARE))
    (n,) = conn.execute("SELECT (SELECT count(*) FROM (SELECT 1 FROM memoryd_fts WHERE memoryd_fts MATCH ?1 "
                        f"LIMIT ?2)) + (SELECT count(*) FROM (SELECT 1 FROM entries WHERE rowid > {TEXT_MARK_SQL} "
                        "LIMIT ?2))", (fts_phrase(text), cap)).fetchone()
    return "scan" if n >= cap else "index"


def _filters(conn: sqlite3.Connection, track: str | None, scope: str | None, text: str | None,
             agent_key: str | None, workspace_key: str | None, plan: QueryPlan) -> tuple[str, list[Any], QueryPlan]:
    """The WHERE clause (with its leading ``WHERE``, or empty), its arguments, and the plan."""
    where: list[str] = []
    args: list[Any] = []
    if text:
        if plan == "auto":
            plan = choose_plan(conn, text, entry_count(conn))
        if plan == "index" and len(text) >= INDEX_MIN_NEEDLE:  # shorter needles hold no trigram
            where.append(INDEX_CANDIDATES)
            args.append(fts_phrase(text))
        where.append("text LIKE ? ESCAPE '\\'")
        args.append(like_pattern(text))
    if track is not None:
        where.append("track = ?")
        args.append(track)
    if scope is not None:
        where.append("scope = ?")
        args.append(scope)
    if agent_key is not None:
        where.append("agent_key IN ('', ?)")
        args.append(agent_key)
    if workspace_key is not None:
        where.append("(scope = 'user-global' OR workspace_key = ?)")
        args.append(workspace_key)
    return (" WHERE " + " AND ".join(where)) if where else "", args, plan


RANK_ORDER = " ORDER BY recall_count DESC, updated_at DESC, id"


def query(
    conn: sqlite3.Connection,
    *,
    track: str | None,
    scope: str | None,
    text: str | None,
    agent_key: str | None,
    workspace_key: str | None,
    plan: QueryPlan = "auto",
) -> list[Entry]:
    """All hits in rank order. A text matches as a substring with ASCII letters folded (the
    protocol's rule): LIKE does exactly that. With an index plan, the trigram index gives the
    candidates (a superset: it folds more than ASCII) and the same LIKE keeps the exact hits,
    so both plans return the same rows (tests/test_query_plans.py compares them)."""
    where, args, _ = _filters(conn, track, scope, text, agent_key, workspace_key, plan)
    return [row_to_entry(r) for r in conn.execute(f"SELECT {ENTRY_COLUMNS} FROM entries{where}{RANK_ORDER}",
                                                  args).fetchall()]


def query_page(
    conn: sqlite3.Connection,
    *,
    track: str | None,
    scope: str | None,
    text: str | None,
    agent_key: str | None,
    workspace_key: str | None,
    limit: int,
    boosted: Collection[str] = (),
) -> tuple[list[Entry], int]:
    """What a page of ``limit`` hits can come from, and the number of all hits: the first
    ``limit + len(boosted)`` hits by stored rank, and the hits among ``boosted`` (entries
    whose queued recalls may lift them; the caller ranks again). Any other hit has at least
    ``limit`` hits ahead of it that no recall can overtake, so it is on no page. Rows are
    built for these only: a query costs in proportion to its page, not to the store (apart
    from matching itself, which a text without the index plan scans for)."""
    where, args, plan = _filters(conn, track, scope, text, agent_key, workspace_key, "auto")
    take = limit + len(boosted)
    if text and plan == "index":
        # Few hits: match once, keeping only what ranks a hit, then build the rows of the
        # page's candidates. (A scanned text is counted in C, and its page walks the rank
        # index until it is full: below.)
        keys = conn.execute(f"SELECT rowid, id FROM entries{where}{RANK_ORDER}", args).fetchall()
        chosen = [k[0] for k in keys[:take]]
        if boosted:
            lifted = set(boosted)
            chosen.extend(k[0] for k in keys[take:] if k[1] in lifted)
        rows = _rows_in(conn, "rowid", chosen, "", [])
        return sorted((row_to_entry(r) for r in rows), key=rank), len(keys)
    if not text and agent_key is None and workspace_key is None:
        # Counted by the kept counts per cell, not by reading the entries.
        (total,) = conn.execute("SELECT total(entries) FROM memoryd_usage WHERE (?1 IS NULL OR track = ?1) AND "
                                "(?2 IS NULL OR scope = ?2)", (track, scope)).fetchone()
    else:
        (total,) = conn.execute(f"SELECT count(*) FROM entries{where}", args).fetchone()
    rows = conn.execute(f"SELECT {ENTRY_COLUMNS} FROM entries{where}{RANK_ORDER} LIMIT ?", [*args, take]).fetchall()
    entries = [row_to_entry(r) for r in rows]
    if boosted and total > len(entries):
        have = {e.id for e in entries}
        missing = [i for i in boosted if i not in have]
        if missing:
            entries.extend(row_to_entry(r) for r in _rows_in(conn, "id", missing, where, args))
    return entries, int(total)


#: Host parameters per statement, well below SQLite's limit (32,766 since 3.32).
_CHUNK = 2000


def _rows_in(conn: sqlite3.Connection, column: str, values: list[Any], where: str, args: list[Any]) -> list[Any]:
    """The entry rows whose ``column`` is one of ``values`` (and that meet ``where``)."""
    joiner = " AND " if where else " WHERE "
    rows: list[Any] = []
    for at in range(0, len(values), _CHUNK):
        part = values[at:at + _CHUNK]
        marks = ", ".join("?" * len(part))
        rows += conn.execute(f"SELECT {ENTRY_COLUMNS} FROM entries{where}{joiner}{column} IN ({marks})",
                             [*args, *part]).fetchall()
    return rows


def rank(e: Entry) -> tuple[int, int, str]:
    """``query``'s ORDER BY as a sort key: for hits whose counts changed after the read."""
    return (-e.recall_count, -e.updated_at, e.id)
