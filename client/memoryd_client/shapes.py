"""The results of memoryctl's read commands, checked without msgspec.

The quick path (:mod:`memoryd_client.quick`) gets plain JSON. Before anything is shown it
is checked against the shape of its wire Struct (``memoryd_protocol.types``), field by
field, as msgspec's decoder checks it, and turned into objects with the Structs' attribute
names (``workspace_key`` for ``workspaceKey``), so :mod:`memoryd_client.render` reads both
alike. A result that does not fit goes to msgspec itself (:func:`memoryd_client.client.decode_result`),
which gives the same ``BAD_RESPONSE`` the async client gives. tests/test_cli_quick.py
checks every shape here against its Struct, so the two cannot drift apart.

A kind is ``("str",)``, ``("int", minimum)``, ``("float",)``, ``("bool",)``,
``("literal", values)``, ``("list", kind)``, ``("null", kind)`` (the kind or null), or a
:class:`Shape`.
"""

from __future__ import annotations

from types import SimpleNamespace

TYPE_CHECKING = False  # typing is not imported at run time: see memoryd_protocol.constants
if TYPE_CHECKING:
    from typing import Any


class Mismatch(Exception):
    """A value that does not fit its kind."""


class Shape:
    """A Struct's fields: ``(attribute, wire name, kind, required)``; a field that is not
    required is None when absent."""

    __slots__ = ("fields", "name")

    def __init__(self, name: str, fields: list[tuple[str, str, Any, bool]]) -> None:
        self.name = name
        self.fields = fields


STR = ("str",)
INT = ("int", None)
BOOL = ("bool",)
FLOAT = ("float",)


def _null(kind: Any) -> tuple[str, Any]:
    return ("null", kind)


def _list(kind: Any) -> tuple[str, Any]:
    return ("list", kind)


def _literal(*values: str) -> tuple[str, tuple[str, ...]]:
    return ("literal", values)


def _required(name: str, *fields: tuple[str, str, Any]) -> Shape:
    return Shape(name, [(attr, wire, kind, True) for attr, wire, kind in fields])


TRACK = _literal("user", "agent")
SCOPE = _literal("user-global", "workspace")

ENTRY = _required(
    "Entry",
    ("id", "id", STR), ("track", "track", TRACK), ("scope", "scope", SCOPE),
    ("workspace_key", "workspaceKey", STR), ("agent_key", "agentKey", STR), ("text", "text", STR),
    ("source", "source", STR), ("tags", "tags", _list(STR)), ("version", "version", ("int", 1)),
    ("created_at", "createdAt", INT), ("updated_at", "updatedAt", INT),
    ("last_recalled", "lastRecalled", _null(INT)), ("recall_count", "recallCount", ("int", 0)),
    ("session_id", "sessionId", _null(STR)),
)
QUERY_RESULT = _required(
    "QueryResult", ("entries", "entries", _list(ENTRY)), ("total", "total", INT), ("truncated", "truncated", BOOL))
BUDGET_ROW = _required(
    "BudgetRow", ("track", "track", TRACK), ("scope", "scope", SCOPE), ("used", "used", ("int", 0)),
    ("limit", "limit", ("int", 0)))
STORE_INFO = _required("StoreInfo", ("path", "path", STR), ("schema_version", "schemaVersion", INT))
CLIENT_INFO = Shape("ClientInfo", [("name", "name", _null(STR), False), ("version", "version", _null(STR), False)])
CONNECTION_INFO = _required(
    "ConnectionInfo",
    ("id", "id", INT), ("transport", "transport", _literal("socket", "stdio", "mcp")), ("pid", "pid", _null(INT)),
    ("uid", "uid", _null(INT)), ("exe", "exe", _null(STR)), ("client", "client", _null(CLIENT_INFO)),
    ("approver", "approver", BOOL), ("opened_at", "openedAt", INT),
)
DAEMON_STATUS = _required(
    "DaemonStatus",
    ("version", "version", STR), ("uptime_s", "uptimeS", FLOAT), ("connections", "connections", INT),
    ("pending_approvals", "pendingApprovals", INT), ("queue_depth", "queueDepth", INT),
    ("store", "store", STORE_INFO), ("pid", "pid", INT), ("write_policy", "writePolicy", _literal("ask", "auto", "off")),
    ("socket", "socket", _null(STR)), ("config", "config", _null(STR)), ("log", "log", _null(STR)),
    ("connection_list", "connectionList", _list(CONNECTION_INFO)),
)

#: The result kind of each method the quick path calls (``memoryd_protocol.types.RESULTS``).
RESULTS: dict[str, Any] = {
    "memory/query": QUERY_RESULT,
    "memory/list": _list(ENTRY),
    "memory/budgets": _list(BUDGET_ROW),
    "daemon/status": DAEMON_STATUS,
}


_INF = float("inf")


def _utf8(value: str) -> bool:
    """Whether ``value`` is text msgspec decodes: json gives a lone surrogate for its UTF-8
    bytes (``surrogatepass``), msgspec refuses them."""
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def convert(kind: Any, value: Any) -> Any:
    """``value`` checked against ``kind``, objects turned into attribute objects; raises
    :class:`Mismatch` where it does not fit."""
    if isinstance(kind, Shape):
        if not isinstance(value, dict):
            raise Mismatch(kind.name)
        out = SimpleNamespace()
        for attr, wire, sub, required in kind.fields:
            if wire in value:
                setattr(out, attr, convert(sub, value[wire]))
            elif required:
                raise Mismatch(f"{kind.name}.{wire}")
            else:
                setattr(out, attr, None)
        return out
    tag = kind[0]
    if tag == "str":
        ok = isinstance(value, str) and (value.isascii() or _utf8(value))
    elif tag == "int":
        ok = isinstance(value, int) and not isinstance(value, bool) and (kind[1] is None or value >= kind[1])
    elif tag == "bool":
        ok = isinstance(value, bool)
    elif tag == "float":
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        try:
            value = float(value) if ok else value
        except OverflowError:  # an int past float's range
            raise Mismatch(tag) from None
        ok = ok and -_INF < value < _INF  # json's reading of 1e400 (msgspec: out of range)
    elif tag == "literal":
        ok = isinstance(value, str) and value in kind[1]
    elif tag == "null":
        return None if value is None else convert(kind[1], value)
    elif tag == "list":
        if not isinstance(value, list):
            raise Mismatch("list")
        return [convert(kind[1], v) for v in value]
    else:  # pragma: no cover - a kind this module does not define
        raise Mismatch(f"unknown kind {tag!r}")
    if not ok:
        raise Mismatch(tag)
    return value


__all__ = ["RESULTS", "Mismatch", "Shape", "convert"]
