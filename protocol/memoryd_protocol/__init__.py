"""dsh-memory-protocol v1 as memoryd speaks it: wire types, errors, validation. Pure: no I/O.

The package itself holds the version, the protocol's name and its errors; each submodule
(``types``, ``methods``, ``ledger``, ...) is imported by name."""

from __future__ import annotations

from . import constants, errors
from ._version import __version__
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
    StoreLocked,
    StoreUnavailable,
    StoreUnsupportedVersion,
    WriteDenied,
    WriteRequiresAgent,
    from_wire,
)

#: The distribution this package ships in. ``__version__`` is its version: pyproject.toml
#: holds the one literal, and hatchling's version build hook writes it into ``_version.py``
#: at install.
DISTRIBUTION = "dsh-memoryd"

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
]
