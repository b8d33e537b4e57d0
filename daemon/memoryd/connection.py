"""One session object per connection, the same for the socket and stdio.

Lines are served in order, each in its own task: a request waits for its predecessor to
finish *or to park on an approval* (``RequestContext.park``), so a pipelined client
sees its requests applied in the order it sent them, while a write waiting for a human
never stops the connection from reading the ``approval/decided`` that releases it.

The ordering is plain asyncio (a task and an ``asyncio.Event`` per request), not anyio's
task group and Event, which cost a cancel scope and more on every request's path. ``serve``
still waits for every request it read before it returns, and cancels them if cancelled.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import anyio
from anyio.abc import AnyByteReceiveStream
from memoryd_protocol.constants import DEFAULT_HALF_LINE_TIMEOUT_S, DEFAULT_MAX_BUFFERED_BYTES
from memoryd_protocol.framing import OVERSIZE
from memoryd_protocol.types import ApprovalOrigin, ClientInfo, ConnectionInfo

from .approvals import Approvals
from .outbound import Outbound
from .peers import PeerProcess
from .rpc import (
    HALF_LINE_LINE,
    OVERSIZE_LINE,
    PARSE_ERROR_LINE,
    UNPARSABLE,
    Dispatcher,
    Message,
    encode_notification,
    failure_line,
    parse,
    serves_inline,
)
from .transports import TIMED_OUT, Lines

log = logging.getLogger("memoryd.connection")


class Sink(Protocol):
    """The outgoing half of a transport; both raise OSError once the peer is gone."""

    def post(self, data: bytes) -> None: ...

    async def drain(self) -> None: ...


#: Requests of one connection in flight (each a task) before the connection stops reading.
MAX_INFLIGHT = 256
_ids = itertools.count(1)


class Connection:
    def __init__(self, sink: Sink, dispatcher: Dispatcher, approvals: Approvals,
                 max_bytes: int, name: str = "socket", *,
                 max_buffered: int = DEFAULT_MAX_BUFFERED_BYTES,
                 half_line_s: float = DEFAULT_HALF_LINE_TIMEOUT_S, inflight: Outbound | None = None) -> None:
        self.id = next(_ids)
        #: the transport: "socket" or "stdio"
        self.name = name
        #: when it was accepted (ms since the epoch)
        self.opened_at = int(time.time() * 1000)
        self.can_approve = True
        #: the peer process (socket peer credentials, or stdio's parent), as the sink has it
        self.peer: PeerProcess | None = getattr(sink, "peer", None)
        #: ``initialize``'s ``client``, as the peer names itself
        self.client: ClientInfo | None = None
        self.closed = False
        #: the peer sent EOF: it can no longer answer approvals (replies may still go out)
        self.gone = False
        self._sink = sink
        self._held: list[bytes] = []
        self._dispatcher = dispatcher
        self._approvals = approvals
        self._max_bytes = max_bytes
        #: set by ``stop_reading`` (shutdown): no further line is read
        self._stop_reading = False
        self._lines: Lines | None = None
        #: max_buffered_bytes: lines read ahead of the one being served, in bytes
        self._max_buffered = max_buffered
        #: half_line_timeout_s: how long an incomplete line may be held
        self._half_line_s = half_line_s
        #: the places for requests in flight over every connection (max_inflight_total)
        self._inflight = inflight
        #: requests of this connection holding a place (``take_place``), and their lines' bytes
        self._places = 0
        self._place_bytes = 0
        self._room = asyncio.Event()
        #: set by ``mcp/attach``: once its reply is out, the rest of the connection's lines
        #: go to this (the MCP front-end)
        self.handoff: Callable[[Lines], Awaitable[None]] | None = None

    def post_line(self, data: bytes, *, hold: bool = False) -> bool:
        """Queue one line whole, never waiting, so concurrent requests' lines never interleave;
        False once the peer is gone. ``hold`` keeps a notification back until the next line
        or the end of this loop iteration, so an event and its reply leave in one write."""
        if self.closed:
            return False
        if hold:
            if not self._held:
                asyncio.get_running_loop().call_soon(self._release)
            self._held.append(data + b"\n")
            return True
        if self._held:
            data = b"".join(self._held) + data
            self._held.clear()
        self._post(data + b"\n")
        return not self.closed

    def _release(self) -> None:
        if self._held and not self.closed:
            data = b"".join(self._held)
            self._held.clear()
            self._post(data)

    def _post(self, data: bytes) -> None:
        try:
            self._sink.post(data)
        except OSError:
            # The peer went away; requests still complete, only their replies are lost.
            self.closed = True

    async def send_line(self, data: bytes) -> None:
        """A reply: queued, then the request waits while the peer is behind (backpressure)."""
        if self.post_line(data):
            await self._drain()

    async def _drain(self) -> None:
        """Until the peer has read what is queued: the connection's next request waits for
        this, so a peer that does not read holds one reply, not one per line it sent."""
        try:
            await self._sink.drain()
        except OSError:
            self.closed = True

    def describe(self) -> ApprovalOrigin | None:
        c, p = self.client, self.peer
        origin = ApprovalOrigin(name=c.name if c else None, version=c.version if c else None,
                                pid=p.pid if p else None, exe=p.exe if p else None)
        return None if origin == ApprovalOrigin() else origin

    def listing(self, *, approver: bool) -> ConnectionInfo:
        """This connection as ``daemon/status`` lists it (``approver``: it is subscribed)."""
        p = self.peer
        transport = self.name if self.name in ("stdio", "mcp") else "socket"
        return ConnectionInfo(id=self.id, transport=transport,  # type: ignore[arg-type]
                              pid=p.pid if p else None, uid=p.uid if p else None, exe=p.exe if p else None,
                              client=self.client, approver=approver, opened_at=self.opened_at)

    @property
    def dropped(self) -> bool:
        """Dropped for not reading (outbound.py): what it sent and was not served yet never is."""
        return bool(getattr(self._sink, "dropped", False))

    async def take_place(self, size: int) -> bool:
        """A place for one more request read and not yet answered (or parked on an
        approval), of ``size`` bytes: at most MAX_INFLIGHT of this connection's, their lines
        holding at most max_buffered_bytes, and one of max_inflight_total over every
        connection. The caller reads no further line until it has one. The socket's requests
        and an MCP session's calls take theirs here alike; False: the connection was dropped
        meanwhile, and serves nothing more."""
        while self._places and (self._places >= MAX_INFLIGHT or self._place_bytes + size > self._max_buffered):
            # Backpressure on a client that pipelines faster than we serve.
            self._room.clear()
            await self._room.wait()
        if self._inflight is not None:
            await self._inflight.admit(self._sink)
            if self.dropped:
                self._inflight.leave(self._sink)
                return False
        self._places += 1
        self._place_bytes += size
        return True

    def free_place(self, size: int) -> None:
        """A request that took a place of ``size`` bytes is answered, parked, or never will be."""
        self._places -= 1
        self._place_bytes -= size
        if self._inflight is not None:
            self._inflight.leave(self._sink)
        self._room.set()

    async def next_line(self, lines: Lines) -> bytes | None:
        """The next line to serve, or None at the end. A line too long is answered here and
        skipped; a half line held too long is answered here and ends the connection."""
        while True:
            line = await lines.next()
            if line is OVERSIZE:
                await self.send_line(OVERSIZE_LINE)
                continue
            if line is TIMED_OUT:
                log.info("connection %d: an incomplete line waited more than %g s; closing", self.id, self._half_line_s)
                await self.send_line(HALF_LINE_LINE)
                return None
            return line

    async def notify(self, method: str, params: Any) -> None:
        """Never waits: a stalled peer cannot hold up approvals or anyone else's request."""
        self.post_line(encode_notification(method, params), hold=True)

    def stop_reading(self) -> None:
        """Read no further line (shutdown); ``serve`` returns once every request already read
        has been answered."""
        self._stop_reading = True
        if self._lines is not None:
            self._lines.stop()

    async def serve(self, stream: AnyByteReceiveStream) -> None:
        """Read and serve lines from ``stream`` (an anyio byte or bytes-object receive
        stream) until EOF or ``stop_reading``."""
        log.debug("connection %d (%s) opened", self.id, self.name)
        self._lines = lines = Lines(stream, self._max_bytes, self._half_line_s)
        if self._stop_reading:
            lines.stop()
        loop = asyncio.get_running_loop()
        #: the requests' tasks not finished yet
        tasks: set[asyncio.Task[None]] = set()
        try:
            try:
                prev = asyncio.Event()
                prev.set()
                while (line := await self.next_line(lines)) is not None:
                    message = parse(line)
                    if serves_inline(message):
                        # Served inline, in order: no task, and nothing here can wait
                        # for an approval that a later line would have to decide.
                        if not prev.is_set():
                            await prev.wait()
                        await self._serve_one(message)
                        if self.handoff is not None:
                            # mcp/attach was answered: from here on the lines are MCP
                            handoff, self.handoff = self.handoff, None
                            await handoff(lines)
                            break
                        continue
                    # Inline requests take no place: one at a time, in this loop, which
                    # reads nothing meanwhile, so an approver's decision never waits here.
                    if not await self.take_place(len(line)):
                        break
                    turn = asyncio.Event()
                    task = loop.create_task(self._handle(message, prev, turn, len(line)))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                    prev = turn
            finally:
                self.gone = True
                # Waiters asked of this connection get "unavailable" and finish.
                self._approvals.connection_closed(self)
            if tasks:  # every request read is answered before serve returns
                await asyncio.wait(set(tasks))
        except BaseException:
            # cancelled while reading, or while waiting for them (the drain ran out of time)
            for t in tasks:
                t.cancel()
            raise
        finally:
            if tasks:
                with anyio.CancelScope(shield=True):
                    await asyncio.wait(set(tasks))
            self._approvals.connection_closed(self)
            log.debug("connection %d closed", self.id)

    async def _handle(self, message: Message, prev: asyncio.Event, turn: asyncio.Event, size: int) -> None:
        left = False

        def parked() -> None:
            # parked on an approval: the next request's turn, and the place for another
            nonlocal left
            turn.set()
            if not left:
                left = True
                self.free_place(size)

        try:
            if not prev.is_set():
                await prev.wait()
            try:
                await self._serve_one(message, parked)
            finally:
                turn.set()
        finally:
            if not left:
                self.free_place(size)

    async def _serve_one(self, message: Message | Any, release_turn: Callable[[], None] | None = None) -> None:
        if self.dropped:
            return  # dropped for not reading (outbound.py): what it sent after is not served
        if message is UNPARSABLE:
            await self.send_line(PARSE_ERROR_LINE)
            return
        try:
            reply = await self._dispatcher.handle(self, message, release_turn)
        except anyio.get_cancelled_exc_class():
            raise
        except Exception as exc:
            # The dispatcher turns every method failure into an error reply; reaching here
            # is a bug of ours, and it must cost this one request, not the connection.
            log.error("connection %d: unhandled failure serving a request", self.id)
            reply = failure_line(message, exc)
        if reply is not None and self.post_line(reply):
            del reply  # while the peer is behind, the line queued is the one copy kept
            await self._drain()
