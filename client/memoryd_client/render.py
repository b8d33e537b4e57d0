"""Human-readable output for ``memoryctl``: tables, escaping, one-line summaries.

Memory text comes from models and other tools, so everything printed to a terminal goes
through :func:`visible`: control characters and bidi overrides are shown as escapes, never
interpreted by the terminal (what the human approves is what is stored).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

from memoryd_protocol.constants import GRID

TYPE_CHECKING = False  # typing is not imported at run time: see memoryd_protocol.constants
if TYPE_CHECKING:
    from typing import Any

    from memoryd_protocol import types as T

# msgspec, the wire types, shutil and unicodedata (for text that is not ASCII) are imported
# where they are used, not here: the read commands' quick path (memoryd_client.quick)
# renders their tables without them.


def _json(value: Any) -> str:
    """``value`` as compact JSON, as msgspec writes it."""
    import msgspec

    return msgspec.json.encode(value).decode()

# ASCII controls (newline and tab handled separately) and DEL, each to its escape: the fast
# path for ASCII text (str.translate, not a regular expression: re was a twentieth of the
# read commands' start-up, and nothing else on their path imports it).
_UNSAFE_ASCII = {code: f"\\x{code:02x}" for code in (*range(0x00, 0x09), *range(0x0B, 0x20), 0x7F)}
# Everything a human cannot see or that re-orders what they see: controls, format
# characters (bidi overrides, zero-width and Unicode tag characters, which hide text from a
# person but not from a model), private-use, surrogates, unassigned code points, line and
# paragraph separators, and every space other than U+0020.
_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Co", "Cs", "Cn", "Zl", "Zp"})
_FILLERS = frozenset("\u115f\u1160\u3164\uffa0")  # Hangul fillers render as blanks


def _unsafe(ch: str) -> bool:
    if ch in "\n\t":
        return False
    import unicodedata

    cat = unicodedata.category(ch)
    if cat in _UNSAFE_CATEGORIES or (cat == "Zs" and ch != " ") or ch in _FILLERS:
        return True
    code = ord(ch)
    return 0xFE00 <= code <= 0xFE0F or 0xE0100 <= code <= 0xE01EF  # variation selectors


def _escape_char(ch: str) -> str:
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def visible(text: str, *, newlines: bool = True) -> str:
    """``text`` safe for a terminal: unsafe characters as ``\\xNN``/``\\uNNNN``/``\\UNNNNNNNN``;
    with ``newlines=False`` line breaks and tabs become ``\\n``/``\\t`` too (one table row)."""
    if text.isascii():
        out = text.translate(_UNSAFE_ASCII)
    else:
        out = "".join(_escape_char(ch) if _unsafe(ch) else ch for ch in text)
    if not newlines:
        out = out.replace("\r", "\\r").replace("\n", "\\n").replace("\t", "\\t")
    else:
        out = out.replace("\r", "\\r")
    return out


def one_line(text: str) -> str:
    return visible(text, newlines=False)


def to_json(value: Any) -> str:
    """The result as pretty JSON (Structs use their wire names)."""
    import msgspec

    return msgspec.json.format(msgspec.json.encode(value), indent=2).decode()


def when(ms: int | None) -> str:
    if ms is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000))


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], *, fit: bool = False) -> str:
    """Columns padded to their widest cell; the last column is never padded and, with
    ``fit`` (stdout is a terminal), cut to the terminal width."""
    rows = [[one_line(str(c)) for c in r] for r in rows]
    if not rows:
        return ""
    widths = [len(h) for h in headers]
    for r in rows:
        for i, cell in enumerate(r[:-1]):
            widths[i] = max(widths[i], len(cell))
    width = 0
    if fit:
        import shutil

        width = shutil.get_terminal_size((100, 24)).columns

    def line(cells: Sequence[str]) -> str:
        head = "  ".join(c.ljust(widths[i]) for i, c in enumerate(cells[:-1]))
        out = f"{head}  {cells[-1]}" if head else cells[-1]
        if width and len(out) > width:
            out = out[: max(width - 1, 0)] + "…"
        return out.rstrip()

    return "\n".join([line(headers), *(line(r) for r in rows)])


def short(entry_id: str | None) -> str:
    return (entry_id or "-")[:8]


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
    return table(headers, rows, fit=fit)


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

    return table(
        ["TRACK", "SCOPE", "USED", "LIMIT", "FULL"],
        [[r.track, r.scope, str(r.used), str(r.limit), pct(r)] for r in rows],
    )


def audit_table(rows: Sequence[T.AuditRow], *, fit: bool = False) -> str:
    return table(
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
    )


def proposals_table(rows: Sequence[T.Proposal], *, fit: bool = False) -> str:
    return table(
        ["ID", "STATUS", "KIND", "LAYER", "SESSION", "TEXT"],
        [[p.id, p.status, p.kind, f"{p.track}/{p.scope}", p.session_id or "-", p.text] for p in rows],
        fit=fit,
    )


def adapters_table(rows: Sequence[T.AdapterInfo], *, fit: bool = False) -> str:
    return table(
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
    ]
    width = max(len(k) for k, _ in pairs)
    text = "\n".join(f"{k.ljust(width)}  {one_line(v)}" for k, v in pairs)
    if status.connection_list:
        text += "\n\n" + connections_table(status.connection_list)
    return text


def _client(c: T.ConnectionInfo) -> str:
    if c.client is None or c.client.name is None:
        return "-"
    return c.client.name if c.client.version is None else f"{c.client.name} {c.client.version}"


def connections_table(rows: Sequence[T.ConnectionInfo]) -> str:
    """The live connections: the kernel's view of each peer (pid, uid, executable) beside
    the name it gave itself in ``initialize``."""
    return table(
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
    if r.ok:
        lines = [f"ledger ok: {r.rows} rows, {r.audit_rows} audit rows chained since audit row "
                 f"{r.after_audit_seq}; head {one_line(r.head) or '-'}"]
        if r.note:
            lines.append(one_line(r.note))
        return "\n".join(lines)
    from memoryd_protocol.types import LedgerProblem

    first, *rest = r.problems or [LedgerProblem(reason="the report names no problem")]
    at = _problem_at(first)
    lines = [f"ledger BROKEN{f' at {at}' if at else ''}: {one_line(first.reason)}"]
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
    proc = ", ".join(x for x in (None if c.pid is None else f"pid {c.pid}",
                                 None if c.exe is None else one_line(c.exe)) if x)
    return f"{name} ({proc})" if proc else name


def _decision(ev: T.LedgerEvent) -> str:
    d = ev.decision
    if d is None:
        return ""
    if d.outcome is None:
        text = f"approval {one_line(d.approval)} has no decision row"
    elif d.decided_by is None:
        text = f"{one_line(d.outcome)}, decided by no connection (timed out, disconnected or shut down)"
    else:
        same = ev.asked_by is not None and d.decided_by.ref == ev.asked_by.ref
        text = f"{one_line(d.outcome)} by {'the asking connection' if same else _who(d.decided_by)}"
    if d.by is not None:
        text += f", who claims {one_line(d.by.kind)}" + (f" {_quoted(d.by.name, '')}" if d.by.name else "")
    if d.failed is not None:
        text += f"; its commit failed: {one_line(d.failed)}"
    return f"decided {text}"


def _event_line(ev: T.LedgerEvent) -> str:
    if ev.action == "present-at-start":
        parts = [when(ev.ts), "present-at-start", "in the store when the ledger's chain began"]
    else:
        parts = [when(ev.ts), one_line(ev.action), one_line(ev.outcome or "-"),
                 f"session {one_line(ev.session_id or '-')}", f"asked by {_who(ev.asked_by)}"]
        decided = _decision(ev)
        if decided:
            parts.append(decided)
    if ev.text is not None:
        parts.append(f"text {one_line(_json(ev.text))}")
    return "  ".join(parts)


def entry_life(life: T.EntryLife) -> str:
    """``memoryctl audit explain``: the entry as it is now (or that it was removed), one
    line per ledger event, oldest first, and the sessions whose snapshots showed it."""
    lines = [f"entry {one_line(life.entry_id)}"]
    e = life.current
    if e is None:
        lines.append("  now:     removed (no longer in the store)")
    else:
        lines += [f"  now:     {one_line(e.track)}/{one_line(e.scope)}  workspace {_quoted(e.workspace_key, '-')}  "
                  f"agent {_quoted(e.agent_key, '(shared)')}  tags {_tags(e.tags)}  source {one_line(e.source)}  "
                  f"version {e.version}",
                  *_gutter(e.text)]
    lines.append(f"events ({len(life.events)}, oldest first):" if life.events else "events: none in the ledger")
    lines += [f"  {_event_line(ev)}" for ev in life.events]
    if life.snapshots:
        lines.append(f"in the snapshots of {len(life.snapshots)} "
                     f"{'session' if len(life.snapshots) == 1 else 'sessions'}: "
                     + ", ".join(one_line(s) for s in life.snapshots))
    else:
        lines.append("in no session's snapshot")
    return "\n".join(lines)


#: A seed/import approval lists this many entries, then says how many it leaves out.
SHOWN_ENTRIES = 20
#: Every line that does not fit is continued under this gutter: text after ``| `` is data.
GUTTER = "  | "


def _cells(ch: str) -> int:
    """Terminal cells ``ch`` may take, never fewer than it takes: wide and ambiguous-width
    characters count 2, a tab (only ever shown inside a gutter) its widest 8."""
    if ch == "\t":
        return 8
    if ch.isascii():
        return 1
    import unicodedata

    return 2 if unicodedata.east_asian_width(ch) in ("W", "F", "A") else 1


def _fit(line: str, width: int) -> list[str]:
    """``line`` cut so that no piece wraps on a terminal ``width`` cells wide; every piece
    after the first goes under the gutter (a soft wrap cannot start a line of its own)."""
    limit = max(width - 1, len(GUTTER) + 16)
    if line.isascii() and "\t" not in line and len(line) <= limit:
        return [line]
    pieces: list[str] = []
    current, used = "", 0
    for ch in line:
        n = _cells(ch)
        if used + n > limit:
            pieces.append(current)
            current, used = GUTTER, len(GUTTER)
        current += ch
        used += n
    pieces.append(current)
    return pieces


def _gutter(text: str) -> list[str]:
    """A multi-line text, every line under the gutter. :func:`visible` leaves ``\n`` as the
    only line break (``\r``, ``\v``, ``\f``, ``\x85``, ``\u2028``, ``\u2029`` become
    escapes), so no line of the text can pass for a line of the prompt."""
    return [GUTTER + line for line in visible(text).split("\n")]


def _key(value: str, empty: str) -> str:
    return one_line(value) if value else empty


def _tags(tags: Sequence[str]) -> str:
    if not tags:
        return "-"
    if any("," in t for t in tags):
        return one_line(_json(list(tags)))
    return ", ".join(one_line(t) for t in tags)


def _quoted(value: str, empty: str) -> str:
    """A key inside a one-line entry header: quoted, so it cannot run into the next field."""
    return one_line(_json(value)) if value else empty


def _origin_lines(origin: T.ApprovalOrigin | None) -> list[str]:
    if origin is None:
        return ["  client:  (unknown)"]
    if origin.name is None and origin.version is None:
        client = "(did not name itself)"
    else:
        client = " ".join(one_line(x) for x in (origin.name or "(no name)", origin.version) if x is not None)
    lines = [f"  client:  {client}"]
    if origin.pid is not None:
        exe = f" ({one_line(origin.exe)})" if origin.exe is not None else ""
        lines.append(f"  process: pid {origin.pid}{exe}")
    return lines


def _summary(entries: Sequence[T.ApprovalEntry]) -> list[str]:
    """Count and size (UTF-16 units, as budgets count) per track/scope/workspaceKey/agentKey."""
    from memoryd_protocol.text import utf16_len

    groups: dict[tuple[str, str, str, str], list[int]] = {}
    for e in entries:
        g = groups.setdefault((e.track, e.scope, e.workspace_key, e.agent_key), [0, 0])
        g[0] += 1
        g[1] += utf16_len(e.text)
    order: dict[tuple[str, str], int] = {cell: n for n, cell in enumerate(GRID)}
    rows = []
    for track, scope, wk, ak in sorted(groups, key=lambda k: (order.get((k[0], k[1]), len(order)), k)):
        count, chars = groups[(track, scope, wk, ak)]
        rows.append([f"{track}/{scope}", _key(wk, "-"), _key(ak, "(shared)"), str(count), str(chars)])
    total = sum(g[1] for g in groups.values())
    layers = "layer" if len(groups) == 1 else "layers"
    grid = table(["LAYER", "WORKSPACE", "AGENT", "ENTRIES", "CHARS"], rows)
    how_many = f"{len(entries)} {'entry' if len(entries) == 1 else 'entries'}"
    return [f"  summary: {how_many}, {total} chars, in {len(groups)} {layers}",
            *(f"    {line}" for line in grid.split("\n"))]


def _entry_lines(entries: Sequence[T.ApprovalEntry], shown: int) -> list[str]:
    head = f"  entries (first {shown} of {len(entries)}):" if len(entries) > shown else "  entries:"
    lines = [head]
    for n, e in enumerate(entries[:shown], 1):
        lines.append(f"  [{n}] {e.track}/{e.scope}  workspace {_quoted(e.workspace_key, '-')}  "
                     f"agent {_quoted(e.agent_key, '(shared)')}  tags {_tags(e.tags)}")
        lines += _gutter(e.text)
    rest = len(entries) - shown
    if rest > 0:
        lines.append(f"  … and {rest} more {'entry' if rest == 1 else 'entries'} (not shown)")
    return lines


def approval_request(asked: T.ApprovalAsked, *, width: int | None = None, shown: int = SHOWN_ENTRIES) -> str:
    """The approval as the human sees it before answering: what the write does, where it
    lands, who asked, and the complete change. A seed/import shows a summary per layer and
    its first ``shown`` entries, then the count of the rest. With ``width`` (the terminal's
    columns) long lines are cut and continued under the gutter instead of wrapping."""
    lines = [
        "memoryd asks to approve a write:",
        f"  action:  {one_line(asked.action)}" + (f" ({asked.count} entries)" if asked.count is not None else ""),
        f"  layer:   {one_line(asked.track)}/{one_line(asked.scope)}",
    ]
    if asked.workspace_key is not None:
        lines.append(f"           workspace: {_key(asked.workspace_key, '(none: every workspace)')}")
    if asked.agent_key is not None:
        lines.append(f"           agent:     {_key(asked.agent_key, '(shared: every agent)')}")
    if asked.tags is not None:
        lines.append(f"           tags:      {_tags(asked.tags)}")
    lines += [
        f"  source:  {one_line(asked.source)}",
        f"  session: {one_line(asked.session_id or '-')}",
        *_origin_lines(asked.origin),
        f"  id:      {one_line(asked.id)}",
    ]
    if asked.entries is not None:
        lines += _summary(asked.entries)
        lines += _entry_lines(asked.entries, shown)
    else:
        lines.append("  payload:")
        lines += _gutter(asked.text)
    if width is not None and width > 0:
        lines = [piece for line in lines for piece in _fit(line, width)]
    return "\n".join(lines)


__all__ = [
    "GUTTER",
    "SHOWN_ENTRIES",
    "adapters_table",
    "approval_request",
    "audit_table",
    "budgets_table",
    "entries_table",
    "entry_life",
    "entry_list",
    "ledger_report",
    "one_line",
    "proposals_table",
    "query_result",
    "short",
    "status_lines",
    "table",
    "to_json",
    "usage",
    "visible",
    "when",
]
