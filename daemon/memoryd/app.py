"""Assembly and lifecycle: open the store, start the writer, serve, shut down cleanly."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import gc
import json
import logging
import os
import select
import signal
import socket
import sqlite3
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import SocketAttribute, SocketListener, SocketStream, TaskGroup
from memoryd_protocol.errors import ProtocolError, StoreLocked
from memoryd_protocol.paths import owner_record_path, read_owner_record, temporary_twin

from . import logs, storefile
from .adapter_registry import load_adapters
from .approvals import Approvals
from .audits import Audits
from .config import Config
from .connection import Connection, Sink
from .context import Handler
from .heads import Heads
from .mcp_host import McpFront
from .outbound import Outbound
from .proposals import Proposals
from .ratelog import RateLimitedLog
from .readers import Readers
from .reads import Reads
from .replication import Replication
from .rpc import TOO_MANY_CONNECTIONS_LINE, Dispatcher, bind_handlers
from .service import Service
from .sessions import UNBOUND_METHODS
from .snapshots import Snapshots
from .transfer import Transfer
from .transports import accepted, bind_unix, inherited_listener, refuse_taken, sd_notify, stdio_stream
from .writer import Writer
from .writes import Writes

log = logging.getLogger("memoryd")

#: How long a starting daemon waits for the previous owner of its store and socket to
#: finish stopping (it drains for at most DRAIN_S, then closes the store).
STOPPING_OWNER_WAIT_S = 12.0

#: The most a SIGTERM'd daemon spends draining (queued commits, denied rows, the replies
#: to requests already read), so that it exits within 5 s of the signal.
DRAIN_S = 3.0


#: accept() failures that mean "no descriptor or memory now", not a broken listener
_OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
#: After such a failure, accept again once a connection closes, or after this long.
ACCEPT_RETRY_S = 1.0


def _refuse(client: socket.socket) -> None:
    """Answer a connection over max_connections with one line, then close it."""
    with contextlib.suppress(OSError):
        client.setblocking(False)
        client.send(TOO_MANY_CONNECTIONS_LINE + b"\n")
        client.shutdown(socket.SHUT_WR)
        # what the peer already sent: closing with it unread would reset the connection
        # before the peer reads the error
        client.recv(65536)
    client.close()


def lock_store(path: Path, endpoint: str | None) -> int:
    """Hold an advisory flock on the db file for the daemon's lifetime: it keeps a second
    memoryd out without touching SQLite's own locks (dsh-memento can still open the file).
    The holder records its pid and socket next to the store, so a refused starter can say
    who owns it; the record means something only while the flock is held."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        if not _outwait_stopping_owner(path, fd):
            os.close(fd)
            raise _locked(path) from None
    try:
        write_owner(path, endpoint)
    except OSError as exc:
        log.warning("cannot record the store's owner next to it: %s", exc.strerror)
    return fd


def write_owner(path: Path, endpoint: str | None, *, stopping: bool = False) -> None:
    owner = owner_record_path(path)
    record: dict[str, Any] = {"pid": os.getpid(), "socket": endpoint}
    if stopping:
        record["stopping"] = True
    tmp = temporary_twin(owner)
    tmp.write_text(json.dumps(record) + "\n")
    os.chmod(tmp, 0o600)
    os.replace(tmp, owner)


def _outwait_stopping_owner(path: Path, fd: int) -> bool:
    """Wait for an owner that marked itself stopping to exit, then take the lock (True once
    held): a client that found no socket in that window and started us must not fail. An
    owner that is not stopping is refused at once."""
    record = read_owner_record(path)
    if record is None or not record.stopping:
        return False
    try:
        pidfd = os.pidfd_open(record.pid)
    except ProcessLookupError:
        pass  # gone already
    except OSError:
        return False
    else:
        log.info("store %s is owned by memoryd pid %d, which is stopping; waiting for it to exit", path, record.pid)
        try:
            select.select([pidfd], [], [], STOPPING_OWNER_WAIT_S)
        finally:
            os.close(pidfd)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _locked(path: Path) -> StoreLocked:
    details: dict[str, Any] = {"path": str(path)}
    record = read_owner_record(path)
    if record is not None:
        details.update(pid=record.pid, socket=record.socket)
    holder = f"memoryd pid {details['pid']}" if "pid" in details else "another memoryd"
    where = f", serving {details['socket']}" if details.get("socket") else ""
    return StoreLocked(f"store {path} is owned by {holder}{where}", details)


