"""Store faults have codes: busy, full, read-only and I/O errors are STORE_UNAVAILABLE.

Every fault here is a real one, produced by real SQLite on a real file: another process
holding the write lock, a file system with no space left (a small tmpfs), an immutable WAL
file, a read-only mount, modes without a write bit. Where a fault cannot be staged under a
running daemon (a store that turns read-only while open: a remount is refused while files
are open for writing), the mapping is tested on the error real SQLite raises for it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sqlite3
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from e2e_helpers import add, entry_input, state
from memoryd import store, storefile
from memoryd.config import Config as DaemonConfig
from memoryd.config import ConfigError, apply
from memoryd.tx import Tx
from memoryd.writer import Writer
from memoryd_protocol.constants import ERROR_CODES
from memoryd_protocol.errors import BudgetExceeded, StoreUnavailable, from_wire
from rawclient import socket_client, write_ctx
from test_e2e_store import digest, make_store, serve

pytestmark = pytest.mark.anyio

ROOT = os.geteuid() == 0


def config(tmp: Path, text: str) -> Path:
    path = tmp / "config.toml"
    path.write_text(text)
    return path


def unavailable(exc: Any, reason: str, path: Path) -> None:
    """``exc`` (an RpcFailure) is STORE_UNAVAILABLE with this reason and path, as the wire says."""
    assert exc.error["code"] == -32020
    assert exc.code == "STORE_UNAVAILABLE"
    assert exc.details == {"reason": reason, "path": str(path)}
    assert exc.error["message"] == store.FAULT_MESSAGES[reason]  # type: ignore[index]


@contextlib.contextmanager
def write_lock(db: Path) -> Iterator[sqlite3.Connection]:
    """Another process's write transaction on the store (dsh-memento's, say)."""
    other = sqlite3.connect(db, isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")
    try:
        yield other
    finally:
        other.execute("ROLLBACK")
        other.close()


@contextlib.contextmanager
def tmpfs(where: Path, size: str) -> Iterator[Path]:
    """A small tmpfs of its own (root only: CI runs as root)."""
    if not ROOT:
        pytest.skip("mounting a tmpfs needs root")
    where.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(where)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=True)


def fill(directory: Path) -> Path:
    """Take every free block of ``directory``'s file system; remove the file to free them."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        for chunk in (65536, 4096, 512, 1):
            while True:
                try:
                    os.write(fd, b"\0" * chunk)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC
                    break
    finally:
        os.close(fd)
    return filler


# --- the mapping, on errors real SQLite raises ----------------------------------------------


def sqlite_error(fn: Any) -> sqlite3.Error:
    with pytest.raises(sqlite3.Error) as info:
        fn()
    return info.value


