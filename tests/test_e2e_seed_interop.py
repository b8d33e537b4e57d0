"""memory/seed, the reference's import-like path, against real daemons.

- A user-global entry that names a workspace (as dsh-memento's own entries do) is taken with
  the key dropped and counted, as memory/import takes it; memory/add, whose keys are the
  caller's own choice, still refuses one, the store unchanged.
- The seed row of a batch whose entries have several sources names those sources, in the
  ledger and in the approval: never a source none of its entries has.
"""

from __future__ import annotations

from typing import Any

import pytest
from e2e_helpers import entry_input, state
from rawclient import socket_client, write_ctx

pytestmark = pytest.mark.anyio

NOTE = ("user-global entries have no workspace: 2 of these named one (dsh-memento writes the session's cwd "
        "there) and are imported without it")


class Recorder:
    def __init__(self, outcome: str = "allowed-once") -> None:
        self.asked: list[dict[str, Any]] = []
        self.outcome = outcome

    async def __call__(self, params: dict[str, Any]) -> str:
        self.asked.append(params)
        return self.outcome


async def test_seed_takes_a_user_global_entry_that_names_a_workspace(ask_daemon: Any) -> None:
    inputs = [entry_input("Prefers tea", workspaceKey="/home/u/proj"),
              entry_input("Uses pnpm", "agent", "user-global", workspaceKey="/srv/repo"),
              entry_input("Run make check", "agent", "workspace", workspaceKey="/home/u/proj")]
    async with socket_client(ask_daemon.socket_path) as raw:
        asked = Recorder()
        raw.on_approval = asked
        res = await raw.ok("memory/seed", {"inputs": inputs, "write": write_ctx()})
        assert (res["added"], res["workspaceKeysDropped"]) == (3, 2)
        assert sorted((e["scope"], e["workspaceKey"], e["text"]) for e in await raw.ok("memory/list", {})) == [
            ("user-global", "", "Prefers tea"), ("user-global", "", "Uses pnpm"),
            ("workspace", "/home/u/proj", "Run make check")]
        (ask,) = asked.asked
        assert ask["workspaceKeysDropped"] == 2 and ask["text"].endswith("\n" + NOTE)
        assert [e["workspaceKey"] for e in ask["entries"]] == ["", "", "/home/u/proj"]
        # nothing to drop: the field stays out
        res = await raw.ok("memory/seed", {"inputs": [entry_input("Prefers coffee", workspaceKey="")],
                                           "write": write_ctx()})
        assert res["added"] == 1 and "workspaceKeysDropped" not in res


async def test_add_still_refuses_a_user_global_entry_that_names_a_workspace(daemon: Any) -> None:
    async with socket_client(daemon.socket_path) as raw:
        before = await state(raw)
        refused = await raw.fail("memory/add", {"input": entry_input("Prefers tea", workspaceKey="/home/u/proj"),
                                                 "write": write_ctx()})
        assert refused.code == "INVALID_INPUT" and refused.details["field"] == "workspaceKey"
        assert await state(raw) == before


def seed_rows(audit: list[dict[str, Any]], action: str) -> list[Any]:
    return [r["source"] for r in audit if r["action"] == action]


@pytest.mark.parametrize(("sources", "recorded"), [
    (["claude", "memoryctl", "claude"], "claude, memoryctl"),
    (["claude", None], "claude, dsh-memento"),
    # a label with the list's own punctuation is quoted: it cannot pass for two sources
    (["a, b", "c"], '"a, b", c'),
    (["mem0", "mem0"], "mem0"),
])
async def test_a_seed_row_names_the_sources_of_its_entries(ask_daemon: Any, sources: list[str | None],
                                                           recorded: str) -> None:
    inputs = [entry_input(f"entry {n}", **({} if s is None else {"source": s})) for n, s in enumerate(sources)]
    async with socket_client(ask_daemon.socket_path) as raw:
        asked = Recorder()
        raw.on_approval = asked
        await raw.ok("memory/seed", {"inputs": inputs, "write": write_ctx()})
        (ask,) = asked.asked
        assert ask["source"] == recorded and f" [source:{recorded}]\n" in ask["reason"]
        audit = await raw.ok("audit/list", {})
        assert seed_rows(audit, "seed") == [recorded]
        assert sorted(seed_rows(audit, "add")) == sorted(s or "dsh-memento" for s in sources)
        report = await raw.ok("audit/verify")
        assert report["ok"] is True and report["problems"] == []


async def test_a_denied_seed_row_names_the_sources_too(ask_daemon: Any) -> None:
    inputs = [entry_input("a", source="claude"), entry_input("b", source="memoryctl")]
    async with socket_client(ask_daemon.socket_path) as raw:
        raw.on_approval = Recorder("rejected")
        before = await raw.ok("memory/list", {})
        refused = await raw.fail("memory/seed", {"inputs": inputs, "write": write_ctx()})
        assert refused.code == "WRITE_DENIED"
        assert await raw.ok("memory/list", {}) == before
        assert seed_rows(await raw.ok("audit/list", {}), "seed-denied") == ["claude, memoryctl"]


async def test_an_import_counts_only_the_dropped_keys_of_what_it_writes(ask_daemon: Any) -> None:
    """Two user-global entries name a workspace and one is already there, so skipExisting
    skips it: the approval lists one entry, and its note, the result and the ledger's seed
    row count one dropped key, not two."""
    envelope = {"plugin": "dsh-memento", "schema": "memory-export-v1", "entries": [
        entry_input("Prefers tea", workspaceKey="/home/u/proj"), entry_input("Uses pnpm", workspaceKey="/home/u/proj")]}
    async with socket_client(ask_daemon.socket_path) as raw:
        asked = Recorder()
        raw.on_approval = asked
        await raw.ok("memory/add", {"input": entry_input("Prefers tea"), "write": write_ctx()})
        res = await raw.ok("memory/import", {"envelope": envelope, "write": write_ctx(), "skipExisting": True})
        assert (res["added"], res["skipped"], res["workspaceKeysDropped"]) == (1, 1, 1)
        ask = asked.asked[-1]
        assert [e["text"] for e in ask["entries"]] == ["Uses pnpm"]
        assert ask["workspaceKeysDropped"] == 1
        assert NOTE.replace("2 of these", "1 of these") in ask["text"]
