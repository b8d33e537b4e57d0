"""The CPU one acknowledged ``memory/add`` costs the daemon, per thread, before and after a
change, in one session.

    python -m bench.writecpu [--base DIR] [--rounds N] [--writes N] [--clients 1,16]

Each round starts one daemon per build (policy ``auto``) on a copy of the same seeded
2,000-entry store, the builds in turn, their order swapped every round (ABBA...), and runs
``--writes`` acked adds from each client count (the bench's own write load,
``suites._write_load``). It records writes per second and the CPU each daemon thread spent
per write (``/proc/<pid>/task/*/schedstat``: nanoseconds): the event loop's thread (the
main thread), the writer's thread (``memoryd-writer``) and the rest. Medians over the
rounds are printed as a Markdown table (and written as JSON with ``--json``).

``--base DIR``: a checkout (its ``protocol/`` and ``daemon/``) the "before" daemon imports
instead of this tree's, e.g. ``git archive main protocol daemon | tar -x -C DIR``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
from pathlib import Path

from .common import seed_store, start_build, thread_cpu
from .suites import _write_load


def measure(tmp: Path, name: str, seed: Path, base: Path | None, clients: int, writes: int) -> dict[str, float]:
    proc, sock = start_build(tmp, name, seed, base)
    try:
        asyncio.run(_write_load(sock, clients, max(clients, 40), False))  # warm up
        before = thread_cpu(proc.pid)
        done, elapsed = asyncio.run(_write_load(sock, clients, writes, False))
        after = thread_cpu(proc.pid)
        spent = {tid: (cpu - before.get(tid, (tname, 0.0))[1]) / done * 1e6 for tid, (tname, cpu) in after.items()}
        loop = spent.pop(proc.pid)
        # Python 3.11 gives its threads no OS name: the writer's is the busiest but the loop's.
        writer = max(spent.values(), default=0.0)
        out = {"per_s": done / elapsed, "loop": loop, "writer": writer, "other": sum(spent.values()) - writer}
        out["total"] = out["loop"] + out["writer"] + out["other"]
        return {k: round(v, 1) for k, v in out.items()}
    finally:
        proc.terminate()
        proc.wait()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.writecpu", description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", type=Path, help="a checkout the 'before' daemon imports (its protocol/ and daemon/)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--writes", type=int, default=2_000)
    ap.add_argument("--clients", default="1,16")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    clients = [int(c) for c in args.clients.split(",")]
    builds: list[tuple[str, Path | None]] = [("after", None)]
    if args.base is not None:
        builds.insert(0, ("before", args.base.resolve()))
    res: dict[str, dict[str, list[dict[str, float]]]] = {}
    with tempfile.TemporaryDirectory(prefix="mdb-wcpu-", dir="/tmp") as d:
        tmp = Path(d)
        seed = tmp / "seed.db"
        seed_store(seed, 2_000)
        for r in range(args.rounds):
            order = builds if r % 2 == 0 else builds[::-1]
            for k in clients:
                for build, base in order:
                    row = measure(tmp, f"{build}-{k}-{r}", seed, base, k, args.writes)
                    res.setdefault(build, {}).setdefault(str(k), []).append(row)
                    (tmp / f"{build}-{k}-{r}.db").unlink()
            print(f"[writecpu] round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    keys = ("per_s", "loop", "writer", "other", "total")
    print(f"medians of {args.rounds} rounds, {args.writes} acked adds each; CPU in µs per write\n")
    print("| clients | build | writes/s | loop thread | writer thread | other threads | daemon total |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for k in clients:
        for b, _ in builds:
            rows = res[b][str(k)]
            print(f"| {k} | {b} | " + " | ".join(str(round(statistics.median(r[x] for r in rows), 1))
                                                  for x in keys) + " |")
    if args.json is not None:
        args.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
