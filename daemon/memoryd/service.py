"""The protocol pipeline: validation → budget pre-check → approval → writer commit → events.

One Service per daemon. Each method takes the request's context (``RequestContext``: the
calling connection, its notify, the request id) and its decoded params, and returns a wire
Struct or raises a ProtocolError. Reads go to the read
connection; every mutation is a job for the single writer, and every job re-checks what
the approval was granted on (the entry *by id*, the budget against current usage) before
it touches a row.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import stat
import time
import uuid
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import anyio
from memoryd_protocol import payloads
from memoryd_protocol.constants import (
    AUDIT_DEFAULT_LIMIT,
    AUDIT_HARD_CAP,
    GRID,
    MAX_IMPORT_ENTRIES,
    PROTOCOL,
    QUERY_HARD_CAP,
    RECALLED_TEXT_UNITS,
    STORE_SCHEMA_VERSION,
)
from memoryd_protocol.errors import EntryNotFound, InvalidInput
from memoryd_protocol.ledger import consistent, read_life, read_report
from memoryd_protocol.text import (
    check_storable,
    cut_units,
    js_trim,
    normalize_agent_key,
    normalize_tags,
    normalize_workspace_key,
    utf16_len,
)
from memoryd_protocol.types import (
    AddParams,
    ApprovalDecidedParams,
    AuditExplainParams,
    AuditListParams,
    AuditRow,
    BudgetRow,
    ConsolidateParams,
    ConsolidateResult,
    DaemonStatus,
    Empty,
    Entry,
    EntryInput,
    EntryLife,
    InitializeParams,
    InitializeResult,
    LedgerReport,
    MemoryAdded,
    MemoryRecalled,
    MemoryRemoved,
    MemoryUpdated,
    QueryParams,
    QueryResult,
    RemoveParams,
    ReplaceParams,
    ReplaceResult,
    SeedParams,
    SeedResult,
    ServerInfo,
    StoreInfo,
    WriteResult,
)
from memoryd_protocol.validation import (
    SessionView,
    Target,
    check_match,
    check_query_text,
    check_session_id,
    check_source,
    check_target,
    check_text,
    resolve_one,
    target_keys,
    writer_view,
)

from . import __version__, store
from .approvals import Approvals
from .config import Config
from .context import RequestContext
from .ledger import Stamp
from .owned import Owned
from .pipeline import Pipeline, WritePlan
from .sessions import Sessions
from .writer import Usage, Writer

if TYPE_CHECKING:
    from .connection import Connection

log = logging.getLogger("memoryd.service")
T = TypeVar("T")

VERSION = __version__

def stderr_file() -> str | None:
    """The file this process's stderr (its log) is appended to, or None when stderr is not
    a regular file (a terminal, a pipe, the journal) or /proc is not there to say."""
    try:
        if not stat.S_ISREG(os.fstat(2).st_mode):
            return None
        return os.readlink("/proc/self/fd/2")
    except OSError:
        return None


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


class Service:
    def __init__(self, config: Config, writer: Writer, reader: Owned, approvals: Approvals,
                 loop_reader: sqlite3.Connection, scanner: Owned | None = None) -> None:
        self.config = config
        self.writer = writer
        self.reader = reader
        #: Whole-ledger scans (audit/verify, audit/explain: seconds and hundreds of MiB on a
        #: large ledger) run on a connection and thread of their own, never queueing the
        #: reader's audit/list and export behind them; one scan of each kind at a time, and
        #: verifies asked while one runs share the next run (``Shared``).
        self.scanner = scanner if scanner is not None else reader
        self._explaining = anyio.Lock()
        self._verify = Shared(self._verify_once)
        #: Entry reads run right here on the event loop: the entries table is bounded by
        #: the budgets (a few thousand rows at most), and such a read costs less than the
        #: thread hop would add. The unbounded audit ledger is read on ``reader``'s thread.
        self.loop_reader = loop_reader
        self.approvals = approvals
        #: which open connection each session id belongs to (sessions.py)
        self.sessions = Sessions()
        self.started = time.monotonic()
        self.connections = 0
        #: the live connections, for ``daemon/status`` (the Daemon's own set)
        self.live: Collection[Connection] = ()
        #: Where the daemon listens, for ``daemon/status``: the socket it bound and unlinks
        #: on shutdown. The Daemon sets None when it serves no socket of its own (stdio, or
        #: a listener inherited from systemd socket activation).
        self.socket_path: Path | None = config.socket_path
        #: every write goes through it (pipeline.py)
        self.pipeline = Pipeline(config, writer, approvals, uuid.uuid4().hex[:12])

    # --- helpers -----------------------------------------------------------------------

    async def read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """A bounded read on the loop's own connection, after queued recall bookkeeping."""
        await self.writer.settled()
        return fn(self.loop_reader)

    async def read_off_loop(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """A read of unbounded size (the ledger) on the reader thread."""
        await self.writer.settled()
        # The reader's own thread (owned.py), not aiosqlite: these reads are one consistent
        # snapshot of several tables plus the work of verifying the chain, a function of a
        # connection. aiosqlite's public API would take a hop per statement, a lock around
        # BEGIN…COMMIT, and another thread for the hashing.
        return await self.reader.run(fn)

    def limit(self, track: str, scope: str) -> int:
        return self.config.budgets[(track, scope)]

    def row(self, usage: Usage, track: str, scope: str) -> BudgetRow:
        return BudgetRow(track=track, scope=scope, used=usage.get((track, scope), 0), limit=self.limit(track, scope))  # type: ignore[arg-type]

    def budget_rows(self) -> list[BudgetRow]:
        usage = self.writer.usage
        return [self.row(usage, t, s) for t, s in GRID]

    async def visible(self, view: SessionView, track: str, scope: str) -> list[Entry]:
        cell = await self.read(lambda c: store.cell_entries(c, track, scope))
        return [e for e in cell if view.sees(e.scope, e.workspace_key, e.agent_key)]

    async def resolve(self, view: SessionView, track: str, scope: str, match: str) -> Entry:
        entries = await self.visible(view, track, scope)
        by_id = {e.id: e for e in entries}
        return by_id[resolve_one(((e.id, e.text) for e in entries), track, scope, match)]

    async def resolve_target(self, view: SessionView, track: str, scope: str, target: Target) -> Entry:
        """The entry a replace/remove names: by unique substring, or by id. An id must name
        an entry of this track/scope that the session sees, exactly as a match must."""
        if target.match is not None:
            return await self.resolve(view, track, scope, target.match)
        for e in await self.visible(view, track, scope):
            if e.id == target.entry_id:
                return e
        raise EntryNotFound("no visible memory entry has this id", target.details(track, scope))

    def stop_writes(self) -> None:
        """Shutdown has begun: from now on the gate admits no write. Every write that
        reaches it is denied (``cancelled``, its denied row first), and so is every write
        still waiting for an approval."""
        self.pipeline.stopping = True
        self.approvals.cancel_all("cancelled")

    # --- lifecycle ---------------------------------------------------------------------

    async def initialize(self, ctx: RequestContext, p: InitializeParams) -> InitializeResult:
        if p.protocol is not None and p.protocol != PROTOCOL:
            raise InvalidInput(f"unsupported protocol {p.protocol!r}; this daemon speaks {PROTOCOL}", "protocol")
        peer = ctx.peer
        if p.capabilities is not None and not p.capabilities.approvals:
            # One-way: a connection that cannot approve never becomes one that can, or a
            # model-side tool could re-initialize and approve its own writes.
            peer.can_approve = False
            self.approvals.unsubscribe(peer)
        peer.client = p.client  # shown as the origin of this connection's approvals
        return InitializeResult(
            protocol=PROTOCOL,
            server=ServerInfo(name="memoryd", version=VERSION),
            schema_version=STORE_SCHEMA_VERSION,
            write_policy=self.config.write_policy,  # type: ignore[arg-type]
            budgets=self.budget_rows(),
        )

    async def status(self, ctx: RequestContext, p: Any) -> DaemonStatus:
        return DaemonStatus(
            version=VERSION,
            uptime_s=round(time.monotonic() - self.started, 3),
            connections=self.connections,
            pending_approvals=len(self.approvals),
            queue_depth=self.writer.depth,
            store=StoreInfo(path=str(self.config.db_path), schema_version=STORE_SCHEMA_VERSION),
            pid=os.getpid(),
            write_policy=self.config.write_policy,  # type: ignore[arg-type]
            socket=None if self.socket_path is None else str(self.socket_path),
            config=None if self.config.config_path is None else str(self.config.config_path),
            log=stderr_file(),
            connection_list=[c.listing(approver=c in self.approvals.approvers)
                             for c in sorted(self.live, key=lambda c: c.id)],
        )

    async def approval_decided(self, ctx: RequestContext, p: ApprovalDecidedParams) -> Empty:
        if p.by is not None and p.by.name is not None:
            check_storable(p.by.name, "by.name")
        self.approvals.decide(ctx.peer, p.id, p.outcome, p.by)
        return Empty()

    async def approval_subscribe(self, ctx: RequestContext, p: Any) -> Empty:
        peer = ctx.peer
        if not peer.can_approve:
            raise InvalidInput("a connection that declared capabilities.approvals false cannot be an approver")
        if self.config.approvers == "interactive" and (peer.peer is None or not peer.peer.interactive()):
            raise InvalidInput('only a process with a controlling terminal can subscribe as an approver; '
                               'set approvers = "any" in the daemon\'s config to admit others')
        self.approvals.subscribe(peer)
        return Empty()

    # --- reads -------------------------------------------------------------------------

    async def budgets(self, ctx: RequestContext, p: Any) -> list[BudgetRow]:
        return self.budget_rows()

    async def list_entries(self, ctx: RequestContext, p: Any) -> list[Entry]:
        return await self.read(store.list_entries)

    async def audit_list(self, ctx: RequestContext, p: AuditListParams) -> list[AuditRow]:
        limit = min(p.limit or AUDIT_DEFAULT_LIMIT, AUDIT_HARD_CAP)
        return await self.read_off_loop(lambda c: store.audit_list(c, limit))

    async def audit_verify(self, ctx: RequestContext, p: Any) -> LedgerReport:
        return await self._verify()

    async def _verify_once(self) -> LedgerReport:
        await self.writer.settled()
        head = self.writer.anchor.head  # committed before the read begins: the read must hold it
        return await self.scanner.run(lambda c: consistent(c, lambda fetch: read_report(fetch, head)))

    async def audit_explain(self, ctx: RequestContext, p: AuditExplainParams) -> EntryLife:
        async with self._explaining:
            await self.writer.settled()
            return await self.scanner.run(lambda c: consistent(c, lambda fetch: read_life(fetch, p.target)))

    async def query(self, ctx: RequestContext, p: QueryParams) -> QueryResult:
        f = p.filter
        o = p.opts
        text = f.text if f and f.text else None
        if text is not None:
            if not js_trim(text):
                text = None
            else:
                check_query_text(text, "filter.text")
        limit = min(f.limit if f and f.limit else self.config.max_entries_per_query, QUERY_HARD_CAP)
        session_id = o.session_id if o else None
        if session_id is not None:
            check_match(session_id, "opts.sessionId")
            check_session_id(session_id, "opts.sessionId")
        agent_key = normalize_agent_key(o.agent_key) if o and o.agent_key is not None else None
        workspace_key = normalize_workspace_key(o.workspace_key) if o and o.workspace_key is not None else None
        track = f.track if f else None
        scope = f.scope if f else None

        hits, total = await self.writer.with_recalls(lambda boosted: store.query_page(
            self.loop_reader, track=track, scope=scope, text=text, agent_key=agent_key, workspace_key=workspace_key,
            limit=limit, boosted=boosted))
        page = hits[:limit]
        ts = store.now_ms()
        stamp = Stamp(origin=self.pipeline.who(ctx.peer), session_id=session_id)

        def recalled(conn: sqlite3.Connection) -> None:
            stamp.audit(conn, "recalled", track=track, scope=scope, entry_id=None,
                        text=cut_units(text, RECALLED_TEXT_UNITS) if text else "", source=None, ts=ts)

        # Recall counters and the recalled row are bookkeeping, not an acknowledged write:
        # the reply does not wait for their commit. The writer's overlay keeps every next
        # query exact meanwhile, and ledger reads flush them first (Writer.settled).
        self.writer.record_recalls(page, ts, recalled if session_id is not None else None)
        if session_id is not None:
            await ctx.notify("memory/recalled", MemoryRecalled(query=text or "", matches=total, session_id=session_id))
        return QueryResult(entries=page, total=total, truncated=total > len(page))

    # --- writes ------------------------------------------------------------------------

    def new_entry(
        self,
        view: SessionView,
        *,
        track: str,
        scope: str,
        text: str,
        source: str,
        tags: list[str],
        workspace_key: str,
        agent_key: str,
        ts: int,
    ) -> Entry:
        return Entry(
            id=store.new_id(),
            track=track,  # type: ignore[arg-type]
            scope=scope,  # type: ignore[arg-type]
            workspace_key=workspace_key,
            agent_key=agent_key,
            text=text,
            source=source,
            tags=tags,
            version=1,
            created_at=ts,
            updated_at=ts,
            last_recalled=None,
            recall_count=0,
            session_id=view.session_id,
        )

    async def add(self, ctx: RequestContext, p: AddParams) -> WriteResult:
        view = writer_view(p.write)
        i = p.input
        text = check_text(i.text)
        tags = normalize_tags(i.tags)
        source = check_source(i.source)
        wk, ak = target_keys(i.scope, view, i.workspace_key, i.agent_key, restricted=True)
        cell = (i.track, i.scope)

        def commit(conn: sqlite3.Connection, stamp: Stamp, usage: Usage) -> WriteResult:
            e = self.new_entry(view, track=i.track, scope=i.scope, text=text, source=source, tags=tags,
                               workspace_key=wk, agent_key=ak, ts=store.now_ms())
            store.insert_entry(conn, e)
            stamp.audit(conn, "add", track=e.track, scope=e.scope, entry_id=e.id, text=e.text, source=source,
                        entry=e, ts=e.created_at)
            return WriteResult(entry=e, usage=self.row(usage, *cell))

        return await self.pipeline.run(ctx, view, WritePlan(
            action="add", track=i.track, scope=i.scope, text=payloads.add_text(text), source=source,
            layers=[cell], sources=[source], deltas={cell: utf16_len(text)}, commit=commit,
            events=lambda r: [("memory/added", MemoryAdded(entry=r.entry))], lands=(wk, ak, tags)))

    @staticmethod
    def still_same(conn: sqlite3.Connection, approved: Entry, match: str | None) -> Entry:
        """The approved entry, re-read by id, unchanged since the human saw it."""
        details: dict[str, str] = {"track": approved.track, "scope": approved.scope}
        if match is not None:
            details["match"] = match
        details["entryId"] = approved.id
        current = store.get_entry(conn, approved.id)
        if current is None:
            raise EntryNotFound("the approved entry was removed while the approval was pending", details)
        if current.text != approved.text or current.version != approved.version:
            raise EntryNotFound("the approved entry changed while the approval was pending", details)
        return current

    async def replace(self, ctx: RequestContext, p: ReplaceParams) -> ReplaceResult:
        view = writer_view(p.write)
        i = p.input
        selector = check_target(i.match, i.id)
        match = selector.match
        text = check_text(i.text)
        tags = normalize_tags(i.tags) if i.tags is not None else None
        target = await self.resolve_target(view, i.track, i.scope, selector)
        cell = (i.track, i.scope)

        def commit(conn: sqlite3.Connection, stamp: Stamp, usage: Usage) -> ReplaceResult:
            previous = self.still_same(conn, target, match)
            e = Entry(**{f: getattr(previous, f) for f in Entry.__struct_fields__})
            e.text = text
            e.tags = tags if tags is not None else list(previous.tags)
            e.version = previous.version + 1
            e.updated_at = max(store.now_ms(), previous.updated_at)
            e.session_id = view.session_id
            store.update_entry(conn, e)
            stamp.audit(conn, "replace", track=e.track, scope=e.scope, entry_id=e.id, text=e.text, source=e.source,
                        entry=e, ts=e.updated_at)
            return ReplaceResult(previous=previous, entry=e, usage=self.row(usage, *cell))

        # A replacement keeps the target's source: that one source is the old text's and the new one's.
        return await self.pipeline.run(ctx, view, WritePlan(
            action="replace", track=i.track, scope=i.scope, text=payloads.replace_text(target.text, text),
            source=target.source, layers=[cell], sources=[target.source],
            deltas={cell: utf16_len(text) - utf16_len(target.text)}, commit=commit,
            events=lambda r: [("memory/updated", MemoryUpdated(previous=r.previous, entry=r.entry))],
            entry_id=target.id, lands=(target.workspace_key, target.agent_key, tags if tags is not None else target.tags)))

    async def remove(self, ctx: RequestContext, p: RemoveParams) -> WriteResult:
        view = writer_view(p.write)
        i = p.input
        selector = check_target(i.match, i.id)
        match = selector.match
        target = await self.resolve_target(view, i.track, i.scope, selector)
        cell = (i.track, i.scope)

        def commit(conn: sqlite3.Connection, stamp: Stamp, usage: Usage) -> WriteResult:
            previous = self.still_same(conn, target, match)
            store.delete_entry(conn, previous.id)
            stamp.audit(conn, "remove", track=previous.track, scope=previous.scope, entry_id=previous.id,
                        text=previous.text, source=previous.source)
            return WriteResult(entry=previous, usage=self.row(usage, *cell))

        return await self.pipeline.run(ctx, view, WritePlan(
            action="remove", track=i.track, scope=i.scope, text=payloads.remove_text(target.text),
            source=target.source, layers=[cell], sources=[target.source], deltas={cell: -utf16_len(target.text)},
            commit=commit, events=lambda r: [("memory/removed", MemoryRemoved(entry=r.entry))],
            entry_id=target.id, lands=(target.workspace_key, target.agent_key, target.tags)))

    async def consolidate(self, ctx: RequestContext, p: ConsolidateParams) -> ConsolidateResult:
        view = writer_view(p.write)
        i = p.input
        matches = [check_match(m, f"matches[{n}]") for n, m in enumerate(i.matches)]
        text = check_text(i.text)
        tags = normalize_tags(i.tags)
        entries = await self.visible(view, i.track, i.scope)
        by_id = {e.id: e for e in entries}
        targets: list[Entry] = []
        for m in matches:
            t = by_id[resolve_one(((e.id, e.text) for e in entries), i.track, i.scope, m)]
            if any(t.id == x.id for x in targets):
                raise InvalidInput("two matches resolve to the same entry", "matches")
            targets.append(t)
        cell = (i.track, i.scope)
        # Merging the session's private entries with shared ones keeps the result private:
        # consolidation must never widen who can see a text.
        ak = view.agent_key if any(t.agent_key for t in targets) else ""
        wk = view.workspace_key if i.scope == "workspace" else ""
        source = check_source(None)

        def commit(conn: sqlite3.Connection, stamp: Stamp, usage: Usage) -> ConsolidateResult:
            removed = [self.still_same(conn, t, m) for t, m in zip(targets, matches, strict=True)]
            ts = store.now_ms()
            for r in removed:
                store.delete_entry(conn, r.id)
                stamp.audit(conn, "consolidate-remove", track=r.track, scope=r.scope, entry_id=r.id, text=r.text,
                            source=r.source, ts=ts)
            e = self.new_entry(view, track=i.track, scope=i.scope, text=text, source=source, tags=tags,
                               workspace_key=wk, agent_key=ak, ts=ts)
            store.insert_entry(conn, e)
            stamp.audit(conn, "consolidate-add", track=e.track, scope=e.scope, entry_id=e.id, text=e.text,
                        source=source, entry=e, ts=ts)
            return ConsolidateResult(removed=removed, entry=e, usage=self.row(usage, *cell))

        return await self.pipeline.run(ctx, view, WritePlan(
            action="consolidate", track=i.track, scope=i.scope,
            text=payloads.consolidate_text([(m, t.text) for m, t in zip(matches, targets, strict=True)], text),
            source=source, layers=[cell], sources=[source, *(t.source for t in targets)],
            deltas={cell: utf16_len(text) - sum(utf16_len(t.text) for t in targets)}, commit=commit,
            events=lambda r: [*(("memory/removed", MemoryRemoved(entry=x)) for x in r.removed),
                              ("memory/added", MemoryAdded(entry=r.entry))],
            lands=(wk, ak, tags)))

    def plan_seed(self, view: SessionView, inputs: Sequence[EntryInput], source_override: str | None = None,
                  *, restricted: bool = True) -> list[Entry]:
        if not inputs:
            raise InvalidInput("inputs must not be empty", "inputs")
        if len(inputs) > MAX_IMPORT_ENTRIES:
            raise InvalidInput(f"at most {MAX_IMPORT_ENTRIES} entries per batch", "inputs")
        planned: list[Entry] = []
        for n, i in enumerate(inputs):
            try:
                text = check_text(i.text)
                tags = normalize_tags(i.tags)
                source = check_source(source_override if i.source is None else i.source)
                wk, ak = target_keys(i.scope, view, i.workspace_key, i.agent_key, restricted=restricted)
            except InvalidInput as exc:
                field = exc.details.get("field", "")
                raise InvalidInput(f"inputs[{n}]: {exc.message}", f"inputs[{n}].{field}" if field else f"inputs[{n}]"
                                   ) from None
            planned.append(self.new_entry(view, track=i.track, scope=i.scope, text=text, source=source, tags=tags,
                                          workspace_key=wk, agent_key=ak, ts=0))
        return planned

    async def seed_planned(self, ctx: RequestContext, view: SessionView, planned: list[Entry]) -> SeedResult:
        deltas: dict[tuple[str, str], int] = {}
        for e in planned:
            deltas[(e.track, e.scope)] = deltas.get((e.track, e.scope), 0) + utf16_len(e.text)
        text = payloads.seed_text([(e.track, e.scope, e.text) for e in planned])
        sources = {e.source for e in planned}
        source = sources.pop() if len(sources) == 1 else check_source(None)

        def commit(conn: sqlite3.Connection, stamp: Stamp, usage: Usage) -> SeedResult:
            ts = store.now_ms()
            stamp.audit(conn, "seed", track="batch", scope="batch", entry_id=None, text=text, source=source, ts=ts)
            for e in planned:
                e.created_at = e.updated_at = ts
                store.insert_entry(conn, e)
                stamp.audit(conn, "add", track=e.track, scope=e.scope, entry_id=e.id, text=e.text, source=e.source,
                            entry=e, ts=ts)
            return SeedResult(added=len(planned), entries=planned)

        return await self.pipeline.run(ctx, view, WritePlan(
            action="seed", track="batch", scope="batch", text=text, source=source,
            layers=[(e.track, e.scope) for e in planned], sources=[e.source for e in planned], deltas=deltas,
            commit=commit, events=lambda r: [("memory/added", MemoryAdded(entry=e)) for e in r.entries],
            count=len(planned), entries=planned))

    async def seed(self, ctx: RequestContext, p: SeedParams) -> SeedResult:
        view = writer_view(p.write)
        return await self.seed_planned(ctx, view, self.plan_seed(view, p.inputs))