def test_mapping_of_real_sqlite_errors(tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    make_store(db, 4)

    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    waiter = sqlite3.connect(db, isolation_level=None, timeout=0)
    busy = sqlite_error(lambda: waiter.execute("BEGIN IMMEDIATE"))
    holder.execute("ROLLBACK")
    assert busy.sqlite_errorname == "SQLITE_BUSY"

    ro = sqlite3.connect(db, isolation_level=None)
    ro.execute("PRAGMA query_only = ON")
    readonly = sqlite_error(lambda: ro.execute("DELETE FROM entries"))
    assert readonly.sqlite_errorname == "SQLITE_READONLY"
    ro_uri = sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True)
    readonly_uri = sqlite_error(lambda: ro_uri.execute("DELETE FROM entries"))
    assert readonly_uri.sqlite_errorname == "SQLITE_READONLY"

    capped = sqlite3.connect(db, isolation_level=None)
    (pages,) = capped.execute("PRAGMA page_count").fetchone()
    capped.execute(f"PRAGMA max_page_count = {pages}")
    full = sqlite_error(lambda: capped.execute("INSERT INTO meta VALUES ('big', ?)", ("x" * 100_000,)))
    assert full.sqlite_errorname == "SQLITE_FULL"

    cantopen = sqlite_error(lambda: sqlite3.connect(tmp_path / "no" / "such" / "dir.db").execute("SELECT 1"))
    assert cantopen.sqlite_errorname == "SQLITE_CANTOPEN"

    for exc, reason in ((busy, "busy"), (readonly, "readonly"), (readonly_uri, "readonly"), (full, "full"),
                        (cantopen, "io")):
        assert store.fault_reason(exc) == reason
        fault = store.store_fault(exc, db)
        assert isinstance(fault, StoreUnavailable)
        assert fault.to_wire() == {"code": -32020, "message": store.FAULT_MESSAGES[reason],  # type: ignore[index]
                                   "data": {"code": "STORE_UNAVAILABLE", "message": store.FAULT_MESSAGES[reason],  # type: ignore[index]
                                            "details": {"reason": reason, "path": str(db)}}}
        rebuilt = from_wire(fault.to_wire())
        assert isinstance(rebuilt, StoreUnavailable) and rebuilt.details == {"reason": reason, "path": str(db)}

    # Not store faults: a constraint, a file that is not a database, a misuse, a plain error.
    conn = sqlite3.connect(db, isolation_level=None)
    constraint = sqlite_error(lambda: conn.execute("INSERT INTO meta VALUES ('schema_version', '4')"))
    assert constraint.sqlite_errorname.startswith("SQLITE_CONSTRAINT")
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not a database" * 100)
    notadb = sqlite_error(lambda: sqlite3.connect(junk).execute("SELECT * FROM sqlite_master"))
    assert notadb.sqlite_errorname == "SQLITE_NOTADB"
    conn.close()
    closed = sqlite_error(lambda: conn.execute("SELECT 1"))
    for exc in (constraint, notadb, closed, RuntimeError("x"), OSError(errno.ENOSPC, "full")):
        assert store.fault_reason(exc) is None and store.store_fault(exc, db) is None
    for c in (holder, waiter, ro, ro_uri, capped):
        c.close()


def test_store_unavailable_is_in_the_one_table() -> None:
    assert ERROR_CODES["STORE_UNAVAILABLE"] == -32020
    assert StoreUnavailable.RPC_CODE == -32020 and StoreUnavailable.CODE == "STORE_UNAVAILABLE"


def test_busy_timeout_is_a_config_key() -> None:
    cfg = DaemonConfig()
    assert cfg.busy_timeout_ms == 5000
    apply(cfg, {"busy_timeout_ms": 250})
    assert cfg.busy_timeout_ms == 250
    for bad in (-1, "5000", 1.5, True, 600_001):
        with pytest.raises(ConfigError, match=r"^config: busy_timeout_ms must be an integer from 0 to 600000"):
            apply(DaemonConfig(), {"busy_timeout_ms": bad})


# --- the writer: group commit under a fault ---------------------------------------------------


def insert_job(key: str, size: int = 10) -> Any:
    def job(tx: Tx) -> str:
        tx.conn.execute("INSERT INTO meta VALUES (?, ?)", (key, "x" * size))
        return key

    return job


def over_budget(tx: Tx) -> None:
    raise BudgetExceeded("memory budget exceeded", {})


def meta_keys(db: Path) -> set[str]:
    conn = sqlite3.connect(db)
    try:
        return {k for (k,) in conn.execute("SELECT key FROM meta")}
    finally:
        conn.close()


async def run_batch(writer: Writer, jobs: list[Any]) -> list[Any]:
    """Queue ``jobs`` before the writer runs, so that they are one batch (one transaction);
    run it, close the writer (its connection and thread stay open)."""
    results: list[Any] = [None] * len(jobs)

    async def one(n: int, fn: Any) -> None:
        try:
            results[n] = await writer.submit(fn)
        except Exception as exc:
            results[n] = exc

    async with anyio.create_task_group() as tg:
        for n, fn in enumerate(jobs):
            tg.start_soon(one, n, fn)
        await anyio.wait_all_tasks_blocked()
        assert writer.depth == len(jobs)
        tg.start_soon(writer.serve)
        writer.close()
    return results


