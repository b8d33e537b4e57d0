"""Changes another program made to the store: found, chained as a ``foreign`` row, and
enforced from (memoryd_protocol.ledger.ForeignBody has the row's format).

Another connection's commit moves SQLite's ``PRAGMA data_version`` on the writer's
connection, and the writer's own commits do not; so one pragma before each batch tells
whether anybody else wrote, and ``schema_version`` whether the schema changed (``Watch``).
Only then does :func:`reconcile` read the store whole: it replays this daemon's chain,
compares the entries, proposals, audit rows, usage counters and text index with what it
finds, and records the difference. No batch commits over a change it did not compare: one
whose check cannot run, or that finds a schema change nobody accepted, runs nothing of its
own. Start-up runs the same comparison when the cheap checks disagree (:func:`open_chain`),
and otherwise leaves it to the first batch, unless the file is as memoryd's clean stop left it.

A dsh-memento process writing the store in place is the legitimate case: its entries stay
as it wrote them, readable and counted against the budgets, and the ledger says they came
from outside memoryd, never through its gate.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

import anyio
import msgspec
from memoryd_protocol import ledger as fmt
from memoryd_protocol import text_index
from memoryd_protocol.audit_types import WitnessedHead
from memoryd_protocol.constants import GRID
from memoryd_protocol.errors import StoreCorrupt
from memoryd_protocol.ledger_check import replay
from memoryd_protocol.text import utf16_len

from . import ledger, queries, schema, store, storefile
from .atomic import atomic
from .tx import Tx, Usage

T = TypeVar("T")

log = logging.getLogger("memoryd.foreign")

_SELECT_OWN = f"SELECT {fmt.LEDGER_COLUMNS} FROM memoryd_ledger WHERE n <= ? ORDER BY n"
_SELECT_AUDIT_AFTER = ("SELECT seq, ts, action, track, scope, entry_id, text, outcome, source, session_id "
                       "FROM audit WHERE seq > ? ORDER BY seq")


def _data_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA data_version").fetchone()[0])


def _versions(conn: sqlite3.Connection) -> tuple[int, int]:
    """data_version, and schema_version: it moves with every change of the schema."""
    return _data_version(conn), int(conn.execute("PRAGMA schema_version").fetchone()[0])


#: what Watch.guard returns: the data_version accounted for, and the error that refuses the batch
Guarded = tuple[int | None, StoreCorrupt | None]


#: A reconcile reads the whole store; after one, the next waits this many times as long as
#: it took (unless ``audit/verify`` asks), so that a program committing without pause costs
#: the writer a tenth of its time at most. A batch that finds another program's commit
#: meanwhile waits for it: what it would commit over must be compared first.
SPACING = 10


class Acceptance(Generic[T]):
    """A writer job that accepts a change made outside memoryd: it runs while a schema change
    nobody accepted stops every other write, since accepting it is how writes resume."""

    def __init__(self, fn: Callable[[Tx], T]) -> None:
        self.fn = fn

    def __call__(self, tx: Tx) -> T:
        return self.fn(tx)


class SchemaChanged(StoreCorrupt):
    """What every write fails with while the schema has a change nobody accepted."""


def runs(job: object, refused: StoreCorrupt | None) -> bool:
    """Whether a job of a batch that Watch.guard ``refused`` runs: only an acceptance, and
    only of a schema change (a check that cannot run lets nothing through)."""
    return refused is None or (isinstance(refused, SchemaChanged) and isinstance(job, Acceptance))


@dataclass
class Watch:
    """The writer connection's data_version as of the last time the store was as memoryd
    left it, and its schema_version as of the last time the schema was memoryd's (or
    accepted): a batch that finds other values checks before anything of it runs."""

    version: int
    #: the store, named in the errors of the writes refused
    path: Path
    #: no reconcile before this (time.monotonic), unless ``force``
    not_before: float = 0.0
    #: set by audit/verify: the next batch reconciles whenever it is
    force: bool = False
    #: set by audit/verify: the next batch reads the whole text index too (text_index.agrees)
    index: bool = False
    #: the last check could not run: the next batch checks, whatever data_version says
    owed: bool = False
    #: None until the first batch looked, and while a schema change stops writes
    schema: int | None = None
    #: set when audit/verify looks: a batch waiting in :meth:`due` begins at once
    _look: anyio.Event | None = None

    @classmethod
    def of(cls, conn: sqlite3.Connection, path: Path, *, owed: bool = False) -> Watch:
        now, schema_now = _versions(conn)
        try:
            known = not schema.changes(conn)
        except sqlite3.Error:
            known = False  # the first batch looks again, and says why it cannot
        return cls(now, path, owed=owed, schema=schema_now if known else None)

    async def due(self, run: Callable[[Callable[[sqlite3.Connection], int]], Awaitable[int]]) -> bool:
        """Before a batch, on the event loop: when another program wrote since the last
        reconcile and the next one is not due yet, wait until it is (or until audit/verify
        looks); the replay is spaced, a commit over an unchecked change is not. Returns
        whether the batch reads the whole text index too (``look``); ``run`` runs a call on
        the writer's thread."""
        wait = self.not_before - time.monotonic()
        if wait > 0 and not self.force and (self.owed or await run(_data_version) != self.version):
            self._look = anyio.Event()
            with anyio.move_on_after(wait):
                await self._look.wait()
        index, self.force, self.index = self.index, False, False
        return index

    def look(self, index: bool = False) -> None:
        """The next batch reconciles whenever it is, and one waiting for that begins now;
        ``index``: it checks the text index against the entries even if nothing moved."""
        self.force, self.index = True, self.index or index
        if self._look is not None:
            self._look.set()

    def guard(self, tx: Tx, head_n: int, index: bool) -> Guarded:
        """Inside the batch's transaction, on the writer's thread, before anything of the
        batch runs: when another program wrote (or the schema moved), reconcile. Returns
        the data_version the store is accounted for up to once the batch commits (None:
        nothing new), and the error every job of the batch fails with instead of running
        (None: they run). Nothing moved: two pragmas."""
        now, schema_now = _versions(tx.conn)
        if now == self.version and schema_now == self.schema and not self.owed and not index:
            return None, None
        return self._guard(tx, head_n, now, schema_now, index)

    def _guard(self, tx: Tx, head_n: int, now: int, schema_now: int, index: bool) -> Guarded:
        conn = tx.conn
        try:
            unknown = schema.unaccepted(conn) if schema_now != self.schema else []
            looked = True
            stale = (now != self.version or self.owed or any(n is None for _, n in unknown)
                     or (index and not text_index.agrees(conn.execute, sqlite3.DatabaseError)))
        except sqlite3.Error as exc:
            if store.fault_reason(exc) is not None:
                raise
            unknown, looked, stale = [], False, True  # the check below says why it cannot run
        moved = None
        if stale:
            started = time.monotonic()
            why = check(tx, head_n, new_schema=[item for item, n in unknown if n is None])
            self.not_before = time.monotonic() + SPACING * (time.monotonic() - started)
            self.owed = why is not None
            if why is not None:
                return None, StoreCorrupt(f"nothing was written: memoryd cannot check the store for changes another "
                                          f"program made ({why}); undo that change (audit verify names what is "
                                          "wrong), then write again", {"path": str(self.path)})
            moved = now
        if unknown:
            rows = [n for _, n in unknown if n is not None]
            recorded = min(rows) if rows else tx.tip[0] if tx.tip else 0
            names = ", ".join(schema.named(item) for item, _ in unknown)
            return moved, SchemaChanged(f"nothing was written: another program changed the store's schema ({names}); "
                                        f"remove it, or accept it with memoryctl audit accept {recorded}",
                                        {"path": str(self.path)})
        if looked:
            self.schema = schema_now
        return moved, None

    def reconciled(self, version: int | None) -> None:
        """The batch has committed: the store is accounted for up to ``version`` (None: as before)."""
        if version is not None:
            self.version = version


