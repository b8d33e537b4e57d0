"""The frozen snapshot text a session's system prompt receives (reference format)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

from .constants import GRID
from .types import Proposal
from .validation import SessionView

Language = Literal["en", "zh"]

# The model-visible strings are the reference's (dsh-memento 0.4.4 lib/strings.mjs), word for
# word: a harness that moves between the two providers sees the same block.
HEADERS: dict[str, str] = {
    "en": (
        "[dsh-memento: frozen memory snapshot — captured at session start; memory changes "
        "during this session do not update this block. To change memory, use the memory tool.]"
    ),
    "zh": "[dsh-memento：冻结记忆快照——会话启动时捕获；本会话内的记忆变更不更新此块。要修改记忆，请使用 memory 工具。]",
}
TITLES: dict[str, dict[tuple[str, str], str]] = {
    "en": {
        ("user", "user-global"): "User profile (global preferences, communication style, landmines)",
        ("user", "workspace"): "User preferences for this workspace",
        ("agent", "user-global"): "Environment facts and conventions (cross-workspace)",
        ("agent", "workspace"): "Workspace facts, conventions, and lessons",
    },
    "zh": {
        ("user", "user-global"): "用户画像（全局偏好、沟通风格、雷区）",
        ("user", "workspace"): "本工作区的用户偏好",
        ("agent", "user-global"): "环境事实与约定（跨工作区）",
        ("agent", "workspace"): "本工作区的事实、约定与教训",
    },
}
USED: dict[str, str] = {"en": "chars used", "zh": "已用字符"}
PROPOSALS_TITLE: dict[str, str] = {
    "en": "Pending memory proposals (reviewed by the user; approve or dismiss via the /memory proposals command)",
    "zh": "待审批记忆提案（由用户裁决；用 /memory proposals 命令 approve 或 dismiss）",
}


def visible_proposals(pending: Iterable[Proposal], view: SessionView, limit: int) -> list[Proposal]:
    """The pending proposals a session's snapshot lists: its own (those it made) that it
    sees (the visibility of entries: agentKey ``''`` or its own; user-global, or workspace
    of its workspaceKey), the first ``limit`` by ``(createdAt, id)``. Another session's
    proposal is text no human approved: it reaches the human's review, not this prompt."""
    own = [p for p in pending if p.session_id is not None and p.session_id == view.session_id
           and view.sees(p.scope, p.workspace_key, p.agent_key)]
    return sorted(own, key=lambda p: (p.created_at, p.id))[:limit]


def fence_proposal(text: str) -> str:
    """A proposal's text as its one line of the snapshot: every line break in it (``\\n``,
    ``\\r\\n``, ``\\r`` and the other breaks :meth:`str.splitlines` knows: VT, FF, NEL,
    U+2028, U+2029, and U+001C-U+001E) becomes one space. A proposal is not yet approved,
    so nothing inside it may start a line of its own and pass for a heading, an entry line
    or another proposal."""
    return " ".join(text.splitlines()) if text else text


def render(
    entries: Sequence[tuple[str, str, str]],
    usage: Mapping[tuple[str, str], tuple[int, int]],
    proposals: Sequence[tuple[str, str, str, str]] = (),
    language: Language = "en",
) -> str:
    """Render the snapshot.

    ``entries``: the session's visible ``(track, scope, text)`` in creation order.
    ``usage``: ``(track, scope) → (used, limit)``. ``proposals``: the session's visible
    pending ``(id, track, scope, text)`` in order (see :func:`visible_proposals`); their
    section follows the entry sections, each on one line (:func:`fence_proposal`).
    Neither entries nor proposals → ``""``.
    """
    by_cell: dict[tuple[str, str], list[str]] = {}
    for track, scope, text in entries:
        by_cell.setdefault((track, scope), []).append(text)
    sections: list[str] = []
    for cell in GRID:
        texts = by_cell.get(cell)
        if not texts:
            continue
        used, limit = usage.get(cell, (0, 0))
        lines = [f"## {TITLES[language][cell]} — {used}/{limit} {USED[language]}"]
        lines.extend(f"- {text}" for text in texts)
        sections.append("\n".join(lines))
    if proposals:
        lines = [f"## {PROPOSALS_TITLE[language]}"]
        lines.extend(f"- [{pid}] {track}/{scope}: {fence_proposal(text)}" for pid, track, scope, text in proposals)
        sections.append("\n".join(lines))
    if not sections:
        return ""
    return "\n\n".join([HEADERS[language], *sections])


__all__ = ["HEADERS", "PROPOSALS_TITLE", "TITLES", "USED", "Language", "fence_proposal", "render", "visible_proposals"]
