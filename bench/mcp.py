"""The MCP front-end: ``memoryd mcp`` beside @modelcontextprotocol/server-memory, both
driven by the same clients in the same run.

Every figure that a target judges is the server's, taken with raw NDJSON lines over the
child's pipes (msgspec in this process, for both servers): the SDK's own ``mcp.Client``
costs milliseconds in the measuring process, which would be billed to whichever server it
drives. The spawn → ``tools/list`` figure is also taken with the official SDK's client
(``mode="legacy"``), the host's view, and reported beside it.

- ``rss``: a fresh daemon on the 2,000-entry store, idle (is the SDK mapped yet?), after
  its first MCP session (the SDK import), and with 10 ``memoryd mcp`` processes attached,
  each initialized and having listed the tools.
- ``start``: spawn → initialize (legacy handshake) → ``notifications/initialized`` →
  ``tools/list`` answered, against that daemon (which has served MCP sessions, so the SDK
  import is paid), beside server-memory's and ``python -c pass``, alternately; on the
  2,000-entry store and on a 50-entry one (the snapshot every session's instructions
  carry lists every visible entry).
- ``query``: ``memory_query`` through one MCP session at 2,000 entries, per needle,
  alternating with the same query over the socket (``memory/query``) and server-memory's
  ``search_nodes`` on a 2,000-entity graph.
- ``writes``: acked ``memory_add`` per second under policy auto from 1 and 16 concurrent
  ``memoryd mcp`` processes (each issuing its adds in sequence, as the ``writes`` suite's
  clients do), and server-memory's ``create_entities`` from one client.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import msgspec

from .common import NEEDLES, Daemon, Line, close_child, console, python_pass, rss_kb, summary
from .peer import install, write_graph
from .suites import BLOCK, Ctx, daemon, log, query_params, write_rate

_enc = msgspec.json.Encoder()
_dec = msgspec.json.Decoder()

#: the legacy handshake's version; both servers speak it
PROTOCOL = "2025-11-25"
CLIENT = {"name": "memoryd-bench", "version": "1"}
INIT = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": PROTOCOL, "capabilities": {}, "clientInfo": CLIENT}}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}
LIST = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
#: what a host writes first: the handshake and tools/list, in one write
OPENING = b"".join(_enc.encode(m) + b"\n" for m in (INIT, INITIALIZED, LIST))
#: the workspace of every memoryd mcp session
CWD = "/bench"
#: memoryd mcp processes attached for the RSS figure
RSS_SESSIONS = 10
#: the concurrent sessions of the write runs
SESSIONS = (1, 16)
#: the store sizes of the start runs (the first is the target's)
START_SIZES = (2_000, 50)


def bytecode_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (else this process's) without PYTHONDONTWRITEBYTECODE. An installed memoryd
    has its bytecode compiled at install; a checkout that is edited while the bench runs
    would, with that variable set, compile each edited module again at every timed start,
    which no user's start does. Started this way, the first start after an edit writes it."""
    out = dict(os.environ if env is None else env)
    out.pop("PYTHONDONTWRITEBYTECODE", None)
    return out


def memoryd_cmd(d: Daemon) -> tuple[list[str], dict[str, str] | None]:
    """What a host spawns for memoryd: ``memoryd mcp`` into the running daemon."""
    return [*console("memoryd"), "mcp", "--socket", d.sock, "--db", str(d.db), "--cwd", CWD], bytecode_env()


def peer_cmd(script: Path, memory_file: Path) -> tuple[list[str], dict[str, str] | None]:
    return [shutil.which("node") or "node", str(script)], dict(os.environ, MEMORY_FILE_PATH=str(memory_file))


