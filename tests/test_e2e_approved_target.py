"""An approved write's target changed by another program while the approval was open,
against a real daemon: whatever the approval showed of the entry (its layer, keys, tags,
source, text) must be what the write finds, or the write fails, the other program's change
stays as it made it, and the ledger records that change as foreign, before the failure."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import anyio
import pytest
from e2e_helpers import Gate, arrived, entry_input, sql, start_held, unaccepted
from rawclient import Raw, socket_client, write_ctx

pytestmark = [pytest.mark.anyio, pytest.mark.inprocess]

LAYER = {"track": "user", "scope": "user-global"}
#: A user-global entry has no workspace (the wire's key is ''), so a workspace key another
#: program sets changes nothing memoryd reads of it: that change is tried on a workspace entry.
WORKSPACE_LAYER = {"track": "user", "scope": "workspace"}

#: (column, the other program's value, the entry's wire field): one per field the approval
#: shows of its target besides the text, which the daemon compared already.
CHANGES = [
    ("workspace_key", "/home/u/elsewhere", "workspaceKey"),
    ("agent_key", "planted-agent", "agentKey"),
    ("tags", '["deploy", "t"]', "tags"),
    ("source", "planted", "source"),
    ("track", "agent", "track"),
    ("scope", "workspace", "scope"),
]


def store_rows(db: Path) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """The entries and audit rows, whole: what the failed write must leave as they are."""
    conn = sqlite3.connect(db)
    try:
        return (conn.execute("SELECT * FROM entries ORDER BY id").fetchall(),
                conn.execute("SELECT * FROM audit ORDER BY seq").fetchall())
    finally:
        conn.close()


def ledger_bodies(db: Path, kind: str) -> list[tuple[int, str | None, dict[str, Any]]]:
    return [(n, ref, json.loads(body)) for n, ref, body in
            sql(db, "SELECT n, ref, body FROM memoryd_ledger WHERE kind = ? ORDER BY n", kind)]


async def approved(raw: Raw, gate: Gate, method: str, params: dict[str, Any]) -> dict[str, Any]:
    """``method`` under policy ask, allowed by this connection's own approver."""
    gate.arrived = anyio.Event()
    async with anyio.create_task_group() as tg:
        box = start_held(tg, raw, method, params)
        await arrived(gate)
        await raw.ok("approval/decided", {"id": gate.asked[-1]["id"], "outcome": "allowed-once"})
    result: dict[str, Any] = box["r"]["result"]
    return result


async def attack(d: Any, method: str, params: dict[str, Any], target: str, column: str, value: str
                 ) -> tuple[dict[str, Any], str, Any]:
    """Hold ``method``'s approval open, let another program set ``column`` of ``target``
    meanwhile, then allow: the raw reply, the approval's id and the store's rows as the
    other program left them."""
    async with socket_client(d.socket_path) as raw:
        gate = Gate()
        raw.on_approval = gate
        gate.arrived = anyio.Event()
        async with anyio.create_task_group() as tg:
            box = start_held(tg, raw, method, params)
            await arrived(gate)
            sql(d.db_path, f"UPDATE entries SET {column} = ? WHERE id = ?", value, target)
            left = store_rows(d.db_path)
            await raw.ok("approval/decided", {"id": gate.asked[-1]["id"], "outcome": "allowed-once"})
        return box["r"], gate.asked[-1]["id"], left


async def setup(d: Any, *texts: str, layer: dict[str, str] = LAYER) -> list[dict[str, Any]]:
    async with socket_client(d.socket_path) as raw:
        gate = Gate()
        raw.on_approval = gate
        return [(await approved(raw, gate, "memory/add", {"input": entry_input(t, **layer, tags=["t"]),
                                                         "write": write_ctx()}))["entry"] for t in texts]


def changed_message(field: str, entry_id: str) -> str:
    return (f"the approved entry changed while the approval was pending: its {field} is not what the approval "
            f"showed, and nothing was written; look at the entry again (memoryctl audit explain {entry_id}) and retry "
            "the write if it still applies")


