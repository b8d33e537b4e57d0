"""Checking the ledger (ledger.py has its format): verification, the store replayed from
the chain, and one entry's life.

Pure: the daemon and ``memoryctl audit verify --db`` read the rows with ledger.py's SQL and
hand them here, so both give the same verdict.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import msgspec

from .errors import InvalidInput
from .ledger import (
    MAX_PROBLEMS,
    SELECT_AUDIT,
    SELECT_CELL_TEXTS,
    SELECT_ENTRIES,
    SELECT_LEDGER,
    SELECT_PROPOSALS,
    SELECT_PROVENANCE,
    SELECT_USAGE,
    SELECT_USAGE_TABLE,
    AcceptedBody,
    AskedBody,
    AuditBody,
    Body,
    DecidedBody,
    FailedBody,
    Fetch,
    ForeignBody,
    Frozen,
    LedgerRow,
    ProposalBody,
    PrunedBody,
    StartBody,
    audit_digest,
    audit_fields,
    audit_from,
    cell_usage,
    chain_hash,
    decode,
    entries_from,
    named_digest,
    proposals_from,
    read_frozen,
    rows_from,
    state_digest,
    text_hash,
)
from .types import (
    AuditRow,
    EntryLife,
    LedgerConnection,
    LedgerDecision,
    LedgerEntry,
    LedgerEvent,
    LedgerProblem,
    LedgerReport,
    Proposal,
)

R = TypeVar("R")


#: What replay compares of an entry: its identity, text, tags, version and keys (not its
#: recall counters or timestamps, which queries move without a ledger row).
_COMPARED = ("track", "scope", "workspace_key", "agent_key", "text", "tags", "source", "version")
_ADDS = frozenset({"add", "consolidate-add", "replace"})
_REMOVES = frozenset({"remove", "consolidate-remove"})


class Replay:
    """The entries and proposals as the chain has them, one row after another. The rows a
    ``foreign`` row names as another program's are not replayed: that row's difference
    holds what they did."""

    def __init__(self, ledger: Sequence[LedgerRow]) -> None:
        self.entries: dict[str, LedgerEntry] = {}
        self.proposals: dict[str, Proposal] = {}
        #: the rows (n) foreign rows name
        self.outside: set[int] = set()
        for row in ledger:
            if row.kind == "foreign":
                try:
                    body = decode(row)
                except (msgspec.DecodeError, msgspec.ValidationError):
                    continue  # verify reports it when it reaches the row
                if isinstance(body, ForeignBody):
                    self.outside.update(n for n in body.ledger_rows if n < row.n)

    def apply(self, row: LedgerRow, body: Body) -> bool:
        """Replay one row; False when it is another program's (not replayed)."""
        if row.n in self.outside:
            return False
        if isinstance(body, StartBody):
            self.entries = {e.id: e for e in body.entries}
            self.proposals = {p.id: p for p in body.proposals}
        elif isinstance(body, ProposalBody):
            if body.replaces is not None:
                self.proposals.pop(body.replaces, None)
            self.proposals[body.proposal.id] = body.proposal
        elif isinstance(body, AuditBody):
            _replay(self.entries, body)
        elif isinstance(body, ForeignBody):
            for eid in body.removed:
                self.entries.pop(eid, None)
            self.entries.update((e.id, e) for e in body.entries)
            for pid in body.removed_proposals:
                self.proposals.pop(pid, None)
            self.proposals.update((p.id, p) for p in body.proposals)
        return True

    def digest(self) -> str:
        return state_digest(self.entries.values(), self.proposals.values())


def replay(ledger: Sequence[LedgerRow]) -> Replay:
    """The state the chain gives (rows whose body cannot be read are skipped: verify
    reports them)."""
    state = Replay(ledger)
    for row in ledger:
        try:
            body = decode(row)
        except (KeyError, msgspec.DecodeError, msgspec.ValidationError):
            continue
        state.apply(row, body)
    return state


