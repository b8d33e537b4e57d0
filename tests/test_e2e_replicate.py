"""Replication with the real parts: a real daemon, the real Litestream (the ``replicate``
extra), a file replica and S3 on a moto server on 127.0.0.1. Every wait is on the daemon's
log (one line per state change) and bounded; nothing sleeps.

- Litestream's bookkeeping tables are never a foreign change: writes go on, no ``foreign``
  row, audit verify is ok.
- Many writes, many checkpoints (memoryd's and Litestream's) and a restart restore to a
  copy that ``memoryctl audit verify --db`` passes, holding every acknowledged write.
- A replica that is unreachable for a while: writes go on, the lag grows and is shown,
  and replication catches up.
- Litestream killed: started again after a back-off, one log line per state change.
- Credentials come from a 0600 file and never reach argv or the log.
- An ``sftp://`` replica on a real sshd on 127.0.0.1 (key authentication, its host key pinned).
"""

from __future__ import annotations

import getpass
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from e2e_helpers import add, sql
from rawclient import socket_client
from replicate_support import (
    ACCESS_KEY,
    SECRET_KEY,
    Log,
    S3Server,
    credentials_file,
    file_config,
    litestream_children,
    s3_config,
)
from sshd_server import Sshd, running_sshd

pytestmark = [pytest.mark.anyio, pytest.mark.process]

MEMORYCTL = [sys.executable, "-m", "memoryd_client"]
REPLICATING = r"replication to (\S+): replicating\n"


@pytest.fixture(autouse=True)
def _plain_http(monkeypatch: pytest.MonkeyPatch) -> None:
    # the daemons (and Litestream under them) inherit the test's environment
    monkeypatch.delenv("AWS_CA_BUNDLE", raising=False)


@pytest.fixture
def s3() -> Iterator[S3Server]:
    server = S3Server()
    yield server
    server.close()


def start(daemon_factory: Any, tmp_path: Path, config: str, name: str = "d", db: Path | None = None,
          *args: str) -> tuple[Any, Log]:
    cfg = tmp_path / f"{name}.toml"
    cfg.write_text(config)
    d = daemon_factory("--config", str(cfg), *args, name=name, db=db)
    return d, Log(d.stderr_path)


def held(d: Any, log: Log) -> None:
    """Wait until the lag reader (at debug level) has read the store's head in the replica.
    Not a wait for "replicating": a replica that caught up before the reader looked never
    left that state, and says nothing."""
    n, h = head(d.db_path)
    log.wait(rf"replica read: Head\(n={n}, hash='{h}'")


async def restore(url: str, out: Path, **keys: Any) -> None:
    from memoryd import litestream, replica

    await litestream.restore(replica.parse({"url": url, **keys}), out)


def verify(db: Path) -> dict[str, Any]:
    r = subprocess.run([*MEMORYCTL, "--json", "audit", "verify", "--db", str(db)], capture_output=True, text=True,
                       timeout=120, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)  # type: ignore[no-any-return]


def head(db: Path) -> tuple[int, str]:
    (row,) = sql(db, "SELECT n, hash FROM memoryd_ledger ORDER BY n DESC LIMIT 1")
    return int(row[0]), str(row[1])


async def status(d: Any) -> dict[str, Any]:
    async with socket_client(d.socket_path) as raw:
        return (await raw.ok("daemon/status", {}))["replication"]  # type: ignore[no-any-return]


async def test_litestreams_tables_are_not_a_foreign_change(daemon_factory: Any, tmp_path: Path) -> None:
    replica = tmp_path / "replica"
    d, log = start(daemon_factory, tmp_path, file_config(replica))
    log.wait(REPLICATING)
    names = {n for (n,) in sql(d.db_path, "SELECT name FROM sqlite_master WHERE name LIKE '\\_litestream%' ESCAPE '\\'")}
    assert names == {"_litestream_seq", "_litestream_lock"}
    async with socket_client(d.socket_path) as raw:
        for k in range(3):
            await add(raw, f"fact {k}")
        assert (await raw.ok("audit/verify", {}))["ok"] is True
    assert sql(d.db_path, "SELECT count(*) FROM memoryd_ledger WHERE kind = 'foreign'") == [(0,)]
    assert "another program changed the store" not in d.stderr()


async def test_many_writes_checkpoints_and_a_restart_restore_to_a_copy_that_verifies(
        daemon_factory: Any, tmp_path: Path) -> None:
    replica = tmp_path / "replica"
    # Litestream checkpoints after every few pages; memoryd's own automatic checkpoints run too
    config = "[budgets.user]\nuser_global = 1000000\n" + file_config(
        replica, extra='min-checkpoint-page-count = 8\ncheckpoint-interval = "100ms"\n')
    acked: list[str] = []
    for run in range(2):
        d, log = start(daemon_factory, tmp_path, config, name=f"run{run}", db=tmp_path / "store.db")
        log.wait(REPLICATING)
        async with socket_client(d.socket_path) as raw:
            for k in range(150):
                text = f"run {run} fact {k} " + "x" * 400
                await add(raw, text)
                acked.append(text)
        assert d.stop() == 0
        assert "replication to file://" in d.stderr() and ": stopped" in d.stderr()
    local = head(tmp_path / "store.db")
    copy = tmp_path / "copy.db"
    await restore(f"file://{replica}", copy)
    assert head(copy) == local  # the stop's last sync held every acknowledged write
    verify(copy)
    assert sorted(t for (t,) in sql(copy, "SELECT text FROM entries")) == sorted(acked)


