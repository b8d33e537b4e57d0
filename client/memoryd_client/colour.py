"""Colour in memoryctl's human output, decided per stream: on a terminal only, off under
``NO_COLOR`` (https://no-color.org) or ``TERM=dumb`` (or no TERM at all, as git has it), and
on wherever ``FORCE_COLOR`` asks for it (https://force-color.org) unless ``NO_COLOR`` says no.

A painter is ``paint(text, style)``: ``style`` is one or more of :data:`STYLES`' names,
space-separated. Text is escaped (:func:`memoryd_protocol.approval_text.visible`) before it
is painted, so the only escape sequences on the terminal are these. Painting happens after
padding and cutting, so widths are counted on the visible text.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

#: ``paint(text, style)``
Paint = Callable[[str, str], str]

#: SGR parameters by style name
STYLES = {"bold": "1", "dim": "2", "red": "31", "green": "32", "yellow": "33"}
RESET = "\x1b[0m"


def _isatty(target: Any) -> bool:
    try:
        return os.isatty(target) if isinstance(target, int) else bool(target.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def enabled(target: Any) -> bool:
    """Whether what is written to ``target``, a stream or a file descriptor, gets colour."""
    if os.environ.get("NO_COLOR"):
        return False
    force = os.environ.get("FORCE_COLOR")
    if force and force != "0":  # FORCE_COLOR=0 is how some tools say "no": it forces nothing here
        return True
    if os.environ.get("TERM", "dumb") == "dumb":
        return False
    return _isatty(target)


def paint(text: str, style: str) -> str:
    """``text`` in ``style``; empty text stays empty (no codes around nothing)."""
    if not text or not style:
        return text
    codes = ";".join(STYLES[name] for name in style.split())
    return f"\x1b[{codes}m{text}{RESET}"


def plain(text: str, style: str) -> str:
    """The painter for a stream without colour: ``text`` as it is."""
    return text


def painter(target: Any) -> Paint:
    """The painter for ``target``, a stream or a file descriptor."""
    return paint if enabled(target) else plain


__all__ = ["RESET", "STYLES", "enabled", "paint", "painter", "plain"]