class _Verifier:
    def __init__(self) -> None:
        self.problems: list[LedgerProblem] = []

    def problem(self, reason: str, n: int | None = None, seq: int | None = None) -> None:
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(LedgerProblem(n=n, seq=seq, reason=reason))

    def head(self, ledger: Sequence[LedgerRow], head: tuple[int, str] | None, lost: str | None = None) -> None:
        """The row the daemon remembers as its newest must be there as it wrote it. ``lost``:
        how the daemon found it gone ("missing", "changed"), which a row written at that n
        since (the daemon's own next row, say) must not turn into another finding."""
        if head is None:
            return
        n, want = head
        have = next((r.hash for r in reversed(ledger) if r.n == n), None)
        if have is None or lost == "missing":
            self.problem(f"ledger row {n}, the last this daemon wrote, is missing: the ledger was truncated", n)
        elif have != want:
            self.problem(f"ledger row {n}, the last this daemon wrote, was changed: the ledger was rewritten", n)


def verify(ledger: Sequence[LedgerRow], audit: Iterable[AuditRow], entries: Iterable[LedgerEntry],
           snapshots: Frozen | None = None, head: tuple[int, str] | None = None,
           provenance: Iterable[Provenance] | None = None, proposals: Iterable[Proposal] | None = None,
           lost: str | None = None) -> LedgerReport:
    """Check the chain, that every audit row since the chain's start is chained and
    unchanged, that replaying the ledger from its start gives the live entries, and that
    every frozen snapshot (what a session's prompt is built from) is the one the ledger
    recorded, its stored text the one its digest names. ``head``: the (n, hash) of the
    newest row the daemon that asks remembers writing; the store must still hold it (no
    tail deleted, nothing rewritten).
    ``provenance``: each live entry's (id, created_at, updated_at, session_id), compared with
    what its ledger rows say (entries present at the chain's start have none to compare).
    ``proposals``: the live proposals, compared with the ledger's replay of them."""
    v = _Verifier()
    frozen = snapshots if snapshots is not None else Frozen([], {})
    live_provenance = {p[0]: p[1:] for p in provenance or ()}
    audit_by_seq = {a.seq: a for a in audit}
    live = {e.id: e for e in entries}
    if not ledger:
        note = "the store has no ledger rows yet"
        if audit_by_seq:
            v.problem(f"{len(audit_by_seq)} audit rows and no ledger: nothing proves them")
        v.head(ledger, head, lost)
        return LedgerReport(ok=not v.problems, rows=0, audit_rows=0, after_audit_seq=max(audit_by_seq, default=0),
                            note=note, head="", problems=v.problems)
    prev = ""
    state = Replay(ledger)
    #: id → [created_at, updated_at, session_id] as the ledger's rows give them
    written: dict[str, list[Any]] = {}
    chained: set[int] = set()
    #: session id → (ledger n, audit seq, text) of its chained snapshot row (the text is the
    #: snapshot's ``sha256:`` digest, or in rows from before memoryd_schema 7 the text itself)
    recorded: dict[str, tuple[int, int, str]] = {}
    #: sessions whose frozen snapshot a ``pruned`` row deleted (and none froze again since)
    pruned: set[str] = set()
    #: foreign rows (n) and the accepted rows that name them
    foreign: dict[int, str] = {}
    accepted: set[int] = set()
    start: StartBody | None = None
    broken = False
    for expected_n, row in enumerate(ledger, start=1):
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
        if row.n in state.outside:
            continue  # another program's row, chained: the foreign row after it says what it did
        try:
            body = decode(row)
        except KeyError:
            v.problem(f"the row's kind {row.kind!r} is not one memoryd writes", row.n)
            broken = True
            break
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            v.problem(f"the row's body cannot be read: {exc}", row.n)
            broken = True
            break
        if row.n == 1 and not isinstance(body, StartBody):
            v.problem("the first ledger row is not the chain's start", row.n)
            broken = True
            break
        if row.n > 1 and isinstance(body, StartBody):
            v.problem("a second start row: the chain restarts here", row.n)
            broken = True
            break
        if isinstance(body, StartBody):
            start = body
        if isinstance(body, ForeignBody) and row.n not in state.outside:
            if state.digest() != body.before:
                v.problem("the entries and proposals before this change made outside memoryd differ from the "
                          "chain's", row.n)
            now = audit_digest(audit_by_seq[seq] for seq in body.audit_seqs if seq in audit_by_seq)
            if body.audit is not None and now != body.audit:
                v.problem("the audit rows this change made outside memoryd wrote were changed or deleted since", row.n)
            chained.update(body.audit_seqs)
            foreign[row.n] = body.note
        if isinstance(body, AcceptedBody):
            if body.foreign not in foreign:
                v.problem(f"the row accepts ledger row {body.foreign}, which records no change made outside memoryd",
                          row.n)
            accepted.add(body.foreign)
        if isinstance(body, PrunedBody):
            for sid in body.sessions:
                recorded.pop(sid, None)
            pruned.update(body.sessions)
        if not state.apply(row, body):
            continue
        if isinstance(body, ForeignBody) and state.digest() != body.after:
            v.problem("replaying this change made outside memoryd does not give the state it recorded", row.n)
        if isinstance(body, AuditBody):
            if row.audit_seq != body.seq:
                v.problem("the row names another audit row than its body", row.n, body.seq)
            stored = audit_by_seq.get(body.seq)
            if stored is None:
                v.problem(f"audit row {body.seq} was deleted", row.n, body.seq)
            elif stored != audit_fields(body):
                v.problem(f"audit row {body.seq} was changed after it was written", row.n, body.seq)
            chained.add(body.seq)
            _provenance(written, body)
            if body.action == "snapshot" and body.session_id is not None:
                recorded[body.session_id] = (row.n, body.seq, body.text or "")
                pruned.discard(body.session_id)
    for n, note in foreign.items():
        if n not in accepted:
            v.problem(f"ledger row {n} records a change another program made to the store, not accepted yet: "
                      f"{note}. Check it, then run memoryctl audit accept {n}", n)
    replayed, proposed = state.entries, state.proposals
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
        _check_snapshots(v, frozen, recorded, {sid: d for sid, d in earlier.items() if sid not in pruned})
        if proposals is not None:
            _compare(v, "proposal", proposed, {p.id: p for p in proposals},
                     lambda _, want, have: [f for f in Proposal.__struct_fields__ if getattr(want, f) != getattr(have, f)])
    v.head(ledger, head, lost)
    return LedgerReport(ok=not v.problems, rows=len(ledger), audit_rows=len(chained), after_audit_seq=after,
                        note=start.note if start is not None else "", head=ledger[-1].hash, problems=v.problems)


