"""The RPC layer (memoryd.rpc) in the test process: parsing, dispatch, wire errors, the
request context, the handler binding check. Pure and fast: no daemon, no socket."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from typing import Any

import anyio
import msgspec
import pytest
from memoryd import rpc
from memoryd.app import method_handlers
from memoryd.approvals import Approvals
from memoryd.config import Config
from memoryd.context import RequestContext
from memoryd.mcp_host import McpFront
from memoryd.peers import PeerProcess
from memoryd.service import Service
from memoryd_protocol.errors import EntryNotFound, InvalidInput, RpcError, StoreUnavailable, WriteDenied
from memoryd_protocol.methods import METHODS
from memoryd_protocol.types import AddParams, ApprovalAsked, ApprovalOrigin, ConnectionInfo, QueryParams
from rawclient import write_ctx

pytestmark = pytest.mark.anyio


class FakePeer:
    def __init__(self) -> None:
        self.id = 7
        self.can_approve = True
        self.gone = False
        self.peer = None
        self.client = None
        self.notes: list[tuple[str, Any]] = []

    def listing(self, *, approver: bool) -> ConnectionInfo:
        return ConnectionInfo(id=self.id, transport="socket", pid=None, uid=None, exe=None, client=None,
                              approver=approver, opened_at=0)

    def describe(self) -> ApprovalOrigin | None:
        return None

    async def notify(self, method: str, params: object) -> None:
        self.notes.append((method, params))


def line(method: str, params: Any = None, id_: Any = 1) -> bytes:
    msg: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        msg["params"] = params
    if id_ is not None:
        msg["id"] = id_
    return json.dumps(msg).encode()


async def serve(dispatcher: rpc.Dispatcher, data: bytes, peer: Any = None, release: Any = None) -> Any:
    reply = await dispatcher.handle(peer or FakePeer(), rpc.parse(data), release)
    return None if reply is None else json.loads(reply)


def data_of(reply: dict[str, Any]) -> dict[str, Any]:
    data: dict[str, Any] = reply["error"]["data"]
    return data


ADD = {"input": {"track": "user", "scope": "user-global", "text": "x"}, "write": write_ctx()}


# --- parsing -------------------------------------------------------------------------------


def test_parse_keeps_params_raw_and_sorts_lines() -> None:
    call = rpc.parse(b'{"jsonrpc":"2.0","id":3,"method":"memory/add","params": {"a": [1, 2]} }')
    assert isinstance(call, rpc.Call) and call.method == "memory/add" and call.id == 3
    assert isinstance(call.params, msgspec.Raw) and bytes(call.params) == b'{"a": [1, 2]}'
    assert rpc.parse(b'{"jsonrpc":"2.0","method":"x"}').id is msgspec.UNSET  # a notification
    assert rpc.parse(b"{nope") is rpc.UNPARSABLE
    assert rpc.parse(b"[" * 100_000 + b"]" * 100_000) is rpc.UNPARSABLE  # too deep
    assert rpc.parse(b"NaN") is rpc.UNPARSABLE
    scalar = rpc.parse(b"5")
    assert isinstance(scalar, rpc.Call) and scalar.method is msgspec.UNSET
    batch = rpc.parse(b'[{"jsonrpc":"2.0","method":"a"}, 1]')
    assert isinstance(batch, list) and [c.method for c in batch] == ["a", msgspec.UNSET]


def test_a_lone_surrogate_reaches_the_params_through_the_lenient_parser() -> None:
    call = rpc.parse(b'{"jsonrpc":"2.0","id":"s","method":"proposals/dismiss","params":{"id":"\\ud800"}}')
    assert isinstance(call, rpc.Call) and call.params == {"id": "\ud800"}


def test_only_methods_that_never_park_are_served_inline() -> None:
    for name, m in METHODS.items():
        assert rpc.serves_inline(rpc.parse(line(name))) is not m.parks, name
    assert rpc.serves_inline(rpc.UNPARSABLE)
    assert not rpc.serves_inline(rpc.parse(line("no/such")))
    assert not rpc.serves_inline(rpc.parse(b"[" + line("memory/query") + b"]"))


# --- dispatch --------------------------------------------------------------------------------


async def test_a_request_gets_its_result_with_its_id_and_the_handler_its_context() -> None:
    seen: list[tuple[RequestContext, Any]] = []

    async def query(ctx: RequestContext, p: QueryParams) -> dict[str, int]:
        seen.append((ctx, p))
        await ctx.notify("memory/recalled", {"n": 1})
        return {"total": 0}

    peer = FakePeer()
    d = rpc.Dispatcher({"memory/query": query})
    raw = await d.handle(peer, rpc.parse(line("memory/query", {"filter": {"text": "a"}}, "q")))
    assert raw == b'{"jsonrpc":"2.0","id":"q","result":{"total":0}}'
    ctx, params = seen[0]
    assert (ctx.peer, ctx.id, ctx.release_turn) == (peer, "q", None)
    assert isinstance(params, QueryParams) and params.filter is not None and params.filter.text == "a"
    assert peer.notes == [("memory/recalled", {"n": 1})]
    # a notification runs and gets no reply; its context has no id
    assert await serve(d, line("memory/query", id_=None), peer) is None
    assert len(seen) == 2 and seen[1][0].id is None


async def test_unknown_methods_and_bad_requests_get_the_wire_errors() -> None:
    d = rpc.Dispatcher({})
    r = await serve(d, line("no/such", id_=4))
    assert r == {"jsonrpc": "2.0", "id": 4, "error": {"code": -32601, "message": "Method not found", "data": {
        "code": "METHOD_NOT_FOUND", "message": "Method not found", "details": {"method": "no/such"}}}}
    assert await serve(d, line("no/such", id_=None)) is None
    for bad, id_ in [(b'{"jsonrpc":"1.0","id":5,"method":"x"}', 5), (b'{"jsonrpc":"2.0","id":6,"method":7}', 6),
                     (b'{"jsonrpc":"2.0","id":7,"method":"x","params":3}', 7),
                     (b'{"jsonrpc":"2.0","id":true,"method":"x"}', None), (b'"x"', None)]:
        r = await serve(d, bad)
        assert r == {"jsonrpc": "2.0", "id": id_, "error": {"code": -32600, "message": "Invalid request", "data": {
            "code": "INVALID_REQUEST", "message": "Invalid request", "details": {}}}}, bad


async def test_params_are_decoded_by_the_method_and_checked_for_an_agent_first() -> None:
    calls: list[AddParams] = []

    async def add(ctx: RequestContext, p: AddParams) -> dict[str, Any]:
        calls.append(p)
        return {}

    d = rpc.Dispatcher({"memory/add": add})
    assert (await serve(d, line("memory/add", ADD)))["result"] == {}
    assert isinstance(calls[0], AddParams) and calls[0].input.text == "x"
    for params in [{"input": "garbage"}, {"input": ADD["input"], "write": None}, {"write": {"agent": None}},
                   {"input": ADD["input"], "write": {}}]:
        r = await serve(d, line("memory/add", params))
        assert (r["error"]["code"], data_of(r)["code"]) == (-32010, "WRITE_REQUIRES_AGENT"), params
    r = await serve(d, line("memory/add", {"input": {**ADD["input"], "track": 5}, "write": write_ctx()}))
    assert data_of(r)["code"] == "INVALID_INPUT" and data_of(r)["details"] == {"field": "input.track"}
    assert r["error"]["message"].startswith("invalid params: Expected `str`")
    r = await serve(d, line("memory/add", [1]))
    assert data_of(r)["code"] == "INVALID_INPUT"
    assert r["error"]["message"] == "params must be an object (by-name), not an array"
    assert len(calls) == 1


async def test_every_failure_becomes_one_wire_error(caplog: pytest.LogCaptureFixture) -> None:
    async def fails(ctx: RequestContext, p: Any) -> Any:
        raise failure

    d = rpc.Dispatcher({"memory/list": fails})
    failure: Exception = EntryNotFound("gone", {"entryId": "e"})
    assert (await serve(d, line("memory/list")))["error"] == EntryNotFound("gone", {"entryId": "e"}).to_wire()
    failure = UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed")
    r = await serve(d, line("memory/list"))
    assert (data_of(r)["code"], r["error"]["message"]) == ("INVALID_INPUT", "params contain a lone UTF-16 surrogate")
    failure = RuntimeError("secret memory text")
    with caplog.at_level(logging.ERROR, logger="memoryd.rpc"):
        r = await serve(d, line("memory/list"))
    assert r["error"] == {"code": -32603, "message": "Internal error",
                          "data": {"code": "INTERNAL_ERROR", "message": "Internal error", "details": {}}}
    assert "secret memory text" not in json.dumps(r)
    assert any(rec.exc_info and rec.exc_info[1] is failure for rec in caplog.records)


async def test_cancellation_is_not_turned_into_a_reply() -> None:
    async def waits(ctx: RequestContext, p: Any) -> Any:
        await anyio.sleep_forever()

    d = rpc.Dispatcher({"memory/list": waits})
    with anyio.move_on_after(0) as scope:
        await d.handle(FakePeer(), rpc.parse(line("memory/list")))
    assert scope.cancelled_caught


async def test_a_batch_is_answered_item_by_item_each_with_its_own_context() -> None:
    ids: list[Any] = []
    released: list[int] = []

    async def budgets(ctx: RequestContext, p: Any) -> list[int]:
        ids.append(ctx.id)
        ctx.park()
        return []

    d = rpc.Dispatcher({"memory/budgets": budgets}, max_batch_calls=4)
    batch = b"[" + b",".join([line("memory/budgets", id_="a"), b"1", line("memory/budgets", id_=None),
                             line("memory/budgets", id_="b")]) + b"]"
    r = await serve(d, batch, release=lambda: released.append(1))
    assert [x.get("id") for x in r] == ["a", None, "b"]
    assert r[0]["result"] == [] and r[1]["error"]["code"] == -32600 and r[2]["result"] == []
    assert sorted(ids, key=str) == sorted(["a", None, "b"], key=str) and released == [1, 1, 1]
    assert await serve(d, b"[" + line("memory/budgets", id_=None) + b"]") is None  # notifications only
    r = await serve(d, b"[]")
    assert (r["id"], r["error"]["message"]) == (None, "Invalid request: empty batch")
    ids.clear()
    r = await serve(d, b"[" + b",".join([line("memory/budgets")] * 5) + b"]")
    assert r["error"]["message"] == "Invalid request: a batch may hold at most 4 calls" and ids == []


async def library_reply(handlers: dict[str, Any], call: rpc.Call) -> dict[str, Any] | None:
    """jsonrpcserver's reply to ``call`` (its public ``async_dispatch_to_serializable``), with
    the table's methods as it calls them: the reference our dispatch is held to."""
    from jsonrpcserver import Error, Success, async_dispatch_to_serializable
    from memoryd.context import RequestContext as Ctx
    from memoryd_protocol.methods import METHODS

    def as_method(name: str, handler: Any) -> Any:
        decode = rpc.params_decoder(METHODS[name])

        async def call_(ctx: Ctx, params: Any, /) -> Any:
            try:
                result = await handler(ctx, decode(params))
            except Exception as exc:
                return Error(**rpc.error_object(exc, name))
            return Success(result)

        return call_

    request: dict[str, Any] = {"jsonrpc": "2.0", "method": call.method, "params": [call.params]}
    if call.id is not msgspec.UNSET:
        request["id"] = call.id
    reply = await async_dispatch_to_serializable(
        "", {n: as_method(n, h) for n, h in handlers.items()}, context=Ctx(FakePeer(), call.reply_id(), None),
        deserializer=lambda _: request, validator=lambda r: r)
    assert not isinstance(reply, list)
    if reply is None:
        return None
    error = reply.get("error")
    if error is None:
        return {"jsonrpc": "2.0", "id": reply["id"], "result": reply["result"]}
    if not isinstance(error.get("data"), dict):  # the library's own: only an unknown method gets one
        error = rpc.error_object(RpcError(-32601, "Method not found", {"method": call.method}))
    return {"jsonrpc": "2.0", "id": reply["id"], "error": error}


