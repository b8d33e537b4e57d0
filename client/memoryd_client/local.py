"""The verbs that need no client: ``socket`` (the path memoryctl uses) and ``rpc`` (raw
NDJSON lines between stdin/stdout and the daemon's socket, for trying the wire by hand
or from a script, with nothing else installed)."""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
from pathlib import Path

from .running import EXIT_CONNECTION, EXIT_OK, Ctx, _error

READ_CHUNK = 65536


def cmd_socket(ctx: Ctx) -> int:
    path = str(Path(ctx.socket).absolute())
    ctx.out(json.dumps({"socket": path}) if ctx.json else path)
    return EXIT_OK


def cmd_rpc(ctx: Ctx) -> int:
    """Copy stdin to the socket and the socket to stdout, byte for byte. At the end of
    stdin the socket's sending half is shut, and the daemon answers what it was sent, then
    closes: every reply is printed before memoryctl exits."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(ctx.socket)
    except OSError as exc:
        conn.close()
        _error(ctx, "NO_DAEMON", f"no daemon answers on {ctx.socket} ({exc.strerror or exc}): start one with "
               "memoryd serve --detach, or name its socket with --socket", {"socket": ctx.socket})
        return EXIT_CONNECTION
    with conn:
        # stdin is read on a thread of its own, so replies are printed as they arrive
        # (an approval/asked before the reader has sent its answer, say)
        threading.Thread(target=_send_stdin, args=(conn,), daemon=True, name="memoryctl-rpc-stdin").start()
        out = sys.stdout.buffer
        while chunk := conn.recv(READ_CHUNK):
            out.write(chunk)
            out.flush()
    return EXIT_OK


def _send_stdin(conn: socket.socket) -> None:
    try:
        while data := os.read(sys.stdin.fileno(), READ_CHUNK):
            conn.sendall(data)
        conn.shutdown(socket.SHUT_WR)
    except OSError:
        pass  # the daemon went away: the reading side sees it and ends
