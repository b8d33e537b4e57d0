"""The measurements. Each suite takes the run's :class:`Ctx` and fills its part of
``ctx.results``; the report computes ratios from whatever is there."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sqlite3
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from .common import (
    NEEDLES,
    WRITE,
    Daemon,
    Line,
    console,
    copy_store,
    python_pass,
    rss_kb,
    seed_store,
    start_daemon,
    summary,
    timed,
)

_dec = msgspec.json.Decoder()
_enc = msgspec.json.Encoder()


@dataclass
class Params:
    sizes: tuple[int, ...]
    query_reps: dict[int, int]
    clients: tuple[int, ...]
    writes_total: int
    ask_clients: tuple[int, ...]
    starts: int
    cli_runs: int
    idle_conns: int
    floor_commits: int
    peer_writes: int
    peer_query_reps: dict[int, int]
    write_store_size: int
    ready_reps: int
    #: blocks of each write run: the FULL floor and every build's writes, in turn
    write_blocks: int


FULL = Params(
    sizes=(50, 2_000, 100_000),
    query_reps={50: 300, 2_000: 300, 100_000: 40},
    clients=(1, 4, 16, 64),
    writes_total=2_000,
    ask_clients=(1, 16),
    starts=15,
    cli_runs=15,
    idle_conns=1_000,
    floor_commits=2_000,
    peer_writes=300,
    peer_query_reps={50: 100, 2_000: 40, 100_000: 4},
    write_store_size=2_000,
    ready_reps=5,
    write_blocks=6,
)
QUICK = Params(
    sizes=(50, 2_000),
    query_reps={50: 20, 2_000: 10},
    clients=(1, 16),
    writes_total=150,
    ask_clients=(1,),
    starts=2,
    cli_runs=2,
    idle_conns=100,
    floor_commits=100,
    peer_writes=20,
    peer_query_reps={50: 5, 2_000: 3},
    write_store_size=2_000,
    ready_reps=1,
    write_blocks=2,
)


@dataclass
class Ctx:
    tmp: Path
    p: Params
    results: dict[str, Any]
    stores: dict[int, Path] = field(default_factory=dict)
    #: set by --profile: ``profiler(label, daemon pid, load)`` runs ``load`` under py-spy
    profiler: Callable[[str, int, Callable[[], object]], None] | None = None
    #: set by --base: the checkout of the "before" build, measured beside this tree's in
    #: the query and write suites
    base: Path | None = None

    def store(self, n: int) -> Path:
        """The seeded store of ``n`` facts (made once per run; suites use copies)."""
        if n not in self.stores:
            path = self.tmp / f"seed-{n}.db"
            t = time.perf_counter()
            seed_store(path, n)
            self.results.setdefault("seeding_s", {})[str(n)] = round(time.perf_counter() - t, 2)
            self.stores[n] = path
        return self.stores[n]

    def copy(self, n: int, name: str) -> Path:
        return copy_store(self.store(n), self.tmp / f"{name}.db")


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@contextmanager
def daemon(ctx: Ctx, name: str, db: Path, policy: str = "auto", base: Path | None = None) -> Iterator[Daemon]:
    d = start_daemon(ctx.tmp, name, db, policy, base=base)
    try:
        yield d
    finally:
        d.stop()


def query_params(needle: str | None) -> dict[str, Any]:
    return {"filter": {"text": needle, "limit": 20} if needle is not None else {"limit": 20}}


# --- floors --------------------------------------------------------------------------

SCAN_SQL = ("SELECT id, track, scope, workspace_key, text, source, created_at, updated_at, session_id, agent_key, "
            "last_recalled, recall_count, tags, version FROM entries{where} "
            "ORDER BY recall_count DESC, updated_at DESC, id")


class ScanFloor:
    """The in-process scan: queries.query's scan plan SQL (LIKE with ASCII folding), every hit
    fetched, no conversion; or with ``instr`` the ``instr(lower())`` form it replaced."""

    def __init__(self, db: Path, needle: str | None, instr: bool = False) -> None:
        from memoryd.queries import like_pattern

        self.conn = sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True)
        self.args: tuple[str, ...] = ()
        if needle is None:
            self.sql = SCAN_SQL.format(where="")
        elif instr:
            self.sql, self.args = SCAN_SQL.format(where=" WHERE instr(lower(text), lower(?)) > 0"), (needle,)
        else:
            self.sql, self.args = SCAN_SQL.format(where=" WHERE text LIKE +? ESCAPE '\\'"), (like_pattern(needle),)

    def __call__(self) -> object:
        return self.conn.execute(self.sql, self.args).fetchall()

    def close(self) -> None:
        self.conn.close()


#: Timed runs of one function in a row, in ``alternating``.
BLOCK = 5


def alternating(fns: dict[str, Callable[[], object]], n: int, warmup: int) -> dict[str, list[float]]:
    """``n`` timed runs of each of ``fns``, taken in turn, a block of ``BLOCK`` runs of one
    and then of the next, so that a machine busier at one moment weighs on all of them
    alike. Each block starts with one untimed run: a figure is of a warm path, as back to
    back runs measure it, not of one that another's run just left cold (a 100,000-row
    scan floor between two daemon round trips made each of them cost twice its time)."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    out: dict[str, list[float]] = {k: [] for k in fns}
    while len(next(iter(out.values()))) < n:
        for k, fn in fns.items():
            fn()
            for _ in range(min(BLOCK, n - len(out[k]))):
                t = time.perf_counter()
                fn()
                out[k].append(time.perf_counter() - t)
    return out


