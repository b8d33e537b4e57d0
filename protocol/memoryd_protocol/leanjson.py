"""A strict subset of ``json.loads`` and ``json.dumps`` for small lines: the stdio relay's
probe answer, and memoryctl's read commands' requests and answers.

``import json`` is a large part of the stdio relay's start-up (json's decoder and encoder
compile regular expressions at import, so ``re`` comes with it), on every
harness spawn, to read one ``daemon/status`` answer; memoryctl's read commands pay it too.
:func:`loads` reads the JSON those lines are made of exactly as ``json.loads`` reads it
(the same values, the last of two equal keys winning), and raises :class:`Unsure` for
anything else: a long line, one that is not UTF-8 starting with ``{``, a ``\\u`` surrogate
escape, NaN or Infinity, deep nesting, and every malformed line. :func:`dumps` writes what
``json.dumps(value, ensure_ascii=False, separators=(",", ":"))`` writes for strings,
ints, booleans, None, lists and dicts with string keys, and raises :class:`Unsure` for
anything else. The caller then asks json itself, so a verdict is never this module's
alone. tests/test_leanjson.py compares both with json on random documents and text.
Pure: no I/O.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing itself costs an import; mypy still reads the block below
if TYPE_CHECKING:
    from typing import Any

#: Longer lines go to json: the pure-Python reader pays per token, which on a long line costs
#: more than importing json.
MAX_BYTES = 16384
MAX_DEPTH = 32
_WS = " \t\n\r"
_DIGITS = "0123456789"
_HEX = frozenset("0123456789abcdefABCDEF")
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


class Unsure(Exception):
    """Not read here: ask ``json.loads``."""


def loads(data: bytes) -> Any:
    """``json.loads(data)``, or :class:`Unsure`."""
    # json.loads(bytes) guesses UTF-16/32 from NUL bytes and BOMs; '{' first and no NUL
    # anywhere leaves UTF-8 (a NUL is invalid in JSON text anyway).
    if len(data) > MAX_BYTES or data[:1] != b"{" or b"\x00" in data:
        raise Unsure
    try:
        text = data.decode("utf-8")  # json decodes with surrogatepass: those lines are Unsure
        value, end = _value(text, 0, 0)
    except (UnicodeDecodeError, IndexError, ValueError):
        raise Unsure from None
    end = _skip(text, end)
    if end != len(text):
        raise Unsure
    return value


def _skip(s: str, i: int) -> int:
    n = len(s)
    while i < n and s[i] in _WS:
        i += 1
    return i


def _value(s: str, i: int, depth: int) -> tuple[Any, int]:
    """The value at ``s[i]`` (no whitespace before it) and the index after it."""
    c = s[i]
    if c == '"':
        return _string(s, i + 1)
    if c == "{":
        return _object(s, i + 1, depth + 1)
    if c == "[":
        return _array(s, i + 1, depth + 1)
    if c == "n" and s.startswith("null", i):
        return None, i + 4
    if c == "t" and s.startswith("true", i):
        return True, i + 4
    if c == "f" and s.startswith("false", i):
        return False, i + 5
    return _number(s, i)


def _object(s: str, i: int, depth: int) -> tuple[dict[str, Any], int]:
    if depth > MAX_DEPTH:
        raise Unsure
    out: dict[str, Any] = {}
    i = _skip(s, i)
    if s[i] == "}":
        return out, i + 1
    while True:
        if s[i] != '"':
            raise Unsure
        key, i = _string(s, i + 1)
        i = _skip(s, i)
        if s[i] != ":":
            raise Unsure
        out[key], i = _value(s, _skip(s, i + 1), depth)
        i = _skip(s, i)
        if s[i] == "}":
            return out, i + 1
        if s[i] != ",":
            raise Unsure
        i = _skip(s, i + 1)


def _array(s: str, i: int, depth: int) -> tuple[list[Any], int]:
    if depth > MAX_DEPTH:
        raise Unsure
    out: list[Any] = []
    i = _skip(s, i)
    if s[i] == "]":
        return out, i + 1
    while True:
        value, i = _value(s, i, depth)
        out.append(value)
        i = _skip(s, i)
        if s[i] == "]":
            return out, i + 1
        if s[i] != ",":
            raise Unsure
        i = _skip(s, i + 1)


def _string(s: str, i: int) -> tuple[str, int]:
    """The string whose opening quote is just before ``s[i]``."""
    parts: list[str] = []
    while True:
        quote = s.find('"', i)
        if quote < 0:
            raise Unsure
        backslash = s.find("\\", i, quote)
        end = quote if backslash < 0 else backslash
        chunk = s[i:end]
        if chunk and min(chunk) < " ":  # json's strict mode refuses raw control characters
            raise Unsure
        parts.append(chunk)
        if backslash < 0:
            return "".join(parts), quote + 1
        c = s[backslash + 1]
        if c == "u":
            digits = s[backslash + 2:backslash + 6]
            if len(digits) != 4 or not _HEX.issuperset(digits):
                raise Unsure
            code = int(digits, 16)
            if 0xD800 <= code <= 0xDFFF:  # json pairs surrogates its own way: let it
                raise Unsure
            parts.append(chr(code))
            i = backslash + 6
        elif c in _ESCAPES:
            parts.append(_ESCAPES[c])
            i = backslash + 2
        else:
            raise Unsure


def _digits(s: str, i: int) -> int:
    n = len(s)
    while i < n and s[i] in _DIGITS:
        i += 1
    return i


def _number(s: str, i: int) -> tuple[int | float, int]:
    """The number at ``s[i]``, ended where json's scanner ends it (ASCII digits only)."""
    start = i
    if s[i] == "-":
        i += 1
    c = s[i]
    if c == "0":
        i += 1
    elif c in _DIGITS:
        i = _digits(s, i + 1)
    else:
        raise Unsure  # NaN, Infinity, or no value at all
    is_float = False
    n = len(s)
    if i + 1 < n and s[i] == "." and s[i + 1] in _DIGITS:
        is_float = True
        i = _digits(s, i + 2)
    if i < n and s[i] in "eE":
        j = i + 1
        if j < n and s[j] in "+-":
            j += 1
        k = _digits(s, j)
        if k > j:
            is_float = True
            i = k
    text = s[start:i]
    return (float(text) if is_float else int(text)), i


