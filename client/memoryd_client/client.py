"""The async client: one JSON-RPC 2.0 connection to memoryd over its Unix socket.

Layers, bottom up:

* framing: NDJSON, one message per line (wire-v1.md §1);
* a reader task that routes each line by shape: a notification (``method``, no ``id``) goes to
  the event listeners and the approval handler, a response (``id`` with ``result``/``error``)
  wakes the call waiting for it in the pending table;
* typed methods, one per daemon method (§4), decoding results into the protocol's msgspec
  Structs (decoders built once, at import) and errors into the protocol's typed exceptions.

The pending table follows the MCP python-sdk shape: one entry per call keyed by id, the wait
under a deadline, a ``finally`` that removes the entry on every path (so a late answer is
dropped, not leaked), and every waiter woken with :class:`ConnectionClosed` when the
connection drops.
"""

from __future__ import annotations

import builtins
import inspect
import itertools
import logging
import math
import socket
import struct
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeAlias

import anyio
import msgspec
from anyio.abc import SocketAttribute, SocketStream, TaskGroup
from memoryd_protocol import types as T
from memoryd_protocol.constants import ALLOWED_ONCE, DEFAULT_MAX_MESSAGE_BYTES, PROTOCOL
from memoryd_protocol.errors import InvalidInput, ProtocolError, from_wire
from memoryd_protocol.framing import OVERSIZE, Framer
from memoryd_protocol.methods import METHODS
from memoryd_protocol.paths import default_socket_path

from .calls import (
    MAX_LINE_BYTES,
    __version__,
    connect_failed,
    default_client,
    initialize_params,
    make_session,
    no_answer,
    query_opts,
    query_params,
)
from .errors import BadResponse, ClientError, ConnectionClosed, Timeout

log = logging.getLogger("memoryd_client")

#: Events buffered per :meth:`Client.events` stream before new ones are dropped (logged).
EVENT_BUFFER: Final = 10_000

#: The write methods: the ones that can ask for approval (the methods table says which).
WRITE_METHODS: Final = frozenset(name for name, m in METHODS.items() if m.parks)
#: Every notification the daemon sends (wire-v1.md §5, §6).
EVENT_METHODS: Final = frozenset(T.NOTIFICATIONS)
#: The events :meth:`Client.watch` subscribes to, for ``c.events(*WATCH_EVENTS)``.
WATCH_EVENTS: Final = ("memory/added", "memory/updated", "memory/removed")

JSON: TypeAlias = Any
#: A session: ``{"id": ..., "header": {"cwd": ..., "agentPreset": ...}}``, a ``types.Session``,
#: or just the id.
SessionLike: TypeAlias = "Mapping[str, Any] | T.Session | str"
#: ``on_approval(asked)`` or ``on_approval(asked, call)``: ``call`` is the :class:`ApprovalCall`
#: that asked, or None.
ApprovalHandler: TypeAlias = (
    "Callable[[T.ApprovalAsked], str | bool | Decision | Awaitable[str | bool | Decision | None] | None]"
    " | Callable[[T.ApprovalAsked, ApprovalCall | None],"
    " str | bool | Decision | Awaitable[str | bool | Decision | None] | None]"
)
Listener: TypeAlias = "Callable[[Event], Any]"

_DEFAULT: Any = object()  # "use the connection's timeout"


class _AskedBy(msgspec.Struct, rename="camel"):
    """The one field of ``approval/asked`` that routes it to a call of this connection."""

    request_id: int | str | None = None


class _Message(msgspec.Struct):
    """An incoming line, typed only as far as routing needs; params/result stay raw."""

    jsonrpc: str | msgspec.UnsetType = msgspec.UNSET
    id: int | str | msgspec.UnsetType | None = msgspec.UNSET
    method: str | msgspec.UnsetType = msgspec.UNSET
    params: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    result: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    error: Any = msgspec.UNSET


_ENCODER: Final = msgspec.json.Encoder()
_MESSAGE: Final = msgspec.json.Decoder(_Message)
_BATCH: Final = msgspec.json.Decoder(list[msgspec.Raw])
_ANY: Final = msgspec.json.Decoder()
_ASKED_BY: Final = msgspec.json.Decoder(_AskedBy)
_RESULT_DECODERS: Final[dict[str, msgspec.json.Decoder[Any]]] = {
    method: msgspec.json.Decoder(rtype) for method, rtype in T.RESULTS.items()
}
_EVENT_DECODERS: Final[dict[str, msgspec.json.Decoder[Any]]] = {
    method: msgspec.json.Decoder(ptype) for method, ptype in T.NOTIFICATIONS.items()
}


