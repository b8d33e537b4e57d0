"""The Python clients' ``watch``: events of other connections' writes, typed, with the
writer's session id, delivered as every other event (``on`` and ``events``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import memoryd_client as mc
import pytest
from memoryd_client import types as T

pytestmark = [pytest.mark.anyio, pytest.mark.inprocess]

TIMEOUT = 10
UG = {"track": "user", "scope": "user-global"}


def session(sid: str, cwd: str = "/home/u/proj", agent: str = "coder") -> dict[str, Any]:
    return mc.make_session(sid, cwd=cwd, agent_preset=agent)


async def test_watch_delivers_typed_events_of_another_connection(daemon: Any) -> None:
    with anyio.fail_after(30):
        async with mc.connect(daemon.socket_path, session=session("w-1"), timeout=TIMEOUT) as watcher, \
                mc.connect(daemon.socket_path, session=session("s-2"), timeout=TIMEOUT) as writer:
            stream = watcher.events(*mc.WATCH_EVENTS)
            heard: list[str] = []
            watcher.on("memory/removed", lambda ev: heard.append(ev.params.entry.text))
            assert await watcher.watch() == T.Empty()
            await writer.add({**UG, "text": "Prefers tabs"})
            await writer.replace({**UG, "match": "tabs", "text": "Prefers spaces"})
            await writer.add({"track": "agent", "scope": "workspace", "text": "not here"},
                             {"agent": {"session": session("s-3", cwd="/elsewhere")}})
            await writer.remove({**UG, "match": "spaces"})
            got = [await stream.receive(TIMEOUT) for _ in range(3)]
            assert [ev.method for ev in got] == ["memory/added", "memory/updated", "memory/removed"]
            assert isinstance(got[1].params, T.MemoryUpdated)
            assert got[1].params.previous.text == "Prefers tabs" and got[1].params.entry.text == "Prefers spaces"
            assert [ev.params.session_id for ev in got] == ["s-2", "s-2", "s-2"]
            assert heard == ["Prefers spaces"]  # the listener ran before the stream's consumer resumed


def test_sync_watch(daemon_factory: Any, tmp_path: Path) -> None:
    daemon = daemon_factory()
    with mc.connect_sync(daemon.socket_path, session=session("w-1"), timeout=TIMEOUT) as watcher, \
            mc.connect_sync(daemon.socket_path, session=session("s-2"), timeout=TIMEOUT) as writer:
        events = watcher.events("memory/added")
        watcher.watch(session("w-other", cwd="/other"))  # an explicit session: its view, not the connection's
        writer.add({"track": "agent", "scope": "workspace", "text": "in proj"})
        writer.add({"track": "agent", "scope": "workspace", "text": "in other"},
                   {"agent": {"session": session("s-2", cwd="/other")}})
        ev = events.receive(TIMEOUT)
        assert (ev.params.entry.text, ev.params.session_id) == ("in other", "s-2")
