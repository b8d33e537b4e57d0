"""Bytes ↔ lines: newline-delimited JSON with a hard per-line limit."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator
from typing import Final

#: Yielded in place of a line that exceeded the limit (the line itself is discarded).
OVERSIZE: Final = b"\x00oversize"


async def lines(chunks: AsyncIterable[bytes], max_bytes: int) -> AsyncIterator[bytes]:
    """Split a byte stream into lines without their ``\\n`` (a trailing ``\\r`` is kept;
    JSON parsing ignores it). A line longer than ``max_bytes`` is dropped as it streams in,
    never buffered whole, and reported once as OVERSIZE."""
    buf = bytearray()
    discarding = False
    async for chunk in chunks:
        start = 0
        while True:
            nl = chunk.find(b"\n", start)
            if nl < 0:
                if not discarding:
                    buf += chunk[start:]
                    if len(buf) > max_bytes:
                        discarding = True
                        buf.clear()
                break
            if discarding:
                discarding = False
                yield OVERSIZE
            else:
                buf += chunk[start:nl]
                if len(buf) > max_bytes:
                    buf.clear()
                    yield OVERSIZE
                elif buf.strip():
                    line = bytes(buf)
                    buf.clear()
                    yield line
                else:
                    buf.clear()
            start = nl + 1
    if discarding:
        yield OVERSIZE
    elif buf.strip():
        yield bytes(buf)
