"""The connection under :class:`~memoryd_client.client.Client`: one JSON-RPC 2.0 connection to
memoryd over its Unix socket, without the typed methods.

Layers, bottom up:

* framing: NDJSON, one message per line (wire-v1.md §1);
* a reader task that routes each line by shape: a notification (``method``, no ``id``) goes to
  the event listeners and the approval handler, a response (``id`` with ``result``/``error``)
  wakes the call waiting for it in the pending table.

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
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from contextlib import suppress
from pathlib import Path
from typing import Any, Final

import anyio
import msgspec
from anyio.abc import SocketAttribute, SocketStream, TaskGroup
from memoryd_protocol import types as T
from memoryd_protocol.constants import DEFAULT_MAX_MESSAGE_BYTES
from memoryd_protocol.errors import InvalidInput, ProtocolError, from_wire
from memoryd_protocol.framing import OVERSIZE, Framer
from memoryd_protocol.methods import METHODS

from .approvals import DECIDED, ApprovalCall, ApprovalHandler, Decided, Decision, _by, _outcome, _takes_call
from .errors import BadResponse, ClientError, ConnectionClosed, Timeout
from .events import Event, EventStream, Listener
from .wire import _ANY, Decoders, SessionLike, _session, decode_result, plain

log = logging.getLogger("memoryd_client")

#: The write methods: the ones that can ask for approval (the methods table says which).
WRITE_METHODS: Final = frozenset(name for name, m in METHODS.items() if m.parks)

_DEFAULT: Any = object()  # "use the connection's timeout"

#: The longest line the client buffers. The daemon's own limit is 4 MiB per message it
#: accepts; its answers (an export of 1000 entries) can be larger, so the client allows more.
MAX_LINE_BYTES: Final = 64 * 1024 * 1024


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
_ASKED_BY: Final = msgspec.json.Decoder(_AskedBy)
_EVENT_DECODERS: Final = Decoders(T.NOTIFICATIONS)


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


class Connection:
    """One connection's state and machinery: sending, the reader, the pending table, events
    and approvals. :class:`~memoryd_client.client.Client` adds one typed method per daemon
    method."""

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
            try:
                result = callback(event)  # a coroutine function's body runs in its own task, below
            except Exception:
                log.exception("event listener for %s failed", event.method)
                continue
            if inspect.isawaitable(result):
                self._spawn(self._await_guarded, result, event.method)

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

    async def approval_decided(self, id: str, outcome: str,
                               by: T.ApprovalBy | Mapping[str, Any] | None = None) -> T.Empty:
        """``approval/decided``; ``by`` claims who decided (``{"kind": "human"|"policy"|"script",
        "name"?}``)."""
        params: dict[str, Any] = {"id": id, "outcome": outcome}
        claimed = _by(by)
        if claimed is not None:
            params["by"] = msgspec.to_builtins(claimed)
        return await self.call("approval/decided", params)  # type: ignore[no-any-return]

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

        The result is decoded with the protocol's type for ``method`` (``methods.RESULTS``);
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
                    raise Timeout(f"{method}: no answer from memoryd within {timeout}s",
                                  {"method": method, "timeout": timeout})
        finally:
            self._pending.pop(request_id, None)
        if pending.error is not None:
            raise pending.error
        return pending.result


__all__ = ["WRITE_METHODS", "Connection"]
