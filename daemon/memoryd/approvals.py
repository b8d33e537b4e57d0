"""Approvals, all of them: the write gate, pending approvals, and who may decide.

The gate (:meth:`Approvals.gate`) takes every write's policy: ``auto`` passes, ``off`` is
denied, ``ask`` asks and waits for a decision; a denial is audited (its ledger rows
committed) before it is raised. Pending approvals are a table keyed by approval id: each
waiter has a timeout and is removed on every path, so a late decision is refused rather
than leaked, and a closing connection wakes every waiter it was asked of. Waiting here
never holds the writer, which only sees approved work. The approval methods
(``approval/decided``, ``subscribe``, ``challenge``, ``prove``) are
:meth:`Approvals.handlers`.

A decision counts only from the process that opened the deciding connection, still running
(:func:`check_decider`; its kernel facts go into the ledger), and a subscribed approver never
decides a write of its own process, an ancestor's or a descendant's (peers.related). Under
``approvers = "keyed"`` a connection decides only once it proved the approver key: an HMAC of
a fresh nonce of this connection's (:meth:`Approvals.challenged`, :func:`prove`). Under ``approvers =
"interactive"`` only a process with a controlling terminal subscribes as an approver or makes
a person's decision outside a prompt (:func:`_require_terminal`, :meth:`Approvals.check_person`).
"""

from __future__ import annotations

import hmac
import logging
import secrets
import time
import uuid
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import anyio
import msgspec
from memoryd_protocol import payloads
from memoryd_protocol.approval_types import ApprovalChallenge, ApprovalProofParams, ProcessFacts
from memoryd_protocol.constants import ALLOWED_ONCE
from memoryd_protocol.errors import InvalidInput, StoreUnavailable, WriteDenied
from memoryd_protocol.paths import ApproverKeyError, approver_key_path, approver_proof, read_approver_key
from memoryd_protocol.payloads import normalize_outcome
from memoryd_protocol.text import check_storable
from memoryd_protocol.types import (
    ApprovalAsked,
    ApprovalBy,
    ApprovalDecidedParams,
    ApprovalResolved,
    Empty,
    LedgerConnection,
)

from . import ledger
from .config import Config
from .context import Handler, Peer
from .peers import Facts, NotThatProcess, now, related
from .tx import Tx
from .writer import Writer

if TYPE_CHECKING:
    from .context import RequestContext

log = logging.getLogger("memoryd.approvals")

#: how long a challenge may wait for its proof
CHALLENGE_TTL_S = 60.0
#: The WRITE_DENIED message (outcome ``cancelled``) of a write that reaches the gate, or
#: is still waiting for its approval, once the daemon has begun to stop.
STOPPING_MESSAGE = "the daemon is stopping"
KEY_NOT_PROVEN = ('approvers = "keyed": this connection has not proved the approver key, so it cannot make '
                  "decisions; send approval/challenge, then approval/prove with its proof (memoryctl does both)")


@dataclass(eq=False)
class _KeyState:
    nonce: str | None = None
    connection: str = ""
    pid: int = 0
    start: int = 0
    issued: float = 0.0
    proven: bool = False


#: per connection (held weakly: gone with it): its open challenge, and whether it proved the key
_keys: weakref.WeakKeyDictionary[Peer, _KeyState] = weakref.WeakKeyDictionary()


def _refused(peer: Peer, reason: str, field: str | None = None) -> InvalidInput:
    """The INVALID_INPUT of a connection that may not do what it asked; logged, never with text."""
    log.warning("connection %d refused: %s", peer.id, reason)
    return InvalidInput(reason, field)


def _running(peer: Peer) -> Facts:
    """The process on ``peer``'s socket now, refused unless it is the one that opened it."""
    try:
        return now(peer.peer)
    except NotThatProcess as exc:
        raise _refused(peer, str(exc)) from None


def proven(peer: Peer) -> bool:
    """``peer`` proved the approver key (approval/prove or approval/subscribe's proof)."""
    state = _keys.get(peer)
    return state is not None and state.proven


def check_decider(peer: Peer, config: Config) -> ProcessFacts:
    """Raise InvalidInput (logged as a warning) unless ``peer`` may make a decision now: the
    process on its socket is the one that opened it, still running (not one it was handed
    to), and under ``approvers = "keyed"`` the connection proved the approver key. Returns
    that process as the kernel shows it now: what the decision's ledger row records."""
    facts = _running(peer)
    if config.approvers == "keyed" and not proven(peer):
        raise _refused(peer, KEY_NOT_PROVEN)
    return facts.wire()


def _require_terminal(peer: Peer, config: Config, refusal: str, field: str | None = None) -> None:
    """Under ``approvers = "interactive"``, raise InvalidInput(``refusal``) unless the process on
    ``peer``'s socket has a controlling terminal: the one place that rule is written."""
    if config.approvers == "interactive" and (peer.peer is None or not peer.peer.interactive()):
        raise InvalidInput(refusal, field)


