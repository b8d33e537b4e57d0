"""The write methods, each a plan for the one pipeline (pipeline.py): add, replace, remove,
consolidate and seed (import and proposals/approve reuse its pieces)."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import TYPE_CHECKING

import msgspec
from memoryd_protocol import payloads
from memoryd_protocol.constants import (
    MAX_IMPORT_ENTRIES,
)
from memoryd_protocol.errors import EntryNotFound, InvalidInput
from memoryd_protocol.text import (
    js_trim,
    normalize_tags,
    utf16_len,
)
from memoryd_protocol.types import (
    AddParams,
    ConsolidateParams,
    ConsolidateResult,
    Entry,
    EntryInput,
    LedgerEntry,
    MemoryAdded,
    MemoryRemoved,
    MemoryUpdated,
    RemoveParams,
    ReplaceParams,
    ReplaceResult,
    SeedParams,
    SeedResult,
    WriteResult,
)
from memoryd_protocol.validation import (
    SessionView,
    check_source,
    check_target,
    check_targets,
    check_text,
    resolve_one,
    target_keys,
    writer_view,
)

from . import store
from .context import Handler, RequestContext
from .ledger import Stamp
from .pipeline import Placement, WritePlan
from .tx import Tx

if TYPE_CHECKING:
    from .service import Service

def drop_user_global_workspaces(inputs: Sequence[EntryInput]) -> set[int]:
    """Clear the workspaceKey of every user-global input; the indexes of those that named
    one. Such entries have none (the spec's ''), but dsh-memento stores the session's cwd
    there, so its own exports carry one: memory must still move, so the key goes and the
    approval says so."""
    dropped = set()
    for n, i in enumerate(inputs):
        if i.scope == "user-global" and i.workspace_key is not None and js_trim(i.workspace_key):
            i.workspace_key = None
            dropped.add(n)
    return dropped


#: What an approval shows of a target entry and the ledger proves of it, (attribute, wire
#: name): an approved write finds each as the approval showed it, or writes nothing.
SHOWN = tuple((f.name, f.encode_name) for f in msgspec.structs.fields(LedgerEntry))


class Writes:
    def __init__(self, service: Service) -> None:
        self.service = service
        #: the config's [workspace_aliases]: how each cwd and explicit workspaceKey becomes a key
        self.aliases = service.config.workspace_aliases

    def handlers(self) -> dict[str, Handler]:
        return {
            "memory/add": self.add,
            "memory/replace": self.replace,
            "memory/remove": self.remove,
            "memory/consolidate": self.consolidate,
            "memory/seed": self.seed,
        }

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
        view = writer_view(p.write, self.aliases)
        i = p.input
        text = check_text(i.text)
        tags = normalize_tags(i.tags)
        source = check_source(i.source)
        wk, ak = target_keys(i.scope, view, i.workspace_key, i.agent_key, self.aliases, restricted=True)
        cell = (i.track, i.scope)

        def commit(tx: Tx, stamp: Stamp) -> WriteResult:
            e = self.new_entry(view, track=i.track, scope=i.scope, text=text, source=source, tags=tags,
                               workspace_key=wk, agent_key=ak, ts=store.now_ms())
            store.insert_entry(tx, e)
            stamp.audit(tx, "add", track=e.track, scope=e.scope, entry_id=e.id, text=e.text, source=source,
                        entry=e, ts=e.created_at)
            return WriteResult(entry=e, usage=self.service.row(tx.usage, *cell))

        return await self.service.pipeline.write(ctx, view, WritePlan(
            action="add", track=i.track, scope=i.scope, text=payloads.add_text(text), source=source,
            layers=[cell], sources=[source], deltas={cell: utf16_len(text)}, commit=commit,
            events=lambda r: [("memory/added", MemoryAdded(entry=r.entry))], placement=Placement(wk, ak, tags)))

    @staticmethod
    def still_same(conn: sqlite3.Connection, approved: Entry, match: str | None) -> Entry:
        """The approved entry, re-read by id, unchanged since the human saw it: every field
        the approval showed or the write keeps (the ledger's view of an entry), not only its
        text, since another program can change any of them without a new version."""
        details: dict[str, str] = {"track": approved.track, "scope": approved.scope}
        if match is not None:
            details["match"] = match
        details["entryId"] = approved.id
        current = store.get_entry(conn, approved.id)
        if current is None:
            raise EntryNotFound("the approved entry was removed while the approval was pending", details)
        changed = [wire for name, wire in SHOWN if getattr(approved, name) != getattr(current, name)]
        if changed:
            raise EntryNotFound(f"the approved entry changed while the approval was pending: its {', '.join(changed)} "
                                f"{'is' if len(changed) == 1 else 'are'} not what the approval showed, and nothing was "
                                f"written; look at the entry again (memoryctl audit explain {approved.id}) and retry the "
                                "write if it still applies", details)
        return current

    async def replace(self, ctx: RequestContext, p: ReplaceParams) -> ReplaceResult:
        view = writer_view(p.write, self.aliases)
        i = p.input
        selector = check_target(i.match, i.id)
        match = selector.match
        text = check_text(i.text)
        tags = normalize_tags(i.tags) if i.tags is not None else None
        target = await self.service.resolve_target(view, i.track, i.scope, selector)
        cell = (i.track, i.scope)

        def commit(tx: Tx, stamp: Stamp) -> ReplaceResult:
            previous = self.still_same(tx.conn, target, match)
            e = Entry(**{f: getattr(previous, f) for f in Entry.__struct_fields__})
            e.text = text
            e.tags = tags if tags is not None else list(previous.tags)
            e.version = previous.version + 1
            e.updated_at = max(store.now_ms(), previous.updated_at)
            e.session_id = view.session_id
            store.update_entry(tx, e)
            stamp.audit(tx, "replace", track=e.track, scope=e.scope, entry_id=e.id, text=e.text, source=e.source,
                        entry=e, ts=e.updated_at)
            return ReplaceResult(previous=previous, entry=e, usage=self.service.row(tx.usage, *cell))

        # A replacement keeps the target's source: that one source is the old text's and the new one's.
        return await self.service.pipeline.write(ctx, view, WritePlan(
            action="replace", track=i.track, scope=i.scope, text=payloads.replace_text(target.text, text),
            source=target.source, layers=[cell], sources=[target.source],
            deltas={cell: utf16_len(text) - utf16_len(target.text)}, commit=commit,
            events=lambda r: [("memory/updated", MemoryUpdated(previous=r.previous, entry=r.entry))],
            entry_id=target.id,
            placement=Placement(target.workspace_key, target.agent_key, target.tags if tags is None else tags)))

    async def remove(self, ctx: RequestContext, p: RemoveParams) -> WriteResult:
        view = writer_view(p.write, self.aliases)
        i = p.input
        selector = check_target(i.match, i.id)
        match = selector.match
        target = await self.service.resolve_target(view, i.track, i.scope, selector)
        cell = (i.track, i.scope)

        def commit(tx: Tx, stamp: Stamp) -> WriteResult:
            previous = self.still_same(tx.conn, target, match)
            store.delete_entry(tx, previous.id)
            stamp.audit(tx, "remove", track=previous.track, scope=previous.scope, entry_id=previous.id,
                        text=previous.text, source=previous.source)
            return WriteResult(entry=previous, usage=self.service.row(tx.usage, *cell))

        return await self.service.pipeline.write(ctx, view, WritePlan(
            action="remove", track=i.track, scope=i.scope, text=payloads.remove_text(target.text),
            source=target.source, layers=[cell], sources=[target.source], deltas={cell: -utf16_len(target.text)},
            commit=commit, events=lambda r: [("memory/removed", MemoryRemoved(entry=r.entry))],
            entry_id=target.id, placement=Placement(target.workspace_key, target.agent_key, target.tags)))

    async def consolidate(self, ctx: RequestContext, p: ConsolidateParams) -> ConsolidateResult:
        view = writer_view(p.write, self.aliases)
        i = p.input
        selectors = check_targets(i.matches, i.ids)
        text = check_text(i.text)
        tags = normalize_tags(i.tags)
        wk = view.workspace_key if i.scope == "workspace" else ""
        # An explicit agentKey is checked as add's is ('' or the session's own), so widening
        # a private text to the shared layer is asked for, and the approval shows it.
        ak = None if i.agent_key is None else target_keys(i.scope, view, wk or None, i.agent_key, self.aliases,
                                                  restricted=True)[1]
        entries = await self.service.visible(view, i.track, i.scope)
        by_id = {e.id: e for e in entries}
        targets: list[Entry] = []
        for sel in selectors:
            if sel.match is not None:
                t = by_id[resolve_one(((e.id, e.text) for e in entries), i.track, i.scope, sel.match)]
            elif sel.entry_id in by_id:
                t = by_id[sel.entry_id]
            else:
                raise EntryNotFound("no visible memory entry has this id", sel.details(i.track, i.scope))
            if any(t.id == x.id for x in targets):
                if sel.match is not None:
                    raise InvalidInput("two matches resolve to the same entry", "matches")
                raise InvalidInput("two ids name the same entry", "ids")
            targets.append(t)
        cell = (i.track, i.scope)
        if ak is None:
            # Merging the session's private entries with shared ones keeps the result private:
            # without an explicit agentKey, consolidation never widens who can see a text.
            ak = view.agent_key if any(t.agent_key for t in targets) else ""
        source = check_source(i.source)
        labels = [sel.match if sel.match is not None else f"id {t.id}" for sel, t in zip(selectors, targets, strict=True)]

        def commit(tx: Tx, stamp: Stamp) -> ConsolidateResult:
            removed = [self.still_same(tx.conn, t, sel.match) for t, sel in zip(targets, selectors, strict=True)]
            ts = store.now_ms()
            for r in removed:
                store.delete_entry(tx, r.id)
                stamp.audit(tx, "consolidate-remove", track=r.track, scope=r.scope, entry_id=r.id, text=r.text,
                            source=r.source, ts=ts)
            e = self.new_entry(view, track=i.track, scope=i.scope, text=text, source=source, tags=tags,
                               workspace_key=wk, agent_key=ak, ts=ts)
            store.insert_entry(tx, e)
            stamp.audit(tx, "consolidate-add", track=e.track, scope=e.scope, entry_id=e.id, text=e.text,
                        source=source, entry=e, ts=ts)
            return ConsolidateResult(removed=removed, entry=e, usage=self.service.row(tx.usage, *cell))

        return await self.service.pipeline.write(ctx, view, WritePlan(
            action="consolidate", track=i.track, scope=i.scope,
            text=payloads.consolidate_text([(label, t.text) for label, t in zip(labels, targets, strict=True)], text),
            source=source, layers=[cell], sources=[source, *(t.source for t in targets)],
            deltas={cell: utf16_len(text) - sum(utf16_len(t.text) for t in targets)}, commit=commit,
            events=lambda r: [*(("memory/removed", MemoryRemoved(entry=x)) for x in r.removed),
                              ("memory/added", MemoryAdded(entry=r.entry))],
            placement=Placement(wk, ak, tags)))

    def plan_seed(self, view: SessionView, inputs: Sequence[EntryInput], source_override: str | None = None,
                  *, restricted: bool = True) -> list[Entry]:
        if not inputs:
            raise InvalidInput("inputs must not be empty", "inputs")
        if len(inputs) > MAX_IMPORT_ENTRIES:
            raise InvalidInput(f"at most {MAX_IMPORT_ENTRIES} entries per batch, and this one has {len(inputs)}: "
                               f"send them as several memory/seed calls of at most {MAX_IMPORT_ENTRIES} entries each",
                               "inputs")
        planned: list[Entry] = []
        for n, i in enumerate(inputs):
            try:
                text = check_text(i.text)
                tags = normalize_tags(i.tags)
                source = check_source(source_override if i.source is None else i.source)
                wk, ak = target_keys(i.scope, view, i.workspace_key, i.agent_key, self.aliases,
                                      restricted=restricted)
            except InvalidInput as exc:
                field = exc.details.get("field", "")
                raise InvalidInput(f"inputs[{n}]: {exc.message}", f"inputs[{n}].{field}" if field else f"inputs[{n}]"
                                   ) from None
            planned.append(self.new_entry(view, track=i.track, scope=i.scope, text=text, source=source, tags=tags,
                                          workspace_key=wk, agent_key=ak, ts=0))
        return planned

    async def seed_planned(self, ctx: RequestContext, view: SessionView, planned: list[Entry],
                           workspace_keys_dropped: int = 0) -> SeedResult:
        deltas: dict[tuple[str, str], int] = {}
        for e in planned:
            deltas[(e.track, e.scope)] = deltas.get((e.track, e.scope), 0) + utf16_len(e.text)
        text = payloads.seed_text([(e.track, e.scope, e.text) for e in planned])
        if workspace_keys_dropped:
            text += "\n" + payloads.dropped_workspaces_note(workspace_keys_dropped)
        source = payloads.batch_source([e.source for e in planned])

        def commit(tx: Tx, stamp: Stamp) -> SeedResult:
            ts = store.now_ms()
            stamp.audit(tx, "seed", track="batch", scope="batch", entry_id=None, text=text, source=source, ts=ts)
            for e in planned:
                e.created_at = e.updated_at = ts
                store.insert_entry(tx, e)
                stamp.audit(tx, "add", track=e.track, scope=e.scope, entry_id=e.id, text=e.text, source=e.source,
                            entry=e, ts=ts)
            return SeedResult(added=len(planned), entries=planned)

        return await self.service.pipeline.write(ctx, view, WritePlan(
            action="seed", track="batch", scope="batch", text=text, source=source,
            layers=[(e.track, e.scope) for e in planned], sources=[e.source for e in planned], deltas=deltas,
            commit=commit, events=lambda r: [("memory/added", MemoryAdded(entry=e)) for e in r.entries],
            count=len(planned), entries=planned, workspace_keys_dropped=workspace_keys_dropped or None))

    async def seed(self, ctx: RequestContext, p: SeedParams) -> SeedResult:
        view = writer_view(p.write, self.aliases)
        # seed is the reference's import path: it takes what an import takes
        dropped = len(drop_user_global_workspaces(p.inputs))
        result = await self.seed_planned(ctx, view, self.plan_seed(view, p.inputs), dropped)
        if dropped:
            result.workspace_keys_dropped = dropped
        return result
