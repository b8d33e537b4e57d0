"""A deliberately small NDJSON peer for end-to-end tests: raw lines in, raw lines out.

It is not the product client: it shows exactly what crosses the wire, routes messages by
shape (response vs notification), and can hold approvals open to stage races.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
from anyio.abc import TaskGroup

# Every message the daemon sends in the end-to-end suites is validated against the
# committed schemas, so the schemas can never quietly lie.
from contract import validate_message as _validate
from memoryd_protocol.framing import Framer

WRITE = {"agent": {"session": {"id": "s-1", "header": {"cwd": "/home/u/proj", "agentPreset": "coder"}}}}
TIMEOUT = 10


def write_ctx(session_id: str = "s-1", cwd: str = "/home/u/proj", agent: str = "coder") -> dict[str, Any]:
    return {"agent": {"session": {"id": session_id, "header": {"cwd": cwd, "agentPreset": agent}}}}


class RpcFailure(AssertionError):
    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(json.dumps(error))
        self.error = error
        data = error.get("data") or {}
        self.code = data.get("code")
        self.details = data.get("details")


class Raw:
    def __init__(self, send: Callable[[bytes], Awaitable[None]], lines: AsyncIterator[bytes]) -> None:
        self._send = send
        self._lines = lines
        self._ids = itertools.count(1)
        self._waiting: dict[Any, anyio.Event] = {}
        self._responses: dict[Any, dict[str, Any]] = {}
        self._methods: dict[Any, str] = {}
        #: ids issued by call(): raw_reply() never takes their responses
        self._owned: set[Any] = set()
        self.notifications: list[dict[str, Any]] = []
        self.received: list[dict[str, Any]] = []
        self._note_event = anyio.Event()
        self._reply_event = anyio.Event()
        self.on_approval: Callable[[dict[str, Any]], Awaitable[str | None]] | None = None
        self.closed = anyio.Event()
        self._tg: TaskGroup | None = None
        #: the child process, for clients that talk to one over its stdio
        self.process: Any = None
        #: ends what this client sends (half-close), set by socket_client
        self._send_eof: Callable[[], Awaitable[None]] | None = None

    async def _reader(self) -> None:
        try:
            async for line in self._lines:
                msg = json.loads(line)
                self.received.append(msg)
                if isinstance(msg, list) or ("id" in msg and ("result" in msg or "error" in msg)):
                    for m in msg if isinstance(msg, list) else [msg]:
                        _validate(m, self._methods.get(m.get("id")))
                        self._responses[m["id"]] = m
                        ev = self._waiting.pop(m["id"], None)
                        if ev is not None:
                            ev.set()
                    self._reply_event.set()
                    self._reply_event = anyio.Event()
                    continue
                _validate(msg, None)
                self.notifications.append(msg)
                self._note_event.set()
                self._note_event = anyio.Event()
                if msg.get("method") == "approval/asked" and self.on_approval is not None and self._tg is not None:
                    self._tg.start_soon(self._answer, msg["params"])
        finally:
            self.closed.set()
            for ev in self._waiting.values():
                ev.set()

    async def _answer(self, params: dict[str, Any]) -> None:
        assert self.on_approval is not None
        outcome = await self.on_approval(params)
        if outcome is not None:
            await self.notify_or_call("approval/decided", {"id": params["id"], "outcome": outcome})

    async def notify_or_call(self, method: str, params: dict[str, Any]) -> None:
        await self.call(method, params)

    async def hang_up(self) -> None:
        """Send EOF, then wait for the daemon to close its end: it does once every request
        it read on this connection is done (an event, where a test would otherwise poll)."""
        assert self._send_eof is not None
        await self._send_eof()
        with anyio.fail_after(TIMEOUT):
            await self.closed.wait()

    async def send_line(self, data: bytes) -> None:
        await self._send(data + b"\n")

    async def call(self, method: str, params: Any = None, *, id_: Any = None) -> dict[str, Any]:
        id_ = next(self._ids) if id_ is None else id_
        msg: dict[str, Any] = {"jsonrpc": "2.0", "id": id_, "method": method}
        if params is not None:
            msg["params"] = params
        ev = anyio.Event()
        self._waiting[id_] = ev
        self._owned.add(id_)
        self._methods[id_] = method
        await self.send_line(json.dumps(msg).encode())
        with anyio.fail_after(TIMEOUT):
            await ev.wait()
        self._owned.discard(id_)
        if id_ not in self._responses:
            raise ConnectionError(f"connection closed before the reply to {method}")
        return self._responses.pop(id_)

    async def ok(self, method: str, params: Any = None) -> Any:
        reply = await self.call(method, params)
        if "error" in reply:
            raise RpcFailure(reply["error"])
        return reply["result"]

    async def fail(self, method: str, params: Any = None) -> RpcFailure:
        reply = await self.call(method, params)
        assert "error" in reply, f"expected an error from {method}, got {reply}"
        return RpcFailure(reply["error"])

    async def notification(self, method: str, start: int = 0) -> dict[str, Any]:
        """The first notification ``method`` received at index ≥ ``start``."""
        with anyio.fail_after(TIMEOUT):
            while True:
                for n in self.notifications[start:]:
                    if n.get("method") == method:
                        return n
                if self.closed.is_set():
                    raise ConnectionError("closed")
                await self._note_event.wait()

    async def notifications_from(self, start: int, count: int) -> list[dict[str, Any]]:
        """The ``count`` notifications received from index ``start`` on, once they are here."""
        with anyio.fail_after(TIMEOUT):
            while len(self.notifications) < start + count:
                if self.closed.is_set():
                    raise ConnectionError("closed")
                await self._note_event.wait()
        return self.notifications[start:start + count]

    async def batch_reply(self) -> list[dict[str, Any]]:
        """The newest batch response received (waiting for one), for batches sent with send_line."""
        with anyio.fail_after(TIMEOUT):
            while True:
                batches = [m for m in self.received if isinstance(m, list)]
                if batches:
                    return batches[-1]
                if self.closed.is_set():
                    raise ConnectionError("closed")
                await self._reply_event.wait()

    async def raw_reply(self) -> dict[str, Any]:
        """The next response (any id), for lines sent with send_line."""
        with anyio.fail_after(TIMEOUT):
            while True:
                for key in list(self._responses):
                    if key not in self._owned:
                        return self._responses.pop(key)
                if self.closed.is_set():
                    raise ConnectionError("closed")
                await self._reply_event.wait()


async def _socket_lines(stream: Any) -> AsyncIterator[bytes]:
    """The lines the daemon sent (an unterminated one at EOF is not a message: dropped)."""
    lines = Framer(sys.maxsize)  # no limit: a test sees whatever the daemon sent
    while True:
        try:
            chunk = await stream.receive()
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
            return
        for line in lines.feed(chunk):
            yield line


@asynccontextmanager
async def socket_client(path: Path | str, *, approvals: bool = True, initialize: bool = True,
                        foreign: bool = False) -> AsyncIterator[Raw]:
    """``foreign``: the connection is made and held by a live process of its own, neither
    this one's ancestor nor its descendant (processes.detached_socket), as a headless
    agent's or an approver's in another terminal would be; a subscribed approver never
    decides a write of its own process, an ancestor's or a descendant's."""
    if foreign:
        from processes import detached_socket

        sock = await anyio.to_thread.run_sync(detached_socket, path)
        stream: Any = await anyio.abc.UNIXSocketStream.from_socket(sock)
    else:
        stream = await anyio.connect_unix(str(path))
    async with stream, running(Raw(stream.send, _socket_lines(stream)), initialize, approvals,
                               send_eof=stream.send_eof) as raw:
        yield raw


@asynccontextmanager
async def running(raw: Raw, initialize: bool, approvals: bool = True, *,
                  send_eof: Callable[[], Awaitable[None]] | None = None) -> AsyncIterator[Raw]:
    """``raw`` with its reader running (and approvals answered) while inside, after an
    ``initialize`` when asked; every transport's client is this around its own streams."""
    async with anyio.create_task_group() as tg:
        raw._tg = tg
        raw._send_eof = send_eof
        tg.start_soon(raw._reader)
        if initialize:
            await raw.ok("initialize", {"protocol": "dsh-memory-protocol/v1", "client": {"name": "raw", "version": "0"},
                                        "capabilities": {"approvals": approvals}})
        try:
            yield raw
        finally:
            tg.cancel_scope.cancel()


