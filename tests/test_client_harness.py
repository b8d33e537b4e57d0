"""The Python client as a harness uses it: ``query()`` scoped to the connection's session by
default (against a real daemon), and approval handlers told which call asked
(``approval/asked.requestId``, routed against a fake server line)."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import memoryd_client as mc
import pytest
from memoryd_protocol.constants import ALLOWED_ONCE
from test_client import fake_server

pytestmark = [pytest.mark.anyio, pytest.mark.inprocess]

TIMEOUT = 10
A = mc.make_session("s-a", cwd="/home/u/a", agent_preset="coder")
B = mc.make_session("s-b", cwd="/home/u/b", agent_preset="reviewer")


@asynccontextmanager
async def client(daemon: Any, **kwargs: Any) -> AsyncIterator[mc.Client]:
    with anyio.fail_after(30):
        async with mc.connect(daemon.socket_path, timeout=TIMEOUT, **kwargs) as c:
            yield c


async def populate(daemon: Any) -> dict[str, mc.types.Entry]:
    """One entry per visibility case, by text."""
    entries: dict[str, mc.types.Entry] = {}
    async with client(daemon, session=A) as a, client(daemon, session=B) as b:
        for c, inp in [
            (a, {"track": "user", "scope": "user-global", "text": "a private"}),
            (a, {"track": "user", "scope": "user-global", "text": "shared global", "agentKey": ""}),
            (a, {"track": "agent", "scope": "workspace", "text": "a workspace"}),
            (a, {"track": "agent", "scope": "workspace", "text": "a workspace shared", "agentKey": ""}),
            (b, {"track": "user", "scope": "user-global", "text": "b private"}),
            (b, {"track": "agent", "scope": "workspace", "text": "b workspace"}),
        ]:
            entries[inp["text"]] = (await c.add(inp)).entry
    return entries


def texts(result: mc.types.QueryResult) -> set[str]:
    return {e.text for e in result.entries}


# --- query scoped to the session ---------------------------------------------------------


async def test_two_sessions_see_only_their_visible_sets(daemon: Any) -> None:
    await populate(daemon)
    async with client(daemon, session=A) as a, client(daemon, session=B) as b:
        assert a.query_opts == {"sessionId": "s-a", "agentKey": "coder", "workspaceKey": "/home/u/a"}
        recalled = a.events("memory/recalled")
        got = await a.query()
        assert texts(got) == {"a private", "shared global", "a workspace", "a workspace shared"}
        assert got.total == 4
        ev = await recalled.receive(TIMEOUT)
        assert (ev.params.session_id, ev.params.query) == ("s-a", "")
        assert texts(await b.query()) == {"b private", "shared global", "b workspace"}
        assert texts(await b.query({"text": "workspace"})) == {"b workspace"}
        # the daemon wrote one 'recalled' row per session query, under that session's id
        rows = [r for r in await a.audit_list(10) if r.action == "recalled"]
        assert [(r.session_id, r.text) for r in rows] == [("s-b", "workspace"), ("s-b", ""), ("s-a", "")]


async def test_explicit_opts_override_the_session(daemon: Any) -> None:
    await populate(daemon)
    async with client(daemon, session=A) as a:
        everything = {"a private", "shared global", "a workspace", "a workspace shared", "b private", "b workspace"}
        assert texts(await a.query(None, None)) == everything
        assert texts(await a.query(opts={})) == everything
        assert texts(await a.query(opts={"agentKey": "reviewer", "workspaceKey": "/home/u/b"})) == {
            "b private", "shared global", "b workspace"}
        assert texts(await a.query({"track": "agent"}, {"workspaceKey": "/home/u/a"})) == {
            "a workspace", "a workspace shared"}
        assert [r for r in await a.audit_list(10) if r.action == "recalled"] == []  # no sessionId was sent


async def test_session_without_id_or_cwd(daemon: Any) -> None:
    await populate(daemon)
    async with client(daemon, session={"header": {"cwd": "/home/u/a", "agentPreset": "coder"}}) as c:
        assert c.query_opts == {"agentKey": "coder", "workspaceKey": "/home/u/a"}
        events = c.events("memory/recalled")
        assert texts(await c.query()) == {"a private", "shared global", "a workspace", "a workspace shared"}
        assert [r for r in await c.audit_list(10) if r.action == "recalled"] == []
        await c.status()  # the daemon has answered everything sent before: no event came
        with pytest.raises(mc.Timeout):
            await events.receive(0)
    # no cwd: the session has no workspace, so it sees no workspace entries
    async with client(daemon, session=mc.make_session("s-c", agent_preset="coder")) as c:
        assert c.query_opts == {"sessionId": "s-c", "agentKey": "coder", "workspaceKey": ""}
        assert texts(await c.query()) == {"a private", "shared global"}
    # no agent preset: the shared layer only
    async with client(daemon, session=mc.make_session("s-d", cwd="/home/u/a/")) as c:
        assert texts(await c.query()) == {"shared global", "a workspace shared"}


async def test_without_a_session_query_sees_the_whole_store(daemon: Any) -> None:
    await populate(daemon)
    async with client(daemon) as c:
        assert c.query_opts is None
        assert (await c.query()).total == 6


async def test_what_a_session_queries_is_what_it_can_target(daemon: Any) -> None:
    entries = await populate(daemon)
    async with client(daemon, session=A) as a:
        visible = texts(await a.query())
        for text, e in entries.items():
            target = {"track": e.track, "scope": e.scope, "id": e.id}
            if text in visible:
                assert (await a.remove(target)).entry.id == e.id
            else:
                with pytest.raises(mc.EntryNotFound) as info:
                    await a.remove(target)
                assert info.value.details == {"track": e.track, "scope": e.scope, "entryId": e.id}
        assert {e.text for e in await a.list()} == {"b private", "b workspace"}


def test_sync_client_scopes_query(daemon: Any) -> None:
    anyio.run(populate, daemon)
    with mc.connect_sync(daemon.socket_path, session=B, timeout=TIMEOUT) as c:
        assert texts(c.query()) == {"b private", "shared global", "b workspace"}
        assert len(c.query(None, None).entries) == 6


# --- approval handlers told which call asked -----------------------------------------------


def entry_json(text: str) -> dict[str, Any]:
    return {"id": "6f1c2a8e-0d3b-4c55-9a1e-2b7f0c9d8e71", "track": "user", "scope": "user-global",
            "workspaceKey": "", "agentKey": "", "text": text, "source": "dsh-memento", "tags": [], "version": 1,
            "createdAt": 1, "updatedAt": 1, "lastRecalled": None, "recallCount": 0, "sessionId": "s"}


def asking_server(request_id: Callable[[Any], Any]) -> Callable[..., Awaitable[bool]]:
    """A fake daemon that asks for every memory/add, with ``requestId`` = request_id(add's id)
    (absent when it returns the ``ABSENT`` marker), and answers the add once decided."""
    adds: dict[str, Any] = {}

    async def handle(req: dict[str, Any], send: Callable[[Any], Awaitable[None]]) -> bool:
        if req["method"] == "memory/add":
            ask_id = f"ap-{req['id']}"
            adds[ask_id] = req
            params = {"id": ask_id, "action": "add", "track": "user", "scope": "user-global",
                      "text": req["params"]["input"]["text"], "source": "dsh-memento", "sessionId": "s",
                      "reason": "[dsh-memento] add user/user-global\nx"}
            rid = request_id(req["id"])
            if rid is not ABSENT:
                params["requestId"] = rid
            await send({"jsonrpc": "2.0", "method": "approval/asked", "params": params})
        elif req["method"] == "approval/decided":
            await send({"jsonrpc": "2.0", "id": req["id"], "result": {}})
            add = adds.pop(req["params"]["id"])
            if req["params"]["outcome"] == ALLOWED_ONCE:
                await send({"jsonrpc": "2.0", "id": add["id"], "result": {
                    "entry": entry_json(add["params"]["input"]["text"]),
                    "usage": {"track": "user", "scope": "user-global", "used": 1, "limit": 2000}}})
            else:
                await send({"jsonrpc": "2.0", "id": add["id"], "error": {
                    "code": -32014, "message": "write denied: rejected",
                    "data": {"code": "WRITE_DENIED", "details": {"outcome": "rejected"}}}})
        else:
            await send({"jsonrpc": "2.0", "id": req["id"], "result": {}})
        return True

    return handle


ABSENT = object()
WRITE = {"agent": {"session": {"id": "s", "header": {"cwd": "/home/u/proj"}}}}


async def test_two_argument_handler_gets_the_asking_call(tmp_path: Path) -> None:
    seen: list[tuple[Any, mc.ApprovalCall | None]] = []

    async def handler(asked: mc.types.ApprovalAsked, call: mc.ApprovalCall | None) -> str:
        seen.append((asked, call))
        return ALLOWED_ONCE

    async with fake_server(tmp_path, asking_server(lambda rid: rid)) as path, \
            mc.connect(path, on_approval=handler, timeout=TIMEOUT) as c:
        async with anyio.create_task_group() as tg:  # two writes in flight: each ask names its own
            tg.start_soon(c.add, {"track": "user", "scope": "user-global", "text": "one"}, WRITE)
            tg.start_soon(c.add, {"track": "user", "scope": "user-global", "text": "two"}, WRITE)
    assert len(seen) == 2
    for asked, call in seen:
        assert call is not None and call.method == "memory/add"
        assert call.request_id == int(asked.id.removeprefix("ap-"))
        assert call.params == {"input": {"track": "user", "scope": "user-global", "text": asked.text},
                               "write": WRITE}


@pytest.mark.parametrize("request_id", [lambda rid: ABSENT, lambda rid: rid + 1000, lambda rid: None,
                                        lambda rid: "not-ours"], ids=["absent", "unknown", "null", "string"])
async def test_an_ask_that_names_no_call_of_ours_gets_none(tmp_path: Path, request_id: Callable[[Any], Any]) -> None:
    calls: list[mc.ApprovalCall | None] = []

    async def handler(asked: mc.types.ApprovalAsked, call: mc.ApprovalCall | None = None) -> bool:
        calls.append(call)
        return True

    async with fake_server(tmp_path, asking_server(request_id)) as path, \
            mc.connect(path, on_approval=handler, timeout=TIMEOUT) as c:
        res = await c.add({"track": "user", "scope": "user-global", "text": "x"}, WRITE)
        assert res.entry.text == "x"
    assert calls == [None]


async def test_one_argument_handlers_keep_working(tmp_path: Path) -> None:
    asked_texts: list[str] = []

    class Prompt:  # a callable object, as memoryctl's approver is
        def __call__(self, asked: mc.types.ApprovalAsked) -> str:
            asked_texts.append(asked.text)
            return "rejected"

    async with fake_server(tmp_path, asking_server(lambda rid: rid)) as path:
        async with mc.connect(path, on_approval=lambda asked: True, timeout=TIMEOUT) as c:
            assert (await c.add({"track": "user", "scope": "user-global", "text": "yes"}, WRITE)).entry.text == "yes"
        async with mc.connect(path, on_approval=Prompt(), timeout=TIMEOUT) as c:
            with pytest.raises(mc.WriteDenied):
                await c.add({"track": "user", "scope": "user-global", "text": "no"}, WRITE)
    assert asked_texts == ["no"]


def test_sync_two_argument_handler_runs_in_a_thread_with_the_call(tmp_path: Path) -> None:
    got: list[tuple[str, mc.ApprovalCall | None]] = []
    main = threading.get_ident()

    def handler(asked: Any, call: mc.ApprovalCall | None) -> str:
        assert threading.get_ident() != main
        got.append((asked.text, call))
        return ALLOWED_ONCE

    async def scenario() -> None:
        async with fake_server(tmp_path, asking_server(lambda rid: rid)) as path, \
                mc.connect(path, on_approval=handler, timeout=TIMEOUT) as c:
            await c.add({"track": "user", "scope": "user-global", "text": "threaded"}, WRITE)

    anyio.run(scenario)
    ((text, call),) = got
    assert text == "threaded" and call is not None and call.method == "memory/add"
    assert call.params["input"]["text"] == "threaded"


async def test_real_daemon_ask_names_the_call(ask_daemon: Any) -> None:
    calls: list[mc.ApprovalCall | None] = []

    async def handler(asked: Any, call: mc.ApprovalCall | None) -> str:
        calls.append(call)
        return ALLOWED_ONCE

    async with client(ask_daemon, session=A, on_approval=handler) as c:
        await c.add({"track": "user", "scope": "user-global", "text": "asked"})
    ((call,),) = [calls]
    assert call is not None and call.method == "memory/add"
    assert call.params["input"] == {"track": "user", "scope": "user-global", "text": "asked"}
