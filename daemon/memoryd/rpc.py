"""JSON-RPC: parse a line, dispatch each request, encode the reply.

Who does what:

- msgspec parses: the envelope with its params left undecoded (:func:`parse`), then the
  params with the method's own decoder, built once from the methods table.
- Our own code, each part for the reason given where it is: the request shape check
  (:func:`_shape_error`), batches (:meth:`Dispatcher.handle`), the per-request dispatch of
  the table's methods (:meth:`Dispatcher._dispatch`), the ordering of a connection's
  requests (connection.py), and :func:`error_object`, the one place where an exception
  becomes a wire error. jsonrpcserver is the reference that dispatch is tested against
  (tests/test_rpc_unit.py), not called: its cost per request is too much of a write's.
- A method outside the table is answered METHOD_NOT_FOUND. Protocol errors keep their code
  and details; msgspec validation failures become INVALID_INPUT with the ``$.path`` of the
  bad field; anything unexpected becomes -32603 with a fixed message, and its traceback
  goes to the log, never onto the wire.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Mapping
from typing import Any, Final

import anyio
import msgspec
from memoryd_protocol.constants import (
    DEFAULT_MAX_BATCH_CALLS,
    INTERNAL_ERROR,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
)
from memoryd_protocol.errors import InvalidInput, ProtocolError, RpcError, StoreUnavailable, WriteRequiresAgent
from memoryd_protocol.methods import METHODS, Method

from .context import Handler, RequestContext

log = logging.getLogger("memoryd.rpc")

_encoder = msgspec.json.Encoder()


# --- wire errors -------------------------------------------------------------------------


def error_object(exc: BaseException, method: str | None = None) -> dict[str, Any]:
    """The JSON-RPC ``error`` object for ``exc``: the one place an exception becomes a
    wire error."""
    if isinstance(exc, StoreUnavailable):
        # The trace of a write the store could not take (after its approval, when it
        # needed one): the method and the code, never the memory text.
        log.error("%s failed: %s (%s) on %s: %s", method, exc.code, exc.details.get("reason"),
                  exc.details.get("path"), exc.message)
    if isinstance(exc, ProtocolError):
        return exc.to_wire()
    if isinstance(exc, UnicodeEncodeError):
        # A lone surrogate in some string that validation did not look at (an id, a key,
        # an enum value) reached the encoder or SQLite: the input is bad.
        return InvalidInput("params contain a lone UTF-16 surrogate").to_wire()
    log.error("internal error in %s", method or "a request", exc_info=exc)
    return RpcError(INTERNAL_ERROR, "Internal error").to_wire()


def encode(message: Any) -> bytes:
    """msgspec, with a fallback for text that is not valid UTF-8 (a lone surrogate echoed
    back from the request): written as a JSON ``\\udXXX`` escape, as the peer sent it."""
    try:
        return _encoder.encode(message)
    except UnicodeEncodeError:
        return json.dumps(msgspec.to_builtins(message), ensure_ascii=True, separators=(",", ":")).encode()


def error_line(exc: BaseException, id_: Any = None) -> bytes:
    return encode({"jsonrpc": "2.0", "id": id_, "error": error_object(exc)})


def encode_notification(method: str, params: Any) -> bytes:
    return encode({"jsonrpc": "2.0", "method": method, "params": params})


PARSE_ERROR_LINE: Final = error_line(RpcError(PARSE_ERROR, "Parse error"))
OVERSIZE_LINE: Final = error_line(RpcError(INVALID_REQUEST, "Invalid request: message exceeds the maximum size"))
HALF_LINE_LINE: Final = error_line(RpcError(INVALID_REQUEST, "Invalid request: incomplete line timed out"))
TOO_MANY_CONNECTIONS_LINE: Final = error_line(RpcError(INVALID_REQUEST, "Invalid request: too many connections"))
_EMPTY_BATCH_LINE: Final = error_line(RpcError(INVALID_REQUEST, "Invalid request: empty batch"))


# --- parsing -----------------------------------------------------------------------------


class Call(msgspec.Struct):
    """One request object of a line, its params not decoded yet: ``msgspec.Raw`` as parsed,
    or a Python value when the line needed the lenient parser. A field the object lacks is
    ``UNSET``; a line (or batch item) that is not an object has every field ``UNSET``."""

    jsonrpc: Any = msgspec.UNSET
    method: Any = msgspec.UNSET
    params: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    id: Any = msgspec.UNSET

    def reply_id(self) -> str | int | float | None:
        """The id a reply carries, also for a request that failed validation when its id
        can still be read: JSON-RPC 2.0 §5 wants ``null`` only when it cannot."""
        return self.id if _is_id(self.id) else None


#: A parsed line: one call, a batch of them, or ``UNPARSABLE``.
Message = Call | list[Call]
UNPARSABLE: Final[Any] = object()
_line_decoder = msgspec.json.Decoder(Call | list[msgspec.Raw])
_item_decoder = msgspec.json.Decoder(Call)


def _is_id(value: Any) -> bool:
    """A string or a number JSON can carry. Not a float out of range: the lenient parser reads
    ``1e400`` as infinity where msgspec refuses the line, and both must answer alike."""
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, str | int) and not isinstance(value, bool)


def _lenient_call(obj: Any) -> Call:
    if not isinstance(obj, dict):
        return Call()
    return Call(obj.get("jsonrpc", msgspec.UNSET), obj.get("method", msgspec.UNSET),
                obj.get("params", msgspec.UNSET), obj.get("id", msgspec.UNSET))


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse(line: bytes) -> Message | Any:
    """The line as a :class:`Call` or a batch of them, or ``UNPARSABLE`` (also for nesting
    too deep to parse)."""
    try:
        top = _line_decoder.decode(line)
    except msgspec.ValidationError:
        return Call()  # JSON, but neither an object nor an array: an invalid request
    except (msgspec.DecodeError, RecursionError):
        # msgspec refuses lone surrogates ("\ud800") outright; the protocol wants them to
        # reach validation and come back as INVALID_INPUT, so try the lenient parser
        # (without its NaN/Infinity extension).
        try:
            obj = json.loads(line, parse_constant=_no_constants)
        except (ValueError, RecursionError):
            return UNPARSABLE
        return [_lenient_call(o) for o in obj] if isinstance(obj, list) else _lenient_call(obj)
    if isinstance(top, Call):
        return top
    batch: list[Call] = []
    for raw in top:
        try:
            batch.append(_item_decoder.decode(raw))
        except msgspec.ValidationError:
            batch.append(Call())
    return batch


#: The methods a connection may serve inline, in order, without a task of their own:
#: those that never wait for an approval.
_INLINE: Final = frozenset(name for name, m in METHODS.items() if not m.parks)


def serves_inline(message: Message | Any) -> bool:
    # a method that is no string (an array, an object) is no name: served inline, as the
    # INVALID_REQUEST it is, and never hashed
    return message is UNPARSABLE or (isinstance(message, Call) and (
        not isinstance(message.method, str) or message.method in _INLINE))


def _shape_error(call: Call) -> str | None:
    """What makes ``call`` no JSON-RPC 2.0 request object, or None.

    Ours, not jsonrpcserver's validator: the library answers a request its validator
    refuses with id null, where JSON-RPC 2.0 §5 wants the id whenever it can be read."""
    if call.jsonrpc != "2.0":
        return "not a JSON-RPC 2.0 request"
    if not isinstance(call.method, str):
        return "method must be a string"
    params = call.params
    if isinstance(params, msgspec.Raw):
        if bytes(memoryview(params)[:1]) not in (b"{", b"["):
            return "params must be an object or array"
    elif params is not msgspec.UNSET and not isinstance(params, dict | list):
        return "params must be an object or array"
    id_ = call.id
    if id_ is not msgspec.UNSET and id_ is not None and not _is_id(id_):
        return "id must be a string, number or null"
    return None


# --- params ------------------------------------------------------------------------------


class _WriteProbe(msgspec.Struct):
    write: Any = None


_probe_decoder = msgspec.json.Decoder(_WriteProbe)
_NO_PARAMS: Final = msgspec.Raw(b"{}")


def _lacks_agent(write: Any) -> bool:
    return write is None or (isinstance(write, dict) and write.get("agent") is None)


def field_of(exc: msgspec.ValidationError) -> str | None:
    """``$.input.track`` from msgspec's "… - at `$.input.track`" as ``input.track``."""
    _, sep, where = str(exc).rpartition(" - at `$")
    return where.rstrip("`").lstrip(".") or None if sep else None


