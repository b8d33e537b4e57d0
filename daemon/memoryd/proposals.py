"""Proposals: a session suggests a memory, a human approves (a write through the pipeline)
or dismisses it; every change of them is a ledger row."""

from __future__ import annotations

import msgspec
from memoryd_protocol.errors import InvalidInput, ProposalNotFound
from memoryd_protocol.text import js_trim, utf16_len
from memoryd_protocol.types import (
    MemoryAdded,
    Proposal,
    ProposalApproveParams,
    ProposalApproveResult,
    ProposalCreateParams,
    ProposalDismissParams,
    ProposalListParams,
)
from memoryd_protocol.validation import check_source, check_text, session_view, target_keys, writer_view

from . import ledger, store
from .context import Handler, RequestContext
from .ledger import Stamp
from .pipeline import Placement, WritePlan
from .service import Service
from .sessions import shown
from .tx import Tx
from .writes import Writes

PROPOSAL_SOURCE = "proposal"


class Proposals:
    def __init__(self, service: Service, writes: Writes) -> None:
        self.service = service
        self.writes = writes
        #: proposal ids with a decision in flight: the first decision claims the id, a
        #: concurrent second one is refused at once instead of prompting the human twice.
        self._deciding: set[str] = set()

    def handlers(self) -> dict[str, Handler]:
        return {
            "proposals/create": self.proposals_create,
            "proposals/list": self.proposals_list,
            "proposals/approve": self.proposals_approve,
            "proposals/dismiss": self.proposals_dismiss,
        }

    async def proposals_create(self, ctx: RequestContext, p: ProposalCreateParams) -> Proposal | None:
        view = session_view(p.session, self.service.config.workspace_aliases)
        session_id = view.session_id
        if not session_id or not js_trim(session_id):
            raise InvalidInput("session.id is required", "session.id")
        self.service.sessions.require_own(ctx.peer, session_id, "create proposals for it")
        i = p.input
        text = check_text(i.text)
        cap = self.service.config.proposal_max_text
        if utf16_len(text) > cap:
            raise InvalidInput(f"proposal text longer than {cap} characters", "input.text")
        kind = check_text(i.kind, "input.kind")
        source = check_source(i.source)
        wk, ak = target_keys(i.scope, view, None, None, self.service.config.workspace_aliases, restricted=True)
        max_pending, max_total = self.service.config.proposal_max_pending, self.service.config.proposal_max_pending_total
        origin = self.service.pipeline.who(ctx.peer)

        def job(tx: Tx) -> Proposal | None:
            row = tx.conn.execute("SELECT status, id FROM proposals WHERE session_id = ? AND kind = ?",
                               (session_id, kind)).fetchone()
            if row is not None and row[0] == "pending":
                return None
            # each proposer's own cap: one session's proposals never block another's
            (mine,) = tx.conn.execute("SELECT count(*) FROM proposals WHERE status = 'pending' AND session_id = ?",
                                      (session_id,)).fetchone()
            if mine >= max_pending:
                raise InvalidInput(f"session {shown(session_id)!r} already has {max_pending} pending proposals "
                                   "(proposal_max_pending); wait until they are approved or dismissed (memoryctl "
                                   "proposals), or raise proposal_max_pending in the daemon's config", "input")
            (pending,) = tx.conn.execute("SELECT count(*) FROM proposals WHERE status = 'pending'").fetchone()
            if pending >= max_total:
                raise InvalidInput(f"the store already holds {max_total} pending proposals (proposal_max_pending_total); "
                                   "approve or dismiss some (memoryctl proposals), or raise proposal_max_pending_total "
                                   "in the daemon's config", "input")
            if row is not None:
                # UNIQUE(session_id, kind) is the reference's layout: a decided proposal
                # makes room for the session's next one of that kind.
                tx.conn.execute("DELETE FROM proposals WHERE session_id = ? AND kind = ?", (session_id, kind))
            proposal = Proposal(id=store.new_id(), kind=kind, track=i.track, scope=i.scope, workspace_key=wk,
                                agent_key=ak, text=text, source=source, session_id=session_id, status="pending",
                                created_at=store.now_ms(), decided_at=None)
            store.insert_proposal(tx.conn, proposal)
            ledger.proposal(tx, origin, "created", proposal, replaces=row[1] if row is not None else None)
            return proposal

        return await self.service.writer.submit(job)

    async def proposals_list(self, ctx: RequestContext, p: ProposalListParams) -> list[Proposal]:
        return await self.service.read(lambda c: store.proposals(c, p.status))

    async def _pending(self, proposal_id: str) -> Proposal:
        proposal = await self.service.read(lambda c: store.get_proposal(c, proposal_id))
        if proposal is None or proposal.status != "pending" or proposal_id in self._deciding:
            raise ProposalNotFound("no pending proposal with this id", {"id": proposal_id})
        return proposal

    async def proposals_approve(self, ctx: RequestContext, p: ProposalApproveParams) -> ProposalApproveResult:
        view = writer_view(p.write, self.service.config.workspace_aliases)
        proposal = await self._pending(p.id)
        self._deciding.add(p.id)
        cell = (proposal.track, proposal.scope)

        def commit(tx: Tx, stamp: Stamp) -> ProposalApproveResult:
            ts = store.now_ms()
            if not store.decide_proposal(tx.conn, proposal.id, "approved", ts):
                raise ProposalNotFound("no pending proposal with this id", {"id": proposal.id})
            decided = store.get_proposal(tx.conn, proposal.id)
            # another program can change a pending proposal while its approval waits: what
            # is approved is what the approval showed, or nothing (the change is foreign)
            if decided is None or msgspec.structs.replace(decided, status="pending", decided_at=None) != proposal:
                raise ProposalNotFound("the proposal changed while its approval was pending, and nothing was written; "
                                       "look at it again (memoryctl proposals) and approve it if it still applies",
                                       {"id": proposal.id})
            e = self.writes.new_entry(view, track=proposal.track, scope=proposal.scope, text=proposal.text,
                                 source=PROPOSAL_SOURCE, tags=[], workspace_key=proposal.workspace_key,
                                 agent_key=proposal.agent_key, ts=ts)
            store.insert_entry(tx, e)
            stamp.audit(tx, "add", track=e.track, scope=e.scope, entry_id=e.id, text=e.text, source=PROPOSAL_SOURCE,
                        entry=e, ts=ts)
            ledger.proposal(tx, stamp.origin, "approved", decided)
            return ProposalApproveResult(proposal=decided, entry=e, usage=self.service.row(tx.usage, *cell))

        try:
            return await self.service.pipeline.write(ctx, view, WritePlan(
                action="add", track=proposal.track, scope=proposal.scope, text=proposal.text, source=PROPOSAL_SOURCE,
                layers=[cell], sources=[PROPOSAL_SOURCE], deltas={cell: utf16_len(proposal.text)}, commit=commit,
                events=lambda r: [("memory/added", MemoryAdded(entry=r.entry))],
                placement=Placement(proposal.workspace_key, proposal.agent_key, [])))
        finally:
            self._deciding.discard(p.id)

    async def proposals_dismiss(self, ctx: RequestContext, p: ProposalDismissParams) -> Proposal:
        await self._pending(p.id)
        origin = self.service.pipeline.who(ctx.peer)

        def job(tx: Tx) -> Proposal:
            if not store.decide_proposal(tx.conn, p.id, "dismissed", store.now_ms()):
                raise ProposalNotFound("no pending proposal with this id", {"id": p.id})
            decided = store.get_proposal(tx.conn, p.id)
            assert decided is not None
            ledger.proposal(tx, origin, "dismissed", decided)
            return decided

        return await self.service.writer.submit(job)
