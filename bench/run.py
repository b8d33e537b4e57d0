"""memoryd benchmarks, each beside its floor in the same run.

    python bench/run.py [--quick]

Measures (daemon in socket mode, on a temp socket and database):
  query   memory/query round trip on a 50-entry store   vs raw socket echo, raw sqlite3 query
  add     auto-policy memory/add, 1 client and 16        vs raw sqlite3 insert+commit (synchronous=FULL)
  start   stdio start: spawn → initialize answered, through the relay to the warm daemon and
          --standalone (a private daemon)                vs spawning `python -c pass`
  rss     idle RSS of the daemon after start and after the runs
Prints medians, p90/p99 and ratios to the floor; writes bench/results.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def summary(name: str, values_s: list[float]) -> dict[str, float]:
    us = [v * 1e6 for v in values_s]
    return {"n": len(us), "p50_us": round(statistics.median(us), 1), "p90_us": round(pct(us, 0.9), 1),
            "p99_us": round(pct(us, 0.99), 1)}


class Line:
    """A blocking NDJSON client: the least overhead a client can add."""

    def __init__(self, path: str) -> None:
        self.s = socket.socket(socket.AF_UNIX)
        self.s.connect(path)
        self.f = self.s.makefile("rb")
        self.n = 0

    def call(self, method: str, params: Any) -> Any:
        self.n += 1
        self.s.sendall(json.dumps({"jsonrpc": "2.0", "id": self.n, "method": method, "params": params}).encode()
                       + b"\n")
        while True:
            msg = json.loads(self.f.readline())
            if msg.get("id") == self.n:
                if "error" in msg:
                    raise RuntimeError(msg["error"])
                return msg["result"]


def start_daemon(tmp: Path, policy: str = "auto") -> tuple[subprocess.Popen[bytes], str]:
    sock = str(tmp / "b.sock")
    cfg = tmp / "bench.toml"
    cfg.write_text("[budgets.agent]\nworkspace = 10000000\n")  # room for every benchmark write
    from memoryd.launch import spawn_ready  # waits for the daemon's READY=1

    proc = spawn_ready(["--socket", sock, "--db", str(tmp / "b.db"), "--config", str(cfg), "--write-policy", policy,
                        "--log-level", "warning"], log=tmp / "daemon.log")
    return proc, sock


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return -1


WRITE = {"agent": {"session": {"id": "bench", "header": {"cwd": "/bench"}}}}


def bench_query(sock: str, n: int) -> list[float]:
    c = Line(sock)
    for i in range(50):
        c.call("memory/add", {"input": {"track": "agent", "scope": "user-global", "text": f"fact number {i} about"
                                        f" the build system"}, "write": WRITE})
    for _ in range(50):  # warm up
        c.call("memory/query", {"filter": {"text": "build", "limit": 5}})
    out = []
    for _ in range(n):
        t = time.perf_counter()
        c.call("memory/query", {"filter": {"text": "number 1", "limit": 5}})
        out.append(time.perf_counter() - t)
    return out


def echo_floor(tmp: Path, n: int) -> list[float]:
    path = str(tmp / "echo.sock")
    # Bound and listening before the echo process starts (it inherits the listener), so the
    # connect needs no wait for it.
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(path)
        listener.listen(1)
        code = ("import socket,sys\ns=socket.socket(fileno=int(sys.argv[1]))\nc,_=s.accept()\n"
                "f=c.makefile('rb')\nfor l in f: c.sendall(l)\n")
        proc = subprocess.Popen([sys.executable, "-c", code, str(listener.fileno())], pass_fds=[listener.fileno()])
    try:
        c = Line(path)
        msg = json.dumps({"jsonrpc": "2.0", "id": 0, "method": "memory/query",
                          "params": {"filter": {"text": "number 1", "limit": 5}}}).encode() + b"\n"
        out = []
        for _ in range(n):
            t = time.perf_counter()
            c.s.sendall(msg)
            json.loads(c.f.readline())
            out.append(time.perf_counter() - t)
        c.s.close()
        return out
    finally:
        proc.kill()
        proc.wait()


def sqlite_query_floor(tmp: Path, n: int) -> list[float]:
    conn = sqlite3.connect(tmp / "floor.db", isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE IF NOT EXISTS e (id TEXT, text TEXT, recall_count INT, updated_at INT)")
    conn.executemany("INSERT INTO e VALUES (?, ?, 0, 0)", [(str(i), f"fact number {i} about the build system")
                                                          for i in range(50)])
    out = []
    for _ in range(n):
        t = time.perf_counter()
        conn.execute("SELECT * FROM e WHERE instr(lower(text), lower(?)) > 0 ORDER BY recall_count DESC, "
                     "updated_at DESC, id", ("number 1",)).fetchall()
        out.append(time.perf_counter() - t)
    conn.close()
    return out


async def add_clients(sock: str, clients: int, per_client: int) -> float:
    async def one(k: int) -> None:
        r, w = await asyncio.open_unix_connection(sock)
        for i in range(per_client):
            w.write(json.dumps({"jsonrpc": "2.0", "id": i, "method": "memory/add", "params": {
                "input": {"track": "agent", "scope": "workspace", "text": f"c{k}-{i}"}, "write": WRITE}}).encode()
                + b"\n")
            await w.drain()
            while True:
                msg = json.loads(await r.readline())
                if msg.get("id") == i:
                    assert "result" in msg, msg
                    break
        w.close()

    t = time.perf_counter()
    await asyncio.gather(*(one(k) for k in range(clients)))
    return clients * per_client / (time.perf_counter() - t)


def sqlite_insert_floor(tmp: Path, n: int) -> float:
    conn = sqlite3.connect(tmp / "floor-w.db", isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE e (id TEXT, text TEXT)")
    t = time.perf_counter()
    for i in range(n):
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO e VALUES (?, ?)", (str(i), "x"))
        conn.execute("COMMIT")
    rate = n / (time.perf_counter() - t)
    conn.close()
    return rate


def memoryd_command() -> list[str]:
    """What a harness runs: the installed console script (``python -m`` adds runpy)."""
    script = Path(sys.executable).parent / "memoryd"
    return [str(script)] if script.exists() else [sys.executable, "-m", "memoryd"]


def stdio_start(serve_args: list[str], n: int) -> tuple[list[float], list[float]]:
    """Spawn ``memoryd serve --stdio <serve_args>`` until ``initialize`` is answered, beside
    spawning ``python -c pass``, alternating so both see the same machine."""
    init = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}).encode() + b"\n"
    ours, floor = [], []
    for i in range(n):
        args = [a.replace("{i}", str(i)) for a in serve_args]
        t = time.perf_counter()
        p = subprocess.Popen([*memoryd_command(), "serve", "--stdio", *args],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert p.stdin and p.stdout
        p.stdin.write(init)
        p.stdin.flush()
        p.stdout.readline()
        ours.append(time.perf_counter() - t)
        p.stdin.close()
        p.wait()
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        floor.append(time.perf_counter() - t)
    return ours, floor


def main() -> None:
    # An installed wheel ships compiled bytecode; a checkout run with PYTHONDONTWRITEBYTECODE
    # would otherwise recompile every module at every cold start.
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "protocol"), str(ROOT / "daemon")],
                   check=True, stdout=subprocess.DEVNULL)
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    nq = 500 if args.quick else 3000
    nw = 300 if args.quick else 2000
    results: dict[str, Any] = {"python": sys.version.split()[0], "cores": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="mdb-", dir="/tmp") as d:
        tmp = Path(d)
        proc, sock = start_daemon(tmp)
        try:
            time.sleep(0.5)
            results["rss_idle_kb"] = rss_kb(proc.pid)
            q = bench_query(sock, nq)
            results["query"] = summary("query", q)
            results["floor_echo"] = summary("echo", echo_floor(tmp, nq))
            results["floor_sqlite_query"] = summary("sqlite", sqlite_query_floor(tmp, nq))
            results["query_vs_echo"] = round(results["query"]["p50_us"] / results["floor_echo"]["p50_us"], 2)
            results["add_1_client_per_s"] = round(asyncio.run(add_clients(sock, 1, nw)))
            results["add_16_clients_per_s"] = round(asyncio.run(add_clients(sock, 16, max(nw // 16, 20))))
            results["rss_after_kb"] = rss_kb(proc.pid)
            ours, floor = stdio_start(["--socket", sock], 10 if args.quick else 30)
            results["relay_start"] = summary("relay", ours)
            results["relay_floor_python_start"] = summary("py", floor)
            results["relay_start_vs_python"] = round(statistics.median(ours) / statistics.median(floor), 2)
        finally:
            proc.terminate()
            proc.wait()
        results["floor_sqlite_commit_per_s"] = round(sqlite_insert_floor(tmp, nw))
        results["add_1_vs_floor"] = round(results["add_1_client_per_s"] / results["floor_sqlite_commit_per_s"], 2)
        ours, floor = stdio_start(["--standalone", "--db", str(tmp / "cs{i}.db"), "--log-level", "warning"],
                                  5 if args.quick else 15)
        results["cold_start"] = summary("start", ours)
        results["floor_python_start"] = summary("py", floor)
    print(json.dumps(results, indent=2))
    (ROOT / "bench" / "results.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