def params_decoder(method: Method) -> Callable[[Any], Any]:
    """One method's params: its msgspec decoder, built once, and for a method that needs an
    agent the WRITE_REQUIRES_AGENT probe, which comes before any other check of them."""
    kind, decoder, needs_agent = method.params, msgspec.json.Decoder(method.params), method.needs_agent

    def decode(params: Any) -> Any:
        if params is msgspec.UNSET:
            params = _NO_PARAMS
        raw = isinstance(params, msgspec.Raw)
        if (bytes(memoryview(params)[:1]) == b"[") if raw else isinstance(params, list):
            raise InvalidInput("params must be an object (by-name), not an array")
        try:
            decoded = decoder.decode(params) if raw else msgspec.convert(params, kind)
        except msgspec.ValidationError as exc:
            if needs_agent and _lacks_agent(_probe_decoder.decode(params).write if raw else params.get("write")):
                raise WriteRequiresAgent() from None
            raise InvalidInput(f"invalid params: {exc}", field_of(exc)) from None
        except msgspec.DecodeError:
            # The envelope leaves params undecoded, so bytes that are not UTF-8 inside them
            # are first seen here: the client's bad input, not our failure.
            raise InvalidInput("invalid params: a string is not valid UTF-8", "params") from None
        if needs_agent and decoded.write.agent is None:  # type: ignore[attr-defined]
            raise WriteRequiresAgent()
        return decoded

    return decode


