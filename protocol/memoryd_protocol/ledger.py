"""The ledger that proves itself: row bodies and the hash chain (ledger_check.py verifies
and replays it).

memoryd keeps, beside the reference's ``audit`` table, its own append-only table
``memoryd_ledger``. Each of its rows is one fact (``kind``) with a canonical JSON ``body``
and the chain: ``hash = sha256([prev, n, ts, kind, ref, audit_seq, body])`` (canonical JSON),
``prev`` being the hash of the row before (``""`` for the first). Every audit row memoryd writes has exactly one ``audit``
ledger row whose body repeats the audit row's columns and adds what the reference's layout
cannot hold: the connection that asked, the approval, and the entry as the write left it.

The first row is ``start``: the audit rows the store already had (a dsh-memento store, or
one from a memoryd without a ledger) carry no hashes, so the chain starts after them, and
``start`` holds the entries present at that moment, from which replay begins.

Pure: the daemon and ``memoryctl audit verify --db`` read the rows with the SQL below and
hand them here, so both give the same verdict.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal, NamedTuple, Protocol, TypeVar

import msgspec

from .approval_types import ProcessFacts
from .text import utf16_len
from .types import (
    ApprovalAsked,
    ApprovalBy,
    AuditRow,
    Entry,
    LedgerConnection,
    LedgerEntry,
    Proposal,
)

#: Runs one SELECT of this module and returns its rows (the caller's sqlite3 connection).
Fetch = Callable[[str], Iterable[Sequence[Any]]]
Kind = Literal["start", "connection", "audit", "asked", "decided", "failed", "proposal", "foreign", "accepted",
               "pruned"]
T = TypeVar("T")

#: How many problems a report lists (the first one is what matters; the rest is context).
MAX_PROBLEMS = 50

TABLE = """CREATE TABLE IF NOT EXISTS memoryd_ledger (
    n INTEGER PRIMARY KEY,
    ts INTEGER NOT NULL,
    kind TEXT NOT NULL,
    ref TEXT,
    audit_seq INTEGER UNIQUE,
    body TEXT NOT NULL,
    prev TEXT NOT NULL,
    hash TEXT NOT NULL
)"""
#: The rows that name something (a connection, an approval, a proposal) by ``ref``; audit
#: rows (ref NULL), most of the ledger, stay out of it: one B-tree page less per write.
#: (Partial since memoryd_schema 4; a lookup ``kind = ? AND ref = ?`` uses it.)
INDEX = "CREATE INDEX IF NOT EXISTS memoryd_ledger_ref ON memoryd_ledger (kind, ref) WHERE ref IS NOT NULL"
LEDGER_COLUMNS = "n, ts, kind, ref, audit_seq, body, prev, hash"
SELECT_LEDGER = f"SELECT {LEDGER_COLUMNS} FROM memoryd_ledger ORDER BY n"
SELECT_AUDIT = "SELECT seq, ts, action, track, scope, entry_id, text, outcome, source, session_id FROM audit ORDER BY seq"
SELECT_ENTRIES = ("SELECT id, track, scope, workspace_key, agent_key, text, tags, source, version "
                  "FROM entries ORDER BY created_at, rowid")
#: what the ledger also knows of an entry: when it was created and last written, and by which session
SELECT_PROVENANCE = "SELECT id, created_at, updated_at, session_id FROM entries"
#: each session's frozen snapshot, by the digest of its text (memoryd_snapshot_texts holds the
#: text once per digest)
SELECT_SNAPSHOTS = "SELECT session_id, digest FROM memoryd_snapshots ORDER BY created_at, session_id"
SELECT_SNAPSHOT_TEXTS = "SELECT digest, bytes, text FROM memoryd_snapshot_texts ORDER BY digest"
SELECT_SNAPSHOT_TEXTS_TABLE = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'memoryd_snapshot_texts'"
#: a store of memoryd_schema 6 or older, not opened by a newer memoryd yet (``audit verify
#: --db``): each session's row holds its whole text
SELECT_SNAPSHOTS_UNSHARED = "SELECT session_id, text FROM memoryd_snapshots ORDER BY created_at, session_id"
#: How a ``snapshot`` audit row names the text it froze, since memoryd_schema 7: ``sha256:``
#: and the hex digest of the UTF-8 text (which is stored once, however many sessions froze it).
SNAPSHOT_REF_PREFIX = "sha256:"
#: the proposals table's columns in the order :func:`proposals_from` reads them
PROPOSAL_COLUMNS = (
    "id, kind, track, scope, workspace_key, text, source, session_id, status, created_at, decided_at, agent_key"
)
SELECT_PROPOSALS = f"SELECT {PROPOSAL_COLUMNS} FROM proposals ORDER BY created_at, rowid"


class LedgerRow(msgspec.Struct, frozen=True):
    n: int
    ts: int
    kind: str
    ref: str | None
    audit_seq: int | None
    body: str
    prev: str
    hash: str


class _Body(msgspec.Struct, rename="camel", kw_only=True, forbid_unknown_fields=True):
    pass


class PreChain(_Body):
    """The audit rows the store held when the chain began: how many, and the sha256 of
    them all in seq order (:func:`audit_digest`), so that none can later be inserted,
    changed or deleted below ``after_audit_seq`` unnoticed."""

    count: int
    digest: str


class StartBody(_Body):
    #: audit rows up to this seq predate the chain
    after_audit_seq: int
    note: str
    entries: list[LedgerEntry]
    #: the frozen snapshots the store already had (an older memoryd's): session id → the
    #: sha256 of its text (absent in a start row written before snapshots were chained)
    snapshots: dict[str, str] = msgspec.field(default_factory=dict)
    #: the proposals the store already had
    proposals: list[Proposal] = msgspec.field(default_factory=list)
    #: the audit rows before the chain (absent in a start row of an older memoryd: those
    #: rows are then not covered)
    earlier_audit: PreChain | None = None


class ProposalBody(_Body):
    """A proposal created, dismissed or approved: its text reaches every snapshot of its
    scope, and a dismissal is somebody's decision, so each names the connection."""

    connection: str | None
    event: Literal["created", "dismissed", "approved"]
    #: the proposal as this change left it
    proposal: Proposal
    #: the decided proposal of the same session and kind that this one took the place of
    replaces: str | None = None


