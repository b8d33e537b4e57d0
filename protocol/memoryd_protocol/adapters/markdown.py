"""Markdown memory files: ``hermes-memory-md`` and ``claude-code-memory-md``.

Payload: the markdown text, either as a JSON string or as ``{"text": "..."}`` (a saved
``{plugin, text}`` export included); a string that is itself a JSON document is decoded
first, as the reference's import reads a file (``reference_md.markdown_of``). A leading
byte-order mark is ignored. Line numbers in errors are 1-based and count a CRLF as one
line break.

Two readings. A document that carries none of memoryd's placement headings (below) is read
exactly as the reference provider reads it (``reference_md``): only ``## `` headings,
bullets and paragraphs, every entry in ``user/user-global``. A document that carries one
is one of memoryd's own exports, and is read as the rest of this docstring says, so its
entries go back to their layers; there line breaks may also be a lone CR.

Sections. A heading of *any* level (``#``, ``##``, ``###``, …; ``#`` followed by a space
or the end of the line, optional closing ``#``s) opens a section that lasts until the next
heading of the same or a higher level.

* Cell: a heading that is exactly ``<track>/<scope>`` - ``user/user-global``,
  ``user/workspace``, ``agent/user-global``, ``agent/workspace``, the headings these
  adapters' own exports write - places the entries inside it (including those under its
  sub-headings) in that track/scope, so export → import round-trips. Outside such a
  section entries land in ``user/user-global``, where the reference puts them.
* Workspace and agent layer: a *placement heading* names them for the ``<track>/<scope>``
  heading that follows it directly (only blank lines between)::

      ## memoryd: workspace "/home/u/proj", agent "coder"
      ## agent/workspace
      - Run make check before pushing.

  Its name is ``memoryd:`` and then ``workspace "<path>"``, ``agent "<key>"`` or both,
  comma-separated, in either order. Each value is a JSON string: ``"``, ``\\`` and control
  characters are escaped, while ``#``, spaces and non-ASCII stand as they are. The value
  is normalized and checked as the daemon checks a session's cwd and agentPreset
  (``normalize_workspace_path``: an absolute POSIX or Windows-drive path of at most 4096
  UTF-16 units; ``normalize_agent_key``: trimmed, ASCII-folded, at most 256 units, no
  control characters; the workspace may not be empty, the agent ``""`` names the shared
  layer), so a placement heading may name a workspace
  the importing user never had (it is a restore) but never an invalid one. What a placement heading
  leaves out, and every section without one, gets what an import gives an entry without
  keys: the importing session's workspace and agent layer (memoryd's exports name both,
  ``agent ""`` for the shared layer, so they restore exactly); user-global entries have
  no workspace, and a placement heading naming one before a user-global cell is refused.
  The placement heading is a ``## `` line of its own, not a sub-heading, because the
  reference provider knows ``## `` headings only: it takes a placement heading for an
  empty section, still tags the bullets with their ``<track>/<scope>`` heading, and its
  hermes adapter (which refuses every other line) still imports the file. Only a name
  starting ``memoryd: workspace "`` or ``memoryd: agent "`` is a placement heading; one
  that then does not parse, is not followed directly by a ``<track>/<scope>`` heading or
  names an invalid value is ``ADAPTER_PAYLOAD`` naming its line. Any other heading, such
  as ``## memoryd: architecture``, is an ordinary one.
* Tags: the name of the innermost enclosing heading that is neither a ``<track>/<scope>``
  nor a placement heading becomes the entry's one tag (trimmed, whitespace collapsed, cut
  to the 32-unit tag limit with ``…`` rather than failing). Entries outside any named
  section get none.

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

Export (both adapters): ``{"plugin": <adapter id>, "text": <markdown>}``, as the reference
writes it. For each non-empty cell in the reference's order (the ``<track>/<scope>`` names
sorted: agent/user-global, agent/workspace, user/user-global, user/workspace), one
``## <track>/<scope>`` section per layer, the layers in the order they first appear; every
section has its placement heading on the line before, naming its workspace (workspace
cells) and its agent (``""`` for the shared layer), values as JSON strings with
U+007F-U+009F, U+2028 and U+2029 escaped too. The reference reads a placement heading as
an empty section. A section is a list of ``- <text>`` bullets in the order given (the
daemon passes creation order); line breaks inside a text become spaces; sections are
separated by a blank line; no final newline; ``""`` when there are no entries. Tags and
sources are not written.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from typing import Any, Final

from ..constants import GRID, Scope, Track
from ..errors import InvalidInput
from ..text import has_lone_surrogate, normalize_agent_key, normalize_workspace_path
from ..types import Entry, EntryInput
from .base import AdapterBase, fit_tag, flatten
from .reference_md import markdown_of, read_like_reference

MARKDOWN_FORMAT: Final = "text/markdown"

_HEADING = re.compile(r"[ \t]*(#+)(?:[ \t]+(.*))?")
_CLOSING_HASHES = re.compile(r"(?:^|[ \t]+)#+[ \t]*$")
_BULLET = re.compile(r"[ \t]*[-*](?:[ \t]+(.*))?")
_THEMATIC_BREAK = re.compile(r"[ \t]*([-*_])(?:[ \t]*\1){2,}[ \t]*")
_FENCE = re.compile(r"[ \t]*(`{3,}|~{3,})(.*)")
_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_GRID_HEADINGS: Final[dict[str, tuple[Track, Scope]]] = {f"{t}/{s}": (t, s) for t, s in GRID}

_PLACEMENT_PREFIX: Final = "memoryd:"
_PLACEMENT_START = re.compile(r'memoryd:[ \t]+(?:workspace|agent)[ \t]+"')
_PLACEMENT_PART = re.compile(r'[ \t]*(workspace|agent)[ \t]+("(?:[^"\\]|\\.)*")[ \t]*(?:(,)|\Z)')
# Left raw by json.dumps(ensure_ascii=False) but taken for line breaks or invisible by some
# readers; escaping them keeps a placement heading one visible line.
_ESCAPE_TOO = re.compile("[\x7f-\x9f\u2028\u2029]")
_PLACEMENT_FORM: Final = "'## memoryd: workspace \"/abs/path\", agent \"name\"' (either part may be left out)"


@dataclass(frozen=True, slots=True)
class _Placement:
    """A placement heading: its line and the keys it names (``None``: not named)."""

    line: int
    workspace_key: str | None
    agent_key: str | None


@dataclass(frozen=True, slots=True)
class _Heading:
    level: int
    name: str
    cell: tuple[Track, Scope] | None = None
    placement: _Placement | None = None  # on a cell heading: the placement heading before it
    is_placement: bool = False


@dataclass(slots=True)
class _Block:
    """An entry being assembled: its lines, how they are joined, where it lands."""

    parts: list[str]
    joiner: str
    track: Track
    scope: Scope
    placement: _Placement | None
    tag: str | None


def _heading(line: str) -> _Heading | None:
    m = _HEADING.fullmatch(line)
    if m is None:
        return None
    name = _CLOSING_HASHES.sub("", m.group(2) or "").strip()
    return _Heading(len(m.group(1)), name, cell=_GRID_HEADINGS.get(name))


def _is_placement(line: str) -> bool:
    heading = _heading(line)
    return heading is not None and _PLACEMENT_START.match(heading.name) is not None


def _bullet(line: str) -> str | None:
    """The bullet's text (possibly empty) or ``None`` when the line is no bullet."""
    m = _BULLET.fullmatch(line)
    if m is None:
        return None
    return (m.group(1) or "").strip()