def sqlite_commit_floor(tmp: Path, n: int) -> tuple[float, float]:
    """Raw sqlite3: one INSERT per transaction, WAL, synchronous=FULL; commits per second,
    and the WAL pages each commit wrote (counted as bench/anatomy.py counts them)."""
    from .anatomy import wal_pages

    path = tmp / "floor-commit.db"
    for stale in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        stale.unlink(missing_ok=True)  # taken again in every block of the write suite
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute("CREATE TABLE e (id TEXT PRIMARY KEY, text TEXT)")
    page_size = int(conn.execute("PRAGMA page_size").fetchone()[0])
    before = wal_pages(path, page_size)
    t = time.perf_counter()
    for i in range(n):
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO e VALUES (?, ?)", (f"id-{i}", f"fact {i}: a floor row of about the same size"))
        conn.execute("COMMIT")
    rate = n / (time.perf_counter() - t)
    pages = (wal_pages(path, page_size) - before) / n
    conn.close()
    return rate, pages


_ECHO = ("import socket,sys\ns=socket.socket(fileno=int(sys.argv[1]))\nc,_=s.accept()\n"
         "f=c.makefile('rb')\nfor l in f: c.sendall(l)\n")


def echo_floor(tmp: Path, n: int) -> list[float]:
    """A Unix-socket echo round trip of a query-sized line, to a Python echo process. The
    listening socket is made here and inherited, so it accepts before the child runs."""
    path = str(tmp / "echo.sock")
    lsock = socket.socket(socket.AF_UNIX)
    lsock.bind(path)
    lsock.listen(1)
    proc = subprocess.Popen([sys.executable, "-c", _ECHO, str(lsock.fileno())], pass_fds=(lsock.fileno(),))
    lsock.close()
    try:
        c = Line(path)
        msg = {"jsonrpc": "2.0", "id": 0, "method": "memory/query", "params": query_params("postgres")}

        def one() -> None:  # what a query's round trip costs the client, and the socket
            c.send(msg)
            _dec.decode(c.readline())

        out = timed(one, n, warmup=20)
        c.close()
        return out
    finally:
        proc.kill()
        proc.wait()


def floors(ctx: Ctx) -> None:
    r = ctx.results.setdefault("floors", {})
    log("floors: sqlite FULL commits")
    rate, pages = sqlite_commit_floor(ctx.tmp, ctx.p.floor_commits)
    r["sqlite_full_commits_per_s"] = round(rate, 1)
    r["sqlite_full_wal_pages_per_commit"] = round(pages, 2)
    log("floors: what one memory/add commits, layer by layer")
    from .anatomy import write_anatomy

    r["write_anatomy"] = write_anatomy(ctx.store(2_000 if 2_000 in ctx.p.sizes else ctx.p.sizes[0]), ctx.tmp,
                                       ctx.p.floor_commits)
    log("floors: unix-socket echo")
    r["echo"] = summary(echo_floor(ctx.tmp, max(ctx.p.query_reps.values())))
    log("floors: python -c pass")
    r["python_pass"] = summary([python_pass() for _ in range(ctx.p.starts)])
    # the in-process scan floors are measured by ``query``, alternating with the daemon's figures