def open_writer(db: Path) -> tuple[sqlite3.Connection, Writer]:
    conn = storefile.open_store(db, storefile.inspect(db), 0)
    return conn, Writer(conn, {}, db)


def again(writer: Writer, db: Path) -> Writer:
    """A new writer on ``writer``'s connection and thread (``writer`` has run and closed)."""
    return Writer(writer._sql, {}, db)


def read_only_job(tx: Tx) -> None:
    """A write that real SQLite refuses with SQLITE_READONLY, inside the job's savepoint."""
    tx.conn.execute("PRAGMA query_only = ON")
    try:
        tx.conn.execute("INSERT INTO meta VALUES ('ro', 'x')")
    finally:
        tx.conn.execute("PRAGMA query_only = OFF")


async def test_a_fault_inside_one_job_fails_that_job_alone(tmp_path: Path) -> None:
    """A fault that SQLite confines to its statement is undone by the job's savepoint; the
    jobs around it commit, in the same transaction."""
    db = tmp_path / "w.db"
    make_store(db, 4)
    conn, writer = open_writer(db)
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    try:
        first, ro, last = await run_batch(writer, [insert_job("a"), read_only_job, insert_job("c")])
    finally:
        await writer.aclose()
    assert (first, last) == ("a", "c")
    assert isinstance(ro, StoreUnavailable) and ro.details == {"reason": "readonly", "path": str(db)}
    assert (statements.count("BEGIN IMMEDIATE"), statements.count("ROLLBACK TO step"),
            statements.count("COMMIT")) == (1, 1, 1)
    keys = meta_keys(db)
    assert {"a", "c"} <= keys and "ro" not in keys


async def test_a_fault_that_sqlite_rolls_back_fails_every_job_of_the_batch(tmp_path: Path) -> None:
    """SQLITE_FULL (max_page_count on the writer's own connection, in the test only) makes
    SQLite roll the whole transaction back: the job before it, whose statements had run,
    did not commit either, and is answered so; so is the job after it, which never ran."""
    db = tmp_path / "w.db"
    make_store(db, 4)
    conn, writer = open_writer(db)
    before = meta_keys(db)
    (pages,) = conn.execute("PRAGMA page_count").fetchone()
    conn.execute(f"PRAGMA max_page_count = {pages + 4}")
    ran: list[str] = []

    def after(tx: Tx) -> str:
        ran.append("c")
        return insert_job("c")(tx)

    try:
        results = await run_batch(writer, [insert_job("a"), insert_job("big", 200_000), after])
        assert [type(r) for r in results] == [StoreUnavailable] * 3
        assert all(r.details == {"reason": "full", "path": str(db)} for r in results)
        assert ran == [] and not conn.in_transaction
        assert meta_keys(db) == before
        conn.execute("PRAGMA max_page_count = 1073741823")
        writer = again(writer, db)
        assert await run_batch(writer, [insert_job("a"), insert_job("c")]) == ["a", "c"]
    finally:
        await writer.aclose()
    assert meta_keys(db) == before | {"a", "c"}


async def test_busy_at_begin_fails_the_whole_batch_and_the_next_one_recovers(tmp_path: Path) -> None:
    """Another process holds the write lock past the busy timeout (0 here): BEGIN fails,
    on the event loop and then on the writer's thread, and every job of the batch with it."""
    db = tmp_path / "w.db"
    make_store(db, 4)
    _, writer = open_writer(db)
    before = meta_keys(db)
    try:
        with write_lock(db):
            results = await run_batch(writer, [insert_job("a"), over_budget, insert_job("c")])
        assert [type(r) for r in results] == [StoreUnavailable] * 3
        assert all(r.details == {"reason": "busy", "path": str(db)} for r in results)
        assert meta_keys(db) == before
        writer = again(writer, db)
        assert await run_batch(writer, [insert_job("a")]) == ["a"]
    finally:
        await writer.aclose()
    assert meta_keys(db) == before | {"a"}


