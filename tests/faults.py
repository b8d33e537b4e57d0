"""Crash trials against real daemons: kill -9 during bursts of mixed writes, then check the store.

One trial (:func:`run_trial`):

1. start ``memoryd serve`` (policy ``auto``, a temporary socket and store) and wait for its
   READY=1;
2. connect several clients over plain sockets; each sends bursts of independent writes
   (``memory/add``, ``replace`` and ``remove`` by id, ``consolidate``, ``seed``, ``import``),
   one line per call or one JSON-RPC batch per burst, and records every write whose success
   reply arrived (acknowledged), with what it did;
3. SIGKILL the daemon at a moment drawn from the trial's seeded RNG: at the n-th event (a
   line sent or a reply received), so that a seed names its point in the traffic whatever
   the load, or a few milliseconds after it (a timer), so that it also lands between events;
4. with the daemon dead, open the store with sqlite3 and :func:`check_store` it against the
   model: integrity, every acknowledged write present (or superseded by a later
   acknowledged one), every acknowledged removal absent, each write that had no reply
   applied whole or not at all (seed, import, consolidate included), nothing else present;
5. start a daemon on the same store and socket path, check that it serves exactly that
   store and takes a write, and stop it (exit 0).

Every text a trial writes carries a unique token ``<c{client}.{n}>``: it identifies an
entry whose id the test never learnt (a write killed before its reply), and it is the
unique substring ``consolidate`` matches on. Each client touches only the entries it
created itself, so the writes of one burst never depend on each other, and a write that
had no reply is, on its own, either applied or not.

Used by tests/test_e2e_crash.py (a few trials in CI) and bench/soak.py (hundreds).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import random
import shutil
import signal
import sqlite3
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memoryd_protocol.ledger_check import read_report

#: a trial that takes longer than this is a failure (a hung daemon or client)
TRIAL_TIMEOUT_S = 60.0
#: budgets no trial reaches: a write is refused only if the daemon is wrong
CONFIG = """\
[budgets.user]
user_global = 10000000
workspace = 10000000
[budgets.agent]
user_global = 10000000
workspace = 10000000
"""
CELLS: tuple[tuple[str, str], ...] = (
    ("user", "user-global"), ("user", "workspace"), ("agent", "user-global"), ("agent", "workspace"),
)
#: (what, weight): the mix of writes a client draws from
MIX: tuple[tuple[str, int], ...] = (
    ("add", 4), ("replace", 3), ("remove", 2), ("consolidate", 2), ("seed", 2), ("import", 2),
)
WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet",
         "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango")

#: what an entry must look like in the store: (track, scope, text)
Row = tuple[str, str, str]


class TrialFailed(AssertionError):
    """A trial found the store or the daemon wrong; the message names the seed."""


# ---------------------------------------------------------------------------------------------
# The model: what acknowledged writes did, and which writes were in flight at the kill


@dataclass(eq=False)
class Pending:
    """A write that was sent and had no reply when the daemon died: all of it or nothing.

    ``creates``: the rows it adds (ids unknown until a reply); ``replaces``: id → (old, new)
    row; ``removes``: id → row. A consolidate removes and creates; a seed or import creates.
    """

    method: str
    creates: list[Row] = field(default_factory=list)
    replaces: dict[str, tuple[Row, Row]] = field(default_factory=dict)
    removes: dict[str, Row] = field(default_factory=dict)


@dataclass
class Expected:
    """The store a trial must find: ``present`` after every acknowledged write, the ids an
    acknowledged write removed, and the writes without a reply (each applied whole or not)."""

    present: dict[str, Row] = field(default_factory=dict)
    removed: set[str] = field(default_factory=set)
    pending: list[Pending] = field(default_factory=list)
    #: acknowledged writes, by method
    acked: Counter[str] = field(default_factory=Counter)
    #: filled in by check_store: how many unanswered writes it found "applied", "not applied"
    unanswered: Counter[str] = field(default_factory=Counter)


def store_rows(db_path: Path) -> dict[str, Row]:
    with contextlib.closing(sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)) as conn:
        return {i: (t, s, x) for i, t, s, x in conn.execute("SELECT id, track, scope, text FROM entries")}


def verify_ledger(db_path: Path, *, ledger: bool = True) -> None:
    """The store's own consistency, offline (no daemon holds it): ``integrity_check``, then
    (``ledger``) what ``memoryctl audit verify --db`` checks: the hash chain, every audit row
    chained, and the replay of the ledger matching the live entries."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)) as conn:
            result = [r[0] for r in conn.execute("PRAGMA integrity_check")]
            report = read_report(lambda sql: conn.execute(sql).fetchall()) if ledger else None
    except sqlite3.DatabaseError as exc:
        raise TrialFailed(f"integrity_check: {exc}") from None
    if result != ["ok"]:
        raise TrialFailed(f"integrity_check: {result}")
    if report is not None and not report.ok:
        raise TrialFailed(f"audit verify: {[p.reason for p in report.problems]}")


