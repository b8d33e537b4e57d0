"""Wire types of moving memory in and out that depend on nothing else of the package:
``memory/export``'s params and the ``adapters/list`` rows. types.py imports them from here
(and keeps the types that name its own, such as ``memory/import``'s params)."""

from __future__ import annotations

import msgspec


class ExportParams(msgspec.Struct, rename="camel", kw_only=True):
    adapter: str | None = None


class AdapterInfo(msgspec.Struct, rename="camel", kw_only=True):
    id: str
    name: str
    description: str
    version: str
    import_formats: list[str]
    export_format: str


__all__ = ["AdapterInfo", "ExportParams"]
