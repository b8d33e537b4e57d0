"""``memoryctl rpc``: raw NDJSON lines between stdin/stdout and a real daemon's socket."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.process

MEMORYCTL = [sys.executable, "-m", "memoryd_client"]
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocol": "dsh-memory-protocol/v1", "client": {"name": "sh", "version": "0"}, "capabilities": {"approvals": False}}}


def rpc(socket_path: Path | str, *lines: dict[str, Any] | str) -> subprocess.CompletedProcess[str]:
    text = "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines)
    return subprocess.run([*MEMORYCTL, "--socket", str(socket_path), "rpc"], input=text, capture_output=True,
                          text=True, timeout=60, start_new_session=True)


def test_every_line_sent_is_answered_before_it_exits(daemon: Any) -> None:
    add = {"jsonrpc": "2.0", "id": 2, "method": "memory/add", "params": {
        "input": {"track": "user", "scope": "user-global", "text": "Prefers tabs"},
        "write": {"agent": {"session": {"id": "s-1", "header": {"cwd": "/w", "agentPreset": "coder"}}}}}}
    done = rpc(daemon.socket_path, INIT, add, "not json", {"jsonrpc": "2.0", "id": 3, "method": "memory/list"})
    assert (done.returncode, done.stderr) == (0, "")
    replies = [json.loads(line) for line in done.stdout.splitlines()]
    by_id = {r.get("id"): r for r in replies if "method" not in r}
    assert by_id[1]["result"]["protocol"] == "dsh-memory-protocol/v1"
    assert by_id[2]["result"]["entry"]["text"] == "Prefers tabs"
    assert by_id[None]["error"]["code"] == -32700
    assert [e["text"] for e in by_id[3]["result"]] == ["Prefers tabs"]
    assert [r["method"] for r in replies if "method" in r] == ["memory/added"]


def test_without_a_daemon_it_says_how_to_start_one(tmp_path: Path) -> None:
    sock = tmp_path / "none.sock"
    done = rpc(sock, INIT)
    assert (done.returncode, done.stdout) == (3, "")
    assert done.stderr == (f"error: NO_DAEMON: no daemon answers on {sock} (No such file or directory): start one "
                           "with memoryd serve --detach, or name its socket with --socket\n")
