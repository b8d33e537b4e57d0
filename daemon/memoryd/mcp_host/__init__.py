"""The MCP front-end's way in: ``mcp/attach``, after which the connection speaks MCP,
served by the official SDK (:mod:`memoryd.mcp_host.session`). The SDK is imported on the
first MCP session, off the event loop. Every tool call goes through the daemon's own method
handlers, so budgets, the approval gate and the ledger are the same as for any client.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Mapping
from functools import partial
from types import ModuleType
from typing import TYPE_CHECKING

import anyio
from memoryd_protocol.constants import STORE_SCHEMA_VERSION
from memoryd_protocol.errors import InvalidInput
from memoryd_protocol.mcp_wire import McpAttachParams, McpAttachResult
from memoryd_protocol.types import StoreInfo

from ..context import Handler, RequestContext

if TYPE_CHECKING:
    from ..service import Service

log = logging.getLogger("memoryd.mcp")


class McpFront:
    def __init__(self, service: Service) -> None:
        self.service = service
        #: every method's handler, as the dispatcher calls them; set once they are bound
        self.methods: Mapping[str, Handler] = {}
        self._session: ModuleType | None = None
        self._loading = anyio.Lock()

    def handlers(self) -> dict[str, Handler]:
        return {"mcp/attach": self.attach}

    async def _session_module(self) -> ModuleType:
        async with self._loading:
            if self._session is None:
                import importlib

                # slow imports: on a thread, so every other connection is served meanwhile
                self._session = await anyio.to_thread.run_sync(importlib.import_module, "memoryd.mcp_host.session")
            return self._session

    async def attach(self, ctx: RequestContext, p: McpAttachParams) -> McpAttachResult:
        from ..connection import Connection

        conn = ctx.peer
        if not isinstance(conn, Connection):
            raise InvalidInput("mcp/attach is for a connection to the daemon's socket")
        if conn.client is not None:
            raise InvalidInput("mcp/attach must come before initialize: a connection is one protocol or the other")
        if conn in self.service.approvals.approvers or any(
                p_.origin is conn for p_ in self.service.approvals.pending.values()):
            raise InvalidInput("mcp/attach must come before this connection approves or writes")
        if self.service.watchers.sessions(conn):
            raise InvalidInput("mcp/attach must come before memory/watch: its events would land on the MCP stream")
        if not os.path.isabs(p.cwd) or "\0" in p.cwd:
            raise InvalidInput("cwd must be an absolute path", "cwd")
        module = await self._session_module()
        session_id = str(uuid.uuid4())
        log.debug("connection %d is MCP session %s (workspace %r, agent %r)", conn.id, session_id, p.cwd, p.agent)
        conn.name = "mcp"
        conn.handoff = partial(module.serve, self, conn, session_id, p)
        config = self.service.config
        return McpAttachResult(session_id=session_id, write_policy=config.write_policy,  # type: ignore[arg-type]
                               store=StoreInfo(path=str(config.db_path), schema_version=STORE_SCHEMA_VERSION))