# --- dispatch ----------------------------------------------------------------------------


def bind_handlers(*groups: Mapping[str, Handler]) -> dict[str, Handler]:
    """The daemon's handlers, one per method of the table: a method without a handler, one
    with two, or a handler for a method the table does not have stops the daemon at
    start-up."""
    bound: dict[str, Handler] = {}
    twice: set[str] = set()
    for group in groups:
        twice |= bound.keys() & group.keys()
        bound.update(group)
    problems = []
    if missing := [name for name in METHODS if name not in bound]:
        problems.append(f"methods without a handler: {', '.join(missing)}")
    if twice:
        problems.append(f"methods with two handlers: {', '.join(sorted(twice))}")
    if unknown := sorted(bound.keys() - METHODS.keys()):
        problems.append(f"handlers for methods outside the table: {', '.join(unknown)}")
    if problems:
        raise ValueError("; ".join(problems))
    return {name: bound[name] for name in METHODS}


class Dispatcher:
    def __init__(self, handlers: Mapping[str, Handler], *, max_batch_calls: int = DEFAULT_MAX_BATCH_CALLS) -> None:
        #: a longer batch is refused whole (one -32600), before any call in it runs
        self.max_batch_calls = max_batch_calls
        self._too_long = error_line(RpcError(
            INVALID_REQUEST, f"Invalid request: a batch may hold at most {max_batch_calls} calls"))
        unknown = sorted(set(handlers) - METHODS.keys())
        if unknown:
            raise ValueError(f"handlers for methods outside the table: {', '.join(unknown)}")
        #: each method's params decoder and handler
        self._bound = {name: (params_decoder(METHODS[name]), h) for name, h in handlers.items()}

    async def handle(self, peer: Any, message: Message, release_turn: Callable[[], None] | None = None) -> bytes | None:
        """A parsed line (request, notification or batch) in, at most one line out.
        ``release_turn`` lets the connection serve its next line while a request of this
        one waits for an approval.

        Batches are ours: jsonrpcserver validates a batch as a whole (one bad item would
        fail them all) and runs its calls with ``asyncio.gather``; here each item is
        dispatched on its own, answered with its own error if it is not a request, in a
        task of its own, and a batch over ``max_batch_calls`` is refused before any runs."""
        if isinstance(message, list):
            if not message:
                return _EMPTY_BATCH_LINE
            if len(message) > self.max_batch_calls:
                return self._too_long
            replies: list[Any] = [None] * len(message)

            async def one(n: int, call: Call) -> None:
                replies[n] = await self._dispatch(peer, call, release_turn)

            async with anyio.create_task_group() as tg:
                for n, call in enumerate(message):
                    tg.start_soon(one, n, call)
            out = [r for r in replies if r is not None]
            return encode(out) if out else None
        reply = await self._dispatch(peer, message, release_turn)
        return None if reply is None else encode(reply)

    async def _dispatch(self, peer: Any, call: Call, release_turn: Callable[[], None] | None) -> dict[str, Any] | None:
        problem = _shape_error(call)
        if problem is not None:
            log.debug("invalid request: %s", problem)
            return invalid(call.reply_id())
        bound = self._bound.get(call.method)
        try:
            if bound is None:
                raise RpcError(METHOD_NOT_FOUND, "Method not found", {"method": call.method})
            decode, handler = bound
            result = await handler(RequestContext(peer, call.reply_id(), release_turn), decode(call.params))
        except Exception as exc:  # cancellation is not an Exception: it goes on up
            error = error_object(exc, call.method if bound is not None else None)
            return None if call.id is msgspec.UNSET else {"jsonrpc": "2.0", "id": call.id, "error": error}
        return None if call.id is msgspec.UNSET else {"jsonrpc": "2.0", "id": call.id, "result": result}


def invalid(id_: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id_, "error": error_object(RpcError(INVALID_REQUEST, "Invalid request"))}


def failure_line(message: Message | Any, exc: BaseException) -> bytes | None:
    """The reply to a line whose handling failed outside any method (a bug of ours)."""
    if isinstance(message, Call) and message.id is msgspec.UNSET:
        return None
    return error_line(exc, message.reply_id() if isinstance(message, Call) else None)