#: Each cell's entries and characters, counted by SQLite itself: every start recounts them,
#: and Python reading every text of a large store would take several times as long.
#: ``length`` counts code points up to the first NUL, where UTF-16 counts a character above
#: U+FFFF twice: the texts that are not plain ASCII (their UTF-8 is longer than ``length``)
#: are counted again in Python (:data:`_SELECT_ODD`).
_SELECT_COUNTS = "SELECT track, scope, count(*), total(length(text)) FROM entries GROUP BY track, scope"
_SELECT_ODD = "SELECT track, scope, text FROM entries WHERE length(CAST(text AS BLOB)) != length(text)"


def _counted(conn: sqlite3.Connection) -> dict[tuple[str, str], list[int]]:
    """Each cell's [entries, UTF-16 units]: what memoryd_usage must hold (fmt.cell_usage's)."""
    counted = {(str(t), str(s)): [int(n), int(units)] for t, s, n, units in conn.execute(_SELECT_COUNTS)}
    for t, s, text in conn.execute(_SELECT_ODD):
        text = str(text)
        counted[(str(t), str(s))][1] += utf16_len(text) - len(text.split("\0", 1)[0])
    return counted


def _stored(conn: sqlite3.Connection) -> dict[tuple[str, str], list[int]]:
    if not conn.execute(fmt.SELECT_USAGE_TABLE).fetchone():
        return {}  # dropped by another program: every cell differs, and recount makes it again
    return {(str(t), str(s)): [int(n), int(u)] for t, s, n, u in conn.execute(fmt.SELECT_USAGE)}


