"""Another program changes the store in ways the reconcile did not look for, against real
daemons: a check that cannot run, a change made in the pause after a reconcile, the text
index edited so that an entry is never found, and a planted trigger. Each must be found
before memoryd's next commit, recorded as a ``foreign`` ledger row, and never chained
silently into memoryd's own rows. (The other program is a connection of the test's own.)"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from e2e_helpers import Gate, add, arrived, sql, start_held, unaccepted
from memoryd import foreign
from rawclient import Raw, RpcFailure, socket_client, write_ctx

pytestmark = [pytest.mark.anyio, pytest.mark.inprocess]

LAYER = {"track": "user", "scope": "user-global"}


def foreign_rows(db: Path) -> list[tuple[int, dict[str, Any]]]:
    return [(n, json.loads(body)) for n, body in sql(db, "SELECT n, body FROM memoryd_ledger WHERE kind = 'foreign'")]


def stored(db: Path) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], int]:
    """What a refused write must leave as it was: the entries, the audit rows, the ledger."""
    entries = sql(db, "SELECT id, track, scope, agent_key, text, source, version FROM entries ORDER BY id")
    audit = sql(db, "SELECT seq, action, entry_id FROM audit ORDER BY seq")
    [(rows,)] = sql(db, "SELECT count(*) FROM memoryd_ledger")
    return entries, audit, int(rows)


async def allow(params: dict[str, Any]) -> str:
    return "allowed-once"


def said(err: RpcFailure) -> str:
    message: str = err.error["data"]["message"]
    return message


def replace(eid: str, text: str) -> dict[str, Any]:
    return {"input": {**LAYER, "id": eid, "text": text}, "write": write_ctx()}


@pytest.mark.process
async def test_a_check_that_cannot_run_stops_the_batch_and_says_why(daemon_factory: Any, any_approvers: Path) -> None:
    """The proposals table renamed away, the target moved to the shared layer with another
    source, then a replace of it asked and approved: the check cannot read the store, so
    the approved replace is refused and nothing commits; once the table is back, the move
    is a foreign row and the refusal a failed row naming why."""
    d = daemon_factory("--config", str(any_approvers), policy="ask")
    db = d.db_path
    async with socket_client(d.socket_path) as raw:
        raw.on_approval = allow
        eid = (await add(raw, "Prefers tabs", agentKey="coder"))["entry"]["id"]
        sql(db, "ALTER TABLE proposals RENAME TO proposals_away")
        sql(db, "UPDATE entries SET agent_key = '', source = 'planted' WHERE id = ?", eid)
        before = stored(db)
        refused = await raw.fail("memory/replace", replace(eid, "Prefers spaces"))
        assert refused.code == "STORE_CORRUPT"
        assert said(refused) == ("nothing was written: memoryd cannot check the store for changes another program "
                                   "made (no such table: proposals); undo that change (audit verify names what is "
                                   "wrong), then write again")
        assert stored(db) == before
        sql(db, "ALTER TABLE proposals_away RENAME TO proposals")
        report = await raw.ok("audit/verify")
        [(n, body)] = foreign_rows(db)
        assert [(e["id"], e["agentKey"], e["source"], e["text"]) for e in body["entries"]] == [
            (eid, "", "planted", "Prefers tabs")]
        assert report["problems"] == [unaccepted(n, body["note"])]
        [(failed,)] = sql(db, "SELECT body FROM memoryd_ledger WHERE kind = 'failed'")
        assert (json.loads(failed)["code"], json.loads(failed)["message"]) == ("STORE_CORRUPT", said(refused))
        [(text,)] = sql(db, "SELECT text FROM entries WHERE id = ?", eid)
        assert text == "Prefers tabs"
    assert "cannot check the store for changes another program made (no such table: proposals)" in d.stderr()


@pytest.mark.process
async def test_a_check_stopped_by_a_text_that_is_not_utf8_says_why_without_the_text(daemon_factory: Any) -> None:
    """SQLite's own error for a row that does not decode quotes the row's text: the reason
    the client, the ledger and the log get names the column, never what the row holds."""
    d = daemon_factory()
    db = d.db_path
    async with socket_client(d.socket_path) as raw:
        await add(raw, "Prefers tabs")
        sql(db, "UPDATE entries SET text = CAST(X'FF' || CAST('secret-in-row' AS BLOB) AS TEXT)")
        rows = "SELECT id, hex(text), version, (SELECT count(*) FROM audit), (SELECT count(*) FROM memoryd_ledger) FROM entries"
        before = sql(db, rows)
        refused = await raw.fail("memory/add", {"input": {**LAYER, "text": "Uses uv"}, "write": write_ctx()})
        assert refused.code == "STORE_CORRUPT"
        assert said(refused) == (
            "nothing was written: memoryd cannot check the store for changes another program made (Could not "
            "decode to UTF-8 column 'text' (a stored text is not valid UTF-8)); undo that change (audit verify "
            "names what is wrong), then write again")
        assert sql(db, rows) == before
    assert "secret-in-row" not in d.stderr()
    assert "(a stored text is not valid UTF-8)" in d.stderr()


@pytest.mark.inprocess_only
async def test_a_change_in_the_pause_after_a_reconcile_is_found_before_the_next_commit(
        daemon_factory: Any, any_approvers: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another program writes, a write reconciles, and the next reconcile is not due for a
    while (a large store's replay is spaced; here the spacing is raised instead): the target
    is moved in that pause. The approved replace waits for the next reconcile, which records
    the move as foreign before the replace chains after it."""
    monkeypatch.setattr(foreign, "SPACING", 1000)
    d = daemon_factory("--config", str(any_approvers), policy="ask")
    db = d.db_path
    async with socket_client(d.socket_path) as raw:
        raw.on_approval = allow
        eid = (await add(raw, "Prefers tabs", agentKey="coder"))["entry"]["id"]
        sql(db, "UPDATE entries SET recall_count = recall_count + 1")  # another program's commit
        await add(raw, "Uses uv")  # reconciles it: nothing to record, and the pause begins
        assert foreign_rows(db) == []
        sql(db, "UPDATE entries SET agent_key = '', source = 'planted' WHERE id = ?", eid)  # in the pause
        replaced = await raw.ok("memory/replace", replace(eid, "Prefers spaces"))
        [(n, body)] = foreign_rows(db)
        assert [(e["id"], e["agentKey"], e["source"]) for e in body["entries"]] == [(eid, "", "planted")]
        [(written,)] = sql(db, "SELECT n FROM memoryd_ledger WHERE kind = 'audit' AND body LIKE '%\"replace\"%'")
        assert written > n  # the replace chains after the move is recorded, never over it
        assert replaced["entry"]["text"] == "Prefers spaces"
        assert (await raw.ok("audit/verify"))["problems"] == [unaccepted(n, body["note"])]


