"""The ledger that proves itself: row bodies, the hash chain, verification and replay.

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
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, Protocol, TypeVar

import msgspec

from .errors import InvalidInput
from .text import utf16_len
from .types import (
    ApprovalAsked,
    ApprovalBy,
    AuditRow,
    Entry,
    EntryLife,
    LedgerConnection,
    LedgerDecision,
    LedgerEntry,
    LedgerEvent,
    LedgerProblem,
    LedgerReport,
    Proposal,
)

#: Runs one SELECT of this module and returns its rows (the caller's sqlite3 connection).
Fetch = Callable[[str], Iterable[Sequence[Any]]]
Kind = Literal["start", "connection", "audit", "asked", "decided", "failed", "proposal"]
T = TypeVar("T")
R = TypeVar("R")

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
SELECT_SNAPSHOTS = "SELECT session_id, text FROM memoryd_snapshots ORDER BY created_at, session_id"
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
    by: ApprovalBy | None
    policy: str


class FailedBody(_Body):
    """An approved write whose commit then failed: nothing of it was written."""

    approval: str | None
    action: str
    connection: str | None
    code: str
    message: str
    #: the entry the write was to replace or remove (None: it would have made a new one)
    entry_id: str | None = None


Body = StartBody | LedgerConnection | AuditBody | AskedBody | DecidedBody | FailedBody | ProposalBody
_BODY_TYPES: dict[str, type[Body]] = {
    "start": StartBody, "connection": LedgerConnection, "audit": AuditBody, "asked": AskedBody,
    "decided": DecidedBody, "failed": FailedBody, "proposal": ProposalBody,
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


#: What replay compares of an entry: its identity, text, tags, version and keys (not its
#: recall counters or timestamps, which queries move without a ledger row).
_COMPARED = ("track", "scope", "workspace_key", "agent_key", "text", "tags", "source", "version")
_ADDS = frozenset({"add", "consolidate-add", "replace"})
_REMOVES = frozenset({"remove", "consolidate-remove"})


class _Verifier:
    def __init__(self) -> None:
        self.problems: list[LedgerProblem] = []

    def problem(self, reason: str, n: int | None = None, seq: int | None = None) -> None:
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(LedgerProblem(n=n, seq=seq, reason=reason))

    def head(self, ledger: Sequence[LedgerRow], head: tuple[int, str] | None) -> None:
        """The row the daemon remembers as its newest must be there as it wrote it."""
        if head is None:
            return
        n, want = head
        have = next((r.hash for r in reversed(ledger) if r.n == n), None)
        if have is None:
            self.problem(f"ledger row {n}, the last this daemon wrote, is missing: the ledger was truncated", n)
        elif have != want:
            self.problem(f"ledger row {n}, the last this daemon wrote, was changed: the ledger was rewritten", n)


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def audit_digest(rows: Iterable[AuditRow]) -> PreChain:
    """The :class:`PreChain` of ``rows`` (taken in seq order)."""
    ordered = sorted(rows, key=lambda a: a.seq)
    return PreChain(count=len(ordered), digest=hashlib.sha256(_encoder.encode(ordered)).hexdigest())


def verify(ledger: Sequence[LedgerRow], audit: Iterable[AuditRow], entries: Iterable[LedgerEntry],
           snapshots: Iterable[tuple[str, str]] = (), head: tuple[int, str] | None = None,
           provenance: Iterable[Provenance] | None = None, proposals: Iterable[Proposal] | None = None
           ) -> LedgerReport:
    """Check the chain, that every audit row since the chain's start is chained and
    unchanged, that replaying the ledger from its start gives the live entries, and that
    every frozen snapshot (``(session id, text)``: what a session's prompt is built from)
    is the one the ledger recorded. ``head``: the (n, hash) of the newest row the daemon that
    asks remembers writing; the store must still hold it (no tail deleted, nothing rewritten).
    ``provenance``: each live entry's (id, created_at, updated_at, session_id), compared with
    what its ledger rows say (entries present at the chain's start have none to compare).
    ``proposals``: the live proposals, compared with the ledger's replay of them."""
    v = _Verifier()
    frozen = dict(snapshots)
    live_provenance = {p[0]: p[1:] for p in provenance or ()}
    audit_by_seq = {a.seq: a for a in audit}
    live = {e.id: e for e in entries}
    if not ledger:
        note = "the store has no ledger rows yet"
        if audit_by_seq:
            v.problem(f"{len(audit_by_seq)} audit rows and no ledger: nothing proves them")
        v.head(ledger, head)
        return LedgerReport(ok=not v.problems, rows=0, audit_rows=0, after_audit_seq=max(audit_by_seq, default=0),
                            note=note, head="", problems=v.problems)
    prev = ""
    replayed: dict[str, LedgerEntry] = {}
    proposed: dict[str, Proposal] = {}
    #: id → [created_at, updated_at, session_id] as the ledger's rows give them
    written: dict[str, list[Any]] = {}
    chained: set[int] = set()
    #: session id → (ledger n, audit seq, text) of its chained snapshot row
    recorded: dict[str, tuple[int, int, str]] = {}
    start: StartBody | None = None
    broken = False
    for expected_n, row in enumerate(ledger, start=1):
        if broken:
            break
        if row.n != expected_n:
            v.problem(f"ledger row {expected_n} is missing (the next row is {row.n})", expected_n)
            broken = True
            break
        if row.prev != prev:
            v.problem("the row does not follow its predecessor (prev hash differs): a row before it was "
                      "changed, removed or inserted", row.n)
            broken = True
            break
        if chain_hash(row.prev, row.n, row.ts, row.kind, row.ref, row.audit_seq, row.body) != row.hash:
            v.problem("the row's hash does not match its content: the row was changed", row.n)
            broken = True
            break
        prev = row.hash
        try:
            body = decode(row)
        except (KeyError, msgspec.DecodeError, msgspec.ValidationError) as exc:
            v.problem(f"the row's body cannot be read: {exc}", row.n)
            broken = True
            break
        if row.n == 1:
            if not isinstance(body, StartBody):
                v.problem("the first ledger row is not the chain's start", row.n)
                broken = True
                break
            start = body
            replayed = {e.id: e for e in body.entries}
            proposed = {p.id: p for p in body.proposals}
            continue
        if isinstance(body, StartBody):
            v.problem("a second start row: the chain restarts here", row.n)
            broken = True
            break
        if isinstance(body, ProposalBody):
            if body.replaces is not None:
                proposed.pop(body.replaces, None)
            proposed[body.proposal.id] = body.proposal
        if isinstance(body, AuditBody):
            if row.audit_seq != body.seq:
                v.problem("the row names another audit row than its body", row.n, body.seq)
            stored = audit_by_seq.get(body.seq)
            if stored is None:
                v.problem(f"audit row {body.seq} was deleted", row.n, body.seq)
            elif stored != audit_fields(body):
                v.problem(f"audit row {body.seq} was changed after it was written", row.n, body.seq)
            chained.add(body.seq)
            _replay(replayed, body)
            _provenance(written, body)
            if body.action == "snapshot" and body.session_id is not None:
                recorded[body.session_id] = (row.n, body.seq, body.text or "")
    assert start is not None or broken
    after = start.after_audit_seq if start is not None else 0
    if start is not None and start.earlier_audit is not None:
        now = audit_digest(a for seq, a in audit_by_seq.items() if seq <= after)
        if now != start.earlier_audit:
            was = start.earlier_audit.count
            v.problem(f"the audit rows at or below seq {after}, from before the chain began, were inserted, changed "
                      f"or deleted: the chain's start recorded {was}, the store now has {now.count}"
                      + ("" if now.count != was else ", not as recorded"), 1)
    if not broken:
        for seq in sorted(audit_by_seq):
            if seq > after and seq not in chained:
                v.problem(f"audit row {seq} is not in the chain: another program wrote it, or it was forged",
                          None, seq)
        def entry_differs(eid: str, want: LedgerEntry, have: LedgerEntry) -> list[str]:
            fields = [f for f in _COMPARED if getattr(want, f) != getattr(have, f)]
            said, now = written.get(eid), live_provenance.get(eid)
            if said is not None and now is not None:
                fields += [f for f, a, b in zip(("created_at", "updated_at", "session_id"), said, now, strict=True)
                           if a is not None and a != b]
            return fields

        _compare(v, "entry", replayed, live, entry_differs)
        earlier = start.snapshots if start is not None else {}
        for sid, text in frozen.items():
            if sid in recorded:
                n, seq, kept = recorded[sid]
                if text != kept:
                    v.problem(f"the frozen snapshot of session {sid} differs from the one the ledger recorded", n, seq)
            elif sid in earlier:
                if text_hash(text) != earlier[sid]:
                    v.problem(f"the frozen snapshot of session {sid} differs from the one the chain's start recorded",
                              1)
            else:
                v.problem(f"session {sid} has a frozen snapshot that no ledger row recorded")
        for sid, (n, seq, _) in recorded.items():
            if sid not in frozen:
                v.problem(f"the frozen snapshot of session {sid} was deleted", n, seq)
        if proposals is not None:
            _compare(v, "proposal", proposed, {p.id: p for p in proposals},
                     lambda _, want, have: [f for f in Proposal.__struct_fields__ if getattr(want, f) != getattr(have, f)])
    v.head(ledger, head)
    return LedgerReport(ok=not v.problems, rows=len(ledger), audit_rows=len(chained), after_audit_seq=after,
                        note=start.note if start is not None else "", head=ledger[-1].hash, problems=v.problems)


#: (id, created_at, updated_at, session_id) of a live entry: the rows of SELECT_PROVENANCE
Provenance = tuple[str, int, int, "str | None"]


def _provenance(written: dict[str, list[Any]], body: AuditBody) -> None:
    """An entry's times and session as its rows give them: an add (or consolidate-add)
    creates it at the row's ts; a replace writes it at the row's ts, for the row's session."""
    if body.entry is None or body.action not in _ADDS:
        return
    if body.action == "replace":
        created = written[body.entry.id][0] if body.entry.id in written else None
    else:
        created = body.ts
    written[body.entry.id] = [created, body.ts, body.session_id]


def _compare(v: _Verifier, noun: str, replayed: Mapping[str, R], live: Mapping[str, R],
             differs: Callable[[str, R, R], list[str]]) -> None:
    """The live rows against the ledger's replay of them: each missing, extra or changed one."""
    for key in sorted(set(replayed) | set(live)):
        want, have = replayed.get(key), live.get(key)
        if want is None:
            v.problem(f"{noun} {key} is in the store but no ledger row wrote it")
        elif have is None:
            v.problem(f"{noun} {key} is in the ledger but not in the store: it was deleted outside memoryd")
        elif fields := differs(key, want, have):
            v.problem(f"{noun} {key} differs from the ledger in {', '.join(fields)}")


def _replay(entries: dict[str, LedgerEntry], body: AuditBody) -> None:
    if body.action in _ADDS and body.entry is not None:
        entries[body.entry.id] = body.entry
    elif body.action in _REMOVES and body.entry_id is not None:
        entries.pop(body.entry_id, None)


def explain(ledger: Sequence[LedgerRow], live: Iterable[LedgerEntry], snapshots: Iterable[tuple[str, str]],
            target: str) -> EntryLife:
    """One entry's life: every ledger row that wrote it, who asked, who approved and how,
    and the sessions whose frozen snapshot showed one of its texts. ``target`` is an entry
    id, or a text that exactly one entry (live, else in the ledger) contains."""
    bodies = [(row, decode(row)) for row in ledger]
    connections = {b.ref: b for _, b in bodies if isinstance(b, LedgerConnection)}
    asked = {b.asked.id: b for _, b in bodies if isinstance(b, AskedBody)}
    decided = {b.approval: b for _, b in bodies if isinstance(b, DecidedBody)}
    failed = {b.approval: b for _, b in bodies if isinstance(b, FailedBody) and b.approval is not None}
    live_list = list(live)
    entry_id = _resolve(target, bodies, live_list)

    def decision_of(approval: str | None) -> LedgerDecision | None:
        if approval is None:
            return None
        d, a, f = decided.get(approval), asked.get(approval), failed.get(approval)
        return LedgerDecision(
            approval=approval, outcome=d.outcome if d else None, policy=d.policy if d else None,
            decided_by=connections.get(d.connection) if d and d.connection else None,
            by=d.by if d else None, reason=a.asked.reason if a else None, failed=f.code if f else None)

    events: list[LedgerEvent] = []
    texts: list[str] = []
    for row, b in bodies:
        if isinstance(b, StartBody):
            for e in b.entries:
                if e.id == entry_id:
                    texts.append(e.text)
                    events.append(LedgerEvent(n=row.n, seq=None, ts=row.ts, action="present-at-start", outcome=None,
                                              text=e.text, session_id=None, asked_by=None, decision=None))
            continue
        if isinstance(b, FailedBody) and b.entry_id == entry_id:
            # an approved write of this entry that then failed: nothing of it was written
            events.append(LedgerEvent(n=row.n, seq=None, ts=row.ts, action=f"{b.action}-failed", outcome=b.code,
                                      text=None, session_id=None,
                                      asked_by=connections.get(b.connection) if b.connection else None,
                                      decision=decision_of(b.approval)))
            continue
        if not isinstance(b, AuditBody) or (b.entry_id != entry_id and (b.entry is None or b.entry.id != entry_id)):
            continue
        text = b.entry.text if b.entry is not None else b.text
        if text is not None and b.entry is not None:
            texts.append(text)
        events.append(LedgerEvent(n=row.n, seq=b.seq, ts=b.ts, action=b.action, outcome=b.outcome, text=text,
                                  session_id=b.session_id,
                                  asked_by=connections.get(b.connection) if b.connection else None,
                                  decision=decision_of(b.approval)))
    current = next((e for e in live_list if e.id == entry_id), None)
    # A snapshot showed the entry when one of its texts is an entry line there ("- text",
    # whole lines), not when another entry's longer text merely contains it.
    shown = sorted({sid for sid, snap in snapshots if any(f"\n- {t}\n" in f"\n{snap}\n" for t in texts)})
    return EntryLife(entry_id=entry_id, current=current, events=events, snapshots=shown)


def _resolve(target: str, bodies: Sequence[tuple[LedgerRow, Body]], live: Sequence[LedgerEntry]) -> str:
    known: dict[str, str] = {}  # id → its latest text
    for _, b in bodies:
        if isinstance(b, StartBody):
            known.update((e.id, e.text) for e in b.entries)
        elif isinstance(b, AuditBody) and b.entry is not None:
            known[b.entry.id] = b.entry.text
    for e in live:
        known[e.id] = e.text
    if target in known:
        return target
    needle = target.lower()
    for pool in ([e.id for e in live], list(known)):
        hits = [i for i in pool if needle in known[i].lower()]
        if len(hits) == 1:
            return hits[0]
        if len(hits) > 1:
            # INVALID_INPUT, not AMBIGUOUS_MATCH / ENTRY_NOT_FOUND: the contract gives those
            # details of a track/scope match, and a target has neither.
            raise InvalidInput(f"{len(hits)} entries contain this text; name one by id: {', '.join(sorted(hits)[:5])}",
                               "target")
    raise InvalidInput("no entry in the store or its ledger has this id or contains this text", "target")


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


def usage_problems(kept: Iterable[Sequence[Any]], texts: Iterable[Sequence[Any]]) -> list[LedgerProblem]:
    """Where memoryd_usage (what the budgets are enforced against) differs from the entries'
    own count and units: a lowered counter would let a layer grow past its budget."""
    counted = cell_usage(texts)
    stored = {(str(t), str(sc)): [int(n), int(u)] for t, sc, n, u in kept}
    problems = []
    for cell in sorted(counted.keys() | stored.keys()):
        want, have = counted.get(cell, [0, 0]), stored.get(cell, [0, 0])
        if want != have:
            problems.append(LedgerProblem(reason=(
                f"memoryd_usage says {cell[0]}/{cell[1]} holds {have[0]} entries of {have[1]} characters; the "
                f"entries are {want[0]} of {want[1]}: the store was changed outside memoryd")))
    return problems


def read_report(fetch: Fetch, head: tuple[int, str] | None = None) -> LedgerReport:
    """:func:`verify` of a store, its rows read by ``fetch`` (SQL → rows), which the caller
    runs inside one read transaction so that all its reads see the same moment; and the
    budgets' counter recomputed from the entries (:func:`usage_problems`)."""
    report = verify(rows_from(fetch(SELECT_LEDGER)), audit_from(fetch(SELECT_AUDIT)), entries_from(fetch(SELECT_ENTRIES)),
                    snapshots_from(fetch(SELECT_SNAPSHOTS)), head,
                    [(str(r[0]), int(r[1]), int(r[2]), None if r[3] is None else str(r[3]))
                     for r in fetch(SELECT_PROVENANCE)], proposals_from(fetch(SELECT_PROPOSALS)))
    if fetch(SELECT_USAGE_TABLE):
        extra = usage_problems(fetch(SELECT_USAGE), fetch(SELECT_CELL_TEXTS))
        if extra:
            report.problems = [*report.problems, *extra][:MAX_PROBLEMS]
            report.ok = False
    return report


def read_life(fetch: Fetch, target: str) -> EntryLife:
    """:func:`explain` of a store, its rows read by ``fetch`` as for :func:`read_report`."""
    snapshots = snapshots_from(fetch(SELECT_SNAPSHOTS))
    return explain(rows_from(fetch(SELECT_LEDGER)), entries_from(fetch(SELECT_ENTRIES)), snapshots, target)


def proposals_from(records: Iterable[Sequence[Any]]) -> list[Proposal]:
    """Proposals from the rows of :data:`SELECT_PROPOSALS`."""
    return [Proposal(id=r[0], kind=r[1], track=r[2], scope=r[3], workspace_key=r[4] or "", text=r[5], source=r[6],
                     session_id=r[7], status=r[8], created_at=r[9], decided_at=r[10], agent_key=r[11] or "")
            for r in records]


def snapshots_from(records: Iterable[Sequence[Any]]) -> list[tuple[str, str]]:
    """(session id, text) pairs from the rows of :data:`SELECT_SNAPSHOTS`."""
    return [(str(r[0]), str(r[1])) for r in records]


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
