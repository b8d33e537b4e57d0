"""Pending approvals: the daemon → client half of the write gate.

A table keyed by approval id: each waiter has a timeout and is removed on every path, so a
late decision is refused rather than leaked, and a closing connection wakes every waiter it
was asked of. Waiting here never holds the writer, which only sees approved work.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio
import msgspec
from memoryd_protocol.constants import DEFAULT_MAX_PENDING_APPROVALS
from memoryd_protocol.errors import InvalidInput
from memoryd_protocol.payloads import normalize_outcome
from memoryd_protocol.types import (
    ApprovalAsked,
    ApprovalBy,
    ApprovalResolved,
)

from .context import Peer

if TYPE_CHECKING:
    from .context import RequestContext

log = logging.getLogger("memoryd.approvals")


def same_process(a: Peer, b: Peer) -> bool:
    """Whether two connections may belong to one process: they share a pid (the one shown
    or the relay's), or neither pid is known. A peer whose pid the kernel does not give us
    (another pid namespace) is never one whose pid we know."""
    pa = a.peer.pids() if a.peer is not None else frozenset()
    pb = b.peer.pids() if b.peer is not None else frozenset()
    if not pa or not pb:
        return not pa and not pb
    return not pa.isdisjoint(pb)


@dataclass(eq=False)
class Pending:
    asked: ApprovalAsked
    origin: Peer
    targets: list[Peer]
    done: anyio.Event = field(default_factory=anyio.Event)
    outcome: str | None = None
    decided_by: Peer | None = None
    #: what the deciding client claims it is (``approval/decided``'s ``by``)
    claimed: ApprovalBy | None = None

    def resolve(self, outcome: str, by: Peer | None = None, claimed: ApprovalBy | None = None) -> None:
        if self.outcome is None:
            self.outcome = outcome
            self.decided_by = by
            self.claimed = claimed
            self.done.set()


class Approvals:
    def __init__(self, max_per_connection: int = DEFAULT_MAX_PENDING_APPROVALS) -> None:
        self.pending: dict[str, Pending] = {}
        #: max_pending_approvals: a connection's next write beyond it is denied at once
        self.max_per_connection = max_per_connection
        self.approvers: list[Peer] = []
        #: set at shutdown: no new approval is asked, every new one is cancelled
        self.closing = False

    def subscribe(self, peer: Peer) -> None:
        if peer not in self.approvers:
            self.approvers.append(peer)

    def full(self, origin: Peer) -> bool:
        """``origin`` already has max_pending_approvals writes waiting for a decision."""
        return sum(p.origin is origin for p in self.pending.values()) >= self.max_per_connection

    def unsubscribe(self, peer: Peer) -> None:
        if peer in self.approvers:
            self.approvers.remove(peer)

    async def ask(self, ctx: RequestContext, asked: ApprovalAsked, wait_s: float,
                  on_asked: Callable[[ApprovalAsked], None]) -> Pending:
        """Send ``approval/asked`` for the write ``ctx`` serves and wait for the outcome
        (never raises for a denial), the request parked; ``on_asked`` sees what approvers get."""
        origin = ctx.peer
        # A subscribed approver never decides a write of its own process: a model's tool
        # cannot approve its own write by subscribing a second connection.
        targets = [origin] if origin.can_approve else [
            a for a in self.approvers if a is not origin and not same_process(a, origin)]
        if self.closing or not targets or origin.gone:
            p = Pending(asked, origin, [])
            p.resolve("cancelled" if self.closing else "unavailable")
            return p  # never asked: nobody is there to answer
        asked = msgspec.structs.replace(asked, origin=origin.describe())
        # requestId means something only on the connection that sent the request.
        own = msgspec.structs.replace(asked, request_id=ctx.id)
        p = Pending(asked, origin, targets)
        self.pending[asked.id] = p
        on_asked(asked)
        try:
            ctx.park()
            with anyio.move_on_after(wait_s):
                for target in targets:
                    await target.notify("approval/asked", own if target is origin else asked)  # never waits
                await p.done.wait()
            if p.outcome is None:
                p.resolve("cancelled")
            return p
        finally:
            self.pending.pop(asked.id, None)
            if p.outcome is None:
                p.resolve("cancelled")
            # Everyone asked who did not decide learns the outcome, so prompts can close.
            await self._tell_resolved(p)

    async def _tell_resolved(self, p: Pending) -> None:
        note = ApprovalResolved(id=p.asked.id, outcome=p.outcome or "cancelled")
        with anyio.move_on_after(1, shield=True):
            for target in p.targets:
                if target is not p.decided_by:
                    await target.notify("approval/resolved", note)

    def decide(self, peer: Peer, approval_id: str, outcome: object, claimed: ApprovalBy | None = None) -> None:
        p = self.pending.get(approval_id)
        if p is None or p.outcome is not None or peer not in p.targets:
            # One message for all three cases, so a foreign connection learns nothing.
            raise InvalidInput("no pending approval with this id was asked of this connection", "id")
        p.resolve(normalize_outcome(outcome), peer, claimed)
        log.info("approval %s decided %s by connection %d (%s, pid %s; claims %s%s)", approval_id, p.outcome,
                 peer.id, "its own prompt" if peer is p.origin else "a subscribed approver",
                 peer.peer.pid if peer.peer and peer.peer.pid else "unknown", claimed.kind if claimed else "nothing",
                 f" {claimed.name!r}" if claimed and claimed.name is not None else "")

    def connection_closed(self, peer: Peer) -> None:
        if peer in self.approvers:
            self.approvers.remove(peer)
        for p in list(self.pending.values()):
            if p.origin is peer:
                p.resolve("unavailable")
            elif peer in p.targets:
                p.targets.remove(peer)
                if not p.targets:
                    p.resolve("unavailable")

    def cancel_all(self, outcome: str = "cancelled") -> None:
        self.closing = True
        for p in list(self.pending.values()):
            p.resolve(outcome)

    def __len__(self) -> int:
        return len(self.pending)