def show(row: Row | None) -> str:
    """A row in a failure message: its cell and the start of its text (which names its token)."""
    if row is None:
        return "absent"
    text = row[2] if len(row[2]) <= 48 else row[2][:45] + "..."
    return f"{row[0]}/{row[1]} {text!r}"


def check_store(db_path: Path, expected: Expected, *, ledger: bool = True) -> None:
    """Raise TrialFailed unless the store at ``db_path`` (no daemon holding it) is one that
    the acknowledged writes and the unanswered ones, each whole or not at all, can give."""
    verify_ledger(db_path, ledger=ledger)
    rows = store_rows(db_path)
    problems: list[str] = []
    for i in sorted(expected.removed & rows.keys()):
        problems.append(f"entry {i} is present, but an acknowledged write removed it: {show(rows[i])}")
    want = dict(expected.present)
    #: rows the applied unanswered writes created, found by text (their ids never reached us)
    created: Counter[Row] = Counter()
    texts = Counter(r[2] for r in rows.values())
    for p in expected.pending:
        steps: list[tuple[str, bool]] = []  # each effect of the write, and whether the store shows it
        for i, (old, new) in p.replaces.items():
            if rows.get(i) not in (old, new):
                problems.append(f"unanswered {p.method} of {i}: found {show(rows.get(i))}, "
                                f"neither {show(old)} nor {show(new)}")
            steps.append((f"replace {i}", rows.get(i) == new))
        for i, row in p.removes.items():
            if i in rows and rows[i] != row:
                problems.append(f"unanswered {p.method} of {i}: found {show(rows[i])}, expected {show(row)} or absent")
            steps.append((f"remove {i}", i not in rows))
        steps += [(f"add {show(row)}", texts[row[2]] > 0) for row in p.creates]
        if all(done for _, done in steps):
            for i, (_, new) in p.replaces.items():
                want[i] = new
            for i in p.removes:
                want.pop(i, None)
            created.update(p.creates)
            expected.unanswered["applied"] += 1
        elif not any(done for _, done in steps):
            expected.unanswered["not applied"] += 1
        else:
            problems.append(f"unanswered {p.method} applied in part: "
                            + "; ".join(f"{what}: {'done' if done else 'not done'}" for what, done in steps))
    for i, row in sorted(want.items()):
        if i not in rows:
            problems.append(f"acknowledged entry {i} is lost: {show(row)}")
        elif rows[i] != row:
            problems.append(f"acknowledged entry {i} is {show(rows[i])}, expected {show(row)}")
    rest = Counter(row for i, row in rows.items() if i not in want)
    for row, n in sorted((rest - created).items()):
        problems.append(f"{n} entr{'y' if n == 1 else 'ies'} that no write asked for: {show(row)}")
    for row, n in sorted((created - rest).items()):
        problems.append(f"{n} entr{'y' if n == 1 else 'ies'} of an applied unanswered write missing: {show(row)}")
    if problems:
        raise TrialFailed(f"{len(problems)} problem(s) in {db_path}:\n  " + "\n  ".join(problems[:40]))


# ---------------------------------------------------------------------------------------------
# Clients


@dataclass
class Op:
    """One write call: its params, and the change it asks for (``pending.creates`` in the
    order of the entries its reply lists)."""

    method: str
    params: dict[str, Any]
    pending: Pending