# --- queries -------------------------------------------------------------------------


def query(ctx: Ctx) -> None:
    """The round trips, each needle's alternating with its in-process scan floors (LIKE and
    instr, on the seeded store), which go into ``floors``: the ratios compare figures of the
    same moments, not of runs minutes apart on a shared machine."""
    out: dict[str, Any] = {}
    scans: dict[str, dict[str, Any]] = {}
    instr: dict[str, dict[str, Any]] = {}
    for n in ctx.p.sizes:
        seed = ctx.store(n)
        db = ctx.copy(n, f"query-{n}")
        with daemon(ctx, f"q{n}", db) as d, contextlib.ExitStack() as stack:
            log(f"query: {n} entries, each needle beside its in-process scans")
            c = Line(d.sock)
            before: Line | None = None
            if ctx.base is not None:
                b = stack.enter_context(daemon(ctx, f"q{n}-before", ctx.copy(n, f"query-{n}-before"), base=ctx.base))
                before = Line(b.sock)
                stack.callback(before.close)
            reps = ctx.p.query_reps[n]
            row: dict[str, Any] = {}
            scans[str(n)], instr[str(n)] = {}, {}
            for label, needle in NEEDLES.items():
                params = query_params(needle)
                total = c.call("memory/query", params)["total"]

                def one(c: Line = c, params: dict[str, Any] = params) -> object:
                    return c.call("memory/query", params)

                floors_ = [ScanFloor(seed, needle)] + ([ScanFloor(seed, needle, instr=True)] if needle else [])
                try:
                    fns: dict[str, Callable[[], object]] = {"daemon": one, "scan": floors_[0]}
                    if needle is not None:
                        fns["instr"] = floors_[1]
                    if before is not None:
                        fns["before"] = lambda b=before, params=params: b.call("memory/query", params)
                    times = alternating(fns, reps, warmup=min(reps, 5))
                finally:
                    for f in floors_:
                        f.close()
                row[label] = {**summary(times["daemon"]), "hits": total}
                if "before" in times:
                    ctx.results.setdefault("query_before", {}).setdefault(str(n), {})[label] = summary(times["before"])
                scans[str(n)][label] = summary(times["scan"])
                if "instr" in times:
                    instr[str(n)][label] = summary(times["instr"])
            if ctx.profiler is not None and n == 2_000:
                def load(c: Line = c, reps: int = reps) -> None:  # every needle in turn, after the measured runs
                    for _ in range(max(1, reps // 3)):
                        for needle in NEEDLES.values():
                            c.call("memory/query", query_params(needle))

                ctx.profiler("queries", d.pid, load)
            c.close()
            out[str(n)] = row
    ctx.results["query"] = out
    ctx.results.setdefault("floors", {}).update(scan=scans, scan_instr=instr)


# --- writes --------------------------------------------------------------------------

async def _writer(sock: str, k: int, count: int, ask: bool) -> None:
    r, w = await asyncio.open_unix_connection(sock, limit=1 << 22)
    try:
        for i in range(1, count + 1):
            w.write(_enc.encode({"jsonrpc": "2.0", "id": i, "method": "memory/add", "params": {
                "input": {"track": "agent", "scope": "workspace", "text": f"client {k} fact {i}: the bench wrote it"},
                "write": WRITE}}) + b"\n")
            while True:
                line = await r.readline()
                if not line:
                    raise ConnectionError("the daemon closed the connection")
                msg = _dec.decode(line)
                if msg.get("id") == i:
                    if "result" not in msg:
                        raise RuntimeError(msg)
                    break
                if ask and msg.get("method") == "approval/asked":
                    w.write(_enc.encode({"jsonrpc": "2.0", "method": "approval/decided",
                                         "params": {"id": msg["params"]["id"], "outcome": "allowed-once"}}) + b"\n")
    finally:
        w.close()


async def _write_load(sock: str, clients: int, total: int, ask: bool) -> tuple[int, float]:
    per = max(1, total // clients)
    t = time.perf_counter()
    await asyncio.gather(*(_writer(sock, k, per, ask) for k in range(clients)))
    return per * clients, time.perf_counter() - t


def write_rate(d: Daemon, clients: int, total: int, ask: bool = False) -> dict[str, float]:
    cpu0 = _cpu_s(d.pid)
    done, elapsed = asyncio.run(_write_load(d.sock, clients, total, ask))
    cpu = _cpu_s(d.pid) - cpu0
    return {"writes": done, "seconds": round(elapsed, 3), "per_s": round(done / elapsed, 1),
            "daemon_cpu_us_per_write": round(cpu / done * 1e6, 1)}


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def writes(ctx: Ctx) -> None:
    """Each policy × clients in blocks: the FULL commit floor, then every build's writes (in
    turn, the order swapped every block), so each block's ratio compares figures of the
    same minute; the row is the median over the blocks, with the ratio's spread."""
    out: dict[str, Any] = {"store_starts_at": ctx.p.write_store_size}
    before_out: dict[str, Any] = {}
    builds: list[tuple[str, Path | None]] = [("after", None)] + ([("before", ctx.base)] if ctx.base else [])
    blocks = ctx.p.write_blocks
    for policy, clients_list in (("auto", ctx.p.clients), ("ask", ctx.p.ask_clients)):
        for clients in clients_list:
            key, ask = f"{policy}/{clients}", policy == "ask"
            with contextlib.ExitStack() as stack:
                ds = {build: stack.enter_context(daemon(ctx, f"w{policy}{clients}{build}", ctx.copy(
                    ctx.p.write_store_size, f"w-{policy}-{clients}-{build}"), policy, base)) for build, base in builds}
                log(f"writes: {policy}, {clients} clients, {blocks} blocks of the floor and {len(ds)} build(s)")
                for d in ds.values():
                    write_rate(d, clients, max(clients, 20), ask)  # warm up
                rows: dict[str, list[dict[str, float]]] = {build: [] for build in ds}
                floors_: list[float] = []
                for k in range(blocks):
                    floors_.append(sqlite_commit_floor(ctx.tmp, max(20, ctx.p.floor_commits // blocks))[0])
                    for build in (list(ds) if k % 2 == 0 else list(ds)[::-1]):
                        rows[build].append(write_rate(ds[build], clients, max(clients, ctx.p.writes_total // blocks), ask))
                for build, target in (("after", out), ("before", before_out)):
                    if build in rows:
                        target[key] = _blocks_summary(rows[build], floors_)
                if ctx.profiler is not None and policy == "auto" and clients == 16:
                    d = ds["after"]
                    ctx.profiler("writes", d.pid, lambda d=d: write_rate(d, 16, 2 * ctx.p.writes_total))
    ctx.results["writes"] = out
    if before_out:
        ctx.results["writes_before"] = before_out


def _blocks_summary(rows: list[dict[str, float]], floors_: list[float]) -> dict[str, Any]:
    ratios = [r["per_s"] / f for r, f in zip(rows, floors_, strict=True)]
    return {"writes": sum(int(r["writes"]) for r in rows),
            "per_s": round(statistics.median(r["per_s"] for r in rows), 1),
            "daemon_cpu_us_per_write": round(statistics.median(r["daemon_cpu_us_per_write"] for r in rows), 1),
            "floor_per_s": round(statistics.median(floors_), 1),
            "x_floor": round(statistics.median(ratios), 3),
            "x_floor_spread": [round(min(ratios), 3), round(max(ratios), 3)],
            "blocks": [{"per_s": r["per_s"], "floor_per_s": round(f, 1)} for r, f in zip(rows, floors_, strict=True)]}


# --- starts and the CLI --------------------------------------------------------------

_INIT = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}).encode() + b"\n"


def stdio_start(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, int]:
    """Spawn ``cmd`` and send ``initialize``: seconds until it is answered, and peak RSS (kB)."""
    t = time.perf_counter()
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    assert p.stdin and p.stdout
    p.stdin.write(_INIT)
    p.stdin.flush()
    line = p.stdout.readline()
    elapsed = time.perf_counter() - t
    if b'"result"' not in line:
        p.kill()
        p.wait()
        raise RuntimeError(f"{cmd[0]}: no initialize result: {line[:200]!r}")
    peak = rss_kb(p.pid, "VmHWM")
    p.stdin.close()
    p.wait()
    return elapsed, peak


def start(ctx: Ctx) -> None:
    out: dict[str, Any] = {}
    with daemon(ctx, "start", ctx.copy(2_000 if 2_000 in ctx.p.sizes else ctx.p.sizes[0], "start")) as d:
        relay = [*console("memoryd"), "serve", "--stdio", "--socket", d.sock, "--db", str(d.db),
                 "--log-level", "warning"]
        log("start: relay")
        ours, floor = [], []
        for _ in range(ctx.p.starts):  # alternating, so both see the same machine
            ours.append(stdio_start(relay)[0])
            floor.append(python_pass())
        out["relay"] = summary(ours)
        out["relay_python_pass"] = summary(floor)
    log("start: --standalone")
    ours, floor = [], []
    for i in range(ctx.p.starts):
        ours.append(stdio_start([*console("memoryd"), "serve", "--stdio", "--standalone", "--db",
                                 str(ctx.tmp / f"standalone-{i}.db"), "--log-level", "warning"])[0])
        floor.append(python_pass())
    out["standalone"] = summary(ours)
    out["standalone_python_pass"] = summary(floor)
    # the daemon's own start: spawn → READY=1 (store open, socket accepting), empty vs largest store
    big = max(ctx.p.sizes)
    log(f"start: daemon ready, empty store and {big} entries")
    empty: list[float] = []
    full: list[float] = []
    for i in range(ctx.p.ready_reps):
        for into, db in ((empty, ctx.tmp / f"ready-empty-{i}.db"), (full, ctx.copy(big, f"ready-{i}"))):
            t = time.perf_counter()
            d = start_daemon(ctx.tmp, f"ready{i}", db)
            into.append(time.perf_counter() - t)
            d.stop()
    out["ready_empty"] = summary(empty)
    out["ready_big"] = summary(full)
    out["ready_big_entries"] = big
    ctx.results["start"] = out


def cli(ctx: Ctx) -> None:
    out: dict[str, Any] = {}
    with daemon(ctx, "cli", ctx.copy(2_000 if 2_000 in ctx.p.sizes else ctx.p.sizes[0], "cli")) as d:
        base = [*console("memoryctl"), "--socket", d.sock, "--no-autostart"]
        for verb, args in (("query", ["query", "postgres"]), ("status", ["status"])):
            log(f"cli: memoryctl {verb}")
            ours, floor = [], []
            for _ in range(ctx.p.cli_runs):
                t = time.perf_counter()
                subprocess.run([*base, *args], check=True, stdout=subprocess.DEVNULL)
                ours.append(time.perf_counter() - t)
                floor.append(python_pass())
            out[verb] = summary(ours)
            out[f"{verb}_python_pass"] = summary(floor)
    ctx.results["cli"] = out


# --- memory --------------------------------------------------------------------------


def rss(ctx: Ctx) -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = ctx.p.idle_conns + 64
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(max(need, soft), hard), hard))
    out: dict[str, Any] = {}
    with daemon(ctx, "rss", ctx.copy(2_000 if 2_000 in ctx.p.sizes else ctx.p.sizes[0], "rss")) as d:
        log("rss: idle")
        out["idle_kb"] = rss_kb(d.pid)
        c = Line(d.sock)
        c.call("initialize", {})
        c.call("memory/query", query_params("postgres"))
        out["after_first_query_kb"] = rss_kb(d.pid)
        log(f"rss: {ctx.p.idle_conns} idle connections")
        conns = []
        for _ in range(ctx.p.idle_conns):
            s = socket.socket(socket.AF_UNIX)
            s.connect(d.sock)
            s.sendall(_INIT)
            conns.append((s, s.makefile("rb")))
        for _s, f in conns:  # every one initialized: each is a live, idle session
            if b'"result"' not in f.readline():
                raise RuntimeError("an idle connection was not initialized")
        out["connections"] = c.call("daemon/status", {})["connections"]
        out["idle_conns"] = ctx.p.idle_conns
        out["with_idle_conns_kb"] = rss_kb(d.pid)
        out["peak_kb"] = rss_kb(d.pid, "VmHWM")
        for s, f in conns:
            f.close()
            s.close()
        c.close()
    ctx.results["rss"] = out
