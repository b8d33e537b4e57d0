"""One MCP session inside the daemon, served by the official SDK's low-level ``Server``.

Where a request's work runs:

- the connection's bytes are framed here (``_read``) and handed to the SDK's server loop,
  which serves both eras (the 2025-11-25 handshake, the 2026-07-28 per-request envelope);
- a ``tools/call`` becomes one call of the daemon's own method handler (``_call``), in a
  task of this session's, so a write parked on an approval outlives the SDK's request when
  the 2026-07-28 era answers it on a retry;
- the SDK's replies go out through the connection (``_write``), never waiting on a peer
  that does not read beyond the connection's output cap.

The server's ``instructions``, the resource ``memory://snapshot`` and the prompt
``memory-snapshot`` are the session's frozen snapshot, taken once, at its first request.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
from collections.abc import AsyncIterator
from typing import Any

import anyio
import mcp_types as types
import msgspec
from mcp.server import NotificationOptions, Server, ServerRequestContext
from mcp.server.request_state import RequestStateBoundary, RequestStateSecurity
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ResourceUpdated
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from memoryd_protocol.approval_text import approval_request
from memoryd_protocol.errors import InvalidInput, ProtocolError
from memoryd_protocol.framing import OVERSIZE, Framer
from memoryd_protocol.mcp_tools import BY_NAME, TOOLS, McpTool
from memoryd_protocol.mcp_wire import McpAttachParams
from memoryd_protocol.types import ApprovalAsked, ApprovalBy, ClientInfo, Session, SnapshotParams

from .. import __version__
from ..connection import Connection
from ..context import RequestContext
from . import McpFront
from .calls import McpCalls, error_result
from .peer import Call, McpPeer

log = logging.getLogger("memoryd.mcp")

#: Requests of one session read and not yet answered; the session stops reading beyond it.
MAX_INFLIGHT = 256
#: Resource-update streams (subscriptions/listen) one session may hold open.
MAX_LISTENS = 8

SNAPSHOT_URI = "memory://snapshot"
BUDGETS_URI = "memory://budgets"
ENTRIES_URI = "memory://entries"
#: the resources that change with every write (the snapshot is frozen)
LIVE_URIS = (ENTRIES_URI, BUDGETS_URI)
SNAPSHOT_PROMPT = "memory-snapshot"

#: The elicitation form: nothing to fill in, the host's accept or decline is the answer.
APPROVE_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}
#: What the ledger records of an elicitation's answer: the host's claim that a human gave it.
BY_ELICITATION = ApprovalBy(kind="human", name="mcp-elicitation")
ELICITATION_FAILED = ApprovalBy(kind="policy", name="memoryd mcp: the host's elicitation failed")
OUTCOMES = {"accept": "allowed-once", "decline": "rejected"}

_PARSE_ERROR = b'{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error"}}'
_INVALID = b'{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Invalid request: not a JSON-RPC 2.0 message"}}'
_OVERSIZE = (b'{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Invalid request: '
             b'the message is longer than max_message_bytes"}}')


def _refusal(line: bytes) -> bytes:
    """The error for a line that is no JSON-RPC message: a parse error, or an invalid
    request answered with its id when a request's id can be read (JSON-RPC 2.0 §5)."""
    try:
        obj = msgspec.json.decode(line)
    except msgspec.DecodeError:
        return _PARSE_ERROR
    id_ = obj.get("id") if isinstance(obj, dict) and "method" in obj else None
    if isinstance(id_, bool) or not isinstance(id_, str | int):
        return _INVALID
    return msgspec.json.encode({"jsonrpc": "2.0", "id": id_, "error": {
        "code": types.INVALID_REQUEST, "message": "Invalid request: not a JSON-RPC 2.0 request"}})


def host_agent(name: str | None) -> str | None:
    """The agent layer a host's ``clientInfo.name`` gives: lower case, words joined by
    ``-``, without a trailing ``mcp-client``/``mcp`` (``Claude Code`` → ``claude-code``,
    ``codex-mcp-client`` → ``codex``)."""
    if not name:
        return None
    key = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    key = re.sub(r"(-mcp)?(-client)?$", "", key).strip("-")
    return key[:64].strip("-") or None


