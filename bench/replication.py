"""Replication's cost and lag, each beside its floor, in one run.

    python -m bench.replication [--samples 50] [--writes 4000] [--blocks 4] [--out bench/results/REPLICATION.md]

- Lag: an acknowledged ``memory/add`` → the replica holds it, for a ``file://`` replica and
  S3 (moto on 127.0.0.1), p50/p99. "Holds it" is the first new Litestream L0 file in the
  replica after the acknowledgement (the store's WAL as Litestream copied it); a restore
  of each replica at the end checks that it holds every acknowledged write. The floor, in
  turn with each sample: Litestream replicating a plain SQLite file to which one process
  commits one row, the same detection: the lag Litestream itself has at its settings.
- Writes: acknowledged ``memory/add`` per second from 1 and 16 clients, a daemon with a
  ``file://`` replica against one without (the floor), in blocks taking turns; the row is
  the median of the blocks' ratios (target ≥ 0.8×). The lag samples write at a random
  point of Litestream's second, so that both see its whole cycle.

Litestream runs with its default intervals (``monitor-interval`` 1 s: it looks at the WAL
once a second; ``sync-interval`` 1 s), as a ``[replicate]`` section without options gets.
Prints a Markdown section and appends it to ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from bench.common import WRITE, Daemon, Line, copy_store, env_info, pct, seed_store, start_daemon
from bench.suites import write_rate

#: how often the replica is looked at while a sample waits (a fraction of Litestream's second)
POLL_S = 0.005
BUCKET = "bench-replica"


class S3:
    """moto's S3 on 127.0.0.1, in this process (the ``[test]`` extra's ``moto[server]``)."""

    def __init__(self) -> None:
        import logging

        import boto3
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        host, port = self.server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        self.client = boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                                   aws_access_key_id="bench", aws_secret_access_key="bench")
        self.client.create_bucket(Bucket=BUCKET)

    def names(self, prefix: str) -> set[str]:
        found: set[str] = set()
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix + "/"):
            found.update(o["Key"] for o in page.get("Contents", ()))
        return found


def _file_names(replica: Path) -> Callable[[], set[str]]:
    def names() -> set[str]:
        level0 = replica / "ltx" / "0"
        return set(os.listdir(level0)) if level0.exists() else set()
    return names


def _wait_new(names: Callable[[], set[str]], before: set[str], timeout: float = 60.0) -> float:
    """Seconds until ``names()`` holds a name ``before`` did not (from the call)."""
    t0 = time.perf_counter()
    while True:
        if names() - before:
            return time.perf_counter() - t0
        if time.perf_counter() - t0 > timeout:
            raise SystemExit(f"the replica took no new file within {timeout} s")
        time.sleep(POLL_S)


def _replicate_toml(url: str, s3: S3 | None) -> str:
    extra = f'endpoint = "{s3.endpoint}"\nregion = "us-east-1"\n' if s3 is not None else ""
    return f'[replicate]\nurl = "{url}"\n{extra}'


@contextlib.contextmanager
def _bare_litestream(db: Path, url: str, s3: S3 | None, work: Path) -> Iterator[None]:
    """The floor: Litestream alone on a plain SQLite file, as memoryd runs it."""
    from memoryd import litestream, replica

    keys = {"endpoint": s3.endpoint, "region": "us-east-1"} if s3 is not None else {}
    rep = replica.parse({"url": url, **keys})
    config = litestream.write_config(work, db, rep)
    proc = subprocess.Popen(litestream.argv("replicate", config, rep), env=litestream.environment(rep),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield
    finally:
        proc.terminate()
        proc.wait(30)


def _lag(work: Path, kind: str, samples: int, s3: S3 | None) -> dict[str, list[float]]:
    """memoryd's lag and the floor's, sample by sample in turn."""
    url = {"file": f"file://{work / kind / 'replica'}", "s3": f"s3://{BUCKET}/{kind}-memoryd"}[kind]
    floor_url = {"file": f"file://{work / kind / 'floor-replica'}", "s3": f"s3://{BUCKET}/{kind}-floor"}[kind]
    (work / kind).mkdir(mode=0o700)
    db = seed_copy(work, kind)
    d = start_daemon(work / kind, "lag", db, config=_replicate_toml(url, s3))
    plain = work / kind / "plain.db"
    conn = sqlite3.connect(plain, isolation_level=None)
    conn.execute("PRAGMA journal_mode = wal")
    conn.execute("CREATE TABLE t (x TEXT)")
    names = {"memoryd": _file_names(work / kind / "replica") if s3 is None else (lambda: s3.names(f"{kind}-memoryd")),
             "floor": _file_names(work / kind / "floor-replica") if s3 is None else (lambda: s3.names(f"{kind}-floor"))}
    out: dict[str, list[float]] = {"memoryd": [], "floor": []}
    try:
        with _bare_litestream(plain, floor_url, s3, work / kind):
            c = Line(d.sock)
            for name in ("memoryd", "floor"):  # each replica's first snapshot is in before the first sample
                _wait_new(names[name], set(), 120)
            for i in range(samples):
                for name in (("memoryd", "floor") if i % 2 == 0 else ("floor", "memoryd")):
                    # a write at a random point of Litestream's second, not just after its last look
                    time.sleep(random.uniform(0, 1.0))
                    before = names[name]()
                    if name == "memoryd":
                        c.call("memory/add", {"input": {"track": "agent", "scope": "workspace",
                                                        "text": f"lag sample {i}"}, "write": WRITE})
                    else:
                        conn.execute("INSERT INTO t VALUES (?)", (f"lag sample {i}",))
                    out[name].append(_wait_new(names[name], before))
            c.close()
    finally:
        d.stop()
        conn.close()
    _check_holds(url, s3, db)
    return out


def _check_holds(url: str, s3: S3 | None, db: Path) -> None:
    """A restore of the replica holds the store's head: every acknowledged write."""
    import anyio
    from memoryd import replica, replica_guard

    keys = {"endpoint": s3.endpoint, "region": "us-east-1"} if s3 is not None else {}
    _, head = anyio.run(replica_guard.read, replica.parse({"url": url, **keys}), db)
    local, _ = replica_guard.ledger_head(db)
    if head != local:
        raise SystemExit(f"the replica at {url} holds {head}, the store {local}")


