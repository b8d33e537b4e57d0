"""Protocol constants: identity, the track × scope grid, limits, and the error-code table.

Every number here is part of dsh-memory-protocol v1 or of memoryd's wire contract
(shared/design/wire-v1.md); changing one is a contract change.
"""

from __future__ import annotations

from typing import Final, Literal

Track = Literal["user", "agent"]
Scope = Literal["user-global", "workspace"]
WritePolicy = Literal["ask", "auto", "off"]
StoreFault = Literal["busy", "full", "readonly", "io"]

PROTOCOL: Final = "dsh-memory-protocol/v1"
EXPORT_SCHEMA: Final = "memory-export-v1"
EXPORT_PLUGIN: Final = "dsh-memento"
#: The reference provider's store schema; memoryd keeps it so dsh-memento can still open
#: a store that memoryd wrote (memoryd versions its own extra tables separately).
STORE_SCHEMA_VERSION: Final = 4
#: memoryd's own tables (frozen snapshots, ...) carry this version in meta.memoryd_schema.
MEMORYD_SCHEMA_VERSION: Final = 8

TRACKS: Final[tuple[Track, ...]] = ("user", "agent")
SCOPES: Final[tuple[Scope, ...]] = ("user-global", "workspace")
#: The order of budget rows and snapshot sections everywhere on the wire.
GRID: Final[tuple[tuple[Track, Scope], ...]] = (
    ("user", "user-global"),
    ("user", "workspace"),
    ("agent", "user-global"),
    ("agent", "workspace"),
)
DEFAULT_BUDGETS: Final[dict[tuple[str, str], int]] = {
    ("user", "user-global"): 2000,
    ("user", "workspace"): 2000,
    ("agent", "user-global"): 4000,
    ("agent", "workspace"): 4000,
}

DEFAULT_SOURCE: Final = "dsh-memento"
MAX_TAGS: Final = 16
MAX_TAG_UNITS: Final = 32
MAX_SOURCE_UNITS: Final = 64
#: approval/decided's by.name: who decided, as the client names it
MAX_BY_NAME: Final = 128
#: Longest workspaceKey (and session header.cwd), agentKey (and header.agentPreset) and
#: session id, in UTF-16 units: every entry and ledger row stores them.
MAX_KEY_UNITS: Final = 4096
MAX_AGENT_KEY_UNITS: Final = 256
MAX_SESSION_ID_UNITS: Final = 256
#: client.name and client.version: each stored in the ledger's row of every connection
MAX_LABEL_UNITS: Final = 256
#: Longest memory/query filter.text, in UTF-16 units.
MAX_QUERY_TEXT_UNITS: Final = 2000
#: A ``recalled`` audit row keeps at most this many units of the query text (then "…").
RECALLED_TEXT_UNITS: Final = 200
MAX_CONSOLIDATE: Final = 20
CONSOLIDATE_EXCERPT_UNITS: Final = 300
AMBIGUOUS_SAMPLE_UNITS: Final = 200
AMBIGUOUS_SAMPLE_COUNT: Final = 5
QUERY_DEFAULT_LIMIT: Final = 20
QUERY_HARD_CAP: Final = 1000
MAX_IMPORT_ENTRIES: Final = 1000
#: the short form of an entry id that tables and messages show and every id argument takes
SHORT_ID_LENGTH: Final = 8
AUDIT_DEFAULT_LIMIT: Final = 100
AUDIT_HARD_CAP: Final = 10000
PROPOSAL_MAX_TEXT: Final = 2000
PROPOSAL_MAX_PENDING: Final = 8
#: Sessions one connection may watch (memory/watch); all watchers together are bounded by
#: max_connections, since a watch lives and dies with its connection.
MAX_WATCHED_SESSIONS: Final = 16
DEFAULT_MAX_MESSAGE_BYTES: Final = 4 * 1024 * 1024
DEFAULT_APPROVAL_TIMEOUT_S: Final = 300.0
# Daemon resource caps (config keys of the same names, lower-case).
DEFAULT_MAX_CONNECTIONS: Final = 256
DEFAULT_MAX_BATCH_CALLS: Final = 100
DEFAULT_MAX_BUFFERED_BYTES: Final = 16 * 1024 * 1024
DEFAULT_HALF_LINE_TIMEOUT_S: Final = 30.0
DEFAULT_MAX_PENDING_APPROVALS: Final = 16
#: session ids one connection may bind (sessions.py): a harness that multiplexes its
#: sessions over one connection binds one each
DEFAULT_MAX_SESSIONS_PER_CONNECTION: Final = 1024

WRITE_POLICIES: Final[tuple[WritePolicy, ...]] = ("ask", "auto", "off")
#: The only approval outcome that lets a write through.
ALLOWED_ONCE: Final = "allowed-once"
DENIAL_OUTCOMES: Final = ("rejected", "cancelled", "unavailable")
#: STORE_UNAVAILABLE's details.reason: why the store cannot take a write right now.
STORE_FAULTS: Final[tuple[StoreFault, ...]] = ("busy", "full", "readonly", "io")
DEFAULT_BUSY_TIMEOUT_MS: Final = 5000

# JSON-RPC 2.0 reserved codes (spec §5.1).
PARSE_ERROR: Final = -32700
INVALID_REQUEST: Final = -32600
METHOD_NOT_FOUND: Final = -32601
INVALID_PARAMS: Final = -32602
INTERNAL_ERROR: Final = -32603

#: Protocol error code → JSON-RPC error code (wire-v1.md §7). memoryd's own codes live in
#: the implementation-defined server range -32010..-32099.
ERROR_CODES: Final[dict[str, int]] = {
    "INVALID_INPUT": INVALID_PARAMS,
    "WRITE_REQUIRES_AGENT": -32010,
    "BUDGET_EXCEEDED": -32011,
    "ENTRY_NOT_FOUND": -32012,
    "AMBIGUOUS_MATCH": -32013,
    "WRITE_DENIED": -32014,
    "PROPOSAL_NOT_FOUND": -32015,
    "STORE_CORRUPT": -32016,
    "STORE_UNSUPPORTED_VERSION": -32017,
    "ADAPTER_NOT_FOUND": -32018,
    "ADAPTER_PAYLOAD": -32019,
    #: the store cannot take a write right now (details: reason busy|full|readonly|io, path)
    "STORE_UNAVAILABLE": -32020,
    #: start-up only: another memoryd owns the store (details: path, pid, socket)
    "STORE_LOCKED": -32021,
}
#: data.code for the JSON-RPC-level failures, so every error a client sees has one shape.
RPC_LEVEL_CODES: Final[dict[int, str]] = {
    PARSE_ERROR: "PARSE_ERROR",
    INVALID_REQUEST: "INVALID_REQUEST",
    METHOD_NOT_FOUND: "METHOD_NOT_FOUND",
    INTERNAL_ERROR: "INTERNAL_ERROR",
}
