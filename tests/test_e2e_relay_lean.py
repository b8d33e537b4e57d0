"""The relay's lean start (strings for paths, no config loaded, leanjson for the probe's
answer, a _thread for stdin) does what the full path does, and imports none of what it
was made lean of."""

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
from hypothesis import given
from hypothesis import strategies as st
from memoryd import cli, relay

LIST = b'{"jsonrpc":"2.0","id":1,"method":"memory/list"}\n'


def test_the_probe_is_the_one_json_dumps_wrote() -> None:
    probe = {"jsonrpc": "2.0", "id": relay.PROBE_ID, "method": "daemon/status", "params": {}}
    assert relay.PROBE == json.dumps(probe).encode() + b"\n"


def full_path(argv: list[str]) -> tuple[str, str | None, list[str]]:
    """What the parser's path hands relay.run for ``argv``."""
    args = cli.quick_args(argv)
    assert args is not None
    config_path, cfg = cli.serve_config(args)
    explicit_db = cfg.db_path if (args.db is not None or cfg.db_path_configured) else None
    return str(cfg.socket_path), None if explicit_db is None else str(explicit_db), cli._forwarded(args, config_path)


@pytest.mark.parametrize("socket_env", [None, "/run/x/memoryd.sock", "rel/m.sock", "/run//x/./m.sock/"])
@pytest.mark.parametrize("argv", [
    ["serve", "--stdio"],
    ["serve", "--stdio", "--socket", "/tmp/s/m.sock", "--db", "/tmp/d/m.db", "--log-level", "warning"],
    ["serve", "--stdio", "--socket=rel/m.sock", "--db=rel.db", "--write-policy", "auto"],
    ["serve", "--stdio", "--socket", "~/s//m.sock/", "--db", "~/d/./m.db", "--write-policy=off", "--log-level=debug"],
    ["serve", "--stdio", "--db", "/a//b/c.db", "--socket", "/x/./y.sock", "--db", "//two/leading.db"],
    ["serve", "--stdio", "--db", "../up/m.db", "--socket", "/"],
])
def test_a_lean_relay_start_gets_what_the_full_path_gets(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                       argv: list[str], socket_env: str | None) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "no-config-here"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    monkeypatch.chdir(tmp_path)
    if socket_env is None:
        monkeypatch.delenv("MEMORYD_SOCKET", raising=False)
    else:
        monkeypatch.setenv("MEMORYD_SOCKET", socket_env)
    words = cli.quick_words(argv)
    assert words is not None
    assert cli._lean_relay(words) == full_path(argv)


def test_a_config_file_takes_the_full_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    argv = ["serve", "--stdio", "--socket", "/tmp/s/m.sock"]
    words = cli.quick_words(argv)
    assert words is not None and cli._lean_relay(words) is not None
    assert cli._lean_relay({**words, "config": "/etc/memoryd.toml"}) is None
    (tmp_path / "memoryd").mkdir()
    (tmp_path / "memoryd" / "config.toml").write_text('db_path = "/srv/m.db"\n')
    assert cli._lean_relay(words) is None
    assert full_path(argv)[1] == "/srv/m.db"  # which the config names, and the relay insists on


PATHISH = st.text(alphabet="/.~ab", max_size=12)


@given(PATHISH)
def test_path_strings_are_what_pathlib_prints(value: str) -> None:
    assert relay._as_path_str(value) == str(Path(value))
    normalized = str(Path(value))
    assert relay._parent(normalized) == str(Path(normalized).parent)


@pytest.mark.parametrize("value", [None, 3, ["/x"], {"p": "/x"}, True])
def test_a_served_path_that_is_no_string_is_refused_as_pathlib_refuses_it(value: Any) -> None:
    with pytest.raises(TypeError):
        Path(value)
    with pytest.raises(TypeError):
        relay._as_path_str(value)


def probe_answer(answer: bytes, db: str | None, write_policy: str | None = None) -> str | bytes:
    """check_store against a peer that answers ``answer``: its error, or the bytes after it."""
    ours, peer = socket.socketpair()
    with ours, peer:
        peer.sendall(answer)
        try:
            return relay.check_store(ours, "/x/memoryd.sock", db, write_policy)
        except relay.RelayError as exc:
            return str(exc)


def test_an_answer_leanjson_leaves_is_read_by_json(tmp_path: Path) -> None:
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


def test_the_lean_relay_imports_no_pathlib_json_re_or_threading(daemon_factory: Any, tmp_path: Path) -> None:
    """A plain relay command line to a running daemon, in a fresh interpreter: of what it
    was made lean of, nothing is imported (the console script pip writes imports re
    itself, which is why this runs memoryd.cli.main, not the script)."""
    d: Daemon = daemon_factory()
    argv = ["serve", "--stdio", "--socket", str(d.socket_path), "--db", str(d.db_path), "--log-level", "warning"]
    code = ("import sys, memoryd.cli as c\n"
            f"rc = c.main({argv!r})\n"
            "lean = ('pathlib', 'json', 're', 'threading', 'memoryd.config', 'memoryd.launch', 'argparse', 'typing',\n"
            "        'tempfile', 'urllib', 'importlib', 'subprocess', 'anyio', 'msgspec', 'sqlite3')\n"
            "print(rc, [m for m in lean if m in sys.modules], file=sys.stderr)\n")
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "none")}
    r = subprocess.run([sys.executable, "-c", code], input=LIST, capture_output=True, timeout=30, env=env)
    assert r.stderr.decode().strip().splitlines()[-1] == "0 []"
    assert json.loads(r.stdout)["id"] == 1


def test_memoryd_mcp_imports_neither_the_sdk_nor_what_the_relay_is_lean_of(daemon_factory: Any, tmp_path: Path) -> None:
    """The process an MCP host spawns is the relay: the SDK (and pydantic) is the daemon's."""
    d: Daemon = daemon_factory()
    argv = ["mcp", "--socket", str(d.socket_path), "--db", str(d.db_path), "--cwd", "/home/u/proj"]
    code = ("import sys, memoryd.cli as c\n"
            f"rc = c.main({argv!r})\n"
            "lean = ('mcp', 'mcp_types', 'pydantic', 'pathlib', 'json', 're', 'threading', 'memoryd.config',\n"
            "        'memoryd.launch', 'argparse', 'typing', 'anyio', 'msgspec', 'sqlite3')\n"
            "print(rc, [m for m in lean if m in sys.modules], file=sys.stderr)\n")
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "none")}
    r = subprocess.run([sys.executable, "-c", code], input=json.dumps(initialize).encode() + b"\n",
                       capture_output=True, timeout=60, env=env)
    assert r.stderr.decode().strip().splitlines()[-1] == "0 []"
    assert json.loads(r.stdout)["result"]["serverInfo"]["name"] == "memoryd"
