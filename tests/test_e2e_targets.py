"""Harness-facing write details end to end, over raw NDJSON against a real daemon:
replace/remove by ``id`` (wire-v1 §4) and ``memory/import`` with ``skipExisting``."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from e2e_helpers import Gate, add, arrived, entry_input, start_held, state
from rawclient import Raw, socket_client, write_ctx

pytestmark = [pytest.mark.anyio, pytest.mark.inprocess]

UG = {"track": "user", "scope": "user-global"}


async def allow(params: dict[str, Any]) -> str:
    return "allowed-once"


# --- replace / remove by id ----------------------------------------------------------------


async def test_remove_one_of_two_identical_entries_by_id(daemon: Any) -> None:
    async with socket_client(daemon.socket_path) as raw:
        first = (await add(raw, "Prefers tabs"))["entry"]
        second = (await add(raw, "Prefers tabs"))["entry"]  # duplicate text is legal
        before = await state(raw)
        err = await raw.fail("memory/remove", {"input": {**UG, "match": "Prefers tabs"}, "write": write_ctx()})
        assert err.code == "AMBIGUOUS_MATCH" and err.details["candidates"] == 2
        assert await state(raw) == before

        res = await raw.ok("memory/remove", {"input": {**UG, "id": second["id"]}, "write": write_ctx()})
        assert res["entry"] == second
        assert res["usage"]["used"] == len("Prefers tabs")
        assert (await raw.notification("memory/removed"))["params"]["entry"] == second
        assert await raw.ok("memory/list", {}) == [first]
        row = (await raw.ok("audit/list", {"limit": 1}))[0]
        assert (row["action"], row["entryId"], row["text"]) == ("remove", second["id"], "Prefers tabs")


async def test_replace_by_id(daemon: Any) -> None:
    async with socket_client(daemon.socket_path) as raw:
        first = (await add(raw, "Prefers tabs", tags=["style"]))["entry"]
        second = (await add(raw, "Prefers tabs"))["entry"]
        res = await raw.ok("memory/replace", {"input": {**UG, "id": first["id"], "text": "Prefers spaces"},
                                              "write": write_ctx()})
        assert res["previous"] == first
        assert (res["entry"]["id"], res["entry"]["text"], res["entry"]["version"], res["entry"]["tags"]) == (
            first["id"], "Prefers spaces", 2, ["style"])
        assert [e["text"] for e in await raw.ok("memory/list", {})] == ["Prefers spaces", "Prefers tabs"]
        assert (await raw.ok("memory/list", {}))[1] == second
        row = (await raw.ok("audit/list", {"limit": 1}))[0]
        assert (row["action"], row["entryId"], row["text"]) == ("replace", first["id"], "Prefers spaces")


@pytest.mark.parametrize("method", ["memory/replace", "memory/remove"])
async def test_match_and_id_exactly_one(daemon: Any, method: str) -> None:
    async with socket_client(daemon.socket_path) as raw:
        e = (await add(raw, "Prefers tabs"))["entry"]
        extra = {"text": "x"} if method == "memory/replace" else {}
        before = await state(raw)
        for selector, field in [({"match": "tabs", "id": e["id"]}, "id"), ({}, "match"), ({"id": ""}, "id"),
                                ({"id": "  "}, "id"), ({"match": ""}, "match")]:
            err = await raw.fail(method, {"input": {**UG, **selector, **extra}, "write": write_ctx()})
            assert (err.code, err.error["code"], err.details) == ("INVALID_INPUT", -32602, {"field": field}), selector
        err = await raw.fail(method, {"input": {**UG, "id": None, **extra}, "write": write_ctx()})
        assert err.code == "INVALID_INPUT" and err.details == {"field": "input.id"}
        assert await state(raw) == before


@pytest.mark.parametrize("method", ["memory/replace", "memory/remove"])
async def test_id_must_name_a_visible_entry_of_that_layer(daemon: Any, method: str) -> None:
    async with socket_client(daemon.socket_path) as raw:
        mine = (await add(raw, "Prefers tabs"))["entry"]
        other_agent = (await raw.ok("memory/add", {"input": entry_input("Reviews in Vim"),
                                                   "write": write_ctx("s-r", agent="reviewer")}))["entry"]
        other_ws = (await raw.ok("memory/add", {"input": entry_input("uses pnpm", "user", "workspace"),
                                                "write": write_ctx("s-w", cwd="/home/u/other")}))["entry"]
        shared = (await add(raw, "Shared fact", agentKey=""))["entry"]
        extra = {"text": "changed"} if method == "memory/replace" else {}
        before = await state(raw)
        cases = [
            ("user", "user-global", other_agent["id"]),  # another agent's private entry
            ("user", "workspace", other_ws["id"]),  # another workspace's entry
            ("agent", "user-global", mine["id"]),  # exists, but in another track
            ("user", "workspace", mine["id"]),  # exists, but in another scope
            ("user", "user-global", "00000000-0000-4000-8000-000000000000"),  # no such entry
            ("user", "user-global", "not-an-id"),
        ]
        for track, scope, entry_id in cases:
            err = await raw.fail(method, {"input": {"track": track, "scope": scope, "id": entry_id, **extra},
                                          "write": write_ctx()})
            assert (err.code, err.error["code"]) == ("ENTRY_NOT_FOUND", -32012)
            assert err.details == {"track": track, "scope": scope, "entryId": entry_id}
        assert await state(raw) == before
        # the shared layer is visible to every agent: its id works from another preset
        res = await raw.ok(method, {"input": {**UG, "id": shared["id"], **extra},
                                    "write": write_ctx("s-r", agent="reviewer")})
        assert res["entry"]["id"] == shared["id"]


async def test_id_remove_asks_with_the_full_text_and_rechecks_by_id(ask_daemon: Any) -> None:
    async with socket_client(ask_daemon.socket_path) as a, socket_client(ask_daemon.socket_path) as b:
        b.on_approval = allow
        await add(b, "Prefers tabs", session="s-2")
        twin = (await add(b, "Prefers tabs", session="s-2"))["entry"]
        gate = Gate()
        a.on_approval = gate
        box: dict[str, Any] = {}
        async with anyio.create_task_group() as tg:

            async def remove() -> None:
                box["r"] = await a.call("memory/remove", {"input": {**UG, "id": twin["id"]}, "write": write_ctx()})

            tg.start_soon(remove)
            with anyio.fail_after(10):
                await gate.arrived.wait()
            asked = gate.asked[0]
            assert (asked["action"], asked["text"]) == ("remove", "Prefers tabs")
            # the approved entry changes meanwhile: the writer's re-check by id refuses
            await b.ok("memory/replace", {"input": {**UG, "id": twin["id"], "text": "Prefers tabs, always"},
                                          "write": write_ctx("s-2")})
            before = await state(b)
            await a.ok("approval/decided", {"id": asked["id"], "outcome": "allowed-once"})
        error = box["r"]["error"]["data"]
        assert error["code"] == "ENTRY_NOT_FOUND"
        assert error["details"] == {"track": "user", "scope": "user-global", "entryId": twin["id"]}
        assert await state(b) == before


# --- consolidate by ids, and where the merged entry lands (agentKey) ---------------------------


async def test_consolidate_by_id_with_agent_key_empty_lands_shared(ask_daemon: Any) -> None:
    """A private session moves one of two same-text entries to the shared layer: named by
    id (exact where a match is ambiguous), the approval saying where it lands."""
    async with socket_client(ask_daemon.socket_path) as raw:
        raw.on_approval = allow
        first = (await add(raw, "Prefers tabs", tags=["style"]))["entry"]
        twin = (await add(raw, "Prefers tabs", tags=["style"]))["entry"]
        assert first["agentKey"] == twin["agentKey"] == "coder"
        budgets = await raw.ok("memory/budgets", {})
        gate = Gate()
        raw.on_approval = gate
        move = {"input": {**UG, "ids": [twin["id"]], "text": twin["text"], "tags": twin["tags"], "agentKey": ""},
                "write": write_ctx()}
        async with anyio.create_task_group() as tg:
            box = start_held(tg, raw, "memory/consolidate", move)
            await arrived(gate)
            asked = gate.asked[0]
            assert (asked["action"], asked["agentKey"], asked["workspaceKey"], asked["tags"]) == (
                "consolidate", "", "", ["style"])
            assert asked["text"] == f"remove: id {twin['id']}\nPrefers tabs\nnew text: Prefers tabs"
            await raw.ok("approval/decided", {"id": asked["id"], "outcome": "allowed-once"})
        res = box["r"]["result"]
        assert res["removed"] == [twin]
        moved = res["entry"]
        assert (moved["agentKey"], moved["text"], moved["tags"], moved["source"]) == ("", "Prefers tabs", ["style"],
                                                                                       "dsh-memento")
        assert moved["id"] != twin["id"]
        assert await raw.ok("memory/list", {}) == [first, moved]
        assert await raw.ok("memory/budgets", {}) == budgets  # same text, same cell: nothing used or freed
        rows = (await raw.ok("audit/list", {"limit": 2}))[::-1]
        assert [(r["action"], r["entryId"], r["text"]) for r in rows] == [
            ("consolidate-remove", twin["id"], "Prefers tabs"), ("consolidate-add", moved["id"], "Prefers tabs")]
        # another agent's session sees the moved entry, and not the one left private
        seen = await raw.ok("memory/query", {"filter": {"text": "tabs"}, "opts": {"agentKey": "reviewer"}})
        assert [e["id"] for e in seen["entries"]] == [moved["id"]]
        assert (await raw.ok("audit/verify", {}))["ok"] is True


async def test_consolidate_without_agent_key_keeps_private_text_private(daemon: Any) -> None:
    async with socket_client(daemon.socket_path) as raw:
        mine = (await add(raw, "Prefers tabs"))["entry"]
        res = await raw.ok("memory/consolidate", {"input": {**UG, "ids": [mine["id"]], "text": "Prefers tabs!"},
                                                  "write": write_ctx()})
        assert res["entry"]["agentKey"] == "coder"


async def test_consolidate_agent_key_is_checked_as_adds(daemon: Any) -> None:
    async with socket_client(daemon.socket_path) as raw:
        mine = (await add(raw, "Prefers tabs"))["entry"]
        before = await state(raw)
        add_err = await raw.fail("memory/add", {"input": entry_input("x", agentKey="reviewer"), "write": write_ctx()})
        err = await raw.fail("memory/consolidate", {
            "input": {**UG, "ids": [mine["id"]], "text": "Prefers tabs", "agentKey": "reviewer"}, "write": write_ctx()})
        assert (err.code, err.error["message"], err.details) == (add_err.code, add_err.error["message"],
                                                                {"field": "agentKey"})
        assert err.error["message"] == "agentKey is outside the session's visible set"
        assert await state(raw) == before
        # the session's own agentKey is in its visible set: a shared entry may be made private
        shared = (await add(raw, "Shared fact", agentKey=""))["entry"]
        res = await raw.ok("memory/consolidate", {
            "input": {**UG, "matches": ["Shared"], "text": "Shared fact", "agentKey": "coder"}, "write": write_ctx()})
        assert (res["removed"][0]["id"], res["entry"]["agentKey"]) == (shared["id"], "coder")


async def test_consolidate_takes_matches_or_ids(daemon: Any) -> None:
    async with socket_client(daemon.socket_path) as raw:
        e = (await add(raw, "Prefers tabs"))["entry"]
        other = (await raw.ok("memory/add", {"input": entry_input("Reviews in Vim"),
                                             "write": write_ctx("s-r", agent="reviewer")}))["entry"]
        before = await state(raw)
        for targets, field in [({"matches": ["tabs"], "ids": [e["id"]]}, "ids"), ({}, "matches"),
                               ({"ids": [""]}, "ids[0]"), ({"ids": [e["id"], "  "]}, "ids[1]"),
                               ({"ids": [e["id"], e["id"]]}, "ids"), ({"matches": ["tabs", "Prefers"]}, "matches")]:
            err = await raw.fail("memory/consolidate", {"input": {**UG, **targets, "text": "x"}, "write": write_ctx()})
            assert (err.code, err.details) == ("INVALID_INPUT", {"field": field}), targets
        err = await raw.fail("memory/consolidate", {"input": {**UG, "ids": [], "text": "x"}, "write": write_ctx()})
        assert err.code == "INVALID_INPUT"
        for entry_id in (other["id"], "00000000-0000-4000-8000-000000000000"):  # another agent's; none
            err = await raw.fail("memory/consolidate", {"input": {**UG, "ids": [entry_id], "text": "x"},
                                                        "write": write_ctx()})
            assert (err.code, err.details) == ("ENTRY_NOT_FOUND", {**UG, "entryId": entry_id})
        assert await state(raw) == before


# --- import with skipExisting --------------------------------------------------------------


async def export_of(raw: Raw) -> dict[str, Any]:
    env: dict[str, Any] = await raw.ok("memory/export", {})
    return env


async def test_reimport_with_skip_existing_is_a_no_op(ask_daemon: Any) -> None:
    async with socket_client(ask_daemon.socket_path) as raw:
        raw.on_approval = allow
        await add(raw, "Prefers tabs", tags=["style"])
        await add(raw, "Prefers tabs")  # a duplicate in the backup
        await add(raw, "uses pnpm", "agent", "workspace")
        env = await export_of(raw)
        gate = Gate()
        raw.on_approval = gate
        before = await state(raw)
        asked_before = len(raw.notifications)
        res = await raw.ok("memory/import", {"envelope": env, "write": write_ctx("imp"), "skipExisting": True})
        assert res == {"added": 0, "entries": [], "skipped": 3}
        assert await state(raw) == before  # nothing written, no audit row
        assert gate.asked == [] and raw.notifications[asked_before:] == []  # no approval, no event


async def test_skip_existing_adds_only_what_is_missing(ask_daemon: Any) -> None:
    async with socket_client(ask_daemon.socket_path) as raw:
        raw.on_approval = allow
        await add(raw, "Prefers tabs")
        await add(raw, "uses pnpm", "agent", "workspace")
        env = await export_of(raw)
        coder = env["entries"][0]
        env["entries"] += [
            {**coder, "text": "Prefers dark mode"},  # new text
            {**coder, "agentKey": "reviewer"},  # same text, another agent: not the same entry
            {**coder, "track": "agent"},  # same text, another track
            {**env["entries"][1], "workspaceKey": "/home/u/other"},  # same text, another workspace
        ]
        asks: list[dict[str, Any]] = []

        async def record(params: dict[str, Any]) -> str:
            asks.append(params)
            return "allowed-once"

        raw.on_approval = record
        res = await raw.ok("memory/import", {"envelope": env, "write": write_ctx("imp"), "skipExisting": True})
        assert res["skipped"] == 2 and res["added"] == 4
        assert [(e["track"], e["agentKey"], e["workspaceKey"], e["text"]) for e in res["entries"]] == [
            ("user", "coder", "", "Prefers dark mode"), ("user", "reviewer", "", "Prefers tabs"),
            ("agent", "coder", "", "Prefers tabs"), ("agent", "coder", "/home/u/other", "uses pnpm")]
        (asked,) = asks
        assert asked["count"] == 4  # the approval shows only the entries to be added
        assert asked["text"] == ("user/user-global: Prefers dark mode\nuser/user-global: Prefers tabs\n"
                                 "agent/user-global: Prefers tabs\nagent/workspace: uses pnpm")
        seed_row = (await raw.ok("audit/list", {"limit": 5}))[4]
        assert (seed_row["action"], seed_row["text"]) == ("seed", asked["text"])


async def test_skip_existing_is_checked_against_the_store_not_the_batch(daemon: Any) -> None:
    async with socket_client(daemon.socket_path) as raw:
        batch = [entry_input("twice"), entry_input("twice")]
        env = {"plugin": "dsh-memento", "schema": "memory-export-v1", "entries": batch}
        res = await raw.ok("memory/import", {"envelope": env, "write": write_ctx(), "skipExisting": True})
        assert (res["added"], res["skipped"]) == (2, 0)  # a faithful restore of a store with duplicates
        res = await raw.ok("memory/import", {"envelope": env, "write": write_ctx(), "skipExisting": True})
        assert (res["added"], res["skipped"]) == (0, 2)


async def test_skipped_field_only_with_skip_existing(daemon: Any) -> None:
    async with socket_client(daemon.socket_path) as raw:
        await add(raw, "Prefers tabs")
        env = await export_of(raw)
        res = await raw.ok("memory/import", {"envelope": env, "write": write_ctx()})
        assert res["added"] == 1 and "skipped" not in res  # the plain restore duplicates
        res = await raw.ok("memory/import", {"envelope": env, "write": write_ctx(), "skipExisting": False})
        assert res["added"] == 1 and res["skipped"] == 0
        assert [e["text"] for e in await raw.ok("memory/list", {})] == ["Prefers tabs"] * 3


async def test_skip_existing_budget_counts_only_added_entries(daemon_factory: Any, tmp_path: Any) -> None:
    cfg = tmp_path / "small.toml"
    cfg.write_text("[budgets.user]\nuser_global = 20\n")
    d = daemon_factory("--config", str(cfg))
    async with socket_client(d.socket_path) as raw:
        await add(raw, "twelve chars")
        env = await export_of(raw)
        before = await state(raw)
        err = await raw.fail("memory/import", {"envelope": env, "write": write_ctx()})
        assert err.code == "BUDGET_EXCEEDED"
        assert await state(raw) == before
        res = await raw.ok("memory/import", {"envelope": env, "write": write_ctx(), "skipExisting": True})
        assert (res["added"], res["skipped"]) == (0, 1)
        assert await state(raw) == before


async def test_skip_existing_still_validates_every_entry(daemon: Any) -> None:
    async with socket_client(daemon.socket_path) as raw:
        await add(raw, "Prefers tabs")
        env = await export_of(raw)
        before = await state(raw)
        bad = {**env, "entries": [*env["entries"], entry_input("   ")]}
        err = await raw.fail("memory/import", {"envelope": bad, "write": write_ctx(), "skipExisting": True})
        assert err.code == "INVALID_INPUT" and err.details == {"field": "inputs[1].text"}
        err = await raw.fail("memory/import", {"envelope": env, "write": write_ctx(), "skipExisting": "yes"})
        assert err.code == "INVALID_INPUT" and err.details == {"field": "skipExisting"}
        err = await raw.fail("memory/import", {"envelope": env, "skipExisting": True})
        assert err.code == "WRITE_REQUIRES_AGENT"
        assert await state(raw) == before


async def test_adapter_reimport_with_skip_existing(daemon: Any) -> None:
    async with socket_client(daemon.socket_path) as raw:
        claude_md = "## Project\n\nUse pnpm, never npm.\n\n## Style\n- tabs for indentation\n"
        params = {"adapter": "claude-code-memory-md", "payload": claude_md, "write": write_ctx(),
                  "skipExisting": True}
        res = await raw.ok("memory/import", params)
        assert (res["added"], res["skipped"]) == (2, 0)
        before = await state(raw)
        res = await raw.ok("memory/import", params)
        assert res == {"added": 0, "entries": [], "skipped": 2}
        assert await state(raw) == before
        edited = claude_md + "- no semicolons\n"
        res = await raw.ok("memory/import", {**params, "payload": edited})
        assert (res["added"], res["skipped"]) == (1, 2)
        assert res["entries"][0]["text"] == "no semicolons"
