"""A host that closes its end with a subscription still open (``claude mcp list`` sends
``subscriptions/listen``, then exits) ends its session at once: nobody is left to cancel
the subscription, so the daemon does not wait for an answer it would never send."""

from __future__ import annotations

import json
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest
from memoryd.mcp_host.wire import EOF_ANSWER_S
from rawclient import socket_client

pytestmark = pytest.mark.anyio

META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "claude-code", "version": "2.1.332"},
        "io.modelcontextprotocol/clientCapabilities": {"elicitation": {"form": {}}}}
#: what Claude Code's health check sends, in its order
HEALTH_CHECK = [
    {"jsonrpc": "2.0", "id": "server-discover-probe-1", "method": "server/discover", "params": {"_meta": META}},
    {"jsonrpc": "2.0", "id": "listen:0", "method": "subscriptions/listen",
     "params": {"_meta": META, "notifications": {"toolsListChanged": True}}},
    {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": META}},
]


async def test_a_host_gone_with_a_subscription_open_leaves_no_connection(daemon: Any, tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "memoryd", "mcp", "--socket", str(daemon.socket_path), "--db", str(daemon.db_path),
            "--cwd", str(tmp_path)]
    lines = b"".join(json.dumps(m).encode() + b"\n" for m in HEALTH_CHECK)
    # the relay exits once the daemon closed the session: within a bound well short of the
    # daemon's wait for answers at EOF (which a subscription never gets)
    r = await anyio.to_thread.run_sync(partial(subprocess.run, argv, input=lines, capture_output=True,
                                               timeout=EOF_ANSWER_S / 2))
    assert r.returncode == 0, r.stderr
    replies = [json.loads(line) for line in r.stdout.splitlines()]
    answered = sorted(str(m["id"]) for m in replies if "id" in m and "result" in m)
    assert answered == ["1", "server-discover-probe-1"]  # what was read is still answered, in any order
    assert [m["method"] for m in replies if "method" in m] == ["notifications/subscriptions/acknowledged"]
    async with socket_client(daemon.socket_path) as raw:
        status = await raw.ok("daemon/status")
    assert status["connections"] == 1 and [c["transport"] for c in status["connectionList"]] == ["socket"]
