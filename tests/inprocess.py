"""The in-process tier: the daemon's real stack (``memoryd.app.Daemon``: store, writer,
service, rpc, connections) running in the test process, with no process spawned.

Two ways in, both through the daemon's public seam (``Daemon.running()``,
``Daemon.serve_stream``, ``Daemon.listen``), and both stopped by the daemon's own drain
(``running()``'s exit: ``begin_stop`` then ``_drain``, as on SIGTERM):

- :func:`memory_daemon` + :meth:`InProcess.connect`: the daemon in the test's own event
  loop, each connection an in-memory pair of streams (:class:`MemorySink` for what the
  daemon sends, a memory object stream of chunks for what it reads), a ``rawclient.Raw`` on
  the other end. This is ``pair_factory``'s ``memory`` kind.
- :class:`ThreadDaemon`: the daemon serving a real Unix socket from an event loop in a
  thread of the test process, for e2e files whose tests call ``daemon_factory(...)`` and
  ``d.stop()`` synchronously and connect with ``socket_client(d.socket_path)``: the same
  object shape as conftest's process ``Daemon``, minus what only a process has (``proc``,
  ``stderr()``). Its own loop keeps it serving while a test blocks (a subprocess, a
  sync client).

The peer of every in-process connection is this process, as it is for the process tiers
(the socket's SO_PEERCRED, a stdio child's parent): approval origins and
``daemon/status`` show the same pid and exe. What differs is the daemon's own pid
(``daemon/status``'s ``pid``), which here is the test's.
"""

from __future__ import annotations

import math
import os
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractContextManager, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import anyio
from anyio.abc import TaskGroup
from anyio.from_thread import BlockingPortal, start_blocking_portal
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from memoryd.app import Daemon
from memoryd.cli import build_parser, serve_config
from memoryd.config import Config
from memoryd.peers import PeerProcess
from rawclient import Raw, _socket_lines, running

#: what one read of a socket returns at most: lines longer than this reach the daemon in
#: pieces, as they do over the socket
CHUNK = 65536


def config_for(args: Sequence[str]) -> Config:
    """The Config ``memoryd serve <args>`` would run with."""
    return serve_config(build_parser().parse_args(["serve", *args]))[1]


class MemorySink:
    """The daemon's outgoing half of an in-memory connection (connection.Sink): ``post``
    queues bytes for the peer without waiting; nothing is ever behind, so ``drain``
    returns at once. Posting after the peer closed raises what a closed socket would
    (anyio's BrokenResourceError), which the connection takes as the peer gone."""

    def __init__(self) -> None:
        self._send: MemoryObjectSendStream[bytes]
        self.receive: MemoryObjectReceiveStream[bytes]
        self._send, self.receive = anyio.create_memory_object_stream[bytes](math.inf)
        self.peer = PeerProcess.of(os.getpid())

    def post(self, data: bytes) -> None:
        self._send.send_nowait(data)

    async def drain(self) -> None:
        return None

    def close(self) -> None:
        """EOF for the peer: the daemon is done with this connection."""
        self._send.close()


@dataclass
class InProcess:
    """A daemon running in this event loop (inside ``Daemon.running()``)."""

    daemon: Daemon
    serving: TaskGroup

    @asynccontextmanager
    async def connect(self, *, approvals: bool = True, initialize: bool = True) -> AsyncIterator[Raw]:
        """A ``Raw`` peer over an in-memory pair of streams, served by the daemon's
        ``serve_stream`` like an accepted socket; leaving closes the peer's half (EOF)."""
        to_daemon, from_peer = anyio.create_memory_object_stream[bytes](math.inf)
        sink = MemorySink()

        async def serve() -> None:
            try:
                async with from_peer:
                    await self.daemon.serve_stream(sink, from_peer, "socket")
            finally:
                sink.close()

        async def send(data: bytes) -> None:
            for i in range(0, len(data), CHUNK):
                await to_daemon.send(data[i:i + CHUNK])

        self.serving.start_soon(serve)
        # hang_up: EOF, as a socket's half-close
        async with to_daemon, sink.receive, running(Raw(send, _socket_lines(sink.receive)), initialize, approvals,
                                                    send_eof=to_daemon.aclose) as raw:
            yield raw


@asynccontextmanager
async def memory_daemon(args: Sequence[str], *, listen: bool = False) -> AsyncIterator[InProcess]:
    """``memoryd serve <args>``'s daemon in this event loop; ``listen``: it also serves its
    socket (``--socket``). Leaving stops it as SIGTERM does, and closes the store."""
    cfg = config_for(args)
    daemon = await Daemon.open(cfg, endpoint=str(cfg.socket_path) if listen else None)
    async with daemon.running() as serving:
        if listen:
            await daemon.listen(serving)
        yield InProcess(daemon, serving)


@asynccontextmanager
async def memory_pair(args: Sequence[str], *, approvals: bool = True, initialize: bool = True) -> AsyncIterator[Raw]:
    """A daemon of its own in this event loop and one in-memory connection to it."""
    async with memory_daemon(args) as d, d.connect(approvals=approvals, initialize=initialize) as raw:
        yield raw


@dataclass
class ThreadDaemon:
    """A daemon serving ``socket_path`` from an event loop in a thread of this process;
    conftest's ``Daemon`` without the process. ``stop()`` drains and closes it as SIGTERM
    would and returns 0 once that finished without an error (what a clean exit means);
    an error in it is raised."""

    socket_path: Path
    db_path: Path
    args: list[str] = field(default_factory=list)
    _portal_cm: AbstractContextManager[BlockingPortal] | None = None
    _running: AbstractContextManager[InProcess] | None = None

    @classmethod
    def start(cls, socket_path: Path, db_path: Path, args: list[str]) -> ThreadDaemon:
        portal_cm = start_blocking_portal("asyncio")
        portal = portal_cm.__enter__()
        running = portal.wrap_async_context_manager(memory_daemon(args, listen=True))
        try:
            running.__enter__()
        except BaseException:
            portal_cm.__exit__(None, None, None)
            raise
        return cls(socket_path, db_path, args, portal_cm, running)

    def stop(self, timeout: float = 10.0) -> int:
        running, portal_cm = self._running, self._portal_cm
        self._running = self._portal_cm = None
        if running is None or portal_cm is None:
            return 0
        try:
            running.__exit__(None, None, None)
        finally:
            portal_cm.__exit__(None, None, None)
        return 0
