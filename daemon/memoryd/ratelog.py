"""A warning that repeats on every attempt, logged a few times a minute at most."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable


class RateLimitedLog:
    """At most ``burst`` warnings a minute, the next one saying how many were held back: a
    condition that repeats on every attempt (a full descriptor table, peers that stop reading,
    another user connecting in a loop) is a few lines, not a flood."""

    INTERVAL_S = 60.0

    def __init__(self, log: logging.Logger, burst: int = 1, clock: Callable[[], float] = time.monotonic) -> None:
        self._log = log
        self.burst = burst
        self._clock = clock
        self._start = -float("inf")
        self._said = 0
        self._held = 0

    def say(self, message: str) -> None:
        now = self._clock()
        if now - self._start >= self.INTERVAL_S:
            self._start, self._said = now, 0
        if self._said >= self.burst:
            self._held += 1
            return
        more = f" ({self._held} more since the last report)" if self._held else ""
        self._log.warning("%s%s", message, more)
        self._said += 1
        self._held = 0
