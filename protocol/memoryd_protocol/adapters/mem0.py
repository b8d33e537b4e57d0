"""``mem0``: mem0 facts in, mem0-shaped facts out.

Import payload: a facts array, ``{"facts": [...]}``, or ``{"results": [...]}`` (the shape
mem0's own ``get_all`` returns). A raw ``{"messages": [...]}`` transcript - or an array of
``{role, content}`` messages - is refused: turning a conversation into facts is model
extraction, which an adapter never does. Per fact:

* ``memory``: a non-empty string (trimmed) - the entry text;
* ``metadata`` (an object; anything else is ignored, as the reference ignores it):
  ``category`` (a string) and the strings of ``tags`` (a list) become tags, category
  first, as the reference reads them; blank ones are skipped, each is trimmed and a label
  longer than 32 UTF-16 units is cut to fit (the reference's import refuses the file);
  more than 16 distinct tags on one fact is refused rather than silently dropped;
* ``metadata.track`` / ``metadata.scope`` (what the ``mem0`` export writes) place the
  entry, so export → import round-trips; the reference ignores them. Without them, or
  with a value that is no track or scope, the entry lands in ``user/user-global``;
* ``metadata.workspace_key`` / ``metadata.agent_key``, when strings, are kept (an empty
  workspace key means "none": the import pipeline decides);
* ``source`` is always ``mem0``; ids, hashes, ``user_id`` and timestamps are ignored (an
  import gets fresh ids and timestamps).

Every refusal is ``ADAPTER_PAYLOAD`` with ``details.adapterId`` and, for a bad fact,
``details.index`` (0-based position in the facts array).

Export: ``{"plugin": "mem0", "facts": [{memory, created_at, updated_at, metadata: {track,
scope, source, workspace_key, agent_key, tags}}]}`` in the order given, as the reference
writes it: ``created_at`` and ``updated_at`` are the entries' epoch milliseconds.
"""

from __future__ import annotations

from typing import Any, Final

from ..constants import MAX_TAGS, Scope, Track
from ..text import has_lone_surrogate
from ..types import Entry, EntryInput
from .base import AdapterBase, fit_tag, json_type

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
        if not isinstance(metadata, dict):
            metadata = {}  # as the reference reads it: anything else carries nothing
        # What the mem0 export writes; a value that is not a track or scope is ignored.
        track: Track = "agent" if metadata.get("track") == "agent" else "user"
        scope: Scope = "workspace" if metadata.get("scope") == "workspace" else "user-global"
        return EntryInput(
            track=track,
            scope=scope,
            text=memory.strip(),
            tags=self._tags(index, metadata),
            source=self.id,
            workspace_key=self._key(index, metadata, "workspace_key") or None,
            agent_key=self._key(index, metadata, "agent_key"),
        )

    def _strings(self, index: int, value: Any, field: str) -> list[str]:
        """The strings in ``value`` (a string, or a list: its other items are skipped, as the
        reference skips them)."""
        items = [value] if isinstance(value, str) else value if isinstance(value, list) else []
        out = [v for v in items if isinstance(v, str)]
        for v in out:
            if has_lone_surrogate(v):
                raise self.error(f"fact {index} {field} contains a lone UTF-16 surrogate", index=index, field=field)
        return out

    def _tags(self, index: int, metadata: dict[str, Any]) -> list[str]:
        category = metadata.get("category")
        raw = [
            *self._strings(index, category if isinstance(category, str) else None, "metadata.category"),
            *self._strings(index, metadata.get("tags") if isinstance(metadata.get("tags"), list) else None,
                           "metadata.tags"),
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
        if not isinstance(value, str):
            return None
        if has_lone_surrogate(value):
            raise self.error(f"fact {index} metadata.{field} contains a lone UTF-16 surrogate", index=index,
                             field=f"metadata.{field}")
        return value

    # -- export ---------------------------------------------------------------------------

    def export(self, entries: list[Entry]) -> dict[str, Any]:
        return {
            "plugin": "mem0",
            "facts": [
                {
                    "memory": e.text,
                    "created_at": e.created_at,
                    "updated_at": e.updated_at,
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
