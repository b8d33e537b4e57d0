"""Resource limits (issue #8 item 7), each against a real daemon whose config sets it small:
the cap holds, and other clients are served meanwhile."""

from __future__ import annotations

import json
import os
import resource
import socket
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from e2e_helpers import Gate, add, entry_input, state
from rawclient import socket_client, write_ctx

pytestmark = pytest.mark.anyio

INIT = (b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocol":"dsh-memory-protocol/v1",'
        b'"capabilities":{"approvals":true}}}\n')


def limited(daemon_factory: Any, tmp_path: Path, config: str, policy: str = "auto", name: str = "d") -> Any:
    cfg = tmp_path / f"{name}.toml"
    cfg.write_text(config)
    return daemon_factory("--config", str(cfg), policy=policy, name=name)


def rss_kib(pid: int, key: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {key} for pid {pid}")


def connect(path: Path) -> socket.socket:
    """A plain blocking socket (closed synchronously, unlike an asyncio transport); the
    timeout only turns a hang into a failure."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(str(path))
    return s


def read_to_eof(s: socket.socket) -> bytes:
    """Everything the daemon sends until it closes the connection."""
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    return data


def read_line(s: socket.socket) -> dict[str, Any]:
    data = b""
    while not data.endswith(b"\n"):
        chunk = s.recv(1)
        assert chunk, "the daemon closed the connection"
        data += chunk
    return json.loads(data)  # type: ignore[no-any-return]


def close_and_wait(s: socket.socket) -> None:
    """Half-close, then read until the daemon closes its end: it has let go of the
    connection (its slot is free) once that EOF arrives."""
    s.shutdown(socket.SHUT_WR)
    read_to_eof(s)
    s.close()


# --- max_batch_calls ---------------------------------------------------------------------


async def test_a_batch_over_max_batch_calls_is_one_error_and_runs_nothing(daemon_factory: Any,
                                                                          tmp_path: Path) -> None:
    d = limited(daemon_factory, tmp_path, "max_batch_calls = 3\n")
    async with socket_client(d.socket_path) as raw, socket_client(d.socket_path) as other:
        await add(raw, "keep me")
        before = await state(raw)
        calls = [{"jsonrpc": "2.0", "id": 100 + n, "method": "memory/add",
                  "params": {"input": entry_input(f"batch {n}"), "write": write_ctx()}} for n in range(4)]
        await raw.send_line(json.dumps(calls).encode())
        r = await raw.raw_reply()
        assert r["id"] is None and r["error"]["code"] == -32600
        assert r["error"]["message"] == "Invalid request: a batch may hold at most 3 calls"
        assert r["error"]["data"]["code"] == "INVALID_REQUEST"
        assert await state(raw) == before
        assert (await other.ok("memory/query", {}))["total"] == 1
        # at the cap, a batch is served as usual
        await raw.send_line(json.dumps(calls[:3]).encode())
        served = await raw.batch_reply()
        assert sorted(m["id"] for m in served) == [100, 101, 102]
        for m in served:
            raw._responses.pop(m["id"])
        assert len(await raw.ok("memory/list", {})) == 4

        # The 56 KB line of tiny calls (400 MB of RSS once): one error, a few MB.
        pid = d.proc.pid
        start = rss_kib(pid)
        await raw.send_line(b"[" + b",".join([b"{}"] * 19000) + b"]")
        r = await raw.raw_reply()
        assert r["id"] is None and r["error"]["code"] == -32600
        assert rss_kib(pid) - start < 64 * 1024, "a refused batch line must not cost its calls' memory"
        assert (await other.ok("memory/query", {}))["total"] == 4


# --- key limits --------------------------------------------------------------------------


def session_write(session_id: str = "s-1", cwd: str = "/home/u/proj", agent: str = "coder") -> dict[str, Any]:
    return write_ctx(session_id, cwd, agent)


@pytest.mark.parametrize(("write", "field", "message"), [
    (session_write(session_id="s" * 257), "sessionId", "sessionId longer than 256 characters"),
    (session_write(session_id="😀" * 129), "sessionId", "sessionId longer than 256 characters"),
    (session_write(cwd="/" + "d" * 4096), "workspaceKey", "cwd (workspaceKey) longer than 4096 characters"),
    (session_write(agent="a" * 257), "agentKey", "agentPreset (agentKey) longer than 256 characters"),
])
async def test_session_keys_over_their_limit_are_refused(daemon: Any, write: dict[str, Any], field: str,
                                                         message: str) -> None:
    async with socket_client(daemon.socket_path) as raw, socket_client(daemon.socket_path) as other:
        before = await state(raw)
        err = await raw.fail("memory/add", {"input": entry_input("x"), "write": write})
        assert err.code == "INVALID_INPUT" and err.details == {"field": field}
        assert err.error["message"] == message
        err = await raw.fail("memory/snapshot", {"session": write["agent"]["session"]})
        assert err.code == "INVALID_INPUT" and err.details == {"field": field}
        assert await state(raw) == before
        assert (await other.ok("memory/query", {}))["total"] == 0


async def test_session_keys_at_their_limit_are_stored(daemon: Any) -> None:
    async with socket_client(daemon.socket_path) as raw:
        w = session_write(session_id="😀" * 128, cwd="/" + "d" * 4095, agent="a" * 256)
        e = (await raw.ok("memory/add", {"input": entry_input("x", "agent", "workspace"), "write": w}))["entry"]
        assert e["sessionId"] == "😀" * 128 and e["workspaceKey"] == "/" + "d" * 4095 and e["agentKey"] == "a" * 256


@pytest.mark.parametrize(("params", "field"), [
    ({"filter": {"text": "q" * 2001}}, "filter.text"),
    ({"filter": {"text": "q"}, "opts": {"sessionId": "s" * 257}}, "opts.sessionId"),
    ({"opts": {"agentKey": "a" * 257}}, "agentKey"),
    ({"opts": {"workspaceKey": "/" + "w" * 4096}}, "workspaceKey"),
])
async def test_query_keys_over_their_limit_are_refused(daemon: Any, params: dict[str, Any], field: str) -> None:
    async with socket_client(daemon.socket_path) as raw, socket_client(daemon.socket_path) as other:
        await add(raw, "q" * 10)
        before = await state(raw)
        err = await raw.fail("memory/query", params)
        assert err.code == "INVALID_INPUT" and err.details == {"field": field}
        assert await state(raw) == before
        assert (await other.ok("memory/query", {"filter": {"text": "q" * 2000}}))["total"] == 0


async def test_recalled_rows_keep_a_bounded_prefix_of_the_query(daemon: Any) -> None:
    async with socket_client(daemon.socket_path) as raw:
        await add(raw, "x" * 1500)
        query = "x" * 1400 + "😀"
        res = await raw.ok("memory/query", {"filter": {"text": "x" * 1400}, "opts": {"sessionId": "s-9"}})
        assert res["total"] == 1
        await raw.ok("memory/query", {"filter": {"text": query}, "opts": {"sessionId": "s-9"}})
        note = await raw.notification("memory/recalled")
        assert note["params"]["query"] == "x" * 1400  # the event carries the whole query
        rows = [a for a in await raw.ok("audit/list", {}) if a["action"] == "recalled"]
        assert [r["text"] for r in rows] == ["x" * 200 + "…"] * 2
        await raw.ok("memory/query", {"filter": {"text": "x" * 200}, "opts": {"sessionId": "s-9"}})
        assert (await raw.ok("audit/list", {"limit": 1}))[0]["text"] == "x" * 200


# --- max_pending_approvals ---------------------------------------------------------------


async def test_a_write_beyond_max_pending_approvals_is_denied_at_once(daemon_factory: Any, tmp_path: Path) -> None:
    d = limited(daemon_factory, tmp_path, "max_pending_approvals = 2\n", policy="ask")
    # each held write reports its reply here, so the test waits on the reply itself
    landed, landing = anyio.create_memory_object_stream[dict[str, Any]](10)
    async with socket_client(d.socket_path) as raw, socket_client(d.socket_path) as other, \
            landed, landing, anyio.create_task_group() as tg:
        gate, other_gate = Gate(), Gate()
        raw.on_approval = gate
        other.on_approval = other_gate
        before = await state(raw)
        replies: list[dict[str, Any]] = []

        async def write(text: str) -> None:
            await landed.send(await raw.call("memory/add", {"input": entry_input(text), "write": write_ctx()}))

        tg.start_soon(write, "one")
        await raw.notification("approval/asked")
        tg.start_soon(write, "two")
        await raw.notification("approval/asked", 1)
        err = await raw.fail("memory/add", {"input": entry_input("three"), "write": write_ctx()})
        assert err.code == "WRITE_DENIED" and err.details == {"outcome": "unavailable"}
        assert err.error["message"] == "write denied: unavailable: this connection already has 2 approvals pending"
        assert [n["params"]["text"] for n in raw.notifications if n["method"] == "approval/asked"] == ["one", "two"]
        denied = (await raw.ok("audit/list", {"limit": 1}))[0]
        assert denied["action"] == "add-denied" and denied["text"] == "three"
        assert denied["outcome"] == "unavailable (via approval, writePolicy ask)"
        # another connection has its own allowance
        tg.start_soon(other.call, "memory/add", {"input": entry_input("four"), "write": write_ctx("s-2")})
        asked = await other.notification("approval/asked")
        assert asked["params"]["text"] == "four"
        await other.call("approval/decided", {"id": asked["params"]["id"], "outcome": "rejected"})
        # a decision frees a slot: the next write is asked again
        first = gate.asked[0]["id"]
        await raw.call("approval/decided", {"id": first, "outcome": "rejected"})
        with anyio.fail_after(10):
            replies.append(await landing.receive())
        tg.start_soon(write, "five")
        await raw.notification("approval/asked", 2)
        for a in [n["params"] for n in raw.notifications if n["method"] == "approval/asked"][1:]:
            await raw.call("approval/decided", {"id": a["id"], "outcome": "rejected"})
        with anyio.fail_after(10):
            replies += [await landing.receive(), await landing.receive()]
        assert [r["error"]["data"]["details"]["outcome"] for r in replies] == ["rejected"] * 3
        entries, budgets, ledger = await state(raw)
        assert (entries, budgets) == before[:2] and ledger == before[2] + 5  # five denied rows, nothing else


# --- half_line_timeout_s -----------------------------------------------------------------


async def test_a_half_line_held_too_long_is_answered_and_closed(daemon_factory: Any, tmp_path: Path) -> None:
    d = limited(daemon_factory, tmp_path, "half_line_timeout_s = 0.5\n")
    async with socket_client(d.socket_path) as idle:
        with connect(d.socket_path) as s:
            started = time.monotonic()
            s.sendall(INIT + b'{"jsonrpc":"2.0","id":2,"method":"memory/li')
            lines = read_to_eof(s).splitlines()
            waited = time.monotonic() - started
        assert len(lines) == 2 and json.loads(lines[0])["id"] == 1
        err = json.loads(lines[1])
        assert err["id"] is None and err["error"]["code"] == -32600
        assert err["error"]["message"] == "Invalid request: incomplete line timed out"
        assert waited >= 0.5
        # `idle` sent nothing for longer than the timeout, with no partial line: still served
        assert (await idle.ok("memory/query", {}))["total"] == 0
    assert "an incomplete line waited more than 0.5 s; closing" in d.stderr()


# --- max_connections and EMFILE ----------------------------------------------------------


async def test_connections_over_max_connections_are_refused_with_one_line(daemon_factory: Any,
                                                                          tmp_path: Path) -> None:
    d = limited(daemon_factory, tmp_path, "max_connections = 2\n")
    async with socket_client(d.socket_path) as a:
        b = connect(d.socket_path)
        b.sendall(INIT)
        assert read_line(b)["id"] == 1
        for _ in range(3):
            with connect(d.socket_path) as refused:  # (a write may fail: the daemon closes at once)
                lines = read_to_eof(refused).splitlines()
            assert len(lines) == 1
            err = json.loads(lines[0])
            assert err["id"] is None and err["error"]["code"] == -32600
            assert err["error"]["message"] == "Invalid request: too many connections"
        assert (await a.ok("memory/query", {}))["total"] == 0
        close_and_wait(b)
        # a slot is free again: the next connection is served
        async with socket_client(d.socket_path) as c:
            assert (await c.ok("daemon/status", {}))["connections"] == 2
    assert d.stderr().count("refusing a connection: max_connections (2) are open") == 1


async def test_out_of_descriptors_is_one_log_line_and_accepting_resumes(daemon: Any) -> None:
    pid = daemon.proc.pid
    async with socket_client(daemon.socket_path) as a:
        # Leave the daemon exactly one free descriptor number, taken by the next connection
        # (descriptors already open above the limit stay usable).
        used = {int(n) for n in os.listdir(f"/proc/{pid}/fd")}
        limit = min(n for n in range(len(used) + 1) if n not in used) + 1
        soft, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (limit, hard))
        b = connect(daemon.socket_path)
        b.sendall(INIT)
        assert read_line(b)["id"] == 1
        # These wait in the listen backlog: every accept fails with EMFILE.
        waiting = [connect(daemon.socket_path) for _ in range(5)]
        for w in waiting:
            w.sendall(INIT)
        assert (await a.ok("memory/query", {}))["total"] == 0  # open connections are served
        close_and_wait(b)
        # a descriptor is free: the first waiting connection is accepted and answered
        assert read_line(waiting[0])["id"] == 1
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (soft, hard))
        for w in waiting[1:]:  # and, with descriptors back, all the others
            assert read_line(w)["id"] == 1
        for w in waiting:
            w.close()
    log = daemon.stderr()
    assert log.count("cannot accept a connection: Too many open files (EMFILE)") == 1
    assert "Traceback" not in log


# --- max_buffered_bytes ------------------------------------------------------------------


async def test_an_approver_that_stops_reading_is_dropped_at_max_buffered_bytes(daemon_factory: Any,
                                                                              tmp_path: Path) -> None:
    # approvers = "any": this approver has no terminal; the writer is another process, since
    # an approver is never asked about its own process's writes
    d = limited(daemon_factory, tmp_path, 'approvers = "any"\nmax_buffered_bytes = 65536\n'
                '[budgets.user]\nuser_global = 1000000\n', policy="ask")
    stalled = connect(d.socket_path)
    stalled.sendall(INIT + b'{"jsonrpc":"2.0","id":2,"method":"approval/subscribe"}\n')
    got = b""
    while got.count(b"\n") < 2:  # the two replies; then this approver never reads again
        got += stalled.recv(65536)
    try:
        async with socket_client(d.socket_path, approvals=False, foreign=True) as writer, \
                socket_client(d.socket_path) as other:
            before = await state(other)
            for n in range(12):  # pipelined: each parks on an ask sent to the stalled approver
                params = {"input": entry_input(f"{n}" + "x" * 200_000), "write": write_ctx()}
                await writer.send_line(json.dumps({"jsonrpc": "2.0", "id": 500 + n, "method": "memory/add",
                                                   "params": params}).encode())
            replies = [await writer.raw_reply() for _ in range(12)]
            assert sorted(r["id"] for r in replies) == list(range(500, 512))
            assert (await other.ok("memory/query", {}))["total"] == 0
        # Every ask went to the stalled approver; once it was dropped, none could be decided.
        assert [r["error"]["data"]["details"]["outcome"] for r in replies] == ["unavailable"] * 12
        async with socket_client(d.socket_path) as late:
            entries, budgets, ledger = await state(late)
            assert (entries, budgets) == before[:2] and ledger == before[2] + 12
    finally:
        stalled.close()
    assert d.stderr().count("dropping a connection that stopped reading") == 1


async def test_the_largest_import_holds_its_journal_in_bounded_memory(daemon_factory: Any, tmp_path: Path) -> None:
    """The writer keeps a job's savepoint journal (the pages it changes) in memory: an import
    of the most entries one call may carry, into a store that already holds as many, costs
    the daemon a bounded peak, and the store serves on."""
    d = limited(daemon_factory, tmp_path, "[budgets.user]\nuser_global = 10000000\n")
    pid = d.proc.pid

    def envelope(batch: int) -> dict[str, Any]:
        return {"plugin": "dsh-memento", "schema": "memory-export-v1", "budgets": [],
                "entries": [entry_input(f"batch {batch} fact {k} " + "lorem ipsum dolor " * 50) for k in range(1000)]}

    async with socket_client(d.socket_path) as raw:
        await raw.ok("memory/import", {"envelope": envelope(0), "write": write_ctx()})
        before = rss_kib(pid, "VmHWM")
        await raw.ok("memory/import", {"envelope": envelope(1), "write": write_ctx()})
        assert rss_kib(pid, "VmHWM") - before < 32 * 1024, "one job's journal must stay bounded"
        assert (await raw.ok("memory/query", {"filter": {"text": "batch 1 fact 999 "}}))["total"] == 1
