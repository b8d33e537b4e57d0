"""An MCP session's connection as the SDK's message streams, with the daemon's caps.

Lines are framed as on the socket, each parsed into the SDK's ``SessionMessage``; a line
that is no JSON-RPC message is answered here. Replies go out without waiting (a host that
stops reading is dropped by the transport). Beyond ``MAX_INFLIGHT`` requests read and not
yet answered or cancelled, as on the socket, or while every connection's requests together
hold every place (``Connection.admit``), no further line is read; at EOF, what was read is
answered before the streams close.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import mcp_types as types
import msgspec
from mcp.shared.message import ServerMessageMetadata, SessionMessage
from memoryd_protocol.framing import OVERSIZE, Framer

from ..connection import MAX_INFLIGHT as MAX_INFLIGHT
from ..connection import Connection
from ..rpc import HALF_LINE_LINE

log = logging.getLogger("memoryd.mcp")
#: How long a session that read EOF waits for the SDK to answer what it read.
EOF_ANSWER_S = 10.0
#: Requests that stay open until the host cancels them (a subscription's stream). A host that
#: closed its end cancels nothing more, so at EOF the session does not wait for their answer.
LASTING = frozenset({"subscriptions/listen"})

_PARSE_ERROR = b'{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error"}}'
_INVALID = b'{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Invalid request: not a JSON-RPC 2.0 message"}}'
_OVERSIZE = (b'{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Invalid request: '
             b'the message is longer than max_message_bytes"}}')

#: The SDK's server loop over the two streams: (what it reads, where it writes).
Serve = Callable[[Any, Any], Awaitable[None]]


def refusal(line: bytes) -> bytes:
    """The error for a line that is no JSON-RPC message: a parse error, or an invalid
    request answered with its id when a request's id can be read (JSON-RPC 2.0 §5)."""
    try:
        obj = msgspec.json.decode(line)
    except msgspec.DecodeError:
        return _PARSE_ERROR
    id_ = obj.get("id") if isinstance(obj, dict) and "method" in obj else None
    if isinstance(id_, bool) or not isinstance(id_, str | int):
        return _INVALID
    return msgspec.json.encode({"jsonrpc": "2.0", "id": id_, "error": {
        "code": types.INVALID_REQUEST, "message": "Invalid request: not a JSON-RPC 2.0 request"}})


def _has_id(line: bytes) -> bool:
    try:
        obj = msgspec.json.decode(line)
    except msgspec.DecodeError:
        return False
    return isinstance(obj, dict) and "id" in obj


class Wire:
    def __init__(self, conn: Connection, session_id: str, half_line_s: float, on_eof: Callable[[], None]) -> None:
        self.conn = conn
        self._session_id = session_id
        self._half_line_s = half_line_s
        #: called once the host's input ended, before what was read is answered
        self._on_eof = on_eof
        #: request id, as the host wrote it → the tokens of the requests with that id read and
        #: not yet settled, oldest first (a host may reuse an id)
        self._open: dict[Any, list[object]] = {}
        self._count = 0
        #: the open requests' tokens that are LASTING ones
        self._lasting: set[object] = set()
        self._room = asyncio.Event()

    async def serve(self, lines: list[bytes], framer: Framer, source: AsyncIterator[bytes], serve: Serve) -> None:
        read_send, read_recv = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        write_send, write_recv = anyio.create_memory_object_stream[SessionMessage](64)
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._read, read_send, lines, framer, source)
            written = anyio.Event()
            tg.start_soon(self._write, write_recv, written)
            try:
                async with write_send:
                    await serve(read_recv, write_send)
                await written.wait()
                tg.cancel_scope.cancel()
            finally:
                # requests the SDK ended without a reply (the session is over) free their places
                self.conn.leave(self._count)
                self._count = 0
                self._open.clear()

    def _settle(self, request_id: Any, token: object | None = None) -> None:
        """One request with ``request_id`` is settled: ``token``'s (cancelled, no reply), else
        the oldest (a reply went out; whichever of two with one id it answers, the count is right)."""
        tokens = self._open.get(request_id)
        if not tokens:
            return
        if token is None:
            self._lasting.discard(tokens.pop(0))
        elif token in tokens:
            tokens.remove(token)
            self._lasting.discard(token)
        else:
            return
        if not tokens:
            del self._open[request_id]
        self._count -= 1
        self.conn.leave()
        self._room.set()

    async def _until(self, done: Callable[[], bool]) -> None:
        while not done():
            self._room.clear()
            await self._room.wait()

    async def _read(self, send: Any, lines: list[bytes], framer: Framer, source: AsyncIterator[bytes]) -> None:
        try:
            async with send:
                for line in lines:
                    await self._take(send, line)
                left = self._half_line_s
                while True:
                    if framer.partial:
                        started = anyio.current_time()
                        with anyio.move_on_after(left) as scope:
                            chunk = await anext(source, None)
                        if scope.cancelled_caught:
                            log.info("mcp session %s: an incomplete line waited more than %g s; closing",
                                     self._session_id, self._half_line_s)
                            self.conn.post_line(HALF_LINE_LINE)
                            break
                        left -= anyio.current_time() - started
                    else:
                        chunk = await anext(source, None)
                    for line in framer.end() if chunk is None else framer.feed(chunk):
                        await self._take(send, line)
                    if not framer.partial:
                        left = self._half_line_s
                    if chunk is None:
                        break
                self._on_eof()
                with anyio.move_on_after(EOF_ANSWER_S):
                    await self._until(lambda: self._count == len(self._lasting))
        except OSError as exc:
            log.debug("mcp session %s: read failed: %s", self._session_id, exc)
        finally:
            self._on_eof()

    async def _take(self, send: Any, line: bytes) -> None:
        if self.conn.dropped:
            return
        if line is OVERSIZE:
            self.conn.post_line(_OVERSIZE)
            return
        try:
            message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
        except ValueError:
            self.conn.post_line(refusal(line))
            return
        if isinstance(message, types.JSONRPCRequest):
            await self._until(lambda: self._count < MAX_INFLIGHT)
            await self.conn.admit()
            if self.conn.dropped:
                self.conn.leave()  # as on the socket: what a dropped host sent is not served
                return
            token = object()
            self._open.setdefault(message.id, []).append(token)
            self._count += 1
            if message.method in LASTING:
                self._lasting.add(token)

            async def unanswered(request_id: Any = message.id, token: object = token) -> None:
                self._settle(request_id, token)  # cancelled by the host: the SDK writes no reply

            await send.send(SessionMessage(message, metadata=ServerMessageMetadata(on_request_unanswered=unanswered)))
            return
        if isinstance(message, types.JSONRPCNotification) and b'"id"' in line and _has_id(line):
            # an id the SDK cannot take (null, a number with a fraction, true): a request all
            # the same, so it gets the error a request gets, not the silence of a notification
            self.conn.post_line(refusal(line))
            return
        await send.send(SessionMessage(message))

    async def _write(self, recv: Any, done: anyio.Event) -> None:
        try:
            async with recv:
                async for item in recv:
                    message = item.message
                    if isinstance(message, types.JSONRPCResponse | types.JSONRPCError):
                        self._settle(message.id)
                    self.conn.post_line(message.model_dump_json(by_alias=True, exclude_unset=True).encode())
        finally:
            done.set()
