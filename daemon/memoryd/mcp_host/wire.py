"""An MCP session's connection as the SDK's message streams, with the daemon's caps.

The lines are the socket's (``Connection.next_line`` over the same :class:`Lines`: the
line limit, the half-line timeout and their error lines), each parsed into the SDK's
``SessionMessage``; a line that is no JSON-RPC message is answered with the socket's error
(:func:`refuse`). Replies go out without waiting (a host that stops reading is dropped by
the transport). A request takes a place as the socket's do (``Connection.take_place``), so
no further line is read while MAX_INFLIGHT are open or every connection's requests together
hold every place; at EOF, what was read is answered before the streams close.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import mcp_types as types
import msgspec
from mcp.shared.message import ServerMessageMetadata, SessionMessage

from ..connection import MAX_INFLIGHT as MAX_INFLIGHT
from ..connection import Connection
from ..rpc import PARSE_ERROR_LINE, UNPARSABLE, Call, encode, invalid, parse
from ..transports import Lines

log = logging.getLogger("memoryd.mcp")
#: How long a session that read EOF waits for the SDK to answer what it read.
EOF_ANSWER_S = 10.0
#: Requests that stay open until the host cancels them (a subscription's stream). A host that
#: closed its end cancels nothing more, so at EOF the session does not wait for their answer.
LASTING = frozenset({"subscriptions/listen"})

#: The SDK's server loop over the two streams: (what it reads, where it writes).
Serve = Callable[[Any, Any], Awaitable[None]]


def refuse(line: bytes) -> bytes:
    """The socket's error for a line that is no JSON-RPC message: PARSE_ERROR when it is no
    JSON, else INVALID_REQUEST with the request's id when it can be read (JSON-RPC 2.0 §5);
    MCP's ids are strings and integers only."""
    message = parse(line)
    if message is UNPARSABLE:
        return PARSE_ERROR_LINE
    id_ = message.reply_id() if isinstance(message, Call) else None
    return encode(invalid(None if isinstance(id_, float) else id_))


class Wire:
    def __init__(self, conn: Connection, on_eof: Callable[[], None]) -> None:
        self.conn = conn
        #: called once the host's input ended, before what was read is answered
        self._on_eof = on_eof
        #: request id, as the host wrote it → the tokens of the requests with that id read and
        #: not yet settled, oldest first (a host may reuse an id)
        self._open: dict[Any, list[object]] = {}
        #: each open request's token → the bytes of its line (its place's size), and whether
        #: it is a LASTING one
        self._sizes: dict[object, tuple[int, bool]] = {}
        self._room = asyncio.Event()

    async def serve(self, lines: Lines, serve: Serve) -> None:
        read_send, read_recv = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        write_send, write_recv = anyio.create_memory_object_stream[SessionMessage](64)
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._read, read_send, lines)
            written = anyio.Event()
            tg.start_soon(self._write, write_recv, written)
            try:
                async with write_send:
                    await serve(read_recv, write_send)
                await written.wait()
                tg.cancel_scope.cancel()
            finally:
                # requests the SDK ended without a reply (the session is over) free their places
                for size, _ in self._sizes.values():
                    self.conn.free_place(size)
                self._sizes.clear()
                self._open.clear()

    def _settle(self, request_id: Any, token: object | None = None) -> None:
        """One request with ``request_id`` is settled: ``token``'s (cancelled, no reply), else
        the oldest (a reply went out; whichever of two with one id it answers, the count is right)."""
        tokens = self._open.get(request_id)
        if not tokens:
            return
        if token is None:
            token = tokens.pop(0)
        elif token in tokens:
            tokens.remove(token)
        else:
            return
        if not tokens:
            del self._open[request_id]
        self.conn.free_place(self._sizes.pop(token)[0])
        self._room.set()

    async def _read(self, send: Any, lines: Lines) -> None:
        try:
            async with send:
                while (line := await self.conn.next_line(lines)) is not None:
                    await self._take(send, line)
                self._on_eof()
                with anyio.move_on_after(EOF_ANSWER_S):
                    while not all(lasting for _, lasting in self._sizes.values()):
                        self._room.clear()
                        await self._room.wait()
        finally:
            self._on_eof()

    async def _take(self, send: Any, line: bytes) -> None:
        if self.conn.dropped:
            return
        try:
            message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
        except ValueError:
            self.conn.post_line(refuse(line))
            return
        if isinstance(message, types.JSONRPCRequest):
            if not await self.conn.take_place(len(line)):
                return  # as on the socket: what a dropped host sent is not served
            token = object()
            self._open.setdefault(message.id, []).append(token)
            self._sizes[token] = (len(line), message.method in LASTING)

            async def unanswered(request_id: Any = message.id, token: object = token) -> None:
                self._settle(request_id, token)  # cancelled by the host: the SDK writes no reply

            await send.send(SessionMessage(message, metadata=ServerMessageMetadata(on_request_unanswered=unanswered)))
            return
        if isinstance(message, types.JSONRPCNotification):
            call = parse(line)
            if isinstance(call, Call) and (call.id is not msgspec.UNSET or call.method is msgspec.UNSET):
                # an id the SDK cannot take (null, a number with a fraction or out of range,
                # true, a key spelt with an escape): a request all the same, so it gets the
                # error a request gets, not a notification's silence
                self.conn.post_line(refuse(line))
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
