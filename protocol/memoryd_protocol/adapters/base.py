"""The adapter contract: a pure converter between a foreign memory document and entries.

An adapter never does I/O and never calls a model (protocol §9). ``adapt(payload)`` turns a
foreign document (already decoded from JSON: a string, a list, a dict) into
:class:`~memoryd_protocol.types.EntryInput` rows that the daemon imports through ``seed``;
``export(entries)`` turns stored entries into the foreign document. Anything an adapter
cannot convert is :class:`~memoryd_protocol.errors.AdapterPayload` (``ADAPTER_PAYLOAD``)
with ``details.adapterId`` - never a bare exception.

Third-party adapters may implement :class:`Adapter` structurally or subclass
:class:`AdapterBase`. The daemon calls them through :func:`adapt_payload` and
:func:`export_entries`, which hold every adapter - built-in or not - to that contract.
"""

from __future__ import annotations

import re
from typing import Any, Final, Protocol, runtime_checkable

import msgspec

from ..constants import MAX_TAG_UNITS
from ..errors import AdapterPayload, ProtocolError
from ..text import cut_units, has_lone_surrogate, utf16_len
from ..types import AdapterInfo, Entry, EntryInput

#: What an adapter id may look like (also the shape the daemon's registry enforces).
ADAPTER_ID_PATTERN: Final = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")

_NEWLINE = re.compile(r"\r\n|\r|\n")
_SPACE_OR_CONTROL = re.compile(r"[\s\x00-\x1f\x7f-\x9f]+")


@runtime_checkable
class Adapter(Protocol):
    """What the daemon needs from an adapter (structural: subclassing is optional)."""

    id: str
    name: str
    description: str
    version: str
    import_formats: list[str]
    export_format: str

    def adapt(self, payload: Any) -> list[EntryInput]:
        """Foreign document → entry inputs; ``AdapterPayload`` when it cannot be converted."""
        ...

    def export(self, entries: list[Entry]) -> Any:
        """Entries → foreign document (JSON-encodable)."""
        ...

    def info(self) -> AdapterInfo:
        """The ``adapters/list`` row."""
        ...


class AdapterBase:
    """Convenience base: stores the descriptive attributes and implements :meth:`info`."""

    def __init__(
        self,
        *,
        id: str,
        name: str,
        description: str,
        version: str,
        import_formats: list[str],
        export_format: str,
    ) -> None:
        self.id = id
        self.name = name
        self.description = description
        self.version = version
        self.import_formats = list(import_formats)
        self.export_format = export_format

    def adapt(self, payload: Any) -> list[EntryInput]:
        raise NotImplementedError

    def export(self, entries: list[Entry]) -> Any:
        raise NotImplementedError

    def info(self) -> AdapterInfo:
        return AdapterInfo(
            id=self.id,
            name=self.name,
            description=self.description,
            version=self.version,
            import_formats=list(self.import_formats),
            export_format=self.export_format,
        )

    def error(self, message: str, **details: Any) -> AdapterPayload:
        """An ``ADAPTER_PAYLOAD`` error whose message is prefixed with this adapter's id."""
        return AdapterPayload(f"{self.id}: {message}", {"adapterId": self.id, **details})

    def __repr__(self) -> str:
        return f"{type(self).__name__}(id={self.id!r})"


# --- helpers shared by the built-ins -----------------------------------------------------


def fit_tag(raw: str) -> str | None:
    """A protocol-valid tag made from a free-form label, or ``None`` when nothing is left.

    Whitespace and control-character runs become one space and the ends are trimmed. A
    label longer than the tag limit (32 UTF-16 units) is *cut* to fit, ending in ``…``,
    instead of failing the whole import: a long section heading is a label, not data, and
    the entries under it are still imported in full.
    """
    tag = _SPACE_OR_CONTROL.sub(" ", raw).strip()
    if not tag:
        return None
    if utf16_len(tag) > MAX_TAG_UNITS:
        # cut_units keeps at most ``limit`` units and appends the one-unit ellipsis.
        tag = cut_units(tag, MAX_TAG_UNITS - 1, "").rstrip() + "…"
    return tag


def json_type(value: object) -> str:
    """The JSON name of a decoded value's type, for error messages (never the value)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def flatten(text: str) -> str:
    """One line: every line break (CRLF, CR, LF) becomes one space."""
    return _NEWLINE.sub(" ", text)


# --- the daemon's calling convention -----------------------------------------------------


def _adapter_id(adapter: object) -> str:
    value = getattr(adapter, "id", None)
    return value if isinstance(value, str) else "?"


def adapt_payload(adapter: Adapter, payload: Any) -> list[EntryInput]:
    """Run ``adapter.adapt`` and hold its result to the contract.

    * a :class:`~memoryd_protocol.errors.ProtocolError` raised by the adapter passes
      through unchanged;
    * any other exception becomes ``ADAPTER_PAYLOAD`` (chained, so the daemon can log the
      traceback; the message names only the exception type, never payload text);
    * the result must be a list of ``EntryInput`` (or of camelCase dicts that convert to
      one); track and scope are checked, a missing ``source`` becomes the adapter id, and
      a text with a lone surrogate is refused.

    Budgets, tag rules, keys and the 1000-entry cap are the import pipeline's job.
    """
    adapter_id = _adapter_id(adapter)
    try:
        result = adapter.adapt(payload)
    except ProtocolError:
        raise
    except Exception as exc:
        raise AdapterPayload(
            f"{adapter_id}: adapter failed to convert the payload ({type(exc).__name__})",
            {"adapterId": adapter_id},
        ) from exc
    if not isinstance(result, list):
        raise AdapterPayload(
            f"{adapter_id}: adapter returned {json_type(result)}, expected a list of entries",
            {"adapterId": adapter_id},
        )
    out: list[EntryInput] = []
    for index, item in enumerate(result):
        try:
            raw = msgspec.to_builtins(item) if isinstance(item, EntryInput) else item
            entry = msgspec.convert(raw, EntryInput)
        except (msgspec.ValidationError, TypeError) as exc:
            raise AdapterPayload(
                f"{adapter_id}: adapter produced an invalid entry at index {index}: {exc}",
                {"adapterId": adapter_id, "index": index},
            ) from exc
        for field, value in (("text", entry.text), *(("tags", tag) for tag in entry.tags or [])):
            if has_lone_surrogate(value):
                raise AdapterPayload(
                    f"{adapter_id}: entry {index} {field} contains a lone UTF-16 surrogate",
                    {"adapterId": adapter_id, "index": index},
                )
        if entry.source is None:
            entry.source = adapter_id
        out.append(entry)
    return out


def export_entries(adapter: Adapter, entries: list[Entry]) -> Any:
    """Run ``adapter.export``; an unexpected failure or a result that is not plain JSON data
    becomes ``ADAPTER_PAYLOAD`` (chained) instead of escaping as a bare exception."""
    adapter_id = _adapter_id(adapter)
    try:
        document = adapter.export(entries)
        msgspec.json.encode(document)
    except ProtocolError:
        raise
    except Exception as exc:
        raise AdapterPayload(
            f"{adapter_id}: adapter failed to export ({type(exc).__name__})",
            {"adapterId": adapter_id},
        ) from exc
    return document


__all__ = [
    "ADAPTER_ID_PATTERN",
    "Adapter",
    "AdapterBase",
    "adapt_payload",
    "export_entries",
    "fit_tag",
    "flatten",
    "json_type",
]