#: A client-side event (not a daemon notification): this connection answered an approval.
#: Its params are a :class:`Decided`; with ``approval/asked`` it is the approval pair a
#: harness appends to its session log.
DECIDED: Final = "approval/decided"


@dataclass(frozen=True, slots=True)
class Decided:
    """What this client answered to ``approval/asked`` ``id``; ``refused`` is the error code
    when the daemon did not take the decision (already decided elsewhere, timed out)."""

    id: str
    outcome: str
    refused: str | None = None
    #: who decided, as this client claimed it in ``approval/decided``
    by: T.ApprovalBy | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    """What an approval handler may return instead of a bare outcome: the outcome, and who
    decided (``approval/decided``'s ``by``: a human at a prompt, a policy, a script), which
    the daemon keeps with the decision. ``by`` may be a :class:`types.ApprovalBy` or a mapping
    ``{"kind": ..., "name": ...}``."""

    outcome: str | bool
    by: T.ApprovalBy | Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class ApprovalCall:
    """The call of this connection that an ``approval/asked`` is about: the ask's
    ``requestId`` is that request's JSON-RPC id. ``params`` are the params as sent (plain
    JSON). A two-argument approval handler gets it (None when the ask names no call of this
    connection, e.g. at an approver)."""

    request_id: int | str
    method: str
    params: Any


@dataclass(frozen=True, slots=True)
class Event:
    """One notification from the daemon. ``params`` is the protocol Struct for known methods
    (``types.MemoryAdded``, ``types.ApprovalAsked``, ...), plain JSON for anything else."""

    method: str
    params: Any


def decode_result(method: str, raw: bytes | msgspec.Raw) -> Any:
    """A ``result`` as ``method``'s protocol Struct (``types.RESULTS``; plain JSON for a
    method it does not name); :class:`BadResponse` when it does not fit."""
    try:
        return _RESULT_DECODERS.get(method, _ANY).decode(raw)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise BadResponse(
            f"{method} result does not fit the wire contract: {exc}",
            {"method": method, "result": bytes(raw).decode("utf-8", "replace")[:2000]},
        ) from None


def plain(value: Any) -> Any:
    """A protocol Struct (or anything containing one) as plain JSON data, ``None`` fields left
    out; dicts and lists pass through with their Structs converted."""
    if isinstance(value, msgspec.Struct):
        return _drop_none(msgspec.to_builtins(value))
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def _drop_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v) for v in value]
    return value


def _session(value: SessionLike | None) -> dict[str, Any] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return {"id": value}
    out = plain(value)
    if not isinstance(out, dict):
        raise TypeError(f"session must be a mapping, a types.Session or an id string, not {type(value).__name__}")
    return out


def _takes_call(handler: Callable[..., Any]) -> bool:
    """Whether an approval handler takes a second positional argument (the asking call);
    one-argument handlers keep working as they are."""
    try:
        params = inspect.signature(handler).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = 0
    for p in params:
        if p.kind is inspect.Parameter.VAR_POSITIONAL:
            return True
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
            positional += 1
    return positional >= 2


def _by(value: T.ApprovalBy | Mapping[str, Any] | None) -> T.ApprovalBy | None:
    return value if value is None or isinstance(value, T.ApprovalBy) else msgspec.convert(value, T.ApprovalBy)


def _outcome(value: Any) -> str:
    """What a handler returned, as an approval outcome: ``True`` approves, a string is sent as
    is (only ``"allowed-once"`` lets the write through), anything else rejects."""
    if isinstance(value, Decision):
        return _outcome(value.outcome)
    if value is True:
        return ALLOWED_ONCE
    if isinstance(value, str) and value:
        return value
    return "rejected"


class _Pending:
    __slots__ = ("done", "error", "method", "params", "result", "scope", "timeout")

    def __init__(self, method: str, params: Any = None) -> None:
        self.method = method
        self.params = params
        self.done = anyio.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self.scope: anyio.CancelScope | None = None
        self.timeout: float = math.inf


