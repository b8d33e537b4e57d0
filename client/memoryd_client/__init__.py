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

from memoryd_protocol import __version__, types
from memoryd_protocol.errors import (
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

from .approvals import DECIDED, ApprovalCall, Decided, Decision
from .client import Client, connect
from .connection import WRITE_METHODS
from .errors import (
    BadResponse,
    ClientError,
    ConnectFailed,
    ConnectionClosed,
    Timeout,
)
from .events import EVENT_METHODS, WATCH_EVENTS, Event, EventStream
from .sync import SyncClient, SyncEventStream, connect_sync
from .wire import make_session, plain

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
