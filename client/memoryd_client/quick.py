"""memoryctl's quick path: the read commands (:data:`LEAN_VERBS`) without --json, run on the
standard library alone. argparse, anyio and msgspec are most of memoryctl's start-up, and a
read command needs none of them.

:func:`quick_args` reads a plain command line as the parser does, :class:`Connection` makes
the call over a blocking socket (with the requests of :mod:`memoryd_client.calls`, as the
async client), the shapes check its result as msgspec checks the wire Struct, and
:func:`run_quick` prints it with the async path's render functions. tests/test_cli_quick.py
holds each part to its counterpart.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping
from types import SimpleNamespace

from memoryd_protocol import leanjson
from memoryd_protocol.constants import SCOPES, TRACKS
from memoryd_protocol.framing import OVERSIZE, Framer

from .calls import (
    MAX_LINE_BYTES,
    connect_failed,
    default_client,
    initialize_params,
    make_session,
    no_answer,
    query_params,
)
from .errors import ClientError, ConnectFailed, ConnectionClosed, ProtocolError
from .running import (
    EXIT_OK,
    PROG,
    Ctx,
    _seconds,
    _workspace,
    autostart,
    fail,
    only_layer,
    prepare,
    query_request,
    warn_db,
)

TYPE_CHECKING = False  # typing is not imported at run time: see memoryd_protocol.constants
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any, Final

# --- the command line ------------------------------------------------------------------

#: The read commands the quick path runs, unless --json is given: that JSON is msgspec's
#: rendering of the Structs, so it goes through the async client.
LEAN_VERBS = frozenset({"list", "query", "status", "budgets"})


#: the global options that take a value, by option word: the parser's dest
_GLOBAL_VALUES = {"--socket": "socket", "--db": "db", "--config": "config", "--timeout": "timeout",
                  "--workspace": "workspace", "--cwd": "workspace", "--agent": "agent", "--session": "session"}
#: the global flags, by option word: the parser's dest
_GLOBAL_FLAGS = {"--no-autostart": "no_autostart", "--json": "json", "-y": "yes", "--yes": "yes",
                 "--via-approver": "via_approver"}
#: each lean verb's own options that take a value (their choices; None: an int), its own
#: flags, and the defaults its parser sets
_VERB_VALUES: dict[str, dict[str, tuple[str, ...] | None]] = {
    "list": {"--track": TRACKS, "--scope": SCOPES}, "query": {"--track": TRACKS, "--scope": SCOPES, "--limit": None},
    "status": {}, "budgets": {}}
_VERB_FLAGS = {"query": ("--as-session",)}
_VERB_DEFAULTS: dict[str, dict[str, Any]] = {
    "list": {"track": None, "scope": None},
    "query": {"text": None, "track": None, "scope": None, "limit": None, "as_session": False},
    "status": {}, "budgets": {}}


def quick_args(argv: Sequence[str]) -> SimpleNamespace | None:
    """The Namespace the parser makes of ``argv``, read without argparse when ``argv`` is a
    plain read command of :data:`LEAN_VERBS` without --json: each word a global option (as
    spelled in full, with its value as the next word or after ``=``, not starting with
    ``-``), the verb, the verb's own options after it, and for query at most one TEXT. None
    for anything else (help, an abbreviation, another verb, an error): the parser reads
    that. Building a parser imports argparse and gettext and compiles regular expressions,
    a large part of a read command's start-up."""
    values: dict[str, Any] = {"socket": None, "db": None, "config": None, "no_autostart": False, "timeout": 30.0,
                              "json": False, "yes": False, "via_approver": False, "workspace": None, "agent": "",
                              "session": None}
    verb: str | None = None
    words = iter(argv)
    for word in words:
        if not word.startswith("-"):
            if verb is None:
                if word not in _VERB_DEFAULTS:
                    return None
                verb = word
                values["verb"] = verb
                values.update(_VERB_DEFAULTS[verb])
            elif verb == "query" and values["text"] is None:
                values["text"] = word
            else:
                return None
            continue
        if word in _GLOBAL_FLAGS:
            values[_GLOBAL_FLAGS[word]] = True
            continue
        if verb is not None and word in _VERB_FLAGS.get(verb, ()):
            values[word[2:].replace("-", "_")] = True
            continue
        name, eq, value = word.partition("=")
        own = _VERB_VALUES[verb] if verb is not None else {}
        if name not in _GLOBAL_VALUES and name not in own:
            return None
        if not eq:
            value = next(words, "-")
        if value.startswith("-") or (eq and not value):
            return None
        if name in _GLOBAL_VALUES:
            dest = _GLOBAL_VALUES[name]
            if dest == "timeout":
                seconds = _seconds(value)
                if seconds is None:
                    return None
                values[dest] = seconds
            else:
                values[dest] = value
            continue
        choices = own[name]
        if choices is None:
            try:
                values[name[2:]] = int(value)
            except ValueError:
                return None
        elif value in choices:
            values[name[2:]] = value
        else:
            return None
    if verb is None or values["json"]:
        return None
    return SimpleNamespace(**values)