async def test_a_failed_commit_fails_every_job_of_the_batch(tmp_path: Path) -> None:
    """On a full file system the pages reach the disk at COMMIT, which fails: the jobs that
    had run (and the one that had failed on its own) all get STORE_UNAVAILABLE full."""
    with tmpfs(tmp_path / "mnt", "1m") as mnt:
        db = mnt / "w.db"
        make_store(db, 4)
        _, writer = open_writer(db)
        before = meta_keys(db)
        filler = fill(mnt)
        try:
            results = await run_batch(writer, [insert_job("a", 20_000), over_budget, insert_job("c", 20_000)])
            assert [type(r) for r in results] == [StoreUnavailable] * 3
            assert all(r.details == {"reason": "full", "path": str(db)} for r in results)
            filler.unlink()
            writer = again(writer, db)
            assert await run_batch(writer, [insert_job("a")]) == ["a"]
        finally:
            await writer.aclose()
        assert meta_keys(db) == before | {"a"}


# --- a running daemon ------------------------------------------------------------------------


async def test_busy_store_answers_store_unavailable_and_serves_reads(daemon_factory: Any, tmp_path: Path) -> None:
    d = daemon_factory("--config", str(config(tmp_path, "busy_timeout_ms = 200\n")))
    async with socket_client(d.socket_path) as writer, socket_client(d.socket_path) as reader:
        await add(writer, "Prefers tabs")
        before = await state(reader)
        with write_lock(d.db_path):
            exc = await writer.fail("memory/add", {"input": entry_input("Uses zsh"), "write": write_ctx()})
            unavailable(exc, "busy", d.db_path)
            # every other kind of request is served while the lock is held
            assert await state(reader) == before
            hits = await reader.ok("memory/query", {"filter": {"text": "tabs"}, "opts": {"sessionId": "s-2"}})
            assert [e["text"] for e in hits["entries"]] == ["Prefers tabs"]
            assert await state(reader) == before  # the ledger read waits out the recall's busy flush
        # the lock is gone: the same write goes through
        await add(writer, "Uses zsh")
        entries = await reader.ok("memory/list", {})
        assert [e["text"] for e in entries] == ["Prefers tabs", "Uses zsh"]
    assert d.stop() == 0
    log = d.stderr()
    assert "memory/add failed: STORE_UNAVAILABLE (busy)" in log and "Uses zsh" not in log


async def test_a_write_waits_out_a_short_lock_while_reads_are_served(daemon_factory: Any, tmp_path: Path) -> None:
    d = daemon_factory("--config", str(config(tmp_path, "busy_timeout_ms = 60000\n")))
    async with socket_client(d.socket_path) as writer, socket_client(d.socket_path) as reader:
        await add(writer, "Prefers tabs")
        before = await state(reader)
        done = anyio.Event()
        reply: dict[str, Any] = {}

        async def write() -> None:
            reply.update(await writer.call("memory/add", {"input": entry_input("Uses zsh"), "write": write_ctx()}))
            done.set()

        async with anyio.create_task_group() as tg:
            with write_lock(d.db_path):
                tg.start_soon(write)
                assert await state(reader) == before
                assert [e["text"] for e in await reader.ok("memory/list", {})] == ["Prefers tabs"]
                assert not done.is_set()  # the lock is still held: the write cannot have finished
            await done.wait()
        assert reply["result"]["entry"]["text"] == "Uses zsh"


