"""Restore plus verify of a large store, beside its floors, in one run.

    python -m bench.restore [--entries 100000] [--reps 3] [--out bench/results/REPLICATION.md]

A store of ``--entries`` facts (bench.common.seed_store) is shipped to a ``file://`` replica
by Litestream (memoryd.litestream's config and argv), which is then stopped. Each rep, in
turn: ``memoryctl restore URL --db NEW`` (copy, verify, install: what a user runs), and its
floors: ``memoryd replica restore`` alone (Litestream's copy, what any restore pays),
``memoryctl audit verify --db`` of the copy alone (what any verify pays), and ``cp`` of the
store file (the bytes moved on this disk). Prints a Markdown section and appends it to
``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.common import console, env_info, seed_store


def _run(args: list[str]) -> float:
    env = {k: v for k, v in os.environ.items() if k != "AWS_CA_BUNDLE"}
    t0 = time.perf_counter()
    r = subprocess.run(args, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL, timeout=3600)
    took = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed ({r.returncode}): {r.stderr.strip()}")
    return took


def _ship(db: Path, url: str, work: Path) -> None:
    """Litestream replicates ``db`` until its first snapshot is in the replica, then stops
    (SIGTERM: it ships what it has not yet)."""
    from memoryd import litestream, replica

    rep = replica.parse({"url": url})
    config = litestream.write_config(work, db, rep)
    env = {k: v for k, v in litestream.environment(rep).items() if k != "AWS_CA_BUNDLE"}
    proc = subprocess.Popen(litestream.argv("replicate", config, rep), env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    done = threading.Event()

    def read() -> None:
        assert proc.stderr is not None
        for raw in proc.stderr:
            try:
                if json.loads(raw).get("msg") == "snapshot complete":
                    done.set()
            except ValueError:
                pass

    threading.Thread(target=read, daemon=True).start()
    if not done.wait(600):
        proc.kill()
        raise SystemExit("Litestream did not complete its first snapshot within 600 s")
    proc.terminate()
    proc.wait(120)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.restore", description=__doc__.split("\n\n")[0])
    ap.add_argument("--entries", type=int, default=100_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "REPLICATION.md")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-restore-") as tmp:
        work = Path(tmp)
        db = work / "primary" / "memory.db"
        db.parent.mkdir(mode=0o700)  # the settling daemon's socket goes there too
        seed_store(db, a.entries)
        url = f"file://{work / 'replica'}"
        _ship(db, url, work)
        size = db.stat().st_size
        times: dict[str, list[float]] = {"restore": [], "litestream": [], "verify": [], "cp": []}
        for rep in range(a.reps):
            target = work / f"restored-{rep}" / "memory.db"
            times["restore"].append(_run([*console("memoryctl"), "--db", str(target), "restore", url]))
            copy = work / f"copy-{rep}.db"
            times["litestream"].append(_run([*console("memoryd"), "replica", "restore", url, "--to", str(copy)]))
            times["verify"].append(_run([*console("memoryctl"), "audit", "verify", "--db", str(copy)]))
            times["cp"].append(_run(["cp", str(db), str(work / f"cp-{rep}.db")]))
            for p in (target.parent, copy, work / f"cp-{rep}.db"):
                shutil.rmtree(p) if p.is_dir() else p.unlink()
    med = {k: statistics.median(v) for k, v in times.items()}
    floor = med["litestream"] + med["verify"]
    info = env_info()
    lines = [
        "",
        f"## Restore plus verify of a {a.entries:,}-entry store",
        "",
        f"`python -m bench.restore --entries {a.entries} --reps {a.reps}`, {time.strftime('%Y-%m-%d %H:%MZ', time.gmtime())}, "
        f"Python {info.get('python', sys.version.split()[0])}, {os.cpu_count()} cores; a `file://` replica on the same "
        f"disk; the store file is {size / 1e6:.1f} MB. Medians of {a.reps}, each rep running the four in turn.",
        "",
        "| what | median | runs |",
        "| --- | --- | --- |",
        f"| `memoryctl restore URL --db NEW` (copy, verify, install) | {med['restore']:.2f} s | "
        f"{', '.join(f'{t:.2f}' for t in times['restore'])} |",
        f"| floor: `memoryd replica restore` alone (Litestream's copy) | {med['litestream']:.2f} s | "
        f"{', '.join(f'{t:.2f}' for t in times['litestream'])} |",
        f"| floor: `memoryctl audit verify --db` of the copy alone | {med['verify']:.2f} s | "
        f"{', '.join(f'{t:.2f}' for t in times['verify'])} |",
        f"| floor: `cp` of the store file | {med['cp']:.3f} s | {', '.join(f'{t:.3f}' for t in times['cp'])} |",
        "",
        f"Restore plus verify took {med['restore'] / floor:.2f}× its two floors added up ({floor:.2f} s).",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    with a.out.open("a", encoding="utf-8") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
