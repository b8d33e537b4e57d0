"""The client's standard-library half: what a call sends, and a blocking connection that
reads plain JSON, for ``memoryctl``'s read commands.

``memoryctl query`` does a few milliseconds of work. Through the async client it first
imports anyio, asyncio, msgspec and every wire Struct, which made it 13× ``python -c pass``.
So the read commands (:data:`memoryd_client.cli.LEAN_VERBS`) take this path
instead: ``socket`` only, with :mod:`memoryd_protocol.leanjson` for the JSON of short
lines (``json``, with the ``re`` it imports, was a tenth of ``python -c pass``; it is
imported for a line leanjson leaves to it). The async :class:`~memoryd_client.client.Client`
builds its requests with the same functions (:func:`make_session`,
:func:`initialize_params`, :func:`query_opts`, :func:`query_params`), so both paths send the
same requests, and both frame lines with :class:`memoryd_protocol.framing.Framer`.

Results come back as plain JSON (wire names); :mod:`memoryd_client.shapes` checks them and
gives them the Structs' attribute names, so one renderer serves both paths.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Mapping

from memoryd_protocol import __version__ as __version__
from memoryd_protocol import leanjson
from memoryd_protocol.framing import OVERSIZE, Framer

from .errors import ConnectFailed, ConnectionClosed, Timeout

TYPE_CHECKING = False  # typing is not imported at run time: see memoryd_protocol.constants
if TYPE_CHECKING:
    from typing import Any, Final

    from memoryd_protocol.errors import ProtocolError

#: The longest line the client buffers. The daemon's own limit is 4 MiB per message it
#: accepts; its answers (an export of 1000 entries) can be larger, so the client allows more.
MAX_LINE_BYTES: Final = 64 * 1024 * 1024
CHUNK: Final = 65536


def make_session(id: str, *, cwd: str | None = None, agent_preset: str | None = None) -> dict[str, Any]:
    """A session object ``{id, header: {cwd, agentPreset}}`` for ``connect(session=...)``."""
    header: dict[str, Any] = {}
    if cwd is not None:
        header["cwd"] = cwd
    if agent_preset is not None:
        header["agentPreset"] = agent_preset
    return {"id": id, "header": header} if header else {"id": id}


def initialize_params(protocol: str, client: Any, capabilities: Any) -> dict[str, Any]:
    """``initialize``'s params; ``client`` and ``capabilities`` as plain JSON."""
    return {"protocol": protocol, "client": client, "capabilities": capabilities}


def default_client(name: str) -> dict[str, Any]:
    """The ``client`` an ``initialize`` names by default: ``name`` at this package's version."""
    return {"name": name, "version": __version__}


def query_opts(session: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The ``opts`` a query sends by default: the session's visible set (``agentKey`` = its
    ``agentPreset`` or ``''``, ``workspaceKey`` = its ``cwd`` or ``''``) and, when the session
    has an id, ``sessionId`` (the daemon then audits the recall and sends
    ``memory/recalled``). None without a session: the whole store."""
    if session is None:
        return None
    header = session.get("header")
    header = header if isinstance(header, Mapping) else {}
    opts: dict[str, Any] = {}
    session_id = session.get("id")
    if session_id is not None:
        opts["sessionId"] = session_id
    agent = header.get("agentPreset")
    opts["agentKey"] = agent if agent is not None else ""
    cwd = header.get("cwd")
    opts["workspaceKey"] = cwd if cwd is not None else ""
    return opts


def query_params(filter: Any, opts: Any) -> dict[str, Any]:
    """``memory/query``'s params (``filter`` and ``opts`` as given, None: left out)."""
    params: dict[str, Any] = {}
    if filter is not None:
        params["filter"] = filter
    if opts is not None:
        params["opts"] = opts
    return params


def connect_failed(path: str, exc: OSError) -> ConnectFailed:
    """The :class:`ConnectFailed` for a connect to ``path`` that raised ``exc``."""
    reason = exc.strerror or str(exc) or type(exc).__name__
    return ConnectFailed(f"cannot connect to memoryd at {path}: {reason}", {"path": path, "errno": exc.errno})


def no_answer(method: str, timeout: float) -> Timeout:
    return Timeout(f"{method}: no answer from memoryd within {timeout}s", {"method": method, "timeout": timeout})


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


__all__ = ["Connection", "default_client", "initialize_params", "make_session", "query_opts", "query_params"]
