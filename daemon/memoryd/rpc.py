"""JSON-RPC: decode a line, dispatch through jsonrpcserver, encode the reply.

This module is the single place where exceptions become wire errors. Protocol errors keep
their code and details; msgspec validation failures become INVALID_INPUT with the
``$.path`` of the bad field; anything unexpected becomes -32603 with a fixed message and
its traceback goes to the log, never onto the wire.

jsonrpcserver supplies the JSON-RPC state machine (method lookup, notifications, ids);
msgspec supplies parsing and typed params, with one converter per method built at
start-up. jsonrpcserver's own jsonschema request validator is replaced by a shape check
that costs a few dict lookups.
"""

from __future__ import annotations

import inspect
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import msgspec
from jsonrpcserver import JsonRpcError, Success, dispatch_to_response
from memoryd_protocol.constants import (
    DEFAULT_MAX_BATCH_CALLS,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    RPC_LEVEL_CODES,
)
from memoryd_protocol.errors import InvalidInput, ProtocolError, StoreUnavailable, WriteRequiresAgent
from memoryd_protocol.types import PARAMS
from oslash.either import Left  # type: ignore[import-untyped]

from .approvals import request_id

log = logging.getLogger("memoryd.rpc")

Handler = Callable[[Any, Any], Awaitable[Any]]

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder()


def rpc_error(code: int, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"code": code, "message": message,
            "data": {"code": RPC_LEVEL_CODES[code], "message": message, "details": details or {}}}


def encode(message: Any) -> bytes:
    """msgspec, with a fallback for text that is not valid UTF-8 (a lone surrogate echoed
    back from the request): written as a JSON ``\\udXXX`` escape, as the peer sent it."""
    try:
        return _encoder.encode(message)
    except UnicodeEncodeError:
        return json.dumps(msgspec.to_builtins(message), ensure_ascii=True, separators=(",", ":")).encode()


def encode_error(error: dict[str, Any], id_: Any = None) -> bytes:
    return encode({"jsonrpc": "2.0", "id": id_, "error": error})


def encode_notification(method: str, params: Any) -> bytes:
    return encode({"jsonrpc": "2.0", "method": method, "params": params})


def internal_error_line(obj: Any) -> bytes | None:
    """The -32603 reply for a request whose handling failed outside the method."""
    if isinstance(obj, dict) and "id" not in obj:
        return None
    return encode_error(rpc_error(INTERNAL_ERROR, "Internal error"), _request_id(obj))


PARSE_ERROR_LINE = encode_error(rpc_error(PARSE_ERROR, "Parse error"))
OVERSIZE_LINE = encode_error(rpc_error(INVALID_REQUEST, "Invalid request: message exceeds the maximum size"))
HALF_LINE_LINE = encode_error(rpc_error(INVALID_REQUEST, "Invalid request: incomplete line timed out"))
TOO_MANY_CONNECTIONS_LINE = encode_error(rpc_error(INVALID_REQUEST, "Invalid request: too many connections"))


def _check_shape(request: Any) -> Any:
    """JSON-RPC 2.0 request object shape (raising makes jsonrpcserver answer -32600)."""
    if not isinstance(request, dict) or request.get("jsonrpc") != "2.0":
        raise ValueError("not a JSON-RPC 2.0 request")
    if not isinstance(request.get("method"), str):
        raise ValueError("method must be a string")
    if "params" in request and not isinstance(request["params"], dict | list):
        raise ValueError("params must be an object or array")
    if "id" in request:
        id_ = request["id"]
        if isinstance(id_, bool) or not (id_ is None or isinstance(id_, str | int | float)):
            raise ValueError("id must be a string, number or null")
    return request


def _field_of(exc: msgspec.ValidationError) -> str | None:
    """``$.input.track`` from msgspec's "… - at `$.input.track`" as ``input.track``."""
    _, sep, where = str(exc).rpartition(" - at `$")
    return where.rstrip("`").lstrip(".") or None if sep else None


