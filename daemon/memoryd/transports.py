"""Where lines come from: the Unix socket (many sessions) and stdio (one harness child)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import selectors
import socket
import stat
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from memoryd_protocol.constants import DEFAULT_MAX_BUFFERED_BYTES
from memoryd_protocol.paths import temporary_twin

from .errors import DaemonError
from .outbound import Outbound
from .peers import PeerProcess as PeerProcess
from .peers import peer_credentials as peer_credentials
from .rundir import check_private_dir, ensure_private_dir

log = logging.getLogger("memoryd.transports")

READ_CHUNK = 65536
#: A long line goes to the transport this much at a time, as the peer reads: the transport
#: copies what it cannot send at once, and a whole reply copied is the reply held twice.
WRITE_PIECE = 4 * READ_CHUNK


def peer_allowed(peer_uid: int, daemon_uid: int) -> bool:
    """Who may talk to the daemon at all, as ssh-agent has it: its own uid, and root."""
    return peer_uid in (daemon_uid, 0)


class RefusalLog:
    """One warning per refused connection, at most ``burst`` per ``window_s`` seconds, the
    rest summed up in one line: a peer that connects in a loop cannot flood the log."""

    def __init__(self, burst: int = 10, window_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.burst = burst
        self.window_s = window_s
        self._clock = clock
        self._start = -float("inf")
        self._logged = 0
        self._suppressed = 0

    def refused(self, pid: int | None, uid: int | None) -> None:
        now = self._clock()
        if now - self._start >= self.window_s:
            if self._suppressed:
                log.warning("refused %d more connections from other users, not logged one by one (at most %d per %g s)",
                            self._suppressed, self.burst, self.window_s)
            self._start, self._logged, self._suppressed = now, 0, 0
        if self._logged >= self.burst:
            self._suppressed += 1
            return
        self._logged += 1
        if uid is None:
            log.warning("refused a connection whose peer credentials cannot be read")
        else:
            log.warning("refused a connection from pid %s uid %d: only the daemon's own uid (%d) and root may connect",
                        pid if pid else "?", uid, os.geteuid())


refusals = RefusalLog()


class SocketInUse(DaemonError):
    """A live daemon already answers on the socket path."""


def _is_live(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except OSError as exc:
            if exc.errno in (errno.ECONNREFUSED, errno.ENOENT, errno.ENOTSOCK):
                return False
            raise
        return True


#: sun_path holds 108 bytes, one of them the terminating NUL.
MAX_SOCKET_PATH = 107


def _temporary(path: Path) -> Path:
    """The name bind_unix binds first (then renames into place), a few bytes longer."""
    return temporary_twin(path)


def refuse_taken(path: Path) -> None:
    """Raise :class:`SocketInUse` unless ``path`` is free or a stale socket and short enough
    to bind under its temporary name; :class:`UnsafeDir` when its directory is not private."""
    check_private_dir(path.parent, missing_ok=True)
    length = len(os.fsencode(_temporary(path)))
    if length > MAX_SOCKET_PATH:
        raise SocketInUse(f"the socket path {path} is too long for a Unix socket: {length} bytes with its "
                          f"temporary name, at most {MAX_SOCKET_PATH}; choose a shorter --socket")
    if path.exists() or path.is_symlink():
        if not stat.S_ISSOCK(path.lstat().st_mode):
            raise SocketInUse(f"{path} exists and is not a socket")
        if _is_live(path):
            raise SocketInUse(f"a memoryd is already serving on {path}")


def _sweep_temporaries(path: Path) -> None:
    """Remove the ``.<name>.<pid>`` left by daemons killed before moving their socket into place."""
    prefix = f".{path.name}."
    try:
        names = os.listdir(path.parent)
    except OSError:
        return
    for name in names:
        pid = name[len(prefix):]
        if not name.startswith(prefix) or not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            leftover = path.parent / name
            with contextlib.suppress(OSError):
                if stat.S_ISSOCK(leftover.lstat().st_mode):
                    leftover.unlink()
        except OSError:
            pass  # alive (another user's): not ours to remove


def bind_unix(path: Path) -> tuple[socket.socket, Path]:
    """Bind and listen under a temporary name, returned with the socket: the caller moves it
    into place (``os.replace``) once it serves, so the path never names a socket nobody serves."""
    ensure_private_dir(path.parent)
    refuse_taken(path)
    _sweep_temporaries(path)
    tmp = _temporary(path)
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        old = os.umask(0o177)
        try:
            sock.bind(str(tmp))
        finally:
            os.umask(old)
        os.chmod(tmp, 0o600)
        sock.listen(128)
    except BaseException:
        sock.close()
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    return sock, tmp


def inherited_listener() -> socket.socket | None:
    """systemd socket activation: fd 3 when LISTEN_PID is us and LISTEN_FDS ≥ 1."""
    if os.environ.get("LISTEN_PID") != str(os.getpid()):
        return None
    try:
        count = int(os.environ.get("LISTEN_FDS", "0"))
    except ValueError:
        return None
    if count < 1:
        return None
    for var in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        os.environ.pop(var, None)
    os.set_inheritable(3, False)
    return socket.socket(fileno=3)


def sd_notify(message: str) -> None:
    """Tell systemd (Type=notify) about our state; a no-op outside systemd."""
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return
    if addr.startswith("@"):
        addr = "\0" + addr[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.connect(addr)
            s.sendall(message.encode())
    except OSError as exc:
        log.warning("sd_notify failed: %s", exc)


#: The default max_buffered_bytes, both ways: unsent output past it drops the connection (a
#: stalled peer must not make the daemon buffer without bound), unread input past it pauses reading.
MAX_UNREAD = DEFAULT_MAX_BUFFERED_BYTES


class _ReadBuffer(threading.local):
    """The buffer sockets read into, one per thread (event loop) rather than per connection:
    asyncio calls ``get_buffer``, ``recv_into`` and ``buffer_updated`` back to back on the
    loop's thread and ``buffer_updated`` copies the bytes out, so no two reads share it."""

    def __init__(self) -> None:
        self.view = memoryview(bytearray(READ_CHUNK))