class EventStream:
    """Events as an async iterator (and a queue: :meth:`receive`). Subscribed from creation
    on, so nothing sent after ``c.events()`` returns is missed; ends when the connection
    closes (after the buffered events) or on :meth:`close`."""

    def __init__(self, client: Client, methods: frozenset[str]) -> None:
        self._client = client
        self.methods = methods
        self._buffer: deque[Event] = deque()
        self._wakeup = anyio.Event()
        self._ended = client.closed
        if not self._ended:
            client._streams.append(self)

    def _offer(self, event: Event) -> None:
        if self._ended or (self.methods and event.method not in self.methods):
            return
        if len(self._buffer) >= EVENT_BUFFER:
            log.warning("event stream full (%d); dropping %s", EVENT_BUFFER, event.method)
            return
        self._buffer.append(event)
        self._wakeup.set()

    def _end(self) -> None:
        self._ended = True
        self._wakeup.set()

    async def _next(self) -> Event | None:
        while not self._buffer:
            if self._ended:
                return None
            self._wakeup = anyio.Event()
            await self._wakeup.wait()
        return self._buffer.popleft()

    async def receive(self, timeout: float | None = None) -> Event:  # noqa: ASYNC109 - a queue's receive(timeout)
        """The next event; :class:`Timeout` after ``timeout`` seconds, :class:`ConnectionClosed`
        once the stream has ended."""
        try:
            with anyio.fail_after(timeout):
                event = await self._next()
        except TimeoutError:
            raise Timeout(f"no event within {timeout}s", {"timeout": timeout}) from None
        if event is None:
            raise ConnectionClosed("event stream ended")
        return event

    def close(self) -> None:
        """Stop receiving; buffered events are dropped."""
        with suppress(ValueError):
            self._client._streams.remove(self)
        self._buffer.clear()
        self._end()

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> Event:
        event = await self._next()
        if event is None:
            raise StopAsyncIteration
        return event

    async def __aenter__(self) -> EventStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