def unlock_store(path: Path, fd: int) -> None:
    """Remove the owner record before letting go of the lock: the next owner's record,
    written once it holds the lock, is never the one removed."""
    with contextlib.suppress(OSError):
        owner_record_path(path).unlink()
    os.close(fd)


def method_handlers(service: Service, adapters: dict[str, Any], mcp: McpFront) -> dict[str, Handler]:
    """Every method's handler, in the methods table's order: the daemon does not start
    unless each method of the table has exactly one (rpc.bind_handlers)."""
    writes = Writes(service)
    return bind_handlers(service.handlers(), Reads(service).handlers(), Audits(service).handlers(), writes.handlers(),
                         Snapshots(service).handlers(), Proposals(service, writes).handlers(),
                         Transfer(service, writes, adapters).handlers(), mcp.handlers())


@dataclass
class Daemon:
    config: Config
    writer: Writer
    approvals: Approvals
    service: Service
    dispatcher: Dispatcher
    #: what ``close`` lets go of, last opened first: the store's connections and their
    #: threads, then the store's lock
    resources: contextlib.AsyncExitStack
    #: where the ledger's heads are witnessed outside the store
    heads: Heads
    #: Litestream shipping the store to the [replicate] replica (None: not configured)
    replication: Replication | None = None
    connections: set[Connection] = field(default_factory=set)
    stopping: anyio.Event = field(default_factory=anyio.Event)
    #: the socket recorded as the store owner's (None: stdio, or systemd's socket)
    endpoint: str | None = None
    #: set while no connection is being served: the drain's last wait
    no_connections: anyio.Event = field(default_factory=anyio.Event)
    #: set by the drain: connections read no further line
    reading_stopped: bool = False
    #: accepted socket connections not yet closed (max_connections counts these)
    _open_sockets: int = 0
    _slot_freed: anyio.Event = field(default_factory=anyio.Event)
    _accept_log: RateLimitedLog = field(default_factory=lambda: RateLimitedLog(log))
    _refuse_log: RateLimitedLog = field(default_factory=lambda: RateLimitedLog(log))
    #: the caps on unsent output and on requests in flight over every connection together
    outbound: Outbound = field(init=False)

    def __post_init__(self) -> None:
        self.service.live = self.connections  # daemon/status lists them
        self.outbound = Outbound(self.config.max_unsent_bytes_total, self.config.max_inflight_total)

    @classmethod
    async def open(cls, config: Config, *, endpoint: str | None = None) -> Daemon:
        path = config.db_path
        busy_ms = config.busy_timeout_ms
        adapters = load_adapters()  # a refused adapter stops the start before the store is touched
        # so does a [replicate] section without Litestream installed
        replication = None if config.replicate is None else Replication(config.replicate, path)
        # Refuse read-only, corrupt and newer stores before creating or locking anything.
        storefile.refuse_read_only(path)
        version = storefile.inspect(path, busy_ms)
        storefile.prepare_path(path)
        # Any step from the lock on can fail (the store, a bad adapter): then what the
        # earlier steps opened is closed again, last first, and the lock let go.
        async with contextlib.AsyncExitStack() as resources:
            lock_fd = lock_store(path, endpoint)
            resources.callback(unlock_store, path, lock_fd)
            heads = Heads(path, config.heads_every_rows, config.heads_every_s)
            stop = await heads.last()
            writer = await Writer.open(path, version, busy_ms, stop, untouched=heads.untouched(stop))
            resources.push_async_callback(writer.aclose)
            await heads.witness(writer.anchor.head, "start")
            writer.anchor.on_commit = heads.committed
            readers = await Readers.open(path, busy_ms)
            resources.push_async_callback(readers.aclose)
            approvals = Approvals(config)
            service = Service(config, writer, readers, approvals)
            mcp = McpFront(service)
            if replication is not None:
                replication.bind(lambda: writer.anchor.head, service.read, writer.submit)
                service.replication = replication
            handlers = {name: h if name in UNBOUND_METHODS else service.sessions.binding(h)
                        for name, h in method_handlers(service, adapters, mcp).items()}
            mcp.methods = handlers  # an MCP tool call is served by the same handlers
            dispatcher = Dispatcher(handlers, max_batch_calls=config.max_batch_calls)
            return cls(config, writer, approvals, service, dispatcher, resources.pop_all(), heads, endpoint=endpoint,
                       replication=replication)

    async def serve_stream(self, sink: Sink, stream: Any, name: str = "socket") -> None:
        """Serve one connection until the peer's EOF or the drain, in ``running()``'s task
        group: ``sink`` the outgoing half (its ``peer``, if any, names the peer process),
        ``stream`` the anyio receive stream of bytes read, ``name`` the transport
        daemon/status shows."""
        cfg = self.config
        conn = Connection(sink, self.dispatcher, self.approvals, cfg.max_message_bytes, name,
                          max_buffered=cfg.max_buffered_bytes, half_line_s=cfg.half_line_timeout_s,
                          inflight=self.outbound)
        self.connections.add(conn)
        if self.no_connections.is_set():
            self.no_connections = anyio.Event()
        if self.reading_stopped:  # accepted just before the listener closed
            conn.stop_reading()
        try:
            await conn.serve(stream)
        finally:
            self.service.sessions.release(conn)
            self.service.watchers.drop(conn)
            self.connections.discard(conn)
            if not self.connections:
                self.no_connections.set()

    async def _serve_socket_client(self, stream: SocketStream) -> None:
        try:
            async with stream:
                halves = accepted(stream, self.config.max_buffered_bytes, outbound=self.outbound)
                if halves is not None:  # None: another user's, refused
                    incoming, outlet = halves
                    async with incoming, outlet.sending():
                        await self.serve_stream(outlet, incoming)
                        await outlet.finish()  # what is still queued goes out before the close
        except Exception:
            # One connection's failure (a bug of ours) must not take the others down.
            log.exception("connection failed")
        finally:
            self._open_sockets -= 1
            self._slot_freed.set()

    async def run(self, *, stdio: bool) -> None:
        # The handlers go in before the socket exists: a SIGTERM that arrives as soon as a
        # client can connect must drain and exit 0, not kill the process (socket left behind).
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            sock = None if stdio else self._bind()
            async with self.running() as serving:
                serving.start_soon(self._watch_signals, signals)
                if sock is None:
                    serving.start_soon(self._serve_stdio)
                else:
                    await self._start_listener(serving, sock)
                sd_notify("READY=1")
                path = self.service.socket_path
                served = "stdio" if sock is None else str(path) if path is not None else listener_name(sock)
                log.info("memoryd ready (%s, store %s)", served, self.config.db_path)
                await self.stopping.wait()
                sd_notify("STOPPING=1")

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[TaskGroup]:
        """The daemon's stack in the caller's event loop, without signals or a socket: the
        yielded task group serves connections (``serve_stream``, ``listen``). Leaving stops it
        as a signal does (``begin_stop``, ``_drain``), then the writer settles and the store
        closes. ``run`` uses it; so do the in-process tests and any embedder."""
        try:
            async with anyio.create_task_group() as root:
                root.start_soon(self.writer.serve)
                if self.replication is not None:  # the store is open: ship it
                    root.start_soon(self.replication.run)
                flush_scope = anyio.CancelScope()

                async def flusher() -> None:
                    with flush_scope:
                        async with anyio.create_task_group() as background:
                            background.start_soon(self.heads.run)  # the periodic heads, appended off the loop
                            await self.writer.flusher()

                root.start_soon(flusher)
                try:
                    async with anyio.create_task_group() as serving:
                        yield serving
                        self.begin_stop()
                        await self._drain(serving)
                finally:
                    flush_scope.cancel()
                    with anyio.CancelScope(shield=True):
                        # another program's change since the last batch is recorded before the
                        # stop head vouches for the file as memoryd leaves it
                        await self.writer.look_outside()
                        await self.writer.settled()
                        if self.replication is not None:  # its last sync holds every acknowledged write
                            await self.replication.stop()
                    self.writer.close()
        finally:
            await self.close()  # shielded; a second close (``_serve``'s) does nothing
        await self.heads.witness(self.writer.anchor.head, "stop")

    async def listen(self, serving: TaskGroup) -> None:
        """Serve the configured socket (or systemd's) from ``running()``'s task group."""
        await self._start_listener(serving, self._bind())

    def _bind(self) -> Any:
        """Before any task starts, so a refusal (a live daemon on the path) exits cleanly.
        The socket is bound under a temporary name that ``_start_listener`` moves into place."""
        sock = inherited_listener()
        #: the name our socket file has now (None: none of ours), removed on shutdown
        self._socket_file: Path | None = None
        if sock is None:  # else systemd owns the path: it is not ours to report or remove
            sock, self._socket_file = bind_unix(self.config.socket_path)
            self.service.socket_path = self.config.socket_path
        return sock

    async def _start_listener(self, tg: TaskGroup, sock: Any) -> None:
        sock.setblocking(False)
        self._accepting = anyio.CancelScope()
        tg.start_soon(self._accept_loop, tg, sock)
        # The listener already queues connections; the accept loop takes them from here on.
        if self._socket_file is not None and self.service.socket_path is not None:
            os.replace(self._socket_file, self.service.socket_path)
            self._socket_file = self.service.socket_path

    async def _accept_loop(self, tg: TaskGroup, sock: socket.socket) -> None:
        """anyio's listener, with our own loop around its accept: past ``max_connections`` a
        connection gets one error line and is closed, and running out of descriptors is a
        rate-limited log line and a retry once one closes, not a traceback per attempt."""
        limit = self.config.max_connections
        with self._accepting, contextlib.closing(sock):
            listener = await SocketListener.from_socket(sock)
            while True:
                try:
                    stream = await listener.accept()
                except anyio.BrokenResourceError as broken:
                    exc = broken.__cause__
                    if not isinstance(exc, OSError) or exc.errno not in _OUT_OF_RESOURCES:
                        if isinstance(exc, OSError) and exc.errno in (errno.ECONNABORTED, errno.EINTR):
                            continue
                        raise
                    self._accept_log.say(f"cannot accept a connection: {exc.strerror} "
                                         f"({errno.errorcode.get(exc.errno or 0, exc.errno)}), "
                                         f"{self._open_sockets} open; retrying when one closes")
                    self._slot_freed = anyio.Event()
                    with anyio.move_on_after(ACCEPT_RETRY_S):
                        await self._slot_freed.wait()
                    continue
                if self._open_sockets >= limit:
                    self._refuse_log.say(f"refusing a connection: max_connections ({limit}) are open")
                    _refuse(stream.extra(SocketAttribute.raw_socket))
                    continue
                self._open_sockets += 1
                tg.start_soon(self._serve_socket_client, stream)

    async def _serve_stdio(self) -> None:
        # fd 1 carries protocol lines only: keep a private copy for them and point fd 1 at
        # stderr, so a stray print() anywhere cannot corrupt the stream.
        out_fd = os.dup(1)
        os.dup2(2, 1)
        try:
            async with stdio_stream(0, out_fd, self.config.max_buffered_bytes, outbound=self.outbound) as (stdin, out):
                try:
                    await self.serve_stream(out, stdin, "stdio")
                except Exception:
                    log.exception("stdio connection failed")
                finally:
                    with anyio.move_on_after(5, shield=True):
                        await out.finish()  # whatever is still queued goes out
        finally:
            os.close(out_fd)
            self.begin_stop()

    def begin_stop(self) -> None:
        """Shutdown begins in the step the signal is seen: from now on no write is admitted."""
        self.approvals.cancel_all()
        self.stopping.set()

    async def _watch_signals(self, signals: Any) -> None:
        async for signum in signals:
            log.info("received %s, shutting down", signal.Signals(signum).name)
            self.begin_stop()
            return

    async def _drain(self, serving: TaskGroup) -> None:
        """Stop accepting; deny pending and new writes (each denied row first); finish
        queued commits; answer the requests already read; all within DRAIN_S."""
        # Before the socket goes: a starter that finds no daemon now waits for us to let go
        # of the store instead of failing with STORE_LOCKED.
        try:
            write_owner(self.config.db_path, self.endpoint, stopping=True)
        except OSError as exc:
            log.warning("cannot mark the store's owner record as stopping: %s", exc.strerror)
        accepting = getattr(self, "_accepting", None)
        if accepting is not None:
            accepting.cancel()  # the accept loop closes the listening socket as it ends
        path = getattr(self, "_socket_file", None)
        if path is not None:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        self.approvals.cancel_all()  # already, unless the stdio peer left first
        with anyio.move_on_after(DRAIN_S):
            # No connection reads another line; each answers every request it has read.
            # A line not read by now gets no reply: the peer sees EOF, and nothing was written.
            self.reading_stopped = True
            for conn in list(self.connections):
                conn.stop_reading()
            if self.connections:
                await self.no_connections.wait()
            await self.writer.idle()  # what no connection waits for: the recall bookkeeping
        serving.cancel_scope.cancel()

    async def close(self) -> None:
        """Close the store's connections and their threads, let go of the store; idempotent."""
        with anyio.CancelScope(shield=True):
            await self.resources.aclose()


