"""Input validation beyond what the msgspec types check: text, keys, visibility, budgets.

Every function here is pure and raises a ProtocolError subclass; nothing is written before
all of them have passed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import msgspec

from .constants import (
    AMBIGUOUS_SAMPLE_COUNT,
    AMBIGUOUS_SAMPLE_UNITS,
    DEFAULT_SOURCE,
    MAX_LABEL_UNITS,
    MAX_QUERY_TEXT_UNITS,
    MAX_SESSION_ID_UNITS,
    MAX_SOURCE_UNITS,
    SHORT_ID_LENGTH,
)
from .errors import AmbiguousMatch, BudgetExceeded, EntryNotFound, InvalidInput, WriteRequiresAgent
from .text import (
    ascii_fold,
    check_storable,
    cut_units,
    js_trim,
    normalize_agent_key,
    normalize_workspace_key,
    utf16_len,
)
from .types import Session, Write

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


@dataclass(frozen=True, slots=True)
class SessionView:
    """Who is writing or reading: the visible set is ``agent_key`` ∈ {'', own} and
    ``workspace`` entries of ``workspace_key`` only."""

    session_id: str | None
    workspace_key: str
    agent_key: str

    def sees(self, scope: str, workspace_key: str, agent_key: str) -> bool:
        if agent_key not in ("", self.agent_key):
            return False
        return scope == "user-global" or workspace_key == self.workspace_key


def session_view(session: Session | None, aliases: Mapping[str, str]) -> SessionView:
    """Who the session is: its id, its cwd's workspace key (mapped by ``aliases``) and its agent."""
    if session is None:
        return SessionView(None, "", "")
    if session.id is not None:
        check_session_id(session.id, "sessionId")
    header = session.header
    return SessionView(
        session.id,
        normalize_workspace_key(header.cwd if header else None, aliases),
        normalize_agent_key(header.agent_preset if header else None),
    )


def check_session_id(session_id: str, field: str) -> str:
    """Storable, and at most MAX_SESSION_ID_UNITS long: every row of the session stores it."""
    check_storable(session_id, field)
    if utf16_len(session_id) > MAX_SESSION_ID_UNITS:
        raise InvalidInput(f"{field} longer than {MAX_SESSION_ID_UNITS} characters", field)
    return session_id


def check_label(value: str, field: str) -> str:
    """A name a client gives itself (``client.name``, ``client.version``): stored in a ledger
    row per connection and shown to approvers, so storable, without control characters,
    and at most MAX_LABEL_UNITS long."""
    check_storable(value, field)
    if _CONTROL.search(value):
        raise InvalidInput(f"{field} must not contain control characters", field)
    if utf16_len(value) > MAX_LABEL_UNITS:
        raise InvalidInput(f"{field} longer than {MAX_LABEL_UNITS} characters", field)
    return value


def check_query_text(text: str, field: str = "filter.text") -> str:
    check_match(text, field)
    if utf16_len(text) > MAX_QUERY_TEXT_UNITS:
        raise InvalidInput(f"{field} longer than {MAX_QUERY_TEXT_UNITS} characters", field)
    return text


def writer_view(write: Write | None, aliases: Mapping[str, str]) -> SessionView:
    """The write context's session; WRITE_REQUIRES_AGENT when there is no agent."""
    if write is None or write.agent is None:
        raise WriteRequiresAgent()
    return session_view(write.agent.session, aliases)


def check_text(text: str, field: str = "text") -> str:
    """Non-empty after trimming surrounding whitespace; storable as UTF-8."""
    check_storable(text, field)
    text = js_trim(text)
    if not text:
        raise InvalidInput(f"{field} must not be empty", field)
    return text


def check_match(match: str, field: str = "match") -> str:
    check_storable(match, field)
    if not js_trim(match):
        raise InvalidInput(f"{field} must not be empty", field)
    return match


@dataclass(frozen=True, slots=True)
class Target:
    """How replace/remove name their target: a unique substring, or an entry id."""

    match: str | None = None
    entry_id: str | None = None

    def details(self, track: str, scope: str) -> dict[str, str]:
        """ENTRY_NOT_FOUND details for this target."""
        if self.entry_id is not None:
            return {"track": track, "scope": scope, "entryId": self.entry_id}
        return {"track": track, "scope": scope, "match": self.match or ""}


def check_target(match: str | msgspec.UnsetType | None, entry_id: str | msgspec.UnsetType | None) -> Target:
    """Exactly one of ``match`` and ``id``; both or neither is INVALID_INPUT naming the field."""
    if isinstance(match, msgspec.UnsetType):
        match = None
    if isinstance(entry_id, msgspec.UnsetType):
        entry_id = None
    if match is not None and entry_id is not None:
        raise InvalidInput("input takes match or id, not both", "id")
    if entry_id is not None:
        return Target(entry_id=check_match(entry_id, "id"))
    if match is None:
        raise InvalidInput("input needs match (a unique substring) or id (an entry id)", "match")
    return Target(match=check_match(match))


def check_targets(matches: list[str] | msgspec.UnsetType, ids: list[str] | msgspec.UnsetType) -> list[Target]:
    """consolidate's targets: exactly one of ``matches`` and ``ids``, each item checked as
    check_target checks one, and the field named as ``matches[n]`` or ``ids[n]``."""
    if not isinstance(matches, msgspec.UnsetType) and not isinstance(ids, msgspec.UnsetType):
        raise InvalidInput("input takes matches or ids, not both", "ids")
    if not isinstance(ids, msgspec.UnsetType):
        return [Target(entry_id=check_match(entry_id, f"ids[{n}]")) for n, entry_id in enumerate(ids)]
    if isinstance(matches, msgspec.UnsetType):
        raise InvalidInput("input needs matches (unique substrings) or ids (entry ids)", "matches")
    return [Target(match=check_match(m, f"matches[{n}]")) for n, m in enumerate(matches)]


