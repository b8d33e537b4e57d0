"""The read methods: budgets, list and queries (audits.py has the ledger's).

Every read runs on a reader's thread (readers.py), in one read transaction.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection
from typing import TYPE_CHECKING, Any

from memoryd_protocol.constants import (
    QUERY_HARD_CAP,
    RECALLED_TEXT_UNITS,
)
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

if TYPE_CHECKING:
    from .service import Service

class Reads:
    def __init__(self, s: Service) -> None:
        self.s = s

    def handlers(self) -> dict[str, Handler]:
        return {
            "memory/query": self.query,
            "memory/budgets": self.budgets,
            "memory/list": self.list_entries,
        }

    async def budgets(self, ctx: RequestContext, p: Any) -> list[BudgetRow]:
        return self.s.budget_rows()

    async def list_entries(self, ctx: RequestContext, p: Any) -> list[Entry]:
        return await self.s.read(store.list_entries)

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
        limit = min(f.limit if f and f.limit and f.limit > 0 else self.s.config.max_entries_per_query, QUERY_HARD_CAP)
        session_id = o.session_id if o else None
        if session_id is not None:
            check_match(session_id, "opts.sessionId")
            check_session_id(session_id, "opts.sessionId")
        agent_key = normalize_agent_key(o.agent_key) if o and o.agent_key is not None else None
        workspace_key = normalize_workspace_key(o.workspace_key) if o and o.workspace_key is not None else None
        track = f.track if f else None
        scope = f.scope if f else None

        small = self.s.small()

        def read(boosted: Collection[str]) -> Awaitable[tuple[list[Entry], int, int]]:
            return self.s.readers.run(lambda c: (*queries.query_page(
                c, track=track, scope=scope, text=text, agent_key=agent_key, workspace_key=workspace_key,
                limit=limit, boosted=boosted), store.recall_seq(c)), small=small)

        hits, total = await self.s.writer.with_recalls(read)
        page = hits[:limit]
        ts = store.now_ms()
        recalled: Callable[[Tx], None] | None = None
        if session_id is not None:  # only a query that names its session leaves a ledger row
            stamp = Stamp(origin=self.s.pipeline.who(ctx.peer), session_id=session_id)

            def recalled(tx: Tx) -> None:
                stamp.audit(tx, "recalled", track=track, scope=scope, entry_id=None,
                            text=cut_units(text, RECALLED_TEXT_UNITS) if text else "", source=None, ts=ts)

        # Recall counters and the recalled row are bookkeeping, not an acknowledged write:
        # the reply does not wait for their commit. The writer's overlay keeps every next
        # query exact meanwhile, and ledger reads flush them first (Writer.settled).
        self.s.writer.record_recalls(page, ts, recalled)
        if session_id is not None:
            await ctx.notify("memory/recalled", MemoryRecalled(query=text or "", matches=total, session_id=session_id))
        return QueryResult(entries=page, total=total, truncated=total > len(page))

