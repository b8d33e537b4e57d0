"""Bytes ↔ lines: newline-delimited JSON with a hard per-line limit."""

from __future__ import annotations

from typing import Final

#: Yielded in place of a line that exceeded the limit (the line itself is discarded).
OVERSIZE: Final = b"\x00oversize"


class Framer:
    """Split a byte stream into lines without their ``\\n`` (a trailing ``\\r`` is kept;
    JSON parsing ignores it). A line longer than ``max_bytes`` is dropped as it streams in,
    never buffered whole, and reported once as OVERSIZE. ``partial`` says whether bytes of
    an unfinished line are held (or being discarded): the half-line timeout runs then."""

    __slots__ = ("_buf", "_discarding", "_max")

    def __init__(self, max_bytes: int) -> None:
        self._buf = bytearray()
        self._discarding = False
        self._max = max_bytes

    @property
    def partial(self) -> bool:
        return self._discarding or bool(self._buf)

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