# --- the connection --------------------------------------------------------------------

CHUNK: Final = 65536


def _from_wire(error: Any) -> ProtocolError:
    from memoryd_protocol.errors import from_wire  # only when the daemon says no

    return from_wire(error)


def _dumps(message: Mapping[str, Any]) -> str:
    """``json.dumps(message, ensure_ascii=False, separators=(",", ":"))``."""
    try:
        return leanjson.dumps(message)
    except leanjson.Unsure:
        import json

        return json.dumps(message, ensure_ascii=False, separators=(",", ":"))


def _loads(line: bytes) -> Any:
    """``json.loads(line, parse_constant=_no_constant)``, and ValueError for a line with a
    lone surrogate (which only json reads: leanjson leaves it)."""
    try:
        return leanjson.loads(line)
    except leanjson.Unsure:
        import json

        value = json.loads(line, parse_constant=_no_constant)
        if b"\\u" in line and _lone_surrogate(value):
            raise ValueError("not JSON: a lone UTF-16 surrogate") from None
        return value


def _lone_surrogate(value: Any) -> bool:
    """Whether a string of ``value`` holds a lone surrogate: json decodes its ``\\u`` escape,
    msgspec refuses the line, and the async client skips it as unreadable."""
    if isinstance(value, str):
        try:
            value.encode()
        except UnicodeEncodeError:
            return True
        return False
    if isinstance(value, dict):
        return any(_lone_surrogate(k) or _lone_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_lone_surrogate(v) for v in value)
    return False


def _no_constant(name: str) -> Any:
    """NaN and Infinity are not JSON (msgspec refuses the line): the line is unreadable."""
    raise ValueError(f"not JSON: {name}")


class Connection:
    """One blocking JSON-RPC connection to memoryd, initialized as the async client does
    (:func:`initialize_params`). :meth:`call` returns a result as plain JSON and raises what
    the async client raises: the protocol's typed errors, :class:`ConnectionClosed`,
    :class:`Timeout` (``timeout`` seconds per call, as ``connect(timeout=)``). Notifications
    are skipped: the read commands wait for nothing but their answer."""

    def __init__(self, path: str, *, timeout: float | None, session: Mapping[str, Any] | None,
                 client_name: str, approvals: bool) -> None:
        self.path = path
        self.timeout = timeout
        self.session = session
        self._ids = 0
        self._lines: list[bytes] = []
        self._framer = Framer(MAX_LINE_BYTES)
        #: the line of the last answer, and its place in a batch (None: not one)
        self._answer: tuple[bytes, int | None] = (b"", None)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        self._sock.settimeout(timeout)
        try:
            self._sock.connect(path)
        except TimeoutError as exc:  # as the async client words it (anyio.fail_after's TimeoutError)
            self._sock.close()
            raise connect_failed(path, TimeoutError()) from exc
        except OSError as exc:
            self._sock.close()
            raise connect_failed(path, exc) from exc
        try:
            self.server = self.call("initialize", initialize_params(
                "dsh-memory-protocol/v1", default_client(client_name), {"approvals": approvals}))
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, message: Mapping[str, Any]) -> None:
        try:
            self._sock.sendall(_dumps(message).encode() + b"\n")
        except OSError as exc:
            raise ConnectionClosed(f"connection to the daemon broke: {exc}") from None

    def _line(self, method: str, deadline: float | None) -> bytes:
        while not self._lines:
            if deadline is not None:
                self._sock.settimeout(max(deadline - time.monotonic(), 0.0))
            try:
                chunk = self._sock.recv(CHUNK)
            except TimeoutError:
                assert self.timeout is not None
                raise no_answer(method, self.timeout) from None
            except OSError as exc:
                raise ConnectionClosed(f"connection to the daemon broke: {exc}", {"method": method}) from None
            if not chunk:
                raise ConnectionClosed("connection closed by the daemon", {"method": method})
            for line in self._framer.feed(chunk):
                if line is OVERSIZE:
                    raise ConnectionClosed(f"the daemon sent a line longer than {MAX_LINE_BYTES} bytes",
                                           {"method": method})
                self._lines.append(line)
        return self._lines.pop(0)

    def call(self, method: str, params: Any) -> Any:
        """Send a request; its ``result`` as plain JSON, within ``timeout`` seconds of the
        send. As the async client does, skip an unreadable line, a notification and an
        answer to another id, and refuse a request from the daemon (v1 defines none)."""
        self._ids += 1
        request_id = self._ids
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        self._send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        while True:
            line = self._line(method, deadline)
            try:
                parsed = _loads(line)
            except ValueError:
                continue
            for at, msg in enumerate(parsed if isinstance(parsed, list) else [parsed]):
                if not isinstance(msg, dict):
                    continue
                if isinstance(msg.get("method"), str):
                    if "id" in msg:
                        self._send({"jsonrpc": "2.0", "id": msg["id"],
                                    "error": {"code": -32601, "message": f"method not found: {msg['method']}"}})
                    continue
                if type(msg.get("id")) is not int or msg["id"] != request_id:
                    continue
                if "error" in msg:
                    raise _from_wire(msg["error"])
                if "result" in msg:
                    self._answer = (line, at if isinstance(parsed, list) else None)
                    return msg["result"]

    def answer_result(self) -> bytes:
        """The last answer's ``result`` as the daemon wrote it, for msgspec to judge as the
        async client does (json reads more than msgspec: an out-of-range number, a lone
        surrogate's UTF-8 bytes). Imports msgspec: only for a result the shapes refused."""
        import msgspec

        line, at = self._answer
        if at is not None:
            line = msgspec.json.decode(line, type=list[msgspec.Raw])[at]
        return bytes(msgspec.json.decode(line, type=dict[str, msgspec.Raw])["result"])


