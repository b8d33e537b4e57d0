"""Bytes ↔ lines, sans I/O: newline-delimited JSON (wire-v1.md §1) with a hard per-line limit.

One line buffer for every reader of the stream: the daemon (which answers an oversize line
with an error and times out a half line), the Python client and the test client. Feed it
whatever bytes arrived; it returns the complete lines.
"""

from __future__ import annotations

from typing import Final

#: Returned in place of a line that exceeded the limit (the line itself is discarded).
OVERSIZE: Final = b"\x00oversize"


class Framer:
    """Split a byte stream into lines without their ``\\n`` (a trailing ``\\r`` is kept;
    JSON parsing ignores it); blank lines are skipped. A line longer than ``max_bytes`` is
    dropped as it streams in, never buffered whole, and reported once as OVERSIZE when its
    ``\\n`` (or the end) comes. ``partial`` says whether bytes of an unfinished line are
    held (or being discarded): the daemon's half-line timeout runs then. ``discarding``
    says a line over the limit is being dropped (a reader that gives up on such a line can
    stop at once)."""

    __slots__ = ("_buf", "_discarding", "_max")

    def __init__(self, max_bytes: int) -> None:
        self._buf = bytearray()
        self._discarding = False
        self._max = max_bytes

    @property
    def partial(self) -> bool:
        return self._discarding or bool(self._buf)

    @property
    def discarding(self) -> bool:
        return self._discarding

    def feed(self, chunk: bytes) -> list[bytes]:
        out: list[bytes] = []
        buf = self._buf
        start = 0
        while True:
            nl = chunk.find(b"\n", start)
            if nl < 0:
                if not self._discarding:
                    buf += chunk[start:]
                    if len(buf) > self._max:
                        self._discarding = True
                        buf.clear()
                return out
            if self._discarding:
                self._discarding = False
                out.append(OVERSIZE)
            else:
                buf += chunk[start:nl]
                if len(buf) > self._max:
                    out.append(OVERSIZE)
                elif buf.strip():
                    out.append(bytes(buf))
                buf.clear()
            start = nl + 1

    def end(self) -> list[bytes]:
        """At EOF: the unterminated last line, if any."""
        if self._discarding:
            return [OVERSIZE]
        if self._buf.strip():
            return [bytes(self._buf)]
        return []


__all__ = ["OVERSIZE", "Framer"]
