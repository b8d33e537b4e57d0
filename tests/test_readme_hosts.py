"""The README's host configurations (fenced blocks marked ``mcp-host``): each parses as its
host reads it (a ``claude mcp add`` command line, Codex's TOML, the JSON of Cursor, VS Code
and Gemini CLI), and the command it names, started as the host starts it (in the project
directory, ``memoryd`` found on PATH), answers ``tools/list`` through the shared daemon."""

from __future__ import annotations

import json
import os
import shlex
import sys
import tomllib
import warnings
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters
from mcp_support import HOST, mcp_daemon
from memoryd_protocol.mcp_tools import TOOLS
from test_readme import ROOT, blocks

pytestmark = pytest.mark.anyio

HOSTS = [b for b in blocks((ROOT / "README.md").read_text(encoding="utf-8"), "README.md") if "mcp-host" in b.info]


def command_of(lang: str, body: str, workspace: str) -> list[str]:
    """The command and arguments a host would spawn for the ``memoryd`` server."""
    if lang == "sh":
        words = shlex.split(body)
        assert words[:2] == ["claude", "mcp"] and "--" in words, body
        return words[words.index("--") + 1:]
    if lang == "toml":
        server = tomllib.loads(body)["mcp_servers"]["memoryd"]
    else:
        doc = json.loads(body)
        server = (doc.get("mcpServers") or doc["servers"])["memoryd"]
        assert server.get("type", "stdio") == "stdio"
    args = [a.replace("${workspaceFolder}", workspace) for a in server.get("args", [])]
    return [server["command"], *args]


def test_the_readme_configures_each_host() -> None:
    assert [b.lang for b in HOSTS] == ["sh", "toml", "json", "json", "json"]


@pytest.mark.parametrize("block", HOSTS, ids=[f"line{b.line}" for b in HOSTS])
async def test_a_host_snippet_starts_memoryd_mcp_and_lists_the_tools(
        block: Any, tmp_path: Path, sock_dir: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    command = command_of(block.lang, block.body, str(project))
    assert command[:2] == ["memoryd", "mcp"], command
    bin_dir = str(Path(sys.executable).parent)  # the venv's, where memoryd is installed
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    async with mcp_daemon(tmp_path, sock_dir) as d:
        env["MEMORYD_SOCKET"] = str(d.daemon.config.socket_path)
        server = StdioServerParameters(command=command[0], args=command[1:], env=env, cwd=project)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            async with Client(server, mode="legacy", client_info=HOST) as c:
                assert [t.name for t in (await c.list_tools()).tools] == [t.name for t in TOOLS]
                r = await c.call_tool("memory_add", {"track": "user", "scope": "workspace", "text": "Prefers tabs"})
        assert r.structured_content is not None
        assert r.structured_content["entry"]["workspaceKey"] == str(project)
