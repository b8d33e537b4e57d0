"""A warning that repeats on every attempt, logged as one line at most once a minute."""

from __future__ import annotations

import logging
import time


class RateLimitedLog:
    """One warning, then at most one a minute, saying how many were held back: a condition
    that repeats on every attempt (a full descriptor table, peers that stop reading) is one
    line, not a flood."""

    INTERVAL_S = 60.0

    def __init__(self, log: logging.Logger) -> None:
        self._log = log
        self._last: float | None = None
        self._held = 0

    def say(self, message: str) -> None:
        now = time.monotonic()
        if self._last is not None and now - self._last < self.INTERVAL_S:
            self._held += 1
            return
        more = f" ({self._held} more since the last report)" if self._held else ""
        self._log.warning("%s%s", message, more)
        self._last = now
        self._held = 0