def _declares_elicitation(ctx: ServerRequestContext[Any, Any]) -> bool:
    caps = ctx.session.client_capabilities
    e = caps.elicitation if caps is not None else None
    return e is not None and (e.form is not None or e.url is None)


class McpSession:
    def __init__(self, front: McpFront, conn: Connection, session_id: str, p: McpAttachParams) -> None:
        self.service = front.service
        self.conn = conn
        config = self.service.config
        self.peer = McpPeer(conn, config.mcp_approvals == "elicitation", self._changed, self._asked, self._resolved)
        self.calls = McpCalls(front.methods, self.peer, session_id, p.cwd)
        self._agent_arg = p.agent
        self._keys = itertools.count(1)
        #: daemon work of this session not finished yet (awaited, never cancelled, at the end)
        self._tasks: set[asyncio.Task[Any]] = set()
        #: 2026-07-28: writes waiting for the host's retry with the answer, by approval id
        self._parked: dict[str, asyncio.Task[types.CallToolResult]] = {}
        #: 2025-11-25: elicitations in flight, by approval id
        self._elicitations: dict[str, asyncio.Task[None]] = {}
        self._snapshot: str | None = None
        self._snapshot_lock = anyio.Lock()
        self._subscribed: set[str] = set()
        self._legacy: Any = None  # the 2025-11-25 ServerSession that subscribed
        self._dirty = asyncio.Event()
        self._bus = InMemorySubscriptionBus()
        self._inflight = 0
        self._room = asyncio.Event()
        self.server: Server[Any] = Server(
            "memoryd", version=__version__, title="memoryd: bounded, approval-gated, audited memory",
            on_list_tools=self._list_tools, on_call_tool=self._call_tool,
            on_list_resources=self._list_resources, on_read_resource=self._read_resource,
            on_subscribe_resource=self._subscribe, on_unsubscribe_resource=self._unsubscribe,
            on_subscriptions_listen=ListenHandler(self._bus, max_subscriptions=MAX_LISTENS, max_buffered_events=64),
            on_list_prompts=self._list_prompts, on_get_prompt=self._get_prompt,
        )
        self.server.middleware.append(self._identify)
        # The 2026-07-28 retry's requestState is sealed to this session, the tool and its
        # arguments; the write it answers is looked up by it, once (``_answered``).
        security = RequestStateSecurity.ephemeral(ttl=config.approval_timeout_s + 60)
        self.server.middleware.append(RequestStateBoundary(security, default_audience=f"memoryd/{session_id}"))
        self.init_options = self.server.create_initialization_options(NotificationOptions())
        self._tools = [self._tool(t) for t in TOOLS]

    # --- identity and the frozen snapshot ----------------------------------------------

    async def _identify(self, ctx: ServerRequestContext[Any, Any], call_next: Any) -> Any:
        """The session's agent layer is fixed by the first request that names the host;
        the snapshot is taken at the session's start: its handshake, else its first request.
        (A 2026-07-28 host may discover on another process and send this one none: the
        TypeScript SDK's stdio client probes ``server/discover`` on a short-lived sibling.)"""
        if self.calls.agent is None:
            client = self._client_of(ctx)
            if client is not None or ctx.method != "initialize":
                if client is not None:
                    self.peer.name_client(client)
                agent = self._agent_arg if self._agent_arg is not None else host_agent(client.name if client else None)
                self._fix_agent(agent if agent is not None else "mcp")
                log.debug("mcp session %s: workspace %r, agent %r, host %r", self.calls.session_id,
                          self.calls.cwd, self.calls.agent, client and client.name)
        if ctx.method in ("initialize", "server/discover"):
            text = await self._instructions()
            self.init_options.instructions = text
            self.server.instructions = text
        elif self._snapshot is None:
            await self._instructions()
        return await call_next(ctx)

    def _fix_agent(self, agent: str) -> None:
        """The session's identity is complete: from now on it hears of every change, by
        anyone, of an entry it sees (its resources' updates)."""
        self.calls.fix_agent(agent)
        self.service.watchers.watch(self.peer, self.calls.view)

    @staticmethod
    def _client_of(ctx: ServerRequestContext[Any, Any]) -> ClientInfo | None:
        info: Any = None
        cp = ctx.session.client_params
        if cp is not None:
            info = {"name": cp.client_info.name, "version": cp.client_info.version}
        elif ctx.method == "initialize" and ctx.params is not None:
            info = ctx.params.get("clientInfo")
        if not isinstance(info, dict):
            return None
        name, version = info.get("name"), info.get("version")
        if not isinstance(name, str):
            return None
        # the host's claim, as a connection's initialize names itself: bounded
        return ClientInfo(name=name[:128], version=version[:64] if isinstance(version, str) else None)

    async def snapshot(self) -> str:
        async with self._snapshot_lock:
            if self._snapshot is None:
                if self.calls.agent is None:
                    self._fix_agent(self._agent_arg if self._agent_arg is not None else "mcp")
                params = SnapshotParams(session=Session(id=self.calls.session_id, header=self.calls.header()))
                result = await self.calls.methods["memory/snapshot"](RequestContext(self.peer), params)
                self._snapshot = result.text
            return self._snapshot

    async def _instructions(self) -> str | None:
        try:
            return await self.snapshot()
        except ProtocolError as exc:
            log.warning("mcp session %s: no snapshot for the instructions: %s", self.calls.session_id, exc.code)
            return None

    # --- tools ---------------------------------------------------------------------------

    @staticmethod
    def _tool(t: McpTool) -> types.Tool:
        from memoryd_protocol.mcp_tools import input_schema, output_schema

        return types.Tool(
            name=t.name, title=t.title, description=t.description, input_schema=input_schema(t),
            output_schema=output_schema(t),
            annotations=types.ToolAnnotations(title=t.title, read_only_hint=t.read_only,
                                              destructive_hint=t.destructive if not t.read_only else None,
                                              idempotent_hint=t.read_only or None, open_world_hint=False))

    async def _list_tools(self, ctx: ServerRequestContext[Any, Any], params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=self._tools)

    async def _call_tool(self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
                         ) -> types.CallToolResult | types.InputRequiredResult:
        tool = BY_NAME.get(params.name)
        if tool is None:
            raise MCPError(types.INVALID_PARAMS, f"unknown tool {params.name[:64]!r}; tools/list names memoryd's tools")
        if not _declares_elicitation(ctx):
            self.peer.can_approve = False  # one-way: see McpPeer
        if params.request_state is not None:
            return await self._answered(params)
        try:
            wire = self.calls.params(tool, params.arguments)
        except ProtocolError as exc:
            return error_result(exc)
        call = Call(ctx, ctx.protocol_version in MODERN_PROTOCOL_VERSIONS)
        key = next(self._keys)
        self.peer.calls[key] = call
        task = self._start(self.calls.call(tool, wire, key))
        try:
            if call.modern:
                asked = asyncio.ensure_future(call.was_asked.wait())
                try:
                    await asyncio.wait({task, asked}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    asked.cancel()
                if not task.done() and call.asked is not None:
                    return self._ask_on_retry(call.asked, task)
            # shielded: the SDK cancelling its request must not cancel the daemon's work
            return await asyncio.shield(task)
        finally:
            self.peer.calls.pop(key, None)

    def _start(self, work: Any) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # --- approvals -------------------------------------------------------------------------

    def _asked(self, call: Call, asked: ApprovalAsked) -> None:
        if call.modern:
            call.asked = asked
            call.was_asked.set()
        else:
            self._elicitations[asked.id] = self._start(self._elicit(call, asked))

    def _resolved(self, approval_id: str) -> None:
        """Decided elsewhere (a timeout, shutdown): the host's dialog is withdrawn."""
        task = self._elicitations.pop(approval_id, None)
        if task is not None:
            task.cancel()

    async def _elicit(self, call: Call, asked: ApprovalAsked) -> None:
        """2025-11-25: ask the host's user with ``elicitation/create``, the complete change as
        the message, and decide with the answer."""
        try:
            answer = await call.mcp.session.elicit_form(approval_request(asked), APPROVE_SCHEMA,
                                                        related_request_id=call.mcp.request_id)
        except Exception as exc:  # the host refused or failed: nobody answered
            log.info("mcp session %s: the host's elicitation failed (%s); denying", self.calls.session_id,
                     type(exc).__name__)
            self._decide(asked.id, "unavailable", ELICITATION_FAILED)
        else:
            self._decide(asked.id, OUTCOMES.get(answer.action, "cancelled"), BY_ELICITATION)
        finally:
            self._elicitations.pop(asked.id, None)

    def _ask_on_retry(self, asked: ApprovalAsked, task: asyncio.Task[types.CallToolResult]
                      ) -> types.InputRequiredResult:
        """2026-07-28: the question goes back as an input-required result; the write stays
        parked in the gate until the host retries with the answer (or the approval times out)."""
        self._parked[asked.id] = task
        task.add_done_callback(lambda _t: self._parked.pop(asked.id, None))
        form = types.ElicitRequestFormParams(message=approval_request(asked), requested_schema=APPROVE_SCHEMA)
        return types.InputRequiredResult(input_requests={"approval": types.ElicitRequest(params=form)},
                                         request_state=asked.id)

    async def _answered(self, params: types.CallToolRequestParams) -> types.CallToolResult:
        """The retry: its requestState (sealed by RequestStateBoundary to this tool and
        these arguments) names the parked write; each answers it once."""
        approval_id = params.request_state or ""
        task = self._parked.pop(approval_id, None)
        if task is None:
            return error_result(InvalidInput("this approval was answered already, or it expired: call the tool "
                                             "again to ask anew", "requestState"))
        answer = (params.input_responses or {}).get("approval")
        outcome = OUTCOMES.get(answer.action, "cancelled") if isinstance(answer, types.ElicitResult) else "cancelled"
        self._decide(approval_id, outcome, BY_ELICITATION)
        return await asyncio.shield(task)

    def _decide(self, approval_id: str, outcome: str, by: ApprovalBy) -> None:
        try:
            self.service.approvals.decide(self.peer, approval_id, outcome, by)
        except InvalidInput:
            pass  # decided already (it timed out, or the daemon is stopping)

    # --- resources and the prompt -------------------------------------------------------

    async def _list_resources(self, ctx: ServerRequestContext[Any, Any], params: Any) -> types.ListResourcesResult:
        return types.ListResourcesResult(resources=[
            types.Resource(uri=SNAPSHOT_URI, name="snapshot", title="Frozen memory snapshot", mime_type="text/markdown",
                           description="This session's memory as it was when the session began (the server's "
                           "instructions); frozen for the session's life."),
            types.Resource(uri=BUDGETS_URI, name="budgets", title="Memory budgets", mime_type="application/json",
                           description="Used and limit, in characters, per track and scope: live."),
            types.Resource(uri=ENTRIES_URI, name="entries", title="Visible memory entries",
                           mime_type="application/json",
                           description="Every entry this session can see, in creation order: live."),
        ])

    async def _read_resource(self, ctx: ServerRequestContext[Any, Any], params: types.ReadResourceRequestParams
                             ) -> types.ReadResourceResult:
        uri = str(params.uri)
        try:
            if uri == SNAPSHOT_URI:
                text, mime = await self.snapshot(), "text/markdown"
            elif uri == BUDGETS_URI:
                text, mime = msgspec.json.encode(await self.calls.budgets()).decode(), "application/json"
            elif uri == ENTRIES_URI:
                text, mime = msgspec.json.encode(await self.calls.visible()).decode(), "application/json"
            else:
                raise MCPError(types.INVALID_PARAMS, f"no resource {uri[:128]!r}; resources/list names them")
        except ProtocolError as exc:
            raise MCPError(types.INTERNAL_ERROR, f"{exc.code}: {exc.message}") from None
        return types.ReadResourceResult(contents=[types.TextResourceContents(uri=uri, mime_type=mime, text=text)])

    async def _subscribe(self, ctx: ServerRequestContext[Any, Any], params: types.SubscribeRequestParams
                         ) -> types.EmptyResult:
        uri = str(params.uri)
        if uri not in (SNAPSHOT_URI, *LIVE_URIS):
            raise MCPError(types.INVALID_PARAMS, f"no resource {uri[:128]!r}; resources/list names them")
        self._subscribed.add(uri)
        self._legacy = ctx.session
        return types.EmptyResult()

    async def _unsubscribe(self, ctx: ServerRequestContext[Any, Any], params: types.UnsubscribeRequestParams
                           ) -> types.EmptyResult:
        self._subscribed.discard(str(params.uri))
        return types.EmptyResult()

    async def _list_prompts(self, ctx: ServerRequestContext[Any, Any], params: Any) -> types.ListPromptsResult:
        return types.ListPromptsResult(prompts=[types.Prompt(
            name=SNAPSHOT_PROMPT, title="Memory snapshot",
            description="This session's frozen memory snapshot, to put into the conversation.")])

    async def _get_prompt(self, ctx: ServerRequestContext[Any, Any], params: types.GetPromptRequestParams
                          ) -> types.GetPromptResult:
        if params.name != SNAPSHOT_PROMPT:
            raise MCPError(types.INVALID_PARAMS, f"no prompt {params.name[:64]!r}; prompts/list names them")
        try:
            text = await self.snapshot()
        except ProtocolError as exc:
            raise MCPError(types.INTERNAL_ERROR, f"{exc.code}: {exc.message}") from None
        return types.GetPromptResult(description="memoryd's frozen memory snapshot for this session", messages=[
            types.PromptMessage(role="user", content=types.TextContent(text=text))])

    def _changed(self) -> None:
        self._dirty.set()

    async def _notify_changes(self) -> None:
        """One update per resource for each burst of changes: a writer never waits here."""
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            for uri in LIVE_URIS:
                if uri in self._subscribed and self._legacy is not None:
                    try:
                        await self._legacy.send_resource_updated(uri)
                    except Exception as exc:  # the host is gone: the session ends on its own
                        log.debug("mcp session %s: resource update not sent: %s", self.calls.session_id, exc)
                await self._bus.publish(ResourceUpdated(uri=uri))

    # --- the connection ------------------------------------------------------------------

    async def run(self, lines: list[bytes], framer: Framer, source: AsyncIterator[bytes]) -> None:
        read_send, read_recv = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        write_send, write_recv = anyio.create_memory_object_stream[SessionMessage](64)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._notify_changes)
                tg.start_soon(self._read, read_send, lines, framer, source)
                writer = anyio.Event()
                tg.start_soon(self._write, write_recv, writer)
                async with write_send:
                    await self.server.run(read_recv, write_send, self.init_options)
                await writer.wait()
                tg.cancel_scope.cancel()
        finally:
            self._end()
            if self._tasks:
                with anyio.CancelScope(shield=True):
                    await asyncio.wait(set(self._tasks))

    def _end(self) -> None:
        self.peer.gone = True
        self.service.watchers.drop(self.peer)
        # Writes waiting for this host's answer are denied "unavailable", as for a closed
        # connection.
        self.service.approvals.connection_closed(self.peer)

    async def _read(self, send: Any, lines: list[bytes], framer: Framer, source: AsyncIterator[bytes]) -> None:
        try:
            async with send:
                for line in lines:
                    await self._take(send, line)
                while True:
                    chunk = await anext(source, None)
                    for line in framer.end() if chunk is None else framer.feed(chunk):
                        await self._take(send, line)
                    if chunk is None:
                        break
                # EOF (the host closed its end, or the daemon stops reading): what was read
                # is answered before the server loop ends, as on the socket; writes still
                # waiting for this host's answer are denied first.
                self._end()
                while self._inflight:
                    self._room.clear()
                    await self._room.wait()
        except OSError as exc:
            log.debug("mcp session %s: read failed: %s", self.calls.session_id, exc)
        finally:
            self._end()

    async def _take(self, send: Any, line: bytes) -> None:
        if line is OVERSIZE:
            await self.conn.send_line(_OVERSIZE)
            return
        try:
            message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
        except ValueError:
            await self.conn.send_line(_refusal(line))
            return
        if isinstance(message, types.JSONRPCRequest):
            while self._inflight >= MAX_INFLIGHT:
                self._room.clear()
                await self._room.wait()
            self._inflight += 1
        await send.send(SessionMessage(message))

    async def _write(self, recv: Any, done: anyio.Event) -> None:
        try:
            async with recv:
                async for item in recv:
                    message = item.message
                    if isinstance(message, types.JSONRPCResponse | types.JSONRPCError) and message.id is not None:
                        self._inflight = max(self._inflight - 1, 0)
                        self._room.set()
                    await self.conn.send_line(message.model_dump_json(by_alias=True, exclude_unset=True).encode())
        finally:
            done.set()


async def serve(front: McpFront, conn: Connection, session_id: str, p: McpAttachParams, lines: list[bytes],
                framer: Framer, source: AsyncIterator[bytes]) -> None:
    await McpSession(front, conn, session_id, p).run(lines, framer, source)
