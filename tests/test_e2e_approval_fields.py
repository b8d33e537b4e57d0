"""approval/asked says everything a human needs to decide (wire-v1 §5, issue #7 item 3):
where the entry lands (workspaceKey, agentKey, tags), every entry of a seed/import, the
requestId of the write that asked, and the origin of the connection that asked.

Raw NDJSON against a real daemon. The raw client runs in this process, so the daemon's
view of its peer (SO_PEERCRED, /proc/<pid>/exe) is this process.
"""

from __future__ import annotations

import json
import os
import re
import sys
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from e2e_helpers import entry_input, state
from rawclient import Raw, relay_client, socket_client, stdio_client, write_ctx

pytestmark = [pytest.mark.anyio, pytest.mark.inprocess]

UUID4 = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")
ME = {"pid": os.getpid(), "exe": os.path.realpath(sys.executable)}
RAW_ORIGIN = {"name": "raw", "version": "0", **ME}
UG = {"track": "user", "scope": "user-global"}


class Recorder:
    """Answers every approval with ``outcome`` and keeps what it was asked."""

    def __init__(self, outcome: str | None = "allowed-once") -> None:
        self.asked: list[dict[str, Any]] = []
        self.outcome = outcome
        self.arrived = anyio.Event()

    async def __call__(self, params: dict[str, Any]) -> str | None:
        self.asked.append(params)
        self.arrived.set()
        return self.outcome

    def last(self) -> dict[str, Any]:
        """The last approval, its (random) id checked and dropped."""
        asked = dict(self.asked[-1])
        assert UUID4.match(asked.pop("id"))
        return asked


def reason(action: str, layer: str, source: str, text: str, count: int | None = None) -> str:
    n = f" ({count} entries)" if count is not None else ""
    return f"[dsh-memento] {action}{n} {layer} [source:{source}]\n{text}"


async def ok(raw: Raw, method: str, params: dict[str, Any], id_: Any) -> Any:
    """``method`` sent with our own id (never one the raw client picks itself)."""
    reply = await raw.call(method, params, id_=id_)
    assert reply["id"] == id_ and "result" in reply, reply
    return reply["result"]


@asynccontextmanager
async def recording(path: Path) -> Any:
    async with socket_client(path) as raw:
        rec = Recorder()
        raw.on_approval = rec
        yield raw, rec


async def test_add_carries_keys_tags_request_id_and_origin(ask_daemon: Any) -> None:
    async with recording(ask_daemon.socket_path) as (raw, rec):
        await ok(raw, "memory/add", {"input": entry_input("Run make check", "agent", "workspace", tags=[" ci ", "ci"]),
                                     "write": write_ctx()}, "add-1")
        assert rec.last() == {
            "action": "add", "track": "agent", "scope": "workspace", "text": "Run make check",
            "source": "dsh-memento", "sessionId": "s-1",
            "reason": reason("add", "agent/workspace", "dsh-memento", "Run make check"),
            "workspaceKey": "/home/u/proj", "agentKey": "coder", "tags": ["ci"],
            "requestId": "add-1", "origin": RAW_ORIGIN,
        }
        # A number id comes back as that number; the shared layer is agentKey ''.
        await ok(raw, "memory/add", {"input": entry_input("Prefers tabs", agentKey=""), "write": write_ctx()}, 4100)
        assert rec.last() == {
            "action": "add", **UG, "text": "Prefers tabs", "source": "dsh-memento", "sessionId": "s-1",
            "reason": reason("add", "user/user-global", "dsh-memento", "Prefers tabs"),
            "workspaceKey": "", "agentKey": "", "tags": [], "requestId": 4100, "origin": RAW_ORIGIN,
        }
        assert type(rec.asked[-1]["requestId"]) is int


