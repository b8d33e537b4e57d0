"""Human-readable output for ``memoryctl``: tables, escaping, one-line summaries.

Memory text comes from models and other tools, so everything printed to a terminal goes
through :func:`visible`: control characters and bidi overrides are shown as escapes, never
interpreted by the terminal (what the human approves is what is stored).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Any

import msgspec
from memoryd_protocol import types as T
from memoryd_protocol.approval_text import (
    approval_request,
    compact_json,
    gutter_lines,
    one_line,
    quoted,
    table,
    tags_text,
    visible,
)
from memoryd_protocol.approval_types import ProcessFacts
from memoryd_protocol.constants import SHORT_ID_LENGTH
from memoryd_protocol.replication_types import ReplicationStatus

from . import colour

# The approval text and the escaping are the protocol package's: the daemon's MCP front-end
# shows the same text.


def to_json(value: Any) -> str:
    """The result as pretty JSON (Structs use their wire names)."""
    return msgspec.json.format(msgspec.json.encode(value), indent=2).decode()


def when(ms: int | None) -> str:
    if ms is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000))


#: How many characters of an id tables and one-line messages show: every id typed back
#: (--id, proposals approve/dismiss, audit explain) may be this prefix. --json, the
#: approval prompt and audit explain show ids in full.
SHORT_ID = SHORT_ID_LENGTH


def short(entry_id: str | None) -> str:
    return (entry_id or "-")[:SHORT_ID]


def stdout_paint() -> colour.Paint:
    """The painter for what memoryctl prints on stdout (its tables and results)."""
    return colour.painter(sys.stdout)


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, fit: bool = False, dim: Sequence[int] = ()) -> str:
    """:func:`table` for stdout: the header bold and the columns ``dim`` dim on a terminal."""
    return table(headers, rows, fit=fit, paint=stdout_paint(), dim=dim)


def entries_table(entries: Sequence[T.Entry], *, fit: bool = False) -> str:
    show_ws = any(e.workspace_key for e in entries)
    headers = ["ID", "TRACK", "SCOPE", "AGENT", *(["WORKSPACE"] if show_ws else []), "TAGS", "TEXT"]
    rows = [
        [
            short(e.id),
            e.track,
            e.scope,
            e.agent_key or "(shared)",
            *([e.workspace_key or "-"] if show_ws else []),
            ",".join(e.tags) or "-",
            e.text,
        ]
        for e in entries
    ]
    return _table(headers, rows, fit=fit, dim=(0,))


def entry_list(entries: Sequence[T.Entry], *, fit: bool = False) -> str:
    """``memoryctl list``."""
    return entries_table(entries, fit=fit) if entries else "no entries"


def query_result(r: T.QueryResult, *, fit: bool = False) -> str:
    """``memoryctl query``: the hits, then how many of how many."""
    if not r.entries:
        return "no matches"
    more = " (truncated; --limit N for more)" if r.truncated else ""
    return f"{entries_table(r.entries, fit=fit)}\n{len(r.entries)} of {r.total} matches{more}"


def budgets_table(rows: Sequence[T.BudgetRow]) -> str:
    def pct(r: T.BudgetRow) -> str:
        return f"{100 * r.used / r.limit:.0f}%" if r.limit else "-"

    return _table(
        ["TRACK", "SCOPE", "USED", "LIMIT", "FULL"],
        [[r.track, r.scope, str(r.used), str(r.limit), pct(r)] for r in rows],
    )


def audit_table(rows: Sequence[T.AuditRow], *, fit: bool = False) -> str:
    return _table(
        ["SEQ", "TIME", "ACTION", "LAYER", "ENTRY", "OUTCOME", "TEXT"],
        [
            [
                str(r.seq),
                when(r.ts),
                r.action,
                f"{r.track or '-'}/{r.scope or '-'}",
                short(r.entry_id),
                r.outcome or "-",
                r.text or "",
            ]
            for r in rows
        ],
        fit=fit,
        dim=(1, 4),
    )


def proposals_table(rows: Sequence[T.Proposal], *, fit: bool = False) -> str:
    return _table(
        ["ID", "STATUS", "KIND", "LAYER", "SESSION", "TEXT"],
        [[short(p.id), p.status, p.kind, f"{p.track}/{p.scope}", p.session_id or "-", p.text] for p in rows],
        fit=fit,
        dim=(0,),
    )


def adapters_table(rows: Sequence[T.AdapterInfo], *, fit: bool = False) -> str:
    return _table(
        ["ID", "VERSION", "IMPORTS", "EXPORT", "DESCRIPTION"],
        [[a.id, a.version, ",".join(a.import_formats), a.export_format, a.description or a.name] for a in rows],
        fit=fit,
    )


def usage(row: T.BudgetRow) -> str:
    return f"{row.track}/{row.scope} {row.used}/{row.limit} chars"


def status_lines(status: T.DaemonStatus, *, socket: str) -> str:
    """``memoryctl status``: ``socket`` is the path memoryctl connected to, shown when the
    daemon reports none of its own (a listener inherited from systemd)."""
    pairs = [
        ("socket", status.socket if status.socket is not None else f"{socket} (from systemd socket activation)"),
        ("pid", str(status.pid)),
        ("version", status.version),
        ("uptime", f"{status.uptime_s:.0f}s"),
        ("write policy", status.write_policy),
        ("store", status.store.path),
        ("store schema", str(status.store.schema_version)),
        ("config", status.config if status.config is not None else "none"),
        ("log", status.log if status.log is not None else "stderr"),
        ("connections", str(status.connections)),
        ("pending approvals", str(status.pending_approvals)),
        ("queue depth", str(status.queue_depth)),
        *_replication_pairs(status.replication),
    ]
    text = _aligned(pairs)
    if status.connection_list:
        text += "\n\n" + connections_table(status.connection_list)
    return text


def _replication_pairs(r: ReplicationStatus | None) -> list[tuple[str, str]]:
    if r is None:
        return []
    if r.lag_rows is None or r.lag_s is None:
        lag = "not read yet"
    else:
        lag = f"{r.lag_rows} rows, {r.lag_s:g} s (replica at row {r.replica_n or 0}, head {r.head_n or 0})"
    pairs = [("replica", r.url), ("replication", r.state + (f": {r.error}" if r.error else "")), ("replica lag", lag)]
    if r.restarts:
        pairs.append(("replica restarts", str(r.restarts)))
    return pairs


def replication_lines(r: ReplicationStatus | None) -> str:
    """``memoryctl replicate status``."""
    if r is None:
        return "replication: not configured (add a [replicate] section to the daemon's config)"
    return _aligned(_replication_pairs(r))


def _aligned(pairs: Sequence[tuple[str, str]]) -> str:
    """One line a pair, its values in one column."""
    width = max(len(k) for k, _ in pairs)
    return "\n".join(f"{k.ljust(width)}  {one_line(v)}" for k, v in pairs)


def _client(c: T.ConnectionInfo) -> str:
    if c.client is None or c.client.name is None:
        return "-"
    return c.client.name if c.client.version is None else f"{c.client.name} {c.client.version}"


def connections_table(rows: Sequence[T.ConnectionInfo]) -> str:
    """The live connections: the kernel's view of each peer (pid, uid, executable) beside
    the name it gave itself in ``initialize``."""
    return _table(
        ["CONN", "TRANSPORT", "PID", "UID", "CLIENT", "APPROVER", "OPENED", "EXE"],
        [[str(c.id), c.transport, "-" if c.pid is None else str(c.pid), "-" if c.uid is None else str(c.uid),
          _client(c), "yes" if c.approver else "no", when(c.opened_at), c.exe or "-"] for c in rows],
    )


def _problem_at(p: T.LedgerProblem) -> str:
    if p.n is not None and p.seq is not None:
        return f"row {p.n} (audit row {p.seq})"
    if p.n is not None:
        return f"row {p.n}"
    return f"audit row {p.seq}" if p.seq is not None else ""


def ledger_report(r: T.LedgerReport) -> str:
    """``memoryctl audit verify``: one line when the ledger holds (and the report's note);
    else the first break, then the other problems indented."""
    paint = stdout_paint()
    if r.ok:
        lines = [f"{paint('ledger ok', 'green')}: {r.rows} rows, {r.audit_rows} audit rows chained since audit row "
                 f"{r.after_audit_seq}; head {one_line(r.head) or '-'}"]
        if r.note:
            lines.append(one_line(r.note))
        return "\n".join(lines)
    first, *rest = r.problems or [T.LedgerProblem(reason="the report names no problem")]
    at = _problem_at(first)
    lines = [f"{paint('ledger BROKEN', 'red bold')}{f' at {at}' if at else ''}: {one_line(first.reason)}"]
    for p in rest:
        at = _problem_at(p)
        lines.append(f"  {f'{at}: ' if at else ''}{one_line(p.reason)}")
    return "\n".join(lines)


def _who(c: T.LedgerConnection | None) -> str:
    """A ledger connection: the name it gave itself, then the kernel's pid and executable."""
    if c is None:
        return "memoryd itself"
    if c.client is None or c.client.name is None:
        name = "an unnamed client"
    else:
        name = one_line(c.client.name if c.client.version is None else f"{c.client.name} {c.client.version}")
    if c.transport == "mcp":
        name += " through memoryd mcp"  # the name is the MCP host's clientInfo
    proc = ", ".join(x for x in (None if c.pid is None else f"pid {c.pid}",
                                 None if c.exe is None else one_line(c.exe)) if x)
    if c.harness is not None:  # the pid and exe are the relay's own
        proc += f"; memoryd's relay for harness pid {c.harness}, as the relay reports"
    return f"{name} ({proc})" if proc else name


def _claim(by: T.ApprovalBy | None) -> str:
    """A decider's ``by``, as what it is: its claim."""
    if by is None:
        return "claimed nothing"
    return f"claimed {one_line(by.kind)}" + (f" {quoted(by.name, '')}" if by.name else "")


def _decided_by(ev: T.LedgerEvent, d: T.LedgerDecision, by: T.LedgerConnection, f: ProcessFacts) -> str:
    """"approved by memoryctl pid 812 (/usr/bin/python3, tty pts/3), claimed human": the
    client's name (a claim), the kernel's facts of the deciding process, and its claim."""
    name = "an unnamed client" if by.client is None or by.client.name is None else one_line(by.client.name)
    if by.transport == "mcp":
        name += " through memoryd mcp"
    exe = "executable unreadable" if f.exe is None else one_line(f.exe)
    word = "approved" if d.outcome == "allowed-once" else f"decided {one_line(d.outcome or '-')}"
    same = ", the asking connection" if ev.asked_by is not None and by.ref == ev.asked_by.ref else ""
    return (f"{word} by {name} pid {f.pid} ({exe}, tty {one_line(f.tty) if f.tty else 'none'}){same}, "
            f"{_claim(d.by)}")


def _decision(ev: T.LedgerEvent) -> str:
    d = ev.decision
    if d is None:
        return ""
    if d.outcome is not None and d.decided_by is not None and d.decider is not None:
        text = _decided_by(ev, d, d.decided_by, d.decider)
        return text + (f"; its commit failed: {one_line(d.failed)}" if d.failed is not None else "")
    # A decision row without the decider's facts (an older memoryd's), or no decider at all.
    if d.outcome is None:
        text = f"approval {one_line(d.approval)} has no decision row"
    elif d.decided_by is None:
        text = f"{one_line(d.outcome)}, decided by no connection (timed out, disconnected or shut down)"
    else:
        same = ev.asked_by is not None and d.decided_by.ref == ev.asked_by.ref
        text = f"{one_line(d.outcome)} by {'the asking connection' if same else _who(d.decided_by)}"
    if d.by is not None:
        text += f", who claims {one_line(d.by.kind)}" + (f" {quoted(d.by.name, '')}" if d.by.name else "")
    if d.failed is not None:
        text += f"; its commit failed: {one_line(d.failed)}"
    return f"decided {text}"


def _event_line(ev: T.LedgerEvent) -> str:
    if ev.action == "present-at-start":
        parts = [when(ev.ts), "present-at-start", "in the store when the ledger's chain began"]
    elif ev.action.endswith("-outside-memoryd"):
        parts = [when(ev.ts), one_line(ev.action), f"by another program, never approved through memoryd (ledger row "
                                                   f"{ev.n} records it)"]
    else:
        parts = [when(ev.ts), one_line(ev.action), one_line(ev.outcome or "-"),
                 f"session {one_line(ev.session_id or '-')}", f"asked by {_who(ev.asked_by)}"]
        decided = _decision(ev)
        if decided:
            parts.append(decided)
    if ev.text is not None:
        parts.append(f"text {one_line(compact_json(ev.text))}")
    return "  ".join(parts)


def entry_life(life: T.EntryLife) -> str:
    """``memoryctl audit explain``: the entry as it is now (or that it was removed), one
    line per ledger event, oldest first, and the sessions whose snapshots showed it."""
    lines = [stdout_paint()(f"entry {one_line(life.entry_id)}", "bold")]
    e = life.current
    if e is None:
        lines.append("  now:     removed (no longer in the store)")
    else:
        lines += [f"  now:     {one_line(e.track)}/{one_line(e.scope)}  workspace {quoted(e.workspace_key, '-')}  "
                  f"agent {quoted(e.agent_key, '(shared)')}  tags {tags_text(e.tags)}  source {one_line(e.source)}  "
                  f"version {e.version}",
                  *gutter_lines(e.text)]
    lines.append(f"events ({len(life.events)}, oldest first):" if life.events else "events: none in the ledger")
    lines += [f"  {_event_line(ev)}" for ev in life.events]
    if life.snapshots:
        lines.append(f"in the snapshots of {len(life.snapshots)} "
                     f"{'session' if len(life.snapshots) == 1 else 'sessions'}: "
                     + ", ".join(one_line(s) for s in life.snapshots))
    else:
        lines.append("in no session's snapshot")
    return "\n".join(lines)


__all__ = [
    "SHORT_ID",
    "adapters_table",
    "approval_request",
    "audit_table",
    "budgets_table",
    "entries_table",
    "entry_life",
    "entry_list",
    "gutter_lines",
    "ledger_report",
    "one_line",
    "proposals_table",
    "query_result",
    "short",
    "status_lines",
    "stdout_paint",
    "to_json",
    "usage",
    "visible",
    "when",
]
