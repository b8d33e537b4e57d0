"""The read methods: budgets, list and queries (audits.py has the ledger's).

Every read runs on a reader's thread (readers.py), in one read transaction. A query's
recalls (its page's recall counts, and its ``recalled`` row) are then a job of the writer's,
as any write is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memoryd_protocol.constants import (
    QUERY_HARD_CAP,
    RECALLED_TEXT_UNITS,
)
from memoryd_protocol.errors import StoreCorrupt, StoreUnavailable
from memoryd_protocol.text import (
    cut_units,
    js_trim,
    normalize_agent_key,
    normalize_workspace_key,
)
from memoryd_protocol.types import (
    BudgetRow,
    Entry,
    MemoryRecalled,
    QueryParams,
    QueryResult,
)
from memoryd_protocol.validation import (
    check_match,
    check_query_text,
    check_session_id,
)

from . import queries, store
from .context import Handler, RequestContext
from .ledger import Stamp
from .tx import Tx
from .writer import WriterClosed

if TYPE_CHECKING:
    from .service import Service

class Reads:
    def __init__(self, service: Service) -> None:
        self.service = service

    def handlers(self) -> dict[str, Handler]:
        return {
            "memory/query": self.query,
            "memory/budgets": self.budgets,
            "memory/list": self.list_entries,
        }

    async def budgets(self, ctx: RequestContext, p: Any) -> list[BudgetRow]:
        return self.service.budget_rows()

    async def list_entries(self, ctx: RequestContext, p: Any) -> list[Entry]:
        return await self.service.read(store.list_entries)

    async def query(self, ctx: RequestContext, p: QueryParams) -> QueryResult:
        f = p.filter
        o = p.opts
        text = f.text if f and f.text else None
        if text is not None:
            if not js_trim(text):
                text = None
            else:
                check_query_text(text, "filter.text")
        # As the reference: a limit below 1 asks for the default page, not for an error.
        limit = min(f.limit if f and f.limit and f.limit > 0 else self.service.config.max_entries_per_query, QUERY_HARD_CAP)
        session_id = o.session_id if o else None
        if session_id is not None:
            check_match(session_id, "opts.sessionId")
            check_session_id(session_id, "opts.sessionId")
        agent_key = normalize_agent_key(o.agent_key) if o and o.agent_key is not None else None
        aliases = self.service.config.workspace_aliases
        workspace_key = normalize_workspace_key(o.workspace_key, aliases) if o and o.workspace_key is not None else None
        track = f.track if f else None
        scope = f.scope if f else None

        hits, total = await self.service.readers.read(lambda c: queries.query_page(
            c, track=track, scope=scope, text=text, agent_key=agent_key, workspace_key=workspace_key, limit=limit))
        ts = store.now_ms()
        stamp = None if session_id is None else Stamp(origin=self.service.pipeline.who(ctx.peer), session_id=session_id)
        ids = [e.id for e in hits]

        def row(tx: Tx) -> None:
            if stamp is not None:  # only a query that names its session leaves a ledger row
                stamp.audit(tx, "recalled", track=track, scope=scope, entry_id=None,
                            text=cut_units(text, RECALLED_TEXT_UNITS) if text else "", source=None, ts=ts)

        def recalled(tx: Tx) -> dict[str, int]:
            counts = store.recall(tx.conn, ids, ts) if ids else {}
            row(tx)
            return counts

        # Recall counts and the recalled row are ranking and audit metadata, not a write the
        # caller asked for: their commit may skip the fsync (durable=False), and queries in
        # flight together share it. The page shows each entry's count as its own recall left
        # it. A store that cannot take the commit (busy, full, or refusing writes over another
        # program's change) does not fail the query: its hits are served as read, uncounted,
        # and the writer has logged why. Its recalled row is kept and written with the first
        # batch the store takes, as the approval rows are: every recall of a session leaves one.
        counts: dict[str, int] = {}
        try:
            if ids or stamp is not None:
                counts = await self.service.writer.submit(recalled, durable=False)
        except (StoreUnavailable, StoreCorrupt, WriterClosed):
            if stamp is not None:
                self.service.writer.defer(row, keep=True)
        for e in hits:
            if e.id in counts:
                e.recall_count, e.last_recalled = counts[e.id], ts
        hits.sort(key=queries.rank)
        if session_id is not None:
            await ctx.notify("memory/recalled", MemoryRecalled(query=text or "", matches=total, session_id=session_id))
        return QueryResult(entries=hits, total=total, truncated=total > len(hits))

