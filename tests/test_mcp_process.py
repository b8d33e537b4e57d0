"""``memoryd mcp`` against real daemon processes: the relay autostarts the shared daemon
when none runs, both eras attach to it, and a daemon imports the MCP SDK only once an MCP
session arrives."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters
from mcp_support import HOST, INITIALIZE, PROJ
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


def _relay_env(tmp_path: Path, sock_dir: Path) -> dict[str, str]:
    """A host's trimmed environment: a runtime dir where no daemon listens, the data dir of
    the store a daemon already serves on another socket."""
    runtime = sock_dir / "rt"
    runtime.mkdir(mode=0o700)
    env = {k: v for k, v in os.environ.items() if k not in ("MEMORYD_SOCKET", "XDG_CONFIG_HOME")}
    return {**env, "XDG_RUNTIME_DIR": str(runtime), "XDG_DATA_HOME": str(tmp_path / "data"),
            "HOME": str(tmp_path)}


BUDGETS = b'{"jsonrpc":"2.0","id":1,"method":"memory/budgets"}\n'


async def test_a_relay_on_the_default_socket_finds_the_daemon_that_owns_the_store(
        tmp_path: Path, sock_dir: Path, daemon_factory: Any) -> None:
    db = tmp_path / "data" / "memoryd" / "memory.db"
    db.parent.mkdir(parents=True)
    daemon_factory(db=db)
    env = _relay_env(tmp_path, sock_dir)
    for command in (["mcp"], ["serve", "--stdio"]):
        line = json.dumps({**INITIALIZE, "id": 1}).encode() + b"\n" if command == ["mcp"] else BUDGETS
        result = await anyio.run_process([sys.executable, "-m", "memoryd", *command], input=line, env=env)
        assert b'"id":1' in result.stdout and b'"result"' in result.stdout, result.stderr
    assert not (sock_dir / "rt" / "memoryd" / "memoryd.sock").exists()  # no second daemon


async def test_a_chosen_socket_is_never_swapped_for_the_owner_s(
        tmp_path: Path, sock_dir: Path, daemon_factory: Any) -> None:
    db = tmp_path / "data" / "memoryd" / "memory.db"
    db.parent.mkdir(parents=True)
    d = daemon_factory(db=db)
    env = _relay_env(tmp_path, sock_dir)
    chosen = sock_dir / "chosen.sock"
    result = await anyio.run_process([sys.executable, "-m", "memoryd", "serve", "--stdio", "--socket", str(chosen)],
                                     input=BUDGETS, env=env, check=False)
    assert result.returncode == 1 and result.stdout == b""
    assert f"STORE_LOCKED: store {db} is owned by memoryd pid {d.proc.pid}, serving {d.socket_path}" in (
        result.stderr.decode())


def _record(db: Path, socket: Path, pid: int) -> None:
    db.with_name(db.name + ".memoryd-owner").write_text(json.dumps({"pid": pid, "socket": str(socket)}) + "\n")


async def test_an_owner_record_is_followed_only_to_the_daemon_of_that_store(
        tmp_path: Path, sock_dir: Path, daemon_factory: Any) -> None:
    default_db = tmp_path / "data" / "memoryd" / "memory.db"
    default_db.parent.mkdir(parents=True)
    other = daemon_factory(db=tmp_path / "other.db", name="other")
    env = _relay_env(tmp_path, sock_dir)
    # a record next to the default store naming a live daemon that serves another store
    _record(default_db, other.socket_path, other.proc.pid)
    result = await anyio.run_process([sys.executable, "-m", "memoryd", "serve", "--stdio"], input=BUDGETS, env=env,
                                     check=False)
    assert result.returncode == 1 and result.stdout == b""
    assert result.stderr.decode() == (
        f"memoryd: the daemon on {other.socket_path} serves the store {other.db_path}, not {default_db}; "
        f"give --socket of the daemon that serves {default_db}, or drop --db to use {other.db_path}\n")


async def test_a_stale_owner_record_is_not_followed(tmp_path: Path, sock_dir: Path, daemon_factory: Any) -> None:
    default_db = tmp_path / "data" / "memoryd" / "memory.db"
    default_db.parent.mkdir(parents=True)
    other = daemon_factory(db=default_db.with_name("elsewhere.db"), name="other")
    env = _relay_env(tmp_path, sock_dir)
    dead = await anyio.run_process([sys.executable, "-c", "import os; print(os.getpid())"])
    _record(default_db, other.socket_path, int(dead.stdout))  # left by a daemon that is gone
    result = await anyio.run_process([sys.executable, "-m", "memoryd", "serve", "--stdio"], input=BUDGETS, env=env)
    assert b'"result"' in result.stdout, result.stderr
    # the relay started a daemon of its own, for the default store, on the default socket
    own = sock_dir / "rt" / "memoryd" / "memoryd.sock"
    assert own.exists() and peer_pid(own) not in (None, other.proc.pid)


@pytest.mark.parametrize(("cwd", "said"), [
    ("${workspaceFolder}", "--cwd '${workspaceFolder}' holds ${workspaceFolder}, a variable your MCP host did not "
                           "expand; give the project's absolute path, or leave --cwd out"),
    ("/home/u/${workspaceFolderBasename}/x", "holds ${workspaceFolderBasename}, a variable your MCP host did not expand"),
    ("proj", "--cwd 'proj' is not an absolute path; give the project's absolute path, or leave --cwd out"),
])
def test_a_cwd_the_host_did_not_expand_or_a_relative_one_is_refused(tmp_path: Path, sock_dir: Path, cwd: str,
                                                                    said: str) -> None:
    """A host that does not expand ``${workspaceFolder}`` hands it on as it is: that would be
    a workspace named after the variable, so it is refused before any daemon is asked."""
    socket = sock_dir / "never.sock"
    r = subprocess.run([sys.executable, "-m", "memoryd", "mcp", "--socket", str(socket), "--db", str(tmp_path / "m.db"),
                        "--cwd", cwd], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr.startswith("memoryd: ") and said in r.stderr, r.stderr
    assert not socket.exists() and not (tmp_path / "m.db").exists()  # nothing started, nothing written
