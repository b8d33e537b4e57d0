"""Wire types: every params, result and notification shape of wire-v1.md as msgspec Structs.

Inputs a caller writes (entries, filters) forbid unknown fields, so a typo such as ``tag``
for ``tags`` is an INVALID_INPUT, not lost data. Envelope-level objects a harness fills in
(``write``, ``session.header``, ``client``) accept them: harnesses put more there.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from .approval_types import ProcessFacts, RelayInfo
from .constants import MAX_BY_NAME, MAX_CONSOLIDATE, MAX_QUERY_TEXT_UNITS, Scope, Track, WritePolicy
from .replication_types import ReplicationStatus
from .transfer_types import AdapterInfo as AdapterInfo
from .transfer_types import ExportParams as ExportParams

NonEmpty = Annotated[str, Meta(min_length=1)]
NonNegative = Annotated[int, Meta(ge=0)]
Version = Annotated[int, Meta(ge=1)]
Action = Literal["add", "replace", "remove", "consolidate", "seed"]
ProposalStatus = Literal["pending", "approved", "dismissed"]


class _In(msgspec.Struct, rename="camel", forbid_unknown_fields=True, kw_only=True):
    """Caller-written input: strict."""


class _Env(msgspec.Struct, rename="camel", kw_only=True):
    """Envelope-level object: unknown fields ignored."""


class _Out(msgspec.Struct, rename="camel", kw_only=True):
    """Daemon output."""


# --- protocol data -----------------------------------------------------------------------
class Entry(_Out):
    id: str
    track: Track
    scope: Scope
    workspace_key: str
    agent_key: str
    text: str
    source: str
    tags: list[str]
    version: Version
    created_at: int
    updated_at: int
    last_recalled: int | None
    recall_count: NonNegative
    session_id: str | None


class EntryInput(_In):
    track: Track
    scope: Scope
    text: str
    tags: list[str] | None = None
    source: str | None = None
    workspace_key: str | None = None
    agent_key: str | None = None


class BudgetRow(_Out):
    track: Track
    scope: Scope
    used: NonNegative
    limit: NonNegative


class AuditRow(_Out):
    seq: int
    ts: int
    action: str
    track: str | None
    scope: str | None
    entry_id: str | None
    text: str | None
    outcome: str | None
    source: str | None
    session_id: str | None


class Proposal(_Out):
    id: str
    kind: str
    track: Track
    scope: Scope
    workspace_key: str
    agent_key: str
    text: str
    source: str
    session_id: str | None
    status: ProposalStatus
    created_at: int
    decided_at: int | None


class ExportEnvelope(_Env):
    plugin: str
    schema: str
    exported_at: str
    budgets: list[BudgetRow]
    entries: list[Entry]


# --- context objects ---------------------------------------------------------------------
class Header(_Env):
    cwd: str | None = None
    agent_preset: str | None = None


class Session(_Env):
    id: str | None = None
    header: Header | None = None


class Agent(_Env):
    session: Session | None = None


class Write(_Env):
    agent: Agent | None = None


class ClientInfo(_Env):
    name: str | None = None
    version: str | None = None


class Capabilities(_Env):
    approvals: bool = True


# --- method params -----------------------------------------------------------------------
class InitializeParams(_Env):
    protocol: str | None = None
    client: ClientInfo | None = None
    capabilities: Capabilities | None = None
    relay: RelayInfo | None = None


class AddParams(_Env):
    input: EntryInput
    write: Write


class ReplaceInput(_In):
    """Exactly one of ``match`` (a unique substring) or ``id`` (an entry id) names the target."""

    track: Track
    scope: Scope
    text: str
    match: str | msgspec.UnsetType = msgspec.UNSET
    id: str | msgspec.UnsetType = msgspec.UNSET
    tags: list[str] | None = None


class ReplaceParams(_Env):
    input: ReplaceInput
    write: Write


class RemoveInput(_In):  # exactly one of match and id names the target, as ReplaceInput's
    track: Track
    scope: Scope
    match: str | msgspec.UnsetType = msgspec.UNSET
    id: str | msgspec.UnsetType = msgspec.UNSET


class RemoveParams(_Env):
    input: RemoveInput
    write: Write


class ConsolidateInput(_In):
    track: Track
    scope: Scope
    text: str
    matches: Annotated[list[str], Meta(min_length=1, max_length=MAX_CONSOLIDATE)] | msgspec.UnsetType = msgspec.UNSET
    ids: Annotated[list[str], Meta(min_length=1, max_length=MAX_CONSOLIDATE)] | msgspec.UnsetType = msgspec.UNSET
    tags: list[str] | None = None
    source: str | None = None
    agent_key: str | None = None


class ConsolidateParams(_Env):
    input: ConsolidateInput
    write: Write


class SeedParams(_Env):
    inputs: list[EntryInput]
    write: Write


class QueryFilter(_In):
    track: Track | None = None
    scope: Scope | None = None
    text: str | None = None
    limit: int | None = None  # below 1: the default, as the reference reads it


class QueryOpts(_In):
    session_id: str | None = None
    agent_key: str | None = None
    workspace_key: str | None = None


class QueryParams(_Env):
    filter: QueryFilter | None = None
    opts: QueryOpts | None = None


class EmptyParams(_Env):
    pass


class AuditListParams(_Env):
    limit: Annotated[int, Meta(ge=1)] | None = None


class AuditExplainParams(_Env):
    #: an entry id, or a text that exactly one entry contains (case-insensitive)
    target: Annotated[str, Meta(min_length=1, max_length=MAX_QUERY_TEXT_UNITS)]


class SnapshotParams(_Env):
    session: Session
    language: Literal["en", "zh"] | None = None


class WatchParams(_Env):
    #: the session whose visible entries the connection is told about (snapshot's shape)
    session: Session


class ImportParams(_Env):
    write: Write
    envelope: Any = None
    adapter: str | None = None
    payload: Any = None
    #: Skip every entry whose track, scope, workspaceKey, agentKey and text already exist.
    skip_existing: bool | None = None
    #: with an adapter: every entry goes to this track and scope instead
    track: Track | None = None
    scope: Scope | None = None


class ProposalInput(_In):
    kind: NonEmpty
    track: Track
    scope: Scope
    text: str
    source: str | None = None


class ProposalCreateParams(_Env):
    input: ProposalInput
    session: Session


class ProposalListParams(_Env):
    status: ProposalStatus | None = None


class ProposalApproveParams(_Env):
    id: str
    write: Write


class ProposalDismissParams(_Env):
    id: str


class ApprovalBy(_In):
    """Who decided, as the deciding client claims it (never checked): a human at a prompt, a
    policy of the client's own (e.g. fail closed without a terminal), or a script (``--yes``)."""

    kind: Literal["human", "policy", "script"]
    name: Annotated[str, Meta(min_length=1, max_length=MAX_BY_NAME)] | None = None


