"""The fixed cost of one ``memory/query`` round trip, before and after a change, in one session.

    python -m bench.roundtrip [--base DIR] [--rounds N] [--reps N] [--sizes 50,2000]

Each round starts one daemon per build on a copy of the same seeded store (the builds in
turn, their order swapped every round: ABBA...), sends ``--reps`` sequential queries per
needle from one lean client (msgspec, one ``recv`` buffer: :class:`bench.common.Line`), and
records the round trip's p50 and p99 and the CPU each side spent per query: the daemon's
event-loop thread (its main thread), the daemon's other threads (the writer's recall
bookkeeping), and the client. The floors are measured in the same round: the in-process
``instr`` scan and the Unix-socket echo. Medians over the rounds are printed as a Markdown
table (and written as JSON with ``--json``).

``--base DIR``: a checkout (its ``protocol/`` and ``daemon/``) the "before" daemon imports
instead of this tree's, e.g. ``git worktree add /tmp/base main`` or ``git archive``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .common import NEEDLES, Line, seed_store, start_build, summary, thread_cpu, timed
from .suites import ScanFloor, echo_floor, query_params


def measure(tmp: Path, name: str, seed: Path, base: Path | None, reps: int, needles: list[str]) -> dict[str, Any]:
    proc, sock = start_build(tmp, name, seed, base)
    try:
        c = Line(sock)
        out: dict[str, Any] = {}
        for label in needles:
            params = query_params(NEEDLES[label])
            timed(lambda params=params: c.call("memory/query", params), 20)  # type: ignore[misc]
            before, client0 = {tid: cpu for tid, (_, cpu) in thread_cpu(proc.pid).items()}, time.process_time()
            s = summary(timed(lambda params=params: c.call("memory/query", params), reps))  # type: ignore[misc]
            after, client = {tid: cpu for tid, (_, cpu) in thread_cpu(proc.pid).items()}, time.process_time() - client0
            loop = after.get(proc.pid, 0.0) - before.get(proc.pid, 0.0)
            others = sum(v - before.get(t, 0.0) for t, v in after.items() if t != proc.pid)
            out[label] = {"p50_us": s["p50_us"], "p99_us": s["p99_us"], "mean_us": s["mean_us"],
                          "loop_cpu_us": round(loop / reps * 1e6, 1), "other_cpu_us": round(others / reps * 1e6, 1),
                          "client_cpu_us": round(client / reps * 1e6, 1)}
        c.close()
        return out
    finally:
        proc.terminate()
        proc.wait()


def _median(rows: list[dict[str, float]], key: str) -> float:
    return round(statistics.median(r[key] for r in rows), 1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.roundtrip", description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", type=Path, help="a checkout the 'before' daemon imports (its protocol/ and daemon/)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--reps", type=int, default=300)
    ap.add_argument("--sizes", default="50,2000")
    ap.add_argument("--needles", default=",".join(NEEDLES))
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    needles = [n.strip() for n in args.needles.split(",")]
    builds: list[tuple[str, Path | None]] = [("after", None)]
    if args.base is not None:
        builds.insert(0, ("before", args.base.resolve()))
    res: dict[str, dict[str, dict[str, list[dict[str, float]]]]] = {}
    floors: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory(prefix="mdb-rt-", dir="/tmp") as d:
        tmp = Path(d)
        seeds = {}
        for n in sizes:
            seeds[n] = tmp / f"seed-{n}.db"
            seed_store(seeds[n], n)
        for r in range(args.rounds):
            order = builds if r % 2 == 0 else builds[::-1]
            for n in sizes:
                f = floors.setdefault(str(n), {})
                (tmp / "echo.sock").unlink(missing_ok=True)
                f.setdefault("echo", []).append(summary(echo_floor(tmp, args.reps))["p50_us"])
                for label in needles:
                    if NEEDLES[label] is not None:
                        scan = ScanFloor(seeds[n], NEEDLES[label], instr=True)
                        try:
                            times = timed(scan, args.reps, warmup=3)
                        finally:
                            scan.close()
                        f.setdefault(label, []).append(summary(times)["p50_us"])
                for build, base in order:
                    got = measure(tmp, f"{build}-{n}", seeds[n], base, args.reps, needles)
                    for label, row in got.items():
                        res.setdefault(build, {}).setdefault(str(n), {}).setdefault(label, []).append(row)
            print(f"[roundtrip] round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    keys = ("p50_us", "p99_us", "loop_cpu_us", "other_cpu_us", "client_cpu_us")
    print(f"medians of {args.rounds} rounds, {args.reps} queries per needle each; µs\n")
    print("| entries | needle | instr floor | echo | " + " | ".join(
        f"{b} {k.removesuffix('_us').replace('_', ' ')}" for b, _ in builds for k in keys) + " |")
    print("| --- " * (4 + len(builds) * len(keys)) + "|")
    for n in sizes:
        for label in needles:
            fl = floors[str(n)]
            cells = [str(n), label, str(round(statistics.median(fl[label]), 1)) if label in fl else "–",
                     str(round(statistics.median(fl["echo"]), 1))]
            for b, _ in builds:
                rows = res[b][str(n)][label]
                cells += [str(_median(rows, k)) for k in keys]
            print("| " + " | ".join(cells) + " |")
    if args.json is not None:
        args.json.write_text(json.dumps({"results": res, "floors": floors}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
