"""A tool call as the daemon serves it: the model's arguments decoded strictly with the
wire's types, the session supplying what a model must not choose (the write context, the
query's session options, the proposal's session), the method's handler, and the result as
MCP carries it. A failure is an ``isError`` result with ``{code, message, details}``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec
from memoryd_protocol import types as t
from memoryd_protocol.errors import InvalidInput
from memoryd_protocol.mcp_tools import SESSION_FIELDS, McpTool, structured
from memoryd_protocol.text import normalize_agent_key, normalize_workspace_key
from memoryd_protocol.validation import SessionView

from ..context import Handler, RequestContext
from ..rpc import error_object, field_of
from .peer import McpPeer

#: A ``tools/call`` result in wire form: a dict, not the SDK's ``CallToolResult``, which the
#: SDK would dump once more before validating and dumping it for the negotiated era.
ToolResult = dict[str, Any]


def tool_result(text: str, structured: Any) -> ToolResult:
    # resultType: 2026-07-28's (the 2025-11-25 surface drops it)
    return {"content": [{"type": "text", "text": text}], "structuredContent": structured, "isError": False,
            "resultType": "complete"}


def error_result(exc: Exception, method: str | None = None) -> ToolResult:
    """A failure as a tool result the model reads: ``CODE: message``, then the error as JSON,
    the ``data`` the socket answers for the same failure (rpc.error_object: one boundary,
    which logs what it logs for the socket). No ``structuredContent``: hosts hold it to the
    tool's output schema, which describes the result, and a text that is JSON alone some
    hosts parse and hold to it too."""
    data = error_object(exc, method)["data"]
    error = msgspec.json.encode(data).decode()
    return {"content": [{"type": "text", "text": f"{data['code']}: {data['message']}\n\n{error}"}],
            "isError": True, "resultType": "complete"}


def _short(entry_id: str) -> str:
    return entry_id[:8]


def _entry_line(e: t.Entry) -> str:
    tags = f" [{', '.join(e.tags)}]" if e.tags else ""
    return f"- {_short(e.id)} {e.track}/{e.scope}{tags}: {e.text}"


def _usage(u: t.BudgetRow) -> str:
    return f"{u.track}/{u.scope} {u.used}/{u.limit}"


def _text(tool: McpTool, result: Any) -> str:
    """The short text beside ``structuredContent``, for hosts that show text only."""
    if isinstance(result, t.QueryResult):
        head = f"{len(result.entries)} of {result.total} matching entries" + (" (more: narrow the query)"
                                                                              if result.truncated else "")
        return "\n".join([head, *(_entry_line(e) for e in result.entries)])
    if tool.name == "memory_list":
        return "\n".join([f"{len(result)} visible entries", *(_entry_line(e) for e in result)])
    if tool.name == "memory_budgets":
        return "budgets (used/limit, characters): " + ", ".join(_usage(r) for r in result)
    if tool.name == "memory_propose":
        if result is None:
            return "no proposal made: this session already has a pending proposal of this kind"
        return f"proposal {_short(result.id)} is pending: the user reviews it with `memoryctl proposals`"
    if isinstance(result, t.ConsolidateResult):
        return (f"consolidated {len(result.removed)} entries into {_short(result.entry.id)} "
                f"({_usage(result.usage)})")
    verb = {"memory_add": "added", "memory_replace": "replaced", "memory_remove": "removed"}[tool.name]
    return f"{verb} {_short(result.entry.id)} in {result.entry.track}/{result.entry.scope} ({_usage(result.usage)})"


class McpCalls:
    def __init__(self, methods: Mapping[str, Handler], peer: McpPeer, session_id: str, cwd: str,
                 aliases: Mapping[str, str]) -> None:
        self.methods = methods
        self.peer = peer
        self.session_id = session_id
        self.cwd = cwd
        #: fixed by the first request that names the host (McpSession._identify): the
        #: session's agent layer ('' is the one every agent shares) and its writes' source
        self.agent: str | None = None
        self.source = "mcp"
        self.view = SessionView(session_id, normalize_workspace_key(cwd, aliases), "")

    def fix_identity(self, agent: str, source: str) -> None:
        if self.agent is None:
            self.agent, self.source = agent, source
            self.view = SessionView(self.session_id, self.view.workspace_key, normalize_agent_key(agent))

    def header(self) -> t.Header:
        return t.Header(cwd=self.cwd, agent_preset=self.agent)

    def _session(self) -> t.Session:
        return t.Session(id=self.session_id, header=self.header())

    def _write(self) -> t.Write:
        return t.Write(agent=t.Agent(session=self._session()))

    def params(self, tool: McpTool, arguments: Mapping[str, Any] | None) -> Any:
        """The method's params for these arguments; INVALID_INPUT when they do not fit."""
        for name in SESSION_FIELDS:
            if arguments is not None and name in arguments:
                raise InvalidInput(f"invalid arguments: {name} is not an argument of {tool.name}: the session sets "
                                   f"it (a write's source is the host that asks)", name)
        try:
            args: Any = msgspec.convert(arguments if arguments is not None else {}, tool.arguments)
        except msgspec.ValidationError as exc:
            raise InvalidInput(f"invalid arguments: {exc}", field_of(exc)) from None
        if tool.method == "memory/query":
            opts = t.QueryOpts(session_id=self.session_id, agent_key=self.view.agent_key,
                               workspace_key=self.view.workspace_key)
            return t.QueryParams(filter=args, opts=opts)
        if "source" in type(args).__struct_fields__:
            args = msgspec.structs.replace(args, source=self.source)
        if tool.method == "proposals/create":
            return t.ProposalCreateParams(input=args, session=self._session())
        if tool.argument == "input":
            return tool.row.params(input=args, write=self._write())
        return t.EmptyParams()

    async def call(self, tool: McpTool, params: Any, key: int) -> ToolResult:
        """Serve the call with the method's handler, as a request of this session's
        connection whose id is ``key`` (approvals find the call by it)."""
        try:
            result = await self.methods[tool.method](RequestContext(self.peer, key), params)
        except Exception as exc:  # cancellation is not an Exception: it goes on up
            return error_result(exc, tool.method)
        if tool.name == "memory_list":
            result = self._visible(result)
        return tool_result(_text(tool, result), structured(tool, result))

    def _visible(self, entries: list[t.Entry]) -> list[t.Entry]:
        v = self.view
        return [e for e in entries if v.sees(e.scope, e.workspace_key, e.agent_key)]

    async def visible(self) -> list[t.Entry]:
        return self._visible(await self.methods["memory/list"](RequestContext(self.peer), t.EmptyParams()))

    async def budgets(self) -> list[t.BudgetRow]:
        rows: list[t.BudgetRow] = await self.methods["memory/budgets"](RequestContext(self.peer), t.EmptyParams())
        return rows