_read_buffer = _ReadBuffer()


class StreamProtocol(asyncio.BufferedProtocol, asyncio.Protocol):
    """A connection as an asyncio Protocol, for both transports, with flow control both ways:
    reading pauses once unread chunks pass max_buffered, writing waits at the transport's
    high-water mark, and a peer that stops reading altogether is dropped.

    A socket is one transport both ways; stdio is two pipes (:func:`stdio_stream`), each
    calling ``connection_made``/``connection_lost`` here, told apart as ``transport`` (reads)
    and ``out`` (writes). Unlike anyio's streams this keeps one epoll registration per
    connection and never yields to write. Sockets read through the buffered half
    (:class:`_ReadBuffer`), so asyncio does not allocate a large bytes object per ``recv``;
    pipes have no buffered path and call ``data_received``. Failures are OSErrors.
    """

    def __init__(self, on_connect: Callable[[StreamProtocol], None] | None, max_buffered: int = MAX_UNREAD,
                 *, peer: PeerProcess | None = None, outbound: Outbound | None = None) -> None:
        """``on_connect`` runs once both directions are connected and the peer is let in.
        ``peer`` is given when no socket can say (stdio: our parent); without it the socket's
        credentials decide, and another user's connection is refused. ``outbound``: the
        daemon-wide cap on unsent output this connection counts towards."""
        self._on_connect = on_connect
        self.max_buffered = max_buffered
        self._outbound = outbound
        #: dropped by ``outbound`` for stopping to read: no further request is served
        self.dropped = False
        #: output not yet handed to the transport (views of the posted bytes, not copies)
        self._pending: deque[memoryview] = deque()
        self._pending_bytes = 0
        self._out_paused = False  # the transport is at its high-water mark
        self._closing = False  # close() was called: the writing side closes once fed
        self._aborted = False
        self._chunks: deque[bytes] = deque()
        self._queued = 0
        self._readable = asyncio.Event()
        self._writable = asyncio.Event()
        self._writable.set()
        #: the writing side is gone (closed, flushed, or aborted)
        self._sent = asyncio.Event()
        self._eof = False
        self._ended = False  # end_chunks was called
        self._paused = False
        self._check_peer = peer is None
        #: no more bytes can go out
        self.closed = False
        self.transport: asyncio.ReadTransport | None = None
        self.out: asyncio.WriteTransport | None = None
        self.peer: PeerProcess | None = peer

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # The first to come reads: asyncio's write pipe, which comes second, is a Transport too.
        if isinstance(transport, asyncio.ReadTransport) and self.transport is None:
            self.transport = transport
        if isinstance(transport, asyncio.WriteTransport):
            self.out = transport
        if self.transport is None or self.out is None:
            return  # stdio: the other pipe comes next
        if self._check_peer:
            sock = transport.get_extra_info("socket")
            creds = peer_credentials(sock)
            if creds is None or not peer_allowed(creds[1], os.geteuid()):
                assert isinstance(transport, asyncio.Transport)
                self._refuse(transport, sock, creds)
                return
            # The kernel's facts only: a relay says what it is later (initialize's relay).
            self.peer = PeerProcess.of(creds[0], creds[1])
        if self._on_connect is not None:
            self._on_connect(self)

    def _refuse(self, transport: asyncio.Transport, sock: Any, creds: tuple[int, int, int] | None) -> None:
        """Another user's connection: never served, nothing of it parsed. Shut both ways and
        discard its input first: closing a Unix socket with unread input resets the peer
        instead of giving it EOF."""
        refusals.refused(creds[0] if creds else None, creds[1] if creds else None)
        self.closed = True
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
            fd = sock.fileno()
            while os.read(fd, READ_CHUNK):  # bounded: the peer can add nothing after the shutdown
                pass
        transport.abort()

    def get_buffer(self, sizehint: int) -> memoryview:
        return _read_buffer.view

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(bytes(_read_buffer.view[:nbytes]))

    def data_received(self, data: bytes) -> None:
        self._chunks.append(data)
        self._queued += len(data)
        self._readable.set()
        if self._queued > self.max_buffered and not self._paused and self.transport is not None:
            self.transport.pause_reading()
            self._paused = True

    def eof_received(self) -> bool:
        self._eof = True
        self._readable.set()
        return True  # a socket stays half-open: replies to what was sent can still go out

    def connection_lost(self, exc: Exception | None) -> None:
        # A stdio pipe is one direction only: stdin's EOF must not stop the replies.
        if self.transport is None or self.transport.is_closing():
            self._eof = True
            self._readable.set()
        if self.out is None or self.out.is_closing():
            self.closed = True
            self._pending.clear()
            self._pending_bytes = 0
            self.resume_writing()  # nothing is behind any more
            self._sent.set()

    def pause_writing(self) -> None:
        self._out_paused = True
        self._writable.clear()

    def resume_writing(self) -> None:
        self._out_paused = False
        self._feed()

    def _feed(self) -> None:
        """Hand queued output to the transport, a piece at a time, until it pauses again."""
        out = self.out
        while self._pending and not self._out_paused and out is not None and not out.is_closing():
            view = self._pending.popleft()
            if len(view) > WRITE_PIECE:
                self._pending.appendleft(view[WRITE_PIECE:])
                view = view[:WRITE_PIECE]
            self._pending_bytes -= len(view)
            out.write(view)
        if not self._out_paused and (not self._pending or self.closed):
            self._writable.set()
            if self._outbound is not None:
                self._outbound.caught_up(self)
            if self._closing:
                # not from here: a pipe calling resume_writing goes on to end itself when closing
                asyncio.get_running_loop().call_soon(self.close)

    def unsent(self) -> int:
        """Bytes posted and not yet sent: queued here or in the transport's buffer."""
        out = self.out
        return self._pending_bytes + (0 if out is None else out.get_write_buffer_size())

    def end_chunks(self) -> None:
        """End ``chunks`` at once, as at EOF, whatever is queued (the drain); replies still go out."""
        self._ended = True
        self._readable.set()

    async def chunks(self) -> AsyncIterator[bytes]:
        while not self._ended:
            while self._chunks and not self._ended:
                chunk = self._chunks.popleft()
                self._queued -= len(chunk)
                if self._paused and self._queued <= self.max_buffered // 2 and self.transport is not None:
                    self._paused = False
                    self.transport.resume_reading()
                yield chunk
            if self._eof or self._ended:
                return
            self._readable.clear()
            await self._readable.wait()

    def post(self, data: bytes) -> None:
        """Queue bytes without waiting; a peer with more than max_buffered bytes unsent is
        dropped (one line, however long, always goes out). BrokenPipeError once it is gone."""
        out = self.out
        if self.closed or out is None or out.is_closing():
            raise BrokenPipeError("the peer is gone")
        unsent = self.unsent()
        if unsent > self.max_buffered:
            log.warning("dropping a connection that stopped reading: %d bytes unsent (max_buffered_bytes %d)",
                        unsent, self.max_buffered)
            self._abort_out()  # only the writing side: what was read is still served
            raise BrokenPipeError("the peer stopped reading")
        if self._writable.is_set() and len(data) <= WRITE_PIECE:
            out.write(data)  # the common case: the transport sends it at once
        else:
            self._pending.append(memoryview(data))
            self._pending_bytes += len(data)
            self._feed()
        if not self._writable.is_set() and self._outbound is not None:
            self._outbound.behind(self)  # behind now, or more output while behind

    async def drain(self) -> None:
        if not self._writable.is_set():
            await self._writable.wait()
        if self.closed:
            raise BrokenPipeError("the peer is gone")

    def close(self) -> None:
        """Stop reading; what is queued still goes out, then the writing side closes."""
        self._closing = True
        if self._pending and self.out is not None and not self.out.is_closing():
            if isinstance(self.transport, asyncio.WriteTransport):
                self.transport.pause_reading()  # a socket: one transport both ways
            elif self.transport is not None:
                self.transport.close()  # stdio's read pipe
            return  # _feed closes the rest once the queue is in the transport
        for t in {self.transport, self.out}:
            if t is not None:
                t.close()

    async def finish(self) -> None:
        """Close, and return once everything queued went out (the caller bounds the wait)."""
        self.close()
        if self.out is not None:
            await self._sent.wait()

    def drop(self) -> None:
        """Close now, dropping what is unsent and what was read but not served yet."""
        self.dropped = True
        self.end_chunks()
        self.abort()

    def _abort_out(self) -> None:
        self._pending.clear()
        self._pending_bytes = 0
        # once only: asyncio's pipes fail when aborted again before they are lost
        if self.out is not None and not self._sent.is_set() and not self._aborted:
            self._aborted = True
            self.out.abort()

    def abort(self) -> None:
        """Close both directions now, dropping what is unsent."""
        self._abort_out()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()  # a read pipe (a socket's transport is aborted above)


