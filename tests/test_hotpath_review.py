"""Adversarial tests of the per-request hot path (issue 10): the connection's own tasks, the
writer's batch re-run, the coalesced recall bookkeeping and our own RPC dispatch."""

from __future__ import annotations

import asyncio
import json
import socket
import sqlite3
import subprocess
from pathlib import Path

import anyio
import pytest
from conftest import start_daemon
from e2e_helpers import add
from faults import CONFIG
from inprocess import memory_daemon
from memoryd.app import DRAIN_S
from rawclient import write_ctx

pytestmark = pytest.mark.anyio

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


# --- recall bookkeeping: exact under concurrent queries and writes ------------------------

QUERY_TEXTS = ("needle", "eedle", "needl")


async def test_recall_counts_and_rows_are_exact_under_concurrent_queries_and_writes(tmp_path: Path) -> None:
    """Six connections query (each with its own sessionId) while a seventh adds and
    replaces matching entries. Every query's reply is one recall of each entry on its page:
    across all replies an entry shows recallCount 1, 2, ..., n exactly once each (the overlay
    neither misses a recall nor counts one twice, whether its commit is queued, in flight or
    done); the store ends with n and the last reply's lastRecalled; each session's recalled
    rows are its queries, in the order it sent them; the ledger verifies."""
    db = tmp_path / "memory.db"
    sessions = [f"s-q{k}" for k in range(6)]
    sent: dict[str, list[str]] = {s: [] for s in sessions}
    seen: dict[str, list[tuple[int, int]]] = {}
    async with memory_daemon(["--db", str(db), "--write-policy", "auto"]) as d:
        async with d.connect() as w:
            ids = [(await add(w, f"needle {n}"))["entry"]["id"] for n in range(6)]

            async def querier(session: str) -> None:
                async with d.connect() as raw:
                    for n in range(40):
                        text = QUERY_TEXTS[(n + len(sent[session])) % 3]
                        sent[session].append(text)
                        r = await raw.ok("memory/query", {"filter": {"text": text, "limit": 50},
                                                          "opts": {"sessionId": session}})
                        for e in r["entries"]:
                            seen.setdefault(e["id"], []).append((e["recallCount"], e["lastRecalled"]))

            async def writer() -> None:
                for n in range(30):
                    ids.append((await add(w, f"needle late {n}"))["entry"]["id"])
                    await w.ok("memory/replace", {"input": {"track": "user", "scope": "user-global",
                                                            "id": ids[n % 6], "text": f"needle {n % 6} v{n}"},
                                                  "write": write_ctx()})

            async with anyio.create_task_group() as tg:
                for s in sessions:
                    tg.start_soon(querier, s)
                tg.start_soon(writer)
            report = await w.ok("audit/verify", {})
            assert report["ok"], report["problems"]
            listed = {e["id"]: e for e in await w.ok("memory/list", {})}
    for i, shown in seen.items():
        assert sorted(c for c, _ in shown) == list(range(1, len(shown) + 1)), i
        assert listed[i]["recallCount"] == len(shown)
    conn = sqlite3.connect(db)
    try:
        stored = {i: (c, t) for i, c, t in conn.execute("SELECT id, recall_count, last_recalled FROM entries")}
        rows = conn.execute("SELECT session_id, text FROM audit WHERE action = 'recalled' ORDER BY seq").fetchall()
    finally:
        conn.close()
    for i, shown in seen.items():
        assert stored[i] == (len(shown), max(t for _, t in shown)), i
    assert {i for i, (c, _) in stored.items() if c} == set(seen)
    for s in sessions:
        assert [t for sid, t in rows if sid == s] == sent[s]
    assert len(rows) == sum(len(v) for v in sent.values())


# --- connection: a peer that leaves with requests in flight ---------------------------------


async def test_a_peer_that_leaves_mid_pipeline_gets_every_reply_in_order_and_leaks_no_task(tmp_path: Path) -> None:
    """120 writes and queries pipelined, then EOF at once: every request read is served, in
    the order sent (the ledger's rows follow the lines), its reply sent; once the daemon
    has closed its end, the event loop holds exactly the tasks it held before the peer
    came, and the store holds every acknowledged write."""
    db = tmp_path / "memory.db"
    async with memory_daemon(["--db", str(db), "--write-policy", "auto"]) as d:
        await d.daemon.writer.idle()
        await anyio.wait_all_tasks_blocked()  # the daemon's own tasks (the heads' appender) have started
        baseline = {t for t in asyncio.all_tasks() if not t.done()}
        async with d.connect() as raw:
            lines = []
            for n in range(120):
                if n % 3 == 2:
                    lines.append({"jsonrpc": "2.0", "id": 1000 + n, "method": "memory/query",
                                  "params": {"filter": {"text": "pipelined"}, "opts": {"sessionId": "s-1"}}})
                else:
                    lines.append({"jsonrpc": "2.0", "id": 1000 + n, "method": "memory/add", "params": {
                        "input": {"track": "user", "scope": "user-global", "text": f"pipelined {n}"},
                        "write": write_ctx()}})
            await raw.send_line(b"\n".join(json.dumps(m).encode() for m in lines))
            await raw.hang_up()  # EOF at once; returns once the daemon has closed its end
            replies = [m for m in raw.received if isinstance(m, dict) and m.get("id", 0) >= 1000]
        await d.daemon.writer.settled()
        left = {t for t in asyncio.all_tasks() if not t.done()} - baseline
        assert not left, left
        assert [r["id"] for r in replies] == [1000 + n for n in range(120)]
        assert all("result" in r for r in replies)
        async with d.connect() as check:
            audit = await check.ok("audit/list", {"limit": 1000})
    added = [a["text"] for a in sorted(audit, key=lambda a: a["seq"]) if a["action"] == "add"]
    assert added == [f"pipelined {n}" for n in range(120) if n % 3 != 2]


# --- reads: a query's statements in one read transaction ------------------------------------


async def test_a_query_whose_read_fails_leaves_no_transaction_open_and_the_next_one_sees_new_writes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A query's statements run in one read transaction on a reader. One that fails after it
    began is answered with an error and ends that transaction, and the store is unchanged;
    the next query, on the same reader (the one free longest is taken last), sees a write
    committed after it: no snapshot is held."""
    from e2e_helpers import state
    from memoryd import queries

    db = tmp_path / "memory.db"
    real = queries.query_page
    fail = [True]

    def failing_once(conn: sqlite3.Connection, **kw: object) -> object:
        result = real(conn, **kw)  # type: ignore[arg-type]
        if fail:
            fail.clear()
            raise sqlite3.OperationalError("disk I/O error")
        return result

    async with memory_daemon(["--db", str(db), "--write-policy", "auto"]) as d, d.connect() as raw:
        await add(raw, "before the fault")
        before = await state(raw)
        monkeypatch.setattr(queries, "query_page", failing_once)
        reply = await raw.call("memory/query", {"filter": {"text": "fault"}})
        assert reply["error"]["code"] == -32603
        assert await state(raw) == before
        await add(raw, "after the fault")
        got = await raw.ok("memory/query", {"filter": {"text": "fault"}})
        assert sorted(e["text"] for e in got["entries"]) == ["after the fault", "before the fault"]
        assert got["total"] == 2