async def test_s3_replica_credentials_from_a_0600_file_never_in_argv_or_log(
        daemon_factory: Any, tmp_path: Path, s3: S3Server) -> None:
    creds = credentials_file(tmp_path / "s3.env")
    d, log = start(daemon_factory, tmp_path, s3_config(s3, creds, prefix="creds"), "d", None, "--log-level", "debug")
    log.wait(REPLICATING)
    (child,) = litestream_children(d.proc.pid)
    assert not any(SECRET_KEY in a or ACCESS_KEY in a for a in child["argv"])
    async with socket_client(d.socket_path) as raw:
        await add(raw, "replicated to S3")
    held(d, log)
    st = await status(d)
    assert (st["url"], st["state"], st["lagRows"], st["lagS"], st["replicaN"]) == (
        "s3://memoryd-replica/creds", "replicating", 0, 0.0, st["headN"])
    assert d.stop() == 0
    copy = tmp_path / "copy.db"
    await restore("s3://memoryd-replica/creds", copy, endpoint=s3.endpoint, region="us-east-1", credentials_file=str(creds))
    assert head(copy) == head(d.db_path)
    verify(copy)
    assert SECRET_KEY not in d.stderr() and ACCESS_KEY not in d.stderr()


async def test_a_credentials_file_refused_while_running_is_said_and_the_daemon_serves_on(
        daemon_factory: Any, tmp_path: Path, s3: S3Server) -> None:
    creds = credentials_file(tmp_path / "s3.env")
    good = creds.read_bytes()
    d, log = start(daemon_factory, tmp_path, s3_config(s3, creds, prefix="refused"))
    log.wait(REPLICATING)

    def opened() -> None:
        creds.chmod(0o644)

    def not_utf8() -> None:
        creds.write_bytes(good + b"# \xff\n")

    def a_fifo() -> None:
        creds.unlink()
        os.mkfifo(creds, 0o600)

    refusals = [
        (opened, f"[replicate] credentials_file {creds} has mode 0644: others may read it; run chmod 600 {creds}"),
        (not_utf8, f"[replicate] credentials_file {creds}: cannot read it: it is not UTF-8 text"),
        (a_fifo, f"[replicate] credentials_file {creds} is not a regular file"),
    ]
    async with socket_client(d.socket_path) as raw:
        for k, (refuse, said) in enumerate(refusals):
            refuse()
            await add(raw, f"written while the credentials file is refused {k}")
            log.wait(r"replication to s3://memoryd-replica/refused: unreachable \(")
            st = await status(d)
            assert (st["state"], st["error"]) == ("unreachable", said)
            await add(raw, f"and served after it {k}")
            creds.unlink()
            credentials_file(creds)
            await add(raw, f"written once it is right again {k}")
            log.wait(REPLICATING)
            caught = await status(d)
            assert (caught["state"], caught["error"], caught["lagRows"]) == ("replicating", None, 0)
    creds.chmod(0o644)  # the stop's last sync, if it runs, is refused and said; the stop is clean
    assert d.stop() == 0
    assert SECRET_KEY not in d.stderr()


async def test_an_unreachable_s3_replica_writes_go_on_the_lag_grows_and_it_catches_up(
        daemon_factory: Any, tmp_path: Path, s3: S3Server) -> None:
    d, log = start(daemon_factory, tmp_path, s3_config(s3, credentials_file(tmp_path / "s3.env"), prefix="away"))
    log.wait(REPLICATING)
    s3.relay.down()
    async with socket_client(d.socket_path) as raw:
        await add(raw, "written while the replica is away")
        log.wait(r"replication to s3://memoryd-replica/away: unreachable \(")
        first = await status(d)
        for k in range(5):
            await add(raw, f"more while away {k}")
        second = await status(d)
    assert first["state"] == second["state"] == "unreachable" and first["error"]
    assert second["headN"] >= first["headN"] + 5 and second["lagRows"] == first["lagRows"] + (
        second["headN"] - first["headN"])
    assert second["lagRows"] > first["lagRows"] > 0 and second["lagS"] >= first["lagS"] > 0, (first, second)
    s3.relay.up()
    log.wait(REPLICATING)
    caught = await status(d)
    assert (caught["state"], caught["lagRows"], caught["lagS"], caught["replicaN"], caught["error"]) == (
        "replicating", 0, 0.0, second["headN"], None)
    assert SECRET_KEY not in d.stderr()


