"""Unsent output across every connection together (``max_unsent_bytes_total``).

Each connection already waits for its own output: a request's reply is queued, and the
connection serves its next request only once the peer has read it (connection.py), so a
peer that stops reading holds at most one reply. Many such peers each still hold one; this
caps their sum. Only connections that are behind count (the kernel did not take all that
was posted, and the rest waits in their outlet): the others hold nothing unsent.

When a connection falls behind, or gets more output while behind, and the output of the
connections behind passes the cap (not counting the largest: one reply of any size always
goes out, as max_buffered_bytes has it per connection), the connections that fell behind
first are dropped until it fits, and what they sent and were not served yet never is. A
reader that reads keeps catching up and goes to the end of that order each time it falls
behind; a peer that stopped reading stays at its front.
Nothing here waits: a notification (``approval/asked``) is queued at once like any line,
and counted like any.

Requests in flight (read, and not yet answered or parked on an approval) are counted here
too, over every connection together (``max_inflight_total``): a connection's reader takes a
place before it hands a request on (``admit``) and stops reading while there is none. An
MCP session answers its calls concurrently, so without this many hosts that pipeline and
do not read would each have the daemon hold its whole window of calls at once. Places are
given in the order they were asked for; while someone waits, the connections that stopped
reading and hold places are dropped by the rule above, the first behind first.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Protocol

from .ratelog import RateLimitedLog


class Outgoing(Protocol):
    """What of a connection's outgoing half (transports.Outlet) the cap needs."""

    def unsent(self) -> int: ...

    def drop(self) -> None: ...


log = logging.getLogger("memoryd.transports")


class Outbound:
    def __init__(self, limit: int, inflight_limit: int) -> None:
        self.limit = limit
        #: the connections behind, in the order they fell behind (a dict keeps it)
        self._behind: dict[Outgoing, None] = {}
        self._drops = RateLimitedLog(log)
        self.inflight_limit = inflight_limit
        #: requests in flight on every connection together, and the most there ever were
        self.inflight = 0
        self.inflight_peak = 0
        #: requests in flight per connection (only those holding any)
        self._holding: dict[object, int] = {}
        #: connections waiting for a place, in the order they asked
        self._waiting: deque[tuple[asyncio.Future[None], object]] = deque()
        #: dropped connections still holding places (freed as their requests end)
        self._dropped: set[object] = set()

    def behind(self, sink: Outgoing) -> None:
        """``sink`` has fallen behind, or got more output while behind: enforce the caps."""
        self._behind.setdefault(sink, None)
        self._cap_unsent(sink)
        if self._waiting:
            self._make_room()

    def _cap_unsent(self, sink: Outgoing) -> None:
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
            self._drop(s, f"dropping a connection that stopped reading: {n} bytes unsent, {total} unsent on all "
                          f"connections (max_unsent_bytes_total {self.limit})")

    def caught_up(self, sink: Outgoing) -> None:
        """``sink`` has nothing unsent again, or is closed."""
        self._behind.pop(sink, None)

    def _drop(self, sink: Outgoing, why: str) -> None:
        self._behind.pop(sink, None)
        self._drops.say(why)
        if self._holding.get(sink):
            self._dropped.add(sink)
        sink.drop()

    # --- requests in flight ----------------------------------------------------------------

    async def admit(self, sink: object) -> None:
        """Take a place for one request of ``sink``, waiting in turn while there is none."""
        if not self._waiting and self.inflight < self.inflight_limit:
            self._take(sink)
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((waiter, sink))
        self._hand_on()  # the waiters before it may all have been cancelled
        if not waiter.done():
            self._make_room()
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.leave(sink)  # given a place as it was cancelled: not taken after all
            else:
                waiter.cancel()  # _hand_on skips it
            raise

    def leave(self, sink: object) -> None:
        """One request of ``sink`` is answered (or parked, or will never be)."""
        held = self._holding.get(sink, 0)
        if not held:
            return
        if held == 1:
            del self._holding[sink]
            self._dropped.discard(sink)
        else:
            self._holding[sink] = held - 1
        self.inflight -= 1
        self._hand_on()

    def _take(self, sink: object) -> None:
        self._holding[sink] = self._holding.get(sink, 0) + 1
        self.inflight += 1
        if self.inflight > self.inflight_peak:
            self.inflight_peak = self.inflight

    def _hand_on(self) -> None:
        while self._waiting and self.inflight < self.inflight_limit:
            waiter, sink = self._waiting.popleft()
            if not waiter.done():
                self._take(sink)
                waiter.set_result(None)

    def _make_room(self) -> None:
        """While connections wait for places, drop those behind that hold some, the first
        behind first, until what they hold covers the waiters: they never free them otherwise."""
        freeing = sum(self._holding.get(s, 0) for s in self._dropped)
        # a dropped connection's waiter gives its place back at once: it waits for nobody
        waiting = {s for w, s in self._waiting if not w.done() and not getattr(s, "dropped", False)}
        for s in list(self._behind):
            if freeing >= len(waiting):
                return
            held = self._holding.get(s, 0)
            if not held or s in waiting:
                continue  # a waiter is not dropped for itself: it is let in when its turn comes
            self._drop(s, f"dropping a connection that stopped reading: {s.unsent()} bytes unsent, {held} of its "
                          f"requests in flight, {len(waiting)} connections waiting for a place "
                          f"(max_inflight_total {self.inflight_limit})")
            freeing += held
