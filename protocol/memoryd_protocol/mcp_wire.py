"""The one memoryd method behind ``memoryd mcp``: ``mcp/attach``.

``memoryd mcp`` is a byte relay, as ``serve --stdio`` is. After its store check it sends
``mcp/attach`` with the session's identity; once the daemon has answered, every later line
on that connection is MCP (JSON-RPC 2.0, one message per line), served by the MCP
front-end inside the daemon. Pure: no I/O.
"""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta, Struct

from .constants import MAX_AGENT_KEY_UNITS
from .types import StoreInfo

#: A workspace path longer than this is refused (a path the kernel accepts is at most 4 KiB).
MAX_CWD_BYTES = 4096


class McpAttachParams(Struct, rename="camel", forbid_unknown_fields=True, kw_only=True):
    #: the session's workspace: ``memoryd mcp --cwd``, else that process's working directory
    cwd: Annotated[str, Meta(min_length=1, max_length=MAX_CWD_BYTES)]
    #: the agent layer: ``--agent``; None takes the MCP host's ``clientInfo.name``, normalized
    agent: Annotated[str, Meta(max_length=MAX_AGENT_KEY_UNITS)] | None = None


class McpAttachResult(Struct, rename="camel", kw_only=True):
    #: the memory session this MCP connection is, fresh for each attach
    session_id: str
    #: what the daemon serves, as ``daemon/status`` says it: the relay checks them
    store: StoreInfo
    write_policy: Literal["ask", "auto", "off"]


__all__ = ["MAX_CWD_BYTES", "McpAttachParams", "McpAttachResult"]
