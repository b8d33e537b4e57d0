"""``memoryctl audit``: the ledger's rows, its verification (with witnessed heads), one
entry's life, the heads themselves, and accepting a change made outside memoryd."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Iterable
from pathlib import Path

import msgspec
from memoryd_protocol import types as T
from memoryd_protocol.audit_types import MAX_HEADS, WitnessedHead, parse_heads
from memoryd_protocol.constants import AUDIT_HARD_CAP
from memoryd_protocol.heads_file import HeadsFileRefused, read_heads_file
from memoryd_protocol.paths import heads_path_for
from memoryd_protocol.replica_chain import Head

from . import render
from .client import Client
from .prompt import Terminal
from .running import EXIT_OK, EXIT_PROTOCOL, EXIT_USAGE, FULL_ID_LENGTH, Ctx, UsageError, _error

#: every entry id the store's audit rows name (removed entries' too), for :func:`widen`
AUDITED_IDS = "SELECT DISTINCT entry_id FROM audit WHERE entry_id IS NOT NULL"
_ID_CHARACTERS = frozenset("0123456789abcdef-")


def id_prefix(target: str) -> bool:
    """Whether ``target`` may be an id as memoryctl's tables show it: a prefix of at least
    render.SHORT_ID characters of an id, short of a full one."""
    return render.SHORT_ID <= len(target) < FULL_ID_LENGTH and set(target) <= _ID_CHARACTERS


def widen(target: str, ids: Iterable[str]) -> str:
    """``audit explain``'s TEXT|ID: an :func:`id_prefix` is taken for the one id of ``ids`` it
    starts; anything else is left for the ledger to resolve (a full id, or a text)."""
    if not id_prefix(target):
        return target
    hits = {i for i in ids if i.startswith(target)}
    if len(hits) > 1:
        raise UsageError(f"{target} starts {len(hits)} entries' ids; give more of it (memoryctl list --json shows "
                         "them in full)")
    return hits.pop() if hits else target


def _ledger_report(ctx: Ctx, report: T.LedgerReport) -> int:
    ctx.result(report, lambda: render.ledger_report(report))
    return EXIT_OK if report.ok else EXIT_PROTOCOL


def _entry_life(ctx: Ctx, life: T.EntryLife) -> int:
    ctx.result(life, lambda: render.entry_life(life))
    return EXIT_OK


def _heads(ctx: Ctx, store: str, path: str | None) -> list[WitnessedHead]:
    """The heads ``path`` (default: the heads file the daemon keeps for ``store``) witnessed
    for ``store``."""
    file = Path(path) if path else heads_path_for(Path(store))
    if file is None:
        raise UsageError("this platform has no default heads file: name one with --heads FILE")
    try:
        # The daemon's own file only as the daemon opens it (a FIFO planted there would hang
        # this read); a FILE the user names is read as named: a copy, a link, <(ssh host ...).
        data = file.read_bytes() if path else read_heads_file(file)
    except HeadsFileRefused as exc:
        raise UsageError(str(exc)) from None
    except FileNotFoundError:
        if path:
            raise UsageError(f"--heads {path}: no such file") from None
        return []
    except OSError as exc:
        raise UsageError(f"{file}: {exc.strerror or exc}") from None
    return parse_heads(data, str(Path(store).resolve()))


def _show_heads(ctx: Ctx, store: str, path: str | None) -> int:
    """One JSON line per head, the heads file's own format: ``--heads`` reads a copy back;
    none, it says which file it read."""
    heads = _heads(ctx, store, path)
    ctx.result(heads, lambda: "\n".join(msgspec.json.encode(h).decode() for h in heads) if heads
               else f"no heads witnessed for {store} yet in {path or heads_path_for(Path(store))}")
    return EXIT_OK


def _pairs(heads: list[WitnessedHead]) -> list[tuple[int, str]]:
    """The distinct heads, newest last; beyond MAX_HEADS, the newest (a later head held as
    witnessed vouches for the chain up to it), saying so."""
    pairs = list(dict.fromkeys((h.n, h.hash) for h in heads))
    if len(pairs) > MAX_HEADS:
        print(f"memoryctl: checking the newest {MAX_HEADS} of {len(pairs)} witnessed heads", file=sys.stderr)
        pairs = pairs[-MAX_HEADS:]
    return pairs


def _witnessed(ctx: Ctx, store: str, path: str) -> list[tuple[int, str]]:
    """``verify --heads FILE``'s heads, saying how many it checks and which: a file that holds
    none of this store's (another store's, or an empty one) checks nothing, and says so."""
    pairs = _pairs(_heads(ctx, store, path))
    if not pairs:
        print(f"memoryctl: {path} holds no heads witnessed for {store}: no head was checked", file=sys.stderr)
        return pairs
    rows = [str(n) for n, _ in pairs]
    shown = ", ".join(rows) if len(rows) <= 6 else f"{', '.join(rows[:3])}, …, {', '.join(rows[-2:])}"
    many = "head" if len(pairs) == 1 else "heads"
    print(f"memoryctl: checking {len(pairs)} {many} witnessed for {store} in {path}: ledger rows {shown} "
          f"(newest: row {pairs[-1][0]}, hash {pairs[-1][1][:16]})", file=sys.stderr)
    return pairs


def _against(ctx: Ctx, witnessed: list[tuple[int, str]]) -> Head | None:
    """``verify --against URL``: the replica's newest row, added to ``witnessed``: the
    replica is a witness kept off this machine, so a truncation or a full rehash of the
    ledger (its heads file rewritten too) no longer checks out."""
    if not getattr(ctx.args, "against", None):
        return None
    from .replicas import against

    head = against(ctx, ctx.args.against)
    if head is not None:
        witnessed.append((head.n, head.hash))
    return head


def _behind(ctx: Ctx, report: T.LedgerReport, replica: Head | None) -> T.LedgerReport:
    if replica is not None:
        from .replicas import behind_hint

        behind_hint(report, ctx.args.against, replica)
    return report


async def _confirm(ctx: Ctx, n: int, problem: str) -> bool:
    """Show what is being accepted and ask; ``--yes`` accepts without asking."""
    print(f"ledger row {n}: {problem}", file=sys.stderr)
    if ctx.args.yes:
        return True
    term = Terminal.open()
    if term is None:
        raise UsageError("accepting a change needs a terminal to confirm it; pass --yes to accept without asking")
    try:
        term.flush_input()
        term.write("Accept this change as yours? [y/N] ")
        answer = await term.readline()
    finally:
        term.close()
    return (answer or "").strip().lower() in ("y", "yes")


async def cmd_audit(c: Client, ctx: Ctx) -> int:
    a = ctx.args
    if a.action in ("verify", "heads", "accept"):
        store = (await c.status()).store.path
    if a.action == "verify":
        witnessed = _witnessed(ctx, store, a.heads) if a.heads else []
        replica = _against(ctx, witnessed)
        report = await c.audit_verify(witnessed)
        return _ledger_report(ctx, _behind(ctx, report, replica))
    if a.action == "heads":
        return _show_heads(ctx, store, a.heads)
    if a.action == "accept":
        n = int(a.target)
        report = await c.audit_verify()
        problem = next((p.reason for p in report.problems if p.n == n and "memoryctl audit accept" in p.reason), None)
        if problem is None:
            _error(ctx, "INVALID_INPUT", f"ledger row {n} is no change waiting to be accepted: audit verify names "
                   "those that are", {"field": "n"})
            return EXIT_USAGE
        if not await _confirm(ctx, n, problem):
            print("not accepted", file=sys.stderr)
            return EXIT_PROTOCOL
        r = await c.audit_accept(n)
        ctx.result(r, lambda: f"accepted ledger row {n}: ledger row {r.n} records it")
        return EXIT_OK
    if a.action == "explain":
        target = a.target
        if id_prefix(target):  # a live entry's, else perhaps a removed one's
            ids = [e.id for e in await c.list()]
            if not any(i.startswith(target) for i in ids):
                ids = [r.entry_id for r in await c.audit_list(AUDIT_HARD_CAP) if r.entry_id]
            target = widen(target, ids)
        return _entry_life(ctx, await c.audit_explain(target))
    rows = await c.audit_list(a.limit)
    ctx.result(rows, lambda: render.audit_table(rows, fit=ctx.fit) if rows else "no audit rows")
    return EXIT_OK


def audit_offline(ctx: Ctx) -> int:
    """``audit verify|explain|heads --db PATH``: read the store itself, read-only, no daemon."""
    from memoryd_protocol.ledger import SELECT_ENTRIES, Fetch
    from memoryd_protocol.ledger_check import read_life, read_report, with_problems

    from . import offline

    a, db = ctx.args, ctx.data["db"]
    if a.action == "accept":
        raise UsageError("audit accept asks the daemon: run it without --db")
    if a.action == "heads":
        return _show_heads(ctx, db, a.heads)
    try:
        if a.action == "verify":
            witnessed = _witnessed(ctx, db, a.heads) if a.heads else []
            replica = _against(ctx, witnessed)
            report = offline.read(db, lambda fetch: read_report(fetch, None, witnessed))
            return _ledger_report(ctx, _behind(ctx, with_problems(report, offline.index_problems(db)), replica))
        target: str = a.target

        def life(fetch: Fetch) -> T.EntryLife:
            if not id_prefix(target):
                return read_life(fetch, target)
            ids = [str(row[0]) for row in (*fetch(SELECT_ENTRIES), *fetch(AUDITED_IDS))]
            return read_life(fetch, widen(target, ids))

        return _entry_life(ctx, offline.read(db, life))
    except offline.StoreHeld as exc:
        how = "run it without --db"
        if exc.socket is not None and Path(exc.socket) != Path(ctx.socket):
            how += f" and with --socket {shlex.quote(exc.socket)}"
        raise UsageError(f"{exc}: ask that daemon instead, {how}") from None
    except offline.OfflineError as exc:
        raise UsageError(str(exc)) from None
    except offline.NoLedger as exc:
        _error(ctx, "NO_LEDGER", f"{exc} ({db}); its chain begins when memoryd first opens it", {"path": db})
        return EXIT_PROTOCOL
