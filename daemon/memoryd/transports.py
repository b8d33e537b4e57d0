"""Where lines come from: the Unix socket (many sessions) and stdio (one harness child).

Both are served with anyio's streams, the socket's accepted by anyio's listener (app.py).
What a connection reads is framed by :class:`Lines`; what it sends goes through an
:class:`Outlet`. The MCP front-end reads the same :class:`Lines` once a connection
switches to it, so the caps on a line hold there too.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import math
import os
import selectors
import socket
import stat
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Final

import anyio
from anyio.abc import AnyByteReceiveStream, ByteReceiveStream, SocketAttribute, SocketStream
from anyio.streams.buffered import BufferedByteReceiveStream
from anyio.streams.file import FileReadStream
from memoryd_protocol.constants import DEFAULT_MAX_BUFFERED_BYTES
from memoryd_protocol.framing import OVERSIZE
from memoryd_protocol.paths import temporary_twin

from .errors import DaemonError
from .outbound import Outbound
from .peers import PeerProcess, peer_credentials
from .ratelog import RateLimitedLog
from .rundir import check_private_dir, ensure_private_dir

log = logging.getLogger("memoryd.transports")

READ_CHUNK = 65536


def peer_allowed(peer_uid: int, daemon_uid: int) -> bool:
    """Who may talk to the daemon at all, as ssh-agent has it: its own uid, and root."""
    return peer_uid in (daemon_uid, 0)


#: one warning per refused connection, at most 10 a minute: a peer that connects in a loop
#: cannot flood the log
refusals = RateLimitedLog(log, burst=10)


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


def refuse_taken(path: Path) -> None:
    """Raise :class:`SocketInUse` unless ``path`` is free or a stale socket and short enough
    to bind under its temporary name; :class:`UnsafeDir` when its directory is not private."""
    check_private_dir(path.parent, missing_ok=True)
    length = len(os.fsencode(temporary_twin(path)))
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
    tmp = temporary_twin(path)
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


#: Returned by :meth:`Lines.next` for an incomplete line held longer than the half-line timeout.
TIMED_OUT: Final = b"\x00timed out"


class _HalfLine(Exception):
    """The bytes of an incomplete line waited too long for the rest."""


class Lines(ByteReceiveStream):
    """A connection's input as NDJSON lines (wire-v1.md §1), for the socket, stdio and the
    MCP front-end alike: ``receive_until(b"\\n")`` over the stream, so nothing is read
    beyond what the connection asks for. A line longer than ``max_bytes`` is dropped as it
    streams in, never held whole, and reported once as OVERSIZE. Bytes of an incomplete
    line may wait for the rest ``half_line_s`` in all (the time spent waiting for the peer);
    an idle connection is never timed out. The buffer reads through :meth:`receive`, where
    each wait for bytes can be ended at once (``stop``), and one made while an incomplete
    line is held is timed."""

    def __init__(self, stream: AnyByteReceiveStream, max_bytes: int, half_line_s: float) -> None:
        self._stream = stream
        self._max = max_bytes
        self._half_line_s = half_line_s
        self._buffered = BufferedByteReceiveStream(self)
        #: bytes read and not yet handed out as lines: an incomplete line's, when nonzero
        self.held = 0
        #: a line over the limit is being dropped
        self._discarding = False
        #: seconds the incomplete line may still wait
        self._left = half_line_s
        #: ``stop`` was called: the read waiting now ends, and no further line is read
        self._stopped = False
        self._ended = False
        #: the scope of the read waiting for bytes now, if any
        self._scope: anyio.CancelScope | None = None

    async def receive(self, max_bytes: int = READ_CHUNK) -> bytes:
        if self._stopped:
            raise anyio.EndOfStream
        partial = self.held > 0 or self._discarding
        started = anyio.current_time() if partial else 0.0
        with anyio.CancelScope(deadline=started + self._left if partial else math.inf) as scope:
            self._scope = scope
            try:
                data: bytes = await self._stream.receive()
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
                log.debug("a read failed: %s", exc)
                raise anyio.EndOfStream from None
        self._scope = None
        if scope.cancelled_caught:
            if self._stopped:
                raise anyio.EndOfStream
            raise _HalfLine
        if partial:
            self._left -= anyio.current_time() - started
        self.held += len(data)
        return data

    async def aclose(self) -> None:
        await self._stream.aclose()

    def stop(self) -> None:
        """Read no further line: a read waiting for bytes ends at once, as at EOF."""
        self._stopped = True
        if self._scope is not None:
            self._scope.cancel()

    async def next(self) -> bytes | None:
        """The next line without its ``\\n`` (blank lines skipped, a trailing ``\\r`` kept),
        OVERSIZE for one over the limit, TIMED_OUT, or None at the end (EOF or ``stop``)."""
        while not (self._stopped or self._ended):
            try:
                line = await self._buffered.receive_until(b"\n", self._max + 1)
            except anyio.DelimiterNotFound:
                return await self._discard()
            except anyio.IncompleteRead:
                return self._last()
            except _HalfLine:
                self._ended = True
                return TIMED_OUT
            self.held -= len(line) + 1
            self._left = self._half_line_s
            if len(line) > self._max:
                return OVERSIZE
            if line and not (line[:1].isspace() and line.isspace()):
                return line
        return None

    def _last(self) -> bytes | None:
        """At EOF: the unterminated last line, if any (none after ``stop``)."""
        self._ended = True
        if self._stopped:
            return None
        rest = self._buffered.buffer
        return rest if rest.strip() else None

    async def _discard(self) -> bytes | None:
        """Drop the line over the limit up to its ``\\n``, then report it."""
        self._discarding = True
        await self._buffered.receive(sys.maxsize)  # what is held of it: the whole buffer
        self.held = 0
        try:
            while True:
                data = await self.receive()
                end = data.find(b"\n")
                if end >= 0:
                    rest = data[end + 1:]
                    self._buffered.feed_data(rest)
                    self.held = len(rest)
                    break
                self.held = 0
        except anyio.EndOfStream:
            self._ended = True
            if self._stopped:
                return None
        except _HalfLine:
            self._ended = True
            return TIMED_OUT
        self._discarding = False
        self._left = self._half_line_s
        return OVERSIZE


class Outlet:
    """A connection's outgoing half, with flow control: ``post`` never waits. What the
    kernel takes at once goes at once; the rest waits in a bounded memory object stream,
    sent by the outlet's own task as the peer reads, and ``drain`` waits until it is sent.
    A peer with more than ``max_buffered`` bytes unsent is dropped (one line, however long,
    always goes out). Failures are OSErrors.

    The kernel's count of what it took is what the caps count, so the outlet writes with
    the descriptor's own non-blocking ``send`` and waits with ``anyio.wait_writable``."""

    def __init__(self, target: socket.socket | int, send: Callable[[memoryview], int], max_buffered: int, *,
                 peer: PeerProcess | None, outbound: Outbound | None = None,
                 hang_up: Callable[[], None] | None = None) -> None:
        """``target`` is waited on, ``send`` writes to it; ``peer`` the process on the
        other end; ``outbound`` the daemon-wide cap on unsent output this counts towards;
        ``hang_up`` ends both directions at once (a socket's shutdown)."""
        self.peer = peer
        self.max_buffered = max_buffered
        #: dropped by ``outbound`` for stopping to read: no further request is served
        self.dropped = False
        #: no more bytes can go out
        self.closed = False
        self._target = target
        self._send = send
        self._outbound = outbound
        self._hang_up = hang_up
        # Every item is one post of at least a byte: the byte cap is always reached first.
        self._queue_in, self._queue = anyio.create_memory_object_stream[memoryview](max_buffered + 1)
        self._unsent = 0
        self._caught_up = anyio.Event()
        self._caught_up.set()
        self._sending = anyio.CancelScope()
        #: the sending task ended: everything went out, or the peer is gone
        self._sent = anyio.Event()

    @contextlib.asynccontextmanager
    async def sending(self) -> AsyncIterator[Outlet]:
        """The outlet with its sending task; leaving drops what is unsent (``finish`` first)."""
        with self._queue_in, self._queue:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._send_queued)
                try:
                    yield self
                finally:
                    self.abort()

    def unsent(self) -> int:
        """Bytes posted and not yet taken by the kernel."""
        return self._unsent

    def post(self, data: bytes) -> None:
        """Queue bytes without waiting. BrokenPipeError once the peer is gone, or when it has
        more than max_buffered bytes unsent (it is dropped then)."""
        if self.closed:
            raise BrokenPipeError("the peer is gone")
        if self._unsent > self.max_buffered:
            log.warning("dropping a connection that stopped reading: %d bytes unsent (max_buffered_bytes %d)",
                        self._unsent, self.max_buffered)
            self.abort()  # what was read is still served; its replies are lost
            raise BrokenPipeError("the peer stopped reading")
        view = memoryview(data)
        if not self._unsent:
            try:
                sent = self._send(view)
            except BlockingIOError:
                sent = 0
            except OSError:
                self._lost()
                raise BrokenPipeError("the peer is gone") from None
            if sent == len(view):
                return  # the common case: the kernel took it all
            view = view[sent:]
            self._caught_up = anyio.Event()
        self._queue_in.send_nowait(view)
        self._unsent += len(view)
        if self._outbound is not None:
            self._outbound.behind(self)  # behind now, or more output while behind

    async def _send_queued(self) -> None:
        try:
            with self._sending:
                async for view in self._queue:
                    while view:
                        try:
                            sent = self._send(view)
                        except BlockingIOError:
                            await anyio.wait_writable(self._target)
                            continue
                        except OSError:
                            self._lost()
                            return
                        view = view[sent:]
                        self._unsent -= sent
                    if not self._unsent:
                        self._caught_up.set()
                        if self._outbound is not None:
                            self._outbound.caught_up(self)
        finally:
            self._sent.set()

    async def drain(self) -> None:
        """Until the peer has taken what is queued."""
        if self._unsent:
            await self._caught_up.wait()
        if self.closed:
            raise BrokenPipeError("the peer is gone")

    async def finish(self) -> None:
        """Post nothing more, and return once everything queued went out (the caller bounds
        the wait)."""
        self.closed = True
        self._queue_in.close()
        await self._sent.wait()

    def _lost(self) -> None:
        """No more bytes can go out: what is queued is dropped."""
        self.closed = True
        self._sending.cancel()
        while True:
            try:
                self._queue.receive_nowait()
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                break
        self._unsent = 0
        self._caught_up.set()
        if self._outbound is not None:
            self._outbound.caught_up(self)

    def abort(self) -> None:
        """Drop what is unsent and send nothing more; a socket is shut both ways, so its
        reader sees the end at once."""
        self._lost()
        if self._hang_up is not None:
            self._hang_up()

    def drop(self) -> None:
        """Dropped for not reading (outbound.py): what it sent and was not served yet never is."""
        self.dropped = True
        self.abort()


