"""The approval round trip and the races it must survive, over the real socket daemon."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import anyio
import pytest
from e2e_helpers import Gate, add, arrived, entry_input, start_held, state
from processes import foreign_socket
from rawclient import socket_client, write_ctx

pytestmark = [pytest.mark.anyio, pytest.mark.inprocess]


def allow(outcome: str = "allowed-once") -> Any:
    async def handler(params: dict[str, Any]) -> str:
        return outcome

    return handler


async def test_allow_round_trip(ask_daemon: Any) -> None:
    async with socket_client(ask_daemon.socket_path) as raw:
        raw.on_approval = allow()
        res = await add(raw, "Prefers tabs", source="claude")
        asked = (await raw.notification("approval/asked"))["params"]
        assert asked["action"] == "add" and asked["text"] == "Prefers tabs"
        assert asked["track"] == "user" and asked["scope"] == "user-global" and asked["sessionId"] == "s-1"
        assert asked["source"] == "claude"
        assert asked["reason"] == "[dsh-memento] add user/user-global [source:claude]\nPrefers tabs"
        assert "count" not in asked
        audit = await raw.ok("audit/list", {"limit": 1})
        assert audit[0]["outcome"] == "allowed-once (via approval, writePolicy ask)"
        assert audit[0]["entryId"] == res["entry"]["id"]


@pytest.mark.parametrize("outcome", ["rejected", "cancelled", "unavailable", "allowed-always", "yes"])
async def test_denials_write_a_denied_row_and_nothing_else(ask_daemon: Any, outcome: str) -> None:
    async with socket_client(ask_daemon.socket_path) as raw:
        entries, budgets, _ = await state(raw)
        raw.on_approval = allow(outcome)
        err = await raw.fail("memory/add", {"input": entry_input("secret"), "write": write_ctx()})
        expected = outcome if outcome in ("rejected", "cancelled", "unavailable") else "rejected"
        assert err.code == "WRITE_DENIED" and err.error["code"] == -32014
        assert err.details == {"outcome": expected}
        audit = await raw.ok("audit/list", {})
        assert audit[0]["action"] == "add-denied"
        assert audit[0]["outcome"] == f"{expected} (via approval, writePolicy ask)"
        assert audit[0]["text"] == "secret" and audit[0]["entryId"] is None
        assert (await state(raw))[:2] == (entries, budgets)


async def test_replace_payload_shows_from_and_to(ask_daemon: Any) -> None:
    async with socket_client(ask_daemon.socket_path) as raw:
        raw.on_approval = allow()
        await add(raw, "Prefers tabs")
        await add(raw, "likes tea")
        await raw.ok("memory/replace", {"input": {"track": "user", "scope": "user-global", "match": "tabs",
                                                  "text": "Prefers spaces"}, "write": write_ctx()})
        await raw.ok("memory/consolidate", {"input": {"track": "user", "scope": "user-global",
                                                      "matches": ["spaces", "tea"], "text": "merged"},
                                            "write": write_ctx()})
        await raw.ok("memory/remove", {"input": {"track": "user", "scope": "user-global", "match": "merg"},
                                       "write": write_ctx()})
        await raw.ok("memory/seed", {"inputs": [entry_input("a"), entry_input("b", "agent")], "write": write_ctx()})
        asked = [n["params"] for n in raw.notifications if n["method"] == "approval/asked"]
        assert [a["action"] for a in asked] == ["add", "add", "replace", "consolidate", "remove", "seed"]
        assert asked[2]["text"] == "from:\nPrefers tabs\n\nto:\nPrefers spaces"
        assert asked[2]["reason"].startswith("[dsh-memento] replace user/user-global [source:dsh-memento]\nfrom:")
        assert asked[3]["text"] == "remove: spaces\nPrefers spaces\nremove: tea\nlikes tea\nnew text: merged"
        assert asked[4]["text"] == "merged"
        assert asked[5]["text"] == "user/user-global: a\nagent/user-global: b" and asked[5]["count"] == 2
        assert asked[5]["track"] == "batch" and asked[5]["scope"] == "batch"


async def test_policy_off_and_overrides(daemon_factory: Any, tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('write_policy = "off"\n[write_policies]\n"agent/workspace" = "auto"\n"source:trusted" = "auto"\n'
                   '"source:blocked" = "off"\n')
    d = daemon_factory("--config", str(cfg), policy=None)
    async with socket_client(d.socket_path) as raw:
        err = await raw.fail("memory/add", {"input": entry_input("x"), "write": write_ctx()})
        assert err.details == {"outcome": "rejected"}
        audit = await raw.ok("audit/list", {"limit": 1})
        assert audit[0]["outcome"] == "rejected (via approval, writePolicy off)"
        await add(raw, "ok by cell", "agent", "workspace")
        # a source label only tightens: "source:trusted" = "auto" does not open an "off" layer
        err = await raw.fail("memory/add", {"input": entry_input("not by source", source="trusted"),
                                            "write": write_ctx()})
        assert err.details == {"outcome": "rejected"}
        await add(raw, "auto by cell and source", "agent", "workspace", source="trusted")
        err = await raw.fail("memory/add", {"input": entry_input("no", "agent", "workspace", source="blocked"),
                                            "write": write_ctx()})
        assert err.code == "WRITE_DENIED"
        assert not [n for n in raw.notifications if n["method"] == "approval/asked"]


async def test_decisions_from_a_foreign_connection_are_refused(ask_daemon: Any) -> None:
    async with socket_client(ask_daemon.socket_path) as a, socket_client(ask_daemon.socket_path) as b:
        gate = Gate()
        a.on_approval = gate
        before = await state(b)
        async with anyio.create_task_group() as tg:
            result = start_held(tg, a, "memory/add", {"input": entry_input("mine"), "write": write_ctx()})
            await arrived(gate)
            approval_id = gate.asked[0]["id"]
            err = await b.fail("approval/decided", {"id": approval_id, "outcome": "allowed-once"})
            assert err.code == "INVALID_INPUT"
            assert (await b.fail("approval/decided", {"id": "nope", "outcome": "allowed-once"})).code == "INVALID_INPUT"
            assert await state(b) == before
            await a.ok("approval/decided", {"id": approval_id, "outcome": "allowed-once"})
            again = await a.fail("approval/decided", {"id": approval_id, "outcome": "rejected"})
            assert again.code == "INVALID_INPUT"
        assert "result" in result["r"]


async def test_decision_accepted_as_a_notification(ask_daemon: Any) -> None:
    async with socket_client(ask_daemon.socket_path) as raw:
        import json

        async def as_notification(params: dict[str, Any]) -> None:
            await raw.send_line(json.dumps({"jsonrpc": "2.0", "method": "approval/decided",
                                            "params": {"id": params["id"], "outcome": "allowed-once"}}).encode())

        raw.on_approval = as_notification
        res = await add(raw, "via notification")
        assert res["entry"]["text"] == "via notification"


async def test_race_replace_target_removed_during_approval(ask_daemon: Any) -> None:
    async with socket_client(ask_daemon.socket_path) as a, socket_client(ask_daemon.socket_path) as b:
        b.on_approval = allow()
        await add(b, "Prefers tabs", session="s-2")
        gate = Gate()
        a.on_approval = gate
        async with anyio.create_task_group() as tg:
            replace = {"track": "user", "scope": "user-global", "match": "tabs", "text": "Prefers spaces"}
            box = start_held(tg, a, "memory/replace", {"input": replace, "write": write_ctx()})
            await arrived(gate)
            await b.ok("memory/remove", {"input": {"track": "user", "scope": "user-global", "match": "tabs"},
                                         "write": write_ctx("s-2")})
            before = await state(b)
            await a.ok("approval/decided", {"id": gate.asked[0]["id"], "outcome": "allowed-once"})
        assert box["r"]["error"]["data"]["code"] == "ENTRY_NOT_FOUND"
        assert await state(b) == before
        assert await b.ok("memory/list", {}) == []


async def test_race_replace_target_changed_during_approval(ask_daemon: Any) -> None:
    async with socket_client(ask_daemon.socket_path) as a, socket_client(ask_daemon.socket_path) as b:
        b.on_approval = allow()
        await add(b, "Prefers tabs", session="s-2")
        gate = Gate()
        a.on_approval = gate
        async with anyio.create_task_group() as tg:
            remove = {"track": "user", "scope": "user-global", "match": "prefers"}
            box = start_held(tg, a, "memory/remove", {"input": remove, "write": write_ctx()})
            await arrived(gate)
            # still contains the match, but it is no longer the text the human approved removing
            await b.ok("memory/replace", {"input": {"track": "user", "scope": "user-global", "match": "tabs",
                                                    "text": "Prefers tabs, always"}, "write": write_ctx("s-2")})
            before = await state(b)
            await a.ok("approval/decided", {"id": gate.asked[0]["id"], "outcome": "allowed-once"})
        assert box["r"]["error"]["data"]["code"] == "ENTRY_NOT_FOUND"
        assert await state(b) == before


async def test_race_budget_fills_during_pending_add(daemon_factory: Any, tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("[budgets.user]\nuser_global = 10\n")
    d = daemon_factory("--config", str(cfg), policy="ask")
    async with socket_client(d.socket_path) as a, socket_client(d.socket_path) as b:
        b.on_approval = allow()
        gate = Gate()
        a.on_approval = gate
        async with anyio.create_task_group() as tg:
            box = start_held(tg, a, "memory/add", {"input": entry_input("123456"), "write": write_ctx()})
            await arrived(gate)
            await add(b, "abcdef", session="s-2")
            before = await state(b)
            await a.ok("approval/decided", {"id": gate.asked[0]["id"], "outcome": "allowed-once"})
        err = box["r"]["error"]["data"]
        assert err["code"] == "BUDGET_EXCEEDED"
        assert err["details"] == {"track": "user", "scope": "user-global", "used": 6, "limit": 10, "needed": 12}
        assert await state(b) == before


async def test_race_disconnect_while_pending(ask_daemon: Any) -> None:
    async with socket_client(ask_daemon.socket_path) as b:
        before_entries = await b.ok("memory/list", {})
        async with socket_client(ask_daemon.socket_path) as a:
            gate = Gate()
            a.on_approval = gate
            await a.send_line(b'{"jsonrpc":"2.0","id":1,"method":"memory/add","params":{"input":{"track":"user",'
                              b'"scope":"user-global","text":"never"},"write":{"agent":{"session":{"id":"gone"}}}}}')
            await arrived(gate)
            await a.hang_up()  # gone: the daemon answers the write and closes its end
        audit = await b.ok("audit/list", {"limit": 1})
        assert audit[0]["action"] == "add-denied"
        assert audit[0]["outcome"] == "unavailable (via approval, writePolicy ask)"
        assert audit[0]["sessionId"] == "gone"
        assert await b.ok("memory/list", {}) == before_entries


async def test_pending_approval_does_not_delay_others(ask_daemon: Any) -> None:
    async with socket_client(ask_daemon.socket_path) as a, socket_client(ask_daemon.socket_path) as b:
        gate = Gate()
        a.on_approval = gate
        b.on_approval = allow()
        async with anyio.create_task_group() as tg:
            box = start_held(tg, a, "memory/add", {"input": entry_input("held"), "write": write_ctx()})
            await arrived(gate)
            # other sessions read, write and get their own approvals while a's waits
            with anyio.fail_after(5):
                await add(b, "not delayed", session="s-2")
                assert [e["text"] for e in await b.ok("memory/list", {})] == ["not delayed"]
                # and a's own connection keeps serving reads too
                assert len(await a.ok("memory/list", {})) == 1
            status = await b.ok("daemon/status", {})
            assert status["pendingApprovals"] == 1 and status["connections"] == 2
            await a.ok("approval/decided", {"id": gate.asked[0]["id"], "outcome": "allowed-once"})
        assert box["r"]["result"]["entry"]["text"] == "held"


async def test_approval_timeout_cancels(daemon_factory: Any, tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("approval_timeout_s = 0.3\n")
    d = daemon_factory("--config", str(cfg), policy="ask")
    async with socket_client(d.socket_path) as raw:
        raw.on_approval = Gate()
        err = await raw.fail("memory/add", {"input": entry_input("slow"), "write": write_ctx()})
        assert err.details == {"outcome": "cancelled"}
        resolved = await raw.notification("approval/resolved")
        assert resolved["params"]["outcome"] == "cancelled"
        audit = await raw.ok("audit/list", {"limit": 1})
        assert audit[0]["outcome"] == "cancelled (via approval, writePolicy ask)"


async def test_headless_without_approver_is_unavailable(ask_daemon: Any) -> None:
    async with socket_client(ask_daemon.socket_path, approvals=False) as raw:
        raw.on_approval = allow()
        err = await raw.fail("memory/add", {"input": entry_input("x"), "write": write_ctx()})
        assert err.details == {"outcome": "unavailable"}
        assert not [n for n in raw.notifications if n["method"] == "approval/asked"]
        assert (await raw.ok("audit/list", {"limit": 1}))[0]["action"] == "add-denied"


async def test_headless_writes_go_to_approvers_first_wins(ask_any_daemon: Any) -> None:
    path = ask_any_daemon.socket_path
    async with (
        socket_client(path, approvals=False) as agent,
        socket_client(path, foreign=True) as h1,
        socket_client(path, foreign=True) as h2,
    ):
        g1, g2 = Gate(), Gate()
        h1.on_approval, h2.on_approval = g1, g2
        await h1.ok("approval/subscribe", {})
        await h2.ok("approval/subscribe", {})
        async with anyio.create_task_group() as tg:
            box = start_held(tg, agent, "memory/add",
                             {"input": entry_input("from a headless agent"), "write": write_ctx("bot")})
            with anyio.fail_after(10):
                await g1.arrived.wait()
                await g2.arrived.wait()
            assert g1.asked[0]["id"] == g2.asked[0]["id"]
            assert not [n for n in agent.notifications if n["method"] == "approval/asked"]
            # the writer itself cannot approve its own write
            assert (await agent.fail("approval/decided", {"id": g1.asked[0]["id"], "outcome": "allowed-once"})
                    ).code == "INVALID_INPUT"
            await h2.ok("approval/decided", {"id": g2.asked[0]["id"], "outcome": "allowed-once"})
            resolved = await h1.notification("approval/resolved")
            assert resolved["params"] == {"id": g1.asked[0]["id"], "outcome": "allowed-once"}
            late = await h1.fail("approval/decided", {"id": g1.asked[0]["id"], "outcome": "rejected"})
            assert late.code == "INVALID_INPUT"
        assert box["r"]["result"]["entry"]["text"] == "from a headless agent"


@pytest.mark.process
async def test_sigterm_denies_pending_and_exits_zero(ask_daemon: Any) -> None:
    async with socket_client(ask_daemon.socket_path) as raw:
        gate = Gate()
        raw.on_approval = gate
        await raw.send_line(b'{"jsonrpc":"2.0","id":"w","method":"memory/add","params":{"input":{"track":"user",'
                            b'"scope":"user-global","text":"pending at shutdown"},"write":{"agent":{}}}}')
        with anyio.fail_after(10):
            await gate.arrived.wait()
        ask_daemon.proc.send_signal(signal.SIGTERM)
        reply = await raw.raw_reply()
        assert reply["error"]["data"]["details"] == {"outcome": "cancelled"}
    assert await anyio.to_thread.run_sync(ask_daemon.proc.wait, 10) == 0
    import sqlite3

    conn = sqlite3.connect(ask_daemon.db_path)
    rows = conn.execute("SELECT action, outcome FROM audit").fetchall()
    assert rows == [("add-denied", "cancelled (via approval, writePolicy ask)")]
    assert conn.execute("SELECT count(*) FROM entries").fetchone() == (0,)
    conn.close()


async def test_a_headless_connection_can_never_approve_its_own_writes(ask_daemon: Any) -> None:
    async with socket_client(ask_daemon.socket_path, approvals=False) as agent:
        agent.on_approval = allow()
        err = await agent.fail("approval/subscribe", {})
        assert err.code == "INVALID_INPUT"
        # re-initializing cannot take the declaration back
        await agent.ok("initialize", {"capabilities": {"approvals": True}})
        err = await agent.fail("memory/add", {"input": entry_input("self-approved?"), "write": write_ctx()})
        assert err.details == {"outcome": "unavailable"}
        assert await agent.ok("memory/list", {}) == []


async def test_a_stalled_approver_blocks_nobody(daemon_factory: Any, tmp_path: Path) -> None:
    """An approver that never reads: approvals still time out on schedule and every
    other connection keeps being served."""
    import socket as pysocket

    cfg = tmp_path / "c.toml"
    cfg.write_text('approval_timeout_s = 1\napprovers = "any"\n[budgets.user]\nuser_global = 10000000\n')
    d = daemon_factory("--config", str(cfg), policy="ask")
    stalled = foreign_socket(d.socket_path)  # an approver is never asked about its own process's writes
    stalled.setsockopt(pysocket.SOL_SOCKET, pysocket.SO_RCVBUF, 4096)
    stalled.sendall(b'{"jsonrpc":"2.0","id":1,"method":"approval/subscribe"}\n')
    try:
        async with socket_client(d.socket_path) as probe:
            probe.on_approval = allow()
            replies: list[dict[str, Any]] = []

            async def headless_write(n: int) -> None:
                async with socket_client(d.socket_path, approvals=False) as agent:
                    replies.append(await agent.call("memory/add", {"input": entry_input(f"{n} " + "x" * 3900),
                                                                   "write": write_ctx(f"bot-{n}")}))

            with anyio.fail_after(8):
                async with anyio.create_task_group() as tg:
                    for n in range(40):
                        tg.start_soon(headless_write, n)
                    await add(probe, "not blocked", session="s-probe")  # asks the probe itself
            assert len(replies) == 40
            assert all(r["error"]["data"]["details"]["outcome"] == "cancelled" for r in replies)
            assert [e["text"] for e in await probe.ok("memory/list", {})] == ["not blocked"]
    finally:
        stalled.close()


async def test_consolidate_never_widens_visibility(daemon: Any) -> None:
    async with socket_client(daemon.socket_path) as raw:
        await raw.ok("memory/add", {"input": entry_input("private note", agentKey="coder"), "write": write_ctx()})
        await raw.ok("memory/add", {"input": entry_input("shared note", agentKey=""), "write": write_ctx()})
        res = await raw.ok("memory/consolidate", {"input": {"track": "user", "scope": "user-global",
                                                            "matches": ["private", "shared"], "text": "merged"},
                                                  "write": write_ctx()})
        assert res["entry"]["agentKey"] == "coder"


async def test_seed_is_limited_to_the_visible_set_import_is_a_restore(daemon: Any) -> None:
    async with socket_client(daemon.socket_path) as raw:
        foreign = [entry_input("elsewhere", "agent", "workspace", workspaceKey="/other", agentKey="reviewer")]
        err = await raw.fail("memory/seed", {"inputs": foreign, "write": write_ctx()})
        assert err.code == "INVALID_INPUT"
        env = {"plugin": "dsh-memento", "schema": "memory-export-v1", "exportedAt": "2026-01-01T00:00:00.000Z",
               "budgets": [], "entries": foreign}
        res = await raw.ok("memory/import", {"envelope": env, "write": write_ctx()})
        assert res["entries"][0]["workspaceKey"] == "/other" and res["entries"][0]["agentKey"] == "reviewer"


async def test_any_non_string_outcome_denies(ask_daemon: Any) -> None:
    async with socket_client(ask_daemon.socket_path) as raw:
        async def weird(params: dict[str, Any]) -> None:
            await raw.ok("approval/decided", {"id": params["id"], "outcome": {"allowed": True}})

        raw.on_approval = weird
        err = await raw.fail("memory/add", {"input": entry_input("x"), "write": write_ctx()})
        assert err.details == {"outcome": "rejected"}