def _to_jsonrpc_error(exc: ProtocolError) -> JsonRpcError:
    wire = exc.to_wire()
    return JsonRpcError(wire["code"], wire["message"], wire["data"])


class _Call:
    """A method call jsonrpcserver has accepted, run by us after it returns.

    jsonrpcserver's async dispatcher wraps every request in ``asyncio.gather`` (an extra
    task and loop iterations per request). We use its synchronous state machine instead:
    the method only records the call, and ``_dispatch`` awaits it afterwards, for
    requests and notifications alike.
    """

    __slots__ = ("coro", "error", "result")

    def __init__(self, coro: Awaitable[Any]) -> None:
        self.coro = coro
        self.result: Any = None
        self.error: JsonRpcError | None = None

    async def run(self) -> None:
        try:
            self.result = await self.coro
        except JsonRpcError as exc:
            self.error = exc


class _Context:
    __slots__ = ("calls", "peer")

    def __init__(self, peer: Any) -> None:
        self.peer = peer
        self.calls: list[_Call] = []


class Dispatcher:
    def __init__(self, handlers: dict[str, Handler], *, max_batch_calls: int = DEFAULT_MAX_BATCH_CALLS) -> None:
        #: a longer batch is refused whole (one -32600), before any call in it runs
        self.max_batch_calls = max_batch_calls
        self._too_long = encode_error(rpc_error(
            INVALID_REQUEST, f"Invalid request: a batch may hold at most {max_batch_calls} calls"))
        unknown = set(handlers) - set(PARAMS)
        if unknown:
            raise ValueError(f"handlers for methods outside wire-v1: {sorted(unknown)}")
        self.methods = {name: self._wrap(name, h) for name, h in handlers.items()}

    @staticmethod
    def _wrap(name: str, handler: Handler) -> Callable[..., Any]:
        params_type = PARAMS[name]
        is_write = "write" in params_type.__struct_fields__

        async def run(peer: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            try:
                if args:
                    raise InvalidInput("params must be an object (by-name), not an array")
                if is_write:
                    write = kwargs.get("write")
                    if write is None or (isinstance(write, dict) and write.get("agent") is None):
                        raise WriteRequiresAgent()
                try:
                    params = msgspec.convert(kwargs, params_type)
                except msgspec.ValidationError as exc:
                    raise InvalidInput(f"invalid params: {exc}", _field_of(exc)) from None
                return await handler(peer, params)
            except StoreUnavailable as exc:
                # The trace of a write the store could not take (after its approval, when it
                # needed one): the method and the code, never the memory text.
                log.error("%s failed: %s (%s) on %s: %s", name, exc.code, exc.details.get("reason"),
                          exc.details.get("path"), exc.message)
                raise _to_jsonrpc_error(exc) from None
            except ProtocolError as exc:
                raise _to_jsonrpc_error(exc) from None
            except UnicodeEncodeError:
                # A lone surrogate in some string that validation did not look at (an id,
                # a key, an enum value) reached the encoder or SQLite: the input is bad.
                raise _to_jsonrpc_error(InvalidInput("params contain a lone UTF-16 surrogate")) from None
            except anyio.get_cancelled_exc_class():
                raise
            except Exception:
                log.exception("internal error in %s", name)
                raise JsonRpcError(INTERNAL_ERROR, "Internal error",
                                   {"code": "INTERNAL_ERROR", "message": "Internal error", "details": {}}) from None

        # ctx is positional-only so that a param named "ctx" is just another unknown field.
        def method(ctx: _Context, /, *args: Any, **kwargs: Any) -> Any:
            call = _Call(run(ctx.peer, args, kwargs))
            ctx.calls.append(call)
            return Success(call)

        # jsonrpcserver binds every call against inspect.signature(method); a precomputed
        # __signature__ turns that from a per-request introspection into an attribute read.
        method.__signature__ = inspect.signature(method)  # type: ignore[attr-defined]
        return method

    async def handle(self, peer: Any, obj: Any) -> bytes | None:
        """A parsed line (request, notification or batch) in, at most one line out."""
        if isinstance(obj, list):
            if not obj:
                return encode_error(rpc_error(INVALID_REQUEST, "Invalid request: empty batch"))
            if len(obj) > self.max_batch_calls:
                return self._too_long
            replies: list[Any] = [None] * len(obj)

            async def one(n: int, item: Any) -> None:
                replies[n] = await self._dispatch(peer, item)

            async with anyio.create_task_group() as tg:
                for n, item in enumerate(obj):
                    tg.start_soon(one, n, item)
            out = [r for r in replies if r is not None]
            return encode(out) if out else None
        reply = await self._dispatch(peer, obj)
        return None if reply is None else encode(reply)

    async def _dispatch(self, peer: Any, obj: Any) -> dict[str, Any] | None:
        ctx = _Context(peer)
        response = dispatch_to_response("", self.methods, context=ctx, deserializer=lambda _: obj,
                                        validator=_check_shape)
        if ctx.calls:
            # The approval gate reads the id from here (approvals.request_id; issue #9
            # replaces this with an explicit request context). Each batch item runs in its
            # own task, so each sees its own id.
            token = request_id.set(_request_id(obj))
            try:
                for call in ctx.calls:
                    await call.run()
            finally:
                request_id.reset(token)
        if response is None:
            return None
        id_ = _request_id(obj)
        if isinstance(response, Left):
            err = response._error
            data = err.data
            if not isinstance(data, dict):
                code = err.code
                if code == METHOD_NOT_FOUND:
                    message = "Method not found"
                    details = {"method": str(data)}
                elif code == INVALID_REQUEST:
                    message = "Invalid request"
                    details = {}
                elif code == INVALID_PARAMS:
                    wire = InvalidInput("params do not fit the method").to_wire()
                    return {"jsonrpc": "2.0", "id": id_, "error": wire}
                else:
                    code = INTERNAL_ERROR
                    message = "Internal error"
                    details = {}
                return {"jsonrpc": "2.0", "id": id_, "error": rpc_error(code, message, details)}
            return {"jsonrpc": "2.0", "id": err.id, "error": {"code": err.code, "message": err.message, "data": data}}
        ok = response._value  # type: ignore[union-attr]  # a single request: never a list
        done: _Call = ok.result
        if done.error is not None:
            e = done.error
            return {"jsonrpc": "2.0", "id": ok.id, "error": {"code": e.code, "message": e.message, "data": e.data}}
        return {"jsonrpc": "2.0", "id": ok.id, "result": done.result}


_UNPARSABLE: Any = object()

#: Methods that never wait for an approval: a connection may serve them inline, in order,
#: without a task of their own.
NEVER_PARK = frozenset({
    "initialize", "memory/query", "memory/budgets", "memory/list", "audit/list", "audit/verify", "audit/explain",
    "memory/snapshot",
    "memory/export", "adapters/list", "proposals/create", "proposals/list", "proposals/dismiss",
    "approval/decided", "approval/subscribe", "daemon/status",
})


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse(line: bytes) -> Any:
    """The line's JSON value, or ``_UNPARSABLE`` (also for nesting too deep to parse)."""
    try:
        return _decoder.decode(line)
    except (msgspec.DecodeError, RecursionError):
        # msgspec refuses lone surrogates ("\ud800") outright; the protocol wants them to
        # reach validation and come back as INVALID_INPUT, so try the lenient parser
        # (without its NaN/Infinity extension).
        try:
            return json.loads(line, parse_constant=_no_constants)
        except (ValueError, RecursionError):
            return _UNPARSABLE


def never_parks(obj: Any) -> bool:
    return isinstance(obj, dict) and obj.get("method") in NEVER_PARK


def _request_id(obj: Any) -> Any:
    """The id of a request that failed validation, when it can still be read: JSON-RPC
    2.0 §5 wants ``null`` only when the id itself could not be detected."""
    if isinstance(obj, dict):
        id_ = obj.get("id")
        if isinstance(id_, str | int | float) and not isinstance(id_, bool):
            return id_
    return None