async def test_full_disk_answers_store_unavailable_and_recovers(daemon_factory: Any, tmp_path: Path) -> None:
    with tmpfs(tmp_path / "mnt", "2m") as mnt:
        d = daemon_factory(db=mnt / "memory.db")
        try:
            async with socket_client(d.socket_path) as writer, socket_client(d.socket_path) as reader:
                await add(writer, "Prefers tabs")
                before = await state(reader)
                filler = fill(mnt)
                for n in range(3):  # every write fails the same way while the disk is full
                    exc = await writer.fail("memory/add", {"input": entry_input(f"note {n} " + "x" * 1500),
                                                           "write": write_ctx()})
                    unavailable(exc, "full", d.db_path)
                assert await state(reader) == before
                filler.unlink()
                await add(writer, "Uses zsh " + "x" * 1500)
                assert len(await reader.ok("memory/list", {})) == 2
            assert d.stop() == 0
        finally:
            d.stop()
        conn = sqlite3.connect(d.db_path)
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert conn.execute("SELECT count(*) FROM entries").fetchone() == (2,)
        conn.close()
    log = d.stderr()
    assert log.count("memory/add failed: STORE_UNAVAILABLE (full)") == 3 and "note 0" not in log


async def test_io_error_answers_store_unavailable_and_recovers(daemon_factory: Any, tmp_path: Path) -> None:
    """An immutable WAL file: every write() to it fails (EPERM), which SQLite reports as
    SQLITE_IOERR_WRITE."""
    if not ROOT:
        pytest.skip("chattr +i needs root")
    d = daemon_factory()
    wal = d.db_path.with_name(d.db_path.name + "-wal")
    async with socket_client(d.socket_path) as writer, socket_client(d.socket_path) as reader:
        await add(writer, "Prefers tabs")
        before = await state(reader)
        r = await anyio.run_process(["chattr", "+i", str(wal)], check=False)
        if r.returncode != 0:
            pytest.skip(f"chattr +i is not supported here: {r.stderr.decode().strip()}")
        try:
            exc = await writer.fail("memory/add", {"input": entry_input("Uses zsh"), "write": write_ctx()})
            unavailable(exc, "io", d.db_path)
            assert await state(reader) == before
        finally:
            await anyio.run_process(["chattr", "-i", str(wal)])
        await add(writer, "Uses zsh")
        assert [e["text"] for e in await reader.ok("memory/list", {})] == ["Prefers tabs", "Uses zsh"]
    assert d.stop() == 0
    assert "memory/add failed: STORE_UNAVAILABLE (io)" in d.stderr()


async def test_an_approved_write_that_fails_leaves_a_log_line_and_a_ledger_row(daemon_factory: Any, tmp_path: Path) -> None:
    d = daemon_factory("--config", str(config(tmp_path, "busy_timeout_ms = 100\n")), policy="ask")
    async with socket_client(d.socket_path) as raw:
        async def allow(params: dict[str, Any]) -> str:
            return "allowed-once"

        raw.on_approval = allow
        before = await state(raw)
        with write_lock(d.db_path):
            exc = await raw.fail("memory/add", {"input": entry_input("a secret preference"), "write": write_ctx()})
        unavailable(exc, "busy", d.db_path)
        assert await state(raw) == before
        # The ledger kept what the fault lost and wrote it once the store took writes:
        # the approval asked, its decision, and the commit that failed after it.
        assert (await raw.ok("audit/verify"))["ok"] is True
        with sqlite3.connect(d.db_path) as conn:
            rows = conn.execute("SELECT kind, body FROM memoryd_ledger WHERE kind IN ('asked', 'decided', 'failed') "
                                "ORDER BY n").fetchall()
        assert [k for k, _ in rows] == ["asked", "decided", "failed"]
        assert '"outcome":"allowed-once"' in rows[1][1]
        assert '"code":"STORE_UNAVAILABLE"' in rows[2][1] and '"action":"add"' in rows[2][1]
    assert d.stop() == 0
    log = d.stderr()
    assert "memory/add failed: STORE_UNAVAILABLE (busy) on " + str(d.db_path) in log
    assert "a secret preference" not in log