class Client:
    """One connection to memoryd. Make it with :func:`connect`; every method is a coroutine.

    Results are protocol Structs (``types.WriteResult``, ``list[types.Entry]``, ...);
    failures raise the protocol's typed exceptions (``BudgetExceeded``, ``WriteDenied``, ...)
    or a :class:`ClientError` (``ConnectionClosed``, ``Timeout``).
    """

    def __init__(
        self,
        stream: SocketStream,
        *,
        session: SessionLike | None = None,
        approvals: bool = True,
        on_approval: ApprovalHandler | None = None,
        client_name: str = "memoryd-client",
        timeout: float | None = 30.0,
        path: Path | None = None,
    ) -> None:
        self._stream = stream
        self._send_lock = anyio.Lock()
        self._ids = itertools.count(1)
        self._pending: dict[int | str, _Pending] = {}
        self._listeners: dict[str, list[Listener]] = {}
        self._streams: list[EventStream] = []
        self._asks: dict[str, anyio.CancelScope] = {}
        self._deciding = 0
        self._closed: str | None = None
        self._closed_event = anyio.Event()
        self._tg: TaskGroup | None = None
        self.path = path
        self.session = _session(session)
        self.approvals = approvals
        self.on_approval = on_approval
        self.client_name = client_name
        self.timeout = timeout
        #: The daemon's default line limit (``max_message_bytes``); raise it to match a
        #: daemon configured with a larger one.
        self.max_message_bytes = DEFAULT_MAX_MESSAGE_BYTES
        #: The daemon's ``initialize`` answer (set by :func:`connect`).
        self.server: T.InitializeResult | None = None

    # --- connection state --------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed is not None

    @property
    def peer_pid(self) -> int | None:
        """The daemon's process id, from the socket's peer credentials (Linux), else None."""
        try:
            raw: socket.socket = self._stream.extra(SocketAttribute.raw_socket)
            creds = raw.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        except (AttributeError, OSError, anyio.TypedAttributeLookupError):
            return None
        pid, _uid, _gid = struct.unpack("3i", creds)
        return pid or None

    @property
    def close_reason(self) -> str | None:
        """Why the connection ended (``"connection closed by the daemon"`` on EOF), or None."""
        return self._closed

    async def wait_closed(self) -> None:
        """Return once the connection has ended: EOF from the daemon, a broken connection,
        or :meth:`aclose`. ``close_reason`` says which."""
        await self._closed_event.wait()

    async def aclose(self) -> None:
        """Close the connection; waiting calls fail with :class:`ConnectionClosed`."""
        self._shutdown("connection closed by the client")
        with anyio.CancelScope(shield=True):
            await self._stream.aclose()

    def _shutdown(self, reason: str) -> None:
        if self._closed is not None:
            return
        self._closed = reason
        self._closed_event.set()
        for pending in builtins.list(self._pending.values()):
            if not pending.done.is_set():
                pending.error = ConnectionClosed(reason, {"method": pending.method})
                pending.done.set()
        for stream in builtins.list(self._streams):
            stream._end()
        self._streams.clear()

    # --- events ------------------------------------------------------------------------

    def on(self, method: str, callback: Listener) -> Callable[[], None]:
        """Call ``callback(event)`` for every notification ``method`` (``"*"``: all of them).

        A plain function runs inline in the reader (keep it short, do not block); a coroutine
        function runs as its own task. Exceptions are logged, never propagated. Returns a
        function that removes the listener.
        """
        self._listeners.setdefault(method, []).append(callback)

        def off() -> None:
            with suppress(ValueError):
                self._listeners.get(method, []).remove(callback)

        return off

    def events(self, *methods: str) -> EventStream:
        """An :class:`EventStream` of the given notifications (all of them when none given)."""
        return EventStream(self, frozenset(methods))

    def _emit(self, event: Event) -> None:
        for stream in builtins.list(self._streams):
            stream._offer(event)
        for callback in (*self._listeners.get(event.method, ()), *self._listeners.get("*", ())):
            if inspect.iscoroutinefunction(callback):
                self._spawn(self._guarded, callback, event)
                continue
            try:
                result = callback(event)
            except Exception:
                log.exception("event listener for %s failed", event.method)
                continue
            if inspect.isawaitable(result):
                self._spawn(self._await_guarded, result, event.method)

    async def _guarded(self, callback: Listener, event: Event) -> None:
        try:
            await callback(event)
        except Exception:
            log.exception("event listener for %s failed", event.method)

    async def _await_guarded(self, awaitable: Awaitable[Any], method: str) -> None:
        try:
            await awaitable
        except Exception:
            log.exception("event listener for %s failed", method)

    def _spawn(self, func: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> None:
        if self._tg is None:
            log.warning("no task group; dropping %s", getattr(func, "__name__", func))
            return
        self._tg.start_soon(func, *args)

    # --- reading -----------------------------------------------------------------------

    async def _read_loop(self) -> None:
        lines = Framer(MAX_LINE_BYTES)
        reason = "connection closed by the daemon"
        try:
            while True:
                try:
                    chunk = await self._stream.receive(65536)
                except anyio.EndOfStream:
                    break
                except anyio.ClosedResourceError:
                    reason = self._closed or "connection closed by the client"
                    break
                except (anyio.BrokenResourceError, OSError) as exc:
                    reason = f"connection to the daemon broke: {exc}"
                    break
                got = lines.feed(chunk)
                oversize = lines.discarding or OVERSIZE in got
                for line in got:
                    if line is OVERSIZE:
                        break
                    self._dispatch(line)
                if oversize:  # the first byte over the limit ends the connection
                    reason = f"the daemon sent a line longer than {MAX_LINE_BYTES} bytes"
                    break
        except Exception as exc:  # a bug here must not hang every caller
            log.exception("memoryd_client reader failed")
            reason = f"client reader failed: {exc!r}"
        finally:
            self._shutdown(reason)

    def _dispatch(self, line: bytes) -> None:
        try:
            if line.lstrip()[:1] == b"[":
                for raw in _BATCH.decode(line):
                    self._route(_MESSAGE.decode(raw))
            else:
                self._route(_MESSAGE.decode(line))
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.warning("unreadable line from memoryd (%s): %.200r", exc, line)

    def _route(self, msg: _Message) -> None:
        if isinstance(msg.method, str):
            if msg.id is msgspec.UNSET:
                self._on_notification(msg.method, msg.params)
            else:  # a server→client request: v1 defines none
                self._spawn(self._refuse_request, msg.id, msg.method)
            return
        if msg.id is msgspec.UNSET or (msg.result is msgspec.UNSET and msg.error is msgspec.UNSET):
            log.warning("message from memoryd that is neither a response nor a notification: %r", msg)
            return
        pending = self._pending.get(msg.id) if msg.id is not None else None
        if pending is None:
            if msg.error is not msgspec.UNSET:
                log.warning("memoryd error for request %r: %r", msg.id, msg.error)
            else:
                log.debug("dropping late response %r", msg.id)
            return
        if pending.done.is_set():
            return
        if msg.error is not msgspec.UNSET:
            pending.error = from_wire(msg.error)
        else:
            assert isinstance(msg.result, msgspec.Raw)
            try:
                pending.result = decode_result(pending.method, msg.result)
            except BadResponse as exc:
                pending.error = exc
        pending.done.set()

    async def _refuse_request(self, id: Any, method: str) -> None:
        with suppress(ClientError):
            await self._send(
                {"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": f"method not found: {method}"}}
            )

    def _on_notification(self, method: str, raw: msgspec.Raw | msgspec.UnsetType) -> None:
        data = raw if isinstance(raw, msgspec.Raw) else b"null"
        decoder = _EVENT_DECODERS.get(method)
        params: Any
        try:
            params = decoder.decode(data) if decoder is not None else _ANY.decode(data)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            log.warning("%s params do not fit the wire contract: %s", method, exc)
            try:
                params = _ANY.decode(data)
            except msgspec.DecodeError:
                params = None
        if method == "approval/asked":
            ask_id = params.id if isinstance(params, T.ApprovalAsked) else (params or {}).get("id")
            if isinstance(ask_id, str):
                scope = anyio.CancelScope()
                self._asks[ask_id] = scope
                self._spawn(self._answer_approval, ask_id, params, scope, self._asking_call(data))
        elif method == "approval/resolved":
            rid = params.id if isinstance(params, T.ApprovalResolved) else (params or {}).get("id")
            asking = self._asks.pop(rid, None) if isinstance(rid, str) else None
            if asking is not None:  # decided elsewhere (another approver, a timeout): stop asking
                asking.cancel()
        self._emit(Event(method, params))

    # --- approvals ---------------------------------------------------------------------

    def _pause_clocks(self) -> None:
        self._deciding += 1
        for pending in self._pending.values():
            if pending.scope is not None:
                pending.scope.deadline = math.inf

    def _restart_clocks(self) -> None:
        self._deciding -= 1
        if self._deciding == 0:
            now = anyio.current_time()
            for pending in self._pending.values():
                if pending.scope is not None:
                    pending.scope.deadline = now + pending.timeout

    def _asking_call(self, raw: bytes | msgspec.Raw) -> ApprovalCall | None:
        """The in-flight call an ``approval/asked`` names by its ``requestId``, if any."""
        try:
            request_id = _ASKED_BY.decode(raw).request_id
        except (msgspec.ValidationError, msgspec.DecodeError):
            return None
        pending = self._pending.get(request_id) if request_id is not None else None
        if pending is None or request_id is None:
            return None
        return ApprovalCall(request_id=request_id, method=pending.method, params=pending.params)

    async def _answer_approval(
        self, ask_id: str, asked: Any, scope: anyio.CancelScope, call: ApprovalCall | None = None
    ) -> None:
        outcome, by = "rejected", None
        self._pause_clocks()
        try:
            with scope:
                outcome, by = await self._decide(asked, call)
        finally:
            self._restart_clocks()
            self._asks.pop(ask_id, None)
        if scope.cancel_called:  # decided elsewhere (approval/resolved): nothing to answer
            return
        refused: str | None = None
        try:
            await self.approval_decided(ask_id, outcome, by)
        except ProtocolError as exc:  # late: another approver or the daemon's timeout decided
            log.info("decision for approval %s refused: %s", ask_id, exc)
            refused = exc.code
        except ClientError as exc:
            refused = exc.code
        self._emit(Event(DECIDED, Decided(id=ask_id, outcome=outcome, refused=refused, by=by)))

    async def _decide(self, asked: Any, call: ApprovalCall | None = None) -> tuple[str, T.ApprovalBy | None]:
        handler = self.on_approval
        if handler is None:
            log.info("approval asked with no handler: rejecting (fail closed)")
            return "rejected", None
        if not isinstance(asked, T.ApprovalAsked):
            log.warning("approval/asked does not fit the wire contract: rejecting")
            return "rejected", None
        args: tuple[Any, ...] = (asked, call) if _takes_call(handler) else (asked,)
        try:
            if inspect.iscoroutinefunction(handler):
                result = await handler(*args)
            else:
                result = await anyio.to_thread.run_sync(handler, *args, abandon_on_cancel=True)
            if inspect.isawaitable(result):
                result = await result
            by = _by(result.by) if isinstance(result, Decision) else None
        except Exception:
            log.exception("approval handler failed: rejecting")
            return "rejected", None
        return _outcome(result), by

    # --- calling -----------------------------------------------------------------------

    async def _send(self, message: Mapping[str, Any]) -> None:
        if self._closed is not None:
            raise ConnectionClosed(self._closed)
        data = _ENCODER.encode(message) + b"\n"
        if len(data) > self.max_message_bytes:
            # The daemon would discard the line and answer with id null, which no call can
            # be matched to: refuse it here, at once, with the daemon's own error code.
            raise InvalidInput(
                f"request of {len(data)} bytes exceeds the {self.max_message_bytes}-byte message limit", "params"
            )
        async with self._send_lock:
            try:
                await self._stream.send(data)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
                self._shutdown(f"connection to the daemon broke: {exc}")
                raise ConnectionClosed(self._closed or str(exc)) from None

    async def notify(self, method: str, params: Any = None) -> None:
        """Send a notification (no answer expected)."""
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = plain(params)
        await self._send(message)

    async def call(self, method: str, params: Any = None, *, timeout: float | None = _DEFAULT) -> Any:  # noqa: ASYNC109
        """Send a request and wait for its answer.

        The result is decoded with the protocol's type for ``method`` (``types.RESULTS``);
        unknown methods give plain JSON. ``timeout`` (seconds, ``None`` = wait forever)
        defaults to the connection's; the clock stops while this connection's approval
        handler is deciding, since the daemon holds the write until then.
        """
        if timeout is _DEFAULT:
            timeout = self.timeout
            if not self.approvals and method in WRITE_METHODS:
                timeout = None  # a remote approver decides; the daemon bounds that wait itself
        if self._closed is not None:
            raise ConnectionClosed(self._closed, {"method": method})
        request_id = next(self._ids)
        pending = _Pending(method)
        self._pending[request_id] = pending
        try:
            message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
            message["params"] = pending.params = plain(params) if params is not None else {}
            await self._send(message)
            if timeout is None:
                await pending.done.wait()
            else:
                pending.timeout = timeout
                pending.scope = anyio.CancelScope(
                    deadline=math.inf if self._deciding else anyio.current_time() + timeout
                )
                with pending.scope:
                    await pending.done.wait()
                if not pending.done.is_set():
                    raise no_answer(method, timeout)
        finally:
            self._pending.pop(request_id, None)
        if pending.error is not None:
            raise pending.error
        return pending.result

    def _write(self, write: Any) -> Any:
        if write is not None:
            return plain(write)
        if self.session is not None:
            return {"agent": {"session": self.session}}
        return None

    async def _write_call(self, method: str, params: dict[str, Any], write: Any) -> Any:
        context = self._write(write)
        if context is not None:
            params["write"] = context
        return await self.call(method, params)

    # --- the daemon's methods (wire-v1.md §4) ------------------------------------------

    async def initialize(
        self,
        protocol: str = PROTOCOL,
        client: Mapping[str, Any] | T.ClientInfo | None = None,
        capabilities: Mapping[str, Any] | T.Capabilities | None = None,
    ) -> T.InitializeResult:
        params = initialize_params(
            protocol,
            plain(client) if client is not None else default_client(self.client_name),
            plain(capabilities) if capabilities is not None else {"approvals": self.approvals},
        )
        result: T.InitializeResult = await self.call("initialize", params)
        self.server = result
        return result

    async def add(self, input: Mapping[str, Any] | T.EntryInput, write: Any = None) -> T.WriteResult:
        return await self._write_call("memory/add", {"input": input}, write)  # type: ignore[no-any-return]

    async def replace(self, input: Mapping[str, Any] | T.ReplaceInput, write: Any = None) -> T.ReplaceResult:
        return await self._write_call("memory/replace", {"input": input}, write)  # type: ignore[no-any-return]

    async def remove(self, input: Mapping[str, Any] | T.RemoveInput, write: Any = None) -> T.WriteResult:
        return await self._write_call("memory/remove", {"input": input}, write)  # type: ignore[no-any-return]

    async def consolidate(
        self, input: Mapping[str, Any] | T.ConsolidateInput, write: Any = None
    ) -> T.ConsolidateResult:
        return await self._write_call("memory/consolidate", {"input": input}, write)  # type: ignore[no-any-return]

    async def seed(self, inputs: Sequence[Mapping[str, Any] | T.EntryInput], write: Any = None) -> T.SeedResult:
        return await self._write_call("memory/seed", {"inputs": builtins.list(inputs)}, write)  # type: ignore[no-any-return]

    @property
    def query_opts(self) -> dict[str, Any] | None:
        """The ``opts`` :meth:`query` sends by default: the connection's session's visible set
        (``agentKey`` = its ``agentPreset`` or ``''``, ``workspaceKey`` = its ``cwd`` or ``''``)
        and, when the session has an id, ``sessionId`` (the daemon then audits the recall and
        sends ``memory/recalled``). None without a session: the whole store."""
        return query_opts(self.session)

    async def query(
        self,
        filter: Mapping[str, Any] | T.QueryFilter | None = None,
        opts: Mapping[str, Any] | T.QueryOpts | None = _DEFAULT,
    ) -> T.QueryResult:
        """``memory/query``. Without ``opts``, a connection with a session sees only that
        session's visible set (:attr:`query_opts`); pass ``opts`` to choose, ``None`` (or
        ``{}``) for the whole store."""
        if opts is _DEFAULT:
            opts = self.query_opts
        return await self.call("memory/query", query_params(filter, opts))  # type: ignore[no-any-return]

    async def budgets(self) -> builtins.list[T.BudgetRow]:
        return await self.call("memory/budgets", {})  # type: ignore[no-any-return]

    async def list(self) -> builtins.list[T.Entry]:
        return await self.call("memory/list", {})  # type: ignore[no-any-return]

    async def audit_list(self, limit: int | None = None) -> builtins.list[T.AuditRow]:
        return await self.call("audit/list", {} if limit is None else {"limit": limit})  # type: ignore[no-any-return]

    async def audit_verify(self) -> T.LedgerReport:
        """``audit/verify``: the daemon checks the ledger's hash chain, that every audit row
        since the chain's start is in it unchanged, and that replaying it gives the live
        entries. ``ok`` False names the breaks in ``problems``, the first one first."""
        return await self.call("audit/verify", {})  # type: ignore[no-any-return]

    async def audit_explain(self, target: str) -> T.EntryLife:
        """``audit/explain``: one entry's life, from the ledger. ``target`` is the entry's id,
        or a text that exactly one entry contains (case-insensitive; a live entry first, else
        one the ledger knows, a removed one say). No entry, or several: INVALID_INPUT with
        ``details.field`` "target"."""
        return await self.call("audit/explain", {"target": target})  # type: ignore[no-any-return]

    async def snapshot(self, session: SessionLike | None = None, language: str | None = None) -> T.SnapshotResult:
        """The frozen snapshot for ``session`` (default: the connection's session)."""
        params: dict[str, Any] = {"session": _session(session) if session is not None else self.session}
        if language is not None:
            params["language"] = language
        return await self.call("memory/snapshot", params)  # type: ignore[no-any-return]

    async def watch(self, session: SessionLike | None = None) -> T.Empty:
        """``memory/watch``: from now on this connection also gets ``memory/added``,
        ``memory/updated`` and ``memory/removed`` for other connections' writes of entries
        ``session`` (default: the connection's) sees, each with the writer's ``session_id``.
        Receive them as any event: :meth:`on` or :meth:`events` (:data:`WATCH_EVENTS`)."""
        params = {"session": _session(session) if session is not None else self.session}
        return await self.call("memory/watch", params)  # type: ignore[no-any-return]

    async def export(self, adapter: str | None = None) -> Any:
        """The ``memory-export-v1`` envelope (a dict), or the adapter's document."""
        return await self.call("memory/export", {} if adapter is None else {"adapter": adapter})

    async def import_(
        self,
        envelope: Any = None,
        adapter: str | None = None,
        payload: Any = None,
        write: Any = None,
        *,
        skip_existing: bool | None = None,
    ) -> T.SeedResult:
        """Import an export envelope (``plugin`` "dsh-memento", ``schema`` "memory-export-v1",
        else INVALID_INPUT), or an adapter's ``payload`` (``adapter=`` given).

        ``skip_existing=True`` leaves out entries whose track, scope, workspaceKey, agentKey
        and text already exist (``result.skipped`` counts them); when that is all of them,
        nothing is written and no approval is asked.
        """
        params: dict[str, Any] = {}
        if adapter is not None:
            params["adapter"] = adapter
            params["payload"] = payload
        else:
            params["envelope"] = envelope
        if skip_existing is not None:
            params["skipExisting"] = skip_existing
        return await self._write_call("memory/import", params, write)  # type: ignore[no-any-return]

    async def adapters_list(self) -> builtins.list[T.AdapterInfo]:
        return await self.call("adapters/list", {})  # type: ignore[no-any-return]

    async def proposals_create(
        self, input: Mapping[str, Any] | T.ProposalInput, session: SessionLike | None = None
    ) -> T.Proposal | None:
        """A pending proposal, or ``None`` when the session already has one of that kind."""
        params = {"input": input, "session": _session(session) if session is not None else self.session}
        return await self.call("proposals/create", params)  # type: ignore[no-any-return]

    async def proposals_list(self, status: str | None = None) -> builtins.list[T.Proposal]:
        return await self.call("proposals/list", {} if status is None else {"status": status})  # type: ignore[no-any-return]

    async def proposals_approve(self, id: str, write: Any = None) -> T.ProposalApproveResult:
        return await self._write_call("proposals/approve", {"id": id}, write)  # type: ignore[no-any-return]

    async def proposals_dismiss(self, id: str) -> T.Proposal:
        return await self.call("proposals/dismiss", {"id": id})  # type: ignore[no-any-return]

    async def approval_decided(self, id: str, outcome: str,
                               by: T.ApprovalBy | Mapping[str, Any] | None = None) -> T.Empty:
        """``approval/decided``; ``by`` claims who decided (``{"kind": "human"|"policy"|"script",
        "name"?}``)."""
        params: dict[str, Any] = {"id": id, "outcome": outcome}
        claimed = _by(by)
        if claimed is not None:
            params["by"] = msgspec.to_builtins(claimed)
        return await self.call("approval/decided", params)  # type: ignore[no-any-return]

    async def approval_subscribe(self) -> T.Empty:
        """Make this connection an approver for writes from connections that cannot approve."""
        return await self.call("approval/subscribe", {})  # type: ignore[no-any-return]

    async def status(self) -> T.DaemonStatus:
        return await self.call("daemon/status", {})  # type: ignore[no-any-return]