@asynccontextmanager
async def stdio_client(db: Path, *extra: str, initialize: bool = True) -> AsyncIterator[Raw]:
    """``memoryd serve --stdio --standalone``: a daemon of its own on a private store."""
    async with _stdio(["--standalone", "--db", str(db), *extra], initialize) as raw:
        yield raw


@asynccontextmanager
async def relay_client(socket_path: Path, *extra: str, initialize: bool = True,
                       approvals: bool = True) -> AsyncIterator[Raw]:
    """``memoryd serve --stdio``: a harness's child relaying to the daemon on ``socket_path``."""
    async with _stdio(["--socket", str(socket_path), *extra], initialize, approvals) as raw:
        yield raw


@asynccontextmanager
async def _stdio(serve_args: list[str], initialize: bool, approvals: bool = True) -> AsyncIterator[Raw]:
    args = [sys.executable, "-m", "memoryd", "serve", "--stdio", *serve_args]
    async with await anyio.open_process(args, env=dict(os.environ)) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        raw = Raw(proc.stdin.send, _socket_lines(proc.stdout))
        raw.process = proc
        try:
            async with running(raw, initialize, approvals) as raw:
                yield raw
        finally:
            await proc.stdin.aclose()
            with anyio.move_on_after(5):
                await proc.wait()
            if proc.returncode is None:
                proc.kill()
