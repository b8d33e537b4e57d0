"""The store file and the process: modes, migrations, refusals, transports, shutdown."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import sqlite3
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import add
from memoryd.app import listener_name
from memoryd.storefile import MIGRATIONS
from memoryd_protocol.constants import MEMORYD_SCHEMA_VERSION
from rawclient import socket_client, write_ctx

pytestmark = pytest.mark.anyio


def serve(*args: str, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "memoryd", "serve", *args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make_store(path: Path, version: int) -> None:
    """A dsh-memento store at schema ``version`` holding one entry."""
    conn = sqlite3.connect(path)
    for step in range(1, version + 1):
        for sql in MIGRATIONS[step]:
            conn.execute(sql)
    conn.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(version),))
    conn.execute("INSERT INTO entries (id, track, scope, workspace_key, text, source, created_at, updated_at, "
                 "session_id) VALUES ('3b241101-e2bb-4255-8caf-4136c566a962', 'user', 'user-global', '', "
                 "'Prefers tabs', 'dsh-memento', 1, 2, 's-0')")
    conn.commit()
    conn.close()


async def test_file_modes(daemon_factory: Any, tmp_path: Path) -> None:
    d = daemon_factory(db=tmp_path / "new" / "dir" / "memory.db")
    assert stat.S_IMODE(d.db_path.stat().st_mode) == 0o600
    assert stat.S_IMODE(d.socket_path.stat().st_mode) == 0o600
    assert stat.S_ISSOCK(d.socket_path.stat().st_mode)
    assert stat.S_IMODE(d.db_path.parent.stat().st_mode) == 0o700
    conn = sqlite3.connect(d.db_path)
    assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    assert conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == ("4",)
    conn.close()


@pytest.mark.parametrize("version", [1, 2, 3, 4])
async def test_opens_and_migrates_reference_stores(daemon_factory: Any, tmp_path: Path, version: int) -> None:
    db = tmp_path / "memory.db"
    make_store(db, version)
    d = daemon_factory(db=db)
    async with socket_client(d.socket_path) as raw:
        [e] = await raw.ok("memory/list", {})
        assert e["text"] == "Prefers tabs" and e["tags"] == [] and e["version"] == 1 and e["recallCount"] == 0
        assert e["agentKey"] == "" and e["sessionId"] == "s-0"
        assert (await raw.ok("memory/budgets", {}))[0]["used"] == 12
        await add(raw, "new one")
    d.stop()
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == ("4",)
    cols = {r[1] for r in conn.execute("PRAGMA table_info(entries)")}
    assert {"agent_key", "last_recalled", "recall_count", "tags", "version"} <= cols
    assert {r[1] for r in conn.execute("PRAGMA table_info(proposals)")} >= {"agent_key", "status"}
    conn.close()


@pytest.mark.parametrize(("key", "newer", "message"), [
    ("schema_version", "5", "store schema version 5 is newer than supported version 4"),
    ("memoryd_schema", str(MEMORYD_SCHEMA_VERSION + 1),
     f"store memoryd_schema {MEMORYD_SCHEMA_VERSION + 1} is newer than supported version {MEMORYD_SCHEMA_VERSION}"),
])
def test_refuses_newer_schema_without_touching_it(tmp_path: Path, key: str, newer: str, message: str) -> None:
    """The reference's schema, or memoryd's own tables' (a newer memoryd's index tail would
    be read as indexed here, and written over)."""
    db = tmp_path / "memory.db"
    make_store(db, 4)
    conn = sqlite3.connect(db)
    conn.execute("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                 (key, newer))
    conn.commit()
    conn.close()
    before = digest(db)
    r = serve("--socket", str(tmp_path / "s.sock"), "--db", str(db))
    assert r.returncode != 0
    assert "STORE_UNSUPPORTED_VERSION" in r.stderr and str(db) in r.stderr and message in r.stderr
    assert digest(db) == before
    assert not (tmp_path / "s.sock").exists()


@pytest.mark.parametrize("content", [b"this is not a database at all" * 100, b"SQLite format 3\x00" + b"\xff" * 5000])
def test_refuses_corrupt_file_without_touching_it(tmp_path: Path, content: bytes) -> None:
    db = tmp_path / "memory.db"
    db.write_bytes(content)
    r = serve("--socket", str(tmp_path / "s.sock"), "--db", str(db))
    assert r.returncode != 0
    assert "STORE_CORRUPT" in r.stderr and str(db) in r.stderr
    assert db.read_bytes() == content


def test_refuses_bad_tags_column(tmp_path: Path) -> None:
    db = tmp_path / "memory.db"
    make_store(db, 4)
    conn = sqlite3.connect(db)
    conn.execute("UPDATE entries SET tags = 'not json'")
    conn.commit()
    conn.close()
    before = digest(db)
    r = serve("--socket", str(tmp_path / "s.sock"), "--db", str(db))
    assert r.returncode != 0 and "STORE_CORRUPT" in r.stderr
    assert digest(db) == before


async def test_a_memoryd_store_that_another_program_wrote_is_checked_in_full(daemon_factory: Any,
                                                                              tmp_path: Path) -> None:
    db = tmp_path / "memory.db"
    d = daemon_factory(db=db)
    async with socket_client(d.socket_path) as raw:
        await add(raw, "Prefers tabs")
    assert d.stop() == 0
    # dsh-memento's kind of write (it audits every write) with a tags column gone bad
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE entries SET tags = 'not json'")
        conn.execute("INSERT INTO audit (ts, action, text) VALUES (1, 'replace', 'Prefers tabs')")
    before = digest(db)
    r = serve("--socket", str(tmp_path / "s2.sock"), "--db", str(db))
    assert r.returncode != 0 and "STORE_CORRUPT" in r.stderr
    assert digest(db) == before


async def test_second_daemon_is_refused(daemon: Any, tmp_path: Path) -> None:
    r = serve("--socket", str(daemon.socket_path), "--db", str(tmp_path / "other.db"))
    assert r.returncode != 0 and "already serving" in r.stderr
    r = serve("--socket", str(tmp_path / "other.sock"), "--db", str(daemon.db_path))
    assert r.returncode != 0 and "STORE_LOCKED" in r.stderr
    async with socket_client(daemon.socket_path) as raw:  # the first one is unaffected
        await raw.ok("memory/list", {})


async def test_stale_socket_is_replaced(daemon_factory: Any, tmp_path: Path) -> None:
    d = daemon_factory(name="stale")
    path = d.socket_path
    d.proc.kill()
    d.proc.wait()
    # a SIGKILLed daemon leaves its socket file behind
    if not path.exists():
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(path))
        s.close()
    assert path.exists()
    d2 = daemon_factory(db=tmp_path / "d2.db", name="stale2", socket_path=path)
    async with socket_client(d2.socket_path) as raw:
        await raw.ok("memory/list", {})


def test_config_errors_refuse_to_start(tmp_path: Path) -> None:
    for text, needle in [('write_polcy = "auto"', "unknown key"), ('write_policy = "yes"', "write_policy"),
                         ("[budgets.user]\nglobal = 5", "budget scope"), ("max_message_bytes = 'x'", "max_message"),
                         ('[write_policies]\n"user/everything" = "auto"', "write_policies"), ("not toml [", "TOML")]:
        cfg = tmp_path / "bad.toml"
        cfg.write_text(text)
        r = serve("--socket", str(tmp_path / "s.sock"), "--db", str(tmp_path / "m.db"), "--config", str(cfg))
        assert r.returncode == 2, text
        assert needle in r.stderr, (text, r.stderr)


def test_stdio_fd1_carries_protocol_lines_only(tmp_path: Path) -> None:
    lines = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}},
        {"jsonrpc": "2.0", "id": 2, "method": "memory/add",
         "params": {"input": {"track": "user", "scope": "user-global", "text": "hi"}, "write": write_ctx()}},
        {"jsonrpc": "2.0", "id": 3, "method": "memory/list"},
    ]
    data = "".join(json.dumps(m) + "\n" for m in lines) + "garbage\n"
    r = subprocess.run([sys.executable, "-m", "memoryd", "serve", "--stdio", "--standalone", "--db", str(tmp_path / "m.db"),
                        "--write-policy", "auto", "--log-level", "debug"],
                       input=data.encode(), capture_output=True, timeout=20)
    assert r.returncode == 0, r.stderr
    out = [json.loads(line) for line in r.stdout.decode().splitlines()]
    assert all(m.get("jsonrpc") == "2.0" for m in out)
    ids = [m.get("id") for m in out if "method" not in m]
    assert ids == [1, 2, 3, None]
    assert b"memoryd" in r.stderr  # logs went to stderr


def test_stdio_from_regular_file(tmp_path: Path) -> None:
    req = tmp_path / "req.ndjson"
    req.write_text(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "memory/budgets"}) + "\n")
    with req.open("rb") as stdin:
        r = subprocess.run([sys.executable, "-m", "memoryd", "serve", "--stdio", "--standalone", "--db", str(tmp_path / "m.db")],
                           stdin=stdin, capture_output=True, timeout=20)
    assert r.returncode == 0
    assert json.loads(r.stdout)["id"] == 1


async def test_data_survives_restart(daemon_factory: Any, tmp_path: Path) -> None:
    db = tmp_path / "keep.db"
    d = daemon_factory(db=db, name="r1")
    async with socket_client(d.socket_path) as raw:
        await add(raw, "durable")
    assert d.stop() == 0
    d2 = daemon_factory(db=db, name="r2")
    async with socket_client(d2.socket_path) as raw:
        assert [e["text"] for e in await raw.ok("memory/list", {})] == ["durable"]
        assert (await raw.ok("memory/budgets", {}))[0]["used"] == 7


def test_sockets_under_default_runtime_dir(tmp_path: Path) -> None:
    """Without --socket the daemon uses $XDG_RUNTIME_DIR/memoryd/memoryd.sock, dir 0700."""
    from conftest import spawn_ready

    runtime = tmp_path / "rt"
    runtime.mkdir()
    env = dict(os.environ, XDG_RUNTIME_DIR=str(runtime))
    env.pop("MEMORYD_SOCKET", None)
    proc = spawn_ready(["--db", str(tmp_path / "m.db")], tmp_path / "err", env)
    try:
        sock = runtime / "memoryd" / "memoryd.sock"
        assert stat.S_IMODE(sock.parent.stat().st_mode) == 0o700
        assert stat.S_IMODE(sock.stat().st_mode) == 0o600
    finally:
        proc.terminate()
        assert proc.wait(10) == 0
    assert not sock.exists()


async def test_a_store_broken_behind_the_daemon_s_back_refuses_writes_and_says_why(daemon: Any) -> None:
    async with socket_client(daemon.socket_path) as raw:
        await add(raw, "secret memory text")
        # break the store behind the daemon's back: the next write cannot be checked
        conn = sqlite3.connect(daemon.db_path)
        conn.execute("ALTER TABLE audit RENAME TO audit_gone")
        conn.commit()
        conn.close()
        r = await raw.call("memory/add", {"input": {"track": "user", "scope": "user-global",
                                                    "text": "another secret"}, "write": write_ctx()})
        assert r["error"]["data"]["code"] == "STORE_CORRUPT"
        assert "(no such table: audit)" in r["error"]["data"]["message"]
        # nothing half-written: the batch ran nothing, the connection still serves
        assert [e["text"] for e in await raw.ok("memory/list", {})] == ["secret memory text"]
        assert (await raw.ok("memory/budgets", {}))[0]["used"] == len("secret memory text")
    daemon.stop()
    log = daemon.stderr()
    assert "memoryd cannot check the store for changes another program made (no such table: audit)" in log
    # memory text never reaches the log at the default level
    assert "secret" not in log


@pytest.mark.parametrize("abstract", [False, True], ids=["path", "abstract"])
def test_systemd_socket_activation_and_notify(tmp_path: Path, abstract: bool) -> None:
    """Under systemd: the inherited listening socket (fd 3, LISTEN_FDS) is served, READY=1
    reaches NOTIFY_SOCKET once the store is open, and the ready line names the socket served
    (not the configured --socket): its path, or "@name" for an abstract one."""
    short = Path(tempfile.mkdtemp(prefix="md-", dir="/tmp"))
    address = f"\0memoryd-test-{short.name}" if abstract else str(short / "act.sock")
    served = f"@memoryd-test-{short.name}" if abstract else str(short / "act.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(8)
    notify_path = short / "notify"
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(notify_path))
    notify.settimeout(20)
    fd = listener.fileno()

    def as_fd3() -> None:
        os.dup2(fd, 3)

    env = dict(os.environ, LISTEN_FDS="1", NOTIFY_SOCKET=str(notify_path), MEMORYD_LOG_LEVEL="info")
    # systemd sets LISTEN_PID to the service's pid; `exec` keeps the shell's pid for python
    with (tmp_path / "stderr").open("wb") as stderr:
        proc = subprocess.Popen(["sh", "-c", f'LISTEN_PID=$$ exec "{sys.executable}" -m memoryd serve --db '
                                 f'"{tmp_path / "m.db"}" --socket "{tmp_path / "unused.sock"}"'],
                                env=env, preexec_fn=as_fd3, close_fds=False,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        assert notify.recv(64) == b"READY=1"
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
            c.connect(address)
            c.sendall(b'{"jsonrpc":"2.0","id":1,"method":"daemon/status"}\n')
            reply = json.loads(c.makefile("rb").readline())
        assert reply["result"]["store"]["path"] == str(tmp_path / "m.db")
        assert reply["result"]["socket"] is None  # systemd's socket: not a path this daemon owns
        assert not (tmp_path / "unused.sock").exists()
    finally:
        proc.terminate()
        assert proc.wait(10) == 0
        listener.close()
        notify.close()
        shutil.rmtree(short, ignore_errors=True)
    # the ready line is logged just after READY=1 is sent: read once the daemon has exited
    log = (tmp_path / "stderr").read_text()
    ready = [line.partition(": ")[2] for line in log.splitlines() if "memoryd ready" in line]
    assert ready == [f"memoryd ready ({served}, store {tmp_path / 'm.db'})"], log


def test_the_ready_line_names_an_unnamed_inherited_socket() -> None:
    """A socket with no address at all (which systemd never passes, but fd 3 may be) gets
    words, not an empty name."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        assert listener_name(a) == "an unnamed inherited socket"