def _quote(value: str) -> str:
    """``value`` as a one-line JSON string, non-ASCII kept readable."""
    return _ESCAPE_TOO.sub(lambda m: f"\\u{ord(m.group()):04x}", json.dumps(value, ensure_ascii=False))


def _placement_heading(workspace_key: str, agent_key: str) -> str:
    """The placement heading line of a layer: its workspace (if any) and its agent, ``""``
    for the shared layer, so that every export carries them."""
    parts = [f"workspace {_quote(workspace_key)}"] if workspace_key else []
    parts.append(f"agent {_quote(agent_key)}")
    return f"## {_PLACEMENT_PREFIX} {', '.join(parts)}"


class MarkdownAdapter(AdapterBase):
    """Shared parser and exporter; subclasses choose the prose handling."""

    allow_prose: bool

    def __init__(self, *, id: str, name: str, description: str, allow_prose: bool) -> None:
        super().__init__(
            id=id,
            name=name,
            description=description,
            version="1.1.0",
            import_formats=[MARKDOWN_FORMAT],
            export_format=MARKDOWN_FORMAT,
        )
        self.allow_prose = allow_prose

    # -- import ---------------------------------------------------------------------------

    def adapt(self, payload: Any) -> list[EntryInput]:
        text = markdown_of(self, payload)
        lines = _LINE_BREAK.split(text)
        if not any(_is_placement(line) for line in lines):
            # Not one of memoryd's exports: read it as the reference provider does.
            return read_like_reference(self, text, prose=self.allow_prose)
        entries: list[EntryInput] = []
        stack: list[_Heading] = []
        block: _Block | None = None
        fence: str | None = None  # the open fence's marker, e.g. "```"
        pending: _Placement | None = None  # a placement heading still waiting for its cell heading

        def flush() -> None:
            nonlocal block
            if block is not None:
                text = block.joiner.join(block.parts).strip()
                if text:
                    where = block.placement
                    entries.append(
                        EntryInput(
                            track=block.track,
                            scope=block.scope,
                            text=text,
                            tags=[block.tag] if block.tag else [],
                            source=self.id,
                            workspace_key=where.workspace_key if where else None,
                            agent_key=where.agent_key if where else None,
                        )
                    )
                block = None

        def start(first: str, joiner: str) -> _Block:
            track, scope, placement = self._cell(stack)
            return _Block([first], joiner, track, scope, placement, self._tag(stack))

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
            if pending is not None:
                if heading is None or heading.cell is None:
                    raise self._unplaced(pending)
                heading = self._placed(heading, pending)
                pending = None
            elif heading is not None and _PLACEMENT_START.match(heading.name):
                pending = self._placement(heading.name, number)
                heading = replace(heading, is_placement=True)
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
        if pending is not None:
            raise self._unplaced(pending)
        flush()
        return entries

    def _placement(self, name: str, line: int) -> _Placement:
        """The keys a placement heading names, normalized as the daemon normalizes them."""
        values: dict[str, str] = {}
        pos = len(_PLACEMENT_PREFIX)
        while True:
            m = _PLACEMENT_PART.match(name, pos)
            if m is None or m.group(1) in values:
                raise self.error(f"line {line} is a malformed placement heading; write it as {_PLACEMENT_FORM}",
                                 line=line)
            try:
                values[m.group(1)] = json.loads(m.group(2))
            except ValueError:
                raise self.error(
                    f"line {line} is a malformed placement heading (its {m.group(1)} is not a valid JSON string); "
                    f"write it as {_PLACEMENT_FORM}",
                    line=line,
                ) from None
            if m.group(3) is None:
                break
            pos = m.end()
        workspace = values.get("workspace")
        agent = values.get("agent")
        try:
            # a path: the importing daemon maps it by its workspace aliases, as any import's key
            workspace_key = None if workspace is None else normalize_workspace_path(workspace)
            agent_key = None if agent is None else normalize_agent_key(agent)
        except InvalidInput as exc:
            which = "workspace" if exc.details.get("field") == "workspaceKey" else "agent"
            raise self.error(
                f"line {line}: the placement heading's {which} is invalid ({exc.message}); correct it or remove "
                "the heading",
                line=line,
            ) from None
        if workspace_key == "":
            raise self.error(
                f"line {line}: the placement heading's workspace is empty; name one or leave the workspace out",
                line=line,
            )
        return _Placement(line, workspace_key, agent_key)

    def _placed(self, heading: _Heading, placement: _Placement) -> _Heading:
        assert heading.cell is not None
        track, scope = heading.cell
        if placement.workspace_key is not None and scope != "workspace":
            raise self.error(
                f"line {placement.line}: the placement heading names a workspace, but '{track}/{scope}' entries have "
                "none; leave the workspace out or place the entries in a workspace section",
                line=placement.line,
            )
        return replace(heading, placement=placement)

    def _unplaced(self, placement: _Placement) -> Exception:
        return self.error(
            f"line {placement.line}: a placement heading must be followed directly by a '## <track>/<scope>' "
            "heading (such as '## agent/workspace'); add one or remove the placement heading",
            line=placement.line,
        )

    def _cell(self, stack: list[_Heading]) -> tuple[Track, Scope, _Placement | None]:
        for heading in reversed(stack):
            if heading.cell is not None:
                return (*heading.cell, heading.placement)
        return "user", "user-global", None  # where the reference puts every entry

    @staticmethod
    def _tag(stack: list[_Heading]) -> str | None:
        for heading in reversed(stack):
            if heading.cell is None and not heading.is_placement:
                return fit_tag(heading.name)
        return None

    # -- export ---------------------------------------------------------------------------

    def export(self, entries: list[Entry]) -> dict[str, str]:
        """``{plugin, text}``, as the reference writes it: a ``## <track>/<scope>`` section per
        track and scope in the reference's order, bullets in the order given, no final
        newline. A section per layer, each after its placement heading."""
        sections: list[str] = []
        for track, scope in sorted(GRID, key=lambda cell: f"{cell[0]}/{cell[1]}"):
            layers: dict[tuple[str, str], list[str]] = {}
            for e in entries:
                if e.track == track and e.scope == scope:
                    # user-global entries have no workspace (the store never gives them one)
                    layer = (e.workspace_key if scope == "workspace" else "", e.agent_key)
                    layers.setdefault(layer, []).append(f"- {flatten(e.text)}")
            for workspace_key, agent_key in layers:
                above = _placement_heading(workspace_key, agent_key)
                sections.append("\n".join([above, f"## {track}/{scope}", *layers[(workspace_key, agent_key)]]))
        return {"plugin": self.id, "text": "\n\n".join(sections)}