async def test_replace_remove_consolidate_carry_the_targets_keys(ask_daemon: Any) -> None:
    async with recording(ask_daemon.socket_path) as (raw, rec):
        await ok(raw, "memory/add", {"input": entry_input("Prefers tabs", tags=["style"]), "write": write_ctx()}, "add-a")
        await ok(raw, "memory/add", {"input": entry_input("likes tea", agentKey=""), "write": write_ctx()}, "add-b")

        # replace with tags: the tags the entry will have; without: the ones it keeps
        await ok(raw, "memory/replace", {"input": {**UG, "match": "tabs", "text": "Prefers spaces", "tags": ["fmt"]},
                                         "write": write_ctx()}, "r-1")
        text = "from:\nPrefers tabs\n\nto:\nPrefers spaces"
        assert rec.last() == {
            "action": "replace", **UG, "text": text, "source": "dsh-memento", "sessionId": "s-1",
            "reason": reason("replace", "user/user-global", "dsh-memento", text),
            "workspaceKey": "", "agentKey": "coder", "tags": ["fmt"], "requestId": "r-1", "origin": RAW_ORIGIN,
        }
        await ok(raw, "memory/replace", {"input": {**UG, "match": "spaces", "text": "Prefers spaces, width 4"},
                                         "write": write_ctx()}, 3.5)
        assert rec.last()["tags"] == ["fmt"] and rec.last()["requestId"] == 3.5

        # consolidate: the merged entry's keys (private, since one target is private)
        await ok(raw, "memory/consolidate", {"input": {**UG, "matches": ["width", "tea"], "text": "merged",
                                                       "tags": ["m"]}, "write": write_ctx()}, "c-1")
        text = "remove: width\nPrefers spaces, width 4\nremove: tea\nlikes tea\nnew text: merged"
        assert rec.last() == {
            "action": "consolidate", **UG, "text": text, "source": "dsh-memento", "sessionId": "s-1",
            "reason": reason("consolidate", "user/user-global", "dsh-memento", text),
            "workspaceKey": "", "agentKey": "coder", "tags": ["m"], "requestId": "c-1", "origin": RAW_ORIGIN,
        }

        # remove: the target's keys and tags, also when it is in another agent's shared layer
        await ok(raw, "memory/add", {"input": entry_input("shared fact", "agent", "workspace", agentKey="",
                                                          tags=["x"], source="claude"),
                                     "write": write_ctx()}, "add-c")
        await ok(raw, "memory/remove", {"input": {"track": "agent", "scope": "workspace", "match": "shared"},
                                        "write": write_ctx(agent="reviewer")}, "rm-1")
        assert rec.last() == {
            "action": "remove", "track": "agent", "scope": "workspace", "text": "shared fact", "source": "claude",
            "sessionId": "s-1", "reason": reason("remove", "agent/workspace", "claude", "shared fact"),
            "workspaceKey": "/home/u/proj", "agentKey": "", "tags": ["x"], "requestId": "rm-1", "origin": RAW_ORIGIN,
        }


async def test_seed_and_import_carry_every_entry(ask_daemon: Any) -> None:
    async with recording(ask_daemon.socket_path) as (raw, rec):
        inputs = [entry_input("a", tags=["t1"]), entry_input("b", "agent", "workspace"),
                  entry_input("c", "agent", "user-global", agentKey="")]
        await ok(raw, "memory/seed", {"inputs": inputs, "write": write_ctx()}, "seed-1")
        text = "user/user-global: a\nagent/workspace: b\nagent/user-global: c"
        assert rec.last() == {
            "action": "seed", "track": "batch", "scope": "batch", "text": text, "source": "dsh-memento",
            "sessionId": "s-1", "reason": reason("seed", "batch/batch", "dsh-memento", text, 3), "count": 3,
            "entries": [
                {**UG, "workspaceKey": "", "agentKey": "coder", "text": "a", "tags": ["t1"], "source": "dsh-memento"},
                {"track": "agent", "scope": "workspace", "workspaceKey": "/home/u/proj", "agentKey": "coder",
                 "text": "b", "tags": [], "source": "dsh-memento"},
                {"track": "agent", "scope": "user-global", "workspaceKey": "", "agentKey": "", "text": "c", "tags": [],
                 "source": "dsh-memento"},
            ],
            "requestId": "seed-1", "origin": RAW_ORIGIN,
        }

        # An import restores the keys its envelope names, and shows them.
        env = {"plugin": "dsh-memento", "schema": "memory-export-v1", "entries": [
            {"track": "agent", "scope": "workspace", "workspaceKey": "/srv/other", "agentKey": "ops",
             "text": "deploy with make ship", "tags": ["deploy"], "source": "claude"},
            {"track": "user", "scope": "user-global", "workspaceKey": "", "agentKey": "", "text": "likes tea"},
        ]}
        await ok(raw, "memory/import", {"envelope": env, "write": write_ctx()}, 77)
        text = "agent/workspace: deploy with make ship\nuser/user-global: likes tea"
        # a batch of several sources names each of them
        assert rec.last() == {
            "action": "seed", "track": "batch", "scope": "batch", "text": text, "source": "claude, dsh-memento",
            "sessionId": "s-1", "reason": reason("seed", "batch/batch", "claude, dsh-memento", text, 2), "count": 2,
            "entries": [
                {"track": "agent", "scope": "workspace", "workspaceKey": "/srv/other", "agentKey": "ops",
                 "text": "deploy with make ship", "tags": ["deploy"], "source": "claude"},
                {**UG, "workspaceKey": "", "agentKey": "", "text": "likes tea", "tags": [], "source": "dsh-memento"},
            ],
            "requestId": 77, "origin": RAW_ORIGIN,
        }