def _pollable(fd: int) -> bool:
    """epoll can watch ``fd`` (not a regular file, nor /dev/null), so asyncio's pipes can serve it."""
    with selectors.DefaultSelector() as probe:
        try:
            probe.register(fd, selectors.EVENT_READ)
        except PermissionError:
            return False
    return True


class FileReader(asyncio.ReadTransport):
    """The regular-file fallback for stdin, which asyncio's pipe transports refuse: reads run
    in a worker thread, one chunk at a time, and stop while reading is paused."""

    def __init__(self, fd: int, protocol: asyncio.Protocol) -> None:
        super().__init__()
        self._fd = fd
        self._protocol = protocol
        self._closing = False
        self._reading = asyncio.Event()
        self._reading.set()
        protocol.connection_made(self)
        self._task = asyncio.get_running_loop().create_task(self._pump())

    async def _pump(self) -> None:
        loop = asyncio.get_running_loop()
        exc: OSError | None = None
        try:
            while True:
                await self._reading.wait()
                data = await loop.run_in_executor(None, os.read, self._fd, READ_CHUNK)
                if not data:
                    self._protocol.eof_received()
                    break
                self._protocol.data_received(data)
        except OSError as e:
            exc = e
        except asyncio.CancelledError:
            pass  # close(): only ever cancelled by it
        self._closing = True
        self._protocol.connection_lost(exc)

    def is_reading(self) -> bool:
        return self._reading.is_set() and not self._closing

    def pause_reading(self) -> None:
        self._reading.clear()

    def resume_reading(self) -> None:
        self._reading.set()

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        if not self._closing:
            self._closing = True
            self._task.cancel()


