"""The core protocol end to end, raw NDJSON lines: the daemon in process (over an in-memory
pair of streams), a real daemon over the socket and over stdio, and a stdio relay."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest
from conftest import PAIRS, PairFactory
from e2e_helpers import add, entry_input, state
from rawclient import Raw, socket_client, write_ctx

pytestmark = pytest.mark.anyio

Connect = Callable[..., AbstractAsyncContextManager[Raw]]
UG = {"track": "user", "scope": "user-global"}


#: pair_factory's transports (memory, socket, stdio) and a stdio relay to a socket daemon:
#: the whole core contract passes through the relay unchanged
PAIR_KINDS = (*PAIRS, "relay")


@pytest.fixture
def connect(pair_factory: PairFactory) -> Connect:
    """``connect(policy=..., config=...)`` → a Raw peer over the parametrized transport."""
    return pair_factory


async def test_initialize(connect: Connect) -> None:
    async with connect() as raw:
        info = await raw.ok("initialize", {})
        assert info["protocol"] == "dsh-memory-protocol/v1"
        assert info["schemaVersion"] == 4
        assert info["writePolicy"] == "auto"
        assert [(b["track"], b["scope"], b["limit"]) for b in info["budgets"]] == [
            ("user", "user-global", 2000), ("user", "workspace", 2000),
            ("agent", "user-global", 4000), ("agent", "workspace", 4000)]


async def test_add_entry_audit_and_event(connect: Connect) -> None:
    async with connect() as raw:
        res = await add(raw, "  Prefers tabs  ", tags=[" a ", "b", "a"], source="claude")
        e = res["entry"]
        assert e["text"] == "Prefers tabs"
        assert e["tags"] == ["a", "b"]
        assert e["version"] == 1 and e["recallCount"] == 0 and e["lastRecalled"] is None
        assert e["agentKey"] == "coder" and e["workspaceKey"] == "" and e["sessionId"] == "s-1"
        assert e["source"] == "claude"
        assert res["usage"] == {"track": "user", "scope": "user-global", "used": 12, "limit": 2000}
        note = await raw.notification("memory/added")
        assert note["params"]["entry"] == e
        audit = await raw.ok("audit/list", {})
        assert audit[0]["action"] == "add" and audit[0]["entryId"] == e["id"]
        assert audit[0]["outcome"] == "allowed-once (via approval, writePolicy auto)"
        assert audit[0]["sessionId"] == "s-1" and audit[0]["text"] == "Prefers tabs"


async def test_budget_counts_utf16_units(connect: Connect) -> None:
    async with connect() as raw:
        res = await add(raw, "a😀中")
        assert res["usage"]["used"] == 4


async def test_budget_exceeded_changes_nothing(connect: Connect) -> None:
    async with connect(config="[budgets.user]\nuser_global = 10\n") as raw:
        await add(raw, "12345678")
        before = await state(raw)
        err = await raw.fail("memory/add", {"input": entry_input("abc"), "write": write_ctx()})
        assert err.code == "BUDGET_EXCEEDED"
        assert err.error["code"] == -32011
        assert err.details == {"track": "user", "scope": "user-global", "used": 8, "limit": 10, "needed": 11}
        assert await state(raw) == before


async def test_budget_needed_is_the_total_the_layer_would_need(daemon_factory: Any, tmp_path: Path) -> None:
    """details.needed = used + this write's size (the reference's checkBudget), for every write
    kind; a write that does not grow usage passes even in a layer left over budget."""
    db = tmp_path / "budget.db"
    cfg = tmp_path / "b20.toml"
    cfg.write_text("[budgets.user]\nuser_global = 20\n")
    d = daemon_factory("--config", str(cfg), db=db, name="b20")
    async with socket_client(d.socket_path) as raw:
        await add(raw, "1234567890")  # 10/20
        before = await state(raw)
        over = {"track": "user", "scope": "user-global", "used": 10, "limit": 20}
        cases = [
            ("memory/add", {"input": entry_input("x" * 11)}, 21),
            ("memory/replace", {"input": {**UG, "match": "12345", "text": "y" * 25}}, 25),  # 10 + (25 - 10)
            ("memory/consolidate", {"input": {**UG, "matches": ["12345"], "text": "z" * 23}}, 23),
            ("memory/seed", {"inputs": [entry_input("a" * 6), entry_input("b" * 6)]}, 22),
            ("memory/import", {"envelope": {"plugin": "dsh-memento", "schema": "memory-export-v1",
                                            "exportedAt": "2026-01-01T00:00:00.000Z", "budgets": [],
                                            "entries": [entry_input("c" * 11)]}}, 21),
        ]
        for method, params, needed in cases:
            err = await raw.fail(method, {**params, "write": write_ctx()})
            assert (err.code, err.details) == ("BUDGET_EXCEEDED", {**over, "needed": needed}), method
            assert err.error["message"] == (
                f"memory budget exceeded: user/user-global has 10/20 characters used, this write would bring it to "
                f"{needed}/20 ({needed - 10} more); make room with memoryctl consolidate or memoryctl remove, or raise "
                f"the budget: user_global = N under [budgets.user] in {cfg}, then restart memoryd"), err.error
        assert await state(raw) == before
    assert d.stop() == 0
    # the same store under a lowered limit: the layer is over budget (10/5)
    cfg.write_text("[budgets.user]\nuser_global = 5\n")
    d = daemon_factory("--config", str(cfg), db=db, name="b5")
    async with socket_client(d.socket_path) as raw:
        before = await state(raw)
        err = await raw.fail("memory/add", {"input": entry_input("q"), "write": write_ctx()})
        assert err.details == {"track": "user", "scope": "user-global", "used": 10, "limit": 5, "needed": 11}
        assert await state(raw) == before
        res = await raw.ok("memory/replace", {"input": {**UG, "match": "12345", "text": "0987654321"},
                                              "write": write_ctx()})
        assert res["usage"]["used"] == 10  # no growth: passes
        res = await raw.ok("memory/replace", {"input": {**UG, "match": "0987", "text": "0987"}, "write": write_ctx()})
        assert res["usage"]["used"] == 4


async def test_workspace_scope_and_visibility(connect: Connect) -> None:
    async with connect() as raw:
        e = (await add(raw, "uses pnpm", "agent", "workspace"))["entry"]
        assert e["workspaceKey"] == "/home/u/proj"
        before = await state(raw)
        for bad in ({"agentKey": "other"}, {"workspaceKey": "/elsewhere"}):
            err = await raw.fail("memory/add", {"input": entry_input("x", "agent", "workspace", **bad),
                                                "write": write_ctx()})
            assert err.code == "INVALID_INPUT"
        assert await state(raw) == before
        # another agent preset cannot see, and so cannot replace, the coder's entry
        other = write_ctx("s-2", agent="reviewer")
        err = await raw.fail("memory/replace", {"input": {"track": "agent", "scope": "workspace", "match": "pnpm",
                                                          "text": "uses npm"}, "write": other})
        assert err.code == "ENTRY_NOT_FOUND"
        # a workspace write from a session without cwd has no workspace to land in
        nocwd = {"agent": {"session": {"id": "s-3", "header": {}}}}
        err = await raw.fail("memory/add", {"input": entry_input("x", "agent", "workspace"), "write": nocwd})
        assert err.code == "INVALID_INPUT"
        assert await state(raw) == before


async def test_replace_remove_conditional_writes(connect: Connect) -> None:
    async with connect() as raw:
        await add(raw, "Prefers tabs", tags=["style"])
        await add(raw, "Prefers dark mode")
        before = await state(raw)
        err = await raw.fail("memory/replace", {"input": {"track": "user", "scope": "user-global", "match": "prefers",
                                                          "text": "x"}, "write": write_ctx()})
        assert err.code == "AMBIGUOUS_MATCH" and err.error["code"] == -32013
        assert err.details["candidates"] == 2
        assert sorted(err.details["sample"]) == ["Prefers dark mode", "Prefers tabs"]
        err = await raw.fail("memory/replace", {"input": {"track": "user", "scope": "user-global", "match": "emacs",
                                                          "text": "x"}, "write": write_ctx()})
        assert err.code == "ENTRY_NOT_FOUND"
        assert err.details == {"track": "user", "scope": "user-global", "match": "emacs"}
        assert await state(raw) == before

        res = await raw.ok("memory/replace", {"input": {"track": "user", "scope": "user-global", "match": "TABS",
                                                        "text": "Prefers spaces"}, "write": write_ctx()})
        assert res["previous"]["text"] == "Prefers tabs"
        assert res["entry"]["id"] == res["previous"]["id"]
        assert res["entry"]["version"] == 2 and res["entry"]["tags"] == ["style"]
        assert res["usage"]["used"] == len("Prefers spaces") + len("Prefers dark mode")
        note = await raw.notification("memory/updated")
        assert note["params"]["entry"]["text"] == "Prefers spaces"
        res = await raw.ok("memory/replace", {"input": {"track": "user", "scope": "user-global", "match": "spaces",
                                                        "text": "Prefers 2 spaces", "tags": []},
                                              "write": write_ctx()})
        assert res["entry"]["version"] == 3 and res["entry"]["tags"] == []

        res = await raw.ok("memory/remove", {"input": {"track": "user", "scope": "user-global", "match": "dark"},
                                             "write": write_ctx()})
        assert res["entry"]["text"] == "Prefers dark mode"
        before = await state(raw)
        err = await raw.fail("memory/remove", {"input": {"track": "user", "scope": "user-global", "match": "dark"},
                                               "write": write_ctx()})
        assert err.code == "ENTRY_NOT_FOUND"
        assert await state(raw) == before
        actions = [a["action"] for a in await raw.ok("audit/list", {})]
        assert actions[:3] == ["remove", "replace", "replace"]


async def test_match_folds_ascii_only(connect: Connect) -> None:
    async with connect() as raw:
        await add(raw, "École rules")
        err = await raw.fail("memory/remove", {"input": {"track": "user", "scope": "user-global", "match": "école"},
                                               "write": write_ctx()})
        assert err.code == "ENTRY_NOT_FOUND"
        await raw.ok("memory/remove", {"input": {"track": "user", "scope": "user-global", "match": "École RULES"},
                                       "write": write_ctx()})


async def test_consolidate_atomic(connect: Connect) -> None:
    async with connect() as raw:
        for t in ("likes tea", "likes coffee", "likes water"):
            await add(raw, t)
        before = await state(raw)
        bad = {"track": "user", "scope": "user-global", "matches": ["tea", "juice"], "text": "likes drinks"}
        err = await raw.fail("memory/consolidate", {"input": bad, "write": write_ctx()})
        assert err.code == "ENTRY_NOT_FOUND"
        dup = {"track": "user", "scope": "user-global", "matches": ["tea", "likes t"], "text": "x"}
        assert (await raw.fail("memory/consolidate", {"input": dup, "write": write_ctx()})).code == "INVALID_INPUT"
        many = {"track": "user", "scope": "user-global", "matches": ["a"] * 21, "text": "x"}
        assert (await raw.fail("memory/consolidate", {"input": many, "write": write_ctx()})).code == "INVALID_INPUT"
        assert await state(raw) == before
        good = {"track": "user", "scope": "user-global", "matches": ["tea", "coffee"], "text": "likes tea and coffee",
                "tags": ["drinks"]}
        res = await raw.ok("memory/consolidate", {"input": good, "write": write_ctx()})
        assert sorted(r["text"] for r in res["removed"]) == ["likes coffee", "likes tea"]
        assert res["entry"]["version"] == 1 and res["entry"]["tags"] == ["drinks"]
        texts = [e["text"] for e in await raw.ok("memory/list", {})]
        assert texts == ["likes water", "likes tea and coffee"]
        actions = [a["action"] for a in await raw.ok("audit/list", {"limit": 3})]
        assert actions == ["consolidate-add", "consolidate-remove", "consolidate-remove"]


async def test_seed_all_or_nothing(connect: Connect) -> None:
    async with connect(config="[budgets.agent]\nuser_global = 20\n") as raw:
        before = await state(raw)
        inputs = [entry_input("fine", "user"), entry_input("x" * 21, "agent")]
        err = await raw.fail("memory/seed", {"inputs": inputs, "write": write_ctx()})
        assert err.code == "BUDGET_EXCEEDED" and err.details["needed"] == 21
        bad = [entry_input("fine"), entry_input("  ")]
        err = await raw.fail("memory/seed", {"inputs": bad, "write": write_ctx()})
        assert err.code == "INVALID_INPUT" and err.details["field"].startswith("inputs[1]")
        assert await state(raw) == before
        res = await raw.ok("memory/seed", {"inputs": [entry_input("one"), entry_input("two", "agent", "workspace")],
                                           "write": write_ctx()})
        assert res["added"] == 2 and [e["text"] for e in res["entries"]] == ["one", "two"]
        audit = await raw.ok("audit/list", {"limit": 3})
        assert [a["action"] for a in audit] == ["add", "add", "seed"]
        assert audit[2]["entryId"] is None and audit[2]["track"] == "batch"


async def test_query_ranks_and_counts_recalls(connect: Connect) -> None:
    async with connect() as raw:
        for t in ("alpha one", "alpha two", "beta"):
            await add(raw, t)
        await add(raw, "alpha ws", "agent", "workspace")
        r = await raw.ok("memory/query", {"filter": {"text": "ALPHA", "limit": 1}})
        assert r["total"] == 3 and r["truncated"] is True and len(r["entries"]) == 1
        top = r["entries"][0]
        assert top["recallCount"] == 1 and top["lastRecalled"] is not None
        r = await raw.ok("memory/query", {"filter": {"text": "alpha"}})
        assert r["entries"][0]["id"] == top["id"] and r["entries"][0]["recallCount"] == 2
        r = await raw.ok("memory/query", {"filter": {"track": "agent"}})
        assert [e["text"] for e in r["entries"]] == ["alpha ws"]
        r = await raw.ok("memory/query", {"filter": {"text": "alpha"}, "opts": {"workspaceKey": "/other"}})
        assert r["total"] == 2
        r = await raw.ok("memory/query", {"filter": {"text": "alpha"}, "opts": {"agentKey": "someone-else"}})
        assert r["total"] == 0
        # memory/recalled carries the hit count (the query's total, not the page), as the reference does
        n = len(raw.notifications)
        r = await raw.ok("memory/query", {"filter": {"text": "alpha", "limit": 1}, "opts": {"sessionId": "s-9"}})
        assert r["total"] == 3 and len(r["entries"]) == 1
        recalled = await raw.notification("memory/recalled", n)
        assert recalled["params"] == {"query": "alpha", "matches": 3, "sessionId": "s-9"}
        n = len(raw.notifications)
        await raw.ok("memory/query", {"filter": {"text": "beta"}, "opts": {"sessionId": "s-9"}})
        recalled = await raw.notification("memory/recalled", n)
        assert recalled["params"] == {"query": "beta", "matches": 1, "sessionId": "s-9"}
        n = len(raw.notifications)
        await raw.ok("memory/query", {"filter": {"text": "nothing like it"}, "opts": {"sessionId": "s-9"}})
        recalled = await raw.notification("memory/recalled", n)
        assert recalled["params"] == {"query": "nothing like it", "matches": 0, "sessionId": "s-9"}
        audit = await raw.ok("audit/list", {"limit": 3})
        assert [(a["action"], a["text"], a["sessionId"]) for a in audit] == [
            ("recalled", "nothing like it", "s-9"), ("recalled", "beta", "s-9"), ("recalled", "alpha", "s-9")]
        # as the reference reads it, a limit below 1 asks for the default page
        zero = await raw.ok("memory/query", {"filter": {"limit": 0}})
        default = await raw.ok("memory/query", {"filter": {}})
        assert (zero["total"], len(zero["entries"])) == (default["total"], len(default["entries"]))


async def test_list_and_audit_order(connect: Connect) -> None:
    async with connect() as raw:
        for t in ("first", "second", "third"):
            await add(raw, t)
        assert [e["text"] for e in await raw.ok("memory/list", {})] == ["first", "second", "third"]
        audit = await raw.ok("audit/list", {"limit": 2})
        assert [a["text"] for a in audit] == ["third", "second"]
        assert audit[0]["seq"] > audit[1]["seq"]


INVALID_WRITES: list[tuple[str, dict[str, Any], str]] = [
    ("memory/add", {"input": entry_input("x")}, "WRITE_REQUIRES_AGENT"),
    ("memory/add", {"input": entry_input("x"), "write": None}, "WRITE_REQUIRES_AGENT"),
    ("memory/add", {"input": entry_input("x"), "write": {"agent": None}}, "WRITE_REQUIRES_AGENT"),
    ("memory/add", {"input": {"track": "bogus", "scope": "user-global", "text": "x"}}, "WRITE_REQUIRES_AGENT"),
    ("memory/add", {"input": {"track": "bogus", "scope": "user-global", "text": "x"}, "write": write_ctx()},
     "INVALID_INPUT"),
    ("memory/add", {"input": {"track": "user", "scope": "user-global", "text": 5}, "write": write_ctx()},
     "INVALID_INPUT"),
    ("memory/add", {"input": {"track": "user", "scope": "user-global", "text": "x", "tag": ["a"]},
                    "write": write_ctx()}, "INVALID_INPUT"),
    ("memory/add", {"input": entry_input("x", tags=[f"t{i}" for i in range(17)]), "write": write_ctx()},
     "INVALID_INPUT"),
    ("memory/add", {"input": entry_input("x", tags=["y" * 33]), "write": write_ctx()}, "INVALID_INPUT"),
    ("memory/add", {"input": entry_input("x", tags=["bell\x07"]), "write": write_ctx()}, "INVALID_INPUT"),
    ("memory/add", {"input": entry_input(""), "write": write_ctx()}, "INVALID_INPUT"),
    ("memory/add", {"write": write_ctx()}, "INVALID_INPUT"),
    ("memory/replace", {"input": {"track": "user", "scope": "user-global", "match": " ", "text": "y"},
                        "write": write_ctx()}, "INVALID_INPUT"),
    ("memory/seed", {"inputs": [], "write": write_ctx()}, "INVALID_INPUT"),
]


@pytest.mark.parametrize(("method", "params", "code"), INVALID_WRITES)
async def test_bad_params_are_structured_errors(connect: Connect, method: str, params: dict[str, Any],
                                                code: str) -> None:
    async with connect() as raw:
        await add(raw, "keep me")
        before = await state(raw)
        err = await raw.fail(method, params)
        assert err.code == code
        assert err.error["code"] == {"INVALID_INPUT": -32602, "WRITE_REQUIRES_AGENT": -32010}[code]
        assert "Traceback" not in err.error["message"]
        assert await state(raw) == before


async def test_a_method_that_is_no_string_is_an_invalid_request_and_keeps_the_connection(connect: Connect) -> None:
    async with connect() as raw:
        await add(raw, "keep me")
        before = await state(raw)
        for k, method in enumerate((b"[1]", b'{"a": 1}', b"null", b"7")):
            await raw.send_line(b'{"jsonrpc": "2.0", "id": %d, "method": %s}' % (k, method))
            r = await raw.raw_reply()
            assert (r["id"], r["error"]["code"], r["error"]["data"]["code"]) == (k, -32600, "INVALID_REQUEST")
        assert await state(raw) == before


async def test_framing_errors_keep_the_connection(connect: Connect) -> None:
    async with connect(config="max_message_bytes = 2048\n") as raw:
        await add(raw, "keep me")
        before = await state(raw)
        await raw.send_line(b"{not json")
        r = await raw.raw_reply()
        assert r["id"] is None and r["error"]["code"] == -32700
        await raw.send_line(b'{"jsonrpc": "2.0", "id": 1, "method": "memory/add", "params": {"x": "' + b"a" * 5000
                            + b'"}}')
        r = await raw.raw_reply()
        assert r["id"] is None and r["error"]["code"] == -32600
        await raw.send_line(b'{"jsonrpc": "1.0", "id": 77, "method": "memory/list"}')
        r = await raw.raw_reply()
        assert r["error"]["code"] == -32600
        r = await raw.call("memory/forget", {})
        assert r["error"]["code"] == -32601 and r["error"]["data"]["code"] == "METHOD_NOT_FOUND"
        r = await raw.call("memory/list", ["positional"])
        assert r["error"]["code"] == -32602
        # a lone surrogate in JSON text is INVALID_INPUT for that request, not a parse error
        await raw.send_line(b'{"jsonrpc":"2.0","id":"s","method":"memory/add","params":{"input":{"track":"user",'
                            b'"scope":"user-global","text":"\\ud800"},"write":{"agent":{}}}}')
        r = await raw.raw_reply()
        assert r["id"] == "s" and r["error"]["data"]["code"] == "INVALID_INPUT"
        # a notification gets no reply; the batch gets one array
        await raw.send_line(b'{"jsonrpc":"2.0","method":"memory/list"}')
        await raw.send_line(b'[{"jsonrpc":"2.0","id":"b1","method":"memory/budgets"},'
                            b'{"jsonrpc":"2.0","method":"memory/list"},{"jsonrpc":"2.0","id":"b2","method":"nope"}]')
        batch = [m for m in raw.received if isinstance(m, list)]
        r1 = await raw.raw_reply()
        r2 = await raw.raw_reply()
        assert {r1["id"], r2["id"]} == {"b1", "b2"}
        assert len([m for m in raw.received if isinstance(m, list)]) == len(batch) + 1
        assert await state(raw) == before


async def test_pipelined_requests_apply_in_order(connect: Connect) -> None:
    """A client that writes 600 requests before reading any reply gets every reply, and
    the writes land in the order it sent them (past the per-connection in-flight cap)."""
    import json

    async with connect(config="[budgets.user]\nuser_global = 100000\n") as raw:
        n = 600
        for i in range(n):
            await raw.send_line(json.dumps({"jsonrpc": "2.0", "id": f"p{i}", "method": "memory/add", "params": {
                "input": entry_input(f"item {i:04d}"), "write": write_ctx()}}).encode())
        got = [await raw.raw_reply() for _ in range(n)]
        assert all("result" in r for r in got)
        texts = [e["text"] for e in await raw.ok("memory/list", {})]
        assert texts == [f"item {i:04d}" for i in range(n)]


HOSTILE_LINES: list[tuple[bytes, int | None, str]] = [
    (b'{"jsonrpc":"2.0","id":1,"method":"\\ud800"}', -32601, "METHOD_NOT_FOUND"),
    (b'{"jsonrpc":"2.0","id":"\\ud800","method":"memory/budgets"}', None, ""),
    (b'{"jsonrpc":"2.0","id":5,"method":"memory/export","params":{"adapter":"\\ud800"}}', -32018, "ADAPTER_NOT_FOUND"),
    (b"[" * 100000, -32700, "PARSE_ERROR"),
    (b'{"jsonrpc":"2.0","id":7,"method":"memory/list","params":{"x":' + b"[" * 5000 + b"]" * 5000 + b"}}", None, ""),
    (b'{"jsonrpc":"2.0","id":NaN,"method":"memory/list"}', -32700, "PARSE_ERROR"),
    (b'{"jsonrpc":"2.0","id":6,"method":"memory/budgets","params":{"ctx":1}}', None, ""),
    (b'{"jsonrpc":"2.0","id":8,"method":"memory/add","params":{"input":{"track":"\\ud800","scope":"user-global",'
     b'"text":"x"},"write":{"agent":{}}}}', -32602, "INVALID_INPUT"),
    (b'{"jsonrpc":"2.0","id":9,"method":"proposals/dismiss","params":{"id":"\\ud800"}}', -32602, "INVALID_INPUT"),
    (b'{"jsonrpc":"2.0","id":10,"method":"proposals/list","params":{"status":"\\ud800"}}', -32602, "INVALID_INPUT"),
]


@pytest.mark.parametrize(("line", "rpc_code", "code"), HOSTILE_LINES)
async def test_hostile_lines_cost_one_reply_never_the_daemon(connect: Connect, line: bytes, rpc_code: int | None,
                                                             code: str) -> None:
    async with connect() as raw:
        await add(raw, "keep me")
        before = await state(raw)
        await raw.send_line(line)
        reply = await raw.raw_reply()
        if rpc_code is not None:
            assert reply["error"]["code"] == rpc_code and reply["error"]["data"]["code"] == code
        else:
            assert "result" in reply or reply["error"]["code"] in (-32600, -32602, -32700)
        # the connection, the daemon and the store are all intact
        assert await state(raw) == before
        await add(raw, "still serving")
