"""Writing the ledger: every audit row with its chained ``memoryd_ledger`` row, and the
approval, connection and failure rows beside them (memoryd_protocol.ledger has the format).

Synchronous, like store.py: each function runs inside a write transaction and takes its
:class:`~memoryd.tx.Tx`, so an audit row and its ledger row commit or vanish together.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal

from memoryd_protocol.approval_types import ProcessFacts
from memoryd_protocol.ledger import (
    SELECT_AUDIT,
    SELECT_ENTRIES,
    SELECT_PROPOSALS,
    SELECT_SNAPSHOTS,
    AcceptedBody,
    AskedBody,
    AuditBody,
    Body,
    DecidedBody,
    FailedBody,
    Kind,
    ProposalBody,
    PrunedBody,
    StartBody,
    audit_digest,
    audit_from,
    canonical,
    chain_hash,
    entries_from,
    ledger_entry,
    proposals_from,
)
from memoryd_protocol.types import ApprovalAsked, ApprovalBy, Entry, LedgerConnection, Proposal

from . import store
from .atomic import atomic
from .context import Peer
from .tx import Tx, Usage

log = logging.getLogger("memoryd.ledger")


def append(tx: Tx, kind: Kind, body: Body, *, ref: str | None = None, audit_seq: int | None = None,
           ts: int | None = None) -> None:
    """Chain one row onto the transaction's tip (``Tx.tip``), which it moves."""
    n, prev = (tx.tip[0] + 1, tx.tip[1]) if tx.tip else (1, "")
    text = canonical(body)
    ts = ts if ts is not None else store.now_ms()
    digest = chain_hash(prev, n, ts, kind, ref, audit_seq, text)
    tx.conn.execute(
        "INSERT INTO memoryd_ledger (n, ts, kind, ref, audit_seq, body, prev, hash) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (n, ts, kind, ref, audit_seq, text, prev, digest),
    )
    tx.tip = (n, digest)


@contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[Tx]:
    """A write transaction outside the writer (start-up, tools, tests): BEGIN, its Tx,
    what it gathered written (store.flush), COMMIT."""
    with atomic(conn):
        tx = Tx(conn, {}, head(conn))
        yield tx
        store.flush(tx)


def ensure_start(tx: Tx) -> bool:
    """Begin the chain of a store that has none yet (inside the caller's transaction); True
    when it did. Audit rows already there carry no hashes: the chain starts after them, and
    says so."""
    conn = tx.conn
    if conn.execute("SELECT 1 FROM memoryd_ledger LIMIT 1").fetchone() is not None:
        return False
    before = audit_from(conn.execute(SELECT_AUDIT))
    after, earlier = max((a.seq for a in before), default=0), len(before)
    entries = entries_from(conn.execute(SELECT_ENTRIES))
    snapshots = dict(conn.execute(SELECT_SNAPSHOTS).fetchall())
    proposals = proposals_from(conn.execute(SELECT_PROPOSALS))  # as stored, as verify reads them
    if earlier:
        note = (f"the chain starts after audit row {after}: the {earlier} earlier audit rows were written "
                f"before this store had a ledger (by dsh-memento, or an older memoryd) and carry no hashes")
    elif entries:
        note = f"the chain starts with the {len(entries)} entries the store held and no audit rows"
    else:
        note = "the chain starts with the store"
    append(tx, "start", StartBody(after_audit_seq=after, note=note, entries=entries, snapshots=snapshots,
                                    proposals=proposals, earlier_audit=audit_digest(before)))
    if entries or earlier:
        # A store new to memoryd, or one whose ledger was deleted: only the log, beside the
        # last run's "ledger head at stop", can tell the two apart.
        log.warning("the ledger's chain begins on a store that already holds %d entries and %d audit rows: nothing "
                    "proves what came before", len(entries), earlier)
    return True


