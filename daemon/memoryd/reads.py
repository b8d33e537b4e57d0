"""The read methods: budgets, list, the audit ledger (list, verify, explain) and queries.

Every read runs on a reader's thread (readers.py), in one read transaction.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import anyio
from memoryd_protocol.constants import (
    AUDIT_DEFAULT_LIMIT,
    AUDIT_HARD_CAP,
    QUERY_HARD_CAP,
    RECALLED_TEXT_UNITS,
)
from memoryd_protocol.ledger_check import read_life, read_report
from memoryd_protocol.text import (
    cut_units,
    js_trim,
    normalize_agent_key,
    normalize_workspace_key,
)
from memoryd_protocol.types import (
    AuditExplainParams,
    AuditListParams,
    AuditRow,
    BudgetRow,
    Entry,
    EntryLife,
    LedgerReport,
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

T = TypeVar("T")


@dataclass(eq=False)
class _Run(Generic[T]):
    done: anyio.Event = field(default_factory=anyio.Event)
    result: T | None = None
    error: Exception | None = None


class Shared(Generic[T]):
    """One run of ``fn`` at a time; callers that arrive while one runs share the next run,
    which starts after they asked (so it sees everything committed before they asked).
    However many clients ask, at most one run is under way and one waits. The run is
    shielded: a caller that goes away does not fail the others who share it."""

    def __init__(self, fn: Callable[[], Awaitable[T]]) -> None:
        self._fn = fn
        self._lock = anyio.Lock()
        self._next: _Run[T] | None = None

    async def __call__(self) -> T:
        run = self._next
        if run is None:
            run = self._next = _Run()
            with anyio.CancelScope(shield=True):
                async with self._lock:
                    self._next = None  # who asks from now on waits for the run after this one
                    try:
                        run.result = await self._fn()
                    except Exception as exc:
                        run.error = exc
                    finally:
                        run.done.set()
        else:
            await run.done.wait()
        if run.error is not None:
            raise run.error
        result: T = run.result  # type: ignore[assignment]
        return result


class Reads:
    def __init__(self, s: Service) -> None:
        self.s = s
        self._explaining = anyio.Lock()
        self._verify = Shared(self._verify_once)

    def handlers(self) -> dict[str, Handler]:
        return {
            "memory/query": self.query,
            "memory/budgets": self.budgets,
            "memory/list": self.list_entries,
            "audit/list": self.audit_list,
            "audit/verify": self.audit_verify,
            "audit/explain": self.audit_explain,
        }

    async def budgets(self, ctx: RequestContext, p: Any) -> list[BudgetRow]:
        return self.s.budget_rows()

    async def list_entries(self, ctx: RequestContext, p: Any) -> list[Entry]:
        return await self.s.read(store.list_entries)

    async def audit_list(self, ctx: RequestContext, p: AuditListParams) -> list[AuditRow]:
        limit = min(p.limit or AUDIT_DEFAULT_LIMIT, AUDIT_HARD_CAP)
        return await self.s.read(lambda c: [store.row_to_audit(r) for r in c.execute(store.AUDIT_LIST_SQL, (limit,))])

    async def audit_verify(self, ctx: RequestContext, p: Any) -> LedgerReport:
        return await self._verify()

    async def _verify_once(self) -> LedgerReport:
        await self.s.writer.settled()
        head = self.s.writer.anchor.head  # committed before the read begins: the read must hold it
        return await self.s.readers.run(lambda c: read_report(lambda sql: c.execute(sql).fetchall(), head))

    async def audit_explain(self, ctx: RequestContext, p: AuditExplainParams) -> EntryLife:
        async with self._explaining:
            await self.s.writer.settled()
            return await self.s.readers.run(lambda c: read_life(lambda sql: c.execute(sql).fetchall(), p.target))

    async def query(self, ctx: RequestContext, p: QueryParams) -> QueryResult:
        f = p.filter
        o = p.opts
        text = f.text if f and f.text else None
        if text is not None:
            if not js_trim(text):
                text = None
            else:
                check_query_text(text, "filter.text")
        limit = min(f.limit if f and f.limit else self.s.config.max_entries_per_query, QUERY_HARD_CAP)
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

