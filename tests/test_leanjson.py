"""memoryd_protocol.leanjson reads what json.loads reads and writes what json.dumps writes,
the same way, or says it is unsure."""

from __future__ import annotations

import json
import math
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from memoryd_protocol import leanjson


def same(a: Any, b: Any) -> bool:
    """Equal, type for type (True is not 1, -0.0 is not 0.0), keys in the same order."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return math.copysign(1, a) == math.copysign(1, b) and a == b
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def agrees(data: bytes) -> bool:
    """True when leanjson read ``data``: then json.loads reads it, to the same value."""
    try:
        ours = leanjson.loads(data)
    except leanjson.Unsure:
        return False
    assert same(ours, json.loads(data)), data
    return True


values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5),
    max_leaves=30,
)


@settings(max_examples=400)
@given(st.dictionaries(st.text(max_size=8), values, max_size=6), st.booleans(), st.sampled_from([None, 0, 2]),
       st.sampled_from([(", ", ": "), (",", ":"), (" ,\t", " :\n")]))
def test_every_json_document_is_read_as_json_reads_it(doc: dict[str, Any], ascii_only: bool, indent: int | None,
                                                     separators: tuple[str, str]) -> None:
    data = json.dumps(doc, ensure_ascii=ascii_only, indent=indent, separators=separators).encode()
    if len(data) <= leanjson.MAX_BYTES and not (ascii_only and "\\ud" in data.decode().lower()):
        assert agrees(data)
    else:
        agrees(data)


JSONISH = st.text(alphabet='{}[]",:. \t\n\r\\/-+eE0123456789truefalsnulNaIyx\x00\x1f\u00e9\u4e2d\U0001f600ubfd', max_size=60)


@settings(max_examples=2000)
@given(JSONISH)
def test_text_that_leanjson_reads_is_json_read_the_same(text: str) -> None:
    agrees(("{" + text).encode("utf-8", "surrogatepass"))


@given(st.binary(max_size=40))
def test_bytes_that_leanjson_reads_are_json_read_the_same(raw: bytes) -> None:
    agrees(b"{" + raw)


@pytest.mark.parametrize("data", [
    b'{"a": NaN}', b'{"a": Infinity}', b'{"a": -Infinity}', b'{"a": "\\ud83d\\ude00"}', b'{"a": "\\udc00"}',
    b'{"a": 1,}', b'{"a" 1}', b"{'a': 1}", b'{"a": 01}', b'{"a": 1.}', b'{"a": .5}', b'{"a": "\x01"}',
    b'{"a": 1} x', b'{"a": "\\x"}', b'{"a": "\\u12"}', b'{"a": "\\u+123"}', b'{"a": tru}', b'{"a": [1 2]}',
    b' {"a": 1}', b'\xef\xbb\xbf{"a": 1}', b'{"a": "\xff"}', b'{"a": \x00}', b'{"a": ' + b"1" * 5000 + b"}",
    b'{"a": ' + b"[" * 40 + b"]" * 40 + b"}", b"{" + b'"k": "' + b"x" * leanjson.MAX_BYTES + b'"}', b"{", b"",
])
def test_what_it_does_not_read_it_leaves_to_json(data: bytes) -> None:
    with pytest.raises(leanjson.Unsure):
        leanjson.loads(data)


@pytest.mark.parametrize("data", [
    b'{"a": 1, "a": 2, "b": {"a": 3}}', b'{"n": -0, "f": -0.0, "e": 1E+2, "g": 2e-3, "h": 10.25}',
    b'{"s": "tab\\t \\"q\\" \\\\ \\/ \\u00e9 \\u4e2d \\b\\f\\n\\r", "u": "\xc3\xa9\xf0\x9f\x98\x80", "d": "\x7f"}',
    b'{ "x" : [ true , false , null , [ ] , { } ] }\r\n', b'{"a": 1e5000, "b": 123456789012345678901234567890}',
])
def test_edges_it_reads_as_json_does(data: bytes) -> None:
    assert agrees(data)


def test_a_status_answer_of_memoryd_is_read_here_not_by_json() -> None:
    """The relay's probe answer, encoded as the daemon encodes it (msgspec): leanjson reads
    it, so the relay does not import json to attach."""
    status = {"jsonrpc": "2.0", "id": "memoryd-relay-probe", "result": {
        "version": "0.1.0", "uptimeS": 12.5, "connections": 3, "pendingApprovals": 0, "queueDepth": 0,
        "store": {"path": "/home/u/.local/share/memoryd/memory.db", "schemaVersion": 4}, "pid": 4242,
        "writePolicy": "ask", "socket": "/run/user/1000/memoryd/memoryd.sock", "config": None,
        "log": "/run/user/1000/memoryd/memoryd.log",
        "connectionList": [{"id": i, "transport": "socket", "pid": 100 + i, "uid": 1000, "exe": "/usr/bin/python3.11",
                            "client": {"name": "memoryctl", "version": "0.1.0"}, "approver": False,
                            "openedAt": 1764600000000} for i in range(8)]}}
    assert agrees(msgspec.json.encode(status))


def dumped(value: Any) -> bool:
    """True when leanjson wrote ``value``: then it wrote what json.dumps writes."""
    try:
        ours = leanjson.dumps(value)
    except leanjson.Unsure:
        return False
    assert ours == json.dumps(value, ensure_ascii=False, separators=(",", ":")), value
    return True


plain_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=5) | st.lists(inner, max_size=3).map(tuple)
    | st.dictionaries(st.text(max_size=8), inner, max_size=5),
    max_leaves=30,
)


@settings(max_examples=400)
@given(plain_values)
def test_every_plain_value_is_written_as_json_writes_it(value: Any) -> None:
    assert dumped(value)


@given(values | st.dictionaries(st.integers() | st.booleans() | st.none(), st.integers(), max_size=3)
       | st.lists(st.binary(max_size=3) | st.sets(st.integers(), max_size=2), min_size=1, max_size=2))
def test_what_leanjson_writes_json_writes_the_same(value: Any) -> None:
    try:
        dumped(value)
    except (TypeError, ValueError):  # json refuses it too (leanjson said Unsure)
        pass


def nested(depth: int) -> Any:
    value: Any = "deep"
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("value", [1.5, [float("nan")], {1: "a"}, {"a": {True: 1}}, [b"x"], {"s": {1, 2}},
                                   nested(leanjson.MAX_DEPTH + 2)])
def test_what_it_does_not_write_it_leaves_to_json(value: Any) -> None:
    with pytest.raises(leanjson.Unsure):
        leanjson.dumps(value)


def test_a_request_of_memoryctl_is_written_here() -> None:
    request = {"jsonrpc": "2.0", "id": 2, "method": "memory/query", "params": {
        "filter": {"text": "tabs \"or\" spaces\t数据库\x01", "track": "user", "limit": 20},
        "opts": {"sessionId": "memoryctl-42", "agentKey": "", "workspaceKey": "/home/u/proj"}}}
    assert dumped(request)
