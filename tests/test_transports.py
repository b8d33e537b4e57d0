"""The transports' two halves: :class:`Lines` framing any anyio byte stream, and stdio as an
:class:`Outlet` like the socket's, with a worker-thread fallback for what epoll cannot watch
(a regular file, /dev/null), and the same max_buffered_bytes rule on the way out."""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from anyio.abc import ByteReceiveStream, SocketStream
from memoryd.transports import READ_CHUNK, Lines, stdio_stream
from memoryd_protocol.framing import OVERSIZE

pytestmark = pytest.mark.anyio


@pytest.fixture
def pipes() -> Iterator[tuple[int, int, int, int]]:
    """(stdin's read end, its write end, stdout's read end, its write end)."""
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    yield in_r, in_w, out_r, out_w
    for fd in (in_r, in_w, out_r, out_w):
        try:
            os.close(fd)
        except OSError:
            pass


async def read_all(stream: ByteReceiveStream) -> bytes:
    return b"".join([chunk async for chunk in stream])


async def read_lines(lines: Lines) -> list[bytes]:
    got = []
    while (line := await lines.next()) is not None:
        got.append(line)
    return got


async def test_pipes_carry_bytes_both_ways_and_replies_outlive_stdins_eof(pipes: tuple[int, int, int, int]) -> None:
    in_r, in_w, out_r, out_w = pipes
    async with stdio_stream(in_r, out_w, 65536) as (stdin, out):
        assert out.peer is not None and out.peer.pid == os.getppid()
        os.write(in_w, b'{"a":1}\n{"b"')
        os.close(in_w)
        assert await read_all(stdin) == b'{"a":1}\n{"b"'
        out.post(b"reply\n")  # stdin is at EOF: what was asked is still answered
        await out.finish()
        assert out.closed
    assert os.read(out_r, 100) == b"reply\n"
    # the parent shares the descriptors: they are left open and blocking, as they came
    assert os.get_blocking(in_r) and os.get_blocking(out_w)


async def test_lines_frame_a_socket_exactly_and_drop_a_line_over_the_limit() -> None:
    """A line of several reads, thousands of short ones in small writes, blank lines, one
    over the limit (dropped, reported once, the next line intact) and an unterminated tail."""
    long = b"a" * (3 * READ_CHUNK + 17)
    data = (long + b"\n\n \r\n" + b"".join(b"%d\n" % i for i in range(5000)) + b"x" * (4 * READ_CHUNK) + b"\nafter\r\n"
            + b"tail")
    ours, theirs = socket.socketpair()

    def send() -> None:
        with theirs:
            for at in range(0, len(data), 1000):
                theirs.sendall(data[at:at + 1000])
            theirs.shutdown(socket.SHUT_WR)

    sender = threading.Thread(target=send)
    sender.start()
    async with await SocketStream.from_socket(ours) as stream:
        got = await read_lines(Lines(stream, 3 * READ_CHUNK + 17, 30.0))
    sender.join()
    assert got == [long, *(b"%d" % i for i in range(5000)), OVERSIZE, b"after\r", b"tail"]


async def test_stop_ends_a_waiting_read_at_once_and_reads_nothing_queued_after_it() -> None:
    send, receive = anyio.create_memory_object_stream[bytes](10)
    with send, receive:
        lines = Lines(receive, 100, 30.0)
        send.send_nowait(b"one\ntw")
        assert await lines.next() == b"one"
        got: list[bytes] = []

        async def read() -> None:
            got.extend(await read_lines(lines))

        async with anyio.create_task_group() as tg:
            tg.start_soon(read)
            await anyio.wait_all_tasks_blocked()  # the read waits for the rest of the line
            lines.stop()
        assert got == []
        send.send_nowait(b"o\nthree\n")  # what arrives afterwards is never read
        assert await lines.next() is None