def _usage_changes(conn: sqlite3.Connection) -> dict[str, list[int]]:
    counted, stored = _counted(conn), _stored(conn)
    return {f"{t}/{s}": [*stored.get((t, s), [0, 0]), *counted.get((t, s), [0, 0])]
            for t, s in sorted(counted.keys() | stored.keys())
            if counted.get((t, s), [0, 0]) != stored.get((t, s), [0, 0])}


def recount(tx: Tx) -> None:
    """memoryd_usage (what the budgets are enforced against) from the entries themselves."""
    conn = tx.conn
    counted = _counted(conn)
    conn.execute(storefile.USAGE_TABLE)
    conn.execute("DELETE FROM memoryd_usage")
    conn.executemany("INSERT INTO memoryd_usage (track, scope, entries, used) VALUES (?, ?, ?, ?)",
                     [(t, s, n, u) for (t, s), (n, u) in counted.items()])
    tx.usage = {cell: counted.get(cell, [0, 0])[1] for cell in GRID}
    tx.entries = sum(n for n, _ in counted.values())


def _covered_audit(rows: list[fmt.LedgerRow]) -> int:
    """The highest audit seq the chain (up to this daemon's head) accounts for: the start's
    earlier rows, and the rows it chains (a foreign row's audit_seq is the newest of the
    audit rows it names)."""
    covered = max((r.audit_seq for r in rows if r.audit_seq is not None), default=0)
    if rows and rows[0].kind == "start":
        start = fmt.decode(rows[0])
        if isinstance(start, fmt.StartBody):
            covered = max(covered, start.after_audit_seq)
    return covered