# --- start-up: a read-only store is refused, and left as it was --------------------------------


def refused(db: Path, tmp: Path, message: str) -> None:
    sock = tmp / "s.sock"
    r = serve("--socket", str(sock), "--db", str(db))
    assert r.returncode == 1
    assert r.stderr == f"memoryd: STORE_UNAVAILABLE: {message}: {db}\n"
    assert not sock.exists()


def test_read_only_file_is_refused_and_its_mode_kept(tmp_path: Path) -> None:
    db = tmp_path / "memory.db"
    make_store(db, 4)
    db.chmod(0o444)
    before = digest(db)
    refused(db, tmp_path, "the store is read-only: its file has mode 0444")
    assert stat.S_IMODE(db.stat().st_mode) == 0o444
    assert digest(db) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["memory.db"]


@pytest.mark.parametrize("exists", [True, False])
def test_read_only_directory_is_refused_not_corrupt(tmp_path: Path, exists: bool) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    db = ro / "memory.db"
    if exists:
        make_store(db, 4)
        conn = sqlite3.connect(db)
        conn.execute("PRAGMA journal_mode = WAL")  # a reader of a WAL store needs a -shm beside it
        conn.close()
    before = sorted(p.name for p in ro.iterdir())
    ro.chmod(0o555)
    try:
        refused(db, tmp_path, f"the store is read-only: its directory {ro} has mode 0555")
        assert stat.S_IMODE(ro.stat().st_mode) == 0o555
        assert sorted(p.name for p in ro.iterdir()) == before
    finally:
        ro.chmod(0o700)


def test_read_only_parent_of_a_new_store_is_refused(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o555)
    try:
        refused(ro / "new" / "memory.db", tmp_path, f"the store is read-only: its directory {ro} has mode 0555")
        assert list(ro.iterdir()) == []
    finally:
        ro.chmod(0o700)


def test_read_only_mount_is_refused(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "mnt", "1m") as mnt:
        db = mnt / "memory.db"
        make_store(db, 4)
        conn = sqlite3.connect(db)
        conn.execute("PRAGMA journal_mode = WAL")
        conn.close()
        before = digest(db)
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        refused(db, tmp_path, "the store is read-only: its file system is mounted read-only")
        assert digest(db) == before
        # inspecting it alone (a WAL store whose -shm cannot be made) is no corruption either
        with pytest.raises(StoreUnavailable) as info:
            storefile.inspect(db)
        assert info.value.details == {"reason": "readonly", "path": str(db)}


def test_busy_store_at_start_is_refused(tmp_path: Path) -> None:
    """A store that needs migrating while another process holds its write lock."""
    db = tmp_path / "memory.db"
    make_store(db, 3)
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA journal_mode = WAL")  # its readers (inspect) are not blocked, its writers are
    conn.close()
    cfg = config(tmp_path, "busy_timeout_ms = 100\n")
    with write_lock(db):
        before = digest(db)
        r = serve("--socket", str(tmp_path / "s.sock"), "--db", str(db), "--config", str(cfg))
        assert digest(db) == before
    assert r.returncode == 1
    assert r.stderr == f"memoryd: STORE_UNAVAILABLE: {store.FAULT_MESSAGES['busy']}: {db}\n"
    assert not (tmp_path / "s.sock").exists()


async def test_an_existing_store_keeps_its_modes(daemon_factory: Any, tmp_path: Path) -> None:
    """Only a store memoryd creates gets 0600; one it finds keeps whatever its owner chose."""
    db = tmp_path / "memory.db"
    make_store(db, 4)
    db.chmod(0o640)
    d = daemon_factory(db=db)
    async with socket_client(d.socket_path) as raw:
        await add(raw, "Uses zsh")
    assert d.stop() == 0
    assert stat.S_IMODE(db.stat().st_mode) == 0o640


