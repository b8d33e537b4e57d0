"""Request ids no request may have, against real daemons: on the socket an id out of range
runs nothing, whichever parser reads its line; through `memoryd mcp` such a request is
refused with -32600, never taken for a notification and left unanswered."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import state
from mcp_support import mcp_daemon, raw_mcp
from rawclient import socket_client

pytestmark = pytest.mark.anyio


MCP_ADD = b'"method":"tools/call","params":{"name":"memory_add","arguments":{"track":"user","scope":"workspace","text":"x"}}'


@pytest.mark.parametrize("line", [
    b'{"jsonrpc":"2.0","id":1e400,' + MCP_ADD + b'}',
    # "id" spelled with a JSON escape: the same key, but not the bytes the wire looks for
    b'{"jsonrpc":"2.0","\\u0069d":1.5,' + MCP_ADD + b'}',
], ids=["id-out-of-range", "escaped-id-key"])
async def test_an_mcp_request_with_an_id_no_request_may_have_is_refused_not_ignored(
        tmp_path: Path, sock_dir: Path, line: bytes) -> None:
    # Each is a request with an id MCP does not allow, so it gets -32600 with id null, as
    # `"id": 1.5` does (test_mcp_hostile). The SDK's parser reads each as a notification (it
    # drops the id it cannot take); the wire must still see a request in it: for 1e400 the
    # envelope does not decode, and the escaped key is not the bytes '"id"'.
    async with mcp_daemon(tmp_path, sock_dir) as d, d.connect() as raw, raw_mcp(d) as host:
        before = await state(raw)
        # The refusal is posted before the next line is read, so it comes before the ping's reply.
        await host.send(line, {"jsonrpc": "2.0", "id": "p", "method": "ping"})
        first = await host.line()
        assert (first.get("id"), first.get("error", {}).get("code")) == (None, -32600), first
        assert (await host.reply("p"))["result"] == {}
        assert await state(raw) == before


# --- an id out of range, on a line the lenient parser reads ---------------------------------

WRITE = (b'"params":{"input":{"track":"user","scope":"user-global","text":"written by an id out of range"},'
         b'"write":{"agent":{"session":{"id":"s-1","header":{"cwd":"/home/u/proj","agentPreset":"coder"}}}}}')
#: What the daemon answers a request whose id is a number out of range (1e400), as the
#: line below without its lone surrogate gets: no id can be read, and nothing runs.
OUT_OF_RANGE = {"jsonrpc": "2.0", "id": None,
                "error": {"code": -32600, "message": "Invalid request",
                          "data": {"code": "INVALID_REQUEST", "message": "Invalid request", "details": {}}}}


def first_line(path: Path, line: bytes) -> Any:
    """The first line the daemon sends back on a fresh connection after ``line``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(str(path))
        s.sendall(line + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = s.recv(1)
            assert chunk, "the daemon closed the connection"
            data += chunk
        return json.loads(data)


async def test_an_id_out_of_range_runs_nothing_even_beside_a_lone_surrogate(daemon: Any) -> None:
    # A lone surrogate anywhere before the id sends the line to the lenient parser
    # (json.loads), which reads 1e400 as inf: the request must be refused as the same line
    # without the surrogate is, not run (the write committed, its result sent with id null).
    plain = b'{"jsonrpc":"2.0","method":"memory/add",' + WRITE + b',"id":1e400}'
    lenient = b'{"x":"\\ud800","jsonrpc":"2.0","method":"memory/add",' + WRITE + b',"id":1e400}'
    async with socket_client(daemon.socket_path) as raw:
        before = await state(raw)
        assert first_line(daemon.socket_path, plain) == OUT_OF_RANGE
        assert await state(raw) == before
        assert first_line(daemon.socket_path, lenient) == OUT_OF_RANGE
        assert await state(raw) == before


async def test_a_batch_item_with_an_id_out_of_range_runs_nothing_beside_a_lone_surrogate(daemon: Any) -> None:
    # The same in a batch: another item's lone surrogate sends the whole line to json.loads.
    batch = (b'[{"jsonrpc":"2.0","id":1e400,"method":"memory/add",' + WRITE + b'},'
             b'{"jsonrpc":"2.0","id":2,"method":"memory/query","params":{"filter":{"text":"\\ud800"}}}]')
    async with socket_client(daemon.socket_path) as raw:
        before = await state(raw)
        reply = first_line(daemon.socket_path, batch)
        assert isinstance(reply, list), reply
        assert reply[0] == OUT_OF_RANGE
        assert reply[1]["id"] == 2 and reply[1]["error"]["data"]["code"] == "INVALID_INPUT"
        assert await state(raw) == before
