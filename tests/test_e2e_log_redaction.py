"""Memory text never reaches the daemon's log above debug, against a real daemon process at
its default level: not through the MCP SDK's own loggers (``mcp.server.*``,
``mcp.shared.*``), which log a failing handler's exception, nor through a traceback of
memoryd's own. The exception here is the one a row another program stored as bytes that are
not UTF-8 gives: Python's sqlite3 quotes the row's text in its message."""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
from e2e_helpers import sql
from mcp import Client, MCPError, StdioServerParameters
from mcp_support import HOST, PROJ
from rawclient import socket_client

pytestmark = [pytest.mark.anyio, pytest.mark.process]

SECRET = "Prefers tabs, and the staging password is hunter2"


def _params(d: Any) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=["-m", "memoryd", "mcp", "--socket", str(d.socket_path),
                                                               "--db", str(d.db_path), "--cwd", PROJ],
                                 env=dict(os.environ))


def plant_undecodable(db: Path, text: str) -> None:
    """Another program stores ``text`` with a byte that is not UTF-8 after it: SQLite keeps
    it, and Python's error reading it back quotes the whole text."""
    raw = (text.encode() + b"\x9f").hex()
    sql(db, "INSERT INTO entries (id, track, scope, workspace_key, text, source, created_at, updated_at, session_id, "
            f"agent_key, last_recalled, recall_count, tags, version) VALUES ('planted', 'user', 'user-global', '', "
            f"CAST(X'{raw}' AS TEXT), 'other', 5, 5, 's-m', '', NULL, 0, '[]', 1)")


#: each era's SDK line for the failed read, as the log shows it: the logger, the level and
#: the message, the exception's type in place of its text
LINES = {
    "legacy": "ERROR mcp.shared.jsonrpc_dispatcher: handler for '…' raised",
    "2026-07-28": "ERROR mcp.server.runner: modern request handler raised",
}


@pytest.mark.parametrize("mode", list(LINES))
async def test_an_sdk_log_record_carrying_memory_text_does_not_reach_the_log(daemon: Any, mode: str) -> None:
    plant_undecodable(daemon.db_path, SECRET)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        async with Client(_params(daemon), mode=mode, client_info=HOST) as c:  # type: ignore[arg-type]
            with pytest.raises(MCPError):
                await c.read_resource("memory://entries")
            # the session goes on: the failure was that one read's
            r = await c.call_tool("memory_budgets", {})
            assert isinstance(r, types.CallToolResult) and not r.is_error
    log = daemon.stderr()
    assert " INFO memoryd: memoryd ready (" in log  # memoryd's own lines pass as they are
    # the SDK's record was logged, without what it carried
    assert f"{LINES[mode]} (OperationalError; memoryd's debug log has the details)\n" in log
    assert "hunter2" not in log and "Prefers tabs" not in log


async def test_a_traceback_in_memoryd_s_own_log_keeps_its_frames_not_the_text(daemon: Any) -> None:
    plant_undecodable(daemon.db_path, SECRET)
    async with socket_client(daemon.socket_path) as raw:
        err = await raw.fail("memory/list")
        assert (err.code, err.error["message"]) == ("INTERNAL_ERROR", "Internal error")
        # the daemon goes on serving
        assert len(await raw.ok("memory/budgets")) == 4
    log = daemon.stderr()
    head, _, trace = log.partition(" ERROR memoryd.rpc: internal error in memory/list\nTraceback (most recent call last):\n")
    assert head and trace.startswith("  File ")  # the traceback's frames are there
    # and its last line, the exception, is its type alone
    ending = next(line for line in trace.splitlines() if not line.startswith(" "))
    assert ending == "sqlite3.OperationalError (its message withheld: memoryd's debug log has it)"
    assert "hunter2" not in log and "Prefers tabs" not in log