def reconcile(tx: Tx, head_n: int, cause: str, new_schema: Sequence[str] = ()) -> fmt.ForeignBody | None:
    """Compare the store with this daemon's chain up to row ``head_n`` (its newest) and,
    when another program changed it, append the ``foreign`` row, log one WARNING, count the
    usage again and rebuild the text index. ``new_schema``: the schema items
    (schema.changes) no foreign row names yet. Runs in the caller's transaction."""
    conn = tx.conn
    own = fmt.rows_from(conn.execute(_SELECT_OWN, (head_n,)))
    extra = [int(n) for (n,) in conn.execute("SELECT n FROM memoryd_ledger WHERE n > ? ORDER BY n", (head_n,))]
    state = replay(own)
    audit = fmt.audit_from(conn.execute(_SELECT_AUDIT_AFTER, (_covered_audit(own),)))
    live = {e.id: e for e in fmt.entries_from(conn.execute(fmt.SELECT_ENTRIES))}
    offered = {p.id: p for p in fmt.proposals_from(conn.execute(fmt.SELECT_PROPOSALS))}
    changed = [e for eid, e in live.items() if state.entries.get(eid) != e]
    removed = sorted(eid for eid in state.entries if eid not in live)
    proposals = [p for pid, p in offered.items() if state.proposals.get(pid) != p]
    dropped = sorted(pid for pid in state.proposals if pid not in offered)
    usage = _usage_changes(conn)
    # A changed or deleted entry rebuilds the index anyway, as do counts that no longer
    # match the entries (an entry changed with the ledger rewritten to match); otherwise
    # rows deleted from the index (or planted in it) would hide an entry from every query,
    # or show one that is gone.
    hidden = not (changed or removed or usage) and not text_index.agrees(conn.execute, sqlite3.DatabaseError)
    if not (extra or audit or changed or removed or proposals or dropped or usage or new_schema or hidden):
        return None
    parts = []
    if new_schema:
        parts.append("the schema changed: " + ", ".join(
            n if n.endswith(" changed") else f"{n} added" for n in map(schema.named, new_schema)))
    if extra:
        parts.append(f"ledger rows {extra[0]}–{extra[-1]} appended" if len(extra) > 1
                     else f"ledger row {extra[0]} appended")
    if audit:
        seqs = f"{audit[0].seq}–{audit[-1].seq}" if len(audit) > 1 else f"{audit[0].seq}"
        parts.append(f"{len(audit)} audit rows written (seq {seqs})")
    added = [e.id for e in changed if e.id not in state.entries]
    edited = [e.id for e in changed if e.id in state.entries]
    for ids, what in ((added, "added"), (edited, "changed"), (removed, "deleted")):
        if ids:
            parts.append(f"{len(ids)} entries {what} ({', '.join(ids[:3])}{', …' if len(ids) > 3 else ''})")
    if proposals:
        parts.append(f"{len(proposals)} proposals written ({', '.join(p.id for p in proposals[:3])})")
    if dropped:
        parts.append(f"{len(dropped)} proposals deleted ({', '.join(dropped[:3])})")
    for cell, (n, used, counted_n, counted) in usage.items():
        parts.append(f"memoryd_usage said {cell} holds {n} entries of {used} characters, and they are "
                     f"{counted_n} of {counted}")
    if hidden:
        parts.append("the text index did not agree with the entries (a query would miss some), rebuilt")
    note = "; ".join(parts) + f" ({cause})"
    body = fmt.ForeignBody(note=note, ledger_rows=extra, audit_seqs=[a.seq for a in audit],
                           audit=fmt.audit_digest(audit) if audit else None, before=state.digest(),
                           after=fmt.state_digest(live.values(), offered.values()), entries=changed, removed=removed,
                           proposals=proposals, removed_proposals=dropped, usage=usage, schema=list(new_schema))
    # audit_seq: the newest audit row it accounts for, so that store.trusted counts it
    # chained (unless a row appended by the other program already names that row)
    newest = audit[-1].seq if audit else None
    if newest is not None and conn.execute("SELECT 1 FROM memoryd_ledger WHERE audit_seq = ?", (newest,)).fetchone():
        newest = None
    ledger.append(tx, "foreign", body, ref=schema.REF if new_schema else None, audit_seq=newest)
    # The next audit row's seq must be one no ledger row claims (another program's row may
    # claim one not written yet): the audit table's counter moves past them all.
    conn.execute("UPDATE sqlite_sequence SET seq = (SELECT max(audit_seq) FROM memoryd_ledger) WHERE name = 'audit' "
                 "AND seq < (SELECT max(audit_seq) FROM memoryd_ledger)")
    recount(tx)
    if changed or removed or usage or hidden:
        # its text may be anywhere in the index, or in none: index every entry again
        conn.execute("INSERT INTO memoryd_fts (memoryd_fts) VALUES ('rebuild')")
    n = tx.tip[0] if tx.tip else 0
    log.warning("another program changed the store: %s; ledger row %d records it, and audit verify reports it "
                "until memoryctl audit accept %d", note, n, n)
    return body


#: Python's sqlite3 names a row that is not UTF-8 with its text, which may be memory text
_UNDECODABLE = "Could not decode to UTF-8 column "


def unreadable(exc: Exception) -> str:
    """Why a check could not run, safe for the log, the client and the ledger: SQLite's
    own words (they name tables and columns), never a stored text."""
    if isinstance(exc, sqlite3.Error):
        message = str(exc)
        if message.startswith(_UNDECODABLE):
            return message.split(" with text ", 1)[0] + " (a stored text is not valid UTF-8)"
        return message or type(exc).__name__
    if isinstance(exc, msgspec.MsgspecError):
        return str(exc)  # where a body stops decoding, by position and path, never the value
    return f"{type(exc).__name__} while replaying the ledger"


