"""What replication's tests share: an S3 server on 127.0.0.1 (moto), a TCP relay in front
of it that can be taken down and brought back (an unreachable replica), the config of a
replicating daemon, and waiting on a daemon's log lines (inotify, never a sleep).

Litestream's S3 client refuses to start when ``AWS_CA_BUNDLE`` names a bundle it cannot
add ("unable to add custom RootCAs"); the tests' servers speak plain http, so the daemon
runs without it (``replicating_env``).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import re
import select
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: the keys the S3 replica is given (moto takes any); the secret must never reach a log
ACCESS_KEY = "AKIAMEMORYDTEST0001"
SECRET_KEY = "memoryd-test-secret-Zq93xL0pW"
BUCKET = "memoryd-replica"
#: the longest any wait of these tests takes before it fails
WAIT_S = 60.0

_IN_MODIFY = 0x2


def replicating_env() -> dict[str, str]:
    """The daemon's environment: the test's, without AWS_CA_BUNDLE (plain http here)."""
    env = {k: v for k, v in os.environ.items() if k != "AWS_CA_BUNDLE"}
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


class S3Server:
    """moto's S3 on 127.0.0.1 at a free port, with one bucket, and a relay in front of it."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # a line per request otherwise
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.direct = f"http://{host}:{port}"
        import boto3

        boto3.client("s3", endpoint_url=self.direct, region_name="us-east-1", aws_access_key_id=ACCESS_KEY,
                     aws_secret_access_key=SECRET_KEY).create_bucket(Bucket=BUCKET)
        self.relay = Relay(("127.0.0.1", port))
        self.endpoint = f"http://127.0.0.1:{self.relay.port}"

    def close(self) -> None:
        self.relay.close()
        self._server.stop()


class Relay:
    """A TCP relay to ``target``: ``down()`` closes its listener and every connection
    (the replica is unreachable: connections are refused), ``up()`` listens again on the
    same port."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        self._listener: socket.socket | None = None
        self.port = 0
        self.up()

    def up(self) -> None:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        sock.listen(64)
        self.port = sock.getsockname()[1]
        self._listener = sock
        threading.Thread(target=self._accept, args=(sock,), daemon=True).start()

    def down(self) -> None:
        with self._lock:
            sock, self._listener = self._listener, None
            conns, self._conns = self._conns, []
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            c.close()

    def close(self) -> None:
        self.down()

    def _accept(self, sock: socket.socket) -> None:
        while True:
            try:
                client, _ = sock.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not sock:
                    client.close()
                    upstream.close()
                    return
                self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                b.shutdown(socket.SHUT_WR)


def s3_config(server: S3Server, credentials: Path, *, prefix: str, lag_every_s: float = 0.1) -> str:
    """``prefix``: each test its own, since moto's buckets live as long as the test process."""
    return (f'[replicate]\nurl = "s3://{BUCKET}/{prefix}"\nendpoint = "{server.endpoint}"\nregion = "us-east-1"\n'
            f'credentials_file = "{credentials}"\nlag_every_s = {lag_every_s}\nrestart_min_s = 0.1\nread_timeout_s = 3\n'
            '[replicate.litestream]\nsync-interval = "50ms"\nforce-path-style = true\n')


def file_config(replica: Path, *, lag_every_s: float = 0.1, extra: str = "") -> str:
    return (f'[replicate]\nurl = "file://{replica}"\nlag_every_s = {lag_every_s}\nrestart_min_s = 0.1\n'
            f'[replicate.litestream]\nsync-interval = "50ms"\n{extra}')


def credentials_file(path: Path, mode: int = 0o600) -> Path:
    path.write_text(f"# the test's S3 keys\nAWS_ACCESS_KEY_ID={ACCESS_KEY}\nAWS_SECRET_ACCESS_KEY={SECRET_KEY}\n")
    path.chmod(mode)
    return path


@contextlib.contextmanager
def _inotify(path: Path) -> Iterator[int]:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_CLOEXEC | os.O_NONBLOCK)
    assert fd >= 0
    try:
        assert libc.inotify_add_watch(fd, str(path).encode(), _IN_MODIFY) >= 0
        yield fd
    finally:
        os.close(fd)


class Log:
    """A daemon's log file, read on from where the last wait ended."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def mark(self) -> None:
        """Later waits look only at what is written from now on."""
        self.offset = self.path.stat().st_size

    def wait(self, pattern: str, timeout: float = WAIT_S) -> re.Match[str]:
        """The first line matching ``pattern`` past the offset, waiting for the file to grow."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with _inotify(self.path) as fd:
            while True:
                text = self.path.read_text(errors="replace")[self.offset:]
                m = rx.search(text)
                if m is not None:
                    self.offset += text.index("\n", m.end()) + 1 if "\n" in text[m.end():] else m.end()
                    return m
                left = deadline - time.monotonic()
                assert left > 0, f"no log line matching {pattern!r} within {timeout} s:\n{text[-3000:]}"
                if select.select([fd], [], [], left)[0]:
                    with contextlib.suppress(BlockingIOError):
                        os.read(fd, 65536)


def litestream_children(pid: int) -> list[dict[str, Any]]:
    """The daemon's ``litestream replicate`` processes (not the restores that read the
    replica): pid and argv from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid and argv[0].endswith(b"litestream") and argv[1:2] == [b"replicate"]:
            found.append({"pid": int(entry.name), "argv": [a.decode() for a in argv if a]})
    return found
