"""The request context: what a handler knows of the request it serves. The dispatcher
makes one per request and the handler passes it on; nothing reaches for per-request state
any other way.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from memoryd_protocol.types import ApprovalOrigin, ClientInfo, ConnectionInfo

from .peers import PeerProcess


class Peer(Protocol):
    """What approvals need of a connection."""

    id: int
    can_approve: bool
    gone: bool
    #: the process on the other end (None when the kernel could not say)
    peer: PeerProcess | None
    #: ``initialize``'s ``client``, as the peer names itself
    client: ClientInfo | None

    def listing(self, *, approver: bool) -> ConnectionInfo:
        """The connection as ``daemon/status`` lists it (and the ledger records it)."""
        ...

    def describe(self) -> ApprovalOrigin | None:
        """Who is on the other end: the ``origin`` of the approvals this peer asks (None
        when nothing is known)."""
        ...

    async def notify(self, method: str, params: object) -> None:
        """Queue a notification; never waits for the peer (it runs on other requests' paths)."""
        ...


@dataclass(slots=True, eq=False)
class RequestContext:
    #: the connection the request came on
    peer: Peer
    #: its JSON-RPC id: ``approval/asked`` carries it as ``requestId`` to this connection.
    #: None for a notification (and for an id of null).
    id: str | int | float | None = None
    #: Called when the request parks on an approval, so the connection may serve its next
    #: line (the decision) meanwhile; None when served inline, which never parks.
    release_turn: Callable[[], None] | None = None

    async def notify(self, method: str, params: object) -> None:
        """A notification to the requesting connection (never waits)."""
        await self.peer.notify(method, params)

    def park(self) -> None:
        """The request is about to wait (for an approval, or its denial's commit): let the
        connection serve its next line meanwhile."""
        if self.release_turn is not None:
            self.release_turn()


#: A method's implementation: the request context and the decoded params in, the result out.
Handler = Callable[[RequestContext, Any], Awaitable[Any]]