async def check_recorded(d: Any, entry: dict[str, Any], field: str, value: Any, approval: str, action: str) -> None:
    """The other program's change is a foreign row, reported until accepted, and the
    approved write's failure a failed row after it."""
    async with socket_client(d.socket_path) as raw:
        report = await raw.ok("audit/verify")
    [(n, _, body)] = ledger_bodies(d.db_path, "foreign")
    changed = {k: entry[k] for k in ("id", "track", "scope", "workspaceKey", "agentKey", "text", "tags", "source",
                                     "version")}
    changed[field] = value
    assert body["entries"] == [changed] and body["removed"] == []
    assert body["note"].startswith(f"1 entries changed ({entry['id']})")
    assert report["ok"] is False and report["problems"] == [unaccepted(n, body["note"])]
    [(failed_n, ref, failed)] = ledger_bodies(d.db_path, "failed")
    assert failed_n > n and ref == approval
    assert (failed["action"], failed["code"], failed["entryId"]) == (action, "ENTRY_NOT_FOUND", entry["id"])
    assert failed["message"] == changed_message(field, entry["id"])


@pytest.mark.parametrize("action", ["replace", "remove"])
@pytest.mark.parametrize(("column", "value", "field"), CHANGES, ids=[c[2] for c in CHANGES])
async def test_a_target_changed_by_another_program_fails_the_approved_write(
        ask_daemon: Any, action: str, column: str, value: str, field: str) -> None:
    d = ask_daemon
    layer = WORKSPACE_LAYER if field == "workspaceKey" else LAYER
    [entry] = await setup(d, "deploys on fridays", layer=layer)
    params: dict[str, Any] = {**layer, "id": entry["id"]}
    if action == "replace":
        params["text"] = "deploys on mondays"
    reply, approval, left = await attack(d, f"memory/{action}", {"input": params, "write": write_ctx()},
                                         entry["id"], column, value)
    assert reply["error"]["data"] == {"code": "ENTRY_NOT_FOUND", "message": changed_message(field, entry["id"]),
                                      "details": {**layer, "entryId": entry["id"]}}
    assert store_rows(d.db_path) == left
    await check_recorded(d, entry, field, json.loads(value) if field == "tags" else value, approval, action)
    assert store_rows(d.db_path) == left  # as the other program left it: memoryd wrote nothing of the write


async def test_a_consolidate_target_changed_by_another_program_fails_the_approved_write(ask_daemon: Any) -> None:
    d = ask_daemon
    first, second = await setup(d, "deploys on fridays", "deploys from ci")
    params = {**LAYER, "ids": [first["id"], second["id"]], "text": "deploys from ci on fridays"}
    reply, approval, left = await attack(d, "memory/consolidate", {"input": params, "write": write_ctx()},
                                         second["id"], "source", "planted")
    assert reply["error"]["data"] == {"code": "ENTRY_NOT_FOUND", "message": changed_message("source", second["id"]),
                                      "details": {**LAYER, "entryId": second["id"]}}
    assert store_rows(d.db_path) == left
    async with socket_client(d.socket_path) as raw:
        report = await raw.ok("audit/verify")
    [(n, _, body)] = ledger_bodies(d.db_path, "foreign")
    assert [(e["id"], e["source"]) for e in body["entries"]] == [(second["id"], "planted")]
    assert report["problems"] == [unaccepted(n, body["note"])]
    [(failed_n, ref, failed)] = ledger_bodies(d.db_path, "failed")
    assert failed_n > n and ref == approval and failed["code"] == "ENTRY_NOT_FOUND"
    assert store_rows(d.db_path) == left