class Stdio:
    """One MCP server process driven with raw NDJSON lines. ``open()`` is the host's start:
    spawn, the handshake and tools/list written at once, read until tools/list is answered."""

    def __init__(self, cmd: list[str], env: dict[str, str] | None) -> None:
        self.cmd, self.env = cmd, env
        self.n = 1
        self.proc: subprocess.Popen[bytes] | None = None
        self.tools = 0

    def open(self) -> float:
        t = time.perf_counter()
        self.proc = p = subprocess.Popen(self.cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.DEVNULL, env=self.env)
        assert p.stdin
        p.stdin.write(OPENING)
        p.stdin.flush()
        while True:
            msg = self._read()
            if msg.get("id") == 1:
                elapsed = time.perf_counter() - t
                if "result" not in msg:
                    raise RuntimeError(f"{self.cmd[0]}: tools/list failed: {msg}")
                self.tools = len(msg["result"]["tools"])
                return elapsed
            if msg.get("id") == 0 and "result" not in msg:
                raise RuntimeError(f"{self.cmd[0]}: initialize failed: {msg}")

    def _read(self) -> Any:
        assert self.proc and self.proc.stdout
        line = self.proc.stdout.readline()
        if not line:
            raise ConnectionError(f"{self.cmd[0]} exited (code {self.proc.poll()})")
        return _dec.decode(line)

    def tool(self, name: str, args: dict[str, Any]) -> Any:
        assert self.proc and self.proc.stdin
        self.n += 1
        self.proc.stdin.write(_enc.encode({"jsonrpc": "2.0", "id": self.n, "method": "tools/call",
                                           "params": {"name": name, "arguments": args}}) + b"\n")
        self.proc.stdin.flush()
        while True:
            msg = self._read()
            if msg.get("id") == self.n:
                result = msg.get("result")
                if result is None or result.get("isError"):
                    raise RuntimeError(f"{name}: {msg}")
                return result["structuredContent"]

    def close(self) -> None:
        if self.proc is not None:
            close_child(self.proc)


def spawn_list(cmd: tuple[list[str], dict[str, str] | None]) -> float:
    s = Stdio(*cmd)
    try:
        return s.open()
    finally:
        s.close()


def sdk_spawn_list(cmd: tuple[list[str], dict[str, str] | None]) -> float:
    """The same start through the official SDK's stdio client (``mode="legacy"``): entering
    the client (spawn, initialize, initialized) and ``list_tools()`` returned."""
    import warnings

    from mcp import Client, StdioServerParameters
    from mcp.client.stdio import stdio_client

    argv, env = cmd

    async def run(null: TextIO) -> float:
        params = StdioServerParameters(command=argv[0], args=argv[1:], env=env or dict(os.environ))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t = time.perf_counter()
            async with Client(stdio_client(params, errlog=null), mode="legacy") as c:
                await c.list_tools()
                return time.perf_counter() - t

    with open(os.devnull, "w") as null:  # server-memory's banner on stderr
        return asyncio.run(run(null))


def _sdk_mapped(pid: int) -> bool:
    """Whether the process has the SDK's stack loaded (pydantic-core's extension mapped)."""
    return "pydantic_core" in Path(f"/proc/{pid}/maps").read_text()


