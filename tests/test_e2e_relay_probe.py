"""The relay's probe: the store and write policy it checks, the answers it refuses, and that
the process an MCP host spawns (the relay) does not import the MCP SDK."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import Daemon
from memoryd import relay

LIST = b'{"jsonrpc":"2.0","id":1,"method":"memory/list"}\n'


def probe_answer(answer: bytes, db: str | None, write_policy: str | None = None) -> str | bytes:
    """check_store against a peer that answers ``answer``: its error, or the bytes after it."""
    ours, peer = socket.socketpair()
    with ours, peer:
        peer.sendall(answer)
        try:
            return relay.check_store(ours, "/x/memoryd.sock", db, write_policy)
        except relay.RelayError as exc:
            return str(exc)


def test_an_answer_with_escapes_and_nan_is_read(tmp_path: Path) -> None:
    served = tmp_path / "m\U0001f600.db"
    served.touch()
    escaped = json.dumps({"id": relay.PROBE_ID, "result": {"store": {"path": str(served)}}, "n": float("nan")})
    assert probe_answer(escaped.encode() + b"\nrest", str(served)) == b"rest"
    other = probe_answer(escaped.encode() + b"\n", str(tmp_path / "other.db"))
    assert other == (f"the daemon on /x/memoryd.sock serves the store {served}, not {tmp_path / 'other.db'}; "
                     f"give --socket of the daemon that serves {tmp_path / 'other.db'}, or drop --db to use {served}")


@pytest.mark.parametrize("answer", [
    b"[1]\n", b'{"result": {"store": {"path": 7}}}\n', b'{"result": "x"}\n', b"{\n", b'{"result": {"store": {}}}\n',
    b"\xff\xfe\n",
])
def test_an_answer_that_is_not_memoryds_is_one_line(answer: bytes) -> None:
    assert probe_answer(answer, None) == "the process on /x/memoryd.sock does not answer as memoryd does"


def test_a_served_path_is_named_as_pathlib_names_it() -> None:
    answer = b'{"result": {"store": {"path": "/srv//m/./x.db/"}, "writePolicy": "ask"}}\n'
    assert probe_answer(answer, "/srv/y.db").startswith(  # type: ignore[union-attr]
        "the daemon on /x/memoryd.sock serves the store /srv/m/x.db, not /srv/y.db;")
    assert probe_answer(answer, None, "auto") == (
        "the daemon on /x/memoryd.sock runs write policy 'ask', not 'auto'; "
        "the policy is the daemon's (its --write-policy or config), not the relay's")


def test_memoryd_mcp_does_not_import_the_sdk(daemon_factory: Any, tmp_path: Path) -> None:
    """The process an MCP host spawns is the relay: the SDK (and pydantic) is the daemon's."""
    d: Daemon = daemon_factory()
    argv = ["mcp", "--socket", str(d.socket_path), "--db", str(d.db_path), "--cwd", "/home/u/proj"]
    code = ("import sys, memoryd.cli as c\n"
            f"rc = c.main({argv!r})\n"
            "sdk = ('mcp', 'mcp_types', 'pydantic')\n"
            "print(rc, [m for m in sdk if m in sys.modules], file=sys.stderr)\n")
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "none")}
    r = subprocess.run([sys.executable, "-c", code], input=json.dumps(initialize).encode() + b"\n",
                       capture_output=True, timeout=60, env=env)
    assert r.stderr.decode().strip().splitlines()[-1] == "0 []"
    assert json.loads(r.stdout)["result"]["serverInfo"]["name"] == "memoryd"
