"""Markdown memory files: ``hermes-memory-md`` and ``claude-code-memory-md``.

Payload: the markdown text, either as a JSON string or as ``{"text": "..."}``. Line breaks
may be LF, CRLF or CR; a leading byte-order mark is ignored. Line numbers in errors are
1-based and count a CRLF as one line break.

Sections. A heading of *any* level (``#``, ``##``, ``###``, …; ``#`` followed by a space
or the end of the line, optional closing ``#``s) opens a section that lasts until the next
heading of the same or a higher level. (The reference provider only recognised ``## ``.)

* Placement: a heading that is exactly ``<track>/<scope>`` - ``user/user-global``,
  ``user/workspace``, ``agent/user-global``, ``agent/workspace``, the headings these
  adapters' own exports write - places the entries inside it (including those under its
  sub-headings) in that track/scope, so export → import round-trips. Outside such a
  section entries land in ``user/user-global`` for ``hermes-memory-md`` (a Hermes
  MEMORY.md is about the user) and in ``agent/user-global`` for ``claude-code-memory-md``
  (a CLAUDE.md holds environment facts and conventions). ``workspace`` entries carry no
  workspace key: the import pipeline files them under the importing session's workspace.
* Tags: the name of the innermost enclosing heading that is not a ``<track>/<scope>``
  heading becomes the entry's one tag (trimmed, whitespace collapsed, cut to the 32-unit
  tag limit with ``…`` rather than failing). Entries outside any named section get none.

Entries. ``source`` is the adapter id. Texts are trimmed.

* ``hermes-memory-md``: each ``- `` or ``* `` bullet is an entry. Any other non-blank line
  - prose, a numbered list, a code fence - is ``ADAPTER_PAYLOAD`` naming its line.
* ``claude-code-memory-md``: each bullet is an entry, and a line that directly follows a
  bullet continues it (markdown's lazy continuation: joined by one space). Every other run
  of non-blank lines (a paragraph, ended by a blank line, a heading or a bullet) is one
  entry, its lines trimmed and joined by one space. A fenced code block (``` or ~~~) is
  one entry kept verbatim, line breaks included, so a ``# comment`` inside it is never
  taken for a heading; a fence left open runs to the end of the file, as in CommonMark.
  A thematic break (``---``, ``***``, ``___``) separates like a blank line; a line that is
  also a bullet (``- - -``) stays a bullet, so every exported ``- <text>`` line round-trips.

Both refuse, naming the line: an empty bullet, and a line with a lone UTF-16 surrogate.

Export (both adapters, a markdown string): one ``## <track>/<scope>`` section per
non-empty cell in grid order (user/user-global, user/workspace, agent/user-global,
agent/workspace), each a list of ``- <text>`` bullets in the order given (the daemon passes
creation order); line breaks inside a text become spaces; sections are separated by a
blank line; the document ends with a newline and is ``""`` when there are no entries.
Workspace keys, agent keys, tags and sources are not written.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

from ..constants import GRID, Scope, Track
from ..text import has_lone_surrogate
from ..types import Entry, EntryInput
from .base import AdapterBase, fit_tag, flatten, json_type

MARKDOWN_FORMAT: Final = "text/markdown"

_HEADING = re.compile(r"[ \t]*(#+)(?:[ \t]+(.*))?")
_CLOSING_HASHES = re.compile(r"(?:^|[ \t]+)#+[ \t]*$")
_BULLET = re.compile(r"[ \t]*[-*](?:[ \t]+(.*))?")
_THEMATIC_BREAK = re.compile(r"[ \t]*([-*_])(?:[ \t]*\1){2,}[ \t]*")
_FENCE = re.compile(r"[ \t]*(`{3,}|~{3,})(.*)")
_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_GRID_HEADINGS: Final[dict[str, tuple[Track, Scope]]] = {f"{t}/{s}": (t, s) for t, s in GRID}


@dataclass(frozen=True, slots=True)
class _Heading:
    level: int
    name: str


@dataclass(slots=True)
class _Block:
    """An entry being assembled: its lines, how they are joined, where it lands."""

    parts: list[str]
    joiner: str
    track: Track
    scope: Scope
    tag: str | None


def _heading(line: str) -> _Heading | None:
    m = _HEADING.fullmatch(line)
    if m is None:
        return None
    name = _CLOSING_HASHES.sub("", m.group(2) or "").strip()
    return _Heading(len(m.group(1)), name)


def _bullet(line: str) -> str | None:
    """The bullet's text (possibly empty) or ``None`` when the line is no bullet."""
    m = _BULLET.fullmatch(line)
    if m is None:
        return None
    return (m.group(1) or "").strip()


