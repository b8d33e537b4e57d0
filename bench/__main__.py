"""memoryd's benchmark suite: real daemons, each figure beside its floor and the peer,
measured in one run.

    python -m bench [--quick] [--only NAME[,NAME]] [--out DIR] [--base DIR] [--profile]

Suites (``--only`` takes their names):
  floors   raw sqlite3 FULL one-row transactions, a Unix-socket echo round trip,
           ``python -c pass``
  query    memory/query round trip p50/p99 at 50, 2,000 and 100,000 entries, for 1-, 2-, 3-
           and 8-character needles, a CJK needle, a needle in every row, and no text; each
           alternating with its floors, the in-process scan (LIKE and instr) at that size
  writes   acked memory/add throughput under policy auto from 1, 4, 16 and 64 clients, and
           under ask with a client that answers its own approval/asked
  start    stdio spawn → initialize answered: through the relay to a running daemon, and
           --standalone; the daemon's own spawn → READY=1 on an empty and the largest store
  cli      ``memoryctl query`` and ``memoryctl status`` against a running daemon
  rss      idle RSS, and RSS with 1,000 idle initialized connections
  peer     @modelcontextprotocol/server-memory (npm-installed into a temp dir, MCP over
           stdio): the same facts, needles and writes, its start and peak RSS; skipped
           with a message when npm is unavailable or the install fails
  mcp      ``memoryd mcp`` beside server-memory, both driven with raw MCP lines: spawn →
           tools/list answered (and with the SDK's client), memory_query at 2,000 entries
           vs search_nodes, acked memory_add from 1 and 16 sessions vs create_entities,
           and the daemon's RSS idle and with 10 MCP sessions; memoryd's figures alone
           when server-memory cannot be installed

Writes results.json, RESULTS.md (medians and ratios) and results.png (matplotlib, the
``bench`` extra; skipped with a message without it) into ``--out`` (default bench/results/).
``--profile`` also records py-spy flame graphs of the daemon under the 16-client write load
and the 2,000-entry query load (``profile-writes.svg``, ``profile-queries.svg``, and their
collapsed stacks in ``.txt``, and those of the GIL holder alone in ``.gil.txt``).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from . import suites
from .common import ROOT, env_info

SUITES = ("floors", "query", "writes", "start", "cli", "rss", "peer", "mcp")


def run_suite(name: str, ctx: suites.Ctx) -> None:
    if name == "peer":
        from .peer import peer

        peer(ctx)
    elif name == "mcp":
        from .mcp import mcp

        mcp(ctx)
    else:
        getattr(suites, name)(ctx)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[2:]))
    ap.add_argument("--quick", action="store_true", help="small sizes and counts: a smoke run (< 60 s)")
    ap.add_argument("--only", metavar="NAME[,NAME]", help=f"run only these suites ({', '.join(SUITES)})")
    ap.add_argument("--out", metavar="DIR", type=Path, default=ROOT / "bench" / "results",
                    help="where the results go (default bench/results/)")
    ap.add_argument("--base", metavar="DIR", type=Path,
                    help="a checkout of the build to compare with (its protocol/ and daemon/): the query and "
                         "write suites measure it beside this tree's, alternating")
    ap.add_argument("--profile", action="store_true",
                    help="record py-spy profiles of the daemon under the 16-client writes and 2,000-entry queries")
    args = ap.parse_args(argv)
    names = SUITES if args.only is None else tuple(n.strip() for n in args.only.split(",") if n.strip())
    unknown = [n for n in names if n not in SUITES]
    if unknown:
        ap.error(f"unknown suite {', '.join(unknown)} (choose from {', '.join(SUITES)})")
    # An installed wheel ships compiled bytecode; a checkout run would otherwise recompile
    # modules at cold starts and bill the start measurements for it.
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "protocol"), str(ROOT / "daemon"),
                    str(ROOT / "client")], check=True, stdout=subprocess.DEVNULL)
    params = suites.QUICK if args.quick else suites.FULL
    results: dict[str, Any] = {"env": env_info(), "quick": args.quick, "suites": list(names)}
    out: Path = args.out
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mdb-", dir="/tmp") as d:
        ctx = suites.Ctx(Path(d), params, results, base=None if args.base is None else args.base.resolve())
        if args.profile:
            from .profile import Profiler

            ctx.profiler = Profiler(out)
        for name in names:
            t = time.perf_counter()
            run_suite(name, ctx)
            results.setdefault("suite_seconds", {})[name] = round(time.perf_counter() - t, 1)
    results["total_seconds"] = round(time.perf_counter() - started, 1)
    from .report import write_all

    for path in write_all(results, out):
        print(f"[bench] wrote {path}", flush=True)
    print(f"[bench] done in {results['total_seconds']} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