def interleaved(fns: dict[str, tuple[Callable[[], object], int]]) -> dict[str, list[float]]:
    """Each ``(fn, n)`` timed ``n`` times, in rounds: a block of each in turn, sized so
    that all end in the same round, each block after one untimed run (as
    :func:`bench.suites.alternating`, for functions of very different costs)."""
    rounds = max(-(-n // BLOCK) for _, n in fns.values())
    out: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for k, (fn, n) in fns.items():
            block = -(-n // rounds)
            todo = min(block, n - len(out[k]))
            if todo <= 0:
                continue
            fn()
            for _ in range(todo):
                t = time.perf_counter()
                fn()
                out[k].append(time.perf_counter() - t)
    return out


# --- RSS --------------------------------------------------------------------------------


def rss(ctx: Ctx, out: dict[str, Any], d: Daemon) -> None:
    log("mcp: daemon RSS, idle and with MCP sessions")
    r: dict[str, Any] = {"idle_kb": rss_kb(d.pid), "sdk_mapped_idle": _sdk_mapped(d.pid)}
    first = spawn_list(memoryd_cmd(d))
    r["first_session_s"] = round(first, 3)
    r["after_first_session_kb"] = rss_kb(d.pid)
    sessions = [Stdio(*memoryd_cmd(d)) for _ in range(RSS_SESSIONS)]
    try:
        for s in sessions:
            s.open()
        c = Line(d.sock)
        r["connections"] = c.call("daemon/status", {})["connections"]
        c.close()
        r["sessions"] = RSS_SESSIONS
        r["with_sessions_kb"] = rss_kb(d.pid)
        r["peak_kb"] = rss_kb(d.pid, "VmHWM")
        r["sdk_mapped_after"] = _sdk_mapped(d.pid)
    finally:
        for s in sessions:
            s.close()
    out["rss"] = r


# --- start ------------------------------------------------------------------------------


def start(ctx: Ctx, out: dict[str, Any], script: Path | None) -> None:
    """memoryd's spawn → tools/list on each store, alternating with server-memory's (on an
    empty file, as the peer's start is measured) and ``python -c pass``."""
    peer = None if script is None else peer_cmd(script, ctx.tmp / "mcp-peer-start.jsonl")
    res: dict[str, Any] = {}
    for n in START_SIZES:
        with daemon(ctx, f"mcpstart{n}", ctx.copy(n, f"mcp-start-{n}")) as d:
            log(f"mcp: spawn → tools/list, {n} entries")
            ours = memoryd_cmd(d)
            warm = spawn_list(ours)  # the daemon's first MCP session imports the SDK
            sdk_spawn_list(ours)  # and this process's first SDK client imports it here
            if peer is not None and n == START_SIZES[0]:
                spawn_list(peer)  # node's modules into the page cache, as memoryd's are
            raw, sdk, py = [], [], []
            peer_raw, peer_sdk = [], []
            for _ in range(ctx.p.starts):
                raw.append(spawn_list(ours))
                py.append(python_pass())
                sdk.append(sdk_spawn_list(ours))
                if peer is not None and n == START_SIZES[0]:
                    peer_raw.append(spawn_list(peer))
                    peer_sdk.append(sdk_spawn_list(peer))
            row = {"raw": summary(raw), "sdk": summary(sdk), "python_pass": summary(py),
                   "first_session_s": round(warm, 3)}
            s = Stdio(*ours)
            s.open()
            row["tools"] = s.tools
            s.close()
            if ctx.profiler is not None and n == START_SIZES[0]:
                def load(ours: tuple[list[str], dict[str, str] | None] = ours) -> None:
                    for _ in range(3 * ctx.p.starts):
                        spawn_list(ours)

                ctx.profiler("mcp-start", d.pid, load)
            res[str(n)] = row
            if peer_raw:
                res["peer"] = {"raw": summary(peer_raw), "sdk": summary(peer_sdk)}
    out["start"] = res


# --- query ------------------------------------------------------------------------------


def mcp_query_args(needle: str | None) -> dict[str, Any]:
    return {"text": needle, "limit": 20} if needle is not None else {"limit": 20}


def query(ctx: Ctx, out: dict[str, Any], script: Path | None) -> None:
    n = 2_000
    graph = ctx.tmp / f"mcp-peer-q{n}.jsonl"
    write_graph(graph, n)
    reps = ctx.p.query_reps[n]
    peer_reps = ctx.p.peer_query_reps[n]
    res: dict[str, Any] = {}
    with daemon(ctx, "mcpq", ctx.copy(n, "mcp-query")) as d:
        log(f"mcp: memory_query at {n}, beside memory/query and server-memory's search_nodes")
        ours = Stdio(*memoryd_cmd(d))
        theirs = None if script is None else Stdio(*peer_cmd(script, graph))
        c = Line(d.sock)
        try:
            ours.open()
            if theirs is not None:
                theirs.open()
            for label, needle in NEEDLES.items():
                args = mcp_query_args(needle)
                hits = ours.tool("memory_query", args)["total"]

                def mcp(s: Stdio = ours, args: dict[str, Any] = args) -> object:
                    return s.tool("memory_query", args)

                params = query_params(needle)

                def sock(c: Line = c, params: dict[str, Any] = params) -> object:
                    return c.call("memory/query", params)

                fns: dict[str, tuple[Callable[[], object], int]] = {"mcp": (mcp, reps), "socket": (sock, reps)}
                if theirs is not None:
                    def peer(s: Stdio = theirs, q: str = needle or "") -> object:
                        return s.tool("search_nodes", {"query": q})

                    fns["peer"] = (peer, peer_reps)
                times = interleaved(fns)
                res[label] = {"mcp": {**summary(times["mcp"]), "hits": hits}, "socket": summary(times["socket"])}
                if theirs is not None:
                    hits = len(theirs.tool("search_nodes", {"query": needle or ""})["entities"])
                    res[label]["peer"] = {**summary(times["peer"]), "hits": hits}
            if ctx.profiler is not None:
                def load(s: Stdio = ours) -> None:
                    for _ in range(max(1, reps // 3)):
                        for needle in NEEDLES.values():
                            s.tool("memory_query", mcp_query_args(needle))

                ctx.profiler("mcp-queries", d.pid, load)
        finally:
            c.close()
            ours.close()
            if theirs is not None:
                theirs.close()
    out["query"] = {"entries": n, "limit": 20, "needles": res}


# --- writes -----------------------------------------------------------------------------


class _Session:
    """One ``memoryd mcp`` child for the write load (asyncio pipes)."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.n = 1

    @classmethod
    async def open(cls, cmd: list[str]) -> _Session:
        proc = await asyncio.create_subprocess_exec(*cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                                    stderr=subprocess.DEVNULL, limit=1 << 22)
        s = cls(proc)
        assert proc.stdin
        proc.stdin.write(OPENING)
        await s._reply(1)
        return s

    async def _reply(self, id_: int) -> Any:
        assert self.proc.stdout
        while True:
            line = await self.proc.stdout.readline()
            if not line:
                raise ConnectionError("memoryd mcp exited")
            msg = _dec.decode(line)
            if msg.get("id") == id_:
                if "result" not in msg or msg["result"].get("isError"):
                    raise RuntimeError(msg)
                return msg["result"]

    async def adds(self, k: int, count: int) -> None:
        assert self.proc.stdin
        for i in range(count):
            self.n += 1
            self.proc.stdin.write(_enc.encode({"jsonrpc": "2.0", "id": self.n, "method": "tools/call", "params": {
                "name": "memory_add", "arguments": {"track": "agent", "scope": "workspace",
                                                    "text": f"session {k} fact {i}: the bench wrote it"}}}) + b"\n")
            await self._reply(self.n)

    async def close(self) -> None:
        assert self.proc.stdin
        self.proc.stdin.close()
        await self.proc.wait()


async def _mcp_write_load(cmd: list[str], pid: int, sessions: int, total: int, round_: int
                          ) -> tuple[int, float, float]:
    """``sessions`` processes, opened first (not timed); then each issues its adds in
    sequence, all at once: the adds acked, the seconds they took, and the daemon's CPU
    seconds meanwhile."""
    from .suites import _cpu_s

    per = max(1, total // sessions)
    opened = await asyncio.gather(*(_Session.open(cmd) for _ in range(sessions)))
    try:
        cpu0, t = _cpu_s(pid), time.perf_counter()
        await asyncio.gather(*(s.adds(round_ * 1000 + k, per) for k, s in enumerate(opened)))
        return per * sessions, time.perf_counter() - t, _cpu_s(pid) - cpu0
    finally:
        await asyncio.gather(*(s.close() for s in opened))


def mcp_write_rate(d: Daemon, sessions: int, total: int, round_: int) -> dict[str, float]:
    done, elapsed, cpu = asyncio.run(_mcp_write_load(memoryd_cmd(d)[0], d.pid, sessions, total, round_))
    return {"writes": done, "seconds": round(elapsed, 3), "per_s": round(done / elapsed, 1),
            "daemon_cpu_us_per_write": round(cpu / done * 1e6, 1)}


def writes(ctx: Ctx, out: dict[str, Any], script: Path | None) -> None:
    res: dict[str, Any] = {"store_starts_at": ctx.p.write_store_size}
    for sessions in SESSIONS:
        db = ctx.copy(ctx.p.write_store_size, f"mcp-w-{sessions}")
        with daemon(ctx, f"mcpw{sessions}", db) as d:
            log(f"mcp: memory_add, {sessions} session(s), beside memory/add over the socket")
            mcp_write_rate(d, sessions, max(sessions, 20), 0)  # warm up (and the SDK import)
            res[f"auto/{sessions}"] = mcp_write_rate(d, sessions, ctx.p.writes_total, 1)
            res[f"socket/{sessions}"] = write_rate(d, sessions, ctx.p.writes_total)
    if script is None:
        out["writes"] = res
        return
    log("mcp: server-memory create_entities, 1 client")
    graph = ctx.tmp / "mcp-peer-w.jsonl"
    write_graph(graph, ctx.p.write_store_size)
    s = Stdio(*peer_cmd(script, graph))
    try:
        s.open()
        count = ctx.p.peer_writes
        t = time.perf_counter()
        for i in range(count):
            s.tool("create_entities", {"entities": [{"name": f"w{i:06d}", "entityType": "memo",
                                                     "observations": [f"client 0 fact {i}: the bench wrote it"]}]})
        elapsed = time.perf_counter() - t
    finally:
        s.close()
    res["peer"] = {"writes": count, "seconds": round(elapsed, 3), "per_s": round(count / elapsed, 1)}
    out["writes"] = res


def mcp(ctx: Ctx) -> None:
    log("mcp: npm install server-memory (once per run)")
    script, version = install(ctx.tmp)
    out: dict[str, Any] = {"peer_version": version} if script is not None else {"peer_skipped": version}
    if script is None:
        log(f"mcp: server-memory skipped ({version}): memoryd's figures alone")
    with daemon(ctx, "mcprss", ctx.copy(2_000, "mcp-rss")) as d:
        rss(ctx, out, d)
    start(ctx, out, script)
    query(ctx, out, script)
    writes(ctx, out, script)
    ctx.results["mcp"] = out
