"""memory/snapshot: a session's frozen memory block, rendered once and kept for good.

A frozen snapshot is never deleted (the ledger vouches for each), so the store holds at most
``max_snapshots``: a new session's first snapshot beyond it is refused, and nothing is
written for the refusal, as for any request refused before it acts (a row per refusal would
grow the store the cap is there to bound).
"""

from __future__ import annotations

import sqlite3

from memoryd_protocol.errors import InvalidInput
from memoryd_protocol.snapshot import render, visible_proposals
from memoryd_protocol.text import js_trim
from memoryd_protocol.types import (
    MemorySnapshot,
    Proposal,
    SnapshotParams,
    SnapshotResult,
)
from memoryd_protocol.validation import session_view

from . import store
from .context import Handler, RequestContext
from .service import Service
from .tx import Tx


class Snapshots:
    def __init__(self, s: Service) -> None:
        self.s = s
        #: the frozen snapshots the store holds, counted once (in a writer job) and then kept
        #: up by the jobs that freeze; None until then, and again after a failed commit
        self._frozen: int | None = None

    def _refuse_beyond_cap(self, held: int) -> None:
        limit = self.s.config.max_snapshots
        if held >= limit:
            raise InvalidInput(f"the store already holds {limit} frozen snapshots (max_snapshots); reuse the id of a "
                               "session that has one, or raise max_snapshots in the daemon's config", "session.id")

    def handlers(self) -> dict[str, Handler]:
        return {"memory/snapshot": self.snapshot}

    async def snapshot(self, ctx: RequestContext, p: SnapshotParams) -> SnapshotResult:
        view = session_view(p.session)
        session_id = view.session_id
        if not session_id or not js_trim(session_id):
            raise InvalidInput("session.id is required", "session.id")
        frozen = await self.s.read(lambda c: store.frozen_snapshot(c, session_id))
        if frozen is not None:
            return SnapshotResult(text=frozen)
        self.s.sessions.require_own(ctx.peer, session_id, "take its first snapshot")
        if self._frozen is not None:
            self._refuse_beyond_cap(self._frozen)  # before rendering: the job checks again
        language = p.language or self.s.config.language

        def gather(c: sqlite3.Connection) -> tuple[list[tuple[str, str, str, str, str]], list[Proposal]]:
            return store.layer_texts(c), store.proposals(c, "pending")

        entries, pending = await self.s.read(gather)
        visible = [(track, scope, text) for track, scope, wk, ak, text in entries if view.sees(scope, wk, ak)]
        # every pending proposal this session sees (not only its own), as the reference lists them
        shown = [(x.id, x.track, x.scope, x.text)
                 for x in visible_proposals(pending, view, self.s.config.proposal_max_pending)]
        usage = {cell: (used, self.s.config.budgets[cell]) for cell, used in self.s.writer.usage.items()}
        text = render(visible, usage, shown, language)  # type: ignore[arg-type]

        stamp = self.s.pipeline.stamp(ctx.peer, view)

        def job(tx: Tx) -> tuple[str, bool]:
            existing = store.frozen_snapshot(tx.conn, session_id)
            if existing is not None:
                return existing, False
            if self._frozen is None:
                self._frozen = int(tx.conn.execute("SELECT count(*) FROM memoryd_snapshots").fetchone()[0])
            self._refuse_beyond_cap(self._frozen)  # in the job: no two sessions both take the last one
            ts = store.now_ms()
            store.freeze_snapshot(tx.conn, session_id, text, language, ts)
            stamp.audit(tx, "snapshot", track=None, scope=None, entry_id=None, text=text, source=None, ts=ts)
            self._frozen += 1
            return text, True

        try:
            final, first = await self.s.writer.submit(job)
        except InvalidInput:
            raise
        except BaseException:
            self._frozen = None  # a commit that failed may have been counted: count again
            raise
        if first:
            await ctx.notify("memory/snapshot", MemorySnapshot(session_id=session_id, text=final))
        return SnapshotResult(text=final)
