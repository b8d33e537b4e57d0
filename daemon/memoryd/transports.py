"""Where lines come from: the Unix socket (many sessions) and stdio (one harness child)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket
import stat
import struct
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from memoryd_protocol.constants import DEFAULT_MAX_BUFFERED_BYTES

log = logging.getLogger("memoryd.transports")

READ_CHUNK = 65536


@dataclass(frozen=True)
class PeerProcess:
    """The process on the other end of a connection, as the kernel reports it (not as the
    client claims): shown to the human who approves that connection's writes."""

    pid: int
    exe: str | None = None

    @classmethod
    def of(cls, pid: int) -> PeerProcess | None:
        if pid <= 0:  # 0: the peer lives in another pid namespace
            return None
        try:
            exe: str | None = os.readlink(f"/proc/{pid}/exe")
        except OSError:  # gone already, not ours to inspect, or no /proc
            exe = None
        return cls(pid, exe)


_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def socket_peer(sock: Any) -> PeerProcess | None:
    """SO_PEERCRED of a connected Unix socket (or asyncio's wrapper of one): the peer's pid
    at connect time."""
    if sock is None:
        return None
    try:
        pid, _uid, _gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    except (OSError, AttributeError, struct.error):  # not a Unix socket, or not Linux
        return None
    return PeerProcess.of(_behind_relay(pid))


def _is_stdio_relay(argv: list[str]) -> bool:
    """``memoryd serve --stdio`` without ``--standalone`` (console script or ``-m memoryd``)."""
    is_memoryd = any(os.path.basename(a) == "memoryd" for a in argv[:3]) or "memoryd" in argv[1:3]
    return is_memoryd and "serve" in argv and "--stdio" in argv and "--standalone" not in argv


