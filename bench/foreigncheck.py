"""What the look for another program's writes costs each batch the writer commits.

    python -m bench.foreigncheck [--entries N[,N]] [--batches N] [--rounds N]

Before anything of a batch runs, inside its transaction, the writer asks SQLite whether
another connection committed (``PRAGMA data_version``) or changed the schema (``PRAGMA
schema_version``): ``foreign.Watch.guard``. When neither moved, that is all it does. Only
when ``schema_version`` moved does it compare ``sqlite_master`` with memoryd's own DDL
(``schema.unaccepted``), and only when either moved does it reconcile (not measured here).

In-process, on a copy of a seeded store opened with memoryd's own ``storefile.open_store``,
one ``BEGIN IMMEDIATE`` … ``ROLLBACK`` per batch as the writer begins its own, this times:

- ``guard``: ``Watch.guard`` when nothing moved (what every batch pays);
- ``data_version`` and ``schema_version``: each pragma alone;
- ``schema compare``: ``schema.unaccepted``, what a batch pays once after the schema moved;
- ``empty batch``: ``BEGIN IMMEDIATE`` and ``ROLLBACK`` around nothing, for scale;
- ``add committed``: one add with its audit and ledger rows, committed with
  ``synchronous=FULL`` (``bench.anatomy``'s last layer), for scale.

Medians (and p99) in microseconds over ``--rounds`` rounds of ``--batches`` batches each, as
a Markdown table.
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from .common import copy_store, pct, seed_store


def _per_batch(conn: sqlite3.Connection, step: Callable[[], object], batches: int) -> list[float]:
    """``step`` timed alone, each time inside a batch's transaction: microseconds."""
    out = []
    for _ in range(batches):
        conn.execute("BEGIN IMMEDIATE")
        t = time.perf_counter_ns()
        step()
        out.append((time.perf_counter_ns() - t) / 1e3)
        conn.execute("ROLLBACK")
    return out


def _empty(conn: sqlite3.Connection, batches: int) -> list[float]:
    out = []
    for _ in range(batches):
        t = time.perf_counter_ns()
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
        out.append((time.perf_counter_ns() - t) / 1e3)
    return out


def measure(src: Path, tmp: Path, batches: int) -> dict[str, list[float]]:
    from memoryd import foreign, schema, storefile
    from memoryd.tx import Tx

    db = copy_store(src, tmp / f"check-{src.stem}.db")
    conn = storefile.open_store(db, storefile.inspect(db))
    try:
        watch = foreign.Watch.of(conn, db)
        assert watch.schema is not None, "the seeded store's schema is memoryd's own"
        tx = Tx(conn, {}, None)

        def guard() -> None:
            assert watch.guard(tx, 0, False) == (None, None), "nothing moved: the two pragmas alone"

        steps: dict[str, Callable[[], object]] = {
            "guard": guard,
            "data_version": lambda: conn.execute("PRAGMA data_version").fetchone(),
            "schema_version": lambda: conn.execute("PRAGMA schema_version").fetchone(),
            "schema compare": lambda: schema.unaccepted(conn),
        }
        out: dict[str, list[float]] = {}
        for name, step in steps.items():
            _per_batch(conn, step, max(10, batches // 10))  # warm the statement cache and the pages
            out[name] = _per_batch(conn, step, batches if name != "schema compare" else max(10, batches // 10))
        out["empty batch"] = _empty(conn, batches)
        return out
    finally:
        conn.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.foreigncheck", description=__doc__.split("\n\n")[0])
    ap.add_argument("--entries", default="2000,20000")
    ap.add_argument("--batches", type=int, default=2_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--adds", type=int, default=300, help="committed adds timed for scale (0: none)")
    args = ap.parse_args(argv)
    from .anatomy import LAYERS, write_anatomy

    with tempfile.TemporaryDirectory(prefix="memoryd-bench-") as d:
        tmp = Path(d)
        for n in (int(x) for x in args.entries.split(",")):
            seed = tmp / f"seed-{n}.db"
            seed_store(seed, n)
            rounds: dict[str, list[float]] = {}
            p99: dict[str, list[float]] = {}
            for _ in range(args.rounds):
                for name, values in measure(seed, tmp, args.batches).items():
                    rounds.setdefault(name, []).append(statistics.median(values))
                    p99.setdefault(name, []).append(pct(values, 0.99))
            if args.adds:
                add = write_anatomy(seed, tmp, args.adds)[LAYERS[-1]]["us_per_commit"]
            print(f"\n{n:,} entries, {args.rounds} rounds × {args.batches:,} batches\n")
            print("| per batch | median µs | p99 µs |\n| --- | --- | --- |")
            for name in rounds:
                print(f"| {name} | {statistics.median(rounds[name]):.2f} | {statistics.median(p99[name]):.2f} |")
            if args.adds:
                print(f"| add committed | {add:.0f} | – |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
