"""How RESULTS.md writes a figure (milliseconds, ratios, megabytes) and reads one out of a
run's results; shared by the report and the ``mcp`` suite's part of it."""

from __future__ import annotations

from typing import Any


def _ms(us: float) -> str:
    return f"{us / 1000:.2f} ms" if us < 100_000 else f"{us / 1000:.0f} ms"


def _x(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}×"


def _ms_or(us: float | None) -> str:
    return "–" if us is None else _ms(us)


def _div(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def _get(d: Any, *keys: str) -> Any:
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def _mb(kb: int | None) -> str:
    return "–" if kb is None else f"{kb / 1024:.1f} MB"