def prove(peer: Peer, proof: str | None) -> None:
    """``proof`` answers ``peer``'s open challenge with the approver key, which the daemon
    reads itself (it runs as the same user); each challenge is answered once, right or wrong."""
    if proof is None:
        raise InvalidInput("approval/prove needs proof: the HMAC that answers approval/challenge", "proof")
    state = _keys.get(peer)
    nonce = state.nonce if state is not None else None
    if state is None or nonce is None or time.monotonic() - state.issued > CHALLENGE_TTL_S:
        raise _refused(peer, f"this connection has no challenge to answer (none was asked, it was answered, or it is "
                             f"older than {CHALLENGE_TTL_S:g} s): send approval/challenge first", "proof")
    state.nonce = None
    facts = _running(peer)
    path = approver_key_path()
    try:
        key = read_approver_key(path)
    except ApproverKeyError as exc:
        raise _refused(peer, f"the daemon cannot use its approver key: {exc}") from None
    # The start time memoryd saw is signed too: a relay that rewrites it in the challenge makes
    # its client sign another process's start, and the proof does not answer.
    want = approver_proof(key, nonce, state.connection, state.pid, state.start).encode()
    if (facts.pid, facts.start) != (state.pid, state.start) or not hmac.compare_digest(
            want, proof.encode("utf-8", "replace")):
        raise _refused(peer, f"the proof does not answer this connection's challenge with the approver key {path}: "
                             "make sure the program reads that key, then send approval/challenge again", "proof")
    state.proven = True
    log.info("connection %d (pid %d) proved the approver key", peer.id, facts.pid)


class Gated(Protocol):
    """What the gate needs of a write (pipeline.WritePlan): its denied row, and its approval."""

    action: str
    track: str
    scope: str
    text: str
    source: str
    entry_id: str | None

    def asked(self, session_id: str | None) -> ApprovalAsked: ...


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
    #: the deciding process as the kernel showed it when the decision arrived
    decider: ProcessFacts | None = None

    def resolve(self, outcome: str, by: Peer | None = None, claimed: ApprovalBy | None = None,
                decider: ProcessFacts | None = None) -> None:
        if self.outcome is None:
            self.outcome = outcome
            self.decided_by = by
            self.claimed = claimed
            self.decider = decider
            self.done.set()