def _ensure_connection(tx: Tx, who: LedgerConnection | None) -> str | None:
    """The ref of ``who``, writing its connection row first if no row of it exists yet."""
    if who is None:
        return None
    if who.ref in tx.known or who.ref in tx.written:
        return who.ref  # its row is in the store: committed in this run, or by this transaction
    if tx.conn.execute("SELECT 1 FROM memoryd_ledger WHERE kind = 'connection' AND ref = ?",
                       (who.ref,)).fetchone() is None:
        append(tx, "connection", who, ref=who.ref)
    tx.written.add(who.ref)
    return who.ref


def head(conn: sqlite3.Connection) -> tuple[int, str] | None:
    """The newest ledger row: (n, hash); None for an empty ledger."""
    row = conn.execute("SELECT n, hash FROM memoryd_ledger ORDER BY n DESC LIMIT 1").fetchone()
    return None if row is None else (int(row[0]), str(row[1]))


def connection(peer: Peer, run: str) -> LedgerConnection:
    """``peer`` as the ledger records it (``run``: this daemon run's id): the kernel's facts
    of its socket's process at connect (a relay's own), and what it claims (its client; a
    relay's harness)."""
    info = peer.listing(approver=False)
    p = peer.peer
    f = p.facts if p is not None else None
    if f is None:  # memoryd saw no process: what the listing has
        return LedgerConnection(ref=f"{run}/{info.id}", run=run, id=info.id, transport=info.transport, pid=info.pid,
                                uid=info.uid, exe=info.exe, client=info.client, opened_at=info.opened_at)
    return LedgerConnection(ref=f"{run}/{info.id}", run=run, id=info.id, transport=info.transport, pid=f.pid,
                            uid=f.uid, exe=f.exe, client=info.client, opened_at=info.opened_at, start=f.start,
                            tty=f.tty, session=f.session, harness=p.pid if p is not None and p.via is not None else None)


@dataclass
class Anchor:
    """The newest ledger row this daemon committed (or found at start), held outside the
    store. A same-uid process can delete the ledger's tail or rewrite it with recomputed
    hashes, and the chain still checks out; it cannot change what the running daemon
    remembers. The writer checks the row at the head of every transaction (``begin``) and
    moves the head after every commit (``committed``); ``audit/verify`` compares the store
    with it. Once the store no longer holds that row as written, the head stays where it
    was for the daemon's life, so a later write does not chain the forgery in."""

    head: tuple[int, str] | None = None
    #: set once the store's row ``head`` was found missing or changed
    lost: Literal["missing", "changed"] | None = None
    #: the connection rows this daemon committed (their refs), while the ledger's newest
    #: row is the one its last commit left (``_left``): anyone else's write forgets them
    _connections: set[str] = field(default_factory=set)
    _left: tuple[int, str] | None = None
    #: called with the head after every commit (heads.Heads.committed)
    on_commit: Callable[[tuple[int, str] | None], None] | None = None

    def begin(self, conn: sqlite3.Connection, usage: Usage) -> Tx:
        """The Tx of the writer's transaction, just begun: the store's newest ledger row
        read once, and checked against the head."""
        tip = head(conn)
        if tip != self._left:
            self._connections = set()  # the ledger is not as this daemon left it: read them again
        self._left = tip
        if self.head is not None and not self.lost and tip != self.head:
            n, want = self.head
            row = conn.execute("SELECT hash FROM memoryd_ledger WHERE n = ?", (n,)).fetchone()
            if row is None or row[0] != want:
                self.lost = "missing" if row is None else "changed"
                log.error("ledger row %d, the last this daemon wrote, is %s outside memoryd; audit/verify reports it",
                          n, "missing: deleted" if row is None else "changed")
        return Tx(conn, dict(usage), tip, self._connections)

    def committed(self, tx: Tx) -> None:
        """After the transaction's COMMIT: its newest row is the head now."""
        self._left = tx.tip
        self._connections |= tx.written
        if not self.lost:
            self.head = tx.tip
        if self.on_commit is not None:
            self.on_commit(self.head)