class FileWriter(asyncio.WriteTransport):
    """The regular-file fallback for stdout: a file takes every write whole, so nothing is buffered."""

    def __init__(self, fd: int, protocol: asyncio.Protocol) -> None:
        super().__init__()
        self._fd = fd
        self._protocol = protocol
        self._closing = False
        protocol.connection_made(self)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing:
            return
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self._fd, view):]
        except OSError as exc:  # a full disk, say: nothing more can go out
            self._lose(exc)

    def get_write_buffer_size(self) -> int:
        return 0

    def is_closing(self) -> bool:
        return self._closing

    def can_write_eof(self) -> bool:
        return False

    def close(self) -> None:
        self._lose(None)

    def abort(self) -> None:
        self._lose(None)

    def _lose(self, exc: Exception | None) -> None:
        if not self._closing:
            self._closing = True
            asyncio.get_running_loop().call_soon(self._protocol.connection_lost, exc)


async def _connect_stdio(proto: StreamProtocol, in_fd: int, out_fd: int) -> None:
    loop = asyncio.get_running_loop()
    a, b = os.fstat(in_fd), os.fstat(out_fd)
    if stat.S_ISSOCK(a.st_mode) and (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino):
        # One socket both ways (inetd style): a write pipe on it would take input for EOF.
        await loop.connect_accepted_socket(lambda: proto, socket.socket(fileno=os.dup(in_fd)))
        return
    if _pollable(in_fd):
        await loop.connect_read_pipe(lambda: proto, os.fdopen(in_fd, "rb", buffering=0, closefd=False))
    else:
        FileReader(in_fd, proto)
    if _pollable(out_fd):
        await loop.connect_write_pipe(lambda: proto, os.fdopen(out_fd, "wb", buffering=0, closefd=False))
    else:
        FileWriter(out_fd, proto)


@contextlib.asynccontextmanager
async def stdio_stream(in_fd: int, out_fd: int, max_buffered: int = MAX_UNREAD, *,
                       outbound: Outbound | None = None) -> AsyncIterator[StreamProtocol]:
    """stdio as a :class:`StreamProtocol` whose peer is our parent. On exit unsent bytes are
    dropped (``finish`` first to send them), and the descriptors, shared with the parent,
    stay open and get their blocking mode back."""
    saved = [(fd, os.get_blocking(fd)) for fd in (in_fd, out_fd)]
    proto = StreamProtocol(None, max_buffered, peer=PeerProcess.of(os.getppid()), outbound=outbound)
    try:
        await _connect_stdio(proto, in_fd, out_fd)
        yield proto
    finally:
        proto.abort()
        for fd, blocking in saved:
            with contextlib.suppress(OSError):
                os.set_blocking(fd, blocking)
