"""dsh-memory-protocol v1 as memoryd speaks it: wire types, errors, validation. Pure: no I/O.

Submodules and names load on first use (PEP 562): the stdio relay and memoryctl's read
commands need ``paths`` and ``constants`` only, and importing the wire types (msgspec and
every Struct) would cost them most of their start-up.
"""

from __future__ import annotations

from ._version import __version__
from .constants import PROTOCOL, STORE_SCHEMA_VERSION

TYPE_CHECKING = False  # typing is not imported at run time: see memoryd_protocol.constants
if TYPE_CHECKING:
    from typing import Any

    from . import constants, errors, ledger, methods, payloads, snapshot, text, types, validation
    from .errors import (
        AdapterNotFound,
        AdapterPayload,
        AmbiguousMatch,
        BudgetExceeded,
        EntryNotFound,
        InvalidInput,
        ProposalNotFound,
        ProtocolError,
        RpcError,
        StoreCorrupt,
        StoreLocked,
        StoreUnavailable,
        StoreUnsupportedVersion,
        WriteDenied,
        WriteRequiresAgent,
        from_wire,
    )

#: The distribution this package ships in. ``__version__`` is its version: pyproject.toml
#: holds the one literal, and hatchling's version build hook writes it into ``_version.py``
#: at install (read without importlib.metadata, which costs a memoryctl start dearly).
DISTRIBUTION = "dsh-memoryd"


_SUBMODULES = frozenset({
    "constants", "errors", "ledger", "methods", "payloads", "snapshot", "text", "types", "validation"})
_FROM_ERRORS = frozenset({
    "AdapterNotFound", "AdapterPayload", "AmbiguousMatch", "BudgetExceeded", "EntryNotFound", "InvalidInput",
    "ProposalNotFound", "ProtocolError", "RpcError", "StoreCorrupt", "StoreLocked", "StoreUnavailable",
    "StoreUnsupportedVersion", "WriteDenied", "WriteRequiresAgent", "from_wire",
})


def __getattr__(name: str) -> Any:
    if name not in _SUBMODULES and name not in _FROM_ERRORS:  # also each `from . import x` not yet imported
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # importlib only here: importing it (and warnings, which it imports) cost the stdio
    # relay and memoryctl about a millisecond of their start-up, for names they never ask.
    import importlib

    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    return getattr(importlib.import_module(".errors", __name__), name)


__all__ = [
    "PROTOCOL",
    "STORE_SCHEMA_VERSION",
    "AdapterNotFound",
    "AdapterPayload",
    "AmbiguousMatch",
    "BudgetExceeded",
    "EntryNotFound",
    "InvalidInput",
    "ProposalNotFound",
    "ProtocolError",
    "RpcError",
    "StoreCorrupt",
    "StoreLocked",
    "StoreUnavailable",
    "StoreUnsupportedVersion",
    "WriteDenied",
    "WriteRequiresAgent",
    "__version__",
    "constants",
    "errors",
    "from_wire",
    "ledger",
    "methods",
    "payloads",
    "snapshot",
    "text",
    "types",
    "validation",
]
