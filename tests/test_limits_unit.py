"""Resource limits, the parts a real daemon cannot show deterministically: how much unread
input a connection is allowed to make the daemon hold (the e2e suite shows the rest, in
test_e2e_limits.py), and the config keys' validation."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio import wait_all_tasks_blocked
from anyio.abc import ByteReceiveStream
from memoryd.approvals import Approvals
from memoryd.config import Config, ConfigError, apply
from memoryd.connection import Connection
from memoryd.rpc import Dispatcher
from memoryd.transports import Lines
from memoryd_protocol.framing import OVERSIZE, Framer
from rawclient import write_ctx


def test_limit_keys_have_defaults_and_refuse_bad_values() -> None:
    cfg = Config()
    assert (cfg.max_connections, cfg.max_batch_calls, cfg.max_buffered_bytes, cfg.half_line_timeout_s,
            cfg.max_pending_approvals) == (256, 100, 16 * 1024 * 1024, 30.0, 16)
    apply(cfg, {"max_connections": 8, "max_batch_calls": 5, "max_buffered_bytes": 65536,
                "half_line_timeout_s": 0.25, "max_pending_approvals": 1})
    assert (cfg.max_connections, cfg.max_batch_calls, cfg.max_buffered_bytes, cfg.half_line_timeout_s,
            cfg.max_pending_approvals) == (8, 5, 65536, 0.25, 1)
    for key, bad in [("max_connections", 0), ("max_connections", "8"), ("max_batch_calls", 0),
                     ("max_batch_calls", 10_001), ("max_buffered_bytes", 65535), ("max_buffered_bytes", 1.5),
                     ("half_line_timeout_s", 0), ("half_line_timeout_s", True), ("half_line_timeout_s", "30"),
                     ("max_pending_approvals", 0), ("max_pending_approvals", False)]:
        with pytest.raises(ConfigError, match=f"^config: {key} must be"):
            apply(Config(), {key: bad})


def test_a_bad_limit_stops_the_daemon_at_start(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("max_connections = -1\n")
    r = subprocess.run([sys.executable, "-m", "memoryd", "serve", "--config", str(cfg), "--db", str(tmp_path / "x.db"),
                        "--socket", str(tmp_path / "x.sock")], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2
    assert "config: max_connections must be an integer from 1 to 65536, got -1" in r.stderr
    assert not (tmp_path / "x.db").exists()


def test_framer_reports_a_partial_line() -> None:
    f = Framer(8)
    assert f.feed(b'{"a":1}\n{"b"') == [b'{"a":1}'] and f.partial
    assert f.feed(b":2}\n") == [b'{"b":2}'] and not f.partial
    assert f.feed(b"x" * 9) == [] and f.partial  # being discarded still counts as partial
    assert f.feed(b"\n") == [OVERSIZE] and not f.partial


class Counted(ByteReceiveStream):
    """``chunks`` read on demand, counting the bytes the reader took."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self.chunks = chunks
        self.pulled = 0

    async def receive(self, max_bytes: int = 65536) -> bytes:
        chunk = next(self.chunks, b"")
        if not chunk:
            raise anyio.EndOfStream
        self.pulled += len(chunk)
        return chunk

    async def aclose(self) -> None:
        pass


@pytest.mark.anyio
async def test_a_line_over_the_limit_is_dropped_as_it_streams_in() -> None:
    """Never held whole: reading stops once the limit is passed, and what follows is dropped
    a read at a time; the next line comes through intact."""
    held: list[int] = []

    class Watched(Counted):
        async def receive(self, max_bytes: int = 65536) -> bytes:
            held.append(lines.held)  # what the reader holds each time it asks for more
            return await super().receive(max_bytes)

    stream = Watched(iter([b"x" * 4096] * 64 + [b"x\nnext\n"]))
    lines = Lines(stream, 65536, 30.0)
    got = []
    while (line := await lines.next()) is not None:
        got.append(line)
    assert got == [OVERSIZE, b"next"]
    assert max(held) == 65536  # never more than the limit held while it asks for more
    assert held[-3:] == [0, 0, 0]


class Sink:
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def post(self, data: bytes) -> None:
        self.sent.append(data)

    async def drain(self) -> None:
        pass


@pytest.mark.anyio
async def test_a_connection_reads_ahead_at_most_max_buffered_bytes_of_lines() -> None:
    """A client pipelines writes behind one that cannot finish: the connection takes lines
    off the socket only while the lines waiting their turn hold at most max_buffered_bytes."""
    stuck = anyio.Event()

    async def add(peer: Any, params: Any) -> Any:
        await stuck.wait()  # never set: the first write holds every later one back
        return {}

    line = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "memory/add", "params": {
        "input": {"track": "user", "scope": "user-global", "text": "x" * 900}, "write": write_ctx()}}).encode()
    stream = Counted(itertools.repeat(line + b"\n"))
    conn = Connection(Sink(), Dispatcher({"memory/add": add}), Approvals(), 1 << 20, "test", max_buffered=20_000)
    async with anyio.create_task_group() as tg:
        tg.start_soon(conn.serve, stream)
        await wait_all_tasks_blocked()
        # the lines read ahead, plus the one that waits for room
        pulled = stream.pulled
        assert 20_000 - len(line) <= pulled - (len(line) + 1) <= 20_000 + len(line) + 1
        tg.cancel_scope.cancel()
