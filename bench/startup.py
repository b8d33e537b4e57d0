"""The start-up rows, this tree beside a checkout of another build, alternating in one run:
the relay's spawn → ``initialize`` answered, ``memoryd mcp``'s spawn → ``tools/list``
answered, ``memoryctl query`` and ``memoryctl status``, each beside ``python -c pass``.

    python -m bench.startup --base DIR [--runs N] [--json FILE]

Each build's processes run from its checkout's ``scripts/`` (as installed) with its packages
first on PYTHONPATH, against one daemon of this tree on a 2,000-entry store (policy auto), so
only the started process differs. A row's builds and its ``python -c pass`` take turns, the
build that goes first alternating. Prints a Markdown table of the medians, each build's ratio
to the floor and the bound (``common.START_BOUNDS``), and beside them the started process's
own CPU time (user and system) as a ratio to the floor's: on a loaded machine the wall times
wait for the CPU, and the CPU ratio shows what the start itself costs. Below the table, the
same measure for importing the stack memoryctl's one path stands on (anyio's asyncio backend,
which ``anyio.run`` imports, and msgspec), none of memoryd's code: the least a memoryctl start
on that stack can cost.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from .common import ROOT, START_BOUNDS, copy_store, python_pass, seed_store, start_daemon, summary
from .mcp import CWD, bytecode_env, spawn_list
from .suites import stdio_start

ENTRIES = 2_000


def _env(tree: Path, tmp: Path) -> dict[str, str]:
    """A started process's environment: ``tree``'s packages, no config file, and its
    bytecode written once it is stale (:func:`bench.mcp.bytecode_env`)."""
    path = os.pathsep.join(str(tree / p) for p in ("protocol", "daemon", "client"))
    return bytecode_env(dict(os.environ, PYTHONPATH=path, XDG_CONFIG_HOME=str(tmp / "no-config"),
                             XDG_STATE_HOME=str(tmp)))


def _rows(tree: Path, tmp: Path, sock: str, db: Path) -> dict[str, Callable[[], float]]:
    """Each row's one timed start of ``tree``'s build, in seconds."""
    env = _env(tree, tmp)
    memoryd = [sys.executable, str(tree / "scripts" / "memoryd")]
    memoryctl = [sys.executable, str(tree / "scripts" / "memoryctl"), "--socket", sock, "--no-autostart"]

    def run(argv: list[str]) -> float:
        t = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env=env)
        return time.perf_counter() - t

    return {
        "relay": lambda: stdio_start([*memoryd, "serve", "--stdio", "--socket", sock, "--db", str(db),
                                      "--log-level", "warning"], env)[0],
        "mcp": lambda: spawn_list(([*memoryd, "mcp", "--socket", sock, "--db", str(db), "--cwd", CWD], env)),
        "memoryctl query": lambda: run([*memoryctl, "query", "postgres"]),
        "memoryctl status": lambda: run([*memoryctl, "status"]),
    }


def _children_cpu() -> float:
    """The CPU seconds (user and system) of this process's children that ended."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


# What memoryctl's one path imports before any memoryd code: the async client runs on anyio's
# asyncio backend and decodes into msgspec Structs.
STACK = [sys.executable, "-c", "import anyio._backends._asyncio, msgspec"]


def _stack() -> float:
    t = time.perf_counter()
    subprocess.run(STACK, check=True)
    return time.perf_counter() - t


LABELS = {"relay": "relay spawn → initialize", "mcp": "`memoryd mcp` spawn → tools/list",
          "memoryctl query": "`memoryctl query`", "memoryctl status": "`memoryctl status`"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.startup", description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", metavar="DIR", type=Path, required=True, help="the checkout of the build before")
    ap.add_argument("--runs", type=int, default=40, help="timed starts per row and build (default 40)")
    ap.add_argument("--json", metavar="FILE", type=Path, help="also write every figure here")
    args = ap.parse_args(argv)
    base: Path = args.base.resolve()
    builds = {"after": ROOT, "before": base}
    for tree in builds.values():  # as an installed wheel ships them: no compiling at a timed start
        subprocess.run([sys.executable, "-m", "compileall", "-q", *(str(tree / p) for p in ("protocol", "daemon",
                        "client"))], check=True, stdout=subprocess.DEVNULL)
    out: dict[str, dict[str, dict[str, float]]] = {}
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="mdb-start-", dir="/tmp") as d:
        tmp = Path(d)
        seed_store(tmp / "seed.db", ENTRIES)
        daemon = start_daemon(tmp, "startup", copy_store(tmp / "seed.db", tmp / "startup.db"))
        try:
            rows = {name: _rows(tree, tmp, daemon.sock, daemon.db) for name, tree in builds.items()}
            for name in builds:  # the daemon's first MCP session imports the SDK; the page cache warms
                for once in rows[name].values():
                    once()
            for row in START_BOUNDS:
                times: dict[str, list[float]] = {"after": [], "before": [], "python -c pass": []}
                cpu: dict[str, list[float]] = {k: [] for k in times}
                for i in range(args.runs):
                    order = ("after", "before") if i % 2 == 0 else ("before", "after")
                    for one in (*order, "python -c pass"):
                        spent = _children_cpu()
                        times[one].append(python_pass() if one == "python -c pass" else rows[one][row]())
                        cpu[one].append(_children_cpu() - spent)
                out[row] = {**{k: summary(v) for k, v in times.items()},
                            **{f"{k} cpu": summary(v) for k, v in cpu.items()}}
                print(f"[startup] {row}: done", file=sys.stderr, flush=True)
            times = {"stack": [], "python -c pass": []}
            cpu = {k: [] for k in times}
            for i in range(args.runs):
                for one in ("stack", "python -c pass") if i % 2 == 0 else ("python -c pass", "stack"):
                    spent = _children_cpu()
                    times[one].append(python_pass() if one == "python -c pass" else _stack())
                    cpu[one].append(_children_cpu() - spent)
            stack = {**{k: summary(v) for k, v in times.items()}, **{f"{k} cpu": summary(v) for k, v in cpu.items()}}
        finally:
            daemon.stop()
    if args.json:
        args.json.write_text(json.dumps({**out, "stack": stack}, indent=1) + "\n")
    print(f"load average {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end; {args.runs} runs of each\n")
    print("| row | before | after | python -c pass | before × python | after × python | bound | met "
          "| CPU: before × python | CPU: after × python |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for row, f in out.items():
        py = f["python -c pass"]["p50_us"]
        before, after = f["before"]["p50_us"] / py, f["after"]["p50_us"] / py
        cpu_py = f["python -c pass cpu"]["p50_us"]
        bound = START_BOUNDS[row]
        print(f"| {LABELS[row]} | {f['before']['p50_us'] / 1000:.1f} ms | {f['after']['p50_us'] / 1000:.1f} ms | "
              f"{py / 1000:.1f} ms | {before:.2f}× | {after:.2f}× | ≤ {bound:g}× | {'yes' if after <= bound else 'no'} "
              f"| {f['before cpu']['p50_us'] / cpu_py:.2f}× | {f['after cpu']['p50_us'] / cpu_py:.2f}× |")
    py, cpu_py = stack["python -c pass"]["p50_us"], stack["python -c pass cpu"]["p50_us"]
    print(f"\nthe stack alone (`{STACK[2]}`): {stack['stack']['p50_us'] / 1000:.1f} ms, "
          f"{stack['stack']['p50_us'] / py:.2f}× python -c pass ({py / 1000:.1f} ms); "
          f"CPU {stack['stack cpu']['p50_us'] / cpu_py:.2f}×")
    return 0


if __name__ == "__main__":
    sys.exit(main())