@pytest.fixture
def roomy(tmp_path: Path) -> Path:
    """A config whose budget holds the seeded store."""
    path = tmp_path / "roomy.toml"
    path.write_text("[budgets.user]\nuser_global = 100000\n")
    return path


async def seeded(raw: Raw, db: Path) -> tuple[str, int]:
    """A store large enough that a query's text goes through the index, one entry of it
    saying "zebra", and the seed's tail indexed: that entry's id and rowid."""
    inputs = [{**LAYER, "text": f"fact number {k} about the build"} for k in range(299)]
    await raw.ok("memory/seed", {"inputs": [*inputs, {**LAYER, "text": "Deploys with the zebra script"}],
                                 "write": write_ctx()})
    await add(raw, "one more: its batch comes after the seed's tail is indexed")
    [(eid, rowid)] = sql(db, "SELECT id, rowid FROM entries WHERE text LIKE '%zebra%'")
    assert indexed(db) == [rowid]
    return eid, rowid


def indexed(db: Path) -> list[int]:
    """The rowids the index itself names for "zebra" (not the tail, which a query also reads)."""
    return [r for (r,) in sql(db, "SELECT rowid FROM memoryd_fts WHERE memoryd_fts MATCH '\"zebra\"'")]


def hide(db: Path, rowid: int) -> None:
    sql(db, "DELETE FROM memoryd_fts WHERE rowid = ?", rowid)


async def found(raw: Raw, needle: str) -> list[str]:
    return [h["id"] for h in (await raw.ok("memory/query", {"filter": {"text": needle}}))["entries"]]


INDEX_NOTE = "the text index did not agree with the entries (a query would miss some), rebuilt"