class AuditBody(AuditRow, forbid_unknown_fields=True):
    """An audit row's columns (the reference's layout) and what that layout cannot hold."""

    #: the connection the row was written for (None: the daemon's own, e.g. a timeout)
    connection: str | None
    #: the approval it was written under (None: policy auto, or no approval was asked)
    approval: str | None
    #: the entry as the write left it (add, replace, consolidate-add); None otherwise
    entry: LedgerEntry | None


class AskedBody(_Body):
    connection: str | None
    asked: ApprovalAsked


class DecidedBody(_Body):
    approval: str
    outcome: str
    #: the connection that decided; None when nobody did (timeout, disconnect, shutdown)
    connection: str | None
    #: who decided as the deciding client claims it: a claim, never the daemon's finding
    by: ApprovalBy | None
    policy: str
    #: the deciding process as the kernel showed it when the decision arrived (absent in
    #: rows of an older memoryd)
    decider: ProcessFacts | None = None


class FailedBody(_Body):
    """An approved write whose commit then failed: nothing of it was written."""

    approval: str | None
    action: str
    connection: str | None
    code: str
    message: str
    #: the entry the write was to replace or remove (None: it would have made a new one)
    entry_id: str | None = None


class ForeignBody(_Body):
    """A change another program made to the store, found by memoryd (at start, or before a
    write, when SQLite's data_version says another connection committed). memoryd chains
    this row onto the store as it found it: what the other program did stays readable and
    is never presented as approved through memoryd. ``audit verify`` reports the row until
    an ``accepted`` row names it.

    Replay applies its difference: the state (entries and proposals, :func:`state_digest`)
    was ``before`` as the chain had it, and is ``after`` as found."""

    #: what changed, in words (the WARNING the daemon logged)
    note: str
    #: ledger rows another program appended after this daemon's newest (their n)
    ledger_rows: list[int]
    #: audit rows no memoryd row chains (a dsh-memento write leaves one): their seqs, and
    #: their count and digest as found
    audit_seqs: list[int]
    audit: PreChain | None
    before: str
    after: str
    #: entries added or changed, as found, and the ids of those gone
    entries: list[LedgerEntry]
    removed: list[str]
    proposals: list[Proposal]
    removed_proposals: list[str]
    #: the cells whose memoryd_usage differed from their entries: "track/scope" →
    #: [entries, used] as stored, then as counted (the counted values are enforced from here)
    usage: dict[str, list[int]]
    #: the schema objects another program added or changed (a trigger, view, index, table or
    #: column), each with the sha256 of its definition: memoryd takes no write while one is
    #: there and not accepted (absent in rows of an older memoryd)
    schema: list[str] = msgspec.field(default_factory=list)


