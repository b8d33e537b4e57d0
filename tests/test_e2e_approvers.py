"""Approvals a model cannot forge (issue #8, item 4), against the real daemon: a subscribed
approver is never asked about a write of its own process; under ``approvers =
"interactive"`` (the default) only a process with a controlling terminal subscribes; and
``approval/decided`` carries the client's claim of who decided (``by``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from e2e_helpers import Gate, arrived, entry_input, start_held, state
from memoryd.config import Config as DaemonConfig
from memoryd.config import ConfigError, apply
from memoryd.peers import PeerProcess, related
from rawclient import relay_client, socket_client, write_ctx

pytestmark = pytest.mark.anyio

NOT_INTERACTIVE = ('only a process with a controlling terminal can subscribe as an approver; '
                   'set approvers = "any" in the daemon\'s config to admit others')


async def asked_of(raw: Any) -> list[dict[str, Any]]:
    """The approval/asked this connection received so far (after a round trip, so any
    notification sent before it has arrived)."""
    await raw.ok("daemon/status", {})
    return [n for n in raw.notifications if n["method"] == "approval/asked"]


async def test_an_approver_is_never_asked_about_its_own_process(ask_any_daemon: Any) -> None:
    path = ask_any_daemon.socket_path
    async with socket_client(path, approvals=False) as agent, socket_client(path) as mine:
        own = Gate()
        mine.on_approval = own
        await mine.ok("approval/subscribe", {})
        before = await state(agent)
        # The only approver is this process, which also sent the write: nobody may decide it.
        err = await agent.fail("memory/add", {"input": entry_input("self-approved?"), "write": write_ctx("bot")})
        assert err.code == "WRITE_DENIED" and err.details == {"outcome": "unavailable"}
        assert await asked_of(mine) == []
        entries, budgets, writes = await state(agent)
        assert (entries, budgets, writes) == (before[0], before[1], before[2] + 1)  # the add-denied row only
        assert (await agent.ok("audit/list", {"limit": 1}))[0]["outcome"].startswith("unavailable")

        # Another process's approver is asked, and only it.
        async with socket_client(path, foreign=True) as other:
            theirs = Gate()
            other.on_approval = theirs
            await other.ok("approval/subscribe", {})
            async with anyio.create_task_group() as tg:
                box: dict[str, Any] = {}

                async def write() -> None:
                    box["r"] = await agent.call("memory/add", {"input": entry_input("approved elsewhere"),
                                                               "write": write_ctx("bot")})

                tg.start_soon(write)
                await arrived(theirs)
                await other.ok("approval/decided", {"id": theirs.asked[0]["id"], "outcome": "allowed-once"})
            assert box["r"]["result"]["entry"]["text"] == "approved elsewhere"
            assert await asked_of(mine) == []


async def test_through_the_relay_the_harness_is_the_process(ask_any_daemon: Any) -> None:
    """A write through the stdio relay belongs to the harness that spawned the relay (this
    test): an approver of this process is not asked about it either."""
    path = ask_any_daemon.socket_path
    async with socket_client(path) as mine, relay_client(path, approvals=False) as agent:
        own = Gate()
        mine.on_approval = own
        await mine.ok("approval/subscribe", {})
        before = await state(mine)
        err = await agent.fail("memory/add", {"input": entry_input("via the relay"), "write": write_ctx("bot")})
        assert err.details == {"outcome": "unavailable"}
        assert await asked_of(mine) == []
        assert (await state(mine))[:2] == before[:2]


SUBSCRIBE = (
    "import socket, sys\n"
    "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
    "s.connect(sys.argv[1])\n"
    "s.sendall(b'{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{}}\\n'\n"
    "          b'{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"approval/subscribe\"}\\n')\n"
    "f = s.makefile('rb')\n"
    "f.readline()\n"
    "sys.stdout.write(f.readline().decode())\n"
)


def subscribe_from_a_child(path: Path, *prefix: str, **kwargs: Any) -> dict[str, Any]:
    """approval/subscribe from a child process; its reply."""
    r = subprocess.run([*prefix, sys.executable, "-c", SUBSCRIBE, str(path)], capture_output=True, text=True,
                       timeout=30, **kwargs)
    assert r.returncode == 0, r.stderr
    reply: dict[str, Any] = json.loads(r.stdout)
    return reply


async def test_interactive_approvers_only_by_default(ask_daemon: Any) -> None:
    async with socket_client(ask_daemon.socket_path, approvals=False) as agent:
        before = await state(agent)
        # a process without a controlling terminal (a new session, stdin not a terminal)
        reply = subscribe_from_a_child(ask_daemon.socket_path, stdin=subprocess.DEVNULL, start_new_session=True)
        assert reply["error"]["data"]["code"] == "INVALID_INPUT"
        assert reply["error"]["message"] == NOT_INTERACTIVE
        assert await state(agent) == before
        # one with a controlling terminal subscribes
        import pty

        master, slave = pty.openpty()
        try:
            reply = subscribe_from_a_child(ask_daemon.socket_path, "setsid", "--ctty", stdin=slave)
        finally:
            os.close(master)
            os.close(slave)
        assert reply == {"jsonrpc": "2.0", "id": 2, "result": {}}
        # that approver has gone again: a headless write is unavailable, and only denied
        err = await agent.fail("memory/add", {"input": entry_input("nobody"), "write": write_ctx("bot")})
        assert err.details == {"outcome": "unavailable"}
        entries, budgets, writes = await state(agent)
        assert (entries, budgets, writes) == (before[0], before[1], before[2] + 1)


async def test_any_admits_approvers_without_a_terminal(ask_any_daemon: Any) -> None:
    reply = subscribe_from_a_child(ask_any_daemon.socket_path, stdin=subprocess.DEVNULL, start_new_session=True)
    assert reply == {"jsonrpc": "2.0", "id": 2, "result": {}}


async def test_a_connection_answering_its_own_approvals_needs_no_terminal(ask_daemon: Any) -> None:
    """The rule is about subscribed approvers only: a harness's own prompt works as before."""
    async with socket_client(ask_daemon.socket_path) as raw:
        gate = Gate()
        raw.on_approval = gate
        async with anyio.create_task_group() as tg:
            box = start_held(tg, raw, "memory/add", {"input": entry_input("own prompt"), "write": write_ctx()})
            await arrived(gate)
            await raw.ok("approval/decided", {"id": gate.asked[0]["id"], "outcome": "allowed-once",
                                              "by": {"kind": "human", "name": "alice"}})
        assert box["r"]["result"]["entry"]["text"] == "own prompt"
    log = ask_daemon.stderr()
    assert f"approval {gate.asked[0]['id']} decided allowed-once by connection " in log
    assert "(its own prompt, pid " in log and "; claims human 'alice')" in log