def check_source(source: str | None) -> str:
    if source is None:
        return DEFAULT_SOURCE
    check_storable(source, "source")
    source = js_trim(source)
    if not source:
        raise InvalidInput("source must not be empty", "source")
    if _CONTROL.search(source):
        raise InvalidInput("source must not contain control characters", "source")
    if utf16_len(source) > MAX_SOURCE_UNITS:
        raise InvalidInput(f"source longer than {MAX_SOURCE_UNITS} characters", "source")
    return source


def target_keys(
    scope: str,
    view: SessionView,
    workspace_key: str | None,
    agent_key: str | None,
    aliases: Mapping[str, str],
    *,
    restricted: bool,
) -> tuple[str, str]:
    """The (workspaceKey, agentKey) an entry is written under.

    Defaults come from the session. ``restricted`` writes (add, proposals) may only target
    the session's visible set; seed and import keep explicit keys (a restore).
    """
    if scope == "user-global":
        wk = normalize_workspace_key(workspace_key, aliases) if workspace_key else ""
        if wk:
            raise InvalidInput("user-global entries have no workspaceKey", "workspaceKey")
    else:
        wk = normalize_workspace_key(workspace_key, aliases) if workspace_key is not None else view.workspace_key
        if not wk:
            raise InvalidInput("workspace scope needs a workspace (session header.cwd)", "workspaceKey")
        if restricted and wk != view.workspace_key:
            raise InvalidInput("workspaceKey is outside the session's workspace", "workspaceKey")
    ak = normalize_agent_key(agent_key) if agent_key is not None else view.agent_key
    if restricted and ak not in ("", view.agent_key):
        raise InvalidInput("agentKey is outside the session's visible set", "agentKey")
    return wk, ak


def resolve_one(
    candidates: Iterable[tuple[str, str]],
    track: str,
    scope: str,
    match: str,
) -> str:
    """The id of the one ``(id, text)`` whose text contains ``match`` (ASCII-folded)."""
    needle = ascii_fold(match)
    hits = [(entry_id, text) for entry_id, text in candidates if needle in ascii_fold(text)]
    if not hits:
        raise EntryNotFound("no memory entry matches", {"track": track, "scope": scope, "match": match})
    if len(hits) > 1:
        ids = [entry_id for entry_id, _ in hits[: AmbiguousMatch.MAX_IDS]]
        # Ids only in the message (never text): the short form memoryctl list shows, which
        # memoryctl --id takes; details.ids has them in full for the wire's id.
        shown = ", ".join(entry_id[:SHORT_ID_LENGTH] for entry_id in ids)
        if len(hits) > len(ids):
            shown += f" and {len(hits) - len(ids)} more"
        raise AmbiguousMatch(
            f"match is ambiguous: {len(hits)} entries contain it (ids {shown}); name one with its id "
            "(memoryctl: --id ID; details.ids has the full ids) or use a longer substring",
            {
                "track": track,
                "scope": scope,
                "match": match,
                "candidates": len(hits),
                "sample": [cut_units(text, AMBIGUOUS_SAMPLE_UNITS) for _, text in hits[:AMBIGUOUS_SAMPLE_COUNT]],
                "ids": ids,
            },
        )
    return hits[0][0]


def check_budget(track: str, scope: str, used: int, limit: int, delta: int, *, config_file: str | None = None) -> None:
    """Refuse a write that would take ``track/scope`` over its limit. A write that does not
    grow usage always passes, even when a lowered limit left the cell over budget.

    ``needed`` is the total the cell would need, ``used + delta`` (the reference's
    ``checkBudget``), not the increment. The message names both ways out: make room, or
    raise the budget's key in ``config_file`` (the daemon's config file)."""
    needed = used + delta
    if delta > 0 and needed > limit:
        key = scope.replace("-", "_")  # the config's spelling of the scope
        where = config_file or "memoryd's config.toml"
        raise BudgetExceeded(
            f"memory budget exceeded: {track}/{scope} has {used}/{limit} characters used, "
            f"this write would bring it to {needed}/{limit} ({delta} more); make room with memoryctl consolidate "
            f"or memoryctl remove, or raise the budget: {key} = N under [budgets.{track}] in {where}, "
            "then restart memoryd",
            {"track": track, "scope": scope, "used": used, "limit": limit, "needed": needed},
        )


def check_batch_budget(
    deltas: Mapping[tuple[str, str], int],
    usage: Mapping[tuple[str, str], int],
    limits: Mapping[tuple[str, str], int],
    *,
    config_file: str | None = None,
) -> None:
    for cell, delta in deltas.items():
        check_budget(cell[0], cell[1], usage.get(cell, 0), limits[cell], delta, config_file=config_file)


__all__ = [
    "SessionView",
    "Target",
    "check_batch_budget",
    "check_budget",
    "check_match",
    "check_query_text",
    "check_session_id",
    "check_source",
    "check_target",
    "check_targets",
    "check_text",
    "resolve_one",
    "session_view",
    "target_keys",
    "writer_view",
]
