"""Counting, folding and normalizing text exactly as the reference provider does.

The protocol counts in JavaScript string lengths (UTF-16 code units) and folds case in
ASCII only (SQLite's ``lower()`` without ICU). Python's ``len`` and ``str.lower`` do
neither, so nothing in memoryd may use them for budgets or matching.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping

from .constants import MAX_AGENT_KEY_UNITS, MAX_KEY_UNITS, MAX_TAG_UNITS, MAX_TAGS
from .errors import InvalidInput

_ASCII_UPPER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")
_WINDOWS_DRIVE = re.compile(r"^[A-Za-z]:[\\/]")


#: What JavaScript's String.prototype.trim() removes (WhiteSpace and LineTerminator).
#: Python's str.strip() differs both ways (it strips \x1c-\x1f and \x85, keeps U+FEFF),
#: which would make stored text, and so budgets, differ from the reference's.
JS_WHITESPACE = (
    "\t\n\x0b\x0c\r \xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000\ufeff"
)


def js_trim(text: str) -> str:
    """``text.trim()`` as JavaScript does it."""
    return text.strip(JS_WHITESPACE)


def utf16_len(text: str) -> int:
    """Length in UTF-16 code units: what JavaScript's ``String.length`` returns."""
    if text.isascii():
        return len(text)
    return len(text) + sum(1 for ch in text if ord(ch) > 0xFFFF)


def ascii_fold(text: str) -> str:
    """Lower-case A–Z only; every other character, and the length, stay as they are."""
    return text.translate(_ASCII_UPPER)


def cut_units(text: str, limit: int, ellipsis: str = "…") -> str:
    """Cut ``text`` to at most ``limit`` UTF-16 units (never splitting a surrogate pair)."""
    if utf16_len(text) <= limit:
        return text
    units = 0
    for i, ch in enumerate(text):
        units += 2 if ord(ch) > 0xFFFF else 1
        if units > limit:
            return text[:i] + ellipsis
    return text  # pragma: no cover - the length check above makes this unreachable


def has_lone_surrogate(text: str) -> bool:
    """True for text SQLite cannot store as UTF-8 (a lone surrogate decoded from JSON)."""
    return _SURROGATE.search(text) is not None


def check_storable(text: str, field: str) -> None:
    if has_lone_surrogate(text):
        raise InvalidInput(f"{field} contains a lone UTF-16 surrogate", field)


def normalize_tags(tags: list[str] | None, field: str = "tags") -> list[str]:
    """Trim, refuse empty/control/oversize tags, dedupe keeping first order, cap at 16."""
    if tags is None:
        return []
    out: list[str] = []
    seen: set[str] = set()
    for raw in tags:
        tag = js_trim(raw)
        if not tag:
            raise InvalidInput("tag must not be empty", field)
        check_storable(tag, field)
        if _CONTROL.search(tag):
            raise InvalidInput("tag must not contain control characters", field)
        if utf16_len(tag) > MAX_TAG_UNITS:
            raise InvalidInput(f"tag longer than {MAX_TAG_UNITS} characters", field)
        if tag not in seen:
            seen.add(tag)
            out.append(tag)
    if len(out) > MAX_TAGS:
        raise InvalidInput(f"more than {MAX_TAGS} tags", field)
    return out


def normalize_workspace_key(cwd: str | None, aliases: Mapping[str, str]) -> str:
    """The workspace key of a cwd, the one place a path becomes a key: the normalized path
    (below), then mapped by the alias in ``aliases`` (the daemon's ``[workspace_aliases]``,
    as workspaces.parse_aliases checked them) whose path is it or contains it."""
    path = normalize_workspace_path(cwd)
    return alias_workspace(path, aliases) if path else path


def alias_workspace(path: str, aliases: Mapping[str, str]) -> str:
    """``path`` moved to the canonical path of the alias whose path is it or the nearest
    directory above it; ``path`` itself when there is none."""
    source = aliased_by(path, aliases) if aliases else None
    if source is None:
        return path
    canonical = aliases[source]
    if source == path:
        return canonical
    key = canonical.rstrip("/") + path[len(source.rstrip("/")):]
    if utf16_len(key) > MAX_KEY_UNITS:
        raise InvalidInput(f"cwd (workspaceKey) longer than {MAX_KEY_UNITS} characters once aliased to {canonical}",
                           "workspaceKey")
    return key


def aliased_by(path: str, aliases: Mapping[str, str]) -> str | None:
    """The alias path that is ``path`` or the nearest directory above it (None: none is). A
    lookup per directory level, so a cwd costs the same whatever the table's size."""
    if path in aliases:
        return path
    cut = len(path)
    while (cut := path.rfind("/", 0, cut)) >= 0:
        directory = path[:cut] or "/"
        if directory in aliases:
            return directory
    return None


def normalize_workspace_path(cwd: str | None) -> str:
    """Normalized absolute cwd: POSIX paths as-is after normpath; Windows paths folded
    (they are case-insensitive) with forward slashes. ``''`` for no cwd. No alias applied."""
    if cwd is None:
        return ""
    cwd = js_trim(cwd)
    if not cwd:
        return ""
    check_storable(cwd, "workspaceKey")
    if utf16_len(cwd) > MAX_KEY_UNITS:
        raise InvalidInput(f"cwd (workspaceKey) longer than {MAX_KEY_UNITS} characters", "workspaceKey")
    if _WINDOWS_DRIVE.match(cwd):
        path = posixpath.normpath(cwd.replace("\\", "/"))
        return ascii_fold(path).rstrip("/") or path
    if not cwd.startswith("/"):
        raise InvalidInput("cwd must be an absolute path", "workspaceKey")
    path = posixpath.normpath(cwd)
    if path.startswith("//"):
        path = "/" + path.lstrip("/")
    return path


def normalize_agent_key(preset: str | None) -> str:
    """Trimmed, ASCII-folded agentPreset; ``''`` is the shared layer."""
    if preset is None:
        return ""
    key = ascii_fold(js_trim(preset))
    check_storable(key, "agentKey")
    if _CONTROL.search(key):
        raise InvalidInput("agentKey must not contain control characters", "agentKey")
    if utf16_len(key) > MAX_AGENT_KEY_UNITS:
        raise InvalidInput(f"agentPreset (agentKey) longer than {MAX_AGENT_KEY_UNITS} characters", "agentKey")
    return key


__all__ = [
    "alias_workspace",
    "aliased_by",
    "ascii_fold",
    "check_storable",
    "cut_units",
    "has_lone_surrogate",
    "js_trim",
    "normalize_agent_key",
    "normalize_tags",
    "normalize_workspace_key",
    "normalize_workspace_path",
    "utf16_len",
]
