"""The NDJSON line buffer (memoryd_protocol.framing), pure: however a stream is cut into
chunks, the same lines come out, a line over the limit is one OVERSIZE and is never held
whole, and ``partial`` says exactly whether an unfinished line is pending."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st
from memoryd_protocol.framing import OVERSIZE, Framer

# Lines of a few bytes that matter: blanks, a kept \r, NUL, invalid UTF-8, JSON-ish text.
pieces = st.lists(st.sampled_from([b"a", b"{}", b" ", b"\t", b"\r", b"\x00", b"\xff", b"\xe2\x82\xac"]), max_size=12)
lines = st.lists(pieces.map(b"".join), max_size=8)


def expected(line: bytes, max_bytes: int) -> list[bytes]:
    if len(line) > max_bytes:
        return [OVERSIZE]
    return [line] if line.strip() else []


def cut(data: bytes, points: list[int]) -> list[bytes]:
    edges = sorted({min(p, len(data)) for p in points} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(edges)]


@given(lines, st.booleans(), st.integers(0, 16), st.lists(st.integers(0, 200), max_size=12))
def test_any_chunking_gives_the_lines(body: list[bytes], terminated: bool, max_bytes: int, points: list[int]) -> None:
    data = b"\n".join(body) + (b"\n" if terminated and body else b"")
    *complete, tail = data.split(b"\n")
    want = [out for line in complete for out in expected(line, max_bytes)]
    f = Framer(max_bytes)
    got: list[bytes] = []
    fed = b""
    for chunk in cut(data, points):
        got += f.feed(chunk)
        fed += chunk
        pending = fed.rpartition(b"\n")[2]
        assert f.partial == bool(pending)
        assert f.discarding == (len(pending) > max_bytes)
        assert len(f._buf) <= max_bytes  # an oversize line is dropped as it streams in
    assert got == want
    assert f.end() == expected(tail, max_bytes)


@given(st.integers(0, 64), st.integers(1, 64))
def test_a_line_at_the_limit_is_kept_and_one_byte_more_is_oversize(max_bytes: int, chunk: int) -> None:
    for size, out in ((max_bytes, [b"x" * max_bytes] if max_bytes else []), (max_bytes + 1, [OVERSIZE])):
        data = b"x" * size + b"\n" + b'{"next":1}\n'
        f = Framer(max_bytes)
        got = [line for i in range(0, len(data), chunk) for line in f.feed(data[i:i + chunk])]
        assert got[: len(out)] == out
        # the line after an oversize one is read normally (when it fits)
        assert got[len(out):] == ([b'{"next":1}'] if max_bytes >= 10 else [OVERSIZE])
        assert not f.partial


def test_oversize_is_reported_once_per_line_and_at_the_end() -> None:
    f = Framer(4)
    assert f.feed(b"123456") == [] and f.discarding
    assert f.feed(b"789") == [] and f.partial
    assert f.feed(b"\nok\n") == [OVERSIZE, b"ok"]
    assert f.feed(b"toolong") == []
    assert f.end() == [OVERSIZE]


def test_blank_lines_are_skipped_and_a_trailing_cr_is_kept() -> None:
    f = Framer(100)
    assert f.feed(b"\n \n\r\n{}\r\n") == [b"{}\r"]
    assert f.end() == []
