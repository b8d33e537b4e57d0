"""Whether memoryd's text index agrees with the entries it indexes.

``memoryd_fts`` (FTS5, the entries its external content) is derived: a query trusts it to
name every entry whose text matches, so rows deleted from it hide an entry from every
query while the entry stays listed. FTS5's ``integrity-check`` with a rank of 1 compares the
index with the content table; the entries above the index's mark (its tail, which memoryd
indexes later, all at once) are indexed first, in a savepoint rolled back afterwards.

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
#: what ``audit verify --db`` reports when it does not (a start rebuilds the index)
PROBLEM = ("the text index memoryd_fts does not agree with the entries: a query may miss an entry; start memoryd to "
           "rebuild it")


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