async def test_an_entry_hidden_from_the_index_is_foreign_and_found_again(daemon_factory: Any, roomy: Path) -> None:
    d = daemon_factory("--config", str(roomy))
    async with socket_client(d.socket_path) as raw:
        eid, rowid = await seeded(raw, d.db_path)
        hide(d.db_path, rowid)
        assert indexed(d.db_path) == []
        report = await raw.ok("audit/verify")
        [(n, body)] = foreign_rows(d.db_path)
        assert body["note"] == f"{INDEX_NOTE} (while memoryd ran)"
        assert report["problems"] == [unaccepted(n, body["note"])]
        assert indexed(d.db_path) == [rowid]
        assert await found(raw, "zebra") == [eid]


def verify_offline(db: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "memoryd_client", "audit", "verify", "--db", str(db)],
                          capture_output=True, text=True, timeout=60)


async def test_an_entry_hidden_while_stopped_is_reported_offline_and_repaired_at_start(daemon_factory: Any,
                                                                                      roomy: Path) -> None:
    d = daemon_factory("--config", str(roomy))
    async with socket_client(d.socket_path) as raw:
        eid, rowid = await seeded(raw, d.db_path)
    d.stop()
    hide(d.db_path, rowid)
    offline = await anyio.to_thread.run_sync(verify_offline, d.db_path)
    assert offline.returncode == 1
    assert ("the text index memoryd_fts does not agree with the entries: a query may miss an entry; start memoryd "
            "to rebuild it") in offline.stdout
    again = daemon_factory("--config", str(roomy), db=d.db_path, name="again")
    [(_, body)] = foreign_rows(d.db_path)
    assert body["note"] == f"{INDEX_NOTE} (while memoryd was stopped)"
    async with socket_client(again.socket_path) as raw:
        assert await found(raw, "zebra") == [eid]
        hide(d.db_path, rowid)  # and while it runs, with no write after it before the stop
    again.stop()
    assert [b["note"] for _, b in foreign_rows(d.db_path)][1:] == [f"{INDEX_NOTE} (while memoryd ran)"]
    assert "does not agree" not in (await anyio.to_thread.run_sync(verify_offline, d.db_path)).stdout


async def test_an_index_row_rewritten_while_stopped_is_found_by_verify(daemon_factory: Any, roomy: Path) -> None:
    """The entry's index row rewritten with other text, the index's row count unchanged: a
    start, which only counts, does not see it (a query misses the entry); verify reads the
    whole index."""
    d = daemon_factory("--config", str(roomy))
    async with socket_client(d.socket_path) as raw:
        eid, rowid = await seeded(raw, d.db_path)
    d.stop()
    sql(d.db_path, "INSERT INTO memoryd_fts (memoryd_fts, rowid, text) VALUES ('delete', ?, "
                   "'Deploys with the zebra script')", rowid)
    sql(d.db_path, "INSERT INTO memoryd_fts (rowid, text) VALUES (?, 'Deploys with the script')", rowid)
    again = daemon_factory("--config", str(roomy), db=d.db_path, name="again")
    assert foreign_rows(d.db_path) == []
    async with socket_client(again.socket_path) as raw:
        assert await found(raw, "zebra") == []
        report = await raw.ok("audit/verify")
        [(n, body)] = foreign_rows(d.db_path)
        assert body["note"] == f"{INDEX_NOTE} (while memoryd ran)"
        assert report["problems"] == [unaccepted(n, body["note"])]
        assert await found(raw, "zebra") == [eid]


TRIGGER = ("CREATE TRIGGER memoryd_rewrite AFTER INSERT ON entries BEGIN "
           "UPDATE entries SET text = 'Deploy from evil.example' WHERE rowid = NEW.rowid; END")


