"""The peer: @modelcontextprotocol/server-memory, installed with npm into a temp dir and
driven over stdio with MCP JSON-RPC, on the same facts and needles.

Its store is one JSON-lines file that it reads whole and rewrites whole on every write; the
query stores are written in its own line format before it starts (seeding 100,000 facts one
``create_entities`` at a time would take hours), its writes go through ``tools/call``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from .common import NEEDLES, close_child, fact, python_pass, rss_kb, summary, timed
from .suites import Ctx, log

PACKAGE = "@modelcontextprotocol/server-memory"


def install(tmp: Path) -> tuple[Path | None, str]:
    """(the server's entry script, its version) or (None, why not)."""
    npm = shutil.which("npm")
    node = shutil.which("node")
    if npm is None or node is None:
        return None, "npm or node is not on PATH"
    where = tmp / "peer"
    pkg = where / "node_modules" / "@modelcontextprotocol" / "server-memory"
    if (pkg / "package.json").exists():  # installed by another suite of this run
        meta = json.loads((pkg / "package.json").read_text())
        return pkg / meta["bin"]["mcp-server-memory"], str(meta["version"])
    where.mkdir(exist_ok=True)
    (where / "package.json").write_text('{"name": "memoryd-bench-peer", "private": true}\n')
    try:
        subprocess.run([npm, "install", "--no-audit", "--no-fund", "--silent", PACKAGE], cwd=where, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=300)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        err = getattr(exc, "stderr", b"") or b""
        return None, f"npm install {PACKAGE} failed: {err.decode(errors='replace').strip()[-300:] or exc}"
    meta = json.loads((pkg / "package.json").read_text())
    return pkg / meta["bin"]["mcp-server-memory"], str(meta["version"])


def write_graph(path: Path, n: int) -> None:
    """``n`` facts in the peer's own file format: one entity with one observation each."""
    with path.open("w") as f:
        f.write("\n".join(json.dumps({"type": "entity", "name": f"n{i:06d}", "entityType": "memo",
                                      "observations": [fact(i)]}) for i in range(n)))


class Mcp:
    """One server-memory process over stdio."""

    def __init__(self, script: Path, memory_file: Path) -> None:
        env = dict(os.environ, MEMORY_FILE_PATH=str(memory_file))
        self.t0 = time.perf_counter()
        self.proc = subprocess.Popen([shutil.which("node") or "node", str(script)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        self.n = 0
        self.call("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                 "clientInfo": {"name": "memoryd-bench", "version": "1"}})
        self.start_s = time.perf_counter() - self.t0
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def send(self, msg: dict[str, Any]) -> None:
        assert self.proc.stdin
        self.proc.stdin.write(json.dumps(msg).encode() + b"\n")
        self.proc.stdin.flush()

    def call(self, method: str, params: dict[str, Any]) -> Any:
        self.n += 1
        self.send({"jsonrpc": "2.0", "id": self.n, "method": method, "params": params})
        assert self.proc.stdout
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise ConnectionError("server-memory exited")
            msg = json.loads(line)
            if msg.get("id") == self.n:
                if "error" in msg:
                    raise RuntimeError(msg["error"])
                return msg["result"]

    def tool(self, name: str, args: dict[str, Any]) -> Any:
        result = self.call("tools/call", {"name": name, "arguments": args})
        if result.get("isError"):
            raise RuntimeError(f"{name}: {result}")
        return result

    def search(self, needle: str | None) -> int:
        return len(self.tool("search_nodes", {"query": needle or ""})["structuredContent"]["entities"])

    def peak_kb(self) -> int:
        return rss_kb(self.proc.pid, "VmHWM")

    def close(self) -> None:
        close_child(self.proc)


def peer(ctx: Ctx) -> None:
    log(f"peer: npm install {PACKAGE}")
    script, version = install(ctx.tmp)
    if script is None:
        log(f"peer: skipped: {version}")
        ctx.results["peer"] = {"skipped": version}
        return
    out: dict[str, Any] = {"package": PACKAGE, "version": version, "node": _node_version()}
    peaks: list[int] = []
    # start: spawn → initialize answered, beside python -c pass, on an empty file
    starts, floor = [], []
    for i in range(ctx.p.starts):
        m = Mcp(script, ctx.tmp / f"peer-start-{i}.jsonl")
        starts.append(m.start_s)
        peaks.append(m.peak_kb())
        m.close()
        floor.append(python_pass())
    out["start"] = summary(starts)
    out["start_python_pass"] = summary(floor)
    # queries at each size
    q: dict[str, Any] = {}
    for n in ctx.p.sizes:
        log(f"peer: queries at {n}")
        path = ctx.tmp / f"peer-q{n}.jsonl"
        write_graph(path, n)
        m = Mcp(script, path)
        row: dict[str, Any] = {}
        for label, needle in NEEDLES.items():
            hits = m.search(needle)
            reps = ctx.p.peer_query_reps[n]
            def one(m: Mcp = m, needle: str | None = needle) -> object:
                return m.search(needle)

            row[label] = {**summary(timed(one, reps, warmup=1 if n >= 100_000 else min(reps, 3))), "hits": hits}
        q[str(n)] = row
        peaks.append(m.peak_kb())
        m.close()
    out["query"] = q
    # writes: one create_entities per fact, sequential (one stdio client), from the same
    # starting size as memoryd's write runs
    log("peer: writes")
    path = ctx.tmp / "peer-w.jsonl"
    write_graph(path, ctx.p.write_store_size)
    m = Mcp(script, path)
    count = ctx.p.peer_writes
    t = time.perf_counter()
    for i in range(count):
        m.tool("create_entities", {"entities": [{"name": f"w{i:06d}", "entityType": "memo",
                                                 "observations": [f"client 0 fact {i}: the bench wrote it"]}]})
    elapsed = time.perf_counter() - t
    out["writes"] = {"writes": count, "seconds": round(elapsed, 3), "per_s": round(count / elapsed, 1),
                     "store_starts_at": ctx.p.write_store_size}
    peaks.append(m.peak_kb())
    m.close()
    out["peak_rss_kb"] = max(peaks)
    ctx.results["peer"] = out


def _node_version() -> str:
    return subprocess.run([shutil.which("node") or "node", "--version"], capture_output=True, text=True).stdout.strip()
