"""Workspace aliases: one project checked out at different paths on different machines
(``/Users/me/proj`` on a laptop, ``/home/me/proj`` on a dev box) is one workspace.

The config's ``[workspace_aliases]`` table maps a path to the canonical path whose key it
shares: ``"/Users/me/proj" = "/home/me/proj"``. A cwd that is the path, or lies under it,
becomes the canonical path's key (``/Users/me/proj/api`` → ``/home/me/proj/api``), wherever a
cwd becomes a key (text.normalize_workspace_key, given the table from the daemon's config).
The table is checked here, once, at start.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from .errors import ProtocolError
from .text import aliased_by, normalize_workspace_path

#: Most entries in ``[workspace_aliases]``: a user's machines times their projects, with room;
#: every cwd is compared with each path, so the table stays small.
MAX_WORKSPACE_ALIASES = 256

Aliases = Mapping[str, str]


class AliasTableError(ValueError):
    """A ``[workspace_aliases]`` table memoryd refuses to start with (the message names why)."""


def _absolute(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise AliasTableError(f"{what} must be a non-empty absolute path, got {value!r}")
    try:
        path = normalize_workspace_path(value)
    except ProtocolError as exc:
        raise AliasTableError(f"{what} must be an absolute path, got {value!r} ({exc.message})") from None
    return path


def parse_aliases(raw: Any, where: str = "workspace_aliases") -> Aliases:
    """The checked table: each path's canonical path. Refused: not a table, more than
    MAX_WORKSPACE_ALIASES entries, a path or canonical path that is not absolute, two paths
    that are one after normalizing, and a canonical path that an alias would map again (a
    chain or a loop: each cwd must have one key, whatever order the table is read in)."""
    if not isinstance(raw, dict):
        raise AliasTableError(f'[{where}] must be a table of "path" = "canonical path"')
    if len(raw) > MAX_WORKSPACE_ALIASES:
        raise AliasTableError(f"[{where}] has {len(raw)} entries, more than {MAX_WORKSPACE_ALIASES}: alias a "
                              "common parent directory instead of each project")
    table: dict[str, str] = {}
    for source, canonical in raw.items():
        path = _absolute(source, f"[{where}] path {source!r}")
        if path in table:
            raise AliasTableError(f"[{where}] names {path} twice (as {source!r} too); keep one")
        table[path] = _absolute(canonical, f"[{where}] {source!r}'s canonical path")
    for path, canonical in table.items():
        if path == canonical:
            raise AliasTableError(f"[{where}] maps {path} to itself; remove that entry")
    for path, canonical in table.items():
        again = aliased_by(canonical, table)
        if again is not None:
            raise AliasTableError(f"[{where}] maps {path} to {canonical}, which the alias of {again} maps again "
                                  f"(a chain or a loop); map every path straight to its final canonical path")
    return MappingProxyType(table)


__all__ = ["MAX_WORKSPACE_ALIASES", "AliasTableError", "Aliases", "parse_aliases"]
