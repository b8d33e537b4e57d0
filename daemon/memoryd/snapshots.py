"""memory/snapshot: a session's frozen memory block, rendered once and kept for good.

A frozen snapshot is never deleted (the ledger vouches for each). Its text is stored once
per distinct content, by the sha256 of its UTF-8 bytes: a session names it by that digest,
and so do its ``snapshot`` audit row and ledger row. Sessions that start while memory is
unchanged (every MCP spawn, every host health check) add a small row each, not a copy.

Two caps bound the store: ``max_snapshots`` the sessions with a frozen snapshot, and
``max_snapshot_bytes`` the UTF-8 bytes of the distinct texts. A new session's first snapshot
beyond either is refused (one whose text is stored already never by the bytes), and
nothing is written for the refusal, as for any request refused before it acts (a row per
refusal would grow the store the caps are there to bound). So that a loop of fresh session
ids cannot fill them for everyone in minutes, each connection and each process may take
only so many first snapshots (sessions.py).

``snapshots/prune`` deletes the snapshots of sessions that ended, a person's decision
recorded by a ``pruned`` ledger row: room comes back at once, with no restart. It is never
done by itself when the store is full: a flood would then choose which sessions' record of
what they were shown is erased.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from memoryd_protocol.errors import InvalidInput, StoreCorrupt
from memoryd_protocol.ledger import snapshot_ref, text_hash
from memoryd_protocol.snapshot import render, visible_proposals
from memoryd_protocol.snapshot_types import PRUNE_ROW_SESSIONS, SnapshotPruneParams, SnapshotPruneResult
from memoryd_protocol.text import js_trim
from memoryd_protocol.types import (
    MemorySnapshot,
    SnapshotParams,
    SnapshotResult,
)
from memoryd_protocol.validation import SessionView, session_view

from . import ledger, store
from .context import Handler, RequestContext
from .service import Service
from .tx import Tx


class Snapshots:
    def __init__(self, service: Service) -> None:
        self.service = service
        #: (frozen snapshots, bytes of their distinct texts) the store holds, counted once (in
        #: a writer job) and then kept up by the jobs that freeze; None until then, and again
        #: after a failed commit. The jobs change it on the writer's thread, a failed commit's
        #: caller on the event loop: ``_lock`` keeps a reset from being overwritten (``_keep``).
        self._held: tuple[int, int] | None = None
        self._lock = threading.Lock()

    def _keep(self, seen: tuple[int, int] | None, held: tuple[int, int]) -> None:
        """In a job: ``held`` is the count now, unless a failed commit reset ``seen`` meanwhile."""
        with self._lock:
            if self._held is seen:
                self._held = held

    def _forget(self) -> None:
        """A commit that failed may have been counted: count again."""
        with self._lock:
            self._held = None

    def _refuse_beyond_cap(self, held: int) -> None:
        limit = self.service.config.max_snapshots
        if held >= limit:
            raise InvalidInput(f"the store already holds {limit} frozen snapshots (max_snapshots); reuse the id of a "
                               "session that has one, free room with memoryctl snapshots prune (the snapshots of "
                               "sessions that ended), or raise max_snapshots in the daemon's config", "session.id")

    def _refuse_beyond_bytes(self, held: int, size: int) -> None:
        limit = self.service.config.max_snapshot_bytes
        if held + size > limit:
            raise InvalidInput(f"the store's snapshot texts take {held} of {limit} bytes (max_snapshot_bytes), too few "
                               f"for this session's new text of {size} bytes; free room with memoryctl snapshots prune "
                               "(the snapshots of sessions that ended), or raise max_snapshot_bytes in the daemon's "
                               "config file and restart memoryd (sessions whose text is stored already are still "
                               "served)", "session.id")

    def _corrupt(self, message: str) -> StoreCorrupt:
        return StoreCorrupt(f"{message}; memoryctl audit verify reports it", {"path": str(self.service.config.db_path)})

    def _stored(self, session_id: str, frozen: tuple[str, str | None]) -> str:
        """The frozen text of a session that has one; STORE_CORRUPT when the store lost it or
        it is not the text its digest names: one edited row would reach every session that
        shares it, and no other text may pass for the one the ledger vouches for."""
        digest, text = frozen
        if text is None:
            raise self._corrupt(f"the frozen snapshot of session {session_id} names the text sha256:{digest}, which "
                                "the store no longer holds")
        if text_hash(text) != digest:
            raise self._corrupt(f"the stored text of session {session_id}'s frozen snapshot is not the text "
                                f"sha256:{digest} it names")
        return text

    def _render(self, tx: Tx, view: SessionView, language: str) -> str:
        """The snapshot ``view`` is shown: the entries it sees, its cells' usage as ``tx``
        leaves it, and the session's own pending proposals, fenced as the reference lists them."""
        config = self.service.config
        visible = store.visible_texts(tx.conn, view.agent_key, view.workspace_key)
        shown = [(x.id, x.track, x.scope, x.text)
                 for x in visible_proposals(store.proposals(tx.conn, "pending"), view, config.proposal_max_pending)]
        usage = {cell: (used, config.budgets[cell]) for cell, used in tx.usage.items()}
        return render(visible, usage, shown, language)  # type: ignore[arg-type]

    def handlers(self) -> dict[str, Handler]:
        return {"memory/snapshot": self.snapshot, "snapshots/prune": self.prune}

    async def snapshot(self, ctx: RequestContext, p: SnapshotParams) -> SnapshotResult:
        view = session_view(p.session, self.service.config.workspace_aliases)
        session_id = view.session_id
        if not session_id or not js_trim(session_id):
            raise InvalidInput("session.id is required", "session.id")
        frozen = await self.service.read(lambda c: store.frozen_snapshot(c, session_id))
        if frozen is not None:
            return SnapshotResult(text=self._stored(session_id, frozen))
        self.service.sessions.require_own(ctx.peer, session_id, "take its first snapshot")
        if self._held is not None:
            self._refuse_beyond_cap(self._held[0])  # before rendering: the job checks again
        undo = self.service.sessions.admit_first_snapshot(ctx.peer)
        try:
            return await self._freeze(ctx, p, view, session_id, undo)
        except BaseException:
            undo()
            raise

    async def _freeze(self, ctx: RequestContext, p: SnapshotParams, view: SessionView, session_id: str,
                      undo: Callable[[], None]) -> SnapshotResult:
        language = p.language or self.service.config.language
        stamp = ledger.Stamp(origin=self.service.pipeline.who(ctx.peer), session_id=session_id)

        def job(tx: Tx) -> tuple[str, bool]:
            # Rendered in the transaction that stores it: the text is the store as of the
            # snapshot's own ledger row, read and written in one turn of the writer's thread.
            existing = store.frozen_snapshot(tx.conn, session_id)
            if existing is not None:
                return self._stored(session_id, existing), False
            counted = self._held
            if counted is None:
                counted = store.snapshot_totals(tx.conn)
                self._keep(None, counted)
            sessions, held = counted
            self._refuse_beyond_cap(sessions)  # in the job: no two sessions both take the last one
            text = self._render(tx, view, language)
            digest = text_hash(text)
            stored = store.snapshot_text_matches(tx.conn, digest, text)
            size = 0  # the bytes a text not stored yet adds
            if stored is None:
                size = len(text.encode())
                self._refuse_beyond_bytes(held, size)
            elif not stored:
                # planted under the digest of a text a session would render: never served
                raise self._corrupt(f"the stored snapshot text sha256:{digest} does not match its digest")
            ts = store.now_ms()
            store.freeze_snapshot(tx.conn, session_id, digest, language, ts, text if stored is None else None)
            stamp.audit(tx, "snapshot", track=None, scope=None, entry_id=None, text=snapshot_ref(digest), source=None,
                        ts=ts)
            self._keep(counted, (sessions + 1, held + size))
            return text, True

        try:
            final, first = await self.service.writer.submit(job)
        except (InvalidInput, StoreCorrupt):
            raise  # refused before the job wrote anything: the counts stand
        except BaseException:
            self._forget()
            raise
        if first:
            await ctx.notify("memory/snapshot", MemorySnapshot(session_id=session_id, text=final))
        else:
            undo()  # another request froze it first: this one took none
        return SnapshotResult(text=final)

    async def prune(self, ctx: RequestContext, p: SnapshotPruneParams) -> SnapshotPruneResult:
        facts = self.service.approvals.check_person(ctx.peer, "prune frozen snapshots")
        who = self.service.pipeline.who(ctx.peer)
        held = self.service.sessions.held()

        def job(tx: Tx) -> SnapshotPruneResult:
            sessions, texts, size = store.prune_snapshots(tx.conn, held, p.before)
            rows = []
            for k in range(0, len(sessions), PRUNE_ROW_SESSIONS):
                ledger.pruned(tx, who, sessions[k:k + PRUNE_ROW_SESSIONS], p.before, facts)
                rows.append(tx.tip[0] if tx.tip else 0)
            seen = self._held
            if seen is not None:
                self._keep(seen, (seen[0] - len(sessions), seen[1] - size))
            return SnapshotPruneResult(sessions=len(sessions), texts=texts, bytes=size, rows=rows)

        try:
            return await self.service.writer.submit(job)
        except BaseException:
            self._forget()
            raise
