"""The rest of the protocol around the core pipeline: frozen snapshots, proposals,
export/import and adapters. Every mutation still goes through the Service's approval gate
and the single writer."""

from __future__ import annotations

import datetime as dt
import sqlite3
from typing import Any

import msgspec
from memoryd_protocol.adapters import adapt_payload, export_entries, get_adapter, json_type
from memoryd_protocol.constants import EXPORT_PLUGIN, EXPORT_SCHEMA, MAX_IMPORT_ENTRIES
from memoryd_protocol.errors import InvalidInput, ProposalNotFound
from memoryd_protocol.snapshot import render, visible_proposals
from memoryd_protocol.text import js_trim, utf16_len
from memoryd_protocol.types import (
    AdapterInfo,
    Entry,
    EntryInput,
    ExportParams,
    ImportParams,
    MemoryAdded,
    MemorySnapshot,
    Proposal,
    ProposalApproveParams,
    ProposalApproveResult,
    ProposalCreateParams,
    ProposalDismissParams,
    ProposalListParams,
    SeedResult,
    SnapshotParams,
    SnapshotResult,
)
from memoryd_protocol.validation import check_source, check_text, session_view, target_keys, writer_view

from . import ledger, store
from .context import Handler, RequestContext
from .ledger import Stamp
from .pipeline import WritePlan
from .service import Service
from .writer import Usage

PROPOSAL_SOURCE = "proposal"


class _ImportedEntry(msgspec.Struct, rename="camel", kw_only=True):
    """An envelope entry as import reads it: ids, timestamps and counters are dropped
    (imports get fresh ones); unknown fields are ignored."""

    track: str
    scope: str
    text: str
    tags: list[str] | None = None
    source: str | None = None
    workspace_key: str | None = None
    agent_key: str | None = None


class _Envelope(msgspec.Struct, rename="camel", kw_only=True):
    plugin: str
    schema: str
    entries: list[Any]


EntryKey = tuple[str, str, str, str, str]


def entry_key(e: Entry) -> EntryKey:
    """What makes an imported entry one that already exists: its layer, keys and text."""
    return (e.track, e.scope, e.workspace_key, e.agent_key, e.text)


def existing_keys(conn: sqlite3.Connection) -> set[EntryKey]:
    rows = conn.execute("SELECT track, scope, workspace_key, agent_key, text FROM entries")
    return {(track, scope, wk or "", ak or "", text) for track, scope, wk, ak, text in rows}


