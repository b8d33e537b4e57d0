"""Human-readable output for ``memoryctl``: tables, escaping, one-line summaries.

Memory text comes from models and other tools, so everything printed to a terminal goes
through :func:`visible`: control characters and bidi overrides are shown as escapes, never
interpreted by the terminal (what the human approves is what is stored).
"""

from __future__ import annotations

import re
import shutil
import time
import unicodedata
from collections.abc import Iterable, Sequence
from typing import Any

import msgspec
from memoryd_protocol import types as T

# ASCII controls (newline and tab handled separately) and DEL: the fast path for ASCII text.
_UNSAFE_ASCII = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
# Everything a human cannot see or that re-orders what they see: controls, format
# characters (bidi overrides, zero-width and Unicode tag characters, which hide text from a
# person but not from a model), private-use, surrogates, unassigned code points, line and
# paragraph separators, and every space other than U+0020.
_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Co", "Cs", "Cn", "Zl", "Zp"})
_FILLERS = frozenset("\u115f\u1160\u3164\uffa0")  # Hangul fillers render as blanks


def _unsafe(ch: str) -> bool:
    if ch in "\n\t":
        return False
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
        out = _UNSAFE_ASCII.sub(lambda m: _escape_char(m.group()), text)
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
    width = shutil.get_terminal_size((100, 24)).columns if fit else 0

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
    return "\n".join(f"{k.ljust(width)}  {one_line(v)}" for k, v in pairs)


def approval_request(asked: T.ApprovalAsked) -> str:
    """The complete approval payload, as the human sees it before answering."""
    lines = [
        "memoryd asks to approve a write:",
        f"  action:  {one_line(asked.action)}" + (f" ({asked.count} entries)" if asked.count is not None else ""),
        f"  layer:   {one_line(asked.track)}/{one_line(asked.scope)}",
        f"  source:  {one_line(asked.source)}",
        f"  session: {one_line(asked.session_id or '-')}",
        f"  id:      {one_line(asked.id)}",
        "  payload:",
    ]
    lines += [f"  | {line}" for line in visible(asked.text).split("\n")]
    return "\n".join(lines)


__all__ = [
    "adapters_table",
    "approval_request",
    "audit_table",
    "budgets_table",
    "entries_table",
    "one_line",
    "proposals_table",
    "short",
    "status_lines",
    "table",
    "to_json",
    "usage",
    "visible",
    "when",
]
