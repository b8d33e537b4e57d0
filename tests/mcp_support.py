"""``memoryd mcp`` as an agent host runs it, for the tests: the daemon's real stack in the
test's event loop serving a real socket (tests/inprocess.py), and ``python -m memoryd mcp``
spawned by the official MCP SDK's own stdio client, or driven with raw lines."""

from __future__ import annotations

import json
import os
import sys
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from inprocess import InProcess, memory_daemon
from mcp import Client, StdioServerParameters

PROJ = "/home/u/proj"
HOST = types.Implementation(name="Claude Code", version="2.1.0")
#: an MCP session's agent layer without --agent: the one every agent shares
HOST_AGENT = ""
#: the source HOST's clientInfo name gives its writes
HOST_SOURCE = "claude-code"
TIMEOUT = 30

Answer = Callable[[types.ElicitRequestParams], Awaitable[types.ElicitResult]]


@asynccontextmanager
async def mcp_daemon(tmp_path: Path, sock_dir: Path, *extra: str, policy: str = "auto",
                     config: str | None = None) -> AsyncIterator[InProcess]:
    """A daemon serving ``sock_dir/d.sock`` and ``tmp_path/m.db`` in this event loop."""
    args = ["--socket", str(sock_dir / "d.sock"), "--db", str(tmp_path / "m.db"), "--write-policy", policy, *extra]
    if config is not None:
        path = tmp_path / "config.toml"
        path.write_text(config)
        args += ["--config", str(path)]
    async with memory_daemon(args, listen=True) as d:
        yield d


def mcp_command(d: InProcess, *extra: str, cwd: str = PROJ) -> list[str]:
    cfg = d.daemon.config
    return [sys.executable, "-m", "memoryd", "mcp", "--socket", str(cfg.socket_path), "--db", str(cfg.db_path),
            "--cwd", cwd, *extra]


def server_params(d: InProcess, *extra: str, cwd: str = PROJ) -> StdioServerParameters:
    command = mcp_command(d, *extra, cwd=cwd)
    return StdioServerParameters(command=command[0], args=command[1:], env=dict(os.environ))


def tool_error(result: Any) -> dict[str, Any]:
    """The ``{code, message, details}`` of an error result (an SDK ``CallToolResult`` or its
    wire dict): ``CODE: message``, a blank line and the error as JSON, with no
    ``structuredContent`` for a host to hold to the tool's output schema."""
    if isinstance(result, dict):
        assert result["isError"] is True and "structuredContent" not in result, result
        text = result["content"][0]["text"]
    else:
        assert result.is_error and result.structured_content is None, result
        text = result.content[0].text
    head, blank, doc = text.split("\n", 2)
    error: dict[str, Any] = json.loads(doc)
    assert (head, blank) == (f"{error['code']}: {error['message']}", ""), text
    assert list(error) == ["code", "message", "details"]
    return error


class Host:
    """What the host's user was asked (each elicitation's message), and how they answer."""

    def __init__(self, action: str = "accept") -> None:
        self.action = action
        self.asked: list[str] = []

    async def __call__(self, ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        self.asked.append(params.message)
        return types.ElicitResult(action=self.action, content={} if self.action == "accept" else None)  # type: ignore[arg-type]


@asynccontextmanager
async def mcp_client(d: InProcess, mode: str = "legacy", *extra: str, host: Host | None = None,
                     cwd: str = PROJ, info: types.Implementation = HOST,
                     on_message: Callable[[Any], Awaitable[None]] | None = None) -> AsyncIterator[Client]:
    """The official SDK's client, over stdio, of a ``memoryd mcp`` child; ``host`` answers
    elicitations (None: a host that declares no elicitation)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the SDK's deprecation warnings for the 2025-11-25 calls
        async with Client(server_params(d, *extra, cwd=cwd), mode=mode, client_info=info,  # type: ignore[arg-type]
                          elicitation_callback=host, message_handler=on_message) as c:
            if mode == "2026-07-28":
                # a pinned 2026-07-28 client fetches nothing by itself: discover, as hosts do
                c.session.adopt(types.DiscoverResult.model_validate(await c.session.send_discover("2026-07-28")))
            yield c


class Lines:
    """A ``memoryd mcp`` child driven with raw NDJSON lines."""

    def __init__(self, proc: Any) -> None:
        self.proc = proc
        self._buf = b""
        #: replies read while waiting for another one, by id
        self._replies: dict[Any, dict[str, Any]] = {}

    async def send(self, *messages: Any) -> None:
        data = b"".join((m if isinstance(m, bytes) else json.dumps(m).encode()) + b"\n" for m in messages)
        await self.proc.stdin.send(data)

    async def line(self) -> dict[str, Any]:
        with anyio.fail_after(TIMEOUT):
            while b"\n" not in self._buf:
                chunk = await self.proc.stdout.receive()
                self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return json.loads(line)  # type: ignore[no-any-return]

    async def reply(self, id_: Any) -> dict[str, Any]:
        """The response to request ``id_``: replies to other requests are kept for their
        own ``reply``, notifications and requests before it are skipped."""
        while id_ not in self._replies:
            msg = await self.line()
            if "result" in msg or "error" in msg:
                self._replies[msg.get("id")] = msg
        return self._replies.pop(id_)


INITIALIZE = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
              "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                         "clientInfo": {"name": "raw-host", "version": "1"}}}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


@asynccontextmanager
async def raw_mcp(d: InProcess, *extra: str, initialize: bool = True) -> AsyncIterator[Lines]:
    async with await anyio.open_process(mcp_command(d, *extra)) as proc:
        lines = Lines(proc)
        if initialize:
            await lines.send(INITIALIZE, INITIALIZED)
            assert "result" in await lines.reply(0)
        try:
            yield lines
        finally:
            await proc.stdin.aclose()
            with anyio.fail_after(TIMEOUT):
                await proc.wait()


def call(id_: int, name: str, arguments: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id_, "method": "tools/call", "params": {"name": name, "arguments": arguments}}