class ApprovalDecidedParams(_Env):
    id: str
    #: Any value: only "allowed-once" allows; anything else is a denial (wire-v1 §5).
    outcome: Any
    #: the client's claim of who decided; kept with the decision and logged
    by: ApprovalBy | None = None


# --- results -----------------------------------------------------------------------------
class ServerInfo(_Out):
    name: str
    version: str


class InitializeResult(_Out):
    protocol: str
    server: ServerInfo
    schema_version: int
    write_policy: WritePolicy
    budgets: list[BudgetRow]
    #: the daemon's ``approvers``: "keyed" asks approvers to prove the approver key
    approvers: Literal["interactive", "any", "keyed"] = "interactive"


class WriteResult(_Out):
    entry: Entry
    usage: BudgetRow


class ReplaceResult(_Out):
    previous: Entry
    entry: Entry
    usage: BudgetRow


class ConsolidateResult(_Out):
    removed: list[Entry]
    entry: Entry
    usage: BudgetRow


class SeedResult(_Out):
    added: int
    entries: list[Entry]
    #: Entries an import with ``skipExisting`` left out (present only then).
    skipped: int | msgspec.UnsetType = msgspec.UNSET
    #: import: user-global entries whose workspaceKey was dropped (present only when some were)
    workspace_keys_dropped: int | msgspec.UnsetType = msgspec.UNSET


class QueryResult(_Out):
    entries: list[Entry]
    total: int
    truncated: bool


class SnapshotResult(_Out):
    text: str


class ProposalApproveResult(_Out):
    proposal: Proposal
    entry: Entry
    usage: BudgetRow


class StoreInfo(_Out):
    path: str
    schema_version: int


class ConnectionInfo(_Out):
    """One live connection (``daemon/status``): the kernel's facts of its peer beside its claims (``client``)."""

    id: int
    transport: Literal["socket", "stdio", "mcp"]  # mcp: a memoryd mcp session
    pid: int | None
    uid: int | None
    exe: str | None
    client: ClientInfo | None
    approver: bool
    opened_at: int


# --- the ledger (audit/verify, audit/explain) ---------------------------------------------
class LedgerEntry(_Out):
    """An entry as the ledger proves it: what replay compares with the live store."""

    id: str
    track: str
    scope: str
    workspace_key: str
    agent_key: str
    text: str
    tags: list[str]
    source: str
    version: int


class LedgerConnection(_Out):
    """A connection as the ledger recorded it, before the first row that names it: ``pid`` to
    ``session`` the kernel's facts of its socket's process at connect (a relay's own, not its
    harness's); ``client`` and ``harness`` are claims."""

    #: ``<run>/<id>``: the daemon run (a fresh id each start) and the connection's number
    ref: str
    run: str
    id: int
    transport: str
    pid: int | None
    uid: int | None
    exe: str | None
    client: ClientInfo | None
    opened_at: int
    start: int | None = None
    tty: str | None = None
    session: int | None = None
    harness: int | None = None


class LedgerProblem(_Out, omit_defaults=True):
    reason: str
    #: the ledger row (``memoryd_ledger.n``) and the audit row (``audit.seq``) concerned
    n: int | None = None
    seq: int | None = None