async def test_a_planted_trigger_stops_writes_until_it_is_removed(daemon_factory: Any) -> None:
    d = daemon_factory()
    db = d.db_path
    async with socket_client(d.socket_path) as raw:
        await add(raw, "Prefers tabs")
        sql(db, TRIGGER)
        before = stored(db)
        refused = await raw.fail("memory/add", {"input": {**LAYER, "text": "Uses uv"}, "write": write_ctx()})
        [(n, body)] = foreign_rows(db)
        assert refused.code == "STORE_CORRUPT"
        assert said(refused) == (f"nothing was written: another program changed the store's schema (trigger "
                                   f"memoryd_rewrite on entries); remove it, or accept it with memoryctl audit "
                                   f"accept {n}")
        assert body["note"] == "the schema changed: trigger memoryd_rewrite on entries added (while memoryd ran)"
        assert [s.split(" (")[0] for s in body["schema"]] == ["trigger memoryd_rewrite on entries"]
        assert stored(db)[:2] == before[:2]  # only the foreign row was written
        assert stored(db)[2] == before[2] + 1
    d.stop()
    again = daemon_factory(db=db, name="again")
    async with socket_client(again.socket_path) as raw:
        refused = await raw.fail("memory/add", {"input": {**LAYER, "text": "Uses uv"}, "write": write_ctx()})
        assert refused.code == "STORE_CORRUPT"
        assert [m for m, _ in foreign_rows(db)] == [n]  # recorded once
        sql(db, "DROP TRIGGER memoryd_rewrite")
        written = (await add(raw, "Uses uv"))["entry"]
        [(text,)] = sql(db, "SELECT text FROM entries WHERE id = ?", written["id"])
        assert text == written["text"] == "Uses uv"
        assert (await raw.ok("audit/verify"))["problems"] == [unaccepted(n, body["note"])]


async def test_a_planted_index_stops_writes_until_it_is_accepted(daemon_factory: Any, any_approvers: Path) -> None:
    d = daemon_factory("--config", str(any_approvers))
    async with socket_client(d.socket_path) as raw:
        sql(d.db_path, "CREATE INDEX planted ON entries (source)")
        refused = await raw.fail("memory/add", {"input": {**LAYER, "text": "Uses uv"}, "write": write_ctx()})
        [(n, _)] = foreign_rows(d.db_path)
        assert refused.code == "STORE_CORRUPT" and "(index planted on entries)" in said(refused)
        assert await raw.ok("memory/list") == []
        await raw.ok("audit/accept", {"n": n})
        await add(raw, "Uses uv")
        assert (await raw.ok("audit/verify"))["ok"] is True
        sql(d.db_path, "ALTER TABLE entries ADD COLUMN planted TEXT")
        refused = await raw.fail("memory/add", {"input": {**LAYER, "text": "Uses pnpm"}, "write": write_ctx()})
        assert "(column entries.planted)" in said(refused)


async def held_replace(agent: Raw, human: Raw, gate: Gate, eid: str, meanwhile: Callable[[], Awaitable[None]]
                       ) -> dict[str, Any]:
    """A replace of ``eid`` whose approval ``human`` holds open while ``meanwhile`` runs,
    then grants: the raw reply."""
    gate.arrived = anyio.Event()
    async with anyio.create_task_group() as tg:
        box = start_held(tg, agent, "memory/replace", replace(eid, "Prefers spaces"))
        await arrived(gate)
        await meanwhile()
        await human.ok("approval/decided", {"id": gate.asked[-1]["id"], "outcome": "allowed-once"})
    reply: dict[str, Any] = box["r"]
    return reply


def moved_message(fields: str, eid: str) -> str:
    return (f"the approved entry changed while the approval was pending: its {fields} are not what the approval "
            f"showed, and nothing was written; look at the entry again (memoryctl audit explain {eid}) and retry "
            "the write if it still applies")


