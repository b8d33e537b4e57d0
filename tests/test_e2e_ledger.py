"""The ledger that proves itself, against real daemons: every write path's rows are chained
and replayable, approvals and failures are recorded, and tampering is caught."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

import anyio
import pytest
from e2e_helpers import Gate, add, arrived, entry_input, sql, start_held, unaccepted
from memoryd_protocol.constants import EXPORT_PLUGIN, EXPORT_SCHEMA
from rawclient import Raw, socket_client, write_ctx
from test_e2e_store import make_store

pytestmark = [pytest.mark.anyio, pytest.mark.inprocess]

LAYER = {"track": "user", "scope": "user-global"}


async def every_path(raw: Raw) -> None:
    """One write of each path, a denial, a recall and a snapshot."""
    first = await add(raw, "alpha one", tags=["t"])
    await add(raw, "beta two")
    await raw.ok("memory/replace", {"input": {**LAYER, "id": first["entry"]["id"], "text": "alpha 1"},
                                    "write": write_ctx()})
    await add(raw, "gamma three")
    await raw.ok("memory/consolidate", {"input": {**LAYER, "matches": ["beta", "gamma"], "text": "beta+gamma"},
                                        "write": write_ctx()})
    await raw.ok("memory/remove", {"input": {**LAYER, "match": "alpha 1"}, "write": write_ctx()})
    await raw.ok("memory/seed", {"inputs": [entry_input("seeded a", "agent", "user-global"),
                                            entry_input("seeded b")], "write": write_ctx()})
    await raw.ok("memory/import", {"envelope": {"plugin": EXPORT_PLUGIN, "schema": EXPORT_SCHEMA, "entries": [
        {**LAYER, "text": "imported", "source": "backup", "tags": ["x"]}]}, "write": write_ctx()})
    await raw.fail("memory/add", {"input": entry_input("x" * 5000), "write": write_ctx()})  # over budget: no row
    await raw.ok("memory/query", {"filter": {"text": "seeded"}, "opts": {"sessionId": "s-1"}})
    await raw.ok("memory/snapshot", {"session": {"id": "s-1"}})
    created = await raw.ok("proposals/create", {"session": {"id": "s-1"}, "input": {**LAYER, "kind": "habit", "text": "proposed"}})
    await raw.ok("proposals/approve", {"id": created["id"], "write": write_ctx()})


def audit_count(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        (n,) = conn.execute("SELECT count(*) FROM audit").fetchone()
    return int(n)


def ledger_rows(db: Path, kind: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT n, ref, body FROM memoryd_ledger WHERE kind = ? ORDER BY n", (kind,)).fetchall()


async def test_every_write_path_is_chained_and_replays(daemon: Any) -> None:
    async with socket_client(daemon.socket_path) as raw:
        await every_path(raw)
        report = await raw.ok("audit/verify")
        assert report["problems"] == [] and report["ok"] is True
        assert report["afterAuditSeq"] == 0 and report["note"] == "the chain starts with the store"
        assert report["auditRows"] == audit_count(daemon.db_path)
        assert len(report["head"]) == 64
        # the connection that wrote is named once, before its first row
        [(_, ref, body)] = ledger_rows(daemon.db_path, "connection")
        run, cid = ref.split("/")
        assert f'"pid":{os.getpid()}' in body and len(run) == 12 and cid.isdigit()


async def test_an_edited_audit_row_is_caught(daemon: Any) -> None:
    async with socket_client(daemon.socket_path) as raw:
        await every_path(raw)
        with sqlite3.connect(daemon.db_path) as conn:
            conn.execute("UPDATE audit SET text = 'harmless' WHERE seq = 2")
        report = await raw.ok("audit/verify")
        assert report["ok"] is False
        assert report["problems"][0] == {"n": report["problems"][0]["n"], "seq": 2,
                                         "reason": "audit row 2 was changed after it was written"}


async def test_an_edited_approval_row_is_caught(ask_daemon: Any) -> None:
    async with socket_client(ask_daemon.socket_path) as raw:
        raw.on_approval = Gate()
        async with anyio.create_task_group() as tg:
            box = start_held(tg, raw, "memory/add", {"input": entry_input("asked one"), "write": write_ctx()})
            await arrived(raw.on_approval)  # type: ignore[arg-type]
            approval = raw.on_approval.asked[0]["id"]  # type: ignore[attr-defined]
            await raw.ok("approval/decided", {"id": approval, "outcome": "allowed-once",
                                              "by": {"kind": "human", "name": "ana"}})
        assert "result" in box["r"]
        assert (await raw.ok("audit/verify"))["ok"] is True
        [(n, ref, body)] = ledger_rows(ask_daemon.db_path, "decided")
        assert ref == approval and '"by":{"kind":"human","name":"ana"}' in body and '"outcome":"allowed-once"' in body
        with sqlite3.connect(ask_daemon.db_path) as conn:
            conn.execute("UPDATE memoryd_ledger SET body = replace(body, 'ana', 'bob') WHERE n = ?", (n,))
        report = await raw.ok("audit/verify")
        assert report["ok"] is False
        assert report["problems"][0] == {"n": n, "reason": "the row's hash does not match its content: the row was changed"}


async def test_deleted_rows_are_caught(daemon: Any) -> None:
    async with socket_client(daemon.socket_path) as raw:
        await every_path(raw)
        with sqlite3.connect(daemon.db_path) as conn:
            conn.execute("DELETE FROM audit WHERE seq = 3")
        report = await raw.ok("audit/verify")
        assert report["ok"] is False and report["problems"][0]["reason"] == "audit row 3 was deleted"
        with sqlite3.connect(daemon.db_path) as conn:
            (n,) = conn.execute("SELECT n FROM memoryd_ledger WHERE audit_seq = 3").fetchone()
            conn.execute("DELETE FROM memoryd_ledger WHERE n = ?", (n,))
        report = await raw.ok("audit/verify")
        assert report["problems"][0] == {"n": n, "reason": f"ledger row {n} is missing (the next row is {n + 1})"}


async def test_forged_rows_and_entries_are_caught(daemon: Any) -> None:
    """Rows and entries written behind the running daemon's back are found before its next
    batch (or verify), each change recorded as a foreign row that verify names until it is
    accepted; a later edit of what such a row recorded is caught at that row."""
    async with socket_client(daemon.socket_path) as raw:
        await every_path(raw)
        seq = audit_count(daemon.db_path) + 1
        with sqlite3.connect(daemon.db_path) as conn:
            conn.execute("INSERT INTO audit (ts, action, text) VALUES (1, 'add', 'forged')")
        report = await raw.ok("audit/verify")
        [(first,)] = sql(daemon.db_path, "SELECT n FROM memoryd_ledger WHERE kind = 'foreign'")
        assert report["problems"] == [unaccepted(first, f"1 audit rows written (seq {seq}) (while memoryd ran)")]
        with sqlite3.connect(daemon.db_path) as conn:
            conn.execute("DELETE FROM audit WHERE seq = ?", (seq,))
            (eid,) = conn.execute("SELECT id FROM entries WHERE text = 'imported'").fetchone()
            conn.execute("UPDATE entries SET text = 'imported!' WHERE id = ?", (eid,))
            track, scope = conn.execute("SELECT track, scope FROM entries WHERE id = ?", (eid,)).fetchone()
            kept = conn.execute("SELECT entries, used FROM memoryd_usage WHERE track = ? AND scope = ?",
                                (track, scope)).fetchone()
            texts = [t for (t,) in conn.execute("SELECT text FROM entries WHERE track = ? AND scope = ?", (track, scope))]
        report = await raw.ok("audit/verify")
        [_, (second,)] = sql(daemon.db_path, "SELECT n FROM memoryd_ledger WHERE kind = 'foreign' ORDER BY n")
        units = sum(len(t.encode("utf-16-le")) // 2 for t in texts)
        # the text was edited without its count: the counter is recounted, and both recorded
        assert report["problems"] == [
            {"n": first, "reason": "the audit rows this change made outside memoryd wrote were changed or deleted "
                                   "since"},
            unaccepted(first, f"1 audit rows written (seq {seq}) (while memoryd ran)"),
            unaccepted(second, f"1 entries changed ({eid}); memoryd_usage said {track}/{scope} holds {kept[0]} "
                               f"entries of {kept[1]} characters, and they are {len(texts)} of {units} "
                               f"(while memoryd ran)")]


async def test_a_memento_store_starts_its_chain_at_the_first_memoryd_row(daemon_factory: Any, tmp_path: Path) -> None:
    db = tmp_path / "memory.db"
    make_store(db, 4)
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT INTO audit (ts, action, text) VALUES (1, 'add', 'Prefers tabs')")
        conn.execute("INSERT INTO audit (ts, action, text) VALUES (2, 'add', 'gone')")
    d = daemon_factory(db=db)
    async with socket_client(d.socket_path) as raw:
        await add(raw, "a memoryd row")
        report = await raw.ok("audit/verify")
        assert report["ok"] is True and report["afterAuditSeq"] == 2 and report["auditRows"] == 1
        assert report["note"] == ("the chain starts after audit row 2: the 2 earlier audit rows were written before "
                                  "this store had a ledger (by dsh-memento, or an older memoryd) and carry no hashes")
        life = await raw.ok("audit/explain", {"target": "tabs"})
        assert [e["action"] for e in life["events"]] == ["present-at-start"]
        assert life["current"]["text"] == "Prefers tabs"


async def test_explain_tells_one_entrys_life(ask_daemon: Any) -> None:
    async with socket_client(ask_daemon.socket_path) as raw:
        gate = Gate()
        raw.on_approval = gate
        async with anyio.create_task_group() as tg:
            start_held(tg, raw, "memory/add", {"input": entry_input("uses pnpm"), "write": write_ctx()})
            await arrived(gate)
            await raw.ok("approval/decided", {"id": gate.asked[0]["id"], "outcome": "allowed-once",
                                              "by": {"kind": "human"}})
        await raw.ok("memory/snapshot", {"session": write_ctx("s-7")["agent"]["session"]})
        await raw.ok("memory/snapshot", {"session": {"id": "s-8"}})  # an agent key of its own: does not see it
        life = await raw.ok("audit/explain", {"target": "PNPM"})
        [event] = life["events"]
        assert event["action"] == "add" and event["text"] == "uses pnpm" and event["sessionId"] == "s-1"
        assert event["outcome"] == "allowed-once (via approval, writePolicy ask)"
        assert event["askedBy"]["pid"] == os.getpid()
        decision = event["decision"]
        assert decision["approval"] == gate.asked[0]["id"] and decision["outcome"] == "allowed-once"
        assert decision["by"] == {"kind": "human", "name": None} and decision["decidedBy"]["pid"] == os.getpid()
        assert decision["reason"] == gate.asked[0]["reason"] and decision["failed"] is None
        assert life["snapshots"] == ["s-7"]
        assert life["current"]["text"] == "uses pnpm"
        assert (await raw.ok("audit/explain", {"target": life["entryId"]}))["entryId"] == life["entryId"]
        err = await raw.fail("audit/explain", {"target": "no such text"})
        assert err.code == "INVALID_INPUT" and err.details == {"field": "target"}
        assert err.error["message"] == "no entry in the store or its ledger has this id or contains this text"



async def test_an_approved_write_that_fails_leaves_a_failed_row(ask_daemon: Any) -> None:
    async with socket_client(ask_daemon.socket_path) as raw, socket_client(ask_daemon.socket_path) as other:
        gate = Gate()
        raw.on_approval = gate
        other_gate = Gate()
        other.on_approval = other_gate
        async with anyio.create_task_group() as tg:
            tg.start_soon(other.call, "memory/add", {"input": entry_input("target"), "write": write_ctx()})
            await arrived(other_gate)
            await other.ok("approval/decided", {"id": other_gate.asked[0]["id"], "outcome": "allowed-once"})
        [entry] = await raw.ok("memory/list")
        async with anyio.create_task_group() as tg:
            box = start_held(tg, raw, "memory/remove", {"input": {**LAYER, "id": entry["id"]}, "write": write_ctx()})
            await arrived(gate)
            # the other session changes the entry while this removal's approval is held open
            other_gate.arrived = anyio.Event()
            tg.start_soon(other.call, "memory/replace", {"input": {**LAYER, "id": entry["id"], "text": "changed"},
                                                         "write": write_ctx("s-2")})
            await arrived(other_gate)
            await other.ok("approval/decided", {"id": other_gate.asked[1]["id"], "outcome": "allowed-once"})
            await raw.ok("approval/decided", {"id": gate.asked[0]["id"], "outcome": "allowed-once"})
        assert box["r"]["error"]["data"]["code"] == "ENTRY_NOT_FOUND"
        report = await raw.ok("audit/verify")
        assert report["ok"] is True
        [(_, ref, body)] = ledger_rows(ask_daemon.db_path, "failed")
        assert ref == gate.asked[0]["id"] and '"code":"ENTRY_NOT_FOUND"' in body and '"action":"remove"' in body
        life = await raw.ok("audit/explain", {"target": entry["id"]})
        assert [e["action"] for e in life["events"]] == ["add", "replace", "remove-failed"]
        failed = life["events"][2]
        assert failed["outcome"] == "ENTRY_NOT_FOUND" and failed["decision"]["outcome"] == "allowed-once"
        assert failed["decision"]["failed"] == "ENTRY_NOT_FOUND" and failed["askedBy"]["pid"] == os.getpid()


async def test_explain_names_the_candidates_of_an_ambiguous_text(daemon: Any) -> None:
    async with socket_client(daemon.socket_path) as raw:
        a = (await add(raw, "uses pnpm"))["entry"]["id"]
        b = (await add(raw, "uses uv"))["entry"]["id"]
        err = await raw.fail("audit/explain", {"target": "uses"})
        assert err.code == "INVALID_INPUT" and err.details == {"field": "target"}
        assert err.error["message"] == f"2 entries contain this text; name one by id: {', '.join(sorted([a, b]))}"
        await raw.ok("memory/remove", {"input": {**LAYER, "id": b}, "write": write_ctx()})
        # a removed entry is still explained, from the ledger
        life = await raw.ok("audit/explain", {"target": "uses uv"})
        assert life["entryId"] == b and life["current"] is None
        assert [e["action"] for e in life["events"]] == ["add", "remove"]
