"""The one write pipeline. Every write path (add, replace, remove, consolidate, seed,
import, proposals/approve) builds a :class:`WritePlan` and hands it to :meth:`Pipeline.run`,
which takes it through the same steps, in order:

1. pre-check the budget against committed usage;
2. the policy, from the plan's layers and sources (``Config.policy_for``, its one place);
3. the gate: ``auto`` passes, ``off`` is denied, ``ask`` waits for an approval; a denial
   is audited (its row committed) before it is raised;
4. the writer job, on the writer's thread: re-check the budget against usage as it is
   then, and let the plan re-resolve its targets by id and write its rows;
5. commit (group commit: acknowledged only once durable);
6. the ledger: the approval's decision is written in the same transaction as the write's
   rows; a write that then fails leaves a ``failed`` row instead;
7. events, each with the writing session's id: to the connection that wrote, then to
   every other watcher whose session sees the entry (watchers.py).

No path computes policy, approval payload, audit outcome or ledger rows on its own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import anyio
from memoryd_protocol import payloads
from memoryd_protocol.constants import ALLOWED_ONCE
from memoryd_protocol.errors import EntryNotFound, ProtocolError, StoreUnavailable, WriteDenied
from memoryd_protocol.paths import default_config_path
from memoryd_protocol.types import ApprovalAsked, ApprovalEntry, Entry, EntryEvent, LedgerConnection
from memoryd_protocol.validation import SessionView, check_batch_budget

from . import ledger, store
from .approvals import Approvals
from .config import Config
from .context import Peer, RequestContext
from .tx import Tx
from .watchers import Watchers
from .writer import Writer, WriterClosed

R = TypeVar("R")
Cell = tuple[str, str]

#: The WRITE_DENIED message (outcome ``cancelled``) of a write that reaches the gate, or
#: is still waiting for its approval, once the daemon has begun to stop.
STOPPING_MESSAGE = "the daemon is stopping"


@dataclass
class WritePlan(Generic[R]):
    """One write, as every path describes it to the pipeline."""

    action: str
    #: the layer shown to the approver and kept in denied rows ("batch" for a seed)
    track: str
    scope: str
    #: what the approval shows and a denied row keeps (the reference's payload text)
    text: str
    #: the source label shown; ``sources`` are all the sources the write touches
    source: str
    layers: list[Cell]
    sources: list[str]
    #: characters each cell gains (negative: frees), checked before and inside the job
    deltas: dict[Cell, int]
    #: the writer job proper, on the writer's thread: re-resolve targets by id, write rows
    #: (through ``stamp``); ``tx.usage`` already counts this write's deltas (for the
    #: result's budget rows)
    commit: Callable[[Tx, ledger.Stamp], R]
    #: the notifications the committed result sends (the writer's, and its watchers')
    events: Callable[[R], list[tuple[str, EntryEvent]]]
    entry_id: str | None = None
    count: int | None = None
    #: (workspaceKey, agentKey, tags) of the entry as the write leaves it
    lands: tuple[str, str, list[str]] | None = None
    #: a seed's batch, every entry shown to the approver
    entries: Sequence[Entry] | None = None
    #: an import's user-global entries whose workspaceKey was dropped (the approval says so)
    workspace_keys_dropped: int | None = None


@dataclass
class Pipeline:
    config: Config
    writer: Writer
    approvals: Approvals
    #: this daemon run's id: connection refs in the ledger are ``<run>/<connection id>``
    run_id: str
    #: who else hears of committed writes (memory/watch)
    watchers: Watchers = field(default_factory=Watchers)
    #: set by ``stop_writes`` at shutdown: the gate admits no more writes
    stopping: bool = field(default=False)

    def who(self, peer: Peer) -> LedgerConnection:
        """``peer`` as the ledger records it: the kernel's facts of its socket's process at
        connect (a relay's own), and what it claims (its client; a relay's harness)."""
        info = peer.listing(approver=False)
        p = peer.peer
        f = p.facts if p is not None else None
        if f is None:  # memoryd saw no process: what the listing has
            return LedgerConnection(ref=f"{self.run_id}/{info.id}", run=self.run_id, id=info.id,
                                    transport=info.transport, pid=info.pid, uid=info.uid, exe=info.exe,
                                    client=info.client, opened_at=info.opened_at)
        return LedgerConnection(ref=f"{self.run_id}/{info.id}", run=self.run_id, id=info.id, transport=info.transport,
                                pid=f.pid, uid=f.uid, exe=f.exe, client=info.client, opened_at=info.opened_at,
                                start=f.start, tty=f.tty, session=f.session,
                                harness=p.pid if p is not None and p.via is not None else None)

    def stamp(self, peer: Peer, view: SessionView) -> ledger.Stamp:
        """The stamp of a request that is not a gated write (a recall, a snapshot)."""
        return ledger.Stamp(origin=self.who(peer), session_id=view.session_id)

    def config_file(self) -> str:
        """The config file that sets the budgets, for BUDGET_EXCEEDED to name: the one the
        daemon read, else the default one it would read at its next start."""
        path = self.config.config_path
        return str(path if path is not None else default_config_path())

    async def run(self, ctx: RequestContext, view: SessionView, plan: WritePlan[R]) -> R:
        limits, config_file = self.config.budgets, self.config_file()
        check_batch_budget(plan.deltas, self.writer.usage, limits, config_file=config_file)
        policy = self.config.policy_for(plan.layers, plan.sources)
        stamp, decision = await self._gate(ctx, view, plan, policy)

        def job(tx: Tx) -> R:
            check_batch_budget(plan.deltas, tx.usage, limits, config_file=config_file)
            if decision is not None:
                decision.record(tx)
            for cell, d in plan.deltas.items():
                tx.usage[cell] = tx.usage.get(cell, 0) + d
            return plan.commit(tx, stamp)  # on an error the writer restores tx.usage

        def failed_row(exc: BaseException) -> None:
            # Nothing of the write was committed (its decision row neither): say so in the
            # ledger, kept until the store takes it; also when the request was cancelled
            # while its commit ran (the writer calls this, not the request).
            code, message = (exc.code, exc.message) if isinstance(exc, ProtocolError) else (
                "INTERNAL_ERROR", "the commit failed")

            def failed(tx: Tx) -> None:
                if decision is not None:
                    decision.record(tx)
                ledger.failed(tx, stamp, plan.action, code, message, plan.entry_id)

            self.writer.defer(failed, keep=True)

        try:
            result = await self.writer.submit(job, on_error=failed_row)
        except WriterClosed as exc:  # refused before it was queued: no on_error
            failed_row(exc)
            raise
        except EntryNotFound:
            if decision is not None:
                # Its target changed during the wait, perhaps by another program since the
                # writer's last look: look now, so that the ledger names that change as
                # foreign before the failure it caused (the failed row is written after it).
                await self.writer.look_outside()
            raise
        events = plan.events(result)
        for method, event in events:
            event.session_id = view.session_id
            await ctx.notify(method, event)
        await self.watchers.broadcast(ctx.peer, events)
        return result

    async def _gate(self, ctx: RequestContext, view: SessionView, plan: WritePlan[Any],
                    policy: str) -> tuple[ledger.Stamp, ledger.Decision | None]:
        """Return only for ``allowed-once``: the stamp the write's rows carry, and the
        decision to record with them. A denial is audited, then raised.

        A write that leaves the gate allowed queues its writer job before the caller's next
        await, so once shutdown has begun (``stop_writes``) no write is queued after it:
        the ledger shows every committed write before the first denial for stopping."""
        peer = ctx.peer
        origin = self.who(peer)
        if self.stopping:
            # As a write parked on an approval does, let the connection serve its next
            # line meanwhile: a pipeline's denials then share a group commit, not one each.
            ctx.park()
            await self._deny(origin, view, plan, "cancelled", policy, None)
            raise WriteDenied(STOPPING_MESSAGE, {"outcome": "cancelled"})
        if policy == "auto":
            label = payloads.outcome_label(ALLOWED_ONCE, policy)
            return ledger.Stamp(origin=origin, session_id=view.session_id, label=label), None
        if policy == "off":
            await self._deny(origin, view, plan, "rejected", policy, None)
            raise WriteDenied("write denied: rejected", {"outcome": "rejected"})
        if self.approvals.full(peer):
            # max_pending_approvals: denied at once, with its denied row like every denial.
            await self._deny(origin, view, plan, "unavailable", policy, None)
            raise WriteDenied(f"write denied: unavailable: this connection already has "
                              f"{self.approvals.max_per_connection} approvals pending", {"outcome": "unavailable"})
        asked = self._asked(view, plan)
        was_asked: list[bool] = []

        def on_asked(payload: ApprovalAsked) -> None:
            was_asked.append(True)
            self.writer.defer(lambda tx: ledger.asked(tx, origin, payload), keep=True)

        try:
            pending = await self.approvals.ask(ctx, asked, self.config.approval_timeout_s, on_asked)
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                gone = ledger.Decision(asked.id, "unavailable", policy, None, None) if was_asked else None
                await self._deny(origin, view, plan, "unavailable", policy, gone)
            raise
        said = pending.outcome or "cancelled"
        # Asked before shutdown began: cancelled (Approvals.cancel_all), or allowed just
        # before it but only resumed after; either way nothing is queued now. The decision
        # row keeps what its decider said; the denied row says the write was cancelled.
        outcome = "cancelled" if self.stopping else said
        decided_by = self.who(pending.decided_by) if pending.decided_by is not None else None
        # an approval nobody could be asked was never asked: it has no rows of its own
        decision = ledger.Decision(asked.id, said, policy, decided_by, pending.claimed,
                                   pending.decider) if was_asked else None
        if outcome == ALLOWED_ONCE:
            label = payloads.outcome_label(ALLOWED_ONCE, policy)
            return ledger.Stamp(origin=origin, session_id=view.session_id, label=label, approval=asked.id), decision
        await self._deny(origin, view, plan, outcome, policy, decision)
        if self.stopping:
            raise WriteDenied(STOPPING_MESSAGE, {"outcome": "cancelled"})
        raise WriteDenied(f"write denied: {outcome}", {"outcome": outcome})

    @staticmethod
    def _asked(view: SessionView, plan: WritePlan[Any]) -> ApprovalAsked:
        lands, entries = plan.lands, plan.entries
        return ApprovalAsked(
            id=store.new_id(),
            action=plan.action,  # type: ignore[arg-type]
            track=plan.track,
            scope=plan.scope,
            text=plan.text,
            source=plan.source,
            session_id=view.session_id,
            reason=payloads.reason(plan.action, plan.track, plan.scope, plan.source, plan.text, plan.count),
            count=plan.count,
            workspace_key=lands[0] if lands else None,
            agent_key=lands[1] if lands else None,
            tags=list(lands[2]) if lands else None,
            entries=None if entries is None else [
                ApprovalEntry(track=e.track, scope=e.scope, workspace_key=e.workspace_key, agent_key=e.agent_key,
                              text=e.text, tags=list(e.tags), source=e.source) for e in entries],
            workspace_keys_dropped=plan.workspace_keys_dropped,
        )

    async def _deny(self, origin: LedgerConnection, view: SessionView, plan: WritePlan[Any], outcome: str,
                    policy: str, decision: ledger.Decision | None) -> None:
        approval = decision.approval if decision is not None else None
        stamp = ledger.Stamp(origin=origin, session_id=view.session_id,
                             label=payloads.outcome_label(outcome, policy), approval=approval)

        def rows(tx: Tx) -> None:
            if decision is not None:
                decision.record(tx)
            stamp.audit(tx, f"{plan.action}-denied", track=plan.track, scope=plan.scope, entry_id=plan.entry_id,
                        text=plan.text, source=plan.source)

        try:
            await self.writer.submit(rows)
        except StoreUnavailable:
            if decision is None:
                raise  # no approval was asked: nothing but the denied row to keep, and a
                # client could queue those without bound while the store is locked
            # An approval's decision (a human's, say) is denied whatever the store does:
            # its decided and denied rows are kept until the store takes them, as a failed
            # commit's are; the write is denied.
            self.writer.defer(rows, keep=True)
