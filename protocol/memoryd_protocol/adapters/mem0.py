"""``mem0``: mem0 facts in, mem0-shaped facts out.

Import payload: a facts array, ``{"facts": [...]}``, or ``{"results": [...]}`` (the shape
mem0's own ``get_all`` returns). A raw ``{"messages": [...]}`` transcript - or an array of
``{role, content}`` messages - is refused: turning a conversation into facts is model
extraction, which an adapter never does. Per fact:

* ``memory``: a non-empty string (trimmed) - the entry text;
* ``metadata`` (optional object): ``category`` (a string or a list of strings) and
  ``tags`` (a list of strings) become tags, category first; blank ones are skipped, each
  is trimmed and a label longer than 32 UTF-16 units is cut to fit; more than 16 distinct
  tags on one fact is refused rather than silently dropped;
* ``metadata.track`` / ``metadata.scope``, when present, must be protocol values and place
  the entry (this is what the ``mem0`` export writes, so export → import round-trips);
  otherwise the entry lands in ``user/user-global``;
* ``metadata.workspace_key`` / ``metadata.agent_key``, when present and strings, are kept
  (an empty workspace key means "none": the import pipeline decides);
* ``source`` is always ``mem0``; ids, hashes, ``user_id`` and timestamps are ignored (an
  import gets fresh ids and timestamps).

Every refusal is ``ADAPTER_PAYLOAD`` with ``details.adapterId`` and, for a bad fact,
``details.index`` (0-based position in the facts array).

Export: ``{"plugin": "mem0", "facts": [{memory, created_at, updated_at, metadata: {track,
scope, source, workspace_key, agent_key, tags}}]}`` in the order given. ``created_at`` and
``updated_at`` are ISO 8601 UTC strings with milliseconds (``2024-05-01T12:00:00.000Z``,
JavaScript's ``toISOString``), converted from the entries' epoch-millisecond fields.
"""

from __future__ import annotations

from typing import Any, Final

from ..constants import MAX_TAGS, SCOPES, TRACKS, Scope, Track
from ..text import has_lone_surrogate
from ..types import Entry, EntryInput
from .base import AdapterBase, fit_tag, iso_utc, json_type

MEM0_FORMAT: Final = "application/json"


def _is_message(item: object) -> bool:
    return isinstance(item, dict) and "memory" not in item and "role" in item and "content" in item


class Mem0Adapter(AdapterBase):
    def __init__(self) -> None:
        super().__init__(
            id="mem0",
            name="mem0",
            description=(
                "mem0 facts (an array, {facts} or {results}): each fact's 'memory' is an entry, "
                "metadata.category and metadata.tags become tags; lands in user/user-global unless metadata.track/scope "
                "say otherwise. "
                "Raw message transcripts are refused."
            ),
            version="1.0.0",
            import_formats=[MEM0_FORMAT],
            export_format=MEM0_FORMAT,
        )

    # -- import ---------------------------------------------------------------------------

    def _facts_of(self, payload: Any) -> list[Any]:
        if isinstance(payload, dict):
            for key in ("facts", "results"):
                if key in payload:
                    facts = payload[key]
                    if not isinstance(facts, list):
                        raise self.error(f"'{key}' must be an array of facts, got {json_type(facts)}")
                    payload = facts
                    break
            else:
                if "messages" in payload:
                    raise self.error(
                        "a raw messages transcript is refused: adapters convert facts, they do not extract them"
                    )
                raise self.error("payload must be a facts array or {facts: [...]}")
        if not isinstance(payload, list):
            raise self.error(f"payload must be a facts array or {{facts: [...]}}, got {json_type(payload)}")
        if payload and all(_is_message(item) for item in payload):
            raise self.error("a raw messages transcript is refused: adapters convert facts, they do not extract them")
        return payload

    def adapt(self, payload: Any) -> list[EntryInput]:
        return [self._entry(index, fact) for index, fact in enumerate(self._facts_of(payload))]

    def _entry(self, index: int, fact: Any) -> EntryInput:
        if not isinstance(fact, dict):
            raise self.error(f"fact {index} must be an object, got {json_type(fact)}", index=index)
        memory = fact.get("memory")
        if not isinstance(memory, str) or not memory.strip():
            raise self.error(f"fact {index} needs a non-empty 'memory' string", index=index, field="memory")
        if has_lone_surrogate(memory):
            raise self.error(f"fact {index} 'memory' contains a lone UTF-16 surrogate", index=index, field="memory")
        metadata = fact.get("metadata")
        if metadata is None:
            metadata = {}
        if not isinstance(metadata, dict):
            raise self.error(
                f"fact {index} 'metadata' must be an object, got {json_type(metadata)}",
                index=index,
                field="metadata",
            )
        track: Track = "user"
        scope: Scope = "user-global"
        if "track" in metadata:
            value = metadata["track"]
            if value not in TRACKS:
                raise self.error(
                    f"fact {index} metadata.track must be one of {list(TRACKS)}", index=index, field="metadata.track"
                )
            track = value
        if "scope" in metadata:
            value = metadata["scope"]
            if value not in SCOPES:
                raise self.error(
                    f"fact {index} metadata.scope must be one of {list(SCOPES)}", index=index, field="metadata.scope"
                )
            scope = value
        return EntryInput(
            track=track,
            scope=scope,
            text=memory.strip(),
            tags=self._tags(index, metadata),
            source=self.id,
            workspace_key=self._key(index, metadata, "workspace_key") or None,
            agent_key=self._key(index, metadata, "agent_key"),
        )

    def _strings(self, index: int, value: Any, field: str, *, single: bool) -> list[str]:
        if value is None:
            return []
        if single and isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            kind = "a string or a list of strings" if single else "a list of strings"
            raise self.error(f"fact {index} {field} must be {kind}", index=index, field=field)
        for v in value:
            if has_lone_surrogate(v):
                raise self.error(f"fact {index} {field} contains a lone UTF-16 surrogate", index=index, field=field)
        return value

    def _tags(self, index: int, metadata: dict[str, Any]) -> list[str]:
        raw = [
            *self._strings(index, metadata.get("category"), "metadata.category", single=True),
            *self._strings(index, metadata.get("tags"), "metadata.tags", single=False),
        ]
        tags: list[str] = []
        for label in raw:
            tag = fit_tag(label)
            if tag is not None and tag not in tags:
                tags.append(tag)
        if len(tags) > MAX_TAGS:
            raise self.error(
                f"fact {index} has {len(tags)} tags, more than {MAX_TAGS}", index=index, field="metadata.tags"
            )
        return tags

    def _key(self, index: int, metadata: dict[str, Any], field: str) -> str | None:
        value = metadata.get(field)
        if value is None:
            return None
        if not isinstance(value, str) or has_lone_surrogate(value):
            raise self.error(f"fact {index} metadata.{field} must be a string", index=index, field=f"metadata.{field}")
        return value

    # -- export ---------------------------------------------------------------------------

    def export(self, entries: list[Entry]) -> dict[str, Any]:
        return {
            "plugin": "mem0",
            "facts": [
                {
                    "memory": e.text,
                    "created_at": iso_utc(e.created_at),
                    "updated_at": iso_utc(e.updated_at),
                    "metadata": {
                        "track": e.track,
                        "scope": e.scope,
                        "source": e.source,
                        "workspace_key": e.workspace_key,
                        "agent_key": e.agent_key,
                        "tags": list(e.tags),
                    },
                }
                for e in entries
            ],
        }


__all__ = ["MEM0_FORMAT", "Mem0Adapter"]
