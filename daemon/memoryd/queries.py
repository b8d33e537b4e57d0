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
#: How the index plan reads its page: "keys", every hit's rank keys in one statement, then
#: the page's rows (few candidates); after a count of the hits, "walk", the rank index
#: walked as the scan plan does (dense hits), or "sorted", the hits' rows sorted (dense
#: candidates the other filters thinned out); "auto" chooses (``walks``).
IndexPage = Literal["auto", "keys", "walk", "sorted"]


def like_pattern(text: str) -> str:
    """``text`` as a LIKE pattern matching it anywhere, with ``\\``, ``%`` and ``_`` escaped.
    SQLite's LIKE folds ASCII letters only (no ICU here), exactly the protocol's rule."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


#: LIKE reads its pattern, and FTS5 its query, only up to a NUL (JSON's ``\\u0000``), so a
#: needle with one is matched by a scan with ``instr(lower(text), lower(?))`` (the same
#: ASCII-only folding): a needle nobody types, on no hot path.
WHOLE = "\x00"


def fts_phrase(text: str) -> str:
    """``text`` as one FTS5 phrase (a substring, for the trigram tokenizer)."""
    return '"' + text.replace('"', '""') + '"'


#: How much of the store file a reading connection maps (an upper bound, not an allocation).
READER_MMAP_BYTES = 256 << 20


def prepare_reader(conn: sqlite3.Connection) -> None:
    """A reading connection's settings: the store memory-mapped, since every commit by
    another connection (the recall bookkeeping's, after each query) empties its page cache,
    and a mapped page is read in place. The hazard SQLite documents: a disk read error under
    a mapped page is a SIGBUS that ends the daemon, not STORE_UNAVAILABLE (the writer's own
    connection is not mapped; the service restarts the daemon)."""
    conn.execute(f"PRAGMA mmap_size = {READER_MMAP_BYTES}")


#: The index plan's candidates: the index's matches, and its tail (the rowids above its mark,
#: in no index yet; see store.TEXT_MARK_KEY). One statement, so the mark and the index,
#: which move in one transaction, are read at one moment.
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
    return probe(conn, text, entries)[0]


def probe(conn: sqlite3.Connection, text: str, entries: int) -> tuple[QueryPlan, int]:
    """``choose_plan``'s plan, and the number of candidates it counted, the tail's with the
    index's (0 when it chose without counting): what ``query_page`` sizes the index plan's
    page by."""
    if entries < INDEX_MIN_ENTRIES or len(text) < INDEX_MIN_NEEDLE or WHOLE in text:
        return "scan", 0
    cap = max(1, int(entries * COMMON_SHARE))
    (n,) = conn.execute("SELECT (SELECT count(*) FROM (SELECT 1 FROM memoryd_fts WHERE memoryd_fts MATCH ?1 "
                        f"LIMIT ?2)) + (SELECT count(*) FROM (SELECT 1 FROM entries WHERE rowid > {TEXT_MARK_SQL} "
                        "LIMIT ?2))", (fts_phrase(text), cap)).fetchone()
    return ("scan" if n >= cap else "index"), int(n)


def _filters(conn: sqlite3.Connection, track: str | None, scope: str | None, text: str | None,
             agent_key: str | None, workspace_key: str | None, plan: QueryPlan) -> tuple[str, list[Any], QueryPlan]:
    """The WHERE clause (with its leading ``WHERE``, or empty), its arguments, and the plan."""
    where: list[str] = []
    args: list[Any] = []
    if text:
        if plan == "auto":
            plan = choose_plan(conn, text, entry_count(conn))
        # shorter needles hold no trigram; one with a NUL is matched by a scan (WHOLE)
        if plan == "index" and len(text) >= INDEX_MIN_NEEDLE and WHOLE not in text:
            where.append(INDEX_CANDIDATES)
            args.append(fts_phrase(text))
        if WHOLE in text:
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
    """All hits in rank order. With an index plan the trigram index gives the candidates (a
    superset: it folds more than ASCII) and the same LIKE keeps the exact hits, so both
    plans return the same rows."""
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
    plan: QueryPlan = "auto",
    page: IndexPage = "auto",
) -> tuple[list[Entry], int]:
    """What a page of ``limit`` hits can come from, and the number of all hits: the first
    ``limit`` hits by stored rank, and the hits among ``boosted`` (whose queued recalls may
    lift them; the caller ranks again). Any other hit has ``limit`` hits that stay ahead of
    it, so rows are built for these only. ``plan`` and ``page`` force a plan and how its
    page is read, for tests; by default the probe decides both."""
    take = limit
    candidates: int | None = None
    stored = entry_count(conn) if text else 0  # read once: the probe and both walk choices use it
    if text and plan == "auto":
        plan, candidates = probe(conn, text, stored)
    where, args, plan = _filters(conn, track, scope, text, agent_key, workspace_key, plan)
    if text and plan == "index":
        if page == "auto" and (candidates is None or not walks(candidates, take, stored)):
            page = "keys"
        if page == "keys":
            # Few candidates: match once, keeping only what ranks a hit, then build the
            # rows of the page's candidates.
            keys = conn.execute(f"SELECT rowid, id FROM entries NOT INDEXED{where}{RANK_ORDER}", args).fetchall()
            chosen = [k[0] for k in keys[:take]]
            if boosted:
                lifted = set(boosted)
                chosen.extend(k[0] for k in keys[take:] if k[1] in lifted)
            rows = _rows_in(conn, "rowid", chosen, "", [])
            return sorted((row_to_entry(r) for r in rows), key=rank), len(keys)
        # Many candidates: count the hits; if they are dense, walk the rank index as the scan
        # plan does until the page is full, else sort the few hits.
        (total,) = conn.execute(f"SELECT count(*) FROM entries NOT INDEXED{where}", args).fetchone()
        if page == "auto":
            page = "walk" if walks(int(total), take, stored) else "sorted"
        if page == "walk":
            page_where, page_args, _ = _filters(conn, track, scope, text, agent_key, workspace_key, "scan")
            rows = conn.execute(f"SELECT {ENTRY_COLUMNS} FROM entries INDEXED BY memoryd_entries_rank{page_where}"
                                f"{RANK_ORDER} LIMIT ?", [*page_args, take]).fetchall()
        else:
            rows = conn.execute(f"SELECT {ENTRY_COLUMNS} FROM entries NOT INDEXED{where}{RANK_ORDER} LIMIT ?",
                                [*args, take]).fetchall()
        return _with_boosted(conn, [row_to_entry(r) for r in rows], int(total), boosted, where, args)
    if not text and agent_key is None and workspace_key is None:
        # Counted by the kept counts per cell, not by reading the entries.
        (total,) = conn.execute("SELECT total(entries) FROM memoryd_usage WHERE (?1 IS NULL OR track = ?1) AND "
                                "(?2 IS NULL OR scope = ?2)", (track, scope)).fetchone()
    else:
        (total,) = conn.execute(f"SELECT count(*) FROM entries{where}", args).fetchone()
    rows = conn.execute(f"SELECT {ENTRY_COLUMNS} FROM entries{where}{RANK_ORDER} LIMIT ?", [*args, take]).fetchall()
    return _with_boosted(conn, [row_to_entry(r) for r in rows], int(total), boosted, where, args)


def _with_boosted(conn: sqlite3.Connection, entries: list[Entry], total: int, boosted: Collection[str],
                  where: str, args: list[Any]) -> tuple[list[Entry], int]:
    """``entries`` (a page's first hits by stored rank) and the hits among ``boosted`` not
    in it yet; and ``total``."""
    if boosted and total > len(entries):
        have = {e.id for e in entries}
        missing = [i for i in boosted if i not in have]
        if missing:
            entries.extend(row_to_entry(r) for r in _rows_in(conn, "id", missing, where, args))
    return entries, total


#: The index plan's page walks the rank index when its hits are at least this dense: the
#: walk reads about ``take × entries / hits`` cheap rows, the sorted path every hit's row at
#: a higher cost each. At worst (every hit ranks last) the walk costs the scan it replaces.
WALK_DENSITY = 1 / 7


def walks(candidates: int, take: int, entries: int) -> bool:
    """Whether the index plan's page of ``take`` out of ``candidates`` walks the rank index."""
    return candidates * candidates >= WALK_DENSITY * take * entries


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
