"""Remote sessions over SSH, through a real sshd on 127.0.0.1: a machine without the store
uses the daemon of the machine that has it by running ``memoryd mcp`` or ``memoryd serve
--stdio`` there, over ``ssh``; approvals are answered in-band (elicitation over the same
pipe) or by ``ssh -t … memoryctl approve``.

The sshd is Debian's ``openssh-server`` (tests/system_tools.py installs it), started here
with a host key and a user key made in tmp, key authentication only, and waited for by its
own ``Server listening`` line. The remote commands name the venv's ``memoryd`` by its
absolute path, as a user must: a command run over ssh gets the remote account's plain PATH.
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from e2e_helpers import Gate, arrived, entry_input, start_held, state
from hosts.screen import Screen
from mcp import Client, StdioServerParameters
from rawclient import Raw, _socket_lines, running, socket_client, write_ctx
from sshd_server import Sshd, running_sshd
from system_tools import require

pytestmark = pytest.mark.anyio

BIN = Path(sys.executable).parent
MEMORYD = str(BIN / "memoryd")
MEMORYCTL = str(BIN / "memoryctl")
#: memoryd's interpreter, as the kernel names the relay's executable
PYTHON = os.path.realpath(sys.executable)
PROJ = "/home/me/proj"
LAYER = {"track": "user", "scope": "workspace"}


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    tmp = tmp_path_factory.mktemp("sshd")
    runtime = remote_runtime(tmp)
    runtime.mkdir(mode=0o700)
    with running_sshd(tmp, (
            # a login's runtime directory, as pam_systemd gives one: the remote default socket
            f"SetEnv XDG_RUNTIME_DIR={runtime}"
            # the remote memoryd runs the code this test imports (a checkout on PYTHONPATH too)
            + (f" PYTHONPATH={os.environ['PYTHONPATH']}" if os.environ.get("PYTHONPATH") else "") + "\n")) as server:
        yield server


def remote_runtime(tmp: Path) -> Path:
    """The remote sessions' XDG_RUNTIME_DIR, where their default socket is: beside the keys."""
    return tmp / "run"


def _ppid(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2:].split()[1])


def _descends_from(pid: int | None, ancestor: int) -> bool:
    try:
        while pid is not None and pid > 1:
            if pid == ancestor:
                return True
            pid = _ppid(pid)
    except OSError:  # gone meanwhile: not a live descendant
        return False
    return False


def ledger_connections(db: Path) -> list[dict[str, Any]]:
    with sqlite3.connect(db) as conn:
        return [json.loads(body) for (body,) in
                conn.execute("SELECT body FROM memoryd_ledger WHERE kind = 'connection' ORDER BY n")]


def the_ssh_connection(status: dict[str, Any], sshd: Sshd) -> dict[str, Any]:
    """The one live connection whose process (for a relay: its harness) the sshd started."""
    [c] = [c for c in status["connectionList"] if _descends_from(c["pid"], sshd.proc.pid)]
    return c


# --- memoryd mcp over ssh: the MCP SDK's client ----------------------------------------------