class _FdReceiveStream(ByteReceiveStream):
    """A descriptor epoll can watch (a pipe, a socket, a terminal), read as anyio reads a
    socket, but watched by the event loop from its first wait until the stream is closed:
    anyio's ``wait_readable`` adds and removes the descriptor for every wait, which on every
    request's path costs more than the read itself (bench/results/SIMPLICITY-2.md). Closing
    the stream stops the watch and leaves the descriptor open: stdio's is the parent's, a
    socket's is closed by its own stream, after this one."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiter: asyncio.Future[None] | None = None

    def _readable(self) -> None:
        waiter = self._waiter
        if waiter is None or waiter.done():
            self._unwatch()  # the wait was cancelled: watch again at the next one
        else:
            waiter.set_result(None)

    def _unwatch(self) -> None:
        if self._loop is not None:
            self._loop.remove_reader(self._fd)
            self._loop = None

    async def receive(self, max_bytes: int = READ_CHUNK) -> bytes:
        while True:
            try:
                data = os.read(self._fd, max_bytes)
            except BlockingIOError:
                if self._loop is None:
                    self._loop = asyncio.get_running_loop()
                    self._loop.add_reader(self._fd, self._readable)
                self._waiter = self._loop.create_future()
                try:
                    await self._waiter
                finally:
                    self._waiter = None
                continue
            if not data:
                self._unwatch()
                raise anyio.EndOfStream
            return data

    async def aclose(self) -> None:
        self._unwatch()


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def accepted(stream: SocketStream, max_buffered: int, *,
             outbound: Outbound | None = None) -> tuple[ByteReceiveStream, Outlet] | None:
    """The two halves of an accepted connection, whose peer credentials (SO_PEERCRED) decide:
    None for another user's, which is refused before anything it sent is read. The socket is
    read as a descriptor: a read that ``Lines.stop`` or the half-line timeout cancels must
    not race the socket turning readable (anyio's socket stream can, in its reader callback)."""
    sock: socket.socket = stream.extra(SocketAttribute.raw_socket)
    creds = peer_credentials(sock)
    if creds is None or not peer_allowed(creds[1], os.geteuid()):
        if creds is None:
            refusals.say("refused a connection whose peer credentials cannot be read")
        else:
            refusals.say(f"refused a connection from pid {creds[0] or '?'} uid {creds[1]}: only the daemon's own "
                         f"uid ({os.geteuid()}) and root may connect")
        # Shut both ways and discard its input first: closing a Unix socket with unread
        # input resets the peer instead of giving it EOF.
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
            while sock.recv(READ_CHUNK):  # bounded: the peer can add nothing after the shutdown
                pass
        return None
    # The kernel's facts only: a relay says what it is later (initialize's relay).
    return _FdReceiveStream(sock.fileno()), Outlet(sock, sock.send, max_buffered, outbound=outbound,
                                                  peer=PeerProcess.of(creds[0], creds[1]), hang_up=lambda: _shut(sock))


def _pollable(fd: int) -> bool:
    """epoll can watch ``fd`` (not a regular file, nor /dev/null)."""
    with selectors.DefaultSelector() as probe:
        try:
            probe.register(fd, selectors.EVENT_READ)
        except PermissionError:
            return False
    return True


@contextlib.asynccontextmanager
async def stdio_stream(in_fd: int, out_fd: int, max_buffered: int = DEFAULT_MAX_BUFFERED_BYTES, *,
                       outbound: Outbound | None = None) -> AsyncIterator[tuple[ByteReceiveStream, Outlet]]:
    """stdin as a byte stream and stdout as an :class:`Outlet` whose peer is our parent.
    What epoll cannot watch (a regular file, /dev/null) is read on a worker thread and
    written whole. On exit unsent bytes are dropped (``finish`` first to send them), and
    the descriptors, shared with the parent, stay open and get their blocking mode back."""
    saved = [(fd, os.get_blocking(fd)) for fd in (in_fd, out_fd)]
    stdin: ByteReceiveStream
    if _pollable(in_fd):
        os.set_blocking(in_fd, False)
        stdin = _FdReceiveStream(in_fd)
    else:
        stdin = FileReadStream(os.fdopen(in_fd, "rb", buffering=0, closefd=False))
    if _pollable(out_fd):
        os.set_blocking(out_fd, False)

    def write(view: memoryview) -> int:
        return os.write(out_fd, view)

    outlet = Outlet(out_fd, write, max_buffered, peer=PeerProcess.of(os.getppid()), outbound=outbound)
    try:
        async with stdin, outlet.sending():
            yield stdin, outlet
    finally:
        for fd, blocking in saved:
            with contextlib.suppress(OSError):
                os.set_blocking(fd, blocking)