# --- the shapes ------------------------------------------------------------------------
# A result comes as plain JSON (wire names). It is checked field by field against its wire
# Struct's shape (memoryd_protocol.types), as msgspec's decoder checks it, and turned into
# objects with the Structs' attribute names, so one renderer reads both paths' results. A
# kind is ("str",), ("int", minimum), ("float",), ("bool",), ("literal", values),
# ("list", kind), ("null", kind) (the kind or null), or a Shape.


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

#: The result kind of each method the quick path calls (``memoryd_protocol.methods.RESULTS``).
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


# --- the run ---------------------------------------------------------------------------


def _result(conn: Connection, method: str, params: dict[str, Any]) -> Any:
    """``method``'s result, checked against its shape (:data:`RESULTS`); one that does not
    fit is decoded by msgspec itself, as the async client decodes it (BAD_RESPONSE, or the
    Struct when the shape was stricter than msgspec)."""
    raw = conn.call(method, params)
    try:
        return convert(RESULTS[method], raw)
    except Mismatch:
        from .client import decode_result

        return decode_result(method, conn.answer_result())


def _quick(ctx: Ctx, conn: Connection) -> str:
    """A lean verb's call and its human output (the same render functions as
    memoryd_client.commands')."""
    from . import render

    a = ctx.args
    if a.verb == "query":
        return render.query_result(_result(conn, "memory/query", query_params(*query_request(ctx, conn.session))),
                                   fit=ctx.fit)
    if a.verb == "list":
        return render.entry_list(only_layer(_result(conn, "memory/list", {}), a), fit=ctx.fit)
    if a.verb == "budgets":
        return render.budgets_table(_result(conn, "memory/budgets", {}))
    assert a.verb == "status", a.verb
    return render.status_lines(_result(conn, "daemon/status", {}), socket=ctx.socket)


def run_quick(ctx: Ctx) -> int:
    """A verb of :data:`LEAN_VERBS`, without --json: connect (autostarting a daemon as
    memoryd_client.commands.run does), one call, its table."""
    a = ctx.args
    session = make_session(a.session or f"memoryctl-{os.getpid()}", cwd=_workspace(a), agent_preset=a.agent)
    autostarted = False
    try:
        prepare(ctx)
        while True:
            try:
                with Connection(ctx.socket, timeout=a.timeout, session=session, client_name=PROG,
                                approvals=not a.via_approver) as conn:
                    if a.db and not autostarted:
                        try:
                            warn_db(ctx, _result(conn, "daemon/status", {}).store.path)
                        except (ProtocolError, ClientError):
                            pass  # as the async path: no answer, no warning
                    ctx.out(_quick(ctx, conn))
                    return EXIT_OK
            except ConnectFailed as exc:
                autostart(ctx, exc, autostarted)
            autostarted = True
    except Exception as exc:
        return fail(ctx, exc)


__all__ = ["LEAN_VERBS", "RESULTS", "Connection", "Mismatch", "Shape", "convert", "quick_args", "run_quick"]
