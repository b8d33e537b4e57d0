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
from e2e_helpers import add, sql, unaccepted
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


#: (what another program plants, what memoryd names it, how it is removed)
PLANTED = [
    ("CREATE VIEW planted AS SELECT id, text FROM entries", "view planted", "DROP VIEW planted"),
    ("CREATE TABLE planted (note TEXT)", "table planted", "DROP TABLE planted"),
]


@pytest.mark.parametrize("way", ["removed", "accepted"])
@pytest.mark.parametrize(("ddl", "name", "drop"), PLANTED, ids=["view", "table"])
async def test_a_planted_view_or_table_stops_writes_until_it_is_removed_or_accepted(
        daemon_factory: Any, any_approvers: Path, ddl: str, name: str, drop: str, way: str) -> None:
    """A view or a new table is a schema change like a planted trigger: named, recorded
    once as a ``foreign`` row, and every write refused with the store unchanged, until the
    object is dropped or that row accepted."""
    d = daemon_factory("--config", str(any_approvers))
    db = d.db_path
    async with socket_client(d.socket_path) as raw:
        await add(raw, "Prefers tabs")
        sql(db, ddl)
        before = stored(db)
        for text in ("Uses uv", "Uses pnpm"):
            refused = await raw.fail("memory/add", {"input": {**LAYER, "text": text}, "write": write_ctx()})
            [(n, body)] = [(n, json.loads(b)) for n, b in sql(db, "SELECT n, body FROM memoryd_ledger "
                                                                   "WHERE kind = 'foreign'")]
            assert refused.code == "STORE_CORRUPT"
            assert said(refused) == (f"nothing was written: another program changed the store's schema ({name}); "
                                     f"remove it, or accept it with memoryctl audit accept {n}")
            assert body["note"] == f"the schema changed: {name} added (while memoryd ran)"
            assert schema_items(db) == [name]  # recorded once, however many writes it refuses
            query = await raw.ok("memory/query", {"filter": {"text": "tabs"}})  # reads are served meanwhile
            assert [e["text"] for e in query["entries"]] == ["Prefers tabs"]
            # a query that names its session too: its recalled row waits for the store
            recall = await raw.ok("memory/query", {"filter": {"text": "tabs"}, "opts": {"sessionId": "s-1"}})
            assert [e["text"] for e in recall["entries"]] == ["Prefers tabs"]
            assert stored(db) == before
        if way == "removed":
            sql(db, drop)
        else:
            await raw.ok("audit/accept", {"n": n})
        written = (await add(raw, "Uses uv"))["entry"]
        assert sql(db, "SELECT text FROM entries WHERE id = ?", written["id"]) == [("Uses uv",)]
        # after the first add (seq 1): the two session queries' recalled rows, kept while writes
        # were refused, went in first
        assert sql(db, "SELECT action FROM audit WHERE session_id = 's-1' AND seq > 1 ORDER BY seq") == [
            ("recalled",), ("recalled",), ("add",)]
        # the row stays to accept when the object is gone; once accepted, nothing is left to report
        problems = [] if way == "accepted" else [unaccepted(n, body["note"])]
        assert (await raw.ok("audit/verify"))["problems"] == problems