class Killer:
    """Counts events (write lines sent, replies received) and SIGKILLs the daemon at the
    ``at``-th, or ``delay`` seconds after it (a timer, not a poll): the trial's moment. The
    event count lands the kill at the same point of the clients' traffic whatever the load;
    the delay lets it land where no client event is, such as between a commit and its reply."""

    def __init__(self, proc: subprocess.Popen[bytes], at: int, delay: float) -> None:
        self.proc = proc
        self.at = at
        self.delay = delay
        self.events = 0
        self.killed = asyncio.Event()

    def event(self) -> None:
        self.events += 1
        if self.events == self.at:
            if self.delay:
                asyncio.get_running_loop().call_later(self.delay, self.kill)
            else:
                self.kill()

    def kill(self) -> None:
        if not self.killed.is_set():
            self.proc.send_signal(signal.SIGKILL)
            self.killed.set()


class Client:
    def __init__(self, n: int, sock: Path, rng: random.Random, model: Expected, killer: Killer) -> None:
        self.n = n
        self.sock = sock
        self.rng = rng
        self.model = model
        self.killer = killer
        #: this client's entries as it last saw them acknowledged: id → row
        self.live: dict[str, Row] = {}
        self.ids = itertools.count(1)
        self.tokens = itertools.count(1)
        self.waiting: dict[int, tuple[Op, asyncio.Future[None]]] = {}
        self.errors: list[str] = []
        self.write = {"agent": {"session": {"id": f"crash-{n}",
                                            "header": {"cwd": f"/home/u/crash{n}", "agentPreset": f"agent{n}"}}}}
        self.reader: asyncio.StreamReader
        self.writer: asyncio.StreamWriter

    # --- wire

    async def connect(self) -> None:
        self.reader, self.writer = await asyncio.open_unix_connection(str(self.sock), limit=1 << 24)
        self.writer.write(json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "client": {"name": "faults", "version": "1"}, "capabilities": {"approvals": False}}}).encode() + b"\n")
        await self.writer.drain()
        while True:
            line = await self.reader.readline()
            if not line:
                raise ConnectionError("the daemon closed before answering initialize")
            msg = json.loads(line)
            if isinstance(msg, dict) and msg.get("id") == 0:
                if "error" in msg:
                    raise ConnectionError(f"initialize failed: {msg['error']}")
                return

    async def read(self) -> None:
        """Route replies until the daemon goes away; unanswered futures end then."""
        try:
            while line := await self.reader.readline():
                if not line.endswith(b"\n"):
                    break  # half a line: the daemon died writing it; no reply arrived
                msg = json.loads(line)
                for m in msg if isinstance(msg, list) else [msg]:
                    if "id" in m and m["id"] in self.waiting:
                        op, fut = self.waiting.pop(m["id"])
                        self.reply(op, m)
                        fut.set_result(None)
                        self.killer.event()
        except (ConnectionError, OSError):
            pass
        finally:
            for _, fut in self.waiting.values():
                if not fut.done():
                    fut.set_result(None)

    async def run(self) -> None:
        reading = asyncio.create_task(self.read())
        try:
            while not self.killer.killed.is_set() and not reading.done():
                calls: list[tuple[Op, dict[str, Any]]] = [
                    (op, {"jsonrpc": "2.0", "id": next(self.ids), "method": op.method, "params": op.params})
                    for op in self.burst()]
                # a burst goes out one line per call, or as one JSON-RPC batch
                lines = [calls] if len(calls) > 1 and self.rng.random() < 0.3 else [[c] for c in calls]
                futs: list[asyncio.Future[None]] = []
                for line in lines:
                    if self.killer.killed.is_set() or reading.done():
                        break
                    for op, msg in line:  # in flight from now on: unanswered if no reply comes
                        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                        self.waiting[msg["id"]] = (op, fut)
                        self.model.pending.append(op.pending)
                        futs.append(fut)
                    data = [msg for _, msg in line] if len(line) > 1 else line[0][1]
                    try:
                        self.writer.write(json.dumps(data).encode() + b"\n")
                    except (ConnectionError, OSError):
                        break
                    self.killer.event()
                with contextlib.suppress(ConnectionError, OSError):
                    await self.writer.drain()
                if futs:
                    await asyncio.wait(futs)
        finally:
            await reading
            self.writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await self.writer.wait_closed()

    # --- writes

    def text(self) -> str:
        words = " ".join(self.rng.choice(WORDS) for _ in range(self.rng.choice((2, 8, 40, 200))))
        return f"crash note <c{self.n}.{next(self.tokens)}> {words}"

    def token(self, text: str) -> str:
        return text[text.index("<"):text.index(">") + 1]

    def burst(self) -> list[Op]:
        ops: list[Op] = []
        busy: set[str] = set()  # entries a write of this burst already targets
        for _ in range(self.rng.randint(1, 4)):
            free = [i for i in self.live if i not in busy]
            kinds, weights = zip(*MIX, strict=True)
            kind = self.rng.choices(kinds, weights)[0]
            if kind in ("replace", "remove") and not free:
                kind = "add"
            if kind == "consolidate":
                by_cell: dict[tuple[str, str], list[str]] = {}
                for i in free:
                    by_cell.setdefault(self.live[i][:2], []).append(i)
                cells = [ids for ids in by_cell.values() if len(ids) >= 2]
                if not cells:
                    kind = "seed"
            if kind == "add":
                ops.append(self.add())
            elif kind == "replace":
                ops.append(self.replace(self.rng.choice(free)))
            elif kind == "remove":
                ops.append(self.remove(self.rng.choice(free)))
            elif kind == "consolidate":
                ids = self.rng.choice(cells)
                ops.append(self.consolidate(self.rng.sample(ids, min(len(ids), self.rng.randint(2, 3)))))
            else:
                ops.append(self.batch(kind))
            busy |= ops[-1].pending.replaces.keys() | ops[-1].pending.removes.keys()
        return ops

    def add(self) -> Op:
        track, scope = self.rng.choice(CELLS)
        row = (track, scope, self.text())
        params = {"input": {"track": track, "scope": scope, "text": row[2]}, "write": self.write}
        return Op("memory/add", params, Pending("memory/add", creates=[row]))

    def replace(self, i: str) -> Op:
        old = self.live[i]
        new = (old[0], old[1], self.text())
        params = {"input": {"track": old[0], "scope": old[1], "id": i, "text": new[2]}, "write": self.write}
        return Op("memory/replace", params, Pending("memory/replace", replaces={i: (old, new)}))

    def remove(self, i: str) -> Op:
        old = self.live[i]
        params = {"input": {"track": old[0], "scope": old[1], "id": i}, "write": self.write}
        return Op("memory/remove", params, Pending("memory/remove", removes={i: old}))

    def consolidate(self, ids: list[str]) -> Op:
        track, scope = self.live[ids[0]][:2]
        row = (track, scope, self.text())
        params = {"input": {"track": track, "scope": scope, "matches": [self.token(self.live[i][2]) for i in ids],
                            "text": row[2]}, "write": self.write}
        pending = Pending("memory/consolidate", creates=[row], removes={i: self.live[i] for i in ids})
        return Op("memory/consolidate", params, pending)

    def batch(self, method: str) -> Op:
        rows = [(*self.rng.choice(CELLS), self.text()) for _ in range(self.rng.randint(1, 6))]
        inputs = [{"track": t, "scope": s, "text": x} for t, s, x in rows]
        if method == "seed":
            params: dict[str, Any] = {"inputs": inputs, "write": self.write}
        else:
            envelope = {"plugin": "dsh-memento", "schema": "memory-export-v1", "entries": inputs}
            params = {"envelope": envelope, "write": self.write}
        return Op(f"memory/{method}", params, Pending(f"memory/{method}", creates=rows))

    def reply(self, op: Op, msg: dict[str, Any]) -> None:
        """Apply an acknowledged write to the model (and this client's view of its entries)."""
        self.model.pending.remove(op.pending)
        if "error" in msg:
            # Every write a trial sends is valid under policy auto and ample budgets.
            self.errors.append(f"{op.method} failed: {json.dumps(msg['error'])}")
            return
        r = msg["result"]
        created: list[dict[str, Any]]
        if op.method in ("memory/seed", "memory/import"):
            created = r["entries"]
        elif op.method in ("memory/add", "memory/consolidate"):
            created = [r["entry"]]
        else:
            created = []
        got = [(e["track"], e["scope"], e["text"]) for e in created]
        if got != op.pending.creates:
            self.errors.append(f"{op.method} answered entries {got!r}, asked {op.pending.creates!r}")
        if op.method == "memory/consolidate" and sorted(e["id"] for e in r["removed"]) != sorted(op.pending.removes):
            self.errors.append(f"consolidate removed {r['removed']!r}, asked {sorted(op.pending.removes)}")
        for i, (_, new) in op.pending.replaces.items():
            if (r["entry"]["id"], r["entry"]["text"]) != (i, new[2]):
                self.errors.append(f"replace of {i} answered {r['entry']!r}")
            self.live[i] = self.model.present[i] = new
        if op.method == "memory/remove" and [r["entry"]["id"]] != list(op.pending.removes):
            self.errors.append(f"remove of {list(op.pending.removes)} answered {r['entry']!r}")
        for i in op.pending.removes:
            del self.live[i]
            del self.model.present[i]
            self.model.removed.add(i)
        for e, row in zip(created, op.pending.creates, strict=False):
            self.live[e["id"]] = self.model.present[e["id"]] = row
        self.model.acked[op.method] += 1


