"""Schema changes another program makes that leave every column as ``pragma_table_info``
shows it, against a real daemon: a generated column (table_info hides it) and a table
rebuilt with another constraint (a UNIQUE that now replaces the row it meets, inside
memoryd's own transaction). Each is a schema change like a planted trigger: named, recorded
as a ``foreign`` row, and no write commits over it. (The other program is a connection of
the test's own.)"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import add, sql
from rawclient import RpcFailure, socket_client, write_ctx

pytestmark = [pytest.mark.anyio, pytest.mark.inprocess]

LAYER = {"track": "user", "scope": "user-global"}


def stored(db: Path) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    entries = sql(db, "SELECT id, track, scope, text, source, version FROM entries ORDER BY id")
    audit = sql(db, "SELECT seq, action, entry_id FROM audit ORDER BY seq")
    return entries, audit


def said(err: RpcFailure) -> str:
    message: str = err.error["data"]["message"]
    return message


def schema_items(db: Path) -> list[str]:
    return [item.split(" (sha256:")[0] for (body,) in sql(db, "SELECT body FROM memoryd_ledger WHERE kind = 'foreign'")
            for item in json.loads(body)["schema"]]


async def test_a_generated_column_stops_writes(daemon_factory: Any) -> None:
    d = daemon_factory()
    db = d.db_path
    async with socket_client(d.socket_path) as raw:
        await add(raw, "Prefers tabs")
        sql(db, "ALTER TABLE entries ADD COLUMN planted AS (1) VIRTUAL")
        before = stored(db)
        refused = await raw.fail("memory/add", {"input": {**LAYER, "text": "Uses uv"}, "write": write_ctx()})
        assert refused.code == "STORE_CORRUPT"
        assert "another program changed the store's schema (column entries.planted)" in said(refused)
        assert schema_items(db) == ["column entries.planted"]
        assert stored(db) == before


def rebuild_proposals(db: Path) -> None:
    """SQLite's own procedure for a table with another constraint: create, copy, drop, rename."""
    with contextlib.closing(sqlite3.connect(db, isolation_level=None)) as conn:
        [(ddl,)] = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'proposals'").fetchall()
        [(index,)] = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'proposals_status'").fetchall()
        changed = ddl.replace("CREATE TABLE proposals", "CREATE TABLE proposals_new").replace(
            "UNIQUE (session_id, kind)", "UNIQUE (session_id, kind) ON CONFLICT REPLACE")
        assert changed != ddl
        conn.executescript(f"BEGIN IMMEDIATE; {changed}; INSERT INTO proposals_new SELECT * FROM proposals; "
                           f"DROP TABLE proposals; ALTER TABLE proposals_new RENAME TO proposals; {index}; COMMIT;")


async def test_a_table_rebuilt_with_another_constraint_stops_writes(daemon_factory: Any) -> None:
    d = daemon_factory()
    db = d.db_path
    async with socket_client(d.socket_path) as raw:
        await add(raw, "Prefers tabs")
        rebuild_proposals(db)
        before = stored(db)
        refused = await raw.fail("memory/add", {"input": {**LAYER, "text": "Uses uv"}, "write": write_ctx()})
        assert refused.code == "STORE_CORRUPT"
        assert "another program changed the store's schema (table proposals changed)" in said(refused)
        assert schema_items(db) == ["table proposals changed"]
        assert stored(db) == before
