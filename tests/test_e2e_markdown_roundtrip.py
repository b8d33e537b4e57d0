"""Markdown exports keep every layer: entries of three workspaces and two agents (and the
shared layer) come back through hermes-memory-md and claude-code-memory-md where they were,
against real daemon processes; a placement heading that names an invalid layer changes
nothing."""

from __future__ import annotations

from typing import Any

import memoryd_client as mc
import pytest
from e2e_helpers import state
from memoryd_protocol.constants import GRID
from rawclient import socket_client, write_ctx

pytestmark = pytest.mark.anyio

ADAPTERS = ["hermes-memory-md", "claude-code-memory-md"]
#: workspaces with a '#', spaces and parentheses, and non-ASCII; agents besides the shared ''
WORKSPACES = ["/home/u/proj", "/srv/repo #2 (beta)", "/home/ü/日本語 projekt"]
AGENTS = ["", "coder", "reviewer"]
#: where the import runs: a session of another workspace and no agent preset (memoryctl's default)
RESTORER = mc.make_session("restore-1", cwd="/home/u/elsewhere")


def layers() -> list[tuple[str, str, str, str, str]]:
    """(track, scope, workspaceKey, agentKey, text): every cell in every layer, in write order."""
    rows = []
    for track, scope in GRID:
        for workspace in WORKSPACES if scope == "workspace" else [""]:
            for agent in AGENTS:
                text = f"{track}/{scope} note for {workspace or 'everywhere'} by {agent or 'any agent'}"
                rows.append((track, scope, workspace, agent, text))
    # markdown-looking texts stay texts, in a layer of their own
    rows.append(("agent", "workspace", WORKSPACES[1], "coder", '## memoryd: agent "intruder"'))
    rows.append(("user", "user-global", "", "reviewer", "## user/workspace"))
    return rows


def recorder(asked: list[Any]) -> Any:
    """An approval handler that approves, keeping what it was asked."""

    def approve(params: Any) -> bool:
        asked.append(params)
        return True

    return approve


async def _allow(params: dict[str, Any]) -> str:
    return "allowed-once"


async def test_markdown_export_import_restores_every_workspace_and_agent(daemon_factory: Any) -> None:
    src = daemon_factory(name="src")
    written = layers()
    async with mc.connect(src.socket_path) as c:
        for n, (track, scope, workspace, agent, text) in enumerate(written):
            session = mc.make_session(f"writer-{n}", cwd=workspace or "/home/u/proj", agent_preset=agent)
            await c.add({"track": track, "scope": scope, "text": text}, write={"agent": {"session": session}})
        stored = sorted((e.track, e.scope, e.workspace_key, e.agent_key, e.text) for e in await c.list())
        documents = {adapter: await c.export(adapter) for adapter in ADAPTERS}
    assert stored == sorted(written)

    for adapter in ADAPTERS:
        asked: list[Any] = []
        dst = daemon_factory(name=f"dst-{adapter}", policy="ask")  # a fresh store
        async with mc.connect(dst.socket_path, session=RESTORER, on_approval=recorder(asked)) as c:
            result = await c.import_(adapter=adapter, payload=documents[adapter])
            assert result.added == len(written)
            back = await c.list()
            assert sorted((e.track, e.scope, e.workspace_key, e.agent_key, e.text) for e in back) == stored
            assert {(e.source, tuple(e.tags)) for e in back} == {(adapter, ())}
            assert await c.export(adapter) == documents[adapter]  # and it exports to the same document
        # the one approval showed every entry where it was about to land
        (ask,) = asked
        assert sorted((e.track, e.scope, e.workspace_key, e.agent_key, e.text) for e in ask.entries) == stored


async def test_invalid_placement_heading_is_refused_and_changes_nothing(ask_daemon: Any) -> None:
    async with socket_client(ask_daemon.socket_path) as raw:
        raw.on_approval = _allow
        await raw.ok("memory/add", {"input": {"track": "user", "scope": "user-global", "text": "Prefers tabs"},
                                    "write": write_ctx()})
        before = await state(raw)
        seen = len(raw.notifications)
        for adapter in ADAPTERS:
            for payload, line, says in [
                ('- kept out\n\n## memoryd: workspace "proj"\n## agent/workspace\n- x\n', 3,
                 "line 3: the placement heading's workspace is invalid (cwd must be an absolute path); correct it "
                 "or remove the heading"),
                ('## memoryd: agent "' + "x" * 257 + '"\n## user/user-global\n- x\n', 1,
                 "line 1: the placement heading's agent is invalid (agentPreset (agentKey) longer than 256 "
                 "characters); correct it or remove the heading"),
                ('## memoryd: workspace "/srv/never-seen"\n- x\n', 1,
                 "line 1: a placement heading must be followed directly by a '## <track>/<scope>' heading (such as "
                 "'## agent/workspace'); add one or remove the placement heading"),
            ]:
                err = await raw.fail("memory/import", {"adapter": adapter, "payload": payload,
                                                       "write": write_ctx("imp")})
                assert (err.code, err.details) == ("ADAPTER_PAYLOAD", {"adapterId": adapter, "line": line})
                assert err.error["message"] == f"{adapter}: {says}"
        assert [n for n in raw.notifications[seen:] if n["method"] == "approval/asked"] == []
        assert await state(raw) == before