def listener_name(sock: socket.socket) -> str:
    """How the ready line names an inherited listener: by its own address, since systemd's
    ``ListenStream=`` chose it and the configured ``socket_path`` may be another."""
    try:
        name = sock.getsockname()
    except OSError:
        return "an inherited socket"
    if isinstance(name, bytes):  # Linux's abstract namespace, written with "@" as systemd does
        return "@" + name[1:].decode(errors="backslashreplace")
    if isinstance(name, str):
        return name or "an unnamed inherited socket"
    return f"an inherited socket at {name[0]} port {name[1]}"  # ListenStream= named an IP address


def serve(cfg: Config, *, stdio: bool, log_level: str) -> int:
    """``memoryd serve`` (socket) and ``--stdio --standalone``: own the store and serve it."""
    logs.configure(log_level)
    return anyio.run(_serve, cfg, stdio)


async def _serve(cfg: Config, stdio: bool) -> int:
    """Serve until stopped. A :class:`~memoryd.errors.DaemonError` (a taken socket, an
    unsafe socket directory, a refused adapter) goes up to the command line, which says it
    in one line; the store's own refusals are said here."""
    # The socket recorded as the store owner's: none for stdio or an inherited (systemd) one.
    activated = os.environ.get("LISTEN_PID") == str(os.getpid())
    if not (stdio or activated):
        try:  # before the store is opened: a refusal creates nothing (bind checks again)
            refuse_taken(cfg.socket_path)
        except OSError as exc:
            print(f"memoryd: cannot use the socket path {cfg.socket_path}: {exc.strerror or exc}", file=sys.stderr)
            return 1
    try:
        daemon = await Daemon.open(cfg, endpoint=None if stdio or activated else str(cfg.socket_path))
    except StoreLocked as exc:
        print(f"memoryd: {exc.code}: {exc.message}", file=sys.stderr)
        return 1
    except ProtocolError as exc:
        print(f"memoryd: {exc.code}: {exc.message}: {cfg.db_path}", file=sys.stderr)
        return 1
    except (OSError, sqlite3.Error) as exc:
        print(f"memoryd: cannot open store {cfg.db_path}: {getattr(exc, 'strerror', None) or exc}", file=sys.stderr)
        return 1
    # What start-up made lives as long as the process: frozen out of the collector's sight,
    # its collections walk only what requests made.
    gc.freeze()
    try:
        await daemon.run(stdio=stdio)
    except BaseException:
        # let go of the store (and end its threads) on the way out
        await daemon.close()
        raise
    return 0
