"""The frozen snapshot text a session's system prompt receives (reference format)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from .constants import GRID

Language = Literal["en", "zh"]

HEADERS: dict[str, str] = {
    "en": (
        "[dsh-memento: frozen memory snapshot — captured at session start; memory changes "
        "during this session do not update this block. To change memory, use the memory tool.]"
    ),
    "zh": "[dsh-memento：冻结的记忆快照——在会话开始时捕获；本会话期间的记忆变更不会更新此块。如需修改记忆，请使用记忆工具。]",
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
        ("agent", "workspace"): "工作区事实、约定与经验",
    },
}
USED: dict[str, str] = {"en": "chars used", "zh": "字符已用"}
PROPOSALS_TITLE: dict[str, str] = {
    "en": "Pending memory proposals (awaiting the user's decision)",
    "zh": "待定的记忆提案（等待用户决定）",
}


def render(
    entries: Sequence[tuple[str, str, str]],
    usage: Mapping[tuple[str, str], tuple[int, int]],
    proposals: Sequence[tuple[str, str, str]] = (),
    language: Language = "en",
) -> str:
    """Render the snapshot.

    ``entries``: the session's visible ``(track, scope, text)`` in creation order.
    ``usage``: ``(track, scope) → (used, limit)``. ``proposals``: pending ``(track, scope,
    text)`` of this session. No entries → ``""``.
    """
    if not entries:
        return ""
    by_cell: dict[tuple[str, str], list[str]] = {}
    for track, scope, text in entries:
        by_cell.setdefault((track, scope), []).append(text)
    sections = [HEADERS[language]]
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
        lines.extend(f"- [{track}/{scope}] {text}" for track, scope, text in proposals)
        sections.append("\n".join(lines))
    return "\n\n".join(sections)


__all__ = ["HEADERS", "TITLES", "Language", "render"]
