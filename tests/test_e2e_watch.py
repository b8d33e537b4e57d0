"""memory/watch against the daemon's real stack in this process: a watcher hears of other
connections' committed writes of the entries its session sees, each with the writing
session's id; never of what its session cannot see, never twice; a watcher that does not
read is dropped at the output cap without slowing the writer.

A watcher's absence of an event is shown with a sentinel: a later write it does see. Its
events arrive in commit order on one connection, so once the sentinel is there, anything
it was not sent before it was never sent."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from e2e_helpers import entry_input, state
from inprocess import InProcess, memory_daemon
from memoryd_protocol.constants import MAX_WATCHED_SESSIONS
from rawclient import Raw, write_ctx

pytestmark = pytest.mark.anyio

PROJ = "/home/u/proj"
UG = {"track": "user", "scope": "user-global"}


def session(session_id: str, cwd: str = PROJ, agent: str = "coder") -> dict[str, Any]:
    return {"id": session_id, "header": {"cwd": cwd, "agentPreset": agent}}


@asynccontextmanager
async def daemon(tmp_path: Path, *extra: str, listen: bool = False) -> AsyncIterator[InProcess]:
    async with memory_daemon(["--db", str(tmp_path / "m.db"), "--write-policy", "auto", *extra],
                             listen=listen) as d:
        yield d


async def watching(raw: Raw, *sessions: dict[str, Any]) -> None:
    for s in sessions:
        assert await raw.ok("memory/watch", {"session": s}) == {}


def summary(notes: list[dict[str, Any]]) -> list[tuple[str, str, str | None]]:
    """(method, entry text, sessionId) of each event."""
    return [(n["method"], n["params"]["entry"]["text"], n["params"].get("sessionId")) for n in notes]


async def test_a_watcher_hears_every_kind_of_write_by_another_connection(tmp_path: Path) -> None:
    async with daemon(tmp_path) as d, d.connect() as watcher, d.connect() as writer:
        await watching(watcher, session("w-1"))
        w = write_ctx("s-2", PROJ, "coder")
        await writer.ok("memory/add", {"input": entry_input("Prefers tabs"), "write": w})
        await writer.ok("memory/replace", {"input": {**UG, "match": "tabs", "text": "Prefers spaces"}, "write": w})
        await writer.ok("memory/remove", {"input": {**UG, "match": "spaces"}, "write": w})
        await writer.ok("memory/seed", {"inputs": [entry_input("one"), entry_input("two")], "write": w})
        await writer.ok("memory/consolidate", {"input": {**UG, "matches": ["one", "two"], "text": "one+two"},
                                               "write": write_ctx("s-3", PROJ, "coder")})
        env = {"plugin": "dsh-memento", "schema": "memory-export-v1", "exportedAt": "2026-01-01T00:00:00.000Z",
               "budgets": [], "entries": [entry_input("imported")]}
        await writer.ok("memory/import", {"envelope": env, "write": w})
        proposal = await writer.ok("proposals/create", {"input": {"kind": "k", **UG, "text": "proposed"},
                                                        "session": session("s-2")})
        await writer.ok("proposals/approve", {"id": proposal["id"], "write": write_ctx("s-4", PROJ, "coder")})
        notes = await watcher.notifications_from(0, 10)
        assert summary(notes) == [
            ("memory/added", "Prefers tabs", "s-2"),
            ("memory/updated", "Prefers spaces", "s-2"),
            ("memory/removed", "Prefers spaces", "s-2"),
            ("memory/added", "one", "s-2"),
            ("memory/added", "two", "s-2"),
            ("memory/removed", "one", "s-3"),
            ("memory/removed", "two", "s-3"),
            ("memory/added", "one+two", "s-3"),
            ("memory/added", "imported", "s-2"),
            ("memory/added", "proposed", "s-4"),
        ]
        assert notes[1]["params"]["previous"]["text"] == "Prefers tabs"
        # the writer's own events carry its session id too
        assert summary(await writer.notifications_from(0, 1)) == [("memory/added", "Prefers tabs", "s-2")]


async def test_a_watcher_never_hears_of_what_its_session_cannot_see(tmp_path: Path) -> None:
    async with daemon(tmp_path) as d, d.connect() as watcher, d.connect() as writer:
        await watching(watcher, session("w-a", "/work/a", "coder"))
        other_ws = write_ctx("s-b", "/work/b", "coder")
        other_agent = write_ctx("s-r", "/work/a", "reviewer")
        await writer.ok("memory/add", {"input": entry_input("b's fact", "agent", "workspace"), "write": other_ws})
        await writer.ok("memory/add", {"input": entry_input("reviewer's own"), "write": other_agent})
        await writer.ok("memory/add", {"input": entry_input("reviewer's in a", "agent", "workspace"),
                                       "write": other_agent})
        # consolidate: each removed entry and the new one are filtered on their own
        await writer.ok("memory/seed", {"inputs": [entry_input("shared x", agentKey=""), entry_input("mine y")],
                                        "write": other_agent})
        await writer.ok("memory/consolidate", {"input": {**UG, "matches": ["shared x", "mine y"], "text": "merged"},
                                               "write": other_agent})
        sentinel = write_ctx("s-a2", "/work/a", "")
        await writer.ok("memory/add", {"input": entry_input("a's fact", "agent", "workspace"), "write": sentinel})
        notes = await watcher.notifications_from(0, 3)
        assert summary(notes) == [
            ("memory/added", "shared x", "s-r"),
            ("memory/removed", "shared x", "s-r"),
            ("memory/added", "a's fact", "s-a2"),
        ]
        # (the merged entry stays the reviewer's: consolidation never widens who sees a text)


async def test_a_connection_that_writes_and_watches_gets_each_event_once(tmp_path: Path) -> None:
    async with daemon(tmp_path) as d, d.connect() as both, d.connect() as other:
        await watching(both, session("s-1"), session("s-1b"))  # two views that both see it
        await both.ok("memory/add", {"input": entry_input("mine"), "write": write_ctx("s-1", PROJ, "coder")})
        await other.ok("memory/add", {"input": entry_input("theirs"), "write": write_ctx("s-9", PROJ, "coder")})
        notes = await both.notifications_from(0, 2)
        assert summary(notes) == [("memory/added", "mine", "s-1"), ("memory/added", "theirs", "s-9")]
        await other.ok("memory/add", {"input": entry_input("last"), "write": write_ctx("s-9", PROJ, "coder")})
        assert summary(await both.notifications_from(2, 1)) == [("memory/added", "last", "s-9")]


async def test_the_cap_on_watched_sessions_refuses_the_next_and_changes_nothing(tmp_path: Path) -> None:
    async with daemon(tmp_path) as d, d.connect() as watcher, d.connect() as writer:
        await watching(watcher, *(session(f"w-{i}", f"/w/{i}") for i in range(MAX_WATCHED_SESSIONS)))
        await watching(watcher, session("w-0", "/w/0"))  # the same id again: no second watch
        before = await state(writer)
        err = await watcher.fail("memory/watch", {"session": session("w-extra", "/w/extra")})
        assert err.code == "INVALID_INPUT" and err.details == {"field": "session.id"}
        assert f"{MAX_WATCHED_SESSIONS} sessions" in err.error["message"]
        assert await state(writer) == before
        assert d.daemon.service.watchers.sessions(_only(d)) == [f"w-{i}" for i in range(MAX_WATCHED_SESSIONS)]
        await writer.ok("memory/add", {"input": entry_input("extra", "agent", "workspace"),
                                       "write": write_ctx("s-2", "/w/extra", "coder")})
        await writer.ok("memory/add", {"input": entry_input("seen", "agent", "workspace"),
                                       "write": write_ctx("s-2", "/w/3", "coder")})
        assert summary(await watcher.notifications_from(0, 1)) == [("memory/added", "seen", "s-2")]


def _only(d: InProcess) -> Any:
    """The one connection of ``d`` that watches anything."""
    (conn,) = [c for c in d.daemon.connections if d.daemon.service.watchers.sessions(c)]
    return conn


async def test_a_watch_needs_a_session_id(tmp_path: Path) -> None:
    async with daemon(tmp_path) as d, d.connect() as raw:
        for s in ({"header": {"cwd": PROJ}}, {"id": "  "}):
            err = await raw.fail("memory/watch", {"session": s})
            assert (err.code, err.details) == ("INVALID_INPUT", {"field": "session.id"})
        err = await raw.fail("memory/watch", {})
        assert err.code == "INVALID_INPUT"
        assert len(d.daemon.service.watchers) == 0


async def test_closing_the_connection_ends_its_watches(tmp_path: Path) -> None:
    async with daemon(tmp_path) as d, d.connect() as writer:
        async with d.connect() as watcher:
            await watching(watcher, session("w-1"), session("w-2"))
            assert len(d.daemon.service.watchers) == 1
            await watcher.hang_up()  # returns once the daemon closed its end
        assert len(d.daemon.service.watchers) == 0
        await writer.ok("memory/add", {"input": entry_input("after"), "write": write_ctx("s-2")})


async def test_watching_a_session_does_not_claim_it(tmp_path: Path) -> None:
    """Another connection still takes the watched session's first snapshot: watching is not
    acting as the session."""
    async with daemon(tmp_path) as d, d.connect() as watcher, d.connect() as harness:
        await watching(watcher, session("s-7"))
        assert "text" in await harness.ok("memory/snapshot", {"session": session("s-7")})


async def test_the_raw_lines_of_a_watch(tmp_path: Path) -> None:
    async with daemon(tmp_path) as d, d.connect() as watcher, d.connect() as writer:
        line = {"jsonrpc": "2.0", "id": "w", "method": "memory/watch", "params": {"session": session("w-1")}}
        await watcher.send_line(json.dumps(line).encode())
        assert await watcher.raw_reply() == {"jsonrpc": "2.0", "id": "w", "result": {}}
        added = await writer.ok("memory/add", {"input": entry_input("raw"), "write": write_ctx("s-2")})
        (note,) = await watcher.notifications_from(0, 1)
        assert note == {"jsonrpc": "2.0", "method": "memory/added",
                        "params": {"entry": added["entry"], "sessionId": "s-2"}}
        # a write that names no session: the event has no sessionId
        await writer.ok("memory/add", {"input": entry_input("anonymous"), "write": {"agent": {}}})
        (note,) = await watcher.notifications_from(1, 1)
        assert "sessionId" not in note["params"]


async def test_a_watcher_that_does_not_read_is_dropped_and_the_writer_never_waits(tmp_path: Path) -> None:
    """The watcher reads nothing after its watch's reply; the writer's writes all complete,
    each a round trip, until the daemon drops the watcher at max_buffered_bytes."""
    cfg = tmp_path / "cfg.toml"
    cfg.write_text("max_buffered_bytes = 65536\n[budgets.user]\nuser_global = 10000000\n")
    sock = tmp_path / "m.sock"
    text = "x" * 50_000
    async with daemon(tmp_path, "--config", str(cfg), "--socket", str(sock), listen=True) as d, \
            d.connect() as writer, await anyio.connect_unix(str(sock)) as stream:
        hello = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
        watch = {"jsonrpc": "2.0", "id": 2, "method": "memory/watch", "params": {"session": session("w-1")}}
        await stream.send((json.dumps(hello) + "\n" + json.dumps(watch) + "\n").encode())
        got = b""
        with anyio.fail_after(10):
            while got.count(b"\n") < 2:
                got += await stream.receive()
        assert json.loads(got.splitlines()[1]) == {"jsonrpc": "2.0", "id": 2, "result": {}}
        conn = _only(d)
        writes = 0
        while not conn.closed:  # a state of the daemon's, changed by the drop itself
            assert writes < 400, "the watcher was never dropped"
            added = await writer.ok("memory/add", {"input": entry_input(f"{writes} {text}"), "write": write_ctx()})
            await writer.ok("memory/remove", {"input": {**UG, "id": added["entry"]["id"]}, "write": write_ctx()})
            writes += 1
        # the writer keeps going; the dropped watcher's stream ends after what was sent
        await writer.ok("memory/add", {"input": entry_input("after the drop"), "write": write_ctx()})
        with anyio.fail_after(10):
            while True:
                try:
                    await stream.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionResetError):
                    break