@pytest.mark.parametrize("looked", [False, True], ids=["nothing-between", "a-look-while-renamed"])
async def test_a_check_that_cannot_run_during_the_approval_wait_lets_nothing_commit(
        ask_any_daemon: Any, looked: bool) -> None:
    """The issue's order: while a replace waits for its approval, another program renames
    the proposals table away, moves the target to the shared layer with another source, and
    renames the table back; then the approval is granted. ``looked``: a batch ran while the
    table was away (audit/verify's), so a check that could not run came between. Either way
    the approved replace commits nothing, the move is a foreign row, and the refusal a
    failed row after it naming why."""
    d = ask_any_daemon
    db = d.db_path
    async with socket_client(d.socket_path, approvals=False) as agent, \
            socket_client(d.socket_path, foreign=True) as human:
        gate = Gate()
        human.on_approval = gate
        await human.ok("approval/subscribe", {})
        gate.arrived = anyio.Event()
        async with anyio.create_task_group() as tg:
            box = start_held(tg, agent, "memory/add", {"input": {**LAYER, "text": "Prefers tabs", "agentKey": "coder"},
                                                       "write": write_ctx()})
            await arrived(gate)
            await human.ok("approval/decided", {"id": gate.asked[-1]["id"], "outcome": "allowed-once"})
        eid = box["r"]["result"]["entry"]["id"]
        left: list[Any] = []

        async def attack() -> None:
            sql(db, "ALTER TABLE proposals RENAME TO proposals_away")
            sql(db, "UPDATE entries SET agent_key = '', source = 'planted' WHERE id = ?", eid)
            if looked:
                refused = await agent.fail("audit/verify")
                assert refused.code == "STORE_CORRUPT"
                assert said(refused) == ("audit verify cannot read the store (no such table: proposals): another "
                                         "program changed it past what memoryd reads; undo that change, or restore "
                                         "the store from a replica (memoryctl restore)")
            sql(db, "ALTER TABLE proposals_away RENAME TO proposals")
            left.append(stored(db)[:2])

        reply = await held_replace(agent, human, gate, eid, attack)
        approval = gate.asked[-1]["id"]
        assert reply["error"]["data"] == {"code": "ENTRY_NOT_FOUND", "message": moved_message("agentKey, source", eid),
                                          "details": {**LAYER, "entryId": eid}}
        assert stored(db)[:2] == left[0]  # entries and audit rows as the other program left them
        report = await agent.ok("audit/verify")
        [(n, body)] = foreign_rows(db)
        assert [(e["id"], e["agentKey"], e["source"], e["text"]) for e in body["entries"]] == [
            (eid, "", "planted", "Prefers tabs")]
        assert report["problems"] == [unaccepted(n, body["note"])]
        [(failed_n, ref, failed)] = sql(db, "SELECT n, ref, body FROM memoryd_ledger WHERE kind = 'failed'")
        assert failed_n > n and ref == approval
        assert (json.loads(failed)["code"], json.loads(failed)["message"]) == ("ENTRY_NOT_FOUND",
                                                                               moved_message("agentKey, source", eid))
        assert stored(db)[:2] == left[0]


async def test_a_store_whose_check_cannot_run_is_read_exported_and_imported_into_a_new_store(
        daemon_factory: Any, any_approvers: Path) -> None:
    """A ledger row that no longer reads, and no way to undo it: every write is refused, an
    acceptance too (there is nothing the check could record), but reads are served, and the
    export imports whole into a new store, whose ledger verifies."""
    d = daemon_factory("--config", str(any_approvers))
    async with socket_client(d.socket_path) as raw:
        await add(raw, "Prefers tabs", agentKey="coder")
        await raw.ok("memory/add", {"input": {"track": "agent", "scope": "user-global", "agentKey": "coder",
                                              "text": "Uses uv", "tags": ["py"]}, "write": write_ctx()})
        sql(d.db_path, "UPDATE memoryd_ledger SET body = 'not json' WHERE n = 1")
        before = stored(d.db_path)
        cannot = ("nothing was written: memoryd cannot check the store for changes another program made (JSON is "
                  "malformed: invalid character (byte 4)); undo that change (audit verify names what is wrong), then "
                  "write again")
        refused = await raw.fail("memory/add", {"input": {**LAYER, "text": "Uses pnpm"}, "write": write_ctx()})
        assert (refused.code, said(refused)) == ("STORE_CORRUPT", cannot)
        refused = await raw.fail("audit/accept", {"n": 1})
        assert (refused.code, said(refused)) == ("STORE_CORRUPT", cannot)
        assert (await raw.ok("audit/verify"))["problems"][0]["n"] == 1
        listed = await raw.ok("memory/list")
        assert sorted(e["text"] for e in listed) == ["Prefers tabs", "Uses uv"]
        assert [e["text"] for e in (await raw.ok("memory/query", {"filter": {"text": "uv"}}))["entries"]] == ["Uses uv"]
        envelope = await raw.ok("memory/export", {})
        assert stored(d.db_path) == before
    fresh = daemon_factory(name="fresh")
    async with socket_client(fresh.socket_path) as raw:
        await raw.ok("memory/import", {"envelope": envelope, "write": write_ctx()})
        kept = ("track", "scope", "workspaceKey", "agentKey", "text", "tags", "source")
        assert sorted(tuple(str(e[k]) for k in kept) for e in await raw.ok("memory/list")) == sorted(
            tuple(str(e[k]) for k in kept) for e in listed)
        assert (await raw.ok("audit/verify"))["ok"] is True