class AcceptedBody(_Body):
    """A person accepted a ``foreign`` row (``audit/accept``), over this connection; the
    accepting process as the kernel showed it when the acceptance arrived."""

    foreign: int
    connection: str | None
    decider: ProcessFacts


class PrunedBody(_Body):
    """Frozen snapshots deleted (``snapshots/prune``) by a person over this connection: the
    sessions, each ended. Their ``snapshot`` rows keep the digests; verify holds a pruned
    session as pruned, and a session named again after it freezes a new snapshot."""

    sessions: list[str]
    #: only snapshots frozen before this (ms since the epoch); None: all of ended sessions
    before: int | None
    connection: str | None
    decider: ProcessFacts


Body = (StartBody | LedgerConnection | AuditBody | AskedBody | DecidedBody | FailedBody | ProposalBody | ForeignBody
        | AcceptedBody | PrunedBody)
_BODY_TYPES: dict[str, type[Body]] = {
    "start": StartBody, "connection": LedgerConnection, "audit": AuditBody, "asked": AskedBody,
    "decided": DecidedBody, "failed": FailedBody, "proposal": ProposalBody, "foreign": ForeignBody,
    "accepted": AcceptedBody, "pruned": PrunedBody,
}
_encoder = msgspec.json.Encoder(order="sorted")


def canonical(body: Body) -> str:
    """A body's stored form: JSON with sorted keys and no spaces, so a hash is reproducible."""
    return _encoder.encode(body).decode()


def chain_hash(prev: str, n: int, ts: int, kind: str, ref: str | None, audit_seq: int | None, body: str) -> str:
    """The row's hash: of every column but itself (its time, its ref and audit_seq too, which
    readers trust), as the canonical JSON array ``[prev, n, ts, kind, ref, audit_seq, body]``."""
    return hashlib.sha256(_encoder.encode([prev, n, ts, kind, ref, audit_seq, body])).hexdigest()


def decode(row: LedgerRow) -> Body:
    return msgspec.json.decode(row.body, type=_BODY_TYPES[row.kind])


def ledger_entry(e: Entry) -> LedgerEntry:
    return LedgerEntry(id=e.id, track=e.track, scope=e.scope, workspace_key=e.workspace_key, agent_key=e.agent_key,
                       text=e.text, tags=list(e.tags), source=e.source, version=e.version)


def audit_fields(body: AuditBody) -> AuditRow:
    """The audit row a body repeats."""
    return AuditRow(**{f: getattr(body, f) for f in AuditRow.__struct_fields__})


def state_digest(entries: Iterable[LedgerEntry], proposals: Iterable[Proposal]) -> str:
    """The sha256 of the entries and proposals, each in id order: what a ``foreign`` row's
    ``before`` and ``after`` name."""
    return hashlib.sha256(_encoder.encode([sorted(entries, key=lambda e: e.id),
                                           sorted(proposals, key=lambda p: p.id)])).hexdigest()


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def audit_digest(rows: Iterable[AuditRow]) -> PreChain:
    """The :class:`PreChain` of ``rows`` (taken in seq order)."""
    ordered = sorted(rows, key=lambda a: a.seq)
    return PreChain(count=len(ordered), digest=hashlib.sha256(_encoder.encode(ordered)).hexdigest())


class _Rows(Protocol):
    def fetchall(self) -> list[Any]: ...


class Executes(Protocol):
    """What :func:`consistent` needs of a connection: a sqlite3.Connection has it."""

    def execute(self, sql: str, /) -> _Rows: ...


def consistent(conn: Executes, read: Callable[[Fetch], T]) -> T:
    """Run ``read`` (:func:`read_report`, :func:`read_life`) with a ``fetch`` whose SELECTs
    all see one moment of the store: one read transaction, ``BEGIN`` … ``COMMIT``, on a
    connection in autocommit mode. The daemon's reader and ``memoryctl audit verify --db``
    both read this way."""
    conn.execute("BEGIN")
    try:
        return read(lambda sql: conn.execute(sql).fetchall())
    finally:
        conn.execute("COMMIT")