async def test_an_unreachable_file_replica_writes_go_on_and_it_catches_up(daemon_factory: Any, tmp_path: Path) -> None:
    replica = tmp_path / "replica"
    d, log = start(daemon_factory, tmp_path, file_config(replica))
    log.wait(REPLICATING)
    away = tmp_path / "replica.away"
    replica.rename(away)
    replica.write_text("not a directory")  # the replica's path now leads nowhere it can write
    async with socket_client(d.socket_path) as raw:
        await add(raw, "written while the replica is away")
        log.wait(rf"replication to file://{replica}: unreachable \(")
        for k in range(3):
            await add(raw, f"more while away {k}")
        away_status = await status(d)
    assert away_status["state"] == "unreachable" and away_status["lagRows"] >= 4 and away_status["lagS"] > 0
    replica.unlink()
    away.rename(replica)
    log.wait(REPLICATING)
    caught = await status(d)
    assert (caught["state"], caught["lagRows"], caught["replicaN"]) == ("replicating", 0, away_status["headN"])


async def test_litestream_killed_is_started_again_after_a_back_off(daemon_factory: Any, tmp_path: Path) -> None:
    d, log = start(daemon_factory, tmp_path, file_config(tmp_path / "replica"))
    log.wait(REPLICATING)
    (child,) = litestream_children(d.proc.pid)
    os.kill(child["pid"], signal.SIGKILL)
    log.wait(r"replication to \S+: restarting \(Litestream exited with status -9; starting it again in 0.1 s\)")
    log.wait(r"replication to \S+: starting\n")
    (again,) = litestream_children(d.proc.pid)
    assert again["pid"] != child["pid"]
    async with socket_client(d.socket_path) as raw:
        await add(raw, "after the restart")
    assert (await status(d))["restarts"] == 1
    assert d.stop() == 0  # the stop waits for the new Litestream's last sync
    copy = tmp_path / "copy.db"
    await restore(f"file://{tmp_path / 'replica'}", copy)
    assert head(copy) == head(d.db_path)
    assert sql(copy, "SELECT text FROM entries") == [("after the restart",)]


async def test_replicate_status_json_gives_what_daemon_status_does(daemon_factory: Any, tmp_path: Path) -> None:
    d, log = start(daemon_factory, tmp_path, file_config(tmp_path / "replica"))
    log.wait(REPLICATING)
    with anyio.fail_after(60):
        r = await anyio.run_process([*MEMORYCTL, "--socket", str(d.socket_path), "--no-autostart", "replicate",
                                     "status", "--json"], check=False, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr.decode()
    mine = json.loads(r.stdout)
    theirs = await status(d)
    assert {k: v for k, v in mine.items() if k not in ("lagS", "readAt")} == {
        k: v for k, v in theirs.items() if k not in ("lagS", "readAt")}
    assert mine["url"] == f"file://{tmp_path / 'replica'}" and mine["state"] == "replicating"
    with anyio.fail_after(60):
        human = await anyio.run_process([*MEMORYCTL, "--socket", str(d.socket_path), "--no-autostart", "status"],
                                        check=True, stdin=subprocess.DEVNULL)
    lines = human.stdout.decode().splitlines()
    assert f"replica            file://{tmp_path / 'replica'}" in lines and "replication        replicating" in lines
    (lag,) = [line for line in lines if line.startswith("replica lag")]
    assert re.fullmatch(r"replica lag {8}0 rows, 0 s \(replica at row (\d+), head \1\)", lag), lag


@pytest.fixture
def sftp_server(tmp_path: Path) -> Iterator[Sshd]:
    """sshd on 127.0.0.1 serving SFTP to one key."""
    keys = tmp_path / "sshd"
    keys.mkdir(mode=0o700)
    with running_sshd(keys, "Subsystem sftp internal-sftp\n") as server:
        yield server


async def test_an_sftp_replica_on_a_real_sshd_restores_to_a_copy_that_verifies(
        daemon_factory: Any, tmp_path: Path, sftp_server: Sshd) -> None:
    port, key, host_key = sftp_server.port, sftp_server.key, sftp_server.host_key_line()
    url = f"sftp://{getpass.getuser()}@127.0.0.1:{port}{tmp_path / 'sftp-replica'}"
    options = {"key-path": str(key), "host-key": host_key}
    config = (f'[replicate]\nurl = "{url}"\nlag_every_s = 0.1\n[replicate.litestream]\nsync-interval = "50ms"\n'
              f'key-path = "{key}"\nhost-key = "{host_key}"\n')
    d, log = start(daemon_factory, tmp_path, config)
    log.wait(REPLICATING)
    async with socket_client(d.socket_path) as raw:
        for k in range(3):
            await add(raw, f"over sftp {k}")
    assert (await status(d))["url"] == url
    assert d.stop() == 0
    copy = tmp_path / "copy.db"
    await restore(url, copy, litestream=options)
    assert head(copy) == head(d.db_path)
    verify(copy)
    assert sorted(t for (t,) in sql(copy, "SELECT text FROM entries")) == [f"over sftp {k}" for k in range(3)]
