"""The one write pipeline. Every write path (add, replace, remove, consolidate, seed,
import, proposals/approve) builds a :class:`WritePlan` and hands it to :meth:`Pipeline.write`,
which takes it through the same steps, in order:

1. pre-check the budget against committed usage;
2. the policy, from the plan's layers and sources (``Config.policy_for``, its one place);
3. the gate (approvals.py, ``Approvals.gate``): ``auto`` passes, ``off`` is denied,
   ``ask`` waits for an approval; a denial is audited (its row committed) before it is
   raised;
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
from typing import Generic, NamedTuple, TypeVar

from memoryd_protocol import payloads
from memoryd_protocol.errors import EntryNotFound, ProtocolError
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


class Placement(NamedTuple):
    """Where the entry is as the write leaves it: its keys and tags, as the approval shows them."""

    workspace_key: str
    agent_key: str
    tags: list[str]


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
    placement: Placement | None = None
    #: a seed's batch, every entry shown to the approver
    entries: Sequence[Entry] | None = None
    #: an import's user-global entries whose workspaceKey was dropped (the approval says so)
    workspace_keys_dropped: int | None = None

    def asked(self, session_id: str | None) -> ApprovalAsked:
        """The approval this write asks for (``approval/asked``), under a new id."""
        placed, entries = self.placement, self.entries
        return ApprovalAsked(
            id=store.new_id(),
            action=self.action,  # type: ignore[arg-type]
            track=self.track,
            scope=self.scope,
            text=self.text,
            source=self.source,
            session_id=session_id,
            reason=payloads.reason(self.action, self.track, self.scope, self.source, self.text, self.count),
            count=self.count,
            workspace_key=placed.workspace_key if placed else None,
            agent_key=placed.agent_key if placed else None,
            tags=list(placed.tags) if placed else None,
            entries=None if entries is None else [
                ApprovalEntry(track=e.track, scope=e.scope, workspace_key=e.workspace_key, agent_key=e.agent_key,
                              text=e.text, tags=list(e.tags), source=e.source) for e in entries],
            workspace_keys_dropped=self.workspace_keys_dropped,
        )


@dataclass
class Pipeline:
    config: Config
    writer: Writer
    approvals: Approvals
    #: who else hears of committed writes (memory/watch)
    watchers: Watchers = field(default_factory=Watchers)

    def who(self, peer: Peer) -> LedgerConnection:
        """``peer`` as the ledger records it (ledger.connection): ``<run>/<connection id>``."""
        return ledger.connection(peer, self.approvals.run_id)

    def config_file(self) -> str:
        """The config file that sets the budgets, for BUDGET_EXCEEDED to name: the one the
        daemon read, else the default one it would read at its next start."""
        path = self.config.config_path
        return str(path if path is not None else default_config_path())

    async def write(self, ctx: RequestContext, view: SessionView, plan: WritePlan[R]) -> R:
        """Take ``plan`` through every step (the module's docstring); its result once committed."""
        limits, config_file = self.config.budgets, self.config_file()
        check_batch_budget(plan.deltas, self.writer.usage, limits, config_file=config_file)
        policy = self.config.policy_for(plan.layers, plan.sources)
        stamp, decision = await self.approvals.gate(ctx, view.session_id, plan, policy, self.writer)

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
