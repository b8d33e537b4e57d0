"""Whether memoryd's text index agrees with the entries it indexes.

``memoryd_fts`` (FTS5, the entries its external content) is derived: a query trusts it to
name every entry whose text matches, so rows deleted from it hide an entry from every
query while the entry stays listed. FTS5's ``integrity-check`` with a rank of 1 compares the
index with the content table; the entries above the index's mark (its tail, which memoryd
indexes later, all at once) are indexed first, in a savepoint rolled back afterwards.

That reads the whole index. A start reads only how many rows FTS5 counts in it (the first
varint of its averages record, id 1 of ``memoryd_fts_data``) against the entries up to the
mark (:data:`SELECT_COUNTS`, :func:`indexed_rows`): an entry deleted from it is one fewer.

Pure: the daemon runs it in its writer's transaction, ``memoryctl audit verify --db`` on a
copy of the store in memory (the check needs a connection that may write).
"""

from __future__ import annotations

from collections.abc import Callable

#: the ``meta`` key of the index's mark: entries above that rowid are not indexed yet
MARK_KEY = "memoryd_fts_mark"
_INDEX_TAIL = ("INSERT INTO memoryd_fts (rowid, text) SELECT rowid, text FROM entries WHERE rowid > "
               f"(SELECT CAST(value AS INTEGER) FROM meta WHERE key = '{MARK_KEY}')")
_CHECK = "INSERT INTO memoryd_fts (memoryd_fts, rank) VALUES ('integrity-check', 1)"
#: FTS5's count of the rows in the index, and the entries it must hold (all, in a store
#: without a mark, which has no tail)
SELECT_COUNTS = ("SELECT (SELECT block FROM memoryd_fts_data WHERE id = 1), (SELECT count(*) FROM entries WHERE "
                 f"rowid <= coalesce((SELECT CAST(value AS INTEGER) FROM meta WHERE key = '{MARK_KEY}'), rowid))")
#: what ``audit verify --db`` reports when it does not (a start rebuilds the index)
PROBLEM = ("the text index memoryd_fts does not agree with the entries: a query may miss an entry; start memoryd to "
           "rebuild it")


def indexed_rows(averages: bytes | None) -> int:
    """The row count FTS5 keeps at the head of its averages record (an SQLite varint; no
    record: an index that never held a row)."""
    n = 0
    for i, byte in enumerate(averages or b""):
        if i == 8:
            return (n << 8) | byte
        n = (n << 7) | (byte & 0x7F)
        if not byte & 0x80:
            break
    return n


def agrees(execute: Callable[[str], object], error: type[Exception]) -> bool:
    """Run by ``execute`` (a connection's, inside or outside a transaction): False when the
    index and the entries differ. ``error`` is the driver's database error; FTS5 reports a
    difference as SQLITE_CORRUPT_VTAB, and any other error is raised."""
    execute("SAVEPOINT memoryd_index_check")
    try:
        execute(_INDEX_TAIL)
        try:
            execute(_CHECK)
        except error as exc:
            if not str(getattr(exc, "sqlite_errorname", "")).startswith("SQLITE_CORRUPT"):
                raise
            return False
        return True
    finally:
        execute("ROLLBACK TO memoryd_index_check")
        execute("RELEASE memoryd_index_check")