def _behind_relay(pid: int) -> int:
    """The process a human should see for a connection: for a stdio relay, the harness that
    spawned it (its parent), since the relay only copies that harness's lines."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode("utf-8", "replace").split("\0")
        if not _is_stdio_relay(argv):
            return pid
        # /proc/<pid>/stat: "pid (comm) state ppid ..."; comm may contain spaces and parens
        ppid = int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        return pid
    return ppid if ppid > 1 else pid


class SocketInUse(Exception):
    """A live daemon already answers on the socket path."""


def _is_live(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except (ConnectionRefusedError, FileNotFoundError):
            return False
        except OSError as exc:
            if exc.errno in (errno.ECONNREFUSED, errno.ENOENT, errno.ENOTSOCK):
                return False
            raise
        return True


#: sun_path holds 108 bytes, one of them the terminating NUL.
MAX_SOCKET_PATH = 107


def _temporary(path: Path) -> Path:
    """The name bind_unix binds first (then renames into place), a few bytes longer."""
    return path.with_name(f".{path.name}.{os.getpid()}")


def refuse_taken(path: Path) -> None:
    """Raise :class:`SocketInUse` unless ``path`` is free or a stale socket, and short
    enough to bind (with the temporary name it is bound under first)."""
    length = len(os.fsencode(_temporary(path)))
    if length > MAX_SOCKET_PATH:
        raise SocketInUse(f"the socket path {path} is too long for a Unix socket: {length} bytes with its "
                          f"temporary name, at most {MAX_SOCKET_PATH}; choose a shorter --socket")
    if path.exists() or path.is_symlink():
        if not stat.S_ISSOCK(path.lstat().st_mode):
            raise SocketInUse(f"{path} exists and is not a socket")
        if _is_live(path):
            raise SocketInUse(f"a memoryd is already serving on {path}")


def bind_unix(path: Path, *, private_dir: bool) -> socket.socket:
    """Bind and listen, then move the socket into place: the path appears only once it
    accepts connections. A stale socket file is replaced; a live daemon is refused."""
    if private_dir:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(path.parent, 0o700)
    elif not path.parent.exists():
        path.parent.mkdir(parents=True, mode=0o700)
    refuse_taken(path)
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
        os.replace(tmp, path)
    except BaseException:
        sock.close()
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    return sock


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


#: The default max_buffered_bytes: a connection whose peer has not read this much of what
#: we sent is dropped (a stalled approver must not make the daemon buffer without bound),
#: and at most this much of its unread input is queued before the daemon stops reading it.
MAX_UNREAD = DEFAULT_MAX_BUFFERED_BYTES
#: Above this, a reply waits (drain) before its request completes; notifications never wait.
HIGH_WATER = 256 * 1024


class SlowConsumer(OSError):
    """The peer stopped reading."""


class FdStream:
    """Non-blocking reads and writes on raw file descriptors (stdio mode), driven by the
    event loop's readiness notifications, with a thread fallback for regular files.

    ``post`` never blocks: what the pipe does not take at once is buffered and flushed
    when fd 1 becomes writable. The descriptors' blocking mode is restored on close,
    since the parent shares them.
    """

    def __init__(self, in_fd: int, out_fd: int, max_buffered: int = MAX_UNREAD) -> None:
        self.max_buffered = max_buffered
        self.in_fd = in_fd
        self.out_fd = out_fd
        self._saved = (os.get_blocking(in_fd), os.get_blocking(out_fd))
        self._in_pollable = not stat.S_ISREG(os.fstat(in_fd).st_mode)
        if self._in_pollable:
            os.set_blocking(in_fd, False)
        self._out_pollable = not stat.S_ISREG(os.fstat(out_fd).st_mode)
        if self._out_pollable:
            os.set_blocking(out_fd, False)
        self._pending = bytearray()
        self._drained = asyncio.Event()
        self._drained.set()
        self._broken: OSError | None = None
        #: stdio's peer is the process that spawned us
        self.peer = PeerProcess.of(os.getppid())

    async def chunks(self) -> AsyncIterator[bytes]:
        while True:
            if self._in_pollable:
                try:
                    data = os.read(self.in_fd, READ_CHUNK)
                except BlockingIOError:
                    await anyio.wait_readable(self.in_fd)
                    continue
            else:
                data = await anyio.to_thread.run_sync(os.read, self.in_fd, READ_CHUNK)
            if not data:
                return
            yield data

    def post(self, data: bytes) -> None:
        if self._broken is not None:
            raise anyio.BrokenResourceError from self._broken
        if not self._out_pollable:
            os.write(self.out_fd, data)  # a regular file takes everything
            return
        if self._pending:
            self._pending += data
        else:
            try:
                n = os.write(self.out_fd, data)
            except BlockingIOError:
                n = 0
            except OSError as exc:
                self._broken = exc
                raise anyio.BrokenResourceError from exc
            if n == len(data):
                return
            self._pending += data[n:]
            asyncio.get_running_loop().add_writer(self.out_fd, self._flush)
        if len(self._pending) > self.max_buffered + len(data):
            log.warning("stdout is not being read: %d bytes unsent (max_buffered_bytes %d); closing",
                        len(self._pending), self.max_buffered)
            self._broken = SlowConsumer("stdout is not being read")
            raise anyio.BrokenResourceError from self._broken
        if len(self._pending) > HIGH_WATER:
            self._drained.clear()

    def _flush(self) -> None:
        try:
            n = os.write(self.out_fd, self._pending)
        except BlockingIOError:
            return
        except OSError as exc:
            self._broken = exc
            n = len(self._pending)
        del self._pending[:n]
        if len(self._pending) <= HIGH_WATER:
            self._drained.set()
        if not self._pending:
            asyncio.get_running_loop().remove_writer(self.out_fd)

    async def drain(self) -> None:
        if not self._drained.is_set():
            await self._drained.wait()
        if self._broken is not None:
            raise anyio.BrokenResourceError from self._broken

    async def flush_all(self) -> None:
        """Before exit: whatever is still buffered goes out (bounded by the caller)."""
        while self._pending and self._broken is None:
            await anyio.wait_writable(self.out_fd)
            self._flush()

    def close(self) -> None:
        os.set_blocking(self.in_fd, self._saved[0])
        os.set_blocking(self.out_fd, self._saved[1])


class StreamProtocol(asyncio.Protocol):
    """An accepted socket as an asyncio Protocol: bytes arrive by callback, replies go
    out through the transport's buffer.

    anyio's UNIX socket stream re-registers the socket with epoll on every receive and
    yields on every send; on a 2-core machine that was a third of a query's round trip.
    This keeps one registration for the connection's life and never yields to write a
    reply, with flow control both ways (pause_reading when unread chunks pile up,
    pause_writing when the peer does not read).
    """

    def __init__(self, on_connect: Callable[[StreamProtocol], None], max_buffered: int = MAX_UNREAD) -> None:
        self._on_connect = on_connect
        #: max_buffered_bytes: unread input queued here, and unsent output, per connection
        self.max_buffered = max_buffered
        self._chunks: deque[bytes] = deque()
        self._queued = 0
        self._readable = asyncio.Event()
        self._writable = asyncio.Event()
        self._writable.set()
        self._eof = False
        self._paused = False
        self.closed = False
        self.transport: asyncio.Transport | None = None
        self.peer: PeerProcess | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.peer = socket_peer(transport.get_extra_info("socket"))
        self._on_connect(self)

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
        return True  # half-closed: replies to what was sent can still go out

    def connection_lost(self, exc: Exception | None) -> None:
        self._eof = True
        self.closed = True
        self._readable.set()
        self._writable.set()

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    async def chunks(self) -> AsyncIterator[bytes]:
        while True:
            while self._chunks:
                chunk = self._chunks.popleft()
                self._queued -= len(chunk)
                if self._paused and self._queued <= self.max_buffered // 2 and self.transport is not None:
                    self._paused = False
                    self.transport.resume_reading()
                yield chunk
            if self._eof:
                return
            self._readable.clear()
            await self._readable.wait()

    def post(self, data: bytes) -> None:
        """Queue bytes for the peer without waiting; a peer that stops reading altogether
        is disconnected once more than max_buffered bytes wait for it (one line, however
        long, always goes out)."""
        if self.closed or self.transport is None or self.transport.is_closing():
            raise anyio.BrokenResourceError
        unsent = self.transport.get_write_buffer_size()
        if unsent > self.max_buffered:
            log.warning("dropping a connection that stopped reading: %d bytes unsent (max_buffered_bytes %d)",
                        unsent, self.max_buffered)
            self.transport.abort()
            raise anyio.BrokenResourceError
        self.transport.write(data)

    async def drain(self) -> None:
        if not self._writable.is_set():
            await self._writable.wait()
        if self.closed:
            raise anyio.BrokenResourceError

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
