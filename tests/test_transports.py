"""stdio as the socket's StreamProtocol: asyncio's pipe transports for pipes, the named
regular-file fallback (FileReader, FileWriter) for what epoll cannot watch, and the same
max_buffered_bytes rule on the way out."""

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
from memoryd.transports import READ_CHUNK, FileReader, FileWriter, PeerProcess, StreamProtocol, stdio_stream

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


async def read_all(proto: StreamProtocol) -> bytes:
    return b"".join([chunk async for chunk in proto.chunks()])


async def test_pipes_carry_bytes_both_ways_and_replies_outlive_stdins_eof(pipes: tuple[int, int, int, int]) -> None:
    in_r, in_w, out_r, out_w = pipes
    async with stdio_stream(in_r, out_w, 65536) as proto:
        assert not isinstance(proto.transport, FileReader) and not isinstance(proto.out, FileWriter)
        assert proto.peer is not None and proto.peer.pid == os.getppid()
        os.write(in_w, b'{"a":1}\n{"b"')
        os.close(in_w)
        assert await read_all(proto) == b'{"a":1}\n{"b"'
        proto.post(b"reply\n")  # stdin is at EOF: what was asked is still answered
        await proto.finish()
        assert proto.closed
    assert os.read(out_r, 100) == b"reply\n"
    # the parent shares the descriptors: they are left open and blocking, as they came
    assert os.get_blocking(in_r) and os.get_blocking(out_w)


async def test_sockets_read_into_one_shared_buffer_and_each_connection_gets_its_own_bytes() -> None:
    """Sockets take the buffered path (one read buffer per event loop): two connections
    read at once, one of them a line of several buffers' worth, each gets exactly its bytes."""
    loop = asyncio.get_running_loop()
    payloads = [b"a" * (3 * READ_CHUNK + 17) + b"\n" + b"tail", b"".join(b"%d\n" % i for i in range(5000))]
    protos: list[StreamProtocol] = []
    senders = []
    for data in payloads:
        ours, theirs = socket.socketpair()
        proto = StreamProtocol(None, peer=PeerProcess(os.getpid()))
        await loop.connect_accepted_socket(lambda proto=proto: proto, ours)  # type: ignore[misc]
        protos.append(proto)

        def send(theirs: socket.socket = theirs, data: bytes = data) -> None:
            with theirs:
                for at in range(0, len(data), 1000):  # many small writes, interleaved with the other's
                    theirs.sendall(data[at:at + 1000])
                theirs.shutdown(socket.SHUT_WR)

        senders.append(threading.Thread(target=send))
    for t in senders:
        t.start()
    got: list[bytes] = [b"", b""]

    async def read(i: int) -> None:
        got[i] = await read_all(protos[i])

    async with anyio.create_task_group() as tg:
        for i in range(2):
            tg.start_soon(read, i)
    for t in senders:
        t.join()
    for proto in protos:
        proto.abort()
    assert got == payloads


async def test_end_chunks_ends_a_waiting_read_at_once_and_reads_nothing_queued_after_it() -> None:
    proto = StreamProtocol(None, peer=PeerProcess(os.getpid()))
    chunks = proto.chunks()
    proto.data_received(b"one\n")
    assert await anext(chunks) == b"one\n"
    got: list[bytes] = []

    async def read() -> None:
        got.extend([chunk async for chunk in chunks])

    async with anyio.create_task_group() as tg:
        tg.start_soon(read)
        await anyio.wait_all_tasks_blocked()  # the read waits for bytes
        proto.end_chunks()
    assert got == []
    proto.data_received(b"two\n")  # what arrives afterwards is never read
    assert [chunk async for chunk in proto.chunks()] == []


async def test_a_stdout_nobody_reads_is_dropped_at_max_buffered_bytes(pipes: tuple[int, int, int, int],
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    in_r, in_w, _out_r, out_w = pipes
    caplog.set_level(logging.WARNING, "memoryd.transports")
    line = b"x" * 16383 + b"\n"
    fcntl.fcntl(out_w, fcntl.F_SETPIPE_SZ, 65536)  # the kernel's share: exactly 4 lines
    async with stdio_stream(in_r, out_w, 65536) as proto:
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
        assert await read_all(proto) == b"more\n"
    assert [r.getMessage() for r in caplog.records] == [
        "dropping a connection that stopped reading: 81920 bytes unsent (max_buffered_bytes 65536)"]


async def test_regular_files_use_the_fallback(tmp_path: Path) -> None:
    data = b"".join(b'{"n":%d}\n' % n for n in range(20_000))  # several reads' worth
    (tmp_path / "in").write_bytes(data)
    with (tmp_path / "in").open("rb") as fin, (tmp_path / "out").open("wb") as fout:
        async with stdio_stream(fin.fileno(), fout.fileno(), 65536) as proto:
            assert isinstance(proto.transport, FileReader) and isinstance(proto.out, FileWriter)
            assert await read_all(proto) == data
            proto.post(b"one\n")
            proto.post(b"two\n")
            await proto.finish()
    assert (tmp_path / "out").read_bytes() == b"one\ntwo\n"


async def test_dev_null_uses_the_fallback() -> None:
    """epoll refuses /dev/null as it does a regular file."""
    fin, fout = os.open(os.devnull, os.O_RDONLY), os.open(os.devnull, os.O_WRONLY)
    try:
        async with stdio_stream(fin, fout, 65536) as proto:
            assert isinstance(proto.transport, FileReader) and isinstance(proto.out, FileWriter)
            assert await read_all(proto) == b""  # EOF at once
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


async def test_one_socket_for_stdin_and_stdout_is_one_socket_transport() -> None:
    """inetd style: a write pipe on the socket would read incoming bytes as its peer closing."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        async with stdio_stream(theirs.fileno(), theirs.fileno(), 65536) as proto:
            assert proto.transport is proto.out
            ours.sendall(b"ask\n")
            ours.shutdown(socket.SHUT_WR)
            assert await read_all(proto) == b"ask\n"
            proto.post(b"answer\n")  # after the peer's EOF
            await proto.finish()
        assert ours.recv(100) == b"answer\n"
        assert theirs.getblocking()
