"""What one acknowledged ``memory/add`` commits, layer by layer.

In-process, on a copy of the 2,000-entry store opened with memoryd's own ``storefile.open_store``
(its pragmas: WAL, ``synchronous=FULL``), one transaction per write, built with memoryd's
own functions, one layer more in each run:

1. the entry: its row, its indexes, its text index row and the kept counts
   (``store.insert_entry``, ``store.flush``);
2. and its audit row (``store.audit``);
3. and its chained ledger row, with the head check and move the writer does around each
   transaction (``ledger.Stamp.audit``, ``ledger.Anchor``): what a daemon commits for one add.

Each run reports commits per second and the WAL pages each commit writes. The WAL is not
checkpointed during a run (``wal_autocheckpoint=0``) so that its growth counts the pages;
a daemon also checkpoints now and then, which is not in these figures.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

LAYERS = ("entry", "entry + audit row", "entry + audit row + ledger row")


def wal_pages(db: Path, page_size: int) -> int:
    wal = Path(str(db) + "-wal")
    size = wal.stat().st_size if wal.exists() else 0
    return max(0, size - 32) // (page_size + 24)  # a WAL header, then (frame header + page) per frame


def write_anatomy(src: Path, tmp: Path, n: int) -> dict[str, dict[str, float]]:
    from memoryd import ledger, store, storefile
    from memoryd.tx import Tx
    from memoryd_protocol.types import Entry

    from .common import copy_store

    out: dict[str, dict[str, float]] = {}
    for depth, layer in enumerate(LAYERS, start=1):
        db = copy_store(src, tmp / f"anatomy-{depth}.db")
        conn = storefile.open_store(db, storefile.inspect(db))
        try:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            conn.execute("PRAGMA wal_autocheckpoint=0")
            page_size = int(conn.execute("PRAGMA page_size").fetchone()[0])
            stamp = ledger.Stamp(origin=None, session_id=None, label="allowed (policy auto)")
            anchor = ledger.Anchor(ledger.head(conn))

            def write(i: int, depth: int = depth, conn: Any = conn, stamp: Any = stamp, anchor: Any = anchor) -> None:
                ts = store.now_ms()
                e = Entry(id=store.new_id(), track="agent", scope="user-global", workspace_key="", agent_key="",
                          text=f"anatomy fact {i}: a benchmark write of about the usual size", source="bench",
                          tags=[], version=1, created_at=ts, updated_at=ts, last_recalled=None, recall_count=0,
                          session_id=None)
                conn.execute("BEGIN IMMEDIATE")
                tx = anchor.begin(conn, {}) if depth == 3 else Tx(conn, {}, None)
                store.insert_entry(tx, e)
                if depth == 2:
                    store.audit(conn, "add", track=e.track, scope=e.scope, entry_id=e.id, text=e.text,
                                outcome=stamp.label, source=e.source, session_id=None, ts=ts)
                elif depth == 3:
                    stamp.audit(tx, "add", track=e.track, scope=e.scope, entry_id=e.id, text=e.text,
                                source=e.source, entry=e, ts=ts)
                store.flush(tx)
                conn.execute("COMMIT")
                if depth == 3:
                    anchor.committed(tx)

            out[layer] = _run(write, n, functools.partial(wal_pages, db, page_size))
        finally:
            conn.close()
    return out


def _run(write: Callable[[int], None], n: int, pages: Callable[[], int]) -> dict[str, float]:
    for i in range(10):  # warm the page cache and the statement cache
        write(-1 - i)
    before = pages()
    t = time.perf_counter()
    for i in range(n):
        write(i)
    elapsed = time.perf_counter() - t
    return {"commits_per_s": round(n / elapsed, 1), "us_per_commit": round(elapsed / n * 1e6, 1),
            "wal_pages_per_commit": round((pages() - before) / n, 2)}