_SEED: dict[str, Path] = {}


def seed_copy(work: Path, name: str, n: int = 2_000) -> Path:
    if "seed" not in _SEED:
        seeded = work / "seed" / "memory.db"
        seeded.parent.mkdir(mode=0o700)
        seed_store(seeded, n)
        _SEED["seed"] = seeded
    dst = work / name / "memory.db"
    dst.parent.mkdir(mode=0o700, exist_ok=True)
    return copy_store(_SEED["seed"], dst)


def _writes(work: Path, writes: int, blocks: int) -> dict[int, dict[str, list[float]]]:
    """Acked writes/s with a file replica and without, in blocks taking turns: each block
    ``writes`` long from 16 clients, a quarter of it from 1 (seconds each, so that
    Litestream's once-a-second work falls into every block)."""
    out: dict[int, dict[str, list[float]]] = {}
    for clients in (1, 16):
        ds: dict[str, Daemon] = {}
        try:
            for name in ("on", "off"):
                db = seed_copy(work, f"w{clients}{name}")
                toml = _replicate_toml(f"file://{db.parent / 'replica'}", None) if name == "on" else ""
                ds[name] = start_daemon(db.parent, f"w{clients}{name}", db, config=toml)
            for d in ds.values():
                write_rate(d, clients, max(clients, 20))  # warm up
            rows: dict[str, list[float]] = {"on": [], "off": []}
            for k in range(blocks):
                for name in (("on", "off") if k % 2 == 0 else ("off", "on")):
                    rows[name].append(write_rate(ds[name], clients, writes if clients > 1 else writes // 4)["per_s"])
            out[clients] = rows
        finally:
            for d in ds.values():
                d.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.replication", description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=50, help="lag samples per replica kind (each also the floor's)")
    ap.add_argument("--writes", type=int, default=4000, help="writes per block from 16 clients (1 client: a quarter)")
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "REPLICATION.md")
    a = ap.parse_args(argv)
    # Litestream's S3 client refuses a custom CA bundle it cannot add; moto here speaks plain http.
    os.environ.pop("AWS_CA_BUNDLE", None)
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    started = time.strftime("%Y-%m-%d %H:%MZ", time.gmtime())
    with tempfile.TemporaryDirectory(prefix="bench-repl-", dir="/tmp") as tmp:
        work = Path(tmp)
        s3 = S3()
        lag = {"file": _lag(work, "file", a.samples, None), "s3": _lag(work, "s3", a.samples, s3)}
        writes = _writes(work, a.writes, a.blocks)
        s3.server.stop()
    info = env_info()
    ms = lambda v: f"{v * 1000:.0f} ms"  # noqa: E731
    lines = [
        "",
        "## Replication: lag and the cost to writes",
        "",
        f"`python -m bench.replication --samples {a.samples} --writes {a.writes} --blocks {a.blocks}`, {started}, "
        f"Python {info.get('python', sys.version.split()[0])}, {os.cpu_count()} cores, Litestream 0.5.17 at its "
        "default intervals (it looks at the WAL once a second). S3 is moto on 127.0.0.1 in the bench's own process.",
        "",
        "| replication lag, acked write → in the replica | p50 | p99 | floor: Litestream alone, p50 | floor p99 | "
        "× floor p50 | samples |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for kind, label in (("file", "`file://` replica"), ("s3", "S3 (moto)")):
        m, f = lag[kind]["memoryd"], lag[kind]["floor"]
        lines.append(f"| {label} | {ms(statistics.median(m))} | {ms(pct(m, 0.99))} | {ms(statistics.median(f))} | "
                     f"{ms(pct(f, 0.99))} | {statistics.median(m) / statistics.median(f):.2f}× | {len(m)} |")
    lines += ["", "| acked writes/s | replication on (file) | off (floor) | on ÷ off, median of blocks (spread) | "
              "target | met |", "| --- | --- | --- | --- | --- | --- |"]
    for clients, rows in writes.items():
        ratios = [on / off for on, off in zip(rows["on"], rows["off"], strict=True)]
        x = statistics.median(ratios)
        lines.append(f"| {clients} client(s) | {statistics.median(rows['on']):.0f} | {statistics.median(rows['off']):.0f} "
                     f"| {x:.2f}× ({min(ratios):.2f}–{max(ratios):.2f}) | ≥ 0.8× | {'yes' if x >= 0.8 else 'NO'} |")
    lines.append("")
    text = "\n".join(lines)
    print(text)
    with a.out.open("a", encoding="utf-8") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