class MarkdownAdapter(AdapterBase):
    """Shared parser and exporter; subclasses choose the default cell and prose handling."""

    default_track: Track
    default_scope: Scope
    allow_prose: bool

    def __init__(
        self,
        *,
        id: str,
        name: str,
        description: str,
        default_track: Track,
        default_scope: Scope,
        allow_prose: bool,
    ) -> None:
        super().__init__(
            id=id,
            name=name,
            description=description,
            version="1.0.0",
            import_formats=[MARKDOWN_FORMAT],
            export_format=MARKDOWN_FORMAT,
        )
        self.default_track = default_track
        self.default_scope = default_scope
        self.allow_prose = allow_prose

    # -- import ---------------------------------------------------------------------------

    def _text_of(self, payload: Any) -> str:
        if isinstance(payload, dict):
            if "text" not in payload:
                raise self.error("payload object needs a 'text' field with the markdown")
            payload = payload["text"]
        if not isinstance(payload, str):
            raise self.error(f"payload must be a markdown string or {{text: string}}, got {json_type(payload)}")
        return payload.removeprefix("\ufeff")

    def adapt(self, payload: Any) -> list[EntryInput]:
        lines = _LINE_BREAK.split(self._text_of(payload))
        entries: list[EntryInput] = []
        stack: list[_Heading] = []
        block: _Block | None = None
        fence: str | None = None  # the open fence's marker, e.g. "```"

        def flush() -> None:
            nonlocal block
            if block is not None:
                text = block.joiner.join(block.parts).strip()
                if text:
                    entries.append(
                        EntryInput(
                            track=block.track,
                            scope=block.scope,
                            text=text,
                            tags=[block.tag] if block.tag else [],
                            source=self.id,
                        )
                    )
                block = None

        def start(first: str, joiner: str) -> _Block:
            track, scope = self._cell(stack)
            return _Block([first], joiner, track, scope, self._tag(stack))

        for number, line in enumerate(lines, start=1):
            if has_lone_surrogate(line):
                raise self.error(f"line {number} contains a lone UTF-16 surrogate", line=number)

            if fence is not None:  # inside a fenced code block (claude-code only)
                assert block is not None
                block.parts.append(line)
                closing = _FENCE.fullmatch(line)
                if closing and closing.group(1).startswith(fence) and closing.group(2).strip() == "":
                    fence = None
                    flush()
                continue

            if not line.strip():
                flush()
                continue

            heading = _heading(line)
            if heading is not None:
                flush()
                while stack and stack[-1].level >= heading.level:
                    stack.pop()
                stack.append(heading)
                continue

            item = _bullet(line)
            if item is not None:
                flush()
                if not item:
                    raise self.error(f"line {number} is an empty bullet", line=number)
                block = start(item, " ")
                continue

            if not self.allow_prose:
                raise self.error(f"line {number} is neither a heading nor a '- '/'* ' bullet", line=number)

            if _THEMATIC_BREAK.fullmatch(line):
                # A rule (---, ***, ___) only separates, like a blank line. Checked after the
                # bullets on purpose: "- - -" stays a bullet, so an exported "- --" round-trips.
                flush()
                continue

            opening = _FENCE.fullmatch(line)
            if opening is not None and not (opening.group(1)[0] == "`" and "`" in opening.group(2)):
                flush()
                fence = opening.group(1)
                block = start(line.strip(), "\n")
                continue

            if block is not None:  # paragraph continuation, or lazy continuation of a bullet
                block.parts.append(line.strip())
            else:
                block = start(line.strip(), " ")
        flush()
        return entries

    def _cell(self, stack: list[_Heading]) -> tuple[Track, Scope]:
        for heading in reversed(stack):
            cell = _GRID_HEADINGS.get(heading.name)
            if cell is not None:
                return cell
        return self.default_track, self.default_scope

    @staticmethod
    def _tag(stack: list[_Heading]) -> str | None:
        for heading in reversed(stack):
            if heading.name not in _GRID_HEADINGS:
                return fit_tag(heading.name)
        return None

    # -- export ---------------------------------------------------------------------------

    def export(self, entries: list[Entry]) -> str:
        sections: list[str] = []
        for track, scope in GRID:
            bullets = [f"- {flatten(e.text)}" for e in entries if e.track == track and e.scope == scope]
            if bullets:
                sections.append("\n".join([f"## {track}/{scope}", *bullets]))
        return "\n\n".join(sections) + "\n" if sections else ""


class HermesMemoryMdAdapter(MarkdownAdapter):
    """Hermes-style MEMORY.md: headings and bullets only; default cell user/user-global."""

    def __init__(self) -> None:
        super().__init__(
            id="hermes-memory-md",
            name="Hermes memory markdown",
            description=(
                "Markdown of section headings (any level) and '- '/'* ' bullets: each bullet is an entry "
                "tagged with its section name; any other non-blank line is refused. '## <track>/<scope>' "
                "headings choose the track/scope, else user/user-global."
            ),
            default_track="user",
            default_scope="user-global",
            allow_prose=False,
        )


class ClaudeCodeMemoryMdAdapter(MarkdownAdapter):
    """CLAUDE.md-style memory: headings, bullets and prose; default cell agent/user-global."""

    def __init__(self) -> None:
        super().__init__(
            id="claude-code-memory-md",
            name="Claude Code memory markdown (CLAUDE.md)",
            description=(
                "Markdown of headings (any level), bullets and prose: each bullet and each paragraph "
                "(lines joined by one space) is an entry tagged with its section name. "
                "'## <track>/<scope>' headings choose the track/scope, else agent/user-global."
            ),
            default_track="agent",
            default_scope="user-global",
            allow_prose=True,
        )


__all__ = ["MARKDOWN_FORMAT", "ClaudeCodeMemoryMdAdapter", "HermesMemoryMdAdapter", "MarkdownAdapter"]