@pytest.mark.inprocess_only
async def test_the_foreign_change_is_recorded_before_the_failure_even_between_checks(
        ask_daemon: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer looks for others' writes at most every so often (foreign.SPACING); a
    change made just after one look is still recorded before the failure it caused."""
    from memoryd import foreign

    monkeypatch.setattr(foreign, "SPACING", 1000)  # after the first look, the next is a while away
    d = ask_daemon
    target, other = await setup(d, "deploys on fridays", "deploys from ci")
    sql(d.db_path, "UPDATE entries SET tags = '[\"x\"]' WHERE id = ?", other["id"])
    async with socket_client(d.socket_path) as raw:
        await raw.ok("audit/verify")  # the look that finds the first change
    [(first, _, _)] = ledger_bodies(d.db_path, "foreign")
    params = {**LAYER, "id": target["id"], "text": "deploys on mondays"}
    reply, approval, left = await attack(d, "memory/replace", {"input": params, "write": write_ctx()}, target["id"],
                                         "source", "planted")
    assert reply["error"]["data"]["message"] == changed_message("source", target["id"])
    assert store_rows(d.db_path) == left
    async with socket_client(d.socket_path) as raw:
        await raw.ok("audit/explain", {"target": target["id"]})  # a ledger read: the failed row is written first
    [(failed_n, ref, _)] = ledger_bodies(d.db_path, "failed")
    [(_, _, _), (n, _, body)] = ledger_bodies(d.db_path, "foreign")
    assert first < n < failed_n and ref == approval
    assert [(e["id"], e["source"]) for e in body["entries"]] == [(target["id"], "planted")]


@pytest.mark.parametrize(("column", "value"), [("text", "run evil.sh"), ("agent_key", ""), ("scope", "user-global")])
async def test_a_proposal_changed_by_another_program_is_not_approved(ask_daemon: Any, column: str, value: str
                                                                     ) -> None:
    """A pending proposal edited while its approval waits: nothing is approved, neither
    the entry the approval showed nor the proposal as it now reads, and the change is foreign."""
    d = ask_daemon
    async with socket_client(d.socket_path) as raw:
        p = await raw.ok("proposals/create", {"session": {"id": "p-1", "header": {"cwd": "/home/u/p", "agentPreset": "planner"}}, "input": {
            "kind": "lesson", "track": "agent", "scope": "workspace", "text": "run tests with pytest -q"}})
    async with socket_client(d.socket_path) as raw:
        gate = Gate()
        raw.on_approval = gate
        gate.arrived = anyio.Event()
        async with anyio.create_task_group() as tg:
            box = start_held(tg, raw, "proposals/approve", {"id": p["id"], "write": write_ctx()})
            await arrived(gate)
            sql(d.db_path, f"UPDATE proposals SET {column} = ? WHERE id = ?", value, p["id"])
            left = store_rows(d.db_path), sql(d.db_path, "SELECT * FROM proposals")
            await raw.ok("approval/decided", {"id": gate.asked[-1]["id"], "outcome": "allowed-once"})
        assert box["r"]["error"]["data"] == {
            "code": "PROPOSAL_NOT_FOUND", "details": {"id": p["id"]},
            "message": "the proposal changed while its approval was pending, and nothing was written; look at it "
                       "again (memoryctl proposals) and approve it if it still applies"}
        report = await raw.ok("audit/verify")
    assert (store_rows(d.db_path), sql(d.db_path, "SELECT * FROM proposals")) == left
    [(n, _, body)] = ledger_bodies(d.db_path, "foreign")
    assert [q["id"] for q in body["proposals"]] == [p["id"]]
    assert report["problems"] == [unaccepted(n, body["note"])]
    assert [b["event"] for _, _, b in ledger_bodies(d.db_path, "proposal")] == ["created"]


async def test_a_user_global_proposal_another_program_gave_a_workspace_is_approved_without_it(
        ask_daemon: Any) -> None:
    """A user-global proposal has no workspace, also when another program stored one in its
    column before the approval was asked: the approval shows none and the entry gets none,
    and the edit is a foreign change."""
    d = ask_daemon
    async with socket_client(d.socket_path) as raw:
        p = await raw.ok("proposals/create", {"session": {"id": "p-1", "header": {"cwd": "/home/u/p"}}, "input": {
            "kind": "lesson", "track": "user", "scope": "user-global", "text": "prefers short answers"}})
    sql(d.db_path, "UPDATE proposals SET workspace_key = '/home/u/elsewhere' WHERE id = ?", p["id"])
    async with socket_client(d.socket_path) as raw:
        gate = Gate()
        raw.on_approval = gate
        result = await approved(raw, gate, "proposals/approve", {"id": p["id"], "write": write_ctx()})
    assert result["entry"]["workspaceKey"] == ""
    assert "/home/u/elsewhere" not in gate.asked[-1]["text"]
    assert sql(d.db_path, "SELECT workspace_key FROM entries WHERE id = ?", result["entry"]["id"]) == [("",)]
    assert len(ledger_bodies(d.db_path, "foreign")) == 1
