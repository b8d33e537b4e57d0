"""memory/snapshot: a session's frozen memory block, rendered once and kept for good."""

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
            ts = store.now_ms()
            store.freeze_snapshot(tx.conn, session_id, text, language, ts)
            stamp.audit(tx, "snapshot", track=None, scope=None, entry_id=None, text=text, source=None, ts=ts)
            return text, True

        final, first = await self.s.writer.submit(job)
        if first:
            await ctx.notify("memory/snapshot", MemorySnapshot(session_id=session_id, text=final))
        return SnapshotResult(text=final)
