"""memory/export, memory/import and adapters: moving memory in and out (an import is a
seed through the pipeline, so it is approval-gated and audited like any write)."""

from __future__ import annotations

import datetime as dt
import sqlite3
from typing import Any

import msgspec
from memoryd_protocol.adapters import adapt_payload, export_entries, get_adapter, json_type
from memoryd_protocol.constants import EXPORT_PLUGIN, EXPORT_SCHEMA, MAX_IMPORT_ENTRIES
from memoryd_protocol.errors import InvalidInput
from memoryd_protocol.types import (
    AdapterInfo,
    Entry,
    EntryInput,
    ExportParams,
    ImportParams,
    SeedResult,
)
from memoryd_protocol.validation import writer_view

from . import store
from .context import Handler, RequestContext
from .service import Service
from .writes import Writes, drop_user_global_workspaces


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
    return {(track, scope, store.workspace_key_of(scope, wk), ak or "", text) for track, scope, wk, ak, text in rows}


def _too_many(count: int, field: str) -> InvalidInput:
    return InvalidInput(f"at most {MAX_IMPORT_ENTRIES} entries per import, and this one has {count}: split it into "
                        f"parts of at most {MAX_IMPORT_ENTRIES} entries and import each (with skipExisting, as "
                        "memoryctl import sends it, entries already in the store are skipped, so re-running a part "
                        "is safe)", field)


class Transfer:
    def __init__(self, service: Service, writes: Writes, adapters: dict[str, Any]) -> None:
        self.service = service
        self.writes = writes
        self.adapters = adapters

    def handlers(self) -> dict[str, Handler]:
        return {
            "memory/export": self.export,
            "memory/import": self.import_,
            "adapters/list": self.adapters_list,
        }

    async def export(self, ctx: RequestContext, p: ExportParams) -> Any:
        entries = await self.service.read(store.list_entries)
        if p.adapter is not None:
            return export_entries(get_adapter(self.adapters, p.adapter), entries)
        exported_at = dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        return {
            "plugin": EXPORT_PLUGIN,
            "schema": EXPORT_SCHEMA,
            "exportedAt": exported_at,
            "budgets": self.service.budget_rows(),
            "entries": entries,
        }

    async def import_(self, ctx: RequestContext, p: ImportParams) -> SeedResult:
        view = writer_view(p.write, self.service.config.workspace_aliases)
        if (p.envelope is None) == (p.adapter is None):
            raise InvalidInput("import takes either an envelope or an adapter with its payload", "envelope")
        if p.adapter is not None:
            inputs = adapt_payload(get_adapter(self.adapters, p.adapter), p.payload)
            source_default: str | None = p.adapter
        else:
            if p.track is not None or p.scope is not None:
                raise InvalidInput("track and scope go with an adapter import: an envelope names each entry's "
                                   "track and scope", "track" if p.track is not None else "scope")
            inputs = self._envelope_inputs(p.envelope)
            source_default = None
        for i in inputs:
            i.track = p.track or i.track
            i.scope = p.scope or i.scope
        dropped = drop_user_global_workspaces(inputs)
        if len(inputs) > MAX_IMPORT_ENTRIES:
            raise _too_many(len(inputs), "entries")
        # An import is a restore: it keeps the workspaceKey/agentKey the backup names.
        planned = self.writes.plan_seed(view, inputs, source_default, restricted=False)
        skipped: int | msgspec.UnsetType = msgspec.UNSET if p.skip_existing is None else 0
        if p.skip_existing:
            present = await self.service.read(existing_keys)
            kept = [n for n, e in enumerate(planned) if entry_key(e) not in present]
            # What the approval and the result count is what is written: a skipped entry's
            # dropped key is not.
            dropped = dropped.intersection(kept)
            skipped, planned = len(planned) - len(kept), [planned[n] for n in kept]
        if planned or not p.skip_existing:
            result = await self.writes.seed_planned(ctx, view, planned, len(dropped))
        else:
            # Everything is already there: a no-op, with no approval to ask and nothing to audit.
            result = SeedResult(added=0, entries=[])
        result.skipped = skipped
        if dropped:
            result.workspace_keys_dropped = len(dropped)
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
            raise _too_many(len(env.entries), "envelope.entries")
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
