"""A transparent tap between an agent host and the stdio MCP server it spawns.

``python mcp_tap.py SOCKET -- COMMAND ARGS...``: runs COMMAND with the tap's stdin, stdout
and stderr piped through, and sends every JSON-RPC line either way to the Unix socket
SOCKET (the test listens there) as one JSON line ``{"dir": "host"|"server", "msg": ...,
"pid": <the tap's pid>}`` (a host may spawn the server more than once: the pid tells them apart).
The test learns what the host sends the server (its initialize request: clientInfo and
capabilities) and what the server asks the host (an elicitation) the moment it happens.
Signals the host sends the server (SIGINT, SIGTERM) are passed on; the tap exits with the
server's status once the server has exited.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from typing import IO


def main() -> int:
    path, sep, *command = sys.argv[1:]
    assert sep == "--" and command, "usage: mcp_tap.py SOCKET -- COMMAND ARGS..."
    sink = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sink.connect(path)
    lock = threading.Lock()

    def record(direction: str, line: bytes) -> None:
        try:
            msg = json.loads(line)
        except ValueError:
            msg = line.decode(errors="replace")
        data = (json.dumps({"dir": direction, "msg": msg, "pid": os.getpid()}) + "\n").encode()
        with lock:
            try:
                sink.sendall(data)
            except OSError:
                pass

    child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda s, _f: child.send_signal(s))
    assert child.stdin is not None and child.stdout is not None

    def pump(src: IO[bytes], dst: IO[bytes], direction: str) -> None:
        try:
            for line in iter(src.readline, b""):
                record(direction, line)
                dst.write(line)
                dst.flush()
        except (BrokenPipeError, ValueError, OSError):
            pass
        finally:
            try:
                dst.close()
            except OSError:
                pass

    to_server = threading.Thread(target=pump, args=(sys.stdin.buffer, child.stdin, "host"), daemon=True)
    to_server.start()
    pump(child.stdout, sys.stdout.buffer, "server")
    code = child.wait()
    with lock:
        sink.close()
    os._exit(code if code >= 0 else 128 - code)


if __name__ == "__main__":
    main()
