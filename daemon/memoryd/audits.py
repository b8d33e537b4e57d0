"""The ledger's methods: audit rows (list), verification (with heads witnessed outside the
store), one entry's life (explain), and accepting a change made outside memoryd.

Every read runs on a reader's thread (readers.py), in one read transaction; an acceptance
is one writer job.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import anyio
from memoryd_protocol.audit_types import AuditAccepted, AuditAcceptParams, AuditVerifyParams
from memoryd_protocol.constants import AUDIT_DEFAULT_LIMIT, AUDIT_HARD_CAP
from memoryd_protocol.errors import InvalidInput, StoreCorrupt
from memoryd_protocol.ledger import audit_from
from memoryd_protocol.ledger_check import heads_problems, read_life, read_report, with_problems
from memoryd_protocol.types import AuditExplainParams, AuditListParams, AuditRow, EntryLife, LedgerReport

from . import foreign, ledger, store
from .context import Handler, RequestContext
from .tx import Tx

if TYPE_CHECKING:
    from .service import Service

T = TypeVar("T")
#: how many witnessed heads one statement looks up
_HEADS_PER_READ = 500


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


class Audits:
    def __init__(self, service: Service) -> None:
        self.service = service
        self._explaining = anyio.Lock()
        self._verify = Shared(self._verify_once)

    def handlers(self) -> dict[str, Handler]:
        return {
            "audit/list": self.audit_list,
            "audit/verify": self.audit_verify,
            "audit/explain": self.audit_explain,
            "audit/accept": self.audit_accept,
        }

    async def audit_list(self, ctx: RequestContext, p: AuditListParams) -> list[AuditRow]:
        limit = min(p.limit or AUDIT_DEFAULT_LIMIT, AUDIT_HARD_CAP)
        return await self.service.read(lambda c: audit_from(c.execute(store.AUDIT_LIST_SQL, (limit,))))

    async def audit_verify(self, ctx: RequestContext, p: AuditVerifyParams) -> LedgerReport:
        report = await self._verify()
        if not p.heads:
            return report
        wanted = [(h.n, h.hash) for h in p.heads]

        def found(c: Any) -> dict[int, str]:
            ns = sorted({n for n, _ in wanted})
            hashes: dict[int, str] = {}
            for k in range(0, len(ns), _HEADS_PER_READ):
                part = ns[k:k + _HEADS_PER_READ]
                hashes.update(c.execute(f"SELECT n, hash FROM memoryd_ledger WHERE n IN ({','.join('?' * len(part))})",
                                        part).fetchall())
            return hashes

        return with_problems(report, heads_problems(await self.service.readers.read(found), wanted))

    async def _verify_once(self) -> LedgerReport:
        await self.service.writer.look_outside(index=True)
        await self.service.writer.settled()
        anchor = self.service.writer.anchor
        head, lost = anchor.head, anchor.lost  # committed before the read begins: the read must hold it
        try:
            return await self.service.readers.read(
                lambda c: read_report(lambda sql: c.execute(sql).fetchall(), head, lost=lost))
        except sqlite3.Error as exc:
            if store.fault_reason(exc) is not None:
                raise
            # Writes already refuse such a store and send their user here: say what stops the read.
            raise StoreCorrupt(f"audit verify cannot read the store ({foreign.unreadable(exc)}): another program "
                               "changed it past what memoryd reads; undo that change, or restore the store from a "
                               "replica (memoryctl restore)", {"path": str(self.service.config.db_path)}) from None

    async def audit_explain(self, ctx: RequestContext, p: AuditExplainParams) -> EntryLife:
        async with self._explaining:
            await self.service.writer.settled()
            return await self.service.readers.read(lambda c: read_life(lambda sql: c.execute(sql).fetchall(), p.target))

    async def audit_accept(self, ctx: RequestContext, p: AuditAcceptParams) -> AuditAccepted:
        facts = self.service.approvals.check_person(ctx.peer, "accept a change made outside memoryd", "n")
        who = self.service.pipeline.who(ctx.peer)

        def accept(tx: Tx) -> int:
            row = tx.conn.execute("SELECT kind FROM memoryd_ledger WHERE n = ?", (p.n,)).fetchone()
            if row is None or row[0] != "foreign":
                raise InvalidInput(f"ledger row {p.n} records no change made outside memoryd: audit verify names "
                                   "the rows to accept", "n")
            done = tx.conn.execute("SELECT n FROM memoryd_ledger WHERE kind = 'accepted' AND ref = ?",
                                   (str(p.n),)).fetchone()
            if done is not None:
                raise InvalidInput(f"ledger row {p.n} was accepted already, by ledger row {done[0]}", "n")
            ledger.accepted(tx, who, p.n, facts)
            return tx.tip[0] if tx.tip else 0

        # runs while a schema change nobody accepted stops every other write
        return AuditAccepted(n=await self.service.writer.submit(foreign.Acceptance(accept)), foreign=p.n)