def check(tx: Tx, head_n: int, cause: str = "while memoryd ran", new_schema: Sequence[str] = ()) -> str | None:
    """:func:`reconcile` in a savepoint of its own: None when the store is accounted for,
    else why it could not be (logged), and nothing of the check stays. The caller writes
    nothing then (a store changed past what replay can read is still served, and audit
    verify names the break), except at start, which goes on and leaves the check owed."""
    saved = tx.save()
    try:
        with atomic(tx.conn, "outside"):
            reconcile(tx, head_n, cause, new_schema)
    except Exception as exc:
        if isinstance(exc, sqlite3.Error) and store.fault_reason(exc) is not None:
            raise  # the store cannot take writes now: the batch fails as any batch would
        tx.restore(saved)
        why = unreadable(exc)
        log.debug("the check failed with: %r", exc)
        log.error("memoryd cannot check the store for changes another program made (%s): it writes nothing until it "
                  "can; audit verify names what is wrong", why, exc_info=not isinstance(exc, sqlite3.Error))
        return why
    return None


def _index_counted(conn: sqlite3.Connection) -> bool:
    """The text index counts as many rows as it must hold (text_index.indexed_rows): the
    whole index is read only when the count says it was changed, or audit verify asks."""
    averages, entries = conn.execute(text_index.SELECT_COUNTS).fetchone()
    return text_index.indexed_rows(averages) == int(entries)


def open_chain(conn: sqlite3.Connection, stop: WitnessedHead | None = None, *, untouched: bool = False) -> bool:
    """At start-up, on the writer's connection: begin the chain if the store has none, and
    reconcile whatever another program changed since memoryd's last run. ``stop``: the head
    the heads file recorded at the last clean stop (rows after it are not memoryd's);
    ``untouched``: the store file is as that stop left it, so nothing needs counting again.
    False when the store was not compared whole (the check could not run, or only the cheap
    checks did): the writer's first batch owes the comparison."""
    with ledger.transaction(conn) as tx:
        if ledger.ensure_start(tx):
            recount(tx)  # a store new to memoryd: its counts begin here, silently
            return True
        tip = tx.tip[0] if tx.tip else 0
        since = tip
        if stop is not None and stop.event != "stop" and stop.n < tip:
            # killed, or stopped without witnessing: its last rows and another program's
            # look alike, and only the log can say that nothing vouches for them
            log.warning("memoryd did not stop cleanly: ledger rows %d–%d came after the last head witnessed outside "
                        "the store (row %d), and nothing there vouches for who wrote them; memoryctl audit explain "
                        "shows what they claim", stop.n + 1, tip, stop.n)
        if stop is not None and stop.event == "stop":
            row = conn.execute("SELECT hash FROM memoryd_ledger WHERE n = ?", (stop.n,)).fetchone()
            if row is None or row[0] != stop.hash:
                log.error("ledger row %d, the head the heads file witnessed at memoryd's last stop, is %s: the ledger "
                          "was %s while memoryd was stopped; audit verify --heads reports it", stop.n,
                          *(("missing", "truncated") if row is None else ("changed", "rewritten")))
                untouched = False
            elif stop.n < tip:
                since = stop.n
        if untouched and since == tip and store.trusted(conn):
            return True  # the file is as memoryd's last stop left it: its counts are memoryd's own
        if since == tip and store.trusted(conn) and not _usage_changes(conn) and _index_counted(conn):
            # The cheap checks agree, but an entry edited in place (moved to another layer,
            # given another source) leaves them so: the first batch compares the store whole
            # before it commits, or a write over that entry would chain it as memoryd's own.
            return False
        return check(tx, since, "while memoryd was stopped") is None


@dataclass
class Opened:
    """The store as a start leaves it, read in the transaction of its check: another
    program's commit after it is one the writer's first batch compares, never one taken
    for the store the check saw."""

    usage: Usage
    head: tuple[int, str] | None
    entries: int
    watch: Watch


def opened(conn: sqlite3.Connection, path: Path, stop: WitnessedHead | None = None, *,
           untouched: bool = False) -> Opened:
    """:func:`open_chain`, then the usage, the ledger's head and the Watch of ``path``, all
    in one transaction holding the write lock: nothing commits between the check and them."""
    with atomic(conn, "opened"):
        checked = open_chain(conn, stop, untouched=untouched)
        return Opened(store.stored_usage(conn), ledger.head(conn), queries.entry_count(conn),
                      Watch.of(conn, path, owed=not checked))
