"""Memory text never reaches the daemon's log above debug, also through the MCP SDK's own
loggers (``mcp.server.*``, ``mcp.shared.*``), against a real daemon process at its default
level: the SDK logs a failing handler's exception, and that exception can carry the text."""

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
