"""``memoryctl audit verify --heads FILE`` says how many of the file's heads it checked, and
which, against the daemon and offline alike; a file with none of the store's says so."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import add
from rawclient import socket_client

pytestmark = pytest.mark.anyio


def memoryctl(*args: str, socket: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "memoryd_client", "--socket", str(socket), *args],
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, start_new_session=True)


def ledger(db: Path) -> list[tuple[int, str]]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return [(int(n), str(h)) for n, h in conn.execute("SELECT n, hash FROM memoryd_ledger ORDER BY n")]
    finally:
        conn.close()


def write_heads(path: Path, store: Path, rows: list[tuple[int, str]]) -> None:
    path.write_text("".join(json.dumps({"store": str(store.resolve()), "n": n, "hash": h, "ts": 1, "event": "every"})
                            + "\n" for n, h in rows))


async def test_verify_with_heads_names_the_heads_it_checked(daemon: Any, tmp_path: Path) -> None:
    async with socket_client(daemon.socket_path) as raw:
        for text in ("Prefers tabs", "Uses uv", "Runs pytest"):
            await add(raw, text)
    rows = ledger(daemon.db_path)
    assert len(rows) >= 3
    picked = [rows[0], rows[1], rows[-1]]
    heads = tmp_path / "heads"
    write_heads(heads, daemon.db_path, [*picked, picked[-1]])  # a head witnessed twice counts once
    store = str(daemon.db_path)
    r = memoryctl("audit", "verify", "--heads", str(heads), socket=daemon.socket_path)
    assert r.returncode == 0 and r.stdout.startswith("ledger ok: "), r.stderr
    assert r.stderr == (f"memoryctl: checking 3 heads witnessed for {store} in {heads}: ledger rows "
                        f"{picked[0][0]}, {picked[1][0]}, {picked[2][0]} (newest: row {picked[2][0]}, hash "
                        f"{picked[2][1][:16]})\n")


async def test_a_heads_file_without_the_store_s_heads_says_none_was_checked(daemon: Any, tmp_path: Path) -> None:
    async with socket_client(daemon.socket_path) as raw:
        await add(raw, "Prefers tabs")
    heads = tmp_path / "heads"
    write_heads(heads, tmp_path / "another.db", ledger(daemon.db_path))
    r = memoryctl("audit", "verify", "--heads", str(heads), socket=daemon.socket_path)
    assert r.returncode == 0 and r.stdout.startswith("ledger ok: ")
    assert r.stderr == f"memoryctl: {heads} holds no heads witnessed for {daemon.db_path}: no head was checked\n"


async def test_offline_verify_says_the_same(daemon_factory: Any, tmp_path: Path) -> None:
    d = daemon_factory()
    async with socket_client(d.socket_path) as raw:
        await add(raw, "Prefers tabs")
    d.stop()
    (one,) = ledger(d.db_path)[-1:]
    heads = tmp_path / "heads"
    write_heads(heads, d.db_path, [one])
    r = memoryctl("audit", "verify", "--db", str(d.db_path), "--heads", str(heads), socket=d.socket_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stderr == (f"memoryctl: checking 1 head witnessed for {d.db_path} in {heads}: ledger rows {one[0]} "
                        f"(newest: row {one[0]}, hash {one[1][:16]})\n")