@dataclass(frozen=True)
class Stamp:
    """What every ledger row of one request names: who asked, under which approval (or
    policy label), for which session."""

    origin: LedgerConnection | None
    session_id: str | None
    #: the audit ``outcome`` of a write (``allowed-once (via approval, ...)``); None for reads
    label: str | None = None
    #: the approval the write passed (None: policy auto, or nothing was asked)
    approval: str | None = None

    def audit(self, tx: Tx, action: str, *, track: str | None, scope: str | None,
              entry_id: str | None, text: str | None, source: str | None, entry: Entry | None = None,
              ts: int | None = None) -> None:
        """One audit row and its ledger row. ``entry``: the entry as this row leaves it."""
        ts = ts if ts is not None else store.now_ms()
        seq = store.audit(tx.conn, action, track=track, scope=scope, entry_id=entry_id, text=text, outcome=self.label,
                          source=source, session_id=self.session_id, ts=ts)
        ref = _ensure_connection(tx, self.origin)
        body = AuditBody(seq=seq, ts=ts, action=action, track=track, scope=scope, entry_id=entry_id, text=text,
                         outcome=self.label, source=source, session_id=self.session_id, connection=ref,
                         approval=self.approval, entry=None if entry is None else ledger_entry(entry))
        append(tx, "audit", body, audit_seq=seq, ts=ts)


def asked(tx: Tx, origin: LedgerConnection | None, payload: ApprovalAsked) -> None:
    ref = _ensure_connection(tx, origin)
    append(tx, "asked", AskedBody(connection=ref, asked=payload), ref=payload.id)


@dataclass(frozen=True)
class Decision:
    """How an asked approval ended, as the gate learned it: ``by`` is the decider's claim,
    ``decider`` its process as the kernel showed it when the decision arrived."""

    approval: str
    outcome: str
    policy: str
    decided_by: LedgerConnection | None
    by: ApprovalBy | None
    decider: ProcessFacts | None = None

    def record(self, tx: Tx) -> None:
        ref = _ensure_connection(tx, self.decided_by)
        append(tx, "decided", DecidedBody(approval=self.approval, outcome=self.outcome, connection=ref,
                                            by=self.by, policy=self.policy, decider=self.decider), ref=self.approval)


def proposal(tx: Tx, origin: LedgerConnection | None, event: Literal["created", "dismissed",
             "approved"], p: Proposal, replaces: str | None = None) -> None:
    ref = _ensure_connection(tx, origin)
    append(tx, "proposal", ProposalBody(connection=ref, event=event, proposal=p, replaces=replaces), ref=p.id)


def accepted(tx: Tx, who: LedgerConnection | None, foreign: int, decider: ProcessFacts) -> None:
    """A person accepted the ``foreign`` row ``foreign`` over connection ``who``, whose
    process the kernel showed as ``decider`` when the acceptance arrived."""
    ref = _ensure_connection(tx, who)
    # ref: the row accepted, so that whether it was is one lookup of the ref index
    append(tx, "accepted", AcceptedBody(foreign=foreign, connection=ref, decider=decider), ref=str(foreign))


def pruned(tx: Tx, who: LedgerConnection | None, sessions: list[str], before: int | None,
           decider: ProcessFacts) -> None:
    """The frozen snapshots of ``sessions`` were deleted over connection ``who``."""
    ref = _ensure_connection(tx, who)
    append(tx, "pruned", PrunedBody(sessions=sessions, before=before, connection=ref, decider=decider))


def failed(tx: Tx, stamp: Stamp, action: str, code: str, message: str,
           entry_id: str | None) -> None:
    ref = _ensure_connection(tx, stamp.origin)
    append(tx, "failed", FailedBody(approval=stamp.approval, action=action, connection=ref, code=code,
                                      message=message, entry_id=entry_id), ref=stamp.approval)
