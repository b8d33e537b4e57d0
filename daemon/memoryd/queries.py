"""Queries: the plan of each (the trigram index's candidates, or a scan), the exact match
(LIKE, ASCII letters folded: the protocol's rule), and pages built from their candidates
only. Synchronous, inside the read transaction of the reader that runs it (readers.py)."""

from __future__ import annotations

import sqlite3
from typing import Any, Literal

from memoryd_protocol.types import Entry

from .store import ENTRY_COLUMNS, row_to_entry

#: Below this many entries a query scans: the index would not pay for its extra statement.
INDEX_MIN_ENTRIES = 256
#: The index serves needles of at least this many code points (it holds trigrams).
INDEX_MIN_NEEDLE = 3
#: A needle whose candidates exceed this share of the store is common: scanning is cheaper.
COMMON_SHARE = 0.25

QueryPlan = Literal["auto", "scan", "index"]


def like_pattern(text: str) -> str:
    """``text`` as a LIKE pattern matching it anywhere, with ``\\``, ``%`` and ``_`` escaped.
    SQLite's LIKE folds ASCII letters only (no ICU here), exactly the protocol's rule."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


#: LIKE reads its pattern, and FTS5 its query, only up to a NUL (JSON's ``\\u0000``), so a
#: needle with one is matched by a scan with ``instr(lower(text), lower(?))`` (the same
#: ASCII-only folding): a needle nobody types, on no hot path.
NUL = "\x00"


def fts_phrase(text: str) -> str:
    """``text`` as one FTS5 phrase (a substring, for the trigram tokenizer)."""
    return '"' + text.replace('"', '""') + '"'


def fts_match(text: str) -> str:
    """The index's query for a needle of 3+ code points: its trigrams every third from the
    first, and its last, ANDed (together they cover each of its code points). An entry that
    holds the needle holds each of them, so the matches are a superset of the hits, as the
    needle's phrase gives; FTS5 reads fewer doclists for them and compares no positions."""
    grams = [text[i:i + 3] for i in range(0, len(text) - 2, 3)] + [text[-3:]]
    return " AND ".join(fts_phrase(g) for g in dict.fromkeys(grams))


#: The index plan's candidates: the index's matches.
INDEX_CANDIDATES = "rowid IN (SELECT rowid FROM memoryd_fts WHERE memoryd_fts MATCH ?)"


def entry_count(conn: sqlite3.Connection) -> int:
    """The number of entries, from the counts memoryd keeps (no scan)."""
    (n,) = conn.execute("SELECT total(entries) FROM memoryd_usage").fetchone()
    return int(n)


def choose_plan(conn: sqlite3.Connection, text: str) -> QueryPlan:
    """Scan or index, per query: the index for needles of 3+ code points in a store big
    enough, unless the needle is so common that its candidates are a large share of the
    store (counted up to that share only, so the probe stays cheap)."""
    if len(text) < INDEX_MIN_NEEDLE or NUL in text:
        return "scan"
    entries = entry_count(conn)
    if entries < INDEX_MIN_ENTRIES:
        return "scan"
    cap = max(1, int(entries * COMMON_SHARE))
    (n,) = conn.execute("SELECT count(*) FROM (SELECT 1 FROM memoryd_fts WHERE memoryd_fts MATCH ? LIMIT ?)",
                        (fts_match(text), cap)).fetchone()
    return "scan" if n >= cap else "index"


def _filters(conn: sqlite3.Connection, track: str | None, scope: str | None, text: str | None,
             agent_key: str | None, workspace_key: str | None, plan: QueryPlan) -> tuple[str, list[Any], QueryPlan]:
    """The WHERE clause (with its leading ``WHERE``, or empty), its arguments, and the plan."""
    where: list[str] = []
    args: list[Any] = []
    if text:
        if plan == "auto":
            plan = choose_plan(conn, text)
        # shorter needles hold no trigram, and one with a NUL is matched by a scan
        if plan == "index" and len(text) >= INDEX_MIN_NEEDLE and NUL not in text:
            where.append(INDEX_CANDIDATES)
            args.append(fts_match(text))
        if NUL in text:
            where.append("instr(lower(text), lower(?)) > 0")
            args.append(text)
        else:
            # ``+?``, not ``?``: a bound LIKE pattern makes SQLite prepare the statement again
            # on every bind (for a LIKE optimization no index here could use).
            where.append("text LIKE +? ESCAPE '\\'")
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


def query_page(
    conn: sqlite3.Connection,
    *,
    track: str | None,
    scope: str | None,
    text: str | None,
    agent_key: str | None,
    workspace_key: str | None,
    limit: int,
    plan: QueryPlan = "auto",
) -> tuple[list[Entry], int]:
    """The first ``limit`` hits in rank order, and the number of all hits. Rows are built
    for the page only. With the index plan the trigram index gives the candidates (a
    superset: it folds more than ASCII) and the same LIKE keeps the exact hits, so both
    plans return the same page. ``plan`` forces one, for tests; by default each query
    chooses (``choose_plan``)."""
    where, args, plan = _filters(conn, track, scope, text, agent_key, workspace_key, plan)
    if text and plan == "index":
        # Few candidates: match once, keeping only what ranks a hit, then build the page's rows.
        keys = conn.execute(f"SELECT rowid FROM entries NOT INDEXED{where}{RANK_ORDER}", args).fetchall()
        rows = _rows_in(conn, [k[0] for k in keys[:limit]])
        return sorted((row_to_entry(r) for r in rows), key=rank), len(keys)
    if not text and agent_key is None and workspace_key is None:
        # Counted by the kept counts per cell, not by reading the entries.
        (total,) = conn.execute("SELECT total(entries) FROM memoryd_usage WHERE (?1 IS NULL OR track = ?1) AND "
                                "(?2 IS NULL OR scope = ?2)", (track, scope)).fetchone()
    else:
        (total,) = conn.execute(f"SELECT count(*) FROM entries{where}", args).fetchone()
    rows = conn.execute(f"SELECT {ENTRY_COLUMNS} FROM entries{where}{RANK_ORDER} LIMIT ?", [*args, limit]).fetchall()
    return [row_to_entry(r) for r in rows], int(total)


def _rows_in(conn: sqlite3.Connection, rowids: list[int]) -> list[Any]:
    """The entry rows of ``rowids`` (at most a page's, well below SQLite's host parameters)."""
    marks = ", ".join("?" * len(rowids))
    return conn.execute(f"SELECT {ENTRY_COLUMNS} FROM entries WHERE rowid IN ({marks})", rowids).fetchall()


def rank(e: Entry) -> tuple[int, int, str]:
    """RANK_ORDER as a sort key: the index plan's page, whose rows come in rowid order."""
    return (-e.recall_count, -e.updated_at, e.id)
