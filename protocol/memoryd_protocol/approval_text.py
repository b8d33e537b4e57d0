"""The text a human approves: the approval request, and the escaping that keeps what a
terminal (or an MCP host's dialog) shows equal to what is stored.

Memory text comes from models and other tools, so everything shown goes through
:func:`visible`: control characters and bidi overrides are shown as escapes, never
interpreted. ``memoryctl``'s prompt and the daemon's MCP elicitation both show
:func:`approval_request`, so a human approves the same text on either. Pure: no I/O.
"""

from __future__ import annotations

import shutil
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import msgspec

from . import types as T
from .constants import CONSOLIDATE_EXCERPT_UNITS, GRID
from .payloads import dropped_workspaces_note
from .text import utf16_len


def compact_json(value: Any) -> str:
    """``value`` as compact JSON, as msgspec writes it."""
    return msgspec.json.encode(value).decode()

# ASCII controls (newline and tab handled separately) and DEL, each to its escape: ASCII
# text, most of what is shown, takes one str.translate instead of a lookup per character.
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
    out = out.replace("\r", "\\r")
    if not newlines:
        out = out.replace("\n", "\\n").replace("\t", "\\t")
    return out


def one_line(text: str) -> str:
    return visible(text, newlines=False)


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], *, fit: bool = False,
          paint: Callable[[str, str], str] | None = None, dim: Iterable[int] = ()) -> str:
    """Columns padded to their widest cell; the last column is never padded and, with
    ``fit`` (stdout is a terminal), cut to the terminal width. With ``paint`` (a colour
    painter) the header is bold and the columns ``dim`` are dim, painted after padding and
    cutting, so the widths are the visible text's."""
    rows = [[one_line(str(c)) for c in r] for r in rows]
    if not rows:
        return ""
    widths = [len(h) for h in headers]
    for r in rows:
        for i, cell in enumerate(r[:-1]):
            widths[i] = max(widths[i], len(cell))
    starts = [sum(widths[:i]) + 2 * i for i in range(len(widths))]
    dimmed = frozenset(dim)
    width = 0
    if fit:
        width = shutil.get_terminal_size((100, 24)).columns

    def line(cells: Sequence[str], header: bool = False) -> str:
        head = "  ".join(c.ljust(widths[i]) for i, c in enumerate(cells[:-1]))
        out = f"{head}  {cells[-1]}" if head else cells[-1]
        if width and len(out) > width:
            out = out[: max(width - 1, 0)] + "…"
        out = out.rstrip()
        if paint is None:
            return out
        if header:
            return paint(out, "bold")
        pieces, at = [], 0
        for i in sorted(dimmed):
            if i >= len(cells) or starts[i] >= len(out):
                continue
            end = len(out) if i == len(cells) - 1 else min(starts[i] + len(cells[i]), len(out))
            pieces += [out[at:starts[i]], paint(out[starts[i]:end], "dim")]
            at = end
        return "".join([*pieces, out[at:]])

    return "\n".join([line(headers, header=True), *(line(r) for r in rows)])


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


def _marked(mark: str, text: str) -> list[str]:
    return [mark + line for line in visible(text).split("\n")]


def gutter_lines(text: str) -> list[str]:
    """A multi-line text, every line under the gutter. :func:`visible` leaves ``\n`` as the
    only line break (``\r``, ``\v``, ``\f``, ``\x85``, ``\u2028``, ``\u2029`` become
    escapes), so no line of the text can pass for a line of the prompt."""
    return _marked(GUTTER, text)


def key_text(value: str, empty: str) -> str:
    return one_line(value) if value else empty


def tags_text(tags: Sequence[str]) -> str:
    if not tags:
        return "-"
    if any("," in t for t in tags):
        return one_line(compact_json(list(tags)))
    return ", ".join(one_line(t) for t in tags)


def quoted(value: str, empty: str) -> str:
    """A key inside a one-line entry header: quoted, so it cannot run into the next field."""
    return one_line(compact_json(value)) if value else empty


def _origin_lines(origin: T.ApprovalOrigin | None) -> list[str]:
    if origin is None:
        return ["  client:  (unknown)"]
    if origin.name is None and origin.version is None:
        client = "(did not name itself)"
    else:
        client = " ".join(one_line(x) for x in (origin.name or "(no name)", origin.version) if x is not None)
    if origin.front_end == "mcp":
        client += " (an MCP host, through memoryd mcp)"
    lines = [f"  client:  {client}"]
    if origin.pid is not None:
        exe = f" ({one_line(origin.exe)})" if origin.exe is not None else ""
        lines.append(f"  process: pid {origin.pid}{exe}")
    return lines


