"""An MCP session as the daemon's approvals and events see it: a :class:`~memoryd.context.Peer`.

It can approve when the host declared elicitation and ``mcp_approvals = "elicitation"``:
the question becomes the host's dialog (2025-11-25: ``elicitation/create``) or an
input-required result answered on the retry (2026-07-28); otherwise subscribed approvers
are asked. ``memory/*`` events become MCP resource updates.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from memoryd_protocol.types import ApprovalAsked, ApprovalOrigin, ClientInfo, ConnectionInfo

from ..connection import Connection
from ..peers import PeerProcess

log = logging.getLogger("memoryd.mcp")

#: the ``memory/*`` events that change what the session's resources show
CHANGES = frozenset({"memory/added", "memory/updated", "memory/removed"})


@dataclass(eq=False)
class Call:
    """One ``tools/call`` in flight: what the approval it may ask needs to reach the host."""

    #: the request context of the SDK (its session, request id and era)
    mcp: Any
    modern: bool
    asked: ApprovalAsked | None = None
    was_asked: asyncio.Event = field(default_factory=asyncio.Event)


class McpPeer:
    """The MCP session's identity towards approvals, sessions and the ledger: the
    connection's (its id, the kernel's facts of its peer process), with the MCP host's
    ``clientInfo`` as the client's claim and ``front_end`` "mcp"."""

    def __init__(self, conn: Connection, can_elicit: bool, on_change: Callable[[], None],
                 on_asked: Callable[[Call, ApprovalAsked], None], on_resolved: Callable[[str], None]) -> None:
        self.conn = conn
        self.id = conn.id
        #: one-way: once a request comes from a host without elicitation, its writes go to
        #: the approvers for good
        self.can_approve = can_elicit
        self.gone = False
        self.peer: PeerProcess | None = conn.peer
        self.client: ClientInfo | None = None
        #: tools/call in flight, by the key their RequestContext carries as its id
        self.calls: dict[int, Call] = {}
        self._on_change = on_change
        self._on_asked = on_asked
        self._on_resolved = on_resolved

    def name_client(self, client: ClientInfo) -> None:
        if self.client is None:
            self.client = client
            self.conn.client = client  # daemon/status lists the host

    def listing(self, *, approver: bool) -> ConnectionInfo:
        return self.conn.listing(approver=approver)

    def describe(self) -> ApprovalOrigin | None:
        c, p = self.client, self.peer
        return ApprovalOrigin(name=c.name if c else None, version=c.version if c else None,
                              pid=p.pid if p else None, exe=p.exe if p else None, front_end="mcp")

    async def notify(self, method: str, params: object) -> None:
        """Never waits, as a connection's notify: the daemon's writers call it."""
        if method in CHANGES:
            self._on_change()
        elif method == "approval/asked" and isinstance(params, ApprovalAsked):
            call = self.calls.get(params.request_id) if isinstance(params.request_id, int) else None
            if call is None:
                log.warning("mcp: an approval was asked for a call this session does not have")
                return
            self._on_asked(call, params)
        elif method == "approval/resolved":
            self._on_resolved(getattr(params, "id", ""))
