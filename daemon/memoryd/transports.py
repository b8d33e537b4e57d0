"""Where lines come from: the Unix socket (many sessions) and stdio (one harness child)."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
from anyio.abc import SocketListener

log = logging.getLogger("memoryd.transports")

READ_CHUNK = 65536


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


def bind_unix(path: Path, *, private_dir: bool) -> socket.socket:
    """Bind and listen, then move the socket into place: the path appears only once it
    accepts connections. A stale socket file is replaced; a live daemon is refused."""
    if private_dir:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(path.parent, 0o700)
    elif not path.parent.exists():
        path.parent.mkdir(parents=True, mode=0o700)
    if path.exists() or path.is_symlink():
        if not stat.S_ISSOCK(path.lstat().st_mode):
            raise SocketInUse(f"{path} exists and is not a socket")
        if _is_live(path):
            raise SocketInUse(f"a memoryd is already serving on {path}")
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
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


async def listener_from(sock: socket.socket) -> SocketListener:
    return await SocketListener.from_socket(sock)


class FdStream:
    """Non-blocking reads and writes on raw file descriptors (stdio mode), driven by the
    event loop's readiness notifications, with a thread fallback for regular files."""

    def __init__(self, in_fd: int, out_fd: int) -> None:
        self.in_fd = in_fd
        self.out_fd = out_fd
        self._in_pollable = not stat.S_ISREG(os.fstat(in_fd).st_mode)
        if self._in_pollable:
            os.set_blocking(in_fd, False)
        self._out_pollable = not stat.S_ISREG(os.fstat(out_fd).st_mode)
        if self._out_pollable:
            os.set_blocking(out_fd, False)

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

    async def send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                n = os.write(self.out_fd, view)
            except BlockingIOError:
                await anyio.wait_writable(self.out_fd)
                continue
            view = view[n:]