def _unwrap(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The one exception inside nested single-member groups, else the group itself."""
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


@asynccontextmanager
async def connect(
    path: str | Path | None = None,
    *,
    session: SessionLike | None = None,
    approvals: bool = True,
    on_approval: ApprovalHandler | None = None,
    client_name: str = "memoryd-client",
    timeout: float | None = 30.0,  # noqa: ASYNC109 - per-call deadline, see Client.call
) -> AsyncIterator[Client]:
    """Connect to memoryd, ``initialize``, and yield a :class:`Client`.

    ``path``: the socket (default ``memoryd_protocol.paths.default_socket_path()``).
    ``session``: the session of this connection's writes, ``{id, header: {cwd, agentPreset}}``
    (the ``write`` context of every write method unless one passes ``write=``); ``query()``
    without ``opts`` then sees only that session's visible set.
    ``approvals``: whether this connection answers approvals itself (``False``: a subscribed
    approver, e.g. ``memoryctl approve``, decides its writes). ``on_approval(asked)`` returns
    the outcome (``"allowed-once"`` or ``True`` approves); a handler that takes a second
    argument also gets the :class:`ApprovalCall` that asked (or None). Without a handler,
    every approval is rejected (fail closed), as it is when the handler raises. ``timeout``:
    seconds per call.

    Raises :class:`ConnectFailed` when no daemon listens there.
    """
    sock = Path(path) if path is not None else default_socket_path()
    try:
        with anyio.fail_after(timeout):
            stream = await anyio.connect_unix(sock)
    except OSError as exc:  # includes TimeoutError
        raise connect_failed(str(sock), exc) from exc
    client = Client(
        stream,
        session=session,
        approvals=approvals,
        on_approval=on_approval,
        client_name=client_name,
        timeout=timeout,
        path=sock,
    )
    try:
        async with anyio.create_task_group() as tg:
            client._tg = tg
            tg.start_soon(client._read_loop)
            try:
                await client.initialize()
                yield client
            finally:
                await client.aclose()
                tg.cancel_scope.cancel()  # approval handlers and listeners still running
    except BaseExceptionGroup as group:
        # Only the body (or initialize) can fail in here: the reader and the spawned tasks
        # catch their own errors. Give the caller its own exception, not a group, with its
        # chaining untouched.
        inner = _unwrap(group)
        if inner is group:
            raise
        context, cause, suppressed = inner.__context__, inner.__cause__, inner.__suppress_context__
        try:
            raise inner
        finally:
            inner.__context__, inner.__cause__, inner.__suppress_context__ = context, cause, suppressed


__all__ = [
    "DECIDED",
    "EVENT_METHODS",
    "WRITE_METHODS",
    "ApprovalCall",
    "Client",
    "Decided",
    "Decision",
    "Event",
    "EventStream",
    "__version__",
    "connect",
    "decode_result",
    "make_session",
    "plain",
]
