"""``memoryd mcp`` against real daemon processes: the relay autostarts the shared daemon
when none runs, both eras attach to it, and a daemon imports the MCP SDK only once an MCP
session arrives."""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters
from mcp_support import HOST, PROJ
from processes import peer_pid

pytestmark = pytest.mark.anyio


def _params(socket: Path, db: Path) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=["-m", "memoryd", "mcp", "--socket", str(socket),
                                                               "--db", str(db), "--cwd", PROJ], env=dict(os.environ))


async def _tools(params: StdioServerParameters, mode: str) -> list[str]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        async with Client(params, mode=mode, client_info=HOST) as c:  # type: ignore[arg-type]
            return [t.name for t in (await c.list_tools()).tools]


def _maps_pydantic(pid: int) -> bool:
    return "pydantic_core" in Path(f"/proc/{pid}/maps").read_text()


async def test_memoryd_mcp_starts_the_shared_daemon_and_both_eras_attach(tmp_path: Path, sock_dir: Path) -> None:
    socket = sock_dir / "auto.sock"
    params = _params(socket, tmp_path / "m.db")
    assert await _tools(params, "legacy") == await _tools(params, "2026-07-28") == [
        "memory_query", "memory_budgets", "memory_add", "memory_replace", "memory_remove", "memory_consolidate",
        "memory_propose", "memory_list"]
    pid = peer_pid(socket)
    assert pid is not None  # the daemon it started serves on, for the next session (sock_dir stops it)
    assert _maps_pydantic(pid)


async def test_the_sdk_is_imported_by_the_first_mcp_session_only(daemon: Any) -> None:
    pid = daemon.proc.pid
    assert not _maps_pydantic(pid)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        async with Client(_params(daemon.socket_path, daemon.db_path), mode="legacy", client_info=HOST) as c:
            r = await c.call_tool("memory_add", {"track": "user", "scope": "workspace", "text": "Prefers tabs"})
            assert isinstance(r, types.CallToolResult) and not r.is_error
    assert _maps_pydantic(pid)