async def test_a_descriptor_is_watched_across_waits_and_not_after_its_stream_closes(
        pipes: tuple[int, int, int, int]) -> None:
    """A cancelled wait (as ``Lines.stop`` ends one) leaves the stream readable, and closing
    the stream stops the loop's watch: a descriptor number reused later is not watched for
    a stream that has ended."""
    in_r, in_w, _, out_w = pipes
    loop = asyncio.get_running_loop()
    async with stdio_stream(in_r, out_w, 65536) as (stdin, _out):
        async with anyio.create_task_group() as tg:
            tg.start_soon(stdin.receive)
            await anyio.wait_all_tasks_blocked()  # the read waits for bytes
            tg.cancel_scope.cancel()
        os.write(in_w, b"after\n")
        assert await stdin.receive() == b"after\n"
        async with anyio.create_task_group() as tg:
            tg.start_soon(stdin.receive)
            await anyio.wait_all_tasks_blocked()
            tg.cancel_scope.cancel()
    assert not loop.remove_reader(in_r)


async def test_a_stdout_nobody_reads_is_dropped_at_max_buffered_bytes(pipes: tuple[int, int, int, int],
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    in_r, in_w, _out_r, out_w = pipes
    caplog.set_level(logging.WARNING, "memoryd.transports")
    line = b"x" * 16383 + b"\n"
    fcntl.fcntl(out_w, fcntl.F_SETPIPE_SZ, 65536)  # the kernel's share: exactly 4 lines
    async with stdio_stream(in_r, out_w, 65536) as (stdin, proto):
        posted = 0
        with pytest.raises(BrokenPipeError):
            while True:
                proto.post(line)
                posted += len(line)
        # the kernel took 4 lines; then lines queued until more than max_buffered_bytes waited
        assert posted == 65536 + 65536 + len(line)
        with pytest.raises(BrokenPipeError):
            proto.post(line)
        # stdin is still read: requests still complete, only their replies are lost
        os.write(in_w, b"more\n")
        os.close(in_w)
        assert await read_all(stdin) == b"more\n"
    assert [r.getMessage() for r in caplog.records] == [
        "dropping a connection that stopped reading: 81920 bytes unsent (max_buffered_bytes 65536)"]


async def test_regular_files_use_the_fallback(tmp_path: Path) -> None:
    data = b"".join(b'{"n":%d}\n' % n for n in range(20_000))  # several reads' worth
    (tmp_path / "in").write_bytes(data)
    with (tmp_path / "in").open("rb") as fin, (tmp_path / "out").open("wb") as fout:
        async with stdio_stream(fin.fileno(), fout.fileno(), 65536) as (stdin, proto):
            assert await read_all(stdin) == data
            proto.post(b"one\n")
            proto.post(b"two\n")
            await proto.finish()
    assert (tmp_path / "out").read_bytes() == b"one\ntwo\n"


async def test_dev_null_uses_the_fallback() -> None:
    """epoll refuses /dev/null as it does a regular file."""
    fin, fout = os.open(os.devnull, os.O_RDONLY), os.open(os.devnull, os.O_WRONLY)
    try:
        async with stdio_stream(fin, fout, 65536) as (stdin, proto):
            assert await read_all(stdin) == b""  # EOF at once
            proto.post(b"gone\n")
            await proto.finish()
    finally:
        os.close(fin)
        os.close(fout)


def test_stdio_from_and_to_regular_files(tmp_path: Path) -> None:
    """``memoryd serve --stdio --standalone < requests.ndjson > out``."""
    req, out = tmp_path / "req.ndjson", tmp_path / "out"
    req.write_text("".join(json.dumps({"jsonrpc": "2.0", "id": n, "method": "memory/budgets"}) + "\n"
                           for n in range(1, 4)))
    with req.open("rb") as stdin, out.open("wb") as stdout:
        r = subprocess.run([sys.executable, "-m", "memoryd", "serve", "--stdio", "--standalone",
                            "--db", str(tmp_path / "m.db")], stdin=stdin, stdout=stdout, stderr=subprocess.PIPE,
                           timeout=20)
    assert r.returncode == 0, r.stderr
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == [1, 2, 3]


async def test_one_socket_for_stdin_and_stdout_carries_both_ways() -> None:
    """inetd style: the input's EOF does not end the output."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        async with stdio_stream(theirs.fileno(), theirs.fileno(), 65536) as (stdin, proto):
            ours.sendall(b"ask\n")
            ours.shutdown(socket.SHUT_WR)
            assert await read_all(stdin) == b"ask\n"
            proto.post(b"answer\n")  # after the peer's EOF
            await proto.finish()
        assert ours.recv(100) == b"answer\n"
        assert theirs.getblocking()