#: memoryd's own counts of each cell's entries and used units (absent from a store it never
#: opened), and what they count
SELECT_USAGE_TABLE = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'memoryd_usage'"
SELECT_USAGE = "SELECT track, scope, entries, used FROM memoryd_usage"
SELECT_CELL_TEXTS = "SELECT track, scope, text FROM entries"


def cell_usage(texts: Iterable[Sequence[Any]]) -> dict[tuple[str, str], list[int]]:
    """Each cell's [entries, used UTF-16 units], from the rows of :data:`SELECT_CELL_TEXTS`:
    what memoryd_usage must hold."""
    counted: dict[tuple[str, str], list[int]] = {}
    for track, scope, text in texts:
        c = counted.setdefault((str(track), str(scope)), [0, 0])
        c[0] += 1
        c[1] += utf16_len(str(text))
    return counted


def proposals_from(records: Iterable[Sequence[Any]]) -> list[Proposal]:
    """Proposals from the rows of :data:`SELECT_PROPOSALS`."""
    return [Proposal(id=r[0], kind=r[1], track=r[2], scope=r[3], workspace_key=r[4] or "", text=r[5], source=r[6],
                     session_id=r[7], status=r[8], created_at=r[9], decided_at=r[10], agent_key=r[11] or "")
            for r in records]


class Frozen(NamedTuple):
    """The frozen snapshots of a store: each session's digest, and each text once."""

    #: (session id, digest), oldest first
    sessions: list[tuple[str, str]]
    #: digest → (its UTF-8 length as stored, the text)
    texts: dict[str, tuple[int, str]]


def snapshot_ref(digest: str) -> str:
    """The audit row's text for a snapshot whose text has ``digest``."""
    return SNAPSHOT_REF_PREFIX + digest


def named_digest(text: str) -> str:
    """The digest of the snapshot text a ``snapshot`` audit row names. Rows from before
    memoryd_schema 7 hold the text itself, which is never of the ``sha256:<hex>`` form (a
    snapshot is empty or starts with its header line)."""
    hexpart = text[len(SNAPSHOT_REF_PREFIX):]
    if text.startswith(SNAPSHOT_REF_PREFIX) and len(hexpart) == 64 and all(c in "0123456789abcdef" for c in hexpart):
        return hexpart
    return text_hash(text)


def read_frozen(fetch: Fetch) -> Frozen:
    """The frozen snapshots, read with :data:`SELECT_SNAPSHOTS` and :data:`SELECT_SNAPSHOT_TEXTS`;
    from a store of memoryd_schema 6 or older, digested here from each session's own text."""
    if fetch(SELECT_SNAPSHOT_TEXTS_TABLE):
        return Frozen([(str(r[0]), str(r[1])) for r in fetch(SELECT_SNAPSHOTS)],
                      {str(r[0]): (int(r[1]), str(r[2])) for r in fetch(SELECT_SNAPSHOT_TEXTS)})
    frozen = Frozen([], {})
    for sid, text in fetch(SELECT_SNAPSHOTS_UNSHARED):
        digest = text_hash(str(text))
        frozen.sessions.append((str(sid), digest))
        frozen.texts[digest] = (len(str(text).encode()), str(text))
    return frozen


def rows_from(records: Iterable[Sequence[Any]]) -> list[LedgerRow]:
    """LedgerRows from the rows of :data:`SELECT_LEDGER`."""
    return [LedgerRow(*r) for r in records]


def audit_from(records: Iterable[Sequence[Any]]) -> list[AuditRow]:
    """AuditRows from the rows of :data:`SELECT_AUDIT`."""
    return [AuditRow(seq=r[0], ts=r[1], action=r[2], track=r[3], scope=r[4], entry_id=r[5], text=r[6],
                     outcome=r[7], source=r[8], session_id=r[9]) for r in records]


def entries_from(records: Iterable[Sequence[Any]]) -> list[LedgerEntry]:
    """LedgerEntries from the rows of :data:`SELECT_ENTRIES` (tags is the JSON column)."""
    out: list[LedgerEntry] = []
    for r in records:
        try:
            tags = msgspec.json.decode(str(r[6] or "[]"), type=list[str])
        except (msgspec.DecodeError, msgspec.ValidationError):
            tags = ["<unreadable tags>"]
        out.append(LedgerEntry(id=str(r[0]), track=str(r[1]), scope=str(r[2]), workspace_key=str(r[3] or ""),
                               agent_key=str(r[4] or ""), text=str(r[5]), tags=tags, source=str(r[7]),
                               version=int(r[8] or 1)))
    return out