BAD_BY: list[tuple[Any, str]] = [
    ({"kind": "robot"}, "by.kind"),
    ({"name": "x"}, "by"),
    ({"kind": "human", "extra": 1}, "by"),
    ({"kind": "script", "name": ""}, "by.name"),
    ({"kind": "script", "name": "x" * 129}, "by.name"),
    ("human", "by"),
]


async def test_a_bad_by_is_invalid_input_and_decides_nothing(ask_daemon: Any) -> None:
    async with socket_client(ask_daemon.socket_path) as raw:
        gate = Gate()
        raw.on_approval = gate
        before = await state(raw)
        async with anyio.create_task_group() as tg:
            box = start_held(tg, raw, "memory/add", {"input": entry_input("decided once"), "write": write_ctx()})
            await arrived(gate)
            aid = gate.asked[0]["id"]
            for by, field in BAD_BY:
                err = await raw.fail("approval/decided", {"id": aid, "outcome": "allowed-once", "by": by})
                assert err.code == "INVALID_INPUT", by
                assert err.details == {"field": field}, (by, err.details)
            # a lone surrogate in the name
            await raw.send_line(json.dumps({"jsonrpc": "2.0", "id": "s", "method": "approval/decided", "params": {
                "id": aid, "outcome": "allowed-once", "by": {"kind": "human", "name": "\ud800"}}}).encode())
            reply = await raw.raw_reply()
            assert reply["error"]["data"]["code"] == "INVALID_INPUT"
            assert reply["error"]["data"]["details"] == {"field": "by.name"}
            # still pending: nothing was decided or written
            assert (await raw.ok("daemon/status", {}))["pendingApprovals"] == 1
            assert await state(raw) == before
            await raw.ok("approval/decided", {"id": aid, "outcome": "rejected", "by": {"kind": "policy"}})
        assert box["r"]["error"]["data"]["details"] == {"outcome": "rejected"}
        entries, budgets, writes = await state(raw)
        assert (entries, budgets, writes) == (before[0], before[1], before[2] + 1)
    assert "; claims policy)" in ask_daemon.stderr()


