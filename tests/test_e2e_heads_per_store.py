"""Whose heads go where, against real daemons: the default store's in the user's witness,
``$XDG_STATE_HOME/memoryd/heads``; any other store's (``--db``, ``db_path``, a standalone
scratch store) beside it, ``<db>.memoryd-heads``, so that a scratch store never writes into
the user's witness. memoryctl reads the same file for the store it checks, through the
daemon and offline."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import add, memoryctl, sql
from rawclient import socket_client, stdio_client

pytestmark = [pytest.mark.anyio, pytest.mark.process]

#: one head of the user's own store, already in their witness before the scratch store runs
USERS_HEAD = b'{"store":"/home/u/.local/share/memoryd/memory.db","n":7,"hash":"' + b"a" * 64 + b'","ts":1,"event":"stop"}\n'


@pytest.fixture
def xdg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's own data and state homes (the default store and the user's witness)."""
    for var, name in (("XDG_DATA_HOME", "data"), ("XDG_STATE_HOME", "state")):
        monkeypatch.setenv(var, str(tmp_path / "xdg" / name))
    return tmp_path / "xdg"



def ledger_tip(db: Path) -> tuple[int, str]:
    [(n, h)] = sql(db, "SELECT n, hash FROM memoryd_ledger ORDER BY n DESC LIMIT 1")
    return int(n), str(h)


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_a_standalone_scratch_store_leaves_the_users_witness_untouched(xdg: Path, tmp_path: Path) -> None:
    witness = xdg / "state" / "memoryd" / "heads"
    witness.parent.mkdir(mode=0o700, parents=True)
    witness.write_bytes(USERS_HEAD)
    scratch = tmp_path / "scratch" / "scratch.db"
    scratch.parent.mkdir()
    async with stdio_client(scratch, "--write-policy", "auto") as raw:
        await add(raw, "Prefers tabs")
        proc = raw.process
    assert proc.returncode == 0
    # the user's witness is byte for byte what it was
    assert witness.read_bytes() == USERS_HEAD
    # the scratch store's heads are beside it, and only its own
    heads = lines(scratch.parent / "scratch.db.memoryd-heads")
    assert [h["event"] for h in heads] == ["start", "stop"]
    assert {h["store"] for h in heads} == {str(scratch.resolve())}
    assert (heads[-1]["n"], heads[-1]["hash"]) == ledger_tip(scratch)
    assert sorted(p.name for p in scratch.parent.iterdir()) == ["scratch.db", "scratch.db.memoryd-heads"]
    # memoryctl finds them from the store alone, and checks them
    printed = memoryctl("audit", "heads", "--db", str(scratch))
    assert printed.returncode == 0, printed.stderr
    assert [json.loads(line) for line in printed.stdout.splitlines()] == heads
    verified = memoryctl("audit", "verify", "--db", str(scratch), "--heads",
                         str(scratch.parent / "scratch.db.memoryd-heads"))
    assert verified.returncode == 0, verified.stdout + verified.stderr


async def test_a_socket_daemon_on_another_store_keeps_its_heads_beside_it(xdg: Path, daemon_factory: Any) -> None:
    d = daemon_factory()
    async with socket_client(d.socket_path) as raw:
        await add(raw, "Uses uv")
    beside = d.db_path.with_name(d.db_path.name + ".memoryd-heads")
    printed = memoryctl("--socket", str(d.socket_path), "audit", "heads")
    assert printed.returncode == 0, printed.stderr
    assert [json.loads(line) for line in printed.stdout.splitlines()] == lines(beside)
    assert [h["event"] for h in lines(beside)] == ["start"]
    assert not (xdg / "state" / "memoryd").exists()


async def test_the_default_store_keeps_its_heads_in_the_users_witness(xdg: Path, daemon_factory: Any) -> None:
    default = xdg / "data" / "memoryd" / "memory.db"
    d = daemon_factory(db=default)
    async with socket_client(d.socket_path) as raw:
        await add(raw, "Runs pytest")
    witness = xdg / "state" / "memoryd" / "heads"
    heads = lines(witness)
    assert [h["event"] for h in heads] == ["start"] and heads[0]["store"] == str(default.resolve())
    assert not default.with_name("memory.db.memoryd-heads").exists()
    printed = memoryctl("--socket", str(d.socket_path), "audit", "heads")
    assert printed.returncode == 0, printed.stderr
    assert [json.loads(line) for line in printed.stdout.splitlines()] == heads
    d.stop()
    assert [h["event"] for h in lines(witness)] == ["start", "stop"]
    offline = memoryctl("audit", "heads", "--db", str(default))
    assert [json.loads(line) for line in offline.stdout.splitlines()] == lines(witness)