def _summary(entries: Sequence[T.ApprovalEntry]) -> list[str]:
    """Count and size (UTF-16 units, as budgets count) per track/scope/workspaceKey/agentKey."""
    groups: dict[tuple[str, str, str, str], list[int]] = {}
    for e in entries:
        g = groups.setdefault((e.track, e.scope, e.workspace_key, e.agent_key), [0, 0])
        g[0] += 1
        g[1] += utf16_len(e.text)
    order: dict[tuple[str, str], int] = {cell: n for n, cell in enumerate(GRID)}
    rows = []
    for track, scope, wk, ak in sorted(groups, key=lambda k: (order.get((k[0], k[1]), len(order)), k)):
        count, chars = groups[(track, scope, wk, ak)]
        rows.append([f"{track}/{scope}", key_text(wk, "-"), key_text(ak, "(shared)"), str(count), str(chars)])
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
        lines.append(f"  [{n}] {e.track}/{e.scope}  workspace {quoted(e.workspace_key, '-')}  "
                     f"agent {quoted(e.agent_key, '(shared)')}  tags {tags_text(e.tags)}")
        lines += _marked(ADDED, e.text)
    rest = len(entries) - shown
    if rest > 0:
        lines.append(f"  … and {rest} more {'entry' if rest == 1 else 'entries'} (not shown)")
    return lines


#: The marks before each line of memory text: what the write adds, what it removes, and
#: text shown as it is (a payload whose parts cannot be told apart, a cut line's rest). No
#: other line of a prompt starts with one, so no memory text can pass for a prompt line.
ADDED, REMOVED = "  + ", "  - "
MARKS = (ADDED, REMOVED, GUTTER)
_STYLE = {ADDED: "green", REMOVED: "red", GUTTER: ""}


def _split_once(text: str, sep: str) -> tuple[str, str] | None:
    """``text`` split at ``sep`` when it starts at exactly one place, overlapping ones
    counted; else None (which occurrence is the format's own cannot be told)."""
    at = [i for i in range(len(text)) if text.startswith(sep, i)]
    return (text[:at[0]], text[at[0] + len(sep):]) if len(at) == 1 else None


def _excerpts(removed: str) -> list[str]:
    """A consolidate's removed part, each target's line ``remove: MATCH`` then its text:
    the payload format cuts each text at CONSOLIDATE_EXCERPT_UNITS with ``…``, which a
    text can hold too, so a target whose text may be cut says so in a line of its own."""
    lines = _marked(REMOVED, removed)
    out: list[str] = []
    for n, line in enumerate(lines):
        out.append(line)
        last = n + 1 == len(lines) or lines[n + 1].startswith(f"{REMOVED}remove: ")
        if last and line.endswith("…") and not line.startswith(f"{REMOVED}remove: "):
            out.append(f"{GUTTER}(may be cut at {CONSOLIDATE_EXCERPT_UNITS} characters, as the payload format "
                       "cuts each target: memoryctl query shows it whole)")
    return out


def _change(action: str, text: str) -> list[str]:
    """The change as marked lines, the written text first: a payload in payloads.py's
    format, split into its new and old texts where its separator occurs exactly once, and
    otherwise shown whole under the gutter."""
    if action == "add":
        return _marked(ADDED, text)
    if action == "remove":
        return _marked(REMOVED, text)
    if action == "replace" and text.startswith("from:\n"):
        split = _split_once(text.removeprefix("from:\n"), "\n\nto:\n")
        if split is not None:
            return [*_marked(ADDED, split[1]), *_marked(REMOVED, split[0])]
    if action == "consolidate":
        split = _split_once("\n" + text, "\nnew text: ")
        if split is not None:
            return [*_marked(ADDED, split[1]), *_excerpts(split[0].removeprefix("\n"))]
    return _marked(GUTTER, text)


def _where(asked: T.ApprovalAsked) -> str:
    """The layer, then whose it is, then the workspace, quoted and last: a key (a client
    names its own cwd) can push nothing it comes before off the line."""
    where = f"{one_line(asked.track)}/{one_line(asked.scope)}"
    if asked.agent_key is not None:
        where += f", only for agent {quoted(asked.agent_key, '')}" if asked.agent_key else ", shared by every agent"
    if asked.workspace_key:
        where += f", in workspace {quoted(asked.workspace_key, '')}"
    return where


