"""Adversarial tests of the per-request hot path (issue 10): the connection's own tasks, the
writer's batch re-run, the coalesced recall bookkeeping and our own RPC dispatch."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

from conftest import start_daemon
from faults import CONFIG
from memoryd.app import DRAIN_S
from rawclient import write_ctx

INIT = (b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocol":"dsh-memory-protocol/v1",'
        b'"capabilities":{"approvals":true}}}\n')


def _line(s: socket.socket) -> bytes:
    got = b""
    while not got.endswith(b"\n"):
        chunk = s.recv(65536)
        assert chunk, "the daemon closed the connection"
        got += chunk
    return got


# --- connection: a stop cancels requests still in flight -----------------------------------


def test_a_reply_the_peer_never_reads_does_not_hold_the_stop_past_its_drain(tmp_path: Path) -> None:
    """A write's reply too large for the socket's buffers, to a peer that reads one byte of
    it and no more: the request's task waits for the peer (backpressure). SIGTERM stops
    reading, waits DRAIN_S for the requests read, then cancels them: the daemon exits 0,
    it does not wait for that peer forever."""
    cfg = tmp_path / "config.toml"
    cfg.write_text(CONFIG)
    d = start_daemon(tmp_path, "--config", str(cfg))
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(30)
    try:
        s.connect(str(d.socket_path))
        s.sendall(INIT)
        _line(s)
        params = {"input": {"track": "user", "scope": "user-global", "text": "x" * 1_500_000}, "write": write_ctx()}
        s.sendall(json.dumps({"jsonrpc": "2.0", "id": 2, "method": "memory/add", "params": params}).encode() + b"\n")
        # The event and the reply (~3 MB) were posted at once: the first byte is here, the
        # rest waits in the daemon, whose request task waits for this peer to read.
        assert s.recv(1)
        d.proc.terminate()
        try:
            rc = d.proc.wait(DRAIN_S + 20)
        except subprocess.TimeoutExpired:
            rc = None
        assert rc == 0, "the daemon did not exit after its drain: a request task waiting for its peer was never cancelled"
    finally:
        s.close()
        d.stop()
