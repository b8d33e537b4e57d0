"""What every benchmark shares: statistics, a blocking NDJSON client, the facts and needles,
seeded stores, and real daemons started on READY=1."""

from __future__ import annotations

import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent

#: The start-up targets, in one place: each start's bound as a multiple of ``python -c pass``
#: measured beside it (RESULTS.md's targets and ``python -m bench.startup`` read them).
START_BOUNDS = {"relay": 4.0, "mcp": 4.0, "memoryctl query": 5.0, "memoryctl status": 5.0}

WRITE = {"agent": {"session": {"id": "bench", "header": {"cwd": "/bench"}}}}

# --- statistics ----------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def summary(values_s: list[float]) -> dict[str, float]:
    """Seconds in, microseconds out: n, p50, p90, p99, mean."""
    us = [v * 1e6 for v in values_s]
    return {"n": len(us), "p50_us": round(statistics.median(us), 1), "p90_us": round(pct(us, 0.9), 1),
            "p99_us": round(pct(us, 0.99), 1), "mean_us": round(statistics.fmean(us), 1)}


def timed(fn: Callable[[], object], n: int, warmup: int = 0) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


# --- facts and needles ----------------------------------------------------------------

_WORDS = (
    "build system uses make for release tags and pytest runs in the ci pipeline with coverage gates; "
    "postgres holds the orders schema behind pgbouncer while sqlite caches the session tokens locally; "
    "deploys go through terraform and helm charts on the staging cluster before production rollouts; "
    "the user prefers tabs over spaces, dark themes, short commit messages and squash merges; "
    "queue workers retry failed jobs three times with exponential backoff and jitter; "
    "logs ship to loki, metrics to prometheus, traces to tempo; the gui is built with react and vite"
).replace(";", "").replace(",", "").split()

#: label → needle. "every" is found in every row; the CJK one in 2% of rows, ``yzz`` in 1%.
NEEDLES: dict[str, str | None] = {
    "1 char": "q",
    "2 chars": "ui",
    "3 chars": "yzz",
    "8 chars": "postgres",
    "CJK": "数据库",
    "every row": "fact",
    "no text": None,
}


def fact(i: int) -> str:
    rng = random.Random(i)
    words = " ".join(rng.choice(_WORDS) for _ in range(7))
    text = f"fact {i}: {words}"
    if i % 100 == 7:
        text += " (xyzzy)"
    if i % 50 == 3:
        text += " 使用数据库迁移"
    return text


def seed_store(path: Path, n: int) -> None:
    """A store of ``n`` facts written with memoryd's own store functions (schema, text index
    and what it keeps beside them), then :func:`settle`d: what a daemon then serves."""
    from memoryd import ledger, store, storefile
    from memoryd_protocol.types import Entry

    if path.exists():
        path.unlink()
    storefile.prepare_path(path)
    conn = storefile.open_store(path, storefile.inspect(path))
    try:
        base = store.now_ms() - n
        with ledger.transaction(conn) as tx:
            for i in range(n):
                ts = base + i
                store.insert_entry(tx, Entry(
                    id=f"00000000-0000-4000-8000-{i:012d}", track="agent", scope="user-global", workspace_key="",
                    text=fact(i), source="bench", created_at=ts, updated_at=ts, session_id=None, agent_key="",
                    last_recalled=None, recall_count=0, tags=[], version=1))
    finally:
        conn.close()
    settle(path)


def settle(path: Path) -> None:
    """One daemon run on the store: it brings what it keeps beside the entries up to date
    (at worst a rebuild), and an add and a remove leave its own audit chain's head newest, so
    that later starts trust the store as one memoryd wrote and rebuild nothing. The entries
    are as seeded afterwards."""
    d = start_daemon(path.parent, f"settle-{path.stem}", path)
    try:
        c = Line(d.sock)
        added = c.call("memory/add", {"input": {"track": "user", "scope": "user-global", "text": "settled"},
                                      "write": WRITE})
        c.call("memory/remove", {"input": {"track": "user", "scope": "user-global", "id": added["entry"]["id"]},
                                 "write": WRITE})
        c.close()
    finally:
        d.stop()


def copy_store(src: Path, dst: Path) -> Path:
    for suffix in ("", "-wal", "-shm"):
        if Path(str(src) + suffix).exists():
            shutil.copyfile(str(src) + suffix, str(dst) + suffix)
    return dst


# --- processes ------------------------------------------------------------------------