class Approvals:
    def __init__(self, config: Config | None = None) -> None:
        #: the daemon's config: its ``approvers`` says who may decide, and past its
        #: max_pending_approvals a connection's next write is denied at once
        self.config = config if config is not None else Config()
        self.pending: dict[str, Pending] = {}
        self.approvers: list[Peer] = []
        #: set at shutdown (``cancel_all``): the gate admits no more writes, no new approval
        #: is asked, every new one is cancelled
        self.closing = False
        #: this daemon run's id, for the ledger's connection refs
        self.run_id = uuid.uuid4().hex[:12]

    def handlers(self) -> dict[str, Handler]:
        return {
            "approval/decided": self.decided,
            "approval/subscribe": self.subscribed,
            "approval/challenge": self.challenged,
            "approval/prove": self.proved,
        }

    async def decided(self, ctx: RequestContext, p: ApprovalDecidedParams) -> Empty:
        if p.by is not None and p.by.name is not None:
            check_storable(p.by.name, "by.name")
        self.decide(ctx.peer, p.id, p.outcome, p.by)
        return Empty()

    async def challenged(self, ctx: RequestContext, p: Any) -> ApprovalChallenge:
        """A fresh nonce for the connection, replacing any earlier one. It names the process on
        the socket, pid and start time: a client signs only a challenge naming itself, so a
        process relaying its connection never gets the proof."""
        peer, connection = ctx.peer, f"{self.run_id}/{ctx.peer.id}"
        facts = _running(peer)
        state = _keys.setdefault(peer, _KeyState())
        state.nonce, state.connection, state.pid, state.start = secrets.token_hex(32), connection, facts.pid, facts.start
        state.issued = time.monotonic()
        return ApprovalChallenge(nonce=state.nonce, connection=connection, pid=facts.pid, start=facts.start)

    async def proved(self, ctx: RequestContext, p: ApprovalProofParams) -> Empty:
        prove(ctx.peer, p.proof)
        return Empty()

    async def subscribed(self, ctx: RequestContext, p: ApprovalProofParams) -> Empty:
        """Admit the connection as an approver (its proof, if any, answering its challenge), or
        raise InvalidInput naming what it lacks under the config's ``approvers``."""
        peer = ctx.peer
        if not peer.can_approve:
            raise InvalidInput("a connection that declared capabilities.approvals false cannot be an approver")
        if p.proof is not None:
            prove(peer, p.proof)
        if self.config.approvers == "keyed" and not proven(peer):
            raise InvalidInput('approvers = "keyed": only a connection that proved the approver key can subscribe; '
                               "send approval/challenge, then approval/subscribe with its proof (memoryctl approve "
                               "does both)")
        _require_terminal(peer, self.config, "only a process with a controlling terminal can subscribe as an "
                                             'approver; set approvers = "any" in the daemon\'s config to admit others')
        if peer not in self.approvers:
            self.approvers.append(peer)
        return Empty()

    def check_person(self, peer: Peer, what: str, field: str | None = None) -> ProcessFacts:
        """Raise INVALID_INPUT unless ``peer`` may make a person's decision (``what``) now: as it
        may decide an approval (:func:`check_decider`), and under ``approvers = "interactive"``
        from a process with a controlling terminal. Returns its facts, to record."""
        facts = check_decider(peer, self.config)
        _require_terminal(peer, self.config, f"only a process with a controlling terminal can {what}; run memoryctl "
                                             "in a terminal", field)
        return facts

    # --- the gate -------------------------------------------------------------------------

    async def gate(self, ctx: RequestContext, session_id: str | None, write: Gated, policy: str,
                   writer: Writer) -> tuple[ledger.Stamp, ledger.Decision | None]:
        """Return only for ``allowed-once``: the stamp the write's rows carry, and the
        decision to record with them. A denial is audited (through ``writer``), then raised.

        A write that leaves the gate allowed queues its writer job before the caller's next
        await, so once shutdown has begun (``cancel_all``) no write is queued after it: the
        ledger shows every committed write before the first denial for stopping."""
        peer = ctx.peer
        origin = ledger.connection(peer, self.run_id)
        if self.closing:
            # As a write parked on an approval does, let the connection serve its next
            # line meanwhile: a pipeline's denials then share a group commit, not one each.
            ctx.park()
            await self._deny(writer, origin, session_id, write, "cancelled", policy, None)
            raise WriteDenied(STOPPING_MESSAGE, {"outcome": "cancelled"})
        if policy == "auto":
            label = payloads.outcome_label(ALLOWED_ONCE, policy)
            return ledger.Stamp(origin=origin, session_id=session_id, label=label), None
        if policy == "off":
            await self._deny(writer, origin, session_id, write, "rejected", policy, None)
            raise WriteDenied("write denied: rejected", {"outcome": "rejected"})
        if sum(p.origin is peer for p in self.pending.values()) >= self.config.max_pending_approvals:
            # max_pending_approvals: denied at once, with its denied row like every denial.
            await self._deny(writer, origin, session_id, write, "unavailable", policy, None)
            raise WriteDenied(f"write denied: unavailable: this connection already has "
                              f"{self.config.max_pending_approvals} approvals pending", {"outcome": "unavailable"})
        asked = write.asked(session_id)
        was_asked: list[bool] = []

        def on_asked(payload: ApprovalAsked) -> None:
            was_asked.append(True)
            writer.defer(lambda tx: ledger.asked(tx, origin, payload), keep=True)

        try:
            pending = await self.ask(ctx, asked, self.config.approval_timeout_s, on_asked)
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                gone = ledger.Decision(asked.id, "unavailable", policy, None, None) if was_asked else None
                await self._deny(writer, origin, session_id, write, "unavailable", policy, gone)
            raise
        decided = pending.outcome or "cancelled"
        # Asked before shutdown began: cancelled (cancel_all), or allowed just before it but
        # only resumed after; either way nothing is queued now. The decision row keeps what
        # its decider decided; the denied row says the write was cancelled.
        outcome = "cancelled" if self.closing else decided
        decided_by = ledger.connection(pending.decided_by, self.run_id) if pending.decided_by is not None else None
        # an approval nobody could be asked was never asked: it has no rows of its own
        decision = ledger.Decision(asked.id, decided, policy, decided_by, pending.claimed,
                                   pending.decider) if was_asked else None
        if outcome == ALLOWED_ONCE:
            label = payloads.outcome_label(ALLOWED_ONCE, policy)
            return ledger.Stamp(origin=origin, session_id=session_id, label=label, approval=asked.id), decision
        await self._deny(writer, origin, session_id, write, outcome, policy, decision)
        if self.closing:
            raise WriteDenied(STOPPING_MESSAGE, {"outcome": "cancelled"})
        raise WriteDenied(f"write denied: {outcome}", {"outcome": outcome})

    @staticmethod
    async def _deny(writer: Writer, origin: LedgerConnection, session_id: str | None, write: Gated, outcome: str,
                    policy: str, decision: ledger.Decision | None) -> None:
        approval = decision.approval if decision is not None else None
        stamp = ledger.Stamp(origin=origin, session_id=session_id, label=payloads.outcome_label(outcome, policy),
                             approval=approval)

        def rows(tx: Tx) -> None:
            if decision is not None:
                decision.record(tx)
            stamp.audit(tx, f"{write.action}-denied", track=write.track, scope=write.scope, entry_id=write.entry_id,
                        text=write.text, source=write.source)

        try:
            await writer.submit(rows)
        except StoreUnavailable:
            if decision is None:
                raise  # no approval was asked: nothing but the denied row to keep, and a
                # client could queue those without bound while the store is locked
            # An approval's decision (a human's, say) is denied whatever the store does:
            # its decided and denied rows are kept until the store takes them, as a failed
            # commit's are; the write is denied.
            writer.defer(rows, keep=True)

    # --- pending approvals ------------------------------------------------------------------

    def unsubscribe(self, peer: Peer) -> None:
        if peer in self.approvers:
            self.approvers.remove(peer)

    async def ask(self, ctx: RequestContext, asked: ApprovalAsked, wait_s: float,
                  on_asked: Callable[[ApprovalAsked], None]) -> Pending:
        """Send ``approval/asked`` for the write ``ctx`` serves and wait for the outcome
        (never raises for a denial), the request parked; ``on_asked`` sees what approvers get."""
        origin = ctx.peer
        keyed = self.config.approvers == "keyed"
        targets = [origin] if origin.can_approve and (not keyed or proven(origin)) else self._approvers_for(origin)
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

    def _approvers_for(self, origin: Peer) -> list[Peer]:
        """The subscribed approvers to ask about ``origin``'s write. A subscribed approver never
        decides a write of its own process, an ancestor's or a descendant's: a model's tool
        cannot approve its own write by subscribing a second connection, nor through a child
        it gave a terminal. None at all when the writer's process is gone: nobody can tell
        whose write it is then. Under keyed, only approvers that proved the key."""
        if not self.approvers:
            return []
        writer = origin.peer
        if writer is not None and writer.facts is not None:
            try:
                now(writer)
            except NotThatProcess:
                log.warning("connection %d: the process that opened it (pid %d) has exited or its pid was reused; "
                            "no approver is asked about its write", origin.id, writer.facts.pid)
                return []
        keyed = self.config.approvers == "keyed"
        return [a for a in self.approvers
                if a is not origin and (not keyed or proven(a)) and not related(a.peer, writer)]

    def decide(self, peer: Peer, approval_id: str, outcome: object, claimed: ApprovalBy | None = None) -> None:
        p = self.pending.get(approval_id)
        if p is None or p.outcome is not None or peer not in p.targets:
            # One message for all three cases, so a foreign connection learns nothing.
            raise InvalidInput("no pending approval with this id was asked of this connection", "id")
        facts = check_decider(peer, self.config)
        if peer is not p.origin:
            self._check_writer(peer, p.origin)  # as things are now, not as they were when asked
        p.resolve(normalize_outcome(outcome), peer, claimed, facts)
        log.info("approval %s decided %s by connection %d (%s, pid %d; claims %s%s)", approval_id, p.outcome,
                 peer.id, "its own prompt" if peer is p.origin else "a subscribed approver", facts.pid,
                 claimed.kind if claimed else "nothing",
                 f" {claimed.name!r}" if claimed and claimed.name is not None else "")

    @staticmethod
    def _check_writer(approver: Peer, origin: Peer) -> None:
        """InvalidInput unless the subscribed ``approver`` may decide ``origin``'s write now."""
        writer = origin.peer
        if writer is not None and writer.facts is not None:
            try:
                now(writer)
            except NotThatProcess:
                raise _refused(approver, f"the process that asked this write (pid {writer.facts.pid}) has exited or "
                                         "its pid was reused: memoryd cannot tell whose write it is, so no approver "
                                         "can decide it; the writer has to write again") from None
        if related(approver.peer, writer):
            pid = approver.peer.pid if approver.peer is not None else None
            raise _refused(approver, f"this approver (pid {pid}) is the writing process, its ancestor or its "
                                     "descendant, so it cannot decide this write; approve from a process of its own, "
                                     "such as memoryctl approve in another terminal")

    def connection_closed(self, peer: Peer) -> None:
        self.unsubscribe(peer)
        for p in list(self.pending.values()):
            if p.origin is peer:
                p.resolve("unavailable")
            elif peer in p.targets:
                p.targets.remove(peer)
                if not p.targets:
                    p.resolve("unavailable")

    def cancel_all(self) -> None:
        """Shutdown has begun: from now on the gate admits no write. Every write that
        reaches it is denied (``cancelled``, its denied row first), and so is every write
        still waiting for an approval."""
        self.closing = True
        for p in list(self.pending.values()):
            p.resolve("cancelled")

    def __len__(self) -> int:
        return len(self.pending)

