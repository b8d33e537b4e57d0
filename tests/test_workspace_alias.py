"""Workspace aliases: one project at different paths on different machines is one workspace.
``[workspace_aliases]`` maps a path (and what lies under it) to a canonical path, applied
wherever a cwd becomes a key: a session's ``header.cwd``, a query's ``workspaceKey``,
``memoryd mcp --cwd``, memoryctl's ``--cwd``. Answers carry the canonical key. A bad table
is a start-up error naming it, and the daemon opens nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import memoryd_client as mc
import pytest
from e2e_helpers import Gate, arrived, entry_input, sql, start_held
from mcp import Client, StdioServerParameters
from memoryd_protocol.constants import EXPORT_PLUGIN, EXPORT_SCHEMA
from memoryd_protocol.errors import InvalidInput
from memoryd_protocol.text import alias_workspace, normalize_workspace_key
from memoryd_protocol.workspaces import MAX_WORKSPACE_ALIASES, AliasTableError, parse_aliases
from rawclient import socket_client, write_ctx
from test_cli_edit import MEMORYCTL, hermetic_env, sock

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures(hermetic_env.__name__)]

LAPTOP, DEVBOX = "/Users/me/proj", "/home/me/proj"
TABLE = f'[workspace_aliases]\n"{LAPTOP}" = "{DEVBOX}"\n"C:\\\\Users\\\\Me\\\\Proj" = "{DEVBOX}"\n'
WS = {"track": "user", "scope": "workspace"}
MEMORYD = str(Path(sys.executable).parent / "memoryd")


def aliased_daemon(daemon_factory: Any, tmp_path: Path, policy: str = "auto") -> Any:
    config = tmp_path / "aliases.toml"
    config.write_text(TABLE)
    return daemon_factory("--config", str(config), policy=policy)


# --- the table ------------------------------------------------------------------------------

def test_a_path_and_what_lies_under_it_map_to_the_canonical_path() -> None:
    aliases = parse_aliases({LAPTOP: DEVBOX, "/Users/me": "/home/me", "C:\\Users\\Me\\Proj": DEVBOX})
    assert dict(aliases) == {"c:/users/me/proj": DEVBOX, LAPTOP: DEVBOX, "/Users/me": "/home/me"}
    assert alias_workspace(LAPTOP, aliases) == DEVBOX
    assert alias_workspace(LAPTOP + "/api", aliases) == DEVBOX + "/api"  # the nearest alias above it
    assert alias_workspace("/Users/me/other", aliases) == "/home/me/other"
    assert alias_workspace("/Users/meg", aliases) == "/Users/meg"  # a prefix of the name is not a parent
    assert alias_workspace("c:/users/me/proj", aliases) == DEVBOX
    # without a table (a client, a test), a key is the path
    assert normalize_workspace_key(LAPTOP + "/", {}) == LAPTOP


def test_an_aliased_key_past_the_longest_key_is_refused() -> None:
    aliases = parse_aliases({"/a": "/" + "b" * 4000})
    with pytest.raises(InvalidInput, match="longer than 4096 characters once aliased"):
        alias_workspace("/a/" + "c" * 200, aliases)


BAD_TABLES = [
    pytest.param(f'"{LAPTOP}" = "{DEVBOX}"\n"{DEVBOX}" = "{LAPTOP}"\n',
                 f"config: [workspace_aliases] maps {LAPTOP} to {DEVBOX}, which the alias of {DEVBOX} maps again "
                 "(a chain or a loop); map every path straight to its final canonical path", id="loop"),
    pytest.param('"/a" = "/b"\n"/b" = "/c"\n',
                 "config: [workspace_aliases] maps /a to /b, which the alias of /b maps again (a chain or a loop); "
                 "map every path straight to its final canonical path", id="chain"),
    pytest.param('"/home" = "/home/me"\n',
                 "config: [workspace_aliases] maps /home to /home/me, which the alias of /home maps again (a chain "
                 "or a loop); map every path straight to its final canonical path", id="into-itself"),
    pytest.param(f'"me/proj" = "{DEVBOX}"\n',
                 "config: [workspace_aliases] path 'me/proj' must be an absolute path, got 'me/proj' (cwd must be an "
                 "absolute path)", id="relative-path"),
    pytest.param(f'"{LAPTOP}" = "proj"\n',
                 f"config: [workspace_aliases] '{LAPTOP}''s canonical path must be an absolute path, got 'proj' (cwd "
                 "must be an absolute path)", id="relative-canonical"),
    pytest.param(f'"{LAPTOP}" = 3\n',
                 f"config: [workspace_aliases] '{LAPTOP}''s canonical path must be a non-empty absolute path, got 3",
                 id="not-a-path"),
    pytest.param(f'"{LAPTOP}" = "{LAPTOP}/"\n',
                 f"config: [workspace_aliases] maps {LAPTOP} to itself; remove that entry", id="itself"),
    pytest.param(f'"{LAPTOP}" = "/x"\n"{LAPTOP}/" = "/y"\n',
                 f"config: [workspace_aliases] names {LAPTOP} twice (as '{LAPTOP}/' too); keep one", id="twice"),
    pytest.param("".join(f'"/m{i}" = "/p{i}"\n' for i in range(MAX_WORKSPACE_ALIASES + 1)),
                 f"config: [workspace_aliases] has {MAX_WORKSPACE_ALIASES + 1} entries, more than "
                 f"{MAX_WORKSPACE_ALIASES}: alias a common parent directory instead of each project", id="too-many"),
]


@pytest.mark.parametrize(("body", "message"), BAD_TABLES)
def test_a_bad_table_stops_the_daemon_at_start_naming_why(tmp_path: Path, body: str, message: str) -> None:
    config = tmp_path / "bad.toml"
    config.write_text("[workspace_aliases]\n" + body)
    db = tmp_path / "never.db"
    r = subprocess.run([sys.executable, "-m", "memoryd", "serve", "--config", str(config), "--db", str(db),
                        "--socket", str(tmp_path / "s.sock")], capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr.strip().splitlines()[-1].endswith(message), r.stderr
    assert not db.exists() and not (tmp_path / "s.sock").exists()


def test_the_bound_is_inclusive() -> None:
    table = {f"/m{i}": f"/p{i}" for i in range(MAX_WORKSPACE_ALIASES)}
    assert len(parse_aliases(table)) == MAX_WORKSPACE_ALIASES
    with pytest.raises(AliasTableError, match="more than"):
        parse_aliases({**table, "/one-more": "/p"})


def test_a_table_that_is_not_a_table_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text(f'workspace_aliases = "{LAPTOP}"\n')
    r = subprocess.run([sys.executable, "-m", "memoryd", "serve", "--config", str(config), "--db",
                        str(tmp_path / "never.db")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip().endswith('config: [workspace_aliases] must be a table of "path" = "canonical path"')


# --- every place a cwd becomes a key, against a real daemon --------------------------------------

async def test_a_session_s_cwd_and_a_query_s_workspace_key_are_aliased(daemon_factory: Any, tmp_path: Path) -> None:
    """Written from the laptop's path (and a Windows one), found from the dev box's; the
    approval and every answer show the canonical key, and so does the ledger."""
    d = aliased_daemon(daemon_factory, tmp_path, policy="ask")
    async with socket_client(d.socket_path) as laptop, socket_client(d.socket_path) as devbox:
        gate = Gate()
        laptop.on_approval = gate
        async with anyio.create_task_group() as tg:
            box = start_held(tg, laptop, "memory/add", {"input": entry_input("Uses tabs", **WS),
                                                        "write": write_ctx("s-laptop", LAPTOP + "/", "coder")})
            await arrived(gate)
            assert gate.asked[0]["workspaceKey"] == DEVBOX  # the human approves the key written
            await laptop.ok("approval/decided", {"id": gate.asked[0]["id"], "outcome": "allowed-once"})
        assert box["r"]["result"]["entry"]["workspaceKey"] == DEVBOX
        laptop.on_approval = allow
        sub = await laptop.ok("memory/add", {"input": entry_input("The api has its own lint", **WS),
                                             "write": write_ctx("s-laptop-api", LAPTOP + "/api", "coder")})
        assert sub["entry"]["workspaceKey"] == DEVBOX + "/api"
        win = await laptop.ok("memory/add", {"input": entry_input("Windows line endings", **WS),
                                             "write": write_ctx("s-win", "C:\\Users\\Me\\Proj", "coder")})
        assert win["entry"]["workspaceKey"] == DEVBOX
        # an explicit workspaceKey in the input is a cwd too: the laptop's path is the session's
        named = await laptop.ok("memory/add", {"input": entry_input("Named its workspace", **WS,
                                                                    workspaceKey=LAPTOP),
                                               "write": write_ctx("s-laptop", LAPTOP, "coder")})
        assert named["entry"]["workspaceKey"] == DEVBOX
        want = ["Uses tabs", "Windows line endings", "Named its workspace"]
        seen = await devbox.ok("memory/query", {"filter": WS, "opts": {"sessionId": "s-dev", "agentKey": "coder",
                                                                       "workspaceKey": DEVBOX}})
        assert sorted(e["text"] for e in seen["entries"]) == sorted(want)
        from_laptop = await devbox.ok("memory/query", {"filter": WS, "opts": {"agentKey": "coder",
                                                                              "workspaceKey": LAPTOP}})
        assert sorted(e["text"] for e in from_laptop["entries"]) == sorted(want)
        # a snapshot, and a proposal, of a session in the laptop's path: the dev box's workspace
        snap = await laptop.ok("memory/snapshot", {"session": {"id": "s-snap", "header": {"cwd": LAPTOP,
                                                                                        "agentPreset": "coder"}}})
        assert all(text in snap["text"] for text in want)
        proposed = await laptop.ok("proposals/create", {"session": {"id": "s-snap", "header": {"cwd": LAPTOP}},
                                                        "input": {**WS, "kind": "habit", "text": "Pairs on Mondays"}})
        assert proposed["workspaceKey"] == DEVBOX
        assert (await devbox.ok("audit/verify"))["ok"] is True
    # the ledger records the key written and approved; the laptop's path is not a key anywhere
    bodies = [body for (body,) in sql(d.db_path, "SELECT body FROM memoryd_ledger WHERE kind IN ('audit', 'asked')")]
    assert sum(f'"workspaceKey":"{DEVBOX}"' in b for b in bodies) == 6  # three adds, each asked
    assert sum(f'"workspaceKey":"{DEVBOX}/api"' in b for b in bodies) == 2
    assert not any(LAPTOP in b or "c:/users" in b for b in bodies)


async def allow(params: dict[str, Any]) -> str:
    return "allowed-once"


async def test_memoryd_mcp_s_cwd_is_aliased(daemon_factory: Any, tmp_path: Path) -> None:
    d = aliased_daemon(daemon_factory, tmp_path)
    laptop = StdioServerParameters(command=MEMORYD, args=["mcp", "--socket", str(d.socket_path), "--cwd", LAPTOP])
    async with Client(laptop, mode="legacy") as c:
        r = await c.call_tool("memory_add", {**WS, "text": "Deploys with make ship"})
        assert not r.is_error, r
        assert r.structured_content["entry"]["workspaceKey"] == DEVBOX  # type: ignore[index]
    devbox = StdioServerParameters(command=MEMORYD, args=["mcp", "--socket", str(d.socket_path), "--cwd", DEVBOX])
    async with Client(devbox, mode="legacy") as c:
        r = await c.call_tool("memory_query", {"text": "make ship"})
        assert [e["workspaceKey"] for e in r.structured_content["entries"]] == [DEVBOX]  # type: ignore[index]


def test_memoryctl_s_cwd_is_aliased(daemon_factory: Any, tmp_path: Path) -> None:
    d = aliased_daemon(daemon_factory, tmp_path)

    def ctl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*MEMORYCTL, *sock(d), *args], stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=60)

    r = ctl("--yes", "--cwd", LAPTOP, "add", "--track", "user", "--scope", "workspace", "Reviews in pairs")
    assert r.returncode == 0, r.stderr
    r = ctl("--json", "--cwd", DEVBOX, "query", "pairs")
    assert r.returncode == 0, r.stderr
    [entry] = json.loads(r.stdout)["entries"]
    assert (entry["text"], entry["workspaceKey"]) == ("Reviews in pairs", DEVBOX)
    with mc.connect_sync(d.socket_path, timeout=10) as c:
        assert [(e.text, e.workspace_key) for e in c.list()] == [("Reviews in pairs", DEVBOX)]


def test_memoryctl_s_own_choices_see_the_aliased_workspace(daemon_factory: Any, tmp_path: Path) -> None:
    """What memoryctl picks itself (share's entries of --cwd, an --id prefix) is chosen by the
    workspace the daemon maps --cwd to: memoryctl reads the same table from the config file."""
    d = aliased_daemon(daemon_factory, tmp_path)
    config = str(tmp_path / "aliases.toml")
    with mc.connect_sync(d.socket_path, timeout=10) as c:
        entry = c.add({**WS, "text": "Lints before pushing", "source": "claude-code"},
                      write=write_ctx("s-cc", DEVBOX, "claude-code")).entry

    def ctl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*MEMORYCTL, *sock(d), "--config", config, *args], stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=60)

    r = ctl("--yes", "--agent", "claude-code", "--cwd", LAPTOP, "share", "--scope", "workspace")
    assert r.returncode == 0, r.stderr
    with mc.connect_sync(d.socket_path, timeout=10) as c:
        [shared] = c.list()
    assert (shared.text, shared.workspace_key, shared.agent_key) == ("Lints before pushing", DEVBOX, "")
    assert r.stdout.splitlines()[0].startswith(f"shared {entry.id[:8]} as {shared.id[:8]} ")
    r = ctl("--yes", "--cwd", LAPTOP + "/", "remove", "--track", "user", "--scope", "workspace", "--id", shared.id[:6])
    assert r.returncode == 0, r.stderr
    with mc.connect_sync(d.socket_path, timeout=10) as c:
        assert c.list() == []


def test_memoryctl_names_a_bad_table_in_its_config(daemon_factory: Any, tmp_path: Path) -> None:
    d = daemon_factory()
    with mc.connect_sync(d.socket_path, timeout=10) as c:
        c.add({**WS, "text": "Stays"}, write=write_ctx("s-1", DEVBOX, "coder"))
        before = [mc.plain(e) for e in c.list()], c.audit_list(10_000)
    bad = tmp_path / "bad.toml"
    bad.write_text(f'[workspace_aliases]\n"{LAPTOP}" = "proj"\n')
    r = subprocess.run([*MEMORYCTL, *sock(d), "--config", str(bad), "--yes", "--cwd", DEVBOX, "remove", "--track",
                        "user", "--scope", "workspace", "--id", "abc"], stdin=subprocess.DEVNULL, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip() == (f"error: USAGE: the config file {bad}: [workspace_aliases] '{LAPTOP}''s canonical "
                                "path must be an absolute path, got 'proj' (cwd must be an absolute path); fix it "
                                "(memoryd refuses it too)")
    with mc.connect_sync(d.socket_path, timeout=10) as c:
        assert ([mc.plain(e) for e in c.list()], c.audit_list(10_000)) == before


async def test_an_import_from_the_other_machine_lands_in_the_canonical_workspace(
        daemon_factory: Any, tmp_path: Path) -> None:
    """An export of the laptop's store names the laptop's paths; imported on the dev box, each
    entry's workspaceKey is mapped by the table as a cwd is."""
    d = aliased_daemon(daemon_factory, tmp_path)
    async with socket_client(d.socket_path) as raw:
        r = await raw.ok("memory/import", {"envelope": {"plugin": EXPORT_PLUGIN, "schema": EXPORT_SCHEMA, "entries": [
            {**WS, "workspaceKey": LAPTOP + "/api", "text": "From the laptop", "source": "backup", "tags": []}]},
            "write": write_ctx("s-import", DEVBOX, "coder")})
        assert [e["workspaceKey"] for e in r["entries"]] == [DEVBOX + "/api"]


async def test_every_transport_maps_the_cwd(pair_factory: Any) -> None:
    """The daemon in this event loop (memory), a daemon process (socket) and a standalone
    stdio child: each daemon applies its own table to its own sessions."""
    async with pair_factory(config=TABLE) as raw:
        r = await raw.ok("memory/add", {"input": entry_input("Any transport", **WS),
                                        "write": write_ctx("s-1", LAPTOP + "/web", "coder")})
        assert r["entry"]["workspaceKey"] == DEVBOX + "/web"
