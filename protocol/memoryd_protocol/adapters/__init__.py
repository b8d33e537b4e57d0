"""Import/export adapters: pure converters between foreign memory documents and entries.

Built-ins (protocol §9, reference-facts.md "Adapters"): ``mem0``, ``hermes-memory-md``,
``claude-code-memory-md``. The daemon adds third-party adapters found through the
``memoryd.adapters`` entry-point group (``memoryd.adapter_registry``).

The daemon's calling convention::

    registry = builtin_adapters()              # or memoryd.adapter_registry.load_adapters()
    adapter = get_adapter(registry, adapter_id)      # ADAPTER_NOT_FOUND
    inputs = adapt_payload(adapter, payload)         # ADAPTER_PAYLOAD; then ride ``seed``
    document = export_entries(adapter, entries)      # the ``memory/export`` result
    rows = [a.info() for a in registry.values()]     # the ``adapters/list`` result
"""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import AdapterNotFound
from .base import (
    ADAPTER_ID_PATTERN,
    Adapter,
    AdapterBase,
    adapt_payload,
    export_entries,
    fit_tag,
    flatten,
    json_type,
)
from .markdown import MARKDOWN_FORMAT, ClaudeCodeMemoryMdAdapter, HermesMemoryMdAdapter, MarkdownAdapter
from .mem0 import MEM0_FORMAT, Mem0Adapter


def builtin_adapters() -> dict[str, Adapter]:
    """Fresh instances of the built-in adapters, keyed by id, in ``adapters/list`` order."""
    adapters: list[Adapter] = [Mem0Adapter(), HermesMemoryMdAdapter(), ClaudeCodeMemoryMdAdapter()]
    return {adapter.id: adapter for adapter in adapters}


def get_adapter(registry: Mapping[str, Adapter], adapter_id: str) -> Adapter:
    """The adapter registered as ``adapter_id``; ``ADAPTER_NOT_FOUND`` otherwise."""
    adapter = registry.get(adapter_id) if isinstance(adapter_id, str) else None
    if adapter is None:
        raise AdapterNotFound(f"no adapter with id {adapter_id!r}", {"adapterId": adapter_id})
    return adapter


__all__ = [
    "ADAPTER_ID_PATTERN",
    "MARKDOWN_FORMAT",
    "MEM0_FORMAT",
    "Adapter",
    "AdapterBase",
    "ClaudeCodeMemoryMdAdapter",
    "HermesMemoryMdAdapter",
    "MarkdownAdapter",
    "Mem0Adapter",
    "adapt_payload",
    "builtin_adapters",
    "export_entries",
    "fit_tag",
    "flatten",
    "get_adapter",
    "json_type",
]
