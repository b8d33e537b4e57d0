"""Another program commits right after a start's check of the store, before the writer
takes its measure of it (the data_version it compares each batch with, the ledger's head),
against a real daemon (in process, so that the commit lands in that moment every time).
The change must be found by the first batch and recorded as foreign, not taken for the
store as the check left it."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest
from e2e_helpers import add, sql
from memoryd import foreign, ledger
from rawclient import socket_client, write_ctx

pytestmark = [pytest.mark.anyio, pytest.mark.inprocess]


def foreign_entries(db: Path) -> list[list[tuple[str, str, str]]]:
    return [[(e["id"], e["agentKey"], e["source"]) for e in json.loads(body)["entries"]]
            for (body,) in sql(db, "SELECT body FROM memoryd_ledger WHERE kind = 'foreign' ORDER BY n")]


@pytest.mark.inprocess_only
async def test_a_commit_right_after_the_start_check_is_found_by_the_first_batch(
        daemon_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    d = daemon_factory()
    db = d.db_path
    async with socket_client(d.socket_path) as raw:
        eid = (await add(raw, "Prefers tabs", agentKey="coder"))["entry"]["id"]
    d.stop()

    move = "UPDATE entries SET agent_key = '', source = 'planted' WHERE id = ?"
    checked = threading.Event()
    fired: list[threading.Thread | None] = []
    open_chain, head = foreign.open_chain, ledger.head

    def chaining(conn: sqlite3.Connection, *args: Any, **kwargs: Any) -> bool:
        try:
            return open_chain(conn, *args, **kwargs)
        finally:
            checked.set()

    def commit(timeout: float) -> None:
        with contextlib.closing(sqlite3.connect(db, timeout=timeout)) as other, other:
            other.execute(move, (eid,))

    def heading(conn: sqlite3.Connection) -> tuple[int, str] | None:
        if checked.is_set() and not fired:
            if not conn.in_transaction:
                commit(0)  # the moment after the check: another program's commit lands here
                fired.append(None)
            else:
                # the writer still holds the store: the commit lands as soon as it lets go
                fired.append(threading.Thread(target=commit, args=(60,)))
                fired[0].start()  # type: ignore[union-attr]
        return head(conn)

    monkeypatch.setattr(foreign, "open_chain", chaining)
    monkeypatch.setattr(ledger, "head", heading)
    again = daemon_factory(db=db, name="again")
    monkeypatch.setattr(ledger, "head", head)
    for t in fired:
        if t is not None:
            await anyio.to_thread.run_sync(t.join)
    assert sql(db, "SELECT agent_key, source FROM entries WHERE id = ?", eid) == [("", "planted")]
    async with socket_client(again.socket_path) as raw:
        await add(raw, "Uses uv")
        assert foreign_entries(db) == [[(eid, "", "planted")]]


async def allow(params: dict[str, Any]) -> str:
    return "allowed-once"


async def test_an_entry_moved_while_memoryd_was_stopped_is_recorded_before_a_write_over_it(
        daemon_factory: Any, any_approvers: Path) -> None:
    """A raw edit while memoryd is stopped that leaves the counts, the audit rows and the
    text index as they were: moved to the shared layer, with another source. The start
    must compare it, so that an approved replace of the entry never chains over the move
    as if memoryd had made it."""
    d = daemon_factory("--config", str(any_approvers), policy="ask")
    db = d.db_path
    async with socket_client(d.socket_path) as raw:
        raw.on_approval = allow
        eid = (await add(raw, "Prefers tabs", agentKey="coder"))["entry"]["id"]
    d.stop()
    sql(db, "UPDATE entries SET agent_key = '', source = 'planted' WHERE id = ?", eid)
    again = daemon_factory("--config", str(any_approvers), db=db, name="again", policy="ask")
    async with socket_client(again.socket_path) as raw:
        raw.on_approval = allow
        await raw.ok("memory/replace", {"input": {"track": "user", "scope": "user-global", "id": eid,
                                                  "text": "Prefers spaces"}, "write": write_ctx()})
        assert foreign_entries(db) == [[(eid, "", "planted")]]
