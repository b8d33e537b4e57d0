"""Restore and take over, with the real parts: a real daemon, a real Litestream shipping its
store to a file replica, and ``memoryctl restore`` / ``audit verify --against`` run as the
user runs them. A restore elsewhere after kill -9 holds every acknowledged write the
replica reached and nothing partial, and the daemon started on it continues the chain; a
copy that does not verify, or a store a daemon holds, changes nothing; the replica catches
a truncation or a full rehash that the heads file, rewritten too, no longer shows."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import add, entry_input, rechain, sql
from memoryd import litestream, replica
from memoryd_protocol.paths import heads_path_for
from rawclient import socket_client, write_ctx
from replicate_support import BUCKET, SECRET_KEY, Log, S3Server, credentials_file, file_config, s3_config

pytestmark = [pytest.mark.anyio, pytest.mark.process]

#: Litestream ships each transaction within this long, so a kill lands among shipped writes
FAST = {"sync-interval": "10ms", "monitor-interval": "10ms"}
#: kill -9 trials: each a fresh primary, killed after a different number of acknowledged writes
TRIALS = 6
#: the same against S3 on moto (each trial's replica a prefix of one bucket)
S3_TRIALS = 3


class Shipper:
    """``litestream replicate`` of one store to one replica, as the daemon's supervisor runs
    it (memoryd.litestream's config, argv and environment), its log lines read as they come."""

    def __init__(self, db: Path, table: dict[str, Any], workdir: Path) -> None:
        self.replica = replica.parse({**table, "litestream": {**table.get("litestream", {}), **FAST}})
        workdir.mkdir(parents=True, exist_ok=True)
        config = litestream.write_config(workdir, db, self.replica)
        env = {k: v for k, v in litestream.environment(self.replica).items() if k != "AWS_CA_BUNDLE"}
        self.proc = subprocess.Popen(litestream.argv("replicate", config, self.replica), env=env,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.said: list[str] = []
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            try:
                msg = str(json.loads(raw).get("msg"))
            except ValueError:
                msg = raw.decode(errors="replace")
            with self._cond:
                self.said.append(msg)
                self._cond.notify_all()

    def said_once(self, msg: str, timeout: float = 30.0) -> None:
        """Wait for Litestream's log line ``msg`` (its first snapshot: the replica exists)."""
        with self._cond:
            assert self._cond.wait_for(lambda: msg in self.said, timeout), self.said

    def stop(self) -> None:
        """SIGTERM: Litestream ships what it has not yet, then exits."""
        self.proc.terminate()
        assert self.ended() == 0

    def kill(self) -> None:
        self.proc.kill()
        self.ended()

    def ended(self) -> int:
        """Once Litestream has exited: its status, its log read to the end and closed."""
        code = self.proc.wait(30)
        self._reader.join(30)
        assert self.proc.stderr is not None
        self.proc.stderr.close()
        return code


@pytest.fixture
def shippers() -> Iterator[list[Shipper]]:
    started: list[Shipper] = []
    yield started
    for s in started:
        if not s.proc.stderr or not s.proc.stderr.closed:
            s.kill()


def ship(shippers: list[Shipper], db: Path, url: str | dict[str, Any], workdir: Path) -> Shipper:
    """Litestream shipping ``db`` to ``url`` (or a whole [replicate] table), once its first
    snapshot is in the replica."""
    s = Shipper(db, {"url": url} if isinstance(url, str) else url, workdir)
    shippers.append(s)
    s.said_once("snapshot complete")
    return s


def memoryctl(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "AWS_CA_BUNDLE"}
    return subprocess.run([sys.executable, "-m", "memoryd_client", *args], capture_output=True, text=True,
                          timeout=300, stdin=subprocess.DEVNULL, start_new_session=True, env=env)


def files_of(directory: Path) -> dict[str, str]:
    """Every file in ``directory`` and the sha256 of its bytes: what "changes nothing" means.
    A WAL store's ``-shm`` is named, not hashed: every reader marks its place there."""
    return {p.name: "" if p.name.endswith("-shm") else hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.iterdir()) if p.is_file()}


def ledger_of(db: Path) -> list[tuple[int, str, str]]:
    return [(int(n), str(p), str(h)) for n, p, h in sql(db, "SELECT n, prev, hash FROM memoryd_ledger ORDER BY n")]


async def test_a_restore_elsewhere_is_verified_installed_and_continued(daemon_factory: Any, shippers: list[Shipper],
                                                                     tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'replica'}"
    d = daemon_factory()
    shipper = ship(shippers, d.db_path, url, tmp_path / "ls")
    async with socket_client(d.socket_path) as raw:
        for text in ("Prefers tabs", "Uses uv", "Deploys on Fridays"):
            await add(raw, text)
    d.stop()
    shipper.stop()
    elsewhere = tmp_path / "devbox" / "memory.db"
    done = memoryctl("--db", str(elsewhere), "restore", url)
    assert done.returncode == 0, done.stderr
    rows = ledger_of(d.db_path)
    assert done.stdout == (f"restored {url} into {elsewhere}: ledger rows 1–{rows[-1][0]} verified (head "
                           f"{rows[-1][2][:16]})\n")
    assert (elsewhere.stat().st_mode & 0o777) == 0o600
    assert ledger_of(elsewhere) == rows
    assert sorted(p.name for p in elsewhere.parent.iterdir()) == ["memory.db", "memory.db.memoryd-heads"]
    assert memoryctl("audit", "verify", "--db", str(elsewhere)).returncode == 0

    new = daemon_factory(db=elsewhere, name="devbox")
    async with socket_client(new.socket_path) as raw:
        await add(raw, "Reviews on Mondays")
        report = await raw.ok("audit/verify")
        assert report["ok"] is True, report
        texts = sorted(e["text"] for e in await raw.ok("memory/list"))
    assert texts == ["Deploys on Fridays", "Prefers tabs", "Reviews on Mondays", "Uses uv"]
    after = ledger_of(elsewhere)
    assert after[:len(rows)] == rows and after[len(rows)][1] == rows[-1][2]  # the same chain, continued
    assert sql(elsewhere, "SELECT count(*) FROM memoryd_ledger WHERE kind = 'foreign'") == [(0,)]
    assert "did not stop cleanly" not in new.stderr() and " ERROR " not in new.stderr()


def _write_until_killed(d: Any, shipper: Shipper, kill_after: int) -> list[str]:
    """Four connections add entries; once ``kill_after`` are acknowledged, Litestream and the
    daemon are killed (-9) together, as a machine that dies. Returns the acknowledged
    entries' ids. Plain blocking sockets, one thread each: what the kill cuts is a peer's
    connection, nothing of the test's own event loop."""
    acked: list[str] = []
    lock = threading.Lock()

    def writer(k: int) -> None:
        with contextlib.ExitStack() as stack, socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(str(d.socket_path))
            lines = stack.enter_context(sock.makefile("rb"))

            def call(i: int, method: str, params: dict[str, Any]) -> dict[str, Any] | None:
                try:
                    sock.sendall(json.dumps({"jsonrpc": "2.0", "id": i, "method": method, "params": params}).encode()
                                 + b"\n")
                    while line := lines.readline():
                        message = json.loads(line)
                        if message.get("id") == i:  # not a notification (memory/added)
                            return dict(message)
                except OSError:
                    pass
                return None  # the kill closed this connection mid-request

            call(0, "initialize", {"protocol": "dsh-memory-protocol/v1", "client": {"name": "raw", "version": "0"},
                                   "capabilities": {"approvals": False}})
            for i in range(1, 1_000_000):
                reply = call(i, "memory/add", {"input": entry_input(f"writer {k} entry {i}"),
                                               "write": write_ctx(f"s-{k}")})
                if reply is None or "result" not in reply:
                    return
                with lock:
                    acked.append(reply["result"]["entry"]["id"])
                    if len(acked) == kill_after:
                        os.kill(shipper.proc.pid, signal.SIGKILL)
                        os.kill(d.proc.pid, signal.SIGKILL)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert d.proc.wait(30) == -signal.SIGKILL and shipper.ended() == -signal.SIGKILL
    return acked


def _row_of(db: Path, entry_id: str) -> int:
    """The ledger row of the audit row that added ``entry_id``."""
    [(n,)] = sql(db, "SELECT l.n FROM memoryd_ledger l JOIN audit a ON a.seq = l.audit_seq "
                     "WHERE a.entry_id = ? AND a.action = 'add'", entry_id)
    return int(n)


@pytest.mark.parametrize("kind", ["file", "s3"])
async def test_kill_9_during_writes_then_a_restore_elsewhere(daemon_factory: Any, shippers: list[Shipper],
                                                           tmp_path: Path, kind: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Each trial: a primary with Litestream shipping every transaction (to a file replica,
    or to S3 on moto), four writers, both killed -9 after a different number of
    acknowledged writes; then a restore on another machine (another directory). The copy is
    exactly the primary's chain up to the newest row the replica reached, so every
    acknowledged write up to there is in it, nothing partial; it verifies; and the new
    primary continues that chain."""
    monkeypatch.delenv("AWS_CA_BUNDLE", raising=False)
    rng = random.Random(29)
    trials = TRIALS if kind == "file" else S3_TRIALS
    with contextlib.ExitStack() as stack:
        server = S3Server() if kind == "s3" else None
        if server is not None:
            stack.callback(server.close)
            creds = credentials_file(tmp_path / "s3.env")
        for trial in range(trials):
            here = tmp_path / f"trial-{trial}"
            options: list[str] = []
            if server is None:
                url = f"file://{here / 'replica'}"
                table: dict[str, Any] = {"url": url}
            else:
                url = f"s3://{BUCKET}/trial-{trial}"
                table = {"url": url, "endpoint": server.endpoint, "region": "us-east-1",
                         "credentials_file": str(creds), "litestream": {"force-path-style": True}}
                cfg = tmp_path / f"restore-{trial}.toml"
                cfg.write_text(f'[replicate]\nurl = "{url}"\nendpoint = "{server.endpoint}"\nregion = "us-east-1"\n'
                               f'credentials_file = "{creds}"\n[replicate.litestream]\nforce-path-style = true\n')
                options = ["--config", str(cfg)]
            await _kill_trial(daemon_factory, shippers, here, trial, url, table, options, rng.randrange(5, 120))


async def _kill_trial(daemon_factory: Any, shippers: list[Shipper], here: Path, trial: int, url: str,
                  table: dict[str, Any], options: list[str], kill_after: int) -> None:
    """One kill -9 trial: the primary, its writers and Litestream to ``table``'s replica, the
    kill, the restore elsewhere (``options``: memoryctl's, the config naming an S3 endpoint)."""
    d = daemon_factory(db=here / "laptop.db", name=f"laptop-{trial}")
    async with socket_client(d.socket_path) as raw:
        await add(raw, "Prefers tabs")
    shipper = ship(shippers, d.db_path, table, here / "ls")
    acked = _write_until_killed(d, shipper, kill_after)
    elsewhere = here / "devbox" / "memory.db"
    done = memoryctl(*options, "--db", str(elsewhere), "restore", url)
    assert done.returncode == 0, done.stderr
    primary, copy = ledger_of(d.db_path), ledger_of(elsewhere)
    reached = copy[-1][0]
    assert copy == primary[:reached]  # the primary's own rows, none partial, none other
    present = {eid for (eid,) in sql(elsewhere, "SELECT id FROM entries")}
    expected = {eid for eid in acked if _row_of(d.db_path, eid) <= reached}
    assert expected <= present
    assert present == {eid for (eid,) in sql(d.db_path, "SELECT id FROM entries")
                       if _row_of(d.db_path, eid) <= reached}
    assert memoryctl("audit", "verify", "--db", str(elsewhere)).returncode == 0
    new = daemon_factory(db=elsewhere, name=f"devbox-{trial}")
    async with socket_client(new.socket_path) as raw:
        await add(raw, "Continued on the dev box")
        assert (await raw.ok("audit/verify"))["ok"] is True
    new.stop()
    after = ledger_of(elsewhere)
    assert after[:reached] == copy and after[reached][1] == copy[-1][2]


async def _replicated(daemon_factory: Any, shippers: list[Shipper], tmp_path: Path, texts: tuple[str, ...],
                      meanwhile: Callable[[Path], None] | None = None) -> tuple[Any, str]:
    """A primary that wrote ``texts`` and stopped, its store shipped whole to a file replica,
    with what ``meanwhile`` did to the store file while Litestream still ran (Litestream
    ships what is left when it stops)."""
    url = f"file://{tmp_path / 'replica'}"
    d = daemon_factory(db=tmp_path / "laptop" / "memory.db", name="laptop")
    async with socket_client(d.socket_path) as raw:
        for text in texts:
            await add(raw, text)
    d.stop()
    shipper = ship(shippers, d.db_path, url, tmp_path / "ls")
    if meanwhile is not None:
        meanwhile(d.db_path)
    shipper.stop()
    return d, url


async def test_a_copy_that_does_not_verify_names_the_row_and_changes_nothing(
        daemon_factory: Any, shippers: list[Shipper], tmp_path: Path) -> None:
    """Another program rewrote a ledger row on the primary and Litestream shipped it, page
    for page: the replica restores, the copy fails verify at that row, and the store the
    restore was to replace is as it was, with nothing left beside it."""
    def rewrite(db: Path) -> None:
        sql(db, "UPDATE memoryd_ledger SET body = replace(body, 'Uses uv', 'Uses pip') WHERE n = "
                "(SELECT max(n) FROM memoryd_ledger WHERE body LIKE '%Uses uv%')")

    d, url = await _replicated(daemon_factory, shippers, tmp_path, ("Prefers tabs", "Uses uv"), rewrite)
    [(bad,)] = sql(d.db_path, "SELECT n FROM memoryd_ledger WHERE body LIKE '%Uses pip%'")
    target = tmp_path / "devbox" / "memory.db"
    target.parent.mkdir(mode=0o700)
    target.write_bytes(b"the store that was here")
    before = files_of(target.parent)
    done = memoryctl("--db", str(target), "restore", url)
    assert done.returncode == 1, done.stderr
    assert done.stdout == (f"ledger BROKEN at row {bad}: the row's hash does not match its content: the row was "
                           "changed\n")
    assert done.stderr.endswith(f"memoryctl: the copy of {url} does not verify: nothing was installed, and {target} "
                                "is unchanged\n")
    assert files_of(target.parent) == before
    assert sorted(p.name for p in target.parent.iterdir()) == ["memory.db"]


async def test_a_restore_onto_a_store_a_daemon_holds_is_refused_and_changes_nothing(
        daemon_factory: Any, shippers: list[Shipper], tmp_path: Path) -> None:
    _, url = await _replicated(daemon_factory, shippers, tmp_path, ("Prefers tabs",))
    held = daemon_factory(db=tmp_path / "devbox" / "memory.db", name="devbox")
    async with socket_client(held.socket_path) as raw:
        await add(raw, "Written on the dev box")
        before = files_of(held.db_path.parent), ledger_of(held.db_path)
        done = memoryctl("--db", str(held.db_path), "restore", url)
        assert done.returncode == 2
        assert done.stderr == (f"error: USAGE: store {held.db_path} is held by memoryd pid {held.proc.pid}, serving "
                               f"{held.socket_path}: stop it first (memoryctl stop), then restore; {held.db_path} is "
                               "unchanged\n")
        assert (files_of(held.db_path.parent), ledger_of(held.db_path)) == before
        assert [e["text"] for e in await raw.ok("memory/list")] == ["Written on the dev box"]


def _forge_stop_head(db: Path) -> None:
    """Rewrite the heads file as the forger would: one stop head naming the ledger's newest
    row as it is now."""
    [(n, h)] = sql(db, "SELECT n, hash FROM memoryd_ledger ORDER BY n DESC LIMIT 1")
    heads = heads_path_for(db)
    assert heads is not None
    heads.write_text(json.dumps({"store": str(db.resolve()), "n": n, "hash": h, "ts": 1, "event": "stop"}) + "\n")


async def test_verify_against_the_replica_catches_a_truncation_with_the_heads_file_rewritten(
        daemon_factory: Any, shippers: list[Shipper], tmp_path: Path) -> None:
    d, url = await _replicated(daemon_factory, shippers, tmp_path, ("Prefers tabs", "the write to hide"))
    [(gone,)] = sql(d.db_path, "SELECT id FROM entries WHERE text = 'the write to hide'")
    [(seq,)] = sql(d.db_path, "SELECT seq FROM audit WHERE entry_id = ?", gone)
    [(n_gone,)] = sql(d.db_path, "SELECT n FROM memoryd_ledger WHERE audit_seq = ?", seq)
    [(newest,)] = sql(d.db_path, "SELECT max(n) FROM memoryd_ledger")
    [(rowid, text)] = sql(d.db_path, "SELECT rowid, text FROM entries WHERE id = ?", gone)
    sql(d.db_path, "INSERT INTO memoryd_fts (memoryd_fts, rowid, text) VALUES ('delete', ?, ?)", rowid, text)
    sql(d.db_path, "DELETE FROM entries WHERE id = ?", gone)
    sql(d.db_path, "DELETE FROM audit WHERE seq = ?", seq)
    sql(d.db_path, "DELETE FROM memoryd_ledger WHERE n >= ?", n_gone)
    sql(d.db_path, "UPDATE memoryd_usage SET entries = 1, used = 12 WHERE track = 'user' AND scope = 'user-global'")
    _forge_stop_head(d.db_path)
    heads = str(heads_path_for(d.db_path))
    assert memoryctl("audit", "verify", "--db", str(d.db_path), "--heads", heads).returncode == 0  # blind to it
    caught = memoryctl("audit", "verify", "--db", str(d.db_path), "--heads", heads, "--against", url)
    assert caught.returncode == 1
    assert caught.stdout == (f"ledger BROKEN at row {newest}: ledger row {newest}, a head witnessed outside the "
                             "store, is missing: the ledger was truncated\n")
    assert (f"memoryctl: checking that this ledger extends the replica's chain at {url}: its newest row is {newest} "
            in caught.stderr)
    live = daemon_factory(db=d.db_path, name="again")  # and a running daemon's verify, the same
    r = memoryctl("--socket", str(live.socket_path), "--no-autostart", "audit", "verify", "--against", url)
    assert (r.returncode, r.stdout) == (1, caught.stdout)


async def test_verify_against_the_replica_catches_a_full_rehash_with_the_heads_file_rewritten(
        daemon_factory: Any, shippers: list[Shipper], tmp_path: Path) -> None:
    d, url = await _replicated(daemon_factory, shippers, tmp_path, ("uses pnpm", "uses uv"))
    [(newest,)] = sql(d.db_path, "SELECT max(n) FROM memoryd_ledger")
    [(rowid,)] = sql(d.db_path, "SELECT rowid FROM entries WHERE text = 'uses pnpm'")
    conn = sqlite3.connect(d.db_path)
    try:
        with conn:
            conn.execute("INSERT INTO memoryd_fts (memoryd_fts, rowid, text) VALUES ('delete', ?, 'uses pnpm')",
                         (rowid,))
            conn.execute("INSERT INTO memoryd_fts (rowid, text) VALUES (?, 'uses npm')", (rowid,))
            conn.execute("UPDATE entries SET text = 'uses npm' WHERE text = 'uses pnpm'")
            conn.execute("UPDATE audit SET text = 'uses npm' WHERE text = 'uses pnpm'")
            conn.execute("UPDATE memoryd_usage SET used = used - 1 WHERE track = 'user'")
            rechain(conn, "uses pnpm", "uses npm")
    finally:
        conn.close()
    _forge_stop_head(d.db_path)
    heads = str(heads_path_for(d.db_path))
    assert memoryctl("audit", "verify", "--db", str(d.db_path), "--heads", heads).returncode == 0  # blind to it
    caught = memoryctl("audit", "verify", "--db", str(d.db_path), "--heads", heads, "--against", url)
    assert caught.returncode == 1
    assert caught.stdout == (f"ledger BROKEN at row {newest}: ledger row {newest} is not the head witnessed outside "
                             "the store: the ledger was rewritten\n")


def _configured(daemon_factory: Any, tmp_path: Path, config: str, name: str, db: Path, *args: str
                ) -> tuple[Any, Log]:
    cfg = tmp_path / f"{name}.toml"
    cfg.write_text(config)
    d = daemon_factory("--config", str(cfg), *args, name=name, db=db)
    return d, Log(d.stderr_path)


REFUSED = r"ERROR memoryd\.replication: (.*)\n"


async def test_the_old_primary_is_refused_once_the_new_one_wrote(daemon_factory: Any, tmp_path: Path) -> None:
    """The laptop replicates, then writes while offline (no [replicate]); the dev box takes
    the replica over and writes. The laptop, started again against the replica, has
    diverged: it refuses to replicate, names both heads and the restore, and the replica
    keeps the dev box's history. A laptop that wrote nothing since is behind, refused too.
    After the restore the message names, the laptop replicates again."""
    replica_dir = tmp_path / "replica"
    url = f"file://{replica_dir}"
    config = file_config(replica_dir)
    laptop_db, devbox_db = tmp_path / "laptop" / "memory.db", tmp_path / "devbox" / "memory.db"
    laptop, log = _configured(daemon_factory, tmp_path, config, "laptop", laptop_db)
    log.wait(rf"replication to {url}: replicating\n")
    async with socket_client(laptop.socket_path) as raw:
        await add(raw, "Prefers tabs")
    laptop.stop()  # Litestream ships the rest before it stops
    idle_copy = tmp_path / "idle-laptop.db"  # a laptop that writes nothing after this
    sql(laptop_db, "VACUUM INTO ?", str(idle_copy))
    offline = daemon_factory(db=laptop_db, name="offline")  # no [replicate]: the laptop on a train
    async with socket_client(offline.socket_path) as raw:
        await add(raw, "Written on the train")
    offline.stop()

    took = memoryctl("--db", str(devbox_db), "restore", url)
    assert took.returncode == 0, took.stderr
    devbox, devlog = _configured(daemon_factory, tmp_path, config, "devbox", devbox_db)
    devlog.wait(rf"replication to {url}: replicating\n")
    async with socket_client(devbox.socket_path) as raw:
        await add(raw, "Written on the dev box")
    devbox.stop()
    replica_before = {p.relative_to(replica_dir): p.read_bytes() for p in replica_dir.rglob("*") if p.is_file()}
    [devbox_head] = sql(devbox_db, "SELECT n, hash FROM memoryd_ledger ORDER BY n DESC LIMIT 1")
    [laptop_head] = sql(laptop_db, "SELECT n, hash FROM memoryd_ledger ORDER BY n DESC LIMIT 1")

    again, log = _configured(daemon_factory, tmp_path, config, "again", laptop_db)
    said = log.wait(REFUSED)[1]
    assert said == (
        f"this store's ledger has diverged from the replica's at {url}: the replica's newest is row {devbox_head[0]} "
        f"(hash {devbox_head[1][:16]}), which is not a row of this store's chain (its newest is row {laptop_head[0]} "
        f"(hash {laptop_head[1][:16]})). Another machine wrote to the replica while this one wrote its own rows. "
        "memoryd does not replicate over another machine's history. To take the replica's history: stop memoryd "
        f"and run memoryctl restore {url} --db {laptop_db} --no-heads (the store you have is kept beside it)")
    async with socket_client(again.socket_path) as raw:
        assert (await raw.ok("daemon/status", {}))["replication"]["state"] == "diverged"
        await add(raw, "Still served here")  # the laptop's memory works; only replication is refused
    again.stop()
    assert {p.relative_to(replica_dir): p.read_bytes() for p in replica_dir.rglob("*") if p.is_file()} == \
        replica_before  # the dev box's history, untouched

    idle, idle_log = _configured(daemon_factory, tmp_path, config, "idle", idle_copy)
    assert idle_log.wait(REFUSED)[1].startswith(f"the replica at {url} holds ledger rows this store does not: its "
                                                f"newest is row {devbox_head[0]}")
    idle.stop()

    before = files_of(laptop_db.parent)
    held_to_heads = memoryctl("--db", str(laptop_db), "restore", url)  # its heads witnessed the train's rows
    assert held_to_heads.returncode == 1
    assert held_to_heads.stdout.startswith(f"ledger BROKEN at row {laptop_head[0]}: ledger row {laptop_head[0]}")
    assert "a head witnessed outside the store" in held_to_heads.stdout
    assert files_of(laptop_db.parent) == before
    back = memoryctl("--db", str(laptop_db), "restore", url, "--no-heads")
    assert back.returncode == 0, back.stderr
    rejoined, log = _configured(daemon_factory, tmp_path, config, "rejoined", laptop_db)
    log.wait(rf"replication to {url}: replicating\n")
    async with socket_client(rejoined.socket_path) as raw:
        texts = sorted(e["text"] for e in await raw.ok("memory/list"))
    assert texts == ["Prefers tabs", "Written on the dev box"]
    kept = [p.name for p in laptop_db.parent.iterdir() if ".replaced-" in p.name]
    assert any(name.endswith(".memoryd-heads") for name in kept) and len(kept) >= 2


async def test_a_restore_from_s3_is_verified_and_continued(daemon_factory: Any, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_CA_BUNDLE", raising=False)
    server = S3Server()
    try:
        config = s3_config(server, credentials_file(tmp_path / "s3.env"), prefix="restore")
        cfg = tmp_path / "s3.toml"
        cfg.write_text(config)
        d, log = _configured(daemon_factory, tmp_path, config, "laptop", tmp_path / "laptop" / "memory.db")
        log.wait(r"replication to (\S+): replicating\n")
        async with socket_client(d.socket_path) as raw:
            for text in ("Prefers tabs", "Uses uv"):
                await add(raw, text)
        d.stop()
        url = f"s3://{BUCKET}/restore"
        elsewhere = tmp_path / "devbox" / "memory.db"
        done = memoryctl("--config", str(cfg), "--db", str(elsewhere), "restore", url)
        assert done.returncode == 0, done.stderr
        assert ledger_of(elsewhere) == ledger_of(d.db_path)
        new = daemon_factory(db=elsewhere, name="devbox")
        async with socket_client(new.socket_path) as raw:
            await add(raw, "Continued on the dev box")
            assert (await raw.ok("audit/verify"))["ok"] is True
        assert SECRET_KEY not in done.stdout + done.stderr
    finally:
        server.close()


async def test_a_restore_over_a_damaged_store_keeps_it_beside_and_the_chain_goes_on(
        daemon_factory: Any, shippers: list[Shipper], tmp_path: Path) -> None:
    """The same machine, its store file damaged: the copy is checked against the heads this
    store witnessed (all of them rows of the replica's chain), moved in, the damaged file
    kept beside it, and the next start takes the restored rows as memoryd's own."""
    d, url = await _replicated(daemon_factory, shippers, tmp_path, ("Prefers tabs", "Uses uv"))
    rows = ledger_of(d.db_path)
    damaged = b"not a database any more" + d.db_path.read_bytes()[23:]
    d.db_path.write_bytes(damaged)
    done = memoryctl("--db", str(d.db_path), "restore", url)
    assert done.returncode == 0, done.stderr
    [kept] = [p for p in d.db_path.parent.iterdir() if p.name.startswith("memory.db.replaced-")]
    assert done.stdout.endswith(f"; the store it replaces is kept as {kept}\n")
    assert "memoryctl: checking 2 heads witnessed for" in done.stderr  # the start's and the stop's
    assert kept.read_bytes() == damaged and ledger_of(d.db_path) == rows
    again = daemon_factory(db=d.db_path, name="again")
    async with socket_client(again.socket_path) as raw:
        await add(raw, "Reviews on Mondays")
        assert (await raw.ok("audit/verify"))["ok"] is True
    again.stop()
    after = ledger_of(d.db_path)
    assert after[:len(rows)] == rows and after[len(rows)][1] == rows[-1][2]
    assert "did not stop cleanly" not in again.stderr() and " ERROR " not in again.stderr()


async def test_a_take_over_while_litestream_runs_is_found_by_the_lag_reader(daemon_factory: Any,
                                                                            tmp_path: Path) -> None:
    """The laptop replicates and its Litestream keeps running; the dev box restores the
    replica, starts on it and writes. The laptop's next write makes its lag reader read the
    replica: its newest row is the dev box's, not of the laptop's chain. The laptop goes
    ``diverged`` with the one ERROR naming both heads, its Litestream is killed and not
    started again, and from that line on the replica is not written by it: not by a sync of
    the writes that follow, nor by a last sync at its stop.

    The window before that line is not covered: the laptop's Litestream is held still
    (SIGSTOP) from before the take-over until the line, as one that has not yet looked at
    the WAL is. One that ships the laptop's write before the reader looks writes its own
    history over the dev box's, and the reader then finds its own chain there."""
    replica_dir = tmp_path / "replica"
    url = f"file://{replica_dir}"
    config = file_config(replica_dir)
    laptop_db, devbox_db = tmp_path / "laptop" / "memory.db", tmp_path / "devbox" / "memory.db"
    (tmp_path / "laptop.toml").write_text(config)
    laptop = daemon_factory("--config", str(tmp_path / "laptop.toml"), "--log-level", "debug", name="laptop",
                            db=laptop_db)
    log = Log(laptop.stderr_path)
    log.wait(rf"replication to {url}: replicating\n")
    async with socket_client(laptop.socket_path) as raw:
        await add(raw, "Prefers tabs")
    [(n, h)] = sql(laptop_db, "SELECT n, hash FROM memoryd_ledger ORDER BY n DESC LIMIT 1")
    log.wait(rf"replica read: Head\(n={n}, hash='{h}'")  # the replica holds "Prefers tabs"
    # The laptop's Litestream is between two looks at the WAL: frozen there, so that the
    # reader's next look comes before it could ship the laptop's next write over the take-over.
    shipping = int(re.search(r"litestream started \(pid (\d+)\)", log.path.read_text())[1])  # type: ignore[index]
    os.kill(shipping, signal.SIGSTOP)

    took = memoryctl("--db", str(devbox_db), "restore", url)
    assert took.returncode == 0, took.stderr
    devbox, devlog = _configured(daemon_factory, tmp_path, config, "devbox", devbox_db, "--log-level", "debug")
    devlog.wait(rf"replication to {url}: replicating\n")
    async with socket_client(devbox.socket_path) as raw:
        await add(raw, "Written on the dev box")
    [devbox_head] = sql(devbox_db, "SELECT n, hash FROM memoryd_ledger ORDER BY n DESC LIMIT 1")
    # the replica holds the dev box's history (its own lag reader read it there), whatever
    # its stop's last sync does on a loaded machine
    devlog.wait(rf"replica read: Head\(n={devbox_head[0]}, hash='{devbox_head[1]}'")
    devbox.stop()

    async with socket_client(laptop.socket_path) as raw:
        await add(raw, "Written on the laptop meanwhile")
        said = log.wait(REFUSED)[1]
        replica_then = {p.relative_to(replica_dir): p.read_bytes() for p in replica_dir.rglob("*") if p.is_file()}
        [laptop_head] = sql(laptop_db, "SELECT n, hash FROM memoryd_ledger ORDER BY n DESC LIMIT 1")
        assert said == (
            f"this store's ledger has diverged from the replica's at {url}: the replica's newest is row "
            f"{devbox_head[0]} (hash {devbox_head[1][:16]}), which is not a row of this store's chain (its newest "
            f"is row {laptop_head[0]} (hash {laptop_head[1][:16]})). Another machine wrote to the replica while this "
            "one wrote its own rows. memoryd does not replicate over another machine's history. To take the "
            f"replica's history: stop memoryd and run memoryctl restore {url} --db {laptop_db} --no-heads (the "
            "store you have is kept beside it)")
        status = (await raw.ok("daemon/status", {}))["replication"]
        assert (status["state"], status["error"]) == ("diverged", said)
        await add(raw, "Still served here")  # the laptop's memory works; only replication ended
    laptop.stop()
    assert {p.relative_to(replica_dir): p.read_bytes() for p in replica_dir.rglob("*") if p.is_file()} == \
        replica_then
    assert laptop.stderr().count(" ERROR ") == 1
    assert log.path.read_text().count("litestream started (pid") == 1  # killed, never started again
    copy = tmp_path / "copy" / "memory.db"
    assert memoryctl("--db", str(copy), "restore", url).returncode == 0
    assert ledger_of(copy) == ledger_of(devbox_db)  # the dev box's history, whole