async def test_our_dispatch_answers_as_jsonrpcserver_does() -> None:
    """The table's methods go through our own dispatch (its cost per request, rpc.py); the
    library, which answers methods outside the table, gives the same reply to each kind of
    request: a result, each kind of failure, every kind of id, a notification."""
    async def ok(ctx: RequestContext, p: Any) -> Any:
        return {"id": ctx.id, "list": [1, "ä"]}

    async def fails(ctx: RequestContext, p: Any) -> Any:
        raise failure

    handlers = {"memory/budgets": ok, "memory/list": fails, "memory/add": ok}
    d = rpc.Dispatcher(handlers)
    failure: Exception = EntryNotFound("gone", {"entryId": "e"})
    cases = [*(line("memory/budgets", id_=i) for i in (1, "s", 2.5, 0, -3)), line("nope/x", id_=10)]
    cases += [b'{"jsonrpc":"2.0","id":null,"method":"memory/budgets"}', line("memory/budgets", id_=None),
              line("memory/budgets", {}, 4), line("memory/add", ADD, 5), line("memory/add", {"input": "x"}, 6),
              line("memory/add", [1], 7),
              line("memory/add", {"input": {**ADD["input"], "track": 5}, "write": write_ctx()}, 8)]
    for each in (EntryNotFound("gone", {"entryId": "e"}), RuntimeError("boom"),
                 UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed")):
        failure = each
        cases += [line("memory/list", id_=9), line("memory/list", id_=None)]
        for data in cases:
            call = rpc.parse(data)
            assert isinstance(call, rpc.Call)
            library = await library_reply(handlers, call)
            assert await d.handle(FakePeer(), call) == (None if library is None else rpc.encode(library)), data
        del cases[-2:]


def run_alone(script: str) -> None:
    """``script`` in a fresh interpreter, which has imported nothing yet; it must pass."""
    r = subprocess.run([sys.executable, "-W", "ignore::DeprecationWarning", "-c", script],
                       capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stderr) == (0, "")


def test_the_daemon_never_imports_jsonrpcserver() -> None:
    """A start, the table's methods and a method outside it do without it (its import, with
    jsonschema, is a quarter of a standalone start); the unknown method gets -32601."""
    script = (
        "import asyncio, sys\n"
        "from memoryd import rpc\n"
        "from memoryd.app import method_handlers\n"
        "async def ok(ctx, p): return 1\n"
        "d = rpc.Dispatcher({'memory/budgets': ok})\n"
        "asyncio.run(d.handle(None, rpc.parse(b'{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"memory/budgets\"}')))\n"
        "r = asyncio.run(d.handle(None, rpc.parse(b'{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"nope/x\"}')))\n"
        "assert b'-32601' in r and 'jsonrpcserver' not in sys.modules, r\n"
    )
    run_alone(script)


async def test_a_line_that_fails_outside_any_method_costs_only_its_reply() -> None:
    assert rpc.failure_line(rpc.parse(line("x", id_=None)), RuntimeError()) is None
    r = json.loads(rpc.failure_line(rpc.parse(line("x", id_=9)), RuntimeError()) or b"")
    assert (r["id"], r["error"]["code"]) == (9, -32603)


# --- the handler binding -----------------------------------------------------------------------


async def _noop(ctx: RequestContext, p: Any) -> None:
    return None


def test_bind_handlers_wants_exactly_one_handler_per_method_of_the_table() -> None:
    every = {name: _noop for name in METHODS}
    assert list(rpc.bind_handlers(every)) == list(METHODS)
    half = len(METHODS) // 2
    names = list(METHODS)
    assert list(rpc.bind_handlers(dict.fromkeys(names[:half], _noop), dict.fromkeys(names[half:], _noop))) == names
    with pytest.raises(ValueError, match=r"^methods without a handler: memory/add, audit/explain$"):
        rpc.bind_handlers({n: _noop for n in names if n not in ("memory/add", "audit/explain")})
    with pytest.raises(ValueError, match=r"^methods with two handlers: initialize$"):
        rpc.bind_handlers(every, {"initialize": _noop})
    with pytest.raises(ValueError, match=r"^handlers for methods outside the table: memory/teleport$"):
        rpc.bind_handlers(every, {"memory/teleport": _noop})
    with pytest.raises(ValueError, match="outside the table: memory/teleport"):
        rpc.Dispatcher({"memory/teleport": _noop})


def test_the_daemon_binds_a_handler_to_every_method() -> None:
    service = Service(Config(), None, None, Approvals())  # type: ignore[arg-type]
    handlers = method_handlers(service, {}, McpFront(service))
    assert list(handlers) == list(METHODS)
    assert handlers["memory/add"].__qualname__ == "Writes.add"  # type: ignore[attr-defined]
    assert handlers["daemon/status"] == service.status


# --- the context reaches the approval gate ------------------------------------------------------


async def test_an_approval_parks_the_request_and_names_its_id_to_its_own_connection() -> None:
    approvals = Approvals()
    peer = FakePeer()
    peer.peer = PeerProcess.of(os.getpid())  # a decision counts only from a process memoryd sees
    released: list[bool] = []
    ctx = RequestContext(peer, "w-1", lambda: released.append(True))  # type: ignore[arg-type]
    asked = ApprovalAsked(id="ap", action="add", track="user", scope="user-global", text="x", source="s",
                          session_id=None, reason="r")
    result: list[str | None] = []

    async def ask() -> None:
        p = await approvals.ask(ctx, asked, 5, lambda _: None)
        result.append(p.outcome)

    async with anyio.create_task_group() as tg:
        tg.start_soon(ask)
        await anyio.wait_all_tasks_blocked()
        assert released == [True]
        ((method, note),) = peer.notes
        assert method == "approval/asked" and note.request_id == "w-1"
        approvals.decide(peer, "ap", "allowed-once")
    assert result == ["allowed-once"]


ODD_IDS: list[Any] = [1.0, -0.0, 10**30, "", "ä", "\ud800", None]


async def test_our_dispatch_answers_as_jsonrpcserver_does_for_odd_ids_params_and_results() -> None:
    """Beyond the cases above: odd ids (a float that is whole, -0.0, an integer beyond 64
    bits, the empty string, non-ASCII, a lone surrogate, null) on every kind of outcome,
    params as an array or an empty object where an input is required, a result of null,
    each protocol error with its details, and an explicit id null on a failing method."""
    async def ok(ctx: RequestContext, p: Any) -> Any:
        return None

    async def fails(ctx: RequestContext, p: Any) -> Any:
        raise failure

    handlers = {"memory/budgets": ok, "memory/list": fails, "memory/add": ok}
    d = rpc.Dispatcher(handlers)
    failure: Exception = EntryNotFound("gone", {"entryId": "e"})
    cases: list[bytes] = []
    for i in ODD_IDS:
        cases += [line("memory/budgets", id_=i), line("memory/add", [ADD], i), line("memory/add", {}, i),
                  line("memory/add", {**ADD, "extra": 1}, i)]
        cases.append(json.dumps({"jsonrpc": "2.0", "id": i, "method": "memory/list"}).encode())
    for each in (InvalidInput("bad", "input.text"), WriteDenied("write denied: rejected", {"outcome": "rejected"}),
                 StoreUnavailable("the store is busy", {"reason": "busy", "path": "/x"}), RuntimeError("boom")):
        failure = each
        for data in cases:
            call = rpc.parse(data)
            assert isinstance(call, rpc.Call)
            library = await library_reply(handlers, call)
            assert await d.handle(FakePeer(), call) == (None if library is None else rpc.encode(library)), data
        # In a batch, each item is answered as it would be alone (the library's reply to it).
        batch = rpc.parse(b"[" + b",".join(cases) + b"]")
        assert isinstance(batch, list)
        alone = [await library_reply(handlers, c) for c in batch]
        assert await d.handle(FakePeer(), batch) == rpc.encode([r for r in alone if r is not None])


def test_methods_outside_the_table_in_a_batch_get_their_own_errors() -> None:
    """Methods outside the table inside a batch, twice, between the table's methods (each
    item in a task of its own): each gets its -32601 with its own id, the others their
    results, in order."""
    script = (
        "import asyncio, json, sys\n"
        "from memoryd import rpc\n"
        "async def ok(ctx, p): return ctx.id\n"
        "d = rpc.Dispatcher({'memory/budgets': ok})\n"
        "line = b'[' + b','.join(json.dumps({'jsonrpc': '2.0', 'id': i, 'method': m}).encode() for i, m in\n"
        "    [(1, 'memory/budgets'), (2, 'nope/x'), (3, 'memory/budgets'), (4, 'nope/y')]) + b']'\n"
        "r = json.loads(asyncio.run(d.handle(None, rpc.parse(line))))\n"
        "assert [x['id'] for x in r] == [1, 2, 3, 4], r\n"
        "assert [x.get('result') for x in r] == [1, None, 3, None], r\n"
        "assert [x['error']['code'] for x in r if 'error' in x] == [-32601, -32601], r\n"
        "assert [x['error']['data']['details'] for x in r if 'error' in x] == [{'method': 'nope/x'}, {'method': 'nope/y'}]\n"
    )
    run_alone(script)