class Lifecycle:
    def __init__(self, service: Service, adapters: dict[str, Any]) -> None:
        self.s = service
        self.adapters = adapters
        #: proposal ids with a decision in flight: the first decision claims the id, a
        #: concurrent second one is refused at once instead of prompting the human twice.
        self._deciding: set[str] = set()

    def handlers(self) -> dict[str, Handler]:
        return {
            "memory/snapshot": self.snapshot,
            "memory/export": self.export,
            "memory/import": self.import_,
            "adapters/list": self.adapters_list,
            "proposals/create": self.proposals_create,
            "proposals/list": self.proposals_list,
            "proposals/approve": self.proposals_approve,
            "proposals/dismiss": self.proposals_dismiss,
        }

    # --- snapshot ----------------------------------------------------------------------

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

        def gather(c: sqlite3.Connection) -> tuple[list[Entry], list[Proposal]]:
            return store.list_entries(c), store.proposals(c, "pending")

        entries, pending = await self.s.read(gather)
        visible = [(e.track, e.scope, e.text) for e in entries if view.sees(e.scope, e.workspace_key, e.agent_key)]
        # every pending proposal this session sees (not only its own), as the reference lists them
        shown = [(x.id, x.track, x.scope, x.text)
                 for x in visible_proposals(pending, view, self.s.config.proposal_max_pending)]
        usage = {cell: (used, self.s.config.budgets[cell]) for cell, used in self.s.writer.usage.items()}
        text = render(visible, usage, shown, language)  # type: ignore[arg-type]

        stamp = self.s.pipeline.stamp(ctx.peer, view)

        def job(conn: sqlite3.Connection, _usage: Usage) -> tuple[str, bool]:
            existing = store.frozen_snapshot(conn, session_id)
            if existing is not None:
                return existing, False
            ts = store.now_ms()
            store.freeze_snapshot(conn, session_id, text, language, ts)
            stamp.audit(conn, "snapshot", track=None, scope=None, entry_id=None, text=text, source=None, ts=ts)
            return text, True

        final, first = await self.s.writer.submit(job)
        if first:
            await ctx.notify("memory/snapshot", MemorySnapshot(session_id=session_id, text=final))
        return SnapshotResult(text=final)

    # --- proposals ---------------------------------------------------------------------

    async def proposals_create(self, ctx: RequestContext, p: ProposalCreateParams) -> Proposal | None:
        view = session_view(p.session)
        session_id = view.session_id
        if not session_id or not js_trim(session_id):
            raise InvalidInput("session.id is required", "session.id")
        self.s.sessions.require_own(ctx.peer, session_id, "create proposals for it")
        i = p.input
        text = check_text(i.text)
        cap = self.s.config.proposal_max_text
        if utf16_len(text) > cap:
            raise InvalidInput(f"proposal text longer than {cap} characters", "input.text")
        kind = check_text(i.kind, "input.kind")
        source = check_source(i.source)
        wk, ak = target_keys(i.scope, view, None, None, restricted=True)
        max_pending = self.s.config.proposal_max_pending
        origin = self.s.pipeline.who(ctx.peer)

        def job(conn: sqlite3.Connection, _usage: Usage) -> Proposal | None:
            row = conn.execute("SELECT status, id FROM proposals WHERE session_id = ? AND kind = ?",
                               (session_id, kind)).fetchone()
            if row is not None and row[0] == "pending":
                return None
            (pending,) = conn.execute("SELECT count(*) FROM proposals WHERE status = 'pending'").fetchone()
            if pending >= max_pending:
                raise InvalidInput(f"too many pending proposals (at most {max_pending})", "input")
            if row is not None:
                # UNIQUE(session_id, kind) is the reference's layout: a decided proposal
                # makes room for the session's next one of that kind.
                conn.execute("DELETE FROM proposals WHERE session_id = ? AND kind = ?", (session_id, kind))
            proposal = Proposal(id=store.new_id(), kind=kind, track=i.track, scope=i.scope, workspace_key=wk,
                                agent_key=ak, text=text, source=source, session_id=session_id, status="pending",
                                created_at=store.now_ms(), decided_at=None)
            store.insert_proposal(conn, proposal)
            ledger.proposal(conn, origin, "created", proposal, replaces=row[1] if row is not None else None)
            return proposal

        return await self.s.writer.submit(job)

    async def proposals_list(self, ctx: RequestContext, p: ProposalListParams) -> list[Proposal]:
        return await self.s.read(lambda c: store.proposals(c, p.status))

    async def _pending(self, proposal_id: str) -> Proposal:
        proposal = await self.s.read(lambda c: store.get_proposal(c, proposal_id))
        if proposal is None or proposal.status != "pending" or proposal_id in self._deciding:
            raise ProposalNotFound("no pending proposal with this id", {"id": proposal_id})
        return proposal

    async def proposals_approve(self, ctx: RequestContext, p: ProposalApproveParams) -> ProposalApproveResult:
        view = writer_view(p.write)
        proposal = await self._pending(p.id)
        self._deciding.add(p.id)
        cell = (proposal.track, proposal.scope)

        def commit(conn: sqlite3.Connection, stamp: Stamp, usage: Usage) -> ProposalApproveResult:
            ts = store.now_ms()
            if not store.decide_proposal(conn, proposal.id, "approved", ts):
                raise ProposalNotFound("no pending proposal with this id", {"id": proposal.id})
            e = self.s.new_entry(view, track=proposal.track, scope=proposal.scope, text=proposal.text,
                                 source=PROPOSAL_SOURCE, tags=[], workspace_key=proposal.workspace_key,
                                 agent_key=proposal.agent_key, ts=ts)
            store.insert_entry(conn, e)
            stamp.audit(conn, "add", track=e.track, scope=e.scope, entry_id=e.id, text=e.text, source=PROPOSAL_SOURCE,
                        entry=e, ts=ts)
            decided = store.get_proposal(conn, proposal.id)
            assert decided is not None
            ledger.proposal(conn, stamp.origin, "approved", decided)
            return ProposalApproveResult(proposal=decided, entry=e, usage=self.s.row(usage, *cell))

        try:
            return await self.s.pipeline.run(ctx, view, WritePlan(
                action="add", track=proposal.track, scope=proposal.scope, text=proposal.text, source=PROPOSAL_SOURCE,
                layers=[cell], sources=[PROPOSAL_SOURCE], deltas={cell: utf16_len(proposal.text)}, commit=commit,
                events=lambda r: [("memory/added", MemoryAdded(entry=r.entry))],
                lands=(proposal.workspace_key, proposal.agent_key, [])))
        finally:
            self._deciding.discard(p.id)

    async def proposals_dismiss(self, ctx: RequestContext, p: ProposalDismissParams) -> Proposal:
        await self._pending(p.id)
        origin = self.s.pipeline.who(ctx.peer)

        def job(conn: sqlite3.Connection, _usage: Usage) -> Proposal:
            if not store.decide_proposal(conn, p.id, "dismissed", store.now_ms()):
                raise ProposalNotFound("no pending proposal with this id", {"id": p.id})
            decided = store.get_proposal(conn, p.id)
            assert decided is not None
            ledger.proposal(conn, origin, "dismissed", decided)
            return decided

        return await self.s.writer.submit(job)

    # --- export / import / adapters ----------------------------------------------------

    def adapter(self, adapter_id: str) -> Any:
        return get_adapter(self.adapters, adapter_id)

    async def export(self, ctx: RequestContext, p: ExportParams) -> Any:
        entries = await self.s.read_off_loop(store.list_entries)
        if p.adapter is not None:
            return export_entries(self.adapter(p.adapter), entries)
        exported_at = dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        return {
            "plugin": EXPORT_PLUGIN,
            "schema": EXPORT_SCHEMA,
            "exportedAt": exported_at,
            "budgets": self.s.budget_rows(),
            "entries": entries,
        }

    async def import_(self, ctx: RequestContext, p: ImportParams) -> SeedResult:
        view = writer_view(p.write)
        if (p.envelope is None) == (p.adapter is None):
            raise InvalidInput("import takes either an envelope or an adapter with its payload", "envelope")
        if p.adapter is not None:
            inputs = adapt_payload(self.adapter(p.adapter), p.payload)
            source_default: str | None = p.adapter
        else:
            inputs = self._envelope_inputs(p.envelope)
            source_default = None
        if len(inputs) > MAX_IMPORT_ENTRIES:
            raise InvalidInput(f"at most {MAX_IMPORT_ENTRIES} entries per import", "entries")
        # An import is a restore: it keeps the workspaceKey/agentKey the backup names.
        planned = self.s.plan_seed(view, inputs, source_default, restricted=False)
        if not p.skip_existing:
            result = await self.s.seed_planned(ctx, view, planned)
            if p.skip_existing is not None:
                result.skipped = 0
            return result
        present = await self.s.read(existing_keys)
        fresh = [e for e in planned if entry_key(e) not in present]
        skipped = len(planned) - len(fresh)
        if not fresh:
            # Everything is already there: a no-op, with no approval to ask and nothing to audit.
            return SeedResult(added=0, entries=[], skipped=skipped)
        result = await self.s.seed_planned(ctx, view, fresh)
        result.skipped = skipped
        return result

    @staticmethod
    def _envelope_inputs(raw: Any) -> list[EntryInput]:
        # As the reference's import: only a dsh-memento document is an envelope. The plugin is
        # checked first, so another tool's document (which has no schema) is named as such.
        if isinstance(raw, dict) and raw.get("plugin") != EXPORT_PLUGIN:
            plugin = raw.get("plugin")
            if "plugin" not in raw:
                got = "no plugin"
            elif isinstance(plugin, str):
                got = f"plugin {plugin[:64]!r}"
            else:
                got = f"a plugin of type {json_type(plugin)}"
            raise InvalidInput(
                f"envelope has {got}; expected {EXPORT_PLUGIN!r} (another tool's document imports through its adapter)",
                "envelope.plugin",
            )
        try:
            env = msgspec.convert(raw, _Envelope)
        except msgspec.ValidationError as exc:
            raise InvalidInput(f"invalid envelope: {exc}", "envelope") from None
        if env.schema != EXPORT_SCHEMA:
            raise InvalidInput(f"unknown envelope schema {env.schema!r}; expected {EXPORT_SCHEMA!r}", "envelope.schema")
        if len(env.entries) > MAX_IMPORT_ENTRIES:
            raise InvalidInput(f"at most {MAX_IMPORT_ENTRIES} entries per import", "envelope.entries")
        inputs: list[EntryInput] = []
        for n, item in enumerate(env.entries):
            try:
                e = msgspec.convert(item, _ImportedEntry)
                inputs.append(msgspec.convert(
                    {"track": e.track, "scope": e.scope, "text": e.text, "tags": e.tags, "source": e.source,
                     "workspaceKey": e.workspace_key, "agentKey": e.agent_key}, EntryInput))
            except msgspec.ValidationError as exc:
                raise InvalidInput(f"invalid envelope entry {n}: {exc}", f"envelope.entries[{n}]") from None
        return inputs

    async def adapters_list(self, ctx: RequestContext, p: Any) -> list[AdapterInfo]:
        return [a.info() for a in self.adapters.values()]