# ---------------------------------------------------------------------------------------------
# Daemons


def spawn(workdir: Path, sock: Path, db: Path, name: str) -> subprocess.Popen[bytes]:
    """A daemon on ``sock`` and ``db``, returned once it said READY=1."""
    from memoryd.launch import LaunchFailed, spawn_ready

    config = workdir / "crash.toml"
    if not config.exists():
        config.write_text(CONFIG)
    log = workdir / f"{name}.log"
    args = ["--socket", str(sock), "--db", str(db), "--config", str(config), "--write-policy", "auto",
            "--log-level", "warning"]
    try:
        return spawn_ready(args, log=log)
    except LaunchFailed as exc:
        raise TrialFailed(f"{name}: memoryd failed to start: {exc}\n{log.read_text(errors='replace')}") from None


def call(sock: Path, method: str, params: Any) -> Any:
    """One blocking call on a fresh connection (for the restarted daemon)."""
    import socket

    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(30)
        s.connect(str(sock))
        s.sendall(json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode() + b"\n")
        with s.makefile("rb") as f:
            while line := f.readline():
                msg = json.loads(line)
                if msg.get("id") == 1:
                    if "error" in msg:
                        raise TrialFailed(f"restarted daemon: {method} failed: {msg['error']}")
                    return msg["result"]
    raise TrialFailed(f"restarted daemon closed before answering {method}")