def rss_kb(pid: int, key: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return -1


def console(name: str) -> list[str]:
    """What a user runs: the installed script (``python -m`` adds runpy)."""
    script = BIN / name
    module = {"memoryd": "memoryd", "memoryctl": "memoryd_client"}[name]
    return [str(script)] if script.exists() else [sys.executable, "-m", module]


@dataclass
class Daemon:
    proc: subprocess.Popen[bytes]
    sock: str
    db: Path
    log: Path
    args: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_daemon(tmp: Path, name: str, db: Path, policy: str = "auto", config: str = "",
                 base: Path | None = None) -> Daemon:
    """``memoryd serve --socket --db --config`` returned once it sent READY=1 (memoryd's own
    launcher: a private NOTIFY_SOCKET and a pidfd, no polling). ``base``: a checkout whose
    ``protocol/`` and ``daemon/`` it imports instead of this tree's (the "before" build)."""
    from memoryd.launch import spawn_ready

    sock = str(tmp / f"{name}.sock")
    cfg = tmp / f"{name}.toml"
    # Room for every benchmark write, and for 1,000 idle connections.
    cfg.write_text("max_connections = 4096\n[budgets.agent]\nworkspace = 10000000\nuser_global = 10000000\n"
                   + config)
    log = tmp / f"{name}.log"
    args = ["--socket", sock, "--db", str(db), "--config", str(cfg), "--write-policy", policy,
            "--log-level", "warning"]
    env = _env(tmp, base)
    proc = spawn_ready(args, log=log, env=env)
    return Daemon(proc, sock, db, log, args)


# --- a blocking client ----------------------------------------------------------------


_enc = msgspec.json.Encoder()
_dec = msgspec.json.Decoder()


class Line:
    """A blocking NDJSON client, as lean as a real one: msgspec encodes each request and
    decodes each reply (the stdlib json costs 2-5x as much: about 48 µs against 20 to decode
    a 20-entry page), and replies are split from one ``recv`` buffer."""

    def __init__(self, path: str) -> None:
        self.s = socket.socket(socket.AF_UNIX)
        self.s.connect(path)
        self._buf = b""
        self.n = 0

    def send(self, message: Any) -> None:
        self.s.sendall(_enc.encode(message) + b"\n")

    def readline(self) -> bytes:
        """The next line, without its newline."""
        buf = self._buf
        nl = buf.find(b"\n")
        while nl < 0:
            chunk = self.s.recv(65536)  # a larger size costs an mmap and munmap per call
            if not chunk:
                raise ConnectionError("the daemon closed the connection")
            nl = chunk.find(b"\n")
            if nl >= 0:
                nl += len(buf)
            buf += chunk
        self._buf = buf[nl + 1:]
        return buf[:nl]

    def call(self, method: str, params: Any) -> Any:
        self.n += 1
        self.send({"jsonrpc": "2.0", "id": self.n, "method": method, "params": params})
        while True:
            msg = _dec.decode(self.readline())
            if msg.get("id") == self.n:
                if "error" in msg:
                    raise RuntimeError(msg["error"])
                return msg["result"]

    def close(self) -> None:
        self.s.close()


def python_pass() -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return time.perf_counter() - t


def env_info() -> dict[str, Any]:
    import platform
    import sqlite3

    load = os.getloadavg()
    return {"python": sys.version.split()[0], "sqlite": sqlite3.sqlite_version, "cores": os.cpu_count(),
            "platform": platform.platform(), "loadavg_at_start": [round(x, 2) for x in load],
            "date_utc": time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime())}


def thread_cpu(pid: int) -> dict[int, tuple[str, float]]:
    """Per thread of ``pid``: its name and its seconds on a CPU (``schedstat``: nanoseconds,
    where ``stat`` counts 10 ms ticks)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
            out[int(tid)] = (name, int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0]) / 1e9)
        except OSError:
            continue  # the thread ended meanwhile
    return out


def start_build(tmp: Path, name: str, seed: Path, base: Path | None) -> tuple[subprocess.Popen[bytes], str]:
    """A daemon (policy ``auto``, budgets out of the way) on a copy of ``seed``, importing
    the checkout ``base``'s ``protocol/`` and ``daemon/`` instead of this tree's when given:
    one build of a before/after comparison (``bench.roundtrip``, ``bench.writecpu``). The
    process, started on its READY=1, and its socket."""
    from memoryd.launch import spawn_ready

    db = copy_store(seed, tmp / f"{name}.db")
    sock = str(tmp / f"{name}.sock")
    cfg = tmp / f"{name}.toml"
    cfg.write_text("max_connections = 4096\n[budgets.agent]\nworkspace = 10000000\nuser_global = 10000000\n")
    args = ["--socket", sock, "--db", str(db), "--config", str(cfg), "--write-policy", "auto", "--log-level", "warning"]
    return spawn_ready(args, log=tmp / f"{name}.log", env=_env(tmp, base)), sock


def _env(tmp: Path, base: Path | None) -> dict[str, str]:
    """A benchmark daemon's environment: its ledger heads witnessed under ``tmp``, not in the
    user's own heads file; with ``base``, that checkout's packages imported instead."""
    env = dict(os.environ, XDG_STATE_HOME=str(tmp))
    if base is not None:
        env["PYTHONPATH"] = os.pathsep.join(str(base / p) for p in ("protocol", "daemon"))
    return env


def close_child(proc: subprocess.Popen[bytes]) -> None:
    """End a stdio server child as a host does: close its input, wait (kill it after 10 s),
    close its output."""
    assert proc.stdin and proc.stdout
    proc.stdin.close()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    finally:
        proc.stdout.close()