class LedgerReport(_Out):
    """``audit/verify``: ``ok`` when the chain holds, every audit row since its start is in
    it unchanged, and replaying it gives the live entries. ``problems[0]`` is the first break."""

    ok: bool
    rows: int
    audit_rows: int
    #: audit rows up to this seq predate the chain (a dsh-memento store's, say)
    after_audit_seq: int
    note: str
    #: the newest row's hash: keep it to detect a later truncation of the ledger
    head: str
    problems: list[LedgerProblem]


class LedgerDecision(_Out):
    approval: str
    outcome: str | None
    policy: str | None
    decided_by: LedgerConnection | None
    by: ApprovalBy | None
    #: the approval's reason line, as the approver saw it
    reason: str | None
    #: the error code, when the approved write then failed to commit
    failed: str | None
    #: the deciding process as the kernel showed it when the decision arrived
    decider: ProcessFacts | None = None


class LedgerEvent(_Out):
    n: int
    seq: int | None
    ts: int
    action: str
    outcome: str | None
    text: str | None
    session_id: str | None
    asked_by: LedgerConnection | None
    decision: LedgerDecision | None


class EntryLife(_Out):
    """``audit/explain``: one entry's life."""

    entry_id: str
    current: LedgerEntry | None
    events: list[LedgerEvent]
    #: the sessions whose frozen snapshot showed one of its texts
    snapshots: list[str]


class DaemonStatus(_Out, omit_defaults=True):
    version: str
    uptime_s: float
    connections: int
    pending_approvals: int
    queue_depth: int
    store: StoreInfo
    #: Additive (beyond wire-v1's minimum), for a human's ``memoryctl status`` and ``stop``.
    pid: int
    write_policy: WritePolicy
    socket: str | None
    config: str | None
    log: str | None
    #: The live connections (``connections`` is their count), the asking one included.
    connection_list: list[ConnectionInfo]
    replication: Annotated[ReplicationStatus | None, Meta(description=(
        "Replication of the store ([replicate] in the config); absent when it is not configured."))] = None


class Empty(_Out):
    pass


# --- notifications (daemon → client) -----------------------------------------------------
class ApprovalEntry(_Out):
    """One entry of a seed/import batch, as the approval shows it."""

    track: Track
    scope: Scope
    workspace_key: str
    agent_key: str
    text: str
    tags: list[str]
    #: the source the entry is stored with (empty from a daemon that does not say)
    source: str = ""


class ApprovalOrigin(_Out, omit_defaults=True):
    """Who asked: its ``initialize`` client info (a claim) and its socket peer's process (the kernel's credentials)."""

    name: str | None = None
    version: str | None = None
    pid: int | None = None
    exe: str | None = None
    #: "mcp": through ``memoryd mcp``, ``name``/``version`` the MCP host's ``clientInfo``
    front_end: Literal["mcp"] | None = None


class ApprovalAsked(_Out, omit_defaults=True):
    id: str
    action: Action
    track: str
    scope: str
    text: str
    source: str
    session_id: str | None
    reason: str
    count: int | None = None
    #: where the entry lands (add) or the target's keys (replace/remove/consolidate); absent for seed
    workspace_key: str | None = None
    agent_key: str | None = None
    tags: list[str] | None = None
    #: seed and import: every entry of the batch
    entries: list[ApprovalEntry] | None = None
    #: the JSON-RPC id of the write that asked; only on the connection that sent it
    request_id: str | int | float | None = None
    origin: ApprovalOrigin | None = None
    #: import: user-global entries whose workspaceKey is dropped (they have none)
    workspace_keys_dropped: int | None = None


class ApprovalResolved(_Out):
    id: str
    outcome: str


#: The entry events carry the writing session's id (``write.agent.session.id``; absent when
#: the write named none): an entry's own ``sessionId`` is its last writer's, not a remover's.
class MemoryAdded(_Out, omit_defaults=True):
    entry: Entry
    session_id: str | None = None


class MemoryUpdated(_Out, omit_defaults=True):
    previous: Entry
    entry: Entry
    session_id: str | None = None


class MemoryRemoved(_Out, omit_defaults=True):
    entry: Entry
    session_id: str | None = None


#: What a committed write tells the writing connection and the watchers.
EntryEvent = MemoryAdded | MemoryUpdated | MemoryRemoved


class MemoryRecalled(_Out):
    query: str
    #: the number of hits (the query's ``total``, not only the page), as the reference sends it
    matches: int
    session_id: str | None


class MemorySnapshot(_Out):
    session_id: str
    text: str


#: notification method → params type.
NOTIFICATIONS: dict[str, type[msgspec.Struct]] = {
    "approval/asked": ApprovalAsked,
    "approval/resolved": ApprovalResolved,
    "memory/added": MemoryAdded,
    "memory/updated": MemoryUpdated,
    "memory/removed": MemoryRemoved,
    "memory/recalled": MemoryRecalled,
    "memory/snapshot": MemorySnapshot,
}
