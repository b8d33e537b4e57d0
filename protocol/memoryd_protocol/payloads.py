"""Approval payload texts, reason lines and audit outcome labels (approve-what-you-see).

The formats are the reference provider's (reference-facts.md), so a human who approves
in one provider reads the same text in the other.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from .constants import ALLOWED_ONCE, CONSOLIDATE_EXCERPT_UNITS, DENIAL_OUTCOMES
from .text import cut_units

_KNOWN_OUTCOMES = (ALLOWED_ONCE, *DENIAL_OUTCOMES)


def add_text(text: str) -> str:
    return text


def replace_text(old: str, new: str) -> str:
    return f"from:\n{old}\n\nto:\n{new}"


def remove_text(old: str) -> str:
    return old


def consolidate_text(targets: Sequence[tuple[str, str]], new: str) -> str:
    """``targets`` is ``[(match, resolved entry text), ...]`` in the caller's order."""
    parts = [f"remove: {match}\n{cut_units(text, CONSOLIDATE_EXCERPT_UNITS)}" for match, text in targets]
    parts.append(f"new text: {new}")
    return "\n".join(parts)


def seed_text(items: Sequence[tuple[str, str, str]]) -> str:
    """``items`` is ``[(track, scope, text), ...]``."""
    return "\n".join(f"{track}/{scope}: {text}" for track, scope, text in items)


def batch_source(sources: Sequence[str]) -> str:
    """The source a batch is recorded and shown under: its entries' one source, else each of
    theirs in order of first use, comma-separated, so that the row claims no source none of
    them has. A label with the list's own punctuation is quoted: it cannot pass for two."""
    distinct = list(dict.fromkeys(sources))
    if len(distinct) == 1:
        return distinct[0]
    return ", ".join(json.dumps(s, ensure_ascii=False) if any(c in s for c in ',()"') else s for s in distinct)


def dropped_workspaces_note(count: int) -> str:
    """The line an import's approval (and its seed row) ends with when ``count`` user-global
    entries named a workspace: the reference writes the session's cwd there."""
    return (f"user-global entries have no workspace: {count} of these named one (dsh-memento writes the "
            "session's cwd there) and are imported without it")


def reason(action: str, track: str, scope: str, source: str | None, text: str, count: int | None = None) -> str:
    head = f"[dsh-memento] {action}"
    if count is not None:
        head += f" ({count} entries)"
    head += f" {track}/{scope}"
    if source:
        head += f" [source:{source}]"
    return f"{head}\n{text}"


def normalize_outcome(outcome: object) -> str:
    """Only ``allowed-once`` passes; anything unknown is treated (and audited) as a rejection."""
    if isinstance(outcome, str) and outcome in _KNOWN_OUTCOMES:
        return outcome
    return "rejected"


def outcome_label(outcome: str, policy: str) -> str:
    """The audit ``outcome`` column: the decision and where it came from."""
    return f"{outcome} (via approval, writePolicy {policy})"


__all__ = [
    "add_text",
    "consolidate_text",
    "dropped_workspaces_note",
    "normalize_outcome",
    "outcome_label",
    "reason",
    "remove_text",
    "replace_text",
    "seed_text",
]
