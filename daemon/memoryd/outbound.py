"""Unsent output across every connection together (``max_unsent_bytes_total``).

Each connection already waits for its own output: a request's reply is queued, and the
connection serves its next request only once the peer has read it (connection.py), so a
peer that stops reading holds at most one reply. Many such peers each still hold one; this
caps their sum. Only connections that are behind count (their transport paused writing at
its high-water mark, with what waits queued behind it): the others hold less than that mark.

When a connection falls behind, or gets more output while behind, and the output of the
connections behind passes the cap (not counting the largest: one reply of any size always
goes out, as max_buffered_bytes has it per connection), the connections that fell behind
first are dropped until it fits, and what they sent and were not served yet never is. A
reader that reads keeps catching up and goes to the end of that order each time it falls
behind; a peer that stopped reading stays at its front.
Nothing here waits: a notification (``approval/asked``) is queued at once like any line,
and counted like any.
"""

from __future__ import annotations

import logging

from .ratelog import RateLimitedLog

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Protocol

    class StreamProtocol(Protocol):
        """What of a connection's transport (transports.StreamProtocol) the cap needs."""

        def unsent(self) -> int: ...

        def drop(self) -> None: ...

log = logging.getLogger("memoryd.transports")


class Outbound:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        #: the connections behind, in the order they fell behind (a dict keeps it)
        self._behind: dict[StreamProtocol, None] = {}
        self._drops = RateLimitedLog(log)

    def behind(self, sink: StreamProtocol) -> None:
        """``sink`` has fallen behind, or got more output while behind: enforce the cap."""
        self._behind.setdefault(sink, None)
        if len(self._behind) < 2:
            return
        held = [(s, s.unsent()) for s in self._behind]
        total = sum(n for _, n in held)
        if total <= self.limit:
            return
        largest, most = held[0]
        for s, n in held:
            if n >= most:  # on a tie the newest, so that the oldest go first
                largest, most = s, n
        counted = total - most
        for s, n in held:
            if counted <= self.limit:
                break
            if s is sink or s is largest:
                continue  # never the connection being written to (this is its write's call)
            counted -= n
            self._drop(s, n, total)

    def caught_up(self, sink: StreamProtocol) -> None:
        """``sink`` is below its low-water mark again, or closed."""
        self._behind.pop(sink, None)

    def _drop(self, sink: StreamProtocol, unsent: int, total: int) -> None:
        self._behind.pop(sink, None)
        self._drops.say(f"dropping a connection that stopped reading: {unsent} bytes unsent, {total} unsent on all "
                        f"connections (max_unsent_bytes_total {self.limit})")
        sink.drop()
