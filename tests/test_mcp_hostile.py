"""A hostile or broken MCP host against ``memoryd mcp``: malformed lines, a flood of calls
in flight, elicitation answers for the wrong request or replayed, a host that closes or
never answers mid-approval, and ``mcp/attach`` where it does not belong. Each gets a clean
error and the store keeps exactly what was acknowledged."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from e2e_helpers import state
from mcp import MCPError
from mcp_support import (
    INITIALIZE,
    INITIALIZED,
    PROJ,
    Host,
    call,
    mcp_client,
    mcp_command,
    mcp_daemon,
    raw_mcp,
    tool_error,
)
from memoryd.mcp_host.session import host_source
from memoryd.mcp_host.wire import MAX_INFLIGHT
from rawclient import write_ctx

pytestmark = pytest.mark.anyio

WS = {"track": "user", "scope": "workspace"}
ELICITING = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
             "params": {"protocolVersion": "2025-11-25", "capabilities": {"elicitation": {"form": {}}},
                        "clientInfo": {"name": "raw-host", "version": "1"}}}


def test_a_host_s_name_gives_its_agent_layer() -> None:
    assert host_source("claude-code") == "claude-code"
    assert host_source("Claude Code") == "claude-code"
    assert host_source("codex-mcp-client") == "codex"
    assert host_source("gemini-cli-mcp-client") == "gemini-cli"
    assert host_source("Visual Studio Code") == "visual-studio-code"
    assert host_source("cursor-vscode") == "cursor-vscode"
    assert host_source("  ") is None and host_source("") is None and host_source(None) is None
    assert host_source("x" * 500) == "x" * 64


async def test_malformed_lines_get_their_errors_and_the_session_goes_on(tmp_path: Path, sock_dir: Path) -> None:
    async with mcp_daemon(tmp_path, sock_dir) as d, raw_mcp(d) as host:
        await host.send(b"{not json", b'{"hello": "world"}', b"[1, 2]", b'"just a string"')
        replies = [await host.line() for _ in range(4)]
        assert [r["error"]["code"] for r in replies] == [-32700, -32600, -32600, -32600]
        assert all(r["id"] is None for r in replies)
        await host.send({"jsonrpc": "2.0", "id": 7, "method": "no/such"},
                        {"jsonrpc": "2.0", "id": 8, "method": "tools/call", "params": {"name": "nope"}},
                        {"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": "not an object"},
                        call(10, "memory_budgets", {}))
        assert (await host.reply(7))["error"]["code"] == -32601
        assert (await host.reply(8))["error"]["code"] == -32602
        assert (await host.reply(9))["error"]["code"] == -32600
        assert (await host.reply(10))["result"]["isError"] is False


async def test_ten_thousand_calls_in_flight_are_all_answered_with_a_bounded_daemon(
        tmp_path: Path, sock_dir: Path) -> None:
    n = 10_000
    async with mcp_daemon(tmp_path, sock_dir) as d, raw_mcp(d) as host:
        baseline = len(asyncio.all_tasks())
        most = 0
        answered: set[int] = set()

        async def flood() -> None:
            for start in range(1, n + 1, 500):
                await host.send(*(call(i, "memory_query", {"text": "x"}) for i in range(start, min(start + 500, n + 1))))

        async with anyio.create_task_group() as tg:
            tg.start_soon(flood)
            while len(answered) < n:
                reply = await host.line()
                assert reply["result"]["isError"] is False, reply
                assert reply["id"] not in answered
                answered.add(reply["id"])
                most = max(most, len(asyncio.all_tasks()) - baseline)
        assert answered == set(range(1, n + 1))
        # the session reads no further request while MAX_INFLIGHT wait for their reply; each
        # is two tasks while its read runs on a reader's thread: the SDK's request, and the
        # session's call
        assert most <= 2 * MAX_INFLIGHT + 32, most


async def test_a_host_that_closes_mid_approval_is_denied_unavailable(tmp_path: Path, sock_dir: Path) -> None:
    async with mcp_daemon(tmp_path, sock_dir, policy="ask") as d:
        async with d.connect() as raw:
            before = await state(raw)
        async with raw_mcp(d, initialize=False) as host:
            await host.send(ELICITING, INITIALIZED)
            await host.reply(0)
            await host.send(call(1, "memory_add", {**WS, "text": "Prefers tabs"}))
            ask = await host.line()
            assert ask["method"] == "elicitation/create" and "Prefers tabs" in ask["params"]["message"]
        # The host's end closed: once its connection is gone, so is the write it asked.
        with anyio.fail_after(30):
            await d.daemon.no_connections.wait()
        async with d.connect() as raw:
            assert (await state(raw))[:2] == before[:2]
            [denied] = [a for a in await raw.ok("audit/list", {}) if a["action"] == "add-denied"]
        assert denied["outcome"].startswith("unavailable")


async def test_an_answer_to_another_request_id_approves_nothing(tmp_path: Path, sock_dir: Path) -> None:
    async with mcp_daemon(tmp_path, sock_dir, policy="ask") as d, d.connect() as raw, \
            raw_mcp(d, initialize=False) as host:
        before = await state(raw)
        await host.send(ELICITING, INITIALIZED)
        await host.reply(0)
        await host.send(call(1, "memory_add", {**WS, "text": "Prefers tabs"}))
        ask = await host.line()
        wrong = {"jsonrpc": "2.0", "id": f"{ask['id']}-other" if isinstance(ask["id"], str) else ask["id"] + 1000,
                 "result": {"action": "accept", "content": {}}}
        await host.send(wrong, call(2, "memory_budgets", {}))
        await host.reply(2)  # the session went on; the wrong answer decided nothing
        assert (await state(raw))[:2] == before[:2]
        await host.send({"jsonrpc": "2.0", "id": ask["id"], "result": {"action": "decline"}})
        result = (await host.reply(1))["result"]
        assert tool_error(result)["details"] == {"outcome": "rejected"}
        assert (await state(raw))[:2] == before[:2]


async def test_an_unanswered_elicitation_times_out_cancelled(tmp_path: Path, sock_dir: Path) -> None:
    async with mcp_daemon(tmp_path, sock_dir, policy="ask", config="approval_timeout_s = 0.5\n") as d, \
            raw_mcp(d, initialize=False) as host:
        await host.send(ELICITING, INITIALIZED)
        await host.reply(0)
        await host.send(call(1, "memory_add", {**WS, "text": "Prefers tabs"}))
        assert (await host.line())["method"] == "elicitation/create"
        result = (await host.reply(1))["result"]
        assert tool_error(result)["details"] == {"outcome": "cancelled"}


async def test_a_2026_answer_is_bound_to_its_call_and_used_once(tmp_path: Path, sock_dir: Path) -> None:
    async with mcp_daemon(tmp_path, sock_dir, policy="ask") as d, d.connect() as raw, \
            mcp_client(d, "2026-07-28", host=Host("accept")) as c:
        s = c.session
        args = {**WS, "text": "Prefers tabs"}
        asked = await s.call_tool("memory_add", args, allow_input_required=True)
        assert isinstance(asked, types.InputRequiredResult)
        [request] = asked.input_requests.values()
        assert "Prefers tabs" in request.params.message  # type: ignore[union-attr]
        yes = {"approval": types.ElicitResult(action="accept", content={})}
        before = await state(raw)
        # the sealed state does not answer another write, nor survives tampering
        with pytest.raises(MCPError):
            await s.call_tool("memory_add", {**WS, "text": "Something else"}, input_responses=yes,
                              request_state=asked.request_state, allow_input_required=True)
        with pytest.raises(MCPError):
            await s.call_tool("memory_add", args, input_responses=yes,
                              request_state=(asked.request_state or "")[:-4] + "AAAA", allow_input_required=True)
        assert (await state(raw))[:2] == before[:2]
        done = await s.call_tool("memory_add", args, input_responses=yes, request_state=asked.request_state,
                                 allow_input_required=True)
        assert isinstance(done, types.CallToolResult) and not done.is_error
        again = await s.call_tool("memory_add", args, input_responses=yes, request_state=asked.request_state,
                                  allow_input_required=True)
        assert isinstance(again, types.CallToolResult) and tool_error(again)["code"] == "INVALID_INPUT"
        entries = await raw.ok("memory/list", {})
        assert [e["text"] for e in entries] == ["Prefers tabs"]


async def test_mcp_attach_is_refused_where_it_does_not_belong(tmp_path: Path, sock_dir: Path) -> None:
    async with mcp_daemon(tmp_path, sock_dir) as d, d.connect() as raw:
        err = await raw.fail("mcp/attach", {"cwd": PROJ})  # this connection has initialized
        assert err.code == "INVALID_INPUT" and "before initialize" in err.error["message"]
    async with mcp_daemon(tmp_path / "b", sock_dir) as d, d.connect(initialize=False) as raw:
        err = await raw.fail("mcp/attach", {"cwd": "relative/path"})
        assert err.code == "INVALID_INPUT" and err.details == {"field": "cwd"}
        err = await raw.fail("mcp/attach", {"cwd": PROJ, "agent": 5})
        assert err.code == "INVALID_INPUT"
        assert (await raw.ok("daemon/status", {}))["connections"] == 1


async def test_a_store_mismatch_is_refused_before_anything_is_relayed(tmp_path: Path, sock_dir: Path) -> None:
    async with mcp_daemon(tmp_path, sock_dir) as d:
        cfg = d.daemon.config
        command = [sys.executable, "-m", "memoryd", "mcp", "--socket", str(cfg.socket_path), "--db", str(tmp_path / "other.db")]
        result = await anyio.run_process(command, check=False, input=b"")
        assert result.returncode == 1 and result.stdout == b""
        assert result.stderr.decode() == (
            f"memoryd: the daemon on {cfg.socket_path} serves the store {cfg.db_path}, not {tmp_path / 'other.db'}; "
            f"give --socket of the daemon that serves {tmp_path / 'other.db'}, or drop --db to use {cfg.db_path}\n")


async def test_cancelled_calls_free_their_slots_and_a_closed_host_ends_its_session(
        tmp_path: Path, sock_dir: Path) -> None:
    async with mcp_daemon(tmp_path, sock_dir) as d:
        async with raw_mcp(d) as host:
            flood = []
            for i in range(1, MAX_INFLIGHT + 45):
                flood += [call(i, "memory_budgets", {}),
                          {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": i}}]
            await host.send(*flood, {"jsonrpc": "2.0", "id": "ping", "method": "ping"})
            assert (await host.reply("ping"))["result"] == {}
        with anyio.fail_after(30):
            await d.daemon.no_connections.wait()


async def test_a_host_that_stops_reading_is_dropped_at_the_output_cap(tmp_path: Path, sock_dir: Path) -> None:
    config = "max_buffered_bytes = 65536\n[budgets.user]\nuser_global = 200000\n"
    async with mcp_daemon(tmp_path, sock_dir, config=config) as d:
        async with d.connect() as raw:
            await raw.ok("memory/seed", {"inputs": [{"track": "user", "scope": "user-global", "text": f"fact {i} " * 12}
                                                    for i in range(400)], "write": write_ctx("s-0")})
        async with await anyio.open_process(mcp_command(d)) as proc:
            await proc.stdin.send(json.dumps(INITIALIZE).encode() + b"\n" + json.dumps(INITIALIZED).encode() + b"\n"
                                  + b"".join(json.dumps(call(i, "memory_list", {})).encode() + b"\n"
                                             for i in range(1, 200)))
            # Nothing is read: the relay's stdout fills, then its socket, then the daemon's
            # buffer for it, and the daemon lets go of the connection.
            with anyio.fail_after(60):
                await d.daemon.no_connections.wait()
            proc.kill()


async def test_a_half_line_held_too_long_closes_the_session(tmp_path: Path, sock_dir: Path) -> None:
    async with mcp_daemon(tmp_path, sock_dir, config="half_line_timeout_s = 0.5\n") as d, raw_mcp(d) as host:
        await host.proc.stdin.send(b'{"jsonrpc":"2.0","id":9,"method":"ping"' + b" " * 1000)  # no newline
        line = await host.line()
        assert line["error"]["code"] == -32600 and "incomplete" in line["error"]["message"]
        with anyio.fail_after(30):
            await d.daemon.no_connections.wait()


async def test_what_was_sent_before_eof_is_answered(tmp_path: Path, sock_dir: Path) -> None:
    async with mcp_daemon(tmp_path, sock_dir) as d, d.connect() as raw:
        async with await anyio.open_process(mcp_command(d)) as proc:
            calls = [call(i, "memory_add", {**WS, "text": f"fact {i}"}) for i in range(1, 6)]
            await proc.stdin.send(b"".join(json.dumps(m).encode() + b"\n" for m in
                                           [INITIALIZE, INITIALIZED, *calls, {"jsonrpc": "2.0", "id": 6,
                                                                               "method": "tools/list"}]))
            await proc.stdin.aclose()
            out = b""
            with anyio.fail_after(30):
                async for chunk in proc.stdout:
                    out += chunk
        replies = {m["id"]: m for m in map(json.loads, out.splitlines())}
        assert sorted(replies) == [0, 1, 2, 3, 4, 5, 6]
        assert all(replies[i]["result"]["isError"] is False for i in range(1, 6))
        assert len(replies[6]["result"]["tools"]) == 8
        assert len(await raw.ok("memory/list", {})) == 5


async def test_mcp_attach_after_memory_watch_is_refused(tmp_path: Path, sock_dir: Path) -> None:
    async with mcp_daemon(tmp_path, sock_dir) as d, d.connect(initialize=False) as raw:
        await raw.ok("memory/watch", {"session": {"id": "w-1"}})
        err = await raw.fail("mcp/attach", {"cwd": PROJ})
        assert err.code == "INVALID_INPUT" and "memory/watch" in err.error["message"]


async def test_cancels_with_odd_ids_neither_break_the_session_nor_leak_its_slots(
        tmp_path: Path, sock_dir: Path) -> None:
    async with mcp_daemon(tmp_path, sock_dir) as d, raw_mcp(d) as host:
        cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled"}
        await host.send({**cancel, "params": {"requestId": [1]}}, {**cancel, "params": {"requestId": {"a": 1}}},
                        {**cancel, "params": "nope"}, {"jsonrpc": "2.0", "id": "p1", "method": "ping"})
        assert (await host.reply("p1"))["result"] == {}
        # the SDK takes "7" and 7 for one id: a request sent as "7" and cancelled as 7
        flood = []
        for i in range(1, MAX_INFLIGHT + 45):
            flood += [call(str(i), "memory_budgets", {}), {**cancel, "params": {"requestId": i}}]  # type: ignore[arg-type]
        await host.send(*flood, {"jsonrpc": "2.0", "id": "p2", "method": "ping"})
        assert (await host.reply("p2"))["result"] == {}


@pytest.mark.parametrize("bad_id", [None, 1.5, True])
async def test_a_request_with_an_id_no_request_may_have_is_refused(tmp_path: Path, sock_dir: Path, bad_id: Any) -> None:
    async with mcp_daemon(tmp_path, sock_dir) as d, d.connect() as raw, raw_mcp(d) as host:
        before = await state(raw)
        await host.send({"jsonrpc": "2.0", "id": bad_id, "method": "tools/call",
                         "params": {"name": "memory_add", "arguments": {**WS, "text": "x"}}})
        line = await host.line()
        assert (line["id"], line["error"]["code"]) == (None, -32600)
        assert await state(raw) == before


def test_the_sdk_s_log_lines_keep_their_level_and_lose_what_they_carry() -> None:
    import logging

    from memoryd.logs import Withheld

    try:
        raise ValueError("Prefers tabs")
    except ValueError:
        import sys

        exc_info = sys.exc_info()
    record = logging.LogRecord("mcp.server.runner", logging.ERROR, __file__, 1, "handler for %r returned %s",
                               ("tools/call", "Prefers tabs"), exc_info)
    assert Withheld().filter(record)
    assert record.getMessage() == "handler for '…' returned … (ValueError; memoryd's debug log has the details)"
    assert record.exc_info is None
    quiet = logging.LogRecord("mcp.shared", logging.INFO, __file__, 1, "got %s", ("Prefers tabs",), None)
    assert not Withheld().filter(quiet)