def _check_snapshots(v: _Verifier, frozen: Frozen, recorded: Mapping[str, tuple[int, int, str]],
                     earlier: Mapping[str, str]) -> None:
    """Each session's frozen snapshot names the digest that its ledger row (or the chain's
    start) recorded, and the text stored under a digest is the one the digest names, of the
    length recorded beside it (what max_snapshot_bytes is enforced against)."""
    intact: dict[str, bool] = {}
    for digest, (size, text) in frozen.texts.items():
        intact[digest] = text_hash(text) == digest
        if intact[digest] and size != len(text.encode()):
            v.problem(f"the stored snapshot text sha256:{digest} records {size} bytes and has {len(text.encode())}: "
                      "the store was changed outside memoryd")
    named: set[str] = set()
    for sid, digest in frozen.sessions:
        named.add(digest)
        n, seq, want, what = (None, None, None, "")
        if sid in recorded:
            n, seq, kept = recorded[sid]
            want, what = named_digest(kept), "the ledger"
        elif sid in earlier:
            n, want, what = 1, earlier[sid], "the chain's start"
        if want is None:
            v.problem(f"session {sid} has a frozen snapshot that no ledger row recorded")
        elif digest not in intact:
            v.problem(f"the text of session {sid}'s frozen snapshot (sha256:{digest}) is missing from the store", n, seq)
        elif digest != want or not intact[digest]:
            v.problem(f"the frozen snapshot of session {sid} differs from the one {what} recorded", n, seq)
    sessions = {sid for sid, _ in frozen.sessions}
    for sid, (n, seq, _) in recorded.items():
        if sid not in sessions:
            v.problem(f"the frozen snapshot of session {sid} was deleted", n, seq)
    for digest in sorted(d for d, ok in intact.items() if not ok and d not in named):
        # no session shows it yet, but a new session whose snapshot has this digest would
        v.problem(f"the stored snapshot text sha256:{digest} does not match its digest: it was changed outside "
                  "memoryd")


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