#: json's escapes for ensure_ascii=False (json.encoder.ESCAPE_DCT)
_STRING_ESCAPES = {**{i: f"\\u{i:04x}" for i in range(0x20)}, ord("\\"): "\\\\", ord('"'): '\\"', ord("\b"): "\\b",
                   ord("\f"): "\\f", ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t"}


def dumps(value: Any) -> str:
    """``json.dumps(value, ensure_ascii=False, separators=(",", ":"))``, or :class:`Unsure`."""
    out: list[str] = []
    try:
        _encode(value, out, 0)
    except ValueError:  # an int too long for str(): json says so itself
        raise Unsure from None
    return "".join(out)


def _encode(value: Any, out: list[str], depth: int) -> None:
    if depth > MAX_DEPTH:
        raise Unsure
    kind = type(value)
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif kind is str:
        out.append('"' + value.translate(_STRING_ESCAPES) + '"')
    elif kind is int:
        out.append(int.__repr__(value))
    elif kind is dict:
        out.append("{")
        for n, (key, item) in enumerate(value.items()):
            if type(key) is not str:
                raise Unsure
            out.append(('"' if n == 0 else ',"') + key.translate(_STRING_ESCAPES) + '":')
            _encode(item, out, depth + 1)
        out.append("}")
    elif kind is list or kind is tuple:
        out.append("[")
        for n, item in enumerate(value):
            if n:
                out.append(",")
            _encode(item, out, depth + 1)
        out.append("]")
    else:
        raise Unsure
