"""One MCP session inside the daemon, served by the official SDK's low-level ``Server``,
which serves both eras (2025-11-25, 2026-07-28) over :class:`~memoryd.mcp_host.wire.Wire`.

A ``tools/call`` runs the daemon's own method handler in a task of this session's, so a
write parked on an approval outlives the SDK's request when the 2026-07-28 era answers it
on a retry. The ``instructions``, the resource ``memory://snapshot`` and the prompt
``memory-snapshot`` are the session's frozen snapshot, taken once, at its first request.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import re
from typing import Any, Final

import anyio
import mcp_types as types
import msgspec
from mcp.server import NotificationOptions, Server, ServerRequestContext
from mcp.server.request_state import RequestStateBoundary, RequestStateSecurity
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ResourceUpdated
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from memoryd_protocol.approval_text import approval_request
from memoryd_protocol.errors import InvalidInput, ProtocolError
from memoryd_protocol.mcp_tools import BY_NAME, TOOLS, McpTool, input_schema, output_schema
from memoryd_protocol.mcp_wire import McpAttachParams
from memoryd_protocol.types import ApprovalAsked, ApprovalBy, ClientInfo, Session, SnapshotParams

from .. import __version__
from ..connection import Connection
from ..context import RequestContext
from ..transports import Lines
from . import McpFront
from .calls import McpCalls, ToolResult, error_result
from .peer import Call, McpPeer
from .wire import MAX_INFLIGHT, Wire

log = logging.getLogger("memoryd.mcp")

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

def host_source(name: str | None) -> str | None:
    """The host a ``clientInfo.name`` names, as a write's source: lower case, words joined
    by ``-``, without a trailing ``mcp-client``/``mcp`` (``Claude Code`` → ``claude-code``,
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


def _tool(t: McpTool) -> types.Tool:
    return types.Tool(
        name=t.name, title=t.title, description=t.description, input_schema=input_schema(t),
        output_schema=output_schema(t),
        annotations=types.ToolAnnotations(title=t.title, read_only_hint=t.read_only,
                                          destructive_hint=t.destructive if not t.read_only else None,
                                          idempotent_hint=t.read_only or None, open_world_hint=False))


#: ``tools/list``'s result, the same for every session: made once, at import (on a thread).
_TOOLS_LISTED: Final = types.ListToolsResult(tools=[_tool(t) for t in TOOLS]).model_dump(
    by_alias=True, mode="json", exclude_none=True)


@functools.cache
def _security(ttl: float) -> RequestStateSecurity:
    """One key per daemon (and approval timeout): each session's tokens name its own
    audience, so one session's requestState never opens another's."""
    return RequestStateSecurity.ephemeral(ttl=ttl)


class McpSession:
    def __init__(self, front: McpFront, conn: Connection, session_id: str, p: McpAttachParams) -> None:
        self.service = front.service
        self.conn = conn
        config = self.service.config
        #: set by every change to what the live resources show; ``_notify_changes`` sends them
        self._dirty = asyncio.Event()
        self.peer = McpPeer(conn, config.mcp_approvals == "elicitation", self._dirty.set, self._asked, self._resolved)
        self.calls = McpCalls(front.methods, self.peer, session_id, p.cwd, config.workspace_aliases)
        self._agent_arg = p.agent
        self._keys = itertools.count(1)
        #: daemon work of this session not finished yet (awaited, never cancelled, at the end)
        self._tasks: set[asyncio.Task[Any]] = set()
        #: 2026-07-28: writes waiting for the host's retry with the answer, by approval id
        self._parked: dict[str, asyncio.Task[ToolResult]] = {}
        #: 2025-11-25: elicitations in flight, by approval id
        self._elicitations: dict[str, asyncio.Task[None]] = {}
        self._snapshot: str | None = None
        self._snapshot_lock = anyio.Lock()
        self._subscribed: set[str] = set()
        self._legacy: Any = None  # the 2025-11-25 ServerSession that subscribed
        #: the snapshot was tried at the session's start (a failed one is tried again only
        #: when asked for: a handshake, the resource, the prompt)
        self._snapshot_tried = False
        self._bus = InMemorySubscriptionBus()
        self.server: Server[Any] = Server(
            "memoryd", version=__version__, title="memoryd: bounded, approval-gated, audited memory",
            on_list_resources=self._list_resources, on_read_resource=self._read_resource,
            on_subscribe_resource=self._subscribe, on_unsubscribe_resource=self._unsubscribe,
            on_subscriptions_listen=ListenHandler(self._bus, max_subscriptions=MAX_LISTENS, max_buffered_events=64),
            on_list_prompts=self._list_prompts, on_get_prompt=self._get_prompt,
        )
        # Results in wire form (calls.ToolResult): the handler's own types are the SDK's.
        self.server.add_request_handler("tools/list", types.PaginatedRequestParams, self._list_tools)
        self.server.add_request_handler("tools/call", types.CallToolRequestParams, self._call_tool)
        # memoryd sends no telemetry: the SDK's default middleware (OpenTelemetry) goes.
        self.server.middleware.clear()
        self.server.middleware.append(self._identify)
        # The 2026-07-28 retry's requestState is sealed to this session, the tool and its
        # arguments; the write it answers is looked up by it, once (``_answered``).
        self.server.middleware.append(RequestStateBoundary(_security(config.approval_timeout_s + 60),
                                                           default_audience=f"memoryd/{session_id}"))
        self.init_options = self.server.create_initialization_options(NotificationOptions())

    # --- identity and the frozen snapshot ----------------------------------------------

    async def _identify(self, ctx: ServerRequestContext[Any, Any], call_next: Any) -> Any:
        """Fix the agent layer at the first request that names the host, and take the
        snapshot at the handshake, else the first request (a 2026-07-28 host may discover
        on a sibling process and send this one no handshake)."""
        if self.calls.agent is None:
            client = self._client_of(ctx)
            if client is not None or ctx.method != "initialize":
                if client is not None:
                    self.peer.name_client(client)
                self._fix_identity(host_source(client.name if client else None))
                log.debug("mcp session %s: workspace %r, agent %r, host %r", self.calls.session_id,
                          self.calls.cwd, self.calls.agent, client and client.name)
        if ctx.method in ("initialize", "server/discover"):
            text = await self._instructions()
            self.init_options.instructions = text
            self.server.instructions = text
        elif not self._snapshot_tried:
            await self._instructions()
        return await call_next(ctx)

    def _fix_identity(self, host: str | None) -> None:
        """The session's identity is complete: the agent layer is ``--agent``'s, else the
        one every agent shares (so what one host learns, the next one knows), and its writes'
        source is the host as it names itself. From now on it hears of every change, by
        anyone, of an entry it sees (its resources' updates)."""
        self.calls.fix_identity(self._agent_arg if self._agent_arg is not None else "", host or "mcp")
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
                    self._fix_identity(None)
                params = SnapshotParams(session=Session(id=self.calls.session_id, header=self.calls.header()))
                result = await self.calls.methods["memory/snapshot"](RequestContext(self.peer), params)
                self._snapshot = result.text
            return self._snapshot

    async def _instructions(self) -> str | None:
        self._snapshot_tried = True
        try:
            return await self.snapshot()
        except ProtocolError as exc:
            log.warning("mcp session %s: no snapshot for the instructions: %s", self.calls.session_id, exc.code)
        except Exception as exc:  # a store row the renderer cannot show: the session still serves
            log.warning("mcp session %s: no snapshot for the instructions: %s (the debug log has the trace)",
                        self.calls.session_id, type(exc).__name__)
            log.debug("the snapshot failed", exc_info=True)
        return None

    # --- tools ---------------------------------------------------------------------------

    async def _list_tools(self, ctx: ServerRequestContext[Any, Any], params: Any) -> dict[str, Any]:
        return _TOOLS_LISTED

    async def _call_tool(self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
                         ) -> ToolResult | types.InputRequiredResult:
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
        try:
            task = self._start(self.calls.call(tool, wire, key))
        except ProtocolError as exc:
            return error_result(exc)
        self.peer.calls[key] = call
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
        if len(self._tasks) >= MAX_INFLIGHT:
            # A host that cancels its calls leaves their work running here (a write is never
            # cut short): bounded all the same.
            work.close()
            raise InvalidInput(f"this session already has {MAX_INFLIGHT} calls in the daemon; wait for "
                               "their results")
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
            # not _start's: the elicitations of a session are bounded by max_pending_approvals,
            # and count against no call's place
            self._elicitations[asked.id] = asyncio.ensure_future(self._elicit(call, asked))

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

    def _ask_on_retry(self, asked: ApprovalAsked, task: asyncio.Task[ToolResult]
                      ) -> types.InputRequiredResult:
        """2026-07-28: the question goes back as an input-required result; the write stays
        parked in the gate until the host retries with the answer (or the approval times out)."""
        self._parked[asked.id] = task
        task.add_done_callback(lambda _t: self._parked.pop(asked.id, None))
        form = types.ElicitRequestFormParams(message=approval_request(asked), requested_schema=APPROVE_SCHEMA)
        return types.InputRequiredResult(input_requests={"approval": types.ElicitRequest(params=form)},
                                         request_state=asked.id)

    async def _answered(self, params: types.CallToolRequestParams) -> ToolResult:
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

    async def serve_lines(self, lines: Lines) -> None:
        """Serve the host's lines with the SDK until EOF (or the daemon stops reading), then
        wait for this session's daemon work."""
        wire = Wire(self.conn, self._end)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._notify_changes)
                await wire.serve(lines, lambda recv, send: self.server.run(recv, send, self.init_options))
                tg.cancel_scope.cancel()
        finally:
            self._end()
            left = {*self._tasks, *self._elicitations.values()}
            if left:
                with anyio.CancelScope(shield=True):
                    await asyncio.wait(left)

    def _end(self) -> None:
        """The host is gone (or the daemon stops reading it): writes waiting for its answer
        are denied "unavailable", as for a closed connection, and its watch ends."""
        self.peer.gone = True
        self.service.watchers.drop(self.peer)
        self.service.approvals.connection_closed(self.peer)


async def serve(front: McpFront, conn: Connection, session_id: str, p: McpAttachParams, lines: Lines) -> None:
    await McpSession(front, conn, session_id, p).serve_lines(lines)