class Elicitations:
    def __init__(self) -> None:
        self.asked: list[str] = []

    async def __call__(self, ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        self.asked.append(params.message)
        return types.ElicitResult(action="accept", content={})


async def test_an_mcp_host_reaches_the_daemon_through_ssh_and_approves_in_band(
        daemon_factory: Any, sshd: Sshd) -> None:
    """``ssh host memoryd mcp``: the tools, a write asked of the human through the host's
    elicitation over the same ssh pipe, and a query that finds it; the ledger records the
    relay and sshd (the kernel's facts) and the remote host's name (its claim)."""
    d = daemon_factory(policy="ask")
    host = Elicitations()
    remote = StdioServerParameters(command=require("ssh"), args=sshd.argv(
        MEMORYD, "mcp", "--socket", str(d.socket_path), "--db", str(d.db_path), "--cwd", PROJ)[1:])
    async with Client(remote, mode="legacy", elicitation_callback=host,
                      client_info=types.Implementation(name="laptop-host", version="7.1")) as c, \
            socket_client(d.socket_path) as raw:
        assert "memory_add" in [t.name for t in (await c.list_tools()).tools]
        r = await c.call_tool("memory_add", {**LAYER, "text": "Prefers tabs"})
        assert not r.is_error, r
        [message] = host.asked
        assert message.split("\n")[:2] == [f'add to user/workspace, shared by every agent, in workspace "{PROJ}":',
                                           "  + Prefers tabs"]
        found = await c.call_tool("memory_query", {"text": "tabs"})
        assert "Prefers tabs" in found.content[0].text  # type: ignore[union-attr]
        # while the session lives: the daemon shows it as sshd's session process, a
        # descendant of the sshd this test started, which memoryd's relay named as its parent
        shown = the_ssh_connection(await raw.ok("daemon/status"), sshd)
        assert (shown["transport"], shown["exe"]) == ("mcp", require("sshd"))
        assert shown["client"] == {"name": "laptop-host", "version": "7.1"}
        entry_id = r.structured_content["entry"]["id"]  # type: ignore[index]
        life = await raw.ok("audit/explain", {"target": entry_id})
        assert (await raw.ok("audit/verify"))["ok"] is True
    [event] = [ev for ev in life["events"] if ev.get("decision")]
    decision = event["decision"]
    assert (decision["outcome"], decision["by"]) == ("allowed-once", {"kind": "human", "name": "mcp-elicitation"})
    asked_by = event["askedBy"]
    # the relay's own facts (memoryd's interpreter), its harness the sshd process, as reported
    assert (asked_by["transport"], asked_by["exe"], asked_by["harness"]) == ("mcp", PYTHON,
                                                                             shown["pid"])
    assert asked_by["client"] == {"name": "laptop-host", "version": "7.1"}
    [row] = [c for c in ledger_connections(d.db_path) if c.get("transport") == "mcp"]
    assert (row["pid"], row["harness"], row["client"]) == (asked_by["pid"], shown["pid"],
                                                           {"name": "laptop-host", "version": "7.1"})


# --- memoryd serve --stdio over ssh: raw NDJSON ----------------------------------------------

class ssh_relay:
    """``ssh host memoryd serve --stdio …`` as a Raw client: the harness's side of the pipe."""

    def __init__(self, sshd: Sshd, *serve: str, approvals: bool = True, initialize: bool = True) -> None:
        self.argv = sshd.argv(MEMORYD, "serve", "--stdio", *serve)
        self.approvals, self.initialize = approvals, initialize

    async def __aenter__(self) -> Raw:
        self._proc = await anyio.open_process(self.argv)
        proc = self._proc
        assert proc.stdin is not None and proc.stdout is not None
        raw = Raw(proc.stdin.send, _socket_lines(proc.stdout))
        raw.process = proc
        self._running = running(raw, self.initialize, self.approvals)
        return await self._running.__aenter__()

    async def __aexit__(self, *exc: Any) -> None:
        try:
            await self._running.__aexit__(*exc)
        finally:
            assert self._proc.stdin is not None
            await self._proc.stdin.aclose()
            with anyio.fail_after(30):
                assert await self._proc.wait() == 0


async def test_a_harness_reaches_the_daemon_through_ssh_and_answers_its_approval_on_the_pipe(
        daemon_factory: Any, sshd: Sshd) -> None:
    """``ssh host memoryd serve --stdio``: raw NDJSON both ways, and ``approval/asked`` comes
    to the harness over the ssh pipe and its ``approval/decided`` goes back the same way."""
    d = daemon_factory(policy="ask")
    async with ssh_relay(sshd, "--socket", str(d.socket_path), "--db", str(d.db_path)) as harness:
        gate = Gate()
        harness.on_approval = gate
        async with anyio.create_task_group() as tg:
            box = start_held(tg, harness, "memory/add", {"input": entry_input("Prefers tabs", **LAYER),
                                                         "write": write_ctx("s-ssh", PROJ, "coder")})
            await arrived(gate)
            [asked] = gate.asked
            assert (asked["text"], asked["workspaceKey"], asked["sessionId"]) == ("Prefers tabs", PROJ, "s-ssh")
            # who asks, as approvers see it: the relay's harness, sshd's session process, and the
            # client's name (a claim)
            origin = asked["origin"]
            assert (origin["name"], origin["exe"]) == ("raw", require("sshd"))
            assert _descends_from(origin["pid"], sshd.proc.pid)
            await harness.ok("approval/decided", {"id": asked["id"], "outcome": "allowed-once",
                                                  "by": {"kind": "human", "name": "remote-harness"}})
        assert box["r"]["result"]["entry"]["text"] == "Prefers tabs"
        assert [e["text"] for e in await harness.ok("memory/list", {})] == ["Prefers tabs"]
        life = await harness.ok("audit/explain", {"target": box["r"]["result"]["entry"]["id"]})
    [event] = [ev for ev in life["events"] if ev.get("decision")]
    assert event["decision"]["by"] == {"kind": "human", "name": "remote-harness"}  # its claim, kept as one
    asked_by = event["askedBy"]
    assert (asked_by["transport"], asked_by["exe"]) == ("socket", PYTHON)
    assert asked_by["client"] == {"name": "raw", "version": "0"}


async def test_a_remote_client_cannot_claim_to_be_a_relay_for_another_process(daemon_factory: Any, sshd: Sshd) -> None:
    """The relay rule, over ssh: memoryd's relay says once, before any byte of the harness's,
    that it relays for its parent (sshd's session process), and the daemon believes it only
    because the kernel bears it out. What the remote client sends after is the client's: a
    second relay claim (naming this test's process, an approver's say) is refused, the
    connection stays shown as sshd's, and nothing is written: the store and its ledger are
    as they were."""
    d = daemon_factory(policy="ask")
    async with socket_client(d.socket_path) as raw:
        before = await state(raw)
        async with ssh_relay(sshd, "--socket", str(d.socket_path), initialize=False) as remote:
            refused = await remote.fail("initialize", {"relay": {"harnessPid": os.getpid()},
                                                       "client": {"name": "claims-to-be-local"}})
            assert (refused.code, refused.details) == ("INVALID_INPUT", {"field": "relay"})
            assert refused.error["data"]["message"] == ("this connection is not memoryd's stdio relay: this "
                                                        "connection has declared its relay already")
            shown = the_ssh_connection(await raw.ok("daemon/status"), sshd)
            assert (shown["transport"], shown["exe"]) == ("socket", require("sshd"))
        assert await state(raw) == before
    assert "said it is memoryd's stdio relay and is taken for what the kernel says it is: this connection has " \
           "declared its relay already" in d.stderr()


# --- ssh -t memoryctl approve -------------------------------------------------------------------

def test_ssh_t_memoryctl_approve_answers_a_pending_write(daemon_factory: Any, sshd: Sshd, tmp_path: Path) -> None:
    """A headless agent's write waits for an approver; ``ssh -t host memoryctl approve`` in
    a real terminal (tmux) subscribes, since sshd's pty is its controlling terminal, shows
    the complete change and takes the human's y. The decision row records that process as
    the kernel showed it: memoryd's interpreter on a pty, under the sshd this test started."""
    d = daemon_factory(policy="ask")
    argv = sshd.argv(MEMORYCTL, "--socket", str(d.socket_path), "--no-autostart", "approve", tty=True)
    env = {"TERM": "xterm", "HOME": os.environ.get("HOME", "/"), "PATH": os.environ["PATH"], "LANG": "C.UTF-8"}

    async def agent_writes(screen: Screen) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        async with socket_client(d.socket_path, approvals=False, foreign=True) as agent, \
                socket_client(d.socket_path) as raw:
            async with anyio.create_task_group() as tg:
                box = start_held(tg, agent, "memory/add", {"input": entry_input("Ships on Fridays", **LAYER),
                                                           "write": write_ctx("s-agent", PROJ, "coder")})
                shown = await anyio.to_thread.run_sync(lambda: screen.wait_for(
                    lambda text: "Approve? [y/N]" in text, what="the approval prompt"))
                assert "+ Ships on Fridays" in shown and f'in workspace "{PROJ}"' in shown
                screen.type("y")
                screen.send("Enter")
            approver = the_ssh_connection(await raw.ok("daemon/status"), sshd)
            assert (approver["transport"], approver["approver"], approver["exe"]) == ("socket", True, PYTHON)
            life = await raw.ok("audit/explain", {"target": box["r"]["result"]["entry"]["id"]})
        return box["r"]["result"], approver, life

    with Screen(argv, cwd=tmp_path, env=env) as screen:
        screen.wait_for(lambda text: "memoryctl: approving writes for memoryd at" in text, what="memoryctl subscribed")
        result, approver, life = anyio.run(agent_writes, screen)
        screen.wait_for(lambda text: "approved" in text.split("Approve? [y/N]")[-1], what="the decision echoed")
    assert result["entry"]["text"] == "Ships on Fridays"
    [event] = [ev for ev in life["events"] if ev.get("decision")]
    decision = event["decision"]
    assert (decision["outcome"], decision["by"]["kind"]) == ("allowed-once", "human")
    decider = decision["decider"]
    assert (decider["pid"], decider["exe"]) == (approver["pid"], PYTHON) and decider["tty"].startswith("pts/")


async def test_the_remote_relay_finds_the_daemon_by_the_store_s_owner_record(daemon_factory: Any, sshd: Sshd) -> None:
    """Without ``--socket``: no daemon answers the remote session's default socket (its
    XDG_RUNTIME_DIR is not the daemon's), so memoryd's relay reads the store's owner record
    and attaches to the daemon that serves it; it starts no second one."""
    d = daemon_factory()
    async with ssh_relay(sshd, "--db", str(d.db_path)) as remote:
        added = await remote.ok("memory/add", {"input": entry_input("Found by its owner record", **LAYER),
                                               "write": write_ctx("s-ssh", PROJ, "coder")})
        status = await remote.ok("daemon/status")
    assert (status["pid"], status["socket"]) == (d.proc.pid, str(d.socket_path))
    assert added["entry"]["workspaceKey"] == PROJ
    assert list(remote_runtime(sshd.key.parent).iterdir()) == []  # nothing started or bound where it looked first


async def test_a_laptop_s_project_path_over_ssh_is_the_dev_box_s_workspace(
        daemon_factory: Any, sshd: Sshd, tmp_path: Path) -> None:
    """The host on the laptop names its own checkout (``--cwd /Users/me/proj``); the dev box's
    ``[workspace_aliases]`` makes it the dev box's project, whose memory a local session sees."""
    config = tmp_path / "aliases.toml"
    config.write_text(f'[workspace_aliases]\n"/Users/me/proj" = "{PROJ}"\n')
    d = daemon_factory("--config", str(config))
    remote = StdioServerParameters(command=require("ssh"), args=sshd.argv(
        MEMORYD, "mcp", "--socket", str(d.socket_path), "--cwd", "/Users/me/proj/api")[1:])
    async with Client(remote, mode="legacy") as c:
        r = await c.call_tool("memory_add", {**LAYER, "text": "The api deploys on Tuesdays"})
        assert not r.is_error, r
        assert r.structured_content["entry"]["workspaceKey"] == PROJ + "/api"  # type: ignore[index]
    async with socket_client(d.socket_path) as local:
        seen = await local.ok("memory/query", {"filter": LAYER, "opts": {"agentKey": "", "workspaceKey": PROJ + "/api"}})
    assert [e["text"] for e in seen["entries"]] == ["The api deploys on Tuesdays"]