def restart_and_serve(workdir: Path, sock: Path, db: Path) -> None:
    """A daemon starts on the killed one's store and socket path, serves exactly that store,
    takes a write, and stops cleanly."""
    before = store_rows(db)
    proc = spawn(workdir, sock, db, "restarted")
    try:
        listed = {e["id"]: (e["track"], e["scope"], e["text"]) for e in call(sock, "memory/list", {})}
        if listed != before:
            raise TrialFailed(f"the restarted daemon lists {len(listed)} entries, the store holds {len(before)}")
        write = {"agent": {"session": {"id": "after", "header": {"cwd": "/home/u/after", "agentPreset": ""}}}}
        added = call(sock, "memory/add", {"input": {"track": "user", "scope": "user-global",
                                                    "text": "written after the crash"}, "write": write})
        if added["entry"]["text"] != "written after the crash":
            raise TrialFailed(f"the restarted daemon answered {added!r}")
    finally:
        proc.send_signal(signal.SIGTERM)
        rc: int | None
        try:
            rc = proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            rc = None
    if rc != 0:
        raise TrialFailed(f"the restarted daemon exited {rc} on SIGTERM")
    log = (workdir / "restarted.log").read_text(errors="replace")
    if "Traceback" in log:
        raise TrialFailed(f"the restarted daemon logged a traceback:\n{log}")
    if store_rows(db) != {**before, added["entry"]["id"]: ("user", "user-global", "written after the crash")}:
        raise TrialFailed("the store after the restarted daemon is not the crashed store plus its one write")


# ---------------------------------------------------------------------------------------------
# Trials


