"""Python client for memoryd (dsh-memory-protocol v1 over JSON-RPC 2.0 / NDJSON).

Async::

    async with memoryd_client.connect(session=make_session("s-1", cwd="/proj")) as c:
        result = await c.add({"track": "user", "scope": "user-global", "text": "Prefers tabs"})

Blocking, for scripts::

    with memoryd_client.connect_sync() as c:
        print(c.budgets())

Results are the protocol's msgspec Structs (``memoryd_protocol.types``); daemon-side failures
raise the protocol's typed exceptions (re-exported here), transport failures a
:class:`ClientError`.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing is not imported at run time: see memoryd_protocol.constants
if TYPE_CHECKING:
    from typing import Any

    from memoryd_protocol import types

    from .calls import __version__, make_session
    from .client import (
        DECIDED,
        EVENT_METHODS,
        WATCH_EVENTS,
        WRITE_METHODS,
        ApprovalCall,
        Client,
        Decided,
        Decision,
        Event,
        EventStream,
        connect,
        plain,
    )
    from .errors import (
        AdapterNotFound,
        AdapterPayload,
        AmbiguousMatch,
        BadResponse,
        BudgetExceeded,
        ClientError,
        ConnectFailed,
        ConnectionClosed,
        EntryNotFound,
        InvalidInput,
        ProposalNotFound,
        ProtocolError,
        RpcError,
        StoreCorrupt,
        StoreLocked,
        StoreUnavailable,
        StoreUnsupportedVersion,
        Timeout,
        WriteDenied,
        WriteRequiresAgent,
        from_wire,
    )
    from .sync import SyncClient, SyncEventStream, connect_sync

#: Where each name lives. They load on first use (PEP 562): ``memoryctl``'s read commands
#: import this package but not the async client (anyio, msgspec, every wire Struct), which
#: would cost them most of their start-up.
_HOMES = {
    **dict.fromkeys(("DECIDED", "EVENT_METHODS", "WATCH_EVENTS", "WRITE_METHODS", "ApprovalCall", "Client", "Decided",
                     "Decision", "Event", "EventStream", "connect", "plain"), ".client"),
    **dict.fromkeys(("AdapterNotFound", "AdapterPayload", "AmbiguousMatch", "BadResponse", "BudgetExceeded",
                     "ClientError", "ConnectFailed", "ConnectionClosed", "EntryNotFound", "InvalidInput",
                     "ProposalNotFound", "ProtocolError", "RpcError", "StoreCorrupt", "StoreLocked", "StoreUnavailable",
                     "StoreUnsupportedVersion", "Timeout", "WriteDenied", "WriteRequiresAgent", "from_wire"), ".errors"),
    **dict.fromkeys(("__version__", "make_session"), ".calls"),
    **dict.fromkeys(("SyncClient", "SyncEventStream", "connect_sync"), ".sync"),
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None and name != "types":  # also each `from . import submodule` not yet imported
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # importlib only here: importing it (and warnings, which it imports) cost memoryctl
    # about a millisecond of its start-up, for names its read commands never ask.
    import importlib

    if home is None:
        return importlib.import_module("memoryd_protocol.types")
    value = getattr(importlib.import_module(home, __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "DECIDED",
    "EVENT_METHODS",
    "WATCH_EVENTS",
    "WRITE_METHODS",
    "AdapterNotFound",
    "AdapterPayload",
    "AmbiguousMatch",
    "ApprovalCall",
    "BadResponse",
    "BudgetExceeded",
    "Client",
    "ClientError",
    "ConnectFailed",
    "ConnectionClosed",
    "Decided",
    "Decision",
    "EntryNotFound",
    "Event",
    "EventStream",
    "InvalidInput",
    "ProposalNotFound",
    "ProtocolError",
    "RpcError",
    "StoreCorrupt",
    "StoreLocked",
    "StoreUnavailable",
    "StoreUnsupportedVersion",
    "SyncClient",
    "SyncEventStream",
    "Timeout",
    "WriteDenied",
    "WriteRequiresAgent",
    "__version__",
    "connect",
    "connect_sync",
    "from_wire",
    "make_session",
    "plain",
    "types",
]