class HermesMemoryMdAdapter(MarkdownAdapter):
    """Hermes-style MEMORY.md: headings and bullets only."""

    def __init__(self) -> None:
        super().__init__(
            id="hermes-memory-md",
            name="Hermes memory markdown",
            description=(
                "Markdown of '## ' section headings and '- '/'* ' bullets, read as dsh-memento reads it: each "
                "bullet is a user/user-global entry tagged with its section name; any other non-blank line is "
                "refused. memoryd's own exports ({plugin, text}) carry placement headings and restore each "
                "entry's track, scope, workspace and agent."
            ),
            allow_prose=False,
        )


class ClaudeCodeMemoryMdAdapter(MarkdownAdapter):
    """CLAUDE.md-style memory: headings, bullets and prose."""

    def __init__(self) -> None:
        super().__init__(
            id="claude-code-memory-md",
            name="Claude Code memory markdown (CLAUDE.md)",
            description=(
                "Markdown of '## ' headings, bullets and prose, read as dsh-memento reads it: each bullet and "
                "each paragraph (lines joined by one space) is a user/user-global entry tagged with its "
                "section name. memoryd's own exports ({plugin, text}) carry placement headings and restore "
                "each entry's track, scope, workspace and agent."
            ),
            allow_prose=True,
        )


__all__ = ["MARKDOWN_FORMAT", "ClaudeCodeMemoryMdAdapter", "HermesMemoryMdAdapter", "MarkdownAdapter"]