async def test_proposal_approve_carries_the_proposals_keys(ask_daemon: Any) -> None:
    async with recording(ask_daemon.socket_path) as (raw, rec):
        session = {"id": "p-1", "header": {"cwd": "/home/u/other", "agentPreset": "planner"}}
        p = await raw.ok("proposals/create", {"input": {"kind": "lesson", "track": "agent", "scope": "workspace",
                                                        "text": "run tests with pytest -q"}, "session": session})
        await ok(raw, "proposals/approve", {"id": p["id"], "write": write_ctx()}, "pa-1")
        assert rec.last() == {
            "action": "add", "track": "agent", "scope": "workspace", "text": "run tests with pytest -q",
            "source": "proposal", "sessionId": "s-1",
            "reason": reason("add", "agent/workspace", "proposal", "run tests with pytest -q"),
            "workspaceKey": "/home/u/other", "agentKey": "planner", "tags": [], "requestId": "pa-1",
            "origin": RAW_ORIGIN,
        }


async def test_batch_items_each_carry_their_own_id(ask_daemon: Any) -> None:
    async with recording(ask_daemon.socket_path) as (raw, rec):
        batch = [{"jsonrpc": "2.0", "id": id_, "method": "memory/add",
                  "params": {"input": entry_input(text), "write": write_ctx()}}
                 for id_, text in (("b-1", "first"), (1002, "second"))]
        await raw.send_line(json.dumps(batch).encode())
        replies = await raw.batch_reply()
        assert sorted(str(r["id"]) for r in replies if "result" in r) == ["1002", "b-1"]
        assert sorted((a["text"], a["requestId"]) for a in rec.asked) == [("first", "b-1"), ("second", 1002)]


async def test_a_write_sent_as_a_notification_has_no_request_id(ask_daemon: Any) -> None:
    async with recording(ask_daemon.socket_path) as (raw, rec):
        await raw.send_line(json.dumps({"jsonrpc": "2.0", "method": "memory/add",
                                        "params": {"input": entry_input("no id"), "write": write_ctx()}}).encode())
        added = await raw.notification("memory/added")
        assert added["params"]["entry"]["text"] == "no id"
        assert "requestId" not in rec.asked[0] and rec.asked[0]["origin"] == RAW_ORIGIN


async def test_approvers_see_the_origin_but_no_request_id(ask_any_daemon: Any) -> None:
    path = ask_any_daemon.socket_path
    async with socket_client(path, initialize=False) as bot, socket_client(path, foreign=True) as human:
        await bot.ok("initialize", {"client": {"name": "headless-bot", "version": "9.1"},
                                    "capabilities": {"approvals": False}})
        rec = Recorder()
        human.on_approval = rec
        await human.ok("approval/subscribe", {})
        await ok(bot, "memory/add", {"input": entry_input("from the bot", tags=["b"]), "write": write_ctx("bot")},
                 "bot-1")
        assert rec.last() == {
            "action": "add", **UG, "text": "from the bot", "source": "dsh-memento", "sessionId": "bot",
            "reason": reason("add", "user/user-global", "dsh-memento", "from the bot"),
            "workspaceKey": "", "agentKey": "coder", "tags": ["b"],
            "origin": {"name": "headless-bot", "version": "9.1", **ME},
        }


async def test_origin_without_initialize_is_the_peer_process_only(ask_daemon: Any) -> None:
    async with socket_client(ask_daemon.socket_path, initialize=False) as raw:
        rec = Recorder("rejected")
        raw.on_approval = rec
        before = await state(raw)
        reply = await raw.call("memory/add", {"input": entry_input("x"), "write": write_ctx()}, id_="w")
        assert reply["error"]["data"]["code"] == "WRITE_DENIED"
        assert rec.asked[0]["origin"] == ME and rec.asked[0]["requestId"] == "w"
        entries, budgets, writes = await state(raw)
        assert (entries, budgets, writes) == (before[0], before[1], before[2] + 1)  # the add-denied row only


async def test_stdio_origin_is_the_parent_process(tmp_path: Path) -> None:
    async with stdio_client(tmp_path / "s.db", "--write-policy", "ask") as raw:
        rec = Recorder()
        raw.on_approval = rec
        await ok(raw, "memory/add", {"input": entry_input("via stdio"), "write": write_ctx()}, "s-1")
        assert rec.asked[0]["origin"] == RAW_ORIGIN and rec.asked[0]["requestId"] == "s-1"


async def test_through_the_relay_the_origin_is_the_harness_not_the_relay(ask_daemon: Any) -> None:
    """The relay only copies the harness's lines: the human is shown the harness process
    (the relay's parent, this test), with the client name the harness sent."""
    async with relay_client(ask_daemon.socket_path) as raw:
        rec = Recorder()
        raw.on_approval = rec
        await ok(raw, "memory/add", {"input": entry_input("via the relay"), "write": write_ctx()}, "r-1")
        assert raw.process.pid != os.getpid()
        assert rec.asked[0]["origin"] == RAW_ORIGIN and rec.asked[0]["requestId"] == "r-1"
