"""A store dsh-memento wrote, through memoryd and back (tests/fixtures/reference).

- memoryd's own export of a store the reference wrote (its DDL, the session's cwd as the
  ``workspaceKey`` of user-global entries) imports back into memoryd: the key normalised
  to '' and counted.
- What memoryd then exports (the envelope and every adapter's document) is the document in
  ``fixtures/reference/memoryd-exports/``, which ``generate.mjs`` gives to dsh-memento's own
  import code; tests/test_reference_adapters.py checks what the reference read back.
  ``MEMORYD_UPDATE_GOLDEN=1`` rewrites those documents (then run generate.mjs again).
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import sql
from rawclient import socket_client, write_ctx
from test_e2e_reference_schema import reference_store

pytestmark = [pytest.mark.anyio, pytest.mark.process]

REF = Path(__file__).resolve().parent / "fixtures" / "reference"
UPDATE = os.environ.get("MEMORYD_UPDATE_GOLDEN") == "1"
IMPORTER = write_ctx("imp", cwd="/home/u/elsewhere", agent="")
ADAPTERS = ["mem0", "hermes-memory-md", "claude-code-memory-md"]
#: what differs on every run: ids, times
VOLATILE = {"id", "createdAt", "updatedAt", "exportedAt", "created_at", "updated_at"}


def reference_written_store(db: Path) -> list[dict[str, Any]]:
    """A v4 store built with the reference's DDL, holding the rows its export shows (each
    user-global entry keeps the cwd that wrote it, as dsh-memento stores it)."""
    envelope = json.loads((REF / "exports" / "envelope.json").read_text(encoding="utf-8"))
    with contextlib.closing(sqlite3.connect(db)) as conn:
        reference_store(conn, 4)
        for e in envelope["entries"]:
            conn.execute("INSERT INTO entries (id, track, scope, workspace_key, agent_key, text, source, tags, "
                         "version, created_at, updated_at, last_recalled, recall_count, session_id) "
                         "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 's-ref')",
                         (e["id"], e["track"], e["scope"], e["workspaceKey"], e["agentKey"], e["text"], e["source"],
                          json.dumps(e["tags"]), e["version"], e["createdAt"], e["updatedAt"], e["lastRecalled"],
                          e["recallCount"]))
        conn.commit()
    return list(envelope["entries"])


def layers(entries: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return sorted((e["track"], e["scope"], e["workspaceKey"], e["agentKey"], e["text"], e["source"], e["tags"])
                  for e in entries)


def stable(doc: Any) -> Any:
    """The document without what changes on every run."""
    if isinstance(doc, dict):
        return {k: stable(v) for k, v in doc.items() if k not in VOLATILE}
    if isinstance(doc, list):
        return [stable(v) for v in doc]
    return doc


def check_fixture(name: str, doc: Any) -> None:
    path = REF / "memoryd-exports" / f"{name}.json"
    if UPDATE:
        path.parent.mkdir(exist_ok=True)
        path.write_text(doc if isinstance(doc, str) else json.dumps(doc, indent=2, ensure_ascii=False) + "\n",
                        encoding="utf-8")
    assert path.exists(), f"missing {path} (run with MEMORYD_UPDATE_GOLDEN=1, then generate.mjs)"
    saved = path.read_text(encoding="utf-8")
    if isinstance(doc, str):
        assert doc == saved, f"{path} is not memoryd's export: run with MEMORYD_UPDATE_GOLDEN=1, then generate.mjs"
    else:
        assert stable(doc) == stable(json.loads(saved)), (
            f"{path} is not memoryd's export: run with MEMORYD_UPDATE_GOLDEN=1, then generate.mjs")


async def test_memoryds_export_of_a_store_the_reference_wrote_imports_back(daemon_factory: Any,
                                                                          tmp_path: Path) -> None:
    db = tmp_path / "reference.db"
    written = reference_written_store(db)
    normalised = sorted((t, s, wk if s == "workspace" else "", ak, text, src, tags)
                        for t, s, wk, ak, text, src, tags in layers(written))
    ref = daemon_factory(db=db, name="ref")
    async with socket_client(ref.socket_path) as raw:
        # memoryd reads the store as the wire has it: a user-global entry has no workspace
        exported = await raw.ok("memory/export", {})
        assert layers(exported["entries"]) == normalised
        assert layers(await raw.ok("memory/list", {})) == normalised
        # a rewrite stores the key it shows, and the ledger still verifies
        await raw.ok("memory/replace", {"input": {"track": "user", "scope": "user-global", "match": "tea",
                                                  "text": "Prefers green tea"}, "write": IMPORTER})
        report = await raw.ok("audit/verify")
        assert report["ok"] is True and report["problems"] == []
    ref.stop()
    assert sql(db, "SELECT workspace_key FROM entries WHERE text = 'Prefers green tea'") == [("",)]
    assert sql(db, "SELECT count(*) FROM entries WHERE scope = 'user-global' AND workspace_key != ''") == [(2,)]

    fresh = daemon_factory(name="fresh")
    async with socket_client(fresh.socket_path) as raw:
        res = await raw.ok("memory/import", {"envelope": exported, "write": IMPORTER})
        assert res["added"] == 5 and "workspaceKeysDropped" not in res  # nothing left to drop
        got = await raw.ok("memory/list", {})
        assert layers(got) == normalised
        # What memoryd now exports of it is the document the reference is given to read.
        envelope = await raw.ok("memory/export", {})
        assert layers(envelope["entries"]) == normalised
        check_fixture("envelope", envelope)
        for adapter in ADAPTERS:
            check_fixture(adapter, await raw.ok("memory/export", {"adapter": adapter}))


async def test_the_references_export_of_its_store_imports_with_the_keys_counted(daemon_factory: Any) -> None:
    """The same store as dsh-memento exports it keeps the cwd keys: the import drops and counts them."""
    envelope = json.loads((REF / "exports" / "envelope.json").read_text(encoding="utf-8"))
    d = daemon_factory()
    async with socket_client(d.socket_path) as raw:
        res = await raw.ok("memory/import", {"envelope": envelope, "write": IMPORTER})
        assert (res["added"], res["workspaceKeysDropped"]) == (5, 3)
        assert {e["workspaceKey"] for e in await raw.ok("memory/list", {}) if e["scope"] == "user-global"} == {""}


async def test_the_references_export_into_its_own_store_finds_every_entry_there(daemon_factory: Any,
                                                                                 tmp_path: Path) -> None:
    """skipExisting (memoryctl import's default) takes an entry the reference stored with
    its cwd for the same entry as the export's, whose key is dropped: nothing is doubled."""
    db = tmp_path / "reference.db"
    reference_written_store(db)
    envelope = json.loads((REF / "exports" / "envelope.json").read_text(encoding="utf-8"))
    d = daemon_factory(db=db)
    async with socket_client(d.socket_path) as raw:
        before = await raw.ok("memory/list", {})
        res = await raw.ok("memory/import", {"envelope": envelope, "write": IMPORTER, "skipExisting": True})
        assert (res["added"], res["skipped"]) == (0, 5)
        assert await raw.ok("memory/list", {}) == before