@dataclass
class TrialResult:
    seed: int
    #: acknowledged writes, by method
    acked: Counter[str]
    #: writes in flight at the kill (each checked all-or-nothing), by "applied", "not applied"
    unanswered: Counter[str]
    #: entries in the store after the kill
    entries: int
    #: when the daemon was killed
    moment: str
    seconds: float


@contextlib.contextmanager
def trial_dirs(base: Path | None, seed: int) -> Iterator[tuple[Path, Path]]:
    """A work directory (store, logs) and a short socket directory (a socket path has at most
    107 bytes). Both are removed after a passing trial; a failing one keeps its work directory
    (the store and the daemon's log are the evidence)."""
    workdir = Path(tempfile.mkdtemp(prefix=f"crash-{seed}-", dir=base))
    sockdir = Path(tempfile.mkdtemp(prefix="md-", dir="/tmp"))
    try:
        yield workdir, sockdir
    except BaseException:
        shutil.rmtree(sockdir, ignore_errors=True)
        raise
    shutil.rmtree(workdir, ignore_errors=True)
    shutil.rmtree(sockdir, ignore_errors=True)


async def _crash(sock: Path, proc: subprocess.Popen[bytes], rng: random.Random, model: Expected,
                 kill_at: int, delay: float) -> list[str]:
    killer = Killer(proc, kill_at, delay)
    clients = [Client(n, sock, rng, model, killer) for n in range(rng.randint(2, 5))]
    for c in clients:  # every client is connected and initialized before the first write
        await c.connect()
    await asyncio.gather(*(c.run() for c in clients))
    if not killer.killed.is_set():
        raise TrialFailed(f"every client lost its connection after {killer.events} events, before the kill")
    return [e for c in clients for e in c.errors]


def run_trial(seed: int, base: Path | None = None) -> TrialResult:
    """One crash trial (see the module's docstring); raises TrialFailed naming ``seed``."""
    started = time.monotonic()
    rng = random.Random(seed)
    # Most kills come within the first ~80 writes; one trial in eight runs long enough for the
    # WAL to reach its auto-checkpoint (1000 pages, some 300 writes), so kills also land during
    # and after checkpoints.
    kill_at = rng.randint(600, 1500) if rng.random() < 0.125 else rng.randint(1, 160)
    delay = rng.choice((0.0, rng.uniform(0, 0.03)))
    moment = f"kill at event {kill_at}" + (f" + {delay * 1000:.1f} ms" if delay else "")
    workdir: Path | None = None
    try:
        with trial_dirs(base, seed) as (workdir, sockdir):
            sock, db = sockdir / "c.sock", workdir / "crash.db"
            model = Expected()
            proc = spawn(workdir, sock, db, "crashed")
            try:
                crash = _crash(sock, proc, rng, model, kill_at, delay)
                errors = asyncio.run(asyncio.wait_for(crash, TRIAL_TIMEOUT_S))
            finally:
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
            if errors:
                try:
                    check_store(db, model)
                except TrialFailed as exc:
                    errors.append(str(exc))
                raise TrialFailed("writes failed before the kill:\n  " + "\n  ".join(errors[:20]))
            if proc.returncode != -signal.SIGKILL:
                raise TrialFailed(f"the daemon exited {proc.returncode} before the kill")
            if "Traceback" in (log := (workdir / "crashed.log").read_text(errors="replace")):
                raise TrialFailed(f"the daemon logged a traceback before the kill:\n{log}")
            check_store(db, model)
            entries = len(store_rows(db))
            restart_and_serve(workdir, sock, db)
    except TrialFailed as exc:
        raise TrialFailed(f"crash trial seed={seed} ({moment}; evidence in {workdir}): {exc}") from None
    except Exception as exc:  # a hung trial (TimeoutError), a refused connection, a harness bug
        raise TrialFailed(f"crash trial seed={seed} ({moment}; evidence in {workdir}): "
                          f"{type(exc).__name__}: {exc}") from exc
    return TrialResult(seed, model.acked, model.unanswered, entries, moment, time.monotonic() - started)


def trial_seed(base: int, n: int) -> int:
    """The seed of trial ``n`` of a run based at ``base``: fixed, so a failure reproduces."""
    return base * 1_000_003 + n