def _headline(asked: T.ApprovalAsked) -> str:
    """Line 1: what is asked, and where it lands."""
    action = one_line(asked.action)
    if asked.entries is not None:
        layers = len({(e.track, e.scope, e.workspace_key, e.agent_key) for e in asked.entries})
        return f"{action} {len(asked.entries)} {'entry' if len(asked.entries) == 1 else 'entries'} into " \
               f"{layers} {'layer' if layers == 1 else 'layers'}:"
    if asked.action == "consolidate":
        count = f" {asked.count} entries" if asked.count is not None else ""
        return f"{action}{count} into one, in {_where(asked)}:"
    word = {"add": "to", "remove": "from"}.get(asked.action, "in")
    return f"{action} {word} {_where(asked)}:"


def _style(n: int, line: str) -> str:
    if n == 0:
        return "bold"
    return next((_STYLE[mark] for mark in MARKS if line.startswith(mark)), "")


def _painted(line: str, style: str, paint: Callable[[str, str], str]) -> str:
    """``line`` in ``style``; after a mark only the text is painted, not the mark."""
    if not style:
        return line
    mark = next((mark for mark in MARKS if line.startswith(mark)), "")
    return mark + paint(line[len(mark):], style)


def _source_line(asked: T.ApprovalAsked) -> str:
    """The write's source; for a batch, its entries' own, each with its count (the batch is
    recorded under their list, which says no count)."""
    counts: dict[str, int] = {}
    for e in asked.entries or ():
        if e.source:
            counts[e.source] = counts.get(e.source, 0) + 1
    if len(counts) < 2:
        return f"  source:  {one_line(next(iter(counts), asked.source))}"
    parts = []
    for source, n in counts.items():
        # a label with the list's own punctuation is quoted: it cannot pass for two sources
        label = quoted(source, "") if any(c in source for c in _LIST_PUNCTUATION) else one_line(source)
        parts.append(f"{label} ({n} {'entry' if n == 1 else 'entries'})")
    return "  sources: " + ", ".join(parts)


_LIST_PUNCTUATION = frozenset(',()"')


def approval_request(asked: T.ApprovalAsked, *, width: int | None = None, shown: int = SHOWN_ENTRIES,
                     paint: Callable[[str, str], str] | None = None) -> str:
    """The approval as the human sees it before answering. Line 1 says what is asked and
    where it lands; the change comes next, the text written first (a replace: the new text,
    then the old), each line marked ``+`` (added) or ``-`` (removed); then who asked. A host
    that shows only a dialog's first lines shows the change. A seed/import shows a summary
    per layer and its first ``shown`` entries, then the count of the rest. With ``width``
    (the terminal's columns) long lines are cut and continued under the gutter instead of
    wrapping. With ``paint`` (a colour painter) the headline is bold, what the write
    removes red and what it adds green."""
    lines = [_headline(asked)]
    if asked.entries is not None:
        lines += _summary(asked.entries)
        lines += _entry_lines(asked.entries, shown)
        if asked.workspace_keys_dropped:
            lines.append(f"  note:    {dropped_workspaces_note(asked.workspace_keys_dropped)}")
    else:
        lines += _change(asked.action, asked.text)
        if asked.tags is not None:
            lines.append(f"  tags:    {tags_text(asked.tags)}")
    lines += [
        _source_line(asked),
        f"  session: {one_line(asked.session_id or '-')}",
        *_origin_lines(asked.origin),
        f"  id:      {one_line(asked.id)}",
    ]
    styled = [(line, _style(n, line)) for n, line in enumerate(lines)]
    if width is not None and width > 0:
        styled = [(piece, style) for line, style in styled for piece in _fit(line, width)]
    if paint is None:
        return "\n".join(line for line, _ in styled)
    return "\n".join(_painted(line, style, paint) for line, style in styled)


__all__ = [
    "ADDED",
    "GUTTER",
    "MARKS",
    "REMOVED",
    "SHOWN_ENTRIES",
    "approval_request",
    "compact_json",
    "gutter_lines",
    "key_text",
    "one_line",
    "quoted",
    "table",
    "tags_text",
    "visible",
]
