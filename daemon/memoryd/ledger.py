"""Writing the ledger: every audit row with its chained ``memoryd_ledger`` row, and the
approval, connection and failure rows beside them (memoryd_protocol.ledger has the format).

Synchronous, like store.py: each function runs inside the transaction the writer opened
(on the event loop's thread or the writer's own, writer.py), so an audit row and its
ledger row commit or vanish together.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from dataclasses import dataclass, field
from typing import Literal

from memoryd_protocol.ledger import (
    SELECT_ENTRIES,
    SELECT_SNAPSHOTS,
    AskedBody,
    AuditBody,
    Body,
    DecidedBody,
    FailedBody,
    Kind,
    ProposalBody,
    StartBody,
    canonical,
    chain_hash,
    entries_from,
    ledger_entry,
    snapshots_from,
    text_hash,
)
from memoryd_protocol.types import ApprovalAsked, ApprovalBy, Entry, LedgerConnection, Proposal

from . import store
from .atomic import atomic

log = logging.getLogger("memoryd.ledger")


#: The writer's transaction in progress on this thread (``Anchor.check`` to ``advance`` or
#: ``leave``): its ``Anchor`` holds the ledger's newest row, so ``append`` need not read it.
_scope = threading.local()


def _in_scope(conn: sqlite3.Connection) -> Anchor | None:
    anchor: Anchor | None = getattr(_scope, "anchor", None)
    return anchor if anchor is not None and anchor._conn is conn else None


def append(conn: sqlite3.Connection, kind: Kind, body: Body, *, ref: str | None = None,
           audit_seq: int | None = None, ts: int | None = None) -> None:
    scope = _in_scope(conn)
    last = scope._tip if scope is not None else head(conn)
    n, prev = (last[0] + 1, last[1]) if last else (1, "")
    text = canonical(body)
    ts = ts if ts is not None else store.now_ms()
    digest = chain_hash(prev, n, ts, kind, ref, audit_seq, text)
    conn.execute(
        "INSERT INTO memoryd_ledger (n, ts, kind, ref, audit_seq, body, prev, hash) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (n, ts, kind, ref, audit_seq, text, prev, digest),
    )
    if scope is not None:
        scope._tip = (n, digest)


def ensure_start(conn: sqlite3.Connection) -> None:
    """Begin the chain of a store that has none yet (inside the caller's transaction).
    Audit rows already there carry no hashes: the chain starts after them, and says so."""
    if conn.execute("SELECT 1 FROM memoryd_ledger LIMIT 1").fetchone() is not None:
        return
    (after,) = conn.execute("SELECT coalesce(max(seq), 0) FROM audit").fetchone()
    (earlier,) = conn.execute("SELECT count(*) FROM audit").fetchone()
    entries = entries_from(conn.execute(SELECT_ENTRIES))
    snapshots = {sid: text_hash(text) for sid, text in snapshots_from(conn.execute(SELECT_SNAPSHOTS))}
    proposals = store.proposals(conn, None)
    if earlier:
        note = (f"the chain starts after audit row {after}: the {earlier} earlier audit rows were written "
                f"before this store had a ledger (by dsh-memento, or an older memoryd) and carry no hashes")
    elif entries:
        note = f"the chain starts with the {len(entries)} entries the store held and no audit rows"
    else:
        note = "the chain starts with the store"
    append(conn, "start", StartBody(after_audit_seq=after, note=note, entries=entries, snapshots=snapshots,
                                    proposals=proposals))
    if entries or earlier:
        # A store new to memoryd, or one whose ledger was deleted: only the log, beside the
        # last run's "ledger head at stop", can tell the two apart.
        log.warning("the ledger's chain begins on a store that already holds %d entries and %d audit rows: nothing "
                    "proves what came before", len(entries), earlier)


def open_chain(conn: sqlite3.Connection) -> None:
    """At start-up, on the writer's connection: begin the chain if the store has none."""
    with atomic(conn):
        ensure_start(conn)


def _ensure_connection(conn: sqlite3.Connection, who: LedgerConnection | None) -> str | None:
    """The ref of ``who``, writing its connection row first if no row of it exists yet."""
    if who is None:
        return None
    scope = _in_scope(conn)
    if scope is not None and (who.ref in scope._connections or who.ref in scope._written):
        return who.ref  # its row is in the store: committed in this run, or by this transaction
    seen = conn.execute("SELECT 1 FROM memoryd_ledger WHERE kind = 'connection' AND ref = ?", (who.ref,)).fetchone()
    if seen is None:
        append(conn, "connection", who, ref=who.ref)
        if scope is not None:
            scope._written.add(who.ref)
    elif scope is not None:
        scope._connections.add(who.ref)  # committed before this transaction (not by it: see above)
    return who.ref


def head(conn: sqlite3.Connection) -> tuple[int, str] | None:
    """The newest ledger row: (n, hash); None for an empty ledger."""
    row = conn.execute("SELECT n, hash FROM memoryd_ledger ORDER BY n DESC LIMIT 1").fetchone()
    return None if row is None else (int(row[0]), str(row[1]))


@dataclass
class Anchor:
    """The newest ledger row this daemon committed (or found at start), held outside the
    store. A same-uid process can delete the ledger's tail or rewrite it with recomputed
    hashes, and the chain still checks out; it cannot change what the running daemon
    remembers. The writer checks the row at the head of every transaction (``check``) and
    moves the head after every commit (``advance``); ``audit/verify`` compares the store
    with it. Once the store no longer holds that row as written, the head stays where it
    was for the daemon's life, so a later write does not chain the forgery in.

    Between ``check`` and ``advance`` (or ``leave``) it is also the writer's transaction
    scope on the thread running it: ``check`` reads the store's newest row once, and every row
    ``append`` adds chains on from it in memory (two statements less per audited write:
    the head read, and the connection-row check of a connection whose row this daemon
    has written). A savepoint rolled back takes its rows out of the scope too (``mark``,
    ``undo``); a transaction rolled back ends it, and the next ``check`` reads again."""

    head: tuple[int, str] | None = None
    #: set once the store's row ``head`` was found missing or changed
    lost: bool = False
    #: the connection rows this daemon committed (their refs), while the ledger's newest
    #: row is the one its last commit left (``_left``): anyone else's write forgets them
    _connections: set[str] = field(default_factory=set)
    _left: tuple[int, str] | None = None
    #: the transaction in progress: its connection, the ledger's newest row in it, and
    #: the connection rows it wrote
    _conn: sqlite3.Connection | None = field(default=None, repr=False)
    _tip: tuple[int, str] | None = None
    _written: set[str] = field(default_factory=set)

    def check(self, conn: sqlite3.Connection) -> None:
        """Inside the writer's transaction, before its first row; begins the scope."""
        tip = head(conn)
        if tip != self._left:
            self._connections.clear()  # the ledger is not as this daemon left it: read them again
        self._left = tip
        self._conn, self._tip, self._written = conn, tip, set()
        _scope.anchor = self
        if self.head is None or self.lost or tip == self.head:
            return
        n, want = self.head
        row = conn.execute("SELECT hash FROM memoryd_ledger WHERE n = ?", (n,)).fetchone()
        if row is None or row[0] != want:
            self.lost = True
            log.error("ledger row %d, the last this daemon wrote, is %s outside memoryd; audit/verify reports it", n,
                      "missing: deleted" if row is None else "changed")

    def resume(self) -> None:
        """Make the scope this thread's again, once the event loop has turned inside the
        transaction (the writer's sliced flush): meanwhile another writer on this thread
        (a second store in the same event loop) may have begun and ended its own."""
        if self._conn is not None:
            _scope.anchor = self

    def mark(self) -> tuple[tuple[int, str] | None, set[str]]:
        """Before a savepoint: what ``undo`` puts back when it is rolled back."""
        return self._tip, set(self._written)

    def undo(self, mark: tuple[tuple[int, str] | None, set[str]]) -> None:
        self._tip, self._written = mark[0], set(mark[1])

    def leave(self) -> None:
        """End the scope (after a rollback: nothing of it is in the store)."""
        if getattr(_scope, "anchor", None) is self:
            _scope.anchor = None
        self._conn, self._written = None, set()

    def advance(self, conn: sqlite3.Connection) -> None:
        """After a commit; ends the scope. Never raises: the commit is done, and a head not
        moved only makes the next check look at an older row, which is still there."""
        if self._conn is conn:
            tip, written = self._tip, self._written
            self.leave()
            self._left = tip
            self._connections |= written
            if not self.lost:
                self.head = tip
            return
        self.leave()
        if self.lost:
            return
        try:
            self.head = head(conn)
        except sqlite3.Error as exc:
            log.error("could not read the ledger's head after a commit: %s", exc)


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

    def audit(self, conn: sqlite3.Connection, action: str, *, track: str | None, scope: str | None,
              entry_id: str | None, text: str | None, source: str | None, entry: Entry | None = None,
              ts: int | None = None, outcome: str | None = None) -> None:
        """One audit row and its ledger row. ``entry``: the entry as this row leaves it."""
        ts = ts if ts is not None else store.now_ms()
        outcome = outcome if outcome is not None else self.label
        seq = store.audit(conn, action, track=track, scope=scope, entry_id=entry_id, text=text, outcome=outcome,
                          source=source, session_id=self.session_id, ts=ts)
        ref = _ensure_connection(conn, self.origin)
        body = AuditBody(seq=seq, ts=ts, action=action, track=track, scope=scope, entry_id=entry_id, text=text,
                         outcome=outcome, source=source, session_id=self.session_id, connection=ref,
                         approval=self.approval, entry=None if entry is None else ledger_entry(entry))
        append(conn, "audit", body, audit_seq=seq, ts=ts)


def asked(conn: sqlite3.Connection, origin: LedgerConnection | None, payload: ApprovalAsked) -> None:
    ref = _ensure_connection(conn, origin)
    append(conn, "asked", AskedBody(connection=ref, asked=payload), ref=payload.id)


@dataclass(frozen=True)
class Decision:
    """How an asked approval ended, as the gate learned it."""

    approval: str
    outcome: str
    policy: str
    decided_by: LedgerConnection | None
    by: ApprovalBy | None

    def record(self, conn: sqlite3.Connection) -> None:
        ref = _ensure_connection(conn, self.decided_by)
        append(conn, "decided", DecidedBody(approval=self.approval, outcome=self.outcome, connection=ref,
                                            by=self.by, policy=self.policy), ref=self.approval)


def proposal(conn: sqlite3.Connection, origin: LedgerConnection | None, event: Literal["created", "dismissed",
             "approved"], p: Proposal, replaces: str | None = None) -> None:
    ref = _ensure_connection(conn, origin)
    append(conn, "proposal", ProposalBody(connection=ref, event=event, proposal=p, replaces=replaces), ref=p.id)


def failed(conn: sqlite3.Connection, stamp: Stamp, action: str, code: str, message: str,
           entry_id: str | None) -> None:
    ref = _ensure_connection(conn, stamp.origin)
    append(conn, "failed", FailedBody(approval=stamp.approval, action=action, connection=ref, code=code,
                                      message=message, entry_id=entry_id), ref=stamp.approval)