def explain(ledger: Sequence[LedgerRow], live: Iterable[LedgerEntry], snapshots: Frozen, target: str) -> EntryLife:
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
            by=d.by if d else None, reason=a.asked.reason if a else None, failed=f.code if f else None,
            decider=d.decider if d else None)

    def unasked(row: LedgerRow, action: str, text: str | None = None) -> LedgerEvent:
        """An event no connection asked for: the chain's start, or another program's change."""
        return LedgerEvent(n=row.n, seq=None, ts=row.ts, action=action, outcome=None, text=text, session_id=None,
                           asked_by=None, decision=None)

    events: list[LedgerEvent] = []
    texts: list[str] = []
    outside = Replay(ledger).outside
    for row, b in bodies:
        if row.n in outside:
            continue  # another program's rows: the foreign row after them says what they did
        if isinstance(b, ForeignBody | StartBody):
            action = "present-at-start" if isinstance(b, StartBody) else "written-outside-memoryd"
            for e in b.entries:
                if e.id == entry_id:
                    texts.append(e.text)
                    events.append(unasked(row, action, e.text))
            if isinstance(b, ForeignBody) and entry_id in b.removed:
                events.append(unasked(row, "deleted-outside-memoryd"))
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
    # Each distinct text is searched once, however many sessions froze it.
    showing = {d for d, (_, snap) in snapshots.texts.items() if any(f"\n- {t}\n" in f"\n{snap}\n" for t in texts)}
    shown = sorted({sid for sid, d in snapshots.sessions if d in showing})
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


def heads_problems(found: Mapping[int, str], witnessed: Iterable[tuple[int, str]]) -> list[LedgerProblem]:
    """Each head witnessed outside the store (n, hash) that the chain no longer holds as
    witnessed; ``found``: the hash of each of those rows the store has."""
    problems = []
    for n, want in witnessed:
        have = found.get(n)
        if have is None:
            problems.append(LedgerProblem(n=n, reason=(
                f"ledger row {n}, a head witnessed outside the store, is missing: the ledger was truncated")))
        elif have != want:
            problems.append(LedgerProblem(n=n, reason=(
                f"ledger row {n} is not the head witnessed outside the store: the ledger was rewritten")))
    return problems


def with_problems(report: LedgerReport, extra: Sequence[LedgerProblem]) -> LedgerReport:
    """``report`` with ``extra`` problems after its own (at most MAX_PROBLEMS in all)."""
    if not extra:
        return report
    return msgspec.structs.replace(report, ok=False, problems=[*report.problems, *extra][:MAX_PROBLEMS])


def read_report(fetch: Fetch, head: tuple[int, str] | None = None,
                witnessed: Sequence[tuple[int, str]] = (), lost: str | None = None) -> LedgerReport:
    """:func:`verify` of a store, its rows read by ``fetch`` (SQL → rows), which the caller
    runs inside one read transaction so that all its reads see the same moment; the
    budgets' counter recomputed from the entries (:func:`usage_problems`); and the heads
    ``witnessed`` outside the store (:func:`heads_problems`)."""
    ledger = rows_from(fetch(SELECT_LEDGER))
    report = verify(ledger, audit_from(fetch(SELECT_AUDIT)), entries_from(fetch(SELECT_ENTRIES)),
                    read_frozen(fetch), head,
                    [(str(r[0]), int(r[1]), int(r[2]), None if r[3] is None else str(r[3]))
                     for r in fetch(SELECT_PROVENANCE)], proposals_from(fetch(SELECT_PROPOSALS)), lost)
    extra = usage_problems(fetch(SELECT_USAGE), fetch(SELECT_CELL_TEXTS)) if fetch(SELECT_USAGE_TABLE) else []
    if witnessed:
        extra += heads_problems({r.n: r.hash for r in ledger}, witnessed)
    return with_problems(report, extra)


def read_life(fetch: Fetch, target: str) -> EntryLife:
    """:func:`explain` of a store, its rows read by ``fetch`` as for :func:`read_report`."""
    return explain(rows_from(fetch(SELECT_LEDGER)), entries_from(fetch(SELECT_ENTRIES)), read_frozen(fetch), target)