# --- pure rules ----------------------------------------------------------------------------


#: Prints its pid, then waits for EOF on stdin: a live process that is not ours to relate to
#: once its parent, which exits at once, has exited (the kernel reparents it then).
ORPHAN = ("import os, sys\n"
          "if os.fork():\n"
          "    os._exit(0)\n"
          "print(os.getpid(), flush=True)\n"
          "sys.stdin.read()\n")


def test_related_compares_the_shown_and_the_relay_pid_and_follows_the_parent_chain() -> None:
    me = PeerProcess.of(os.getpid())
    assert me is not None and me.via is None and me.exe == os.path.realpath(sys.executable)
    assert me.facts is not None and me.facts.pid == os.getpid() and me.facts.ppid == os.getppid()
    assert PeerProcess.of(0) is None
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    orphan = subprocess.Popen([sys.executable, "-c", ORPHAN], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        # The grandchild may print before its parent has exited, while it still is our
        # descendant: reaping the parent first makes sure it has been reparented.
        assert orphan.wait(30) == 0 and orphan.stdout is not None
        stranger = PeerProcess.of(int(orphan.stdout.readline()))
        kid = PeerProcess.of(child.pid)
        assert related(me, me)
        assert related(me, kid) and related(kid, me)  # an ancestor, a descendant
        assert not related(me, stranger) and not related(stranger, kid)
        # a relay's connection is its harness and the relay: either pid counts
        relay = PeerProcess(os.getpid(), via=child.pid)
        assert relay.pids() == {os.getpid(), child.pid}
        assert related(PeerProcess(child.pid), relay) and not related(stranger, relay)
        # unknown pids (another pid namespace): two unknowns may be one process; a known pid
        # is never an unknown one's
        assert related(None, None) and related(PeerProcess(None, uid=0), None)
        assert not related(None, me) and not related(stranger, None)
    finally:
        with child, orphan:  # closing their stdin ends both (and the orphan, which holds it too)
            pass


def test_has_terminal_reads_the_controlling_terminal() -> None:
    code = "import os; from memoryd.peers import has_terminal; print(has_terminal(os.getpid()))"
    import pty

    master, slave = pty.openpty()
    try:
        r = subprocess.run(["setsid", "--ctty", sys.executable, "-c", code], stdin=slave, capture_output=True,
                           text=True, timeout=30)
        assert r.stdout == "True\n", r.stderr
    finally:
        os.close(master)
        os.close(slave)
    r = subprocess.run([sys.executable, "-c", code], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=30, start_new_session=True)
    assert r.stdout == "False\n", r.stderr


def test_approvers_config_key() -> None:
    cfg = DaemonConfig()
    assert cfg.approvers == "interactive"
    apply(cfg, {"approvers": "any"})
    assert cfg.approvers == "any"
    for bad in ("all", True, ""):
        with pytest.raises(ConfigError, match="approvers must be interactive or any or keyed"):
            apply(DaemonConfig(), {"approvers": bad})


def test_a_bad_approvers_value_refuses_to_start(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text('approvers = "everyone"\n')
    r = subprocess.run([sys.executable, "-m", "memoryd", "serve", "--socket", str(tmp_path / "s.sock"), "--db",
                        str(tmp_path / "m.db"), "--config", str(cfg)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2
    assert "config: approvers must be interactive or any or keyed, got 'everyone'" in r.stderr
    assert not (tmp_path / "m.db").exists()
