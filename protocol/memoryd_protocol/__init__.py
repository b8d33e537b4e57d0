"""dsh-memory-protocol v1 as memoryd speaks it: wire types, errors, validation. Pure: no I/O."""

from __future__ import annotations

from . import constants, errors, payloads, snapshot, text, types, validation
from .constants import PROTOCOL, STORE_SCHEMA_VERSION
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
    StoreUnsupportedVersion,
    WriteDenied,
    WriteRequiresAgent,
    from_wire,
)

__version__ = "0.1.0"

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
    "StoreUnsupportedVersion",
    "WriteDenied",
    "WriteRequiresAgent",
    "__version__",
    "constants",
    "errors",
    "from_wire",
    "payloads",
    "snapshot",
    "text",
    "types",
    "validation",
]
