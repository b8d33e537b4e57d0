"""``approvers = "keyed"`` against a relay at the socket path, with a real daemon: an agent that
can write the runtime directory but cannot read the approver key renames memoryd's socket and
puts a relaying proxy (tests/relaying_proxy.py) at the old path. The approver key's proof
binds to the connection it proves: the challenge names the process the daemon sees on it (pid
and start time), and a client signs only a challenge that names itself. Through the proxy,
the daemon sees the proxy, so memoryctl approve and the Python client refuse to sign, the
proxy never holds a proven approver connection, and the agent's write is denied."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import memoryd_client as mc
import pytest
from e2e_helpers import sql
from memoryd_client import proof
from memoryd_client.errors import ApproverRelayed
from memoryd_client.proof import check_challenge, own_start
from memoryd_protocol.approval_types import ApprovalChallenge
from processes import HeadlessAdd
from rawclient import socket_client

# The keyed daemon and its key, as test_e2e_keyed makes them.
from test_e2e_keyed import config_home, key, keyed  # noqa: F401

pytestmark = pytest.mark.anyio

MEMORYCTL = [sys.executable, "-m", "memoryd_client"]
PYTHON = os.path.realpath(sys.executable)
PROXY = Path(__file__).with_name("relaying_proxy.py")


def relayed(sock: Path, proxy: int) -> str:
    """What a client says when the daemon's challenge names ``proxy``, not itself."""
    return (f"the daemon sees this connection as pid {proxy}, not as this process (pid {{me}}): another process "
            f"relays it (pid {proxy}, {PYTHON}, serves {sock}), so the approver key was not used; stop that "
            f"process and restart memoryd, so that {sock} is memoryd's own socket again, then retry")


def ledger(db: Path, kind: str) -> list[dict[str, Any]]:
    return [json.loads(body) for (body,) in sql(db, "SELECT body FROM memoryd_ledger WHERE kind = ? ORDER BY n", kind)]


def proc_start(pid: int) -> int:
    """Field 22 of /proc/<pid>/stat: the process's start time."""
    return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[19])


class Relay:
    """The proxy at the daemon's socket path, memoryd's socket renamed beside it."""

    def __init__(self, daemon: Any, start: str | None = None) -> None:
        self.path: Path = daemon.socket_path
        self.real = self.path.with_name("memoryd-renamed.sock")
        os.rename(self.path, self.real)
        self.proc = subprocess.Popen([sys.executable, str(PROXY), str(self.path), str(self.real),
                                      *([start] if start else [])], stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None and self.proc.stdout.readline() == "READY\n"
        self.pid = self.proc.pid

    def report(self) -> list[str]:
        """Everything the proxy reported, once it is stopped."""
        self.proc.kill()
        out, _ = self.proc.communicate(timeout=30)
        return out.splitlines()


@pytest.fixture
def relay(keyed: Any) -> Iterator[Relay]:  # noqa: F811
    r = Relay(keyed)
    try:
        yield r
    finally:
        if r.proc.poll() is None:
            r.report()


@pytest.fixture
def start_relay(keyed: Any) -> Iterator[Callable[[str], Relay]]:  # noqa: F811
    """A relay that changes the challenge's ``start`` (relaying_proxy.py's START)."""
    made: list[Relay] = []

    def make(start: str) -> Relay:
        made.append(Relay(keyed, start))
        return made[-1]

    try:
        yield make
    finally:
        for r in made:
            if r.proc.poll() is None:
                r.report()


def as_pid(pid: int, argv: list[str]) -> subprocess.Popen[str]:
    """``argv`` run in a pid namespace of its own (with its own /proc) as pid ``pid`` there: a
    client whose pid, as it sees it, is the relay's pid as memoryd sees it."""
    script = f'echo {pid - 1} > /proc/sys/kernel/ns_last_pid && "$@"; exit $?'
    return subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "sh", "-c", script, "sh",
                             *argv], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def approve_as(relay: Relay) -> subprocess.Popen[str]:
    """memoryctl approve through ``relay``, as a process with the relay's pid."""
    return as_pid(relay.pid, [*MEMORYCTL, "--socket", str(relay.path), "--no-autostart", "approve"])


needs_pid_namespaces = pytest.mark.skipif(os.geteuid() != 0, reason="makes a pid namespace and sets its next pid")


def no_approval_taken(daemon: Any, relay: Relay) -> list[str]:
    """The agent's write was denied for want of an approver, nothing was asked or decided,
    and the store holds no entry; what the relay reported."""
    report = relay.report()
    assert not [line for line in report if line.startswith(("asked", "decided"))]
    with mc.connect_sync(relay.real, timeout=30) as c:
        assert c.list() == []
        [row] = c.audit_list(10)
        assert row.action == "add-denied" and row.outcome is not None and row.outcome.startswith("unavailable")
    assert ledger(daemon.db_path, "asked") == [] and ledger(daemon.db_path, "decided") == []
    log = daemon.stderr()
    assert "proved the approver key" not in log and "decided allowed-once" not in log
    return report


@pytest.mark.process
@needs_pid_namespaces
def test_a_relay_that_strips_start_gets_no_proof_from_a_client_with_its_pid(
        keyed: Any, start_relay: Callable[[str], Relay]) -> None:  # noqa: F811
    """The relay removes the challenge's start, and the approver runs where its pid is the
    relay's (another pid namespace): the pid alone names it, so before, it proved the key for
    the relay's connection and the relay allowed the agent's write."""
    relay = start_relay("strip")
    approver = approve_as(relay)
    try:
        assert approver.stderr is not None
        said = approver.stderr.readline()  # its refusal, or (proven and subscribed) its banner
        writer = HeadlessAdd(relay.real, "agent-1", "Allowed by the relay")
        assert writer.result() == {"denied": "unavailable"}
        assert said == (f"error: APPROVER_RELAYED: the daemon's challenge names pid {relay.pid} without its start "
                        "time, so it may name another process than this one: another process relays this connection "
                        "and removed it, or memoryd is older than this client, so the approver key was not used; make "
                        f"sure {relay.path} is memoryd's own socket (restart memoryd to put it back), then retry\n")
        assert approver.wait(30) == 3
    finally:
        if approver.poll() is None:
            approver.kill()
        approver.communicate(timeout=30)
    report = no_approval_taken(keyed, relay)
    assert "challenge strip null" in report
    assert not [line for line in report if line.startswith(("client approval/subscribe", "client approval/prove"))]


@pytest.mark.process
@needs_pid_namespaces
def test_a_relay_that_puts_the_clients_start_in_gets_a_proof_the_daemon_refuses(
        keyed: Any, key: Path, start_relay: Callable[[str], Relay]) -> None:  # noqa: F811
    """The relay puts the approver's own start time into the challenge, so that pid and start
    both name the approver, which signs: the proof covers the start time, and memoryd checks
    it with the relay's, the process it sees on the connection."""
    relay = start_relay("client")
    relay_start = proc_start(relay.pid)
    approver = approve_as(relay)
    try:
        assert approver.stderr is not None
        said = approver.stderr.readline()
        writer = HeadlessAdd(relay.real, "agent-1", "Allowed by the relay")
        assert writer.result() == {"denied": "unavailable"}
        assert said == ("error: INVALID_INPUT: the proof does not answer this connection's challenge with the approver "
                        f"key {key}: make sure the program reads that key, then send approval/challenge "
                        "again\n")
        assert approver.wait(30) == 1
    finally:
        if approver.poll() is None:
            approver.kill()
        approver.communicate(timeout=30)
    report = no_approval_taken(keyed, relay)
    [line] = [line for line in report if line.startswith("challenge ")]
    assert line.startswith("challenge client ") and int(line.split()[2]) != relay_start
    assert "client approval/subscribe proof" in report
    assert "refused: the proof does not answer this connection's challenge" in keyed.stderr()


@pytest.mark.process
def test_memoryctl_approve_through_a_relay_refuses_to_sign_and_the_write_is_denied(keyed: Any,  # noqa: F811
                                                                                  relay: Relay) -> None:
    """The attack: memoryctl approve connects through the proxy. Before, it proved the key for
    the proxy's connection, and the proxy hid the agent's approval/asked and allowed it."""
    approver = subprocess.Popen([*MEMORYCTL, "--socket", str(relay.path), "--no-autostart", "approve"],
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
    try:
        assert approver.stderr is not None
        said = approver.stderr.readline()  # its refusal, or (proven and subscribed) its banner
        writer = HeadlessAdd(relay.real, "agent-1", "Allowed by the relay")
        assert writer.result() == {"denied": "unavailable"}
        assert said == "error: APPROVER_RELAYED: " + relayed(relay.path, relay.pid).format(me=approver.pid) + "\n"
        assert approver.wait(30) == 3
    finally:
        if approver.poll() is None:
            approver.kill()
        approver.communicate(timeout=30)
    report = relay.report()
    assert not [line for line in report if line.startswith(("client approval/subscribe", "client approval/prove"))]
    assert "client approval/challenge -" in report
    assert not [line for line in report if line.startswith(("asked", "decided"))]
    with mc.connect_sync(relay.real, timeout=30) as c:
        assert c.list() == []
        [row] = c.audit_list(10)
        assert row.action == "add-denied" and row.outcome is not None and row.outcome.startswith("unavailable")
    assert ledger(keyed.db_path, "asked") == [] and ledger(keyed.db_path, "decided") == []
    log = keyed.stderr()
    assert "proved the approver key" not in log and "decided allowed-once" not in log


async def test_the_python_client_through_a_relay_refuses_to_prove(keyed: Any, relay: Relay) -> None:  # noqa: F811
    """prove_approver_key through the proxy: the challenge names the proxy, so no proof is
    made; the proxy's connection is no approver."""
    async with mc.connect(relay.path, client_name="approver", timeout=30) as c:
        assert c.peer_pid == relay.pid
        with pytest.raises(ApproverRelayed) as info:
            await c.prove_approver_key(subscribe=True)
        assert info.value.message == relayed(relay.path, relay.pid).format(me=os.getpid())
        assert info.value.details == {"pid": relay.pid, "ownPid": os.getpid(), "socketPid": relay.pid}
        status = await c.status()
    assert [(conn.pid, conn.approver) for conn in status.connection_list] == [(relay.pid, False)]
    report = relay.report()
    assert "client approval/challenge -" in report
    assert not [line for line in report if line.startswith(("client approval/subscribe", "client approval/prove"))]
    assert "proved the approver key" not in keyed.stderr()


async def test_the_challenge_names_the_process_the_daemon_sees(keyed: Any) -> None:  # noqa: F811
    """Directly on memoryd's socket the challenge names this process, pid and start time, and
    the Python client proves the key."""
    async with socket_client(keyed.socket_path) as raw:
        ch = await raw.ok("approval/challenge", {})
        assert (ch["pid"], ch["start"]) == (os.getpid(), own_start())
    async with mc.connect(keyed.socket_path, timeout=30) as c:
        await c.prove_approver_key(subscribe=True)
        assert [conn.approver for conn in (await c.status()).connection_list] == [True]


@pytest.mark.process
def test_memoryctl_add_through_a_relay_sends_no_write(keyed: Any, relay: Relay) -> None:  # noqa: F811
    """memoryctl add --yes proves the key for its own prompt first: through the proxy it
    refuses, and sends neither a proof nor the write."""
    r = subprocess.Popen([*MEMORYCTL, "--socket", str(relay.path), "--no-autostart", "--yes", "add", "--track", "user",
                          "--scope", "user-global", "Through the relay"], stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    out, err = r.communicate(timeout=60)
    assert (r.returncode, out) == (3, "")
    assert err == "error: APPROVER_RELAYED: " + relayed(relay.path, relay.pid).format(me=r.pid) + "\n"
    report = relay.report()
    assert [line for line in report if line.startswith("client ")] == [
        "client initialize -", "client approval/challenge -"]
    with mc.connect_sync(relay.real, timeout=30) as c:
        assert c.list() == [] and c.audit_list(10) == []


# --- the client's rule, pure ----------------------------------------------------------------------


def challenge(pid: int, start: int | None) -> ApprovalChallenge:
    return ApprovalChallenge(nonce="00" * 32, connection="run/1", pid=pid, start=start)


def test_a_client_answers_only_a_challenge_naming_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    me, start = os.getpid(), own_start()
    assert start is not None
    assert check_challenge(challenge(me, start), Path("/run/m.sock"), 1) == start
    # this pid without a start time (a relay removed it, or an older daemon): maybe not this process
    with pytest.raises(ApproverRelayed) as info:
        check_challenge(challenge(me, None), Path("/run/m.sock"), 1)
    assert info.value.message == (
        f"the daemon's challenge names pid {me} without its start time, so it may name another process than this one: "
        "another process relays this connection and removed it, or memoryd is older than this client, so the "
        "approver key was not used; make sure /run/m.sock is memoryd's own socket (restart memoryd to put it back), "
        "then retry")
    assert info.value.details == {"pid": me, "ownPid": me, "socketPid": 1}
    # the same pid, another start time: not this process
    with pytest.raises(ApproverRelayed) as info:
        check_challenge(challenge(me, start + 1), Path("/run/m.sock"), None)
    assert info.value.message == (
        f"the daemon sees this connection as pid {me} started at clock tick {start + 1}, not as this process "
        f"(started at clock tick {start}): another process relays it, or this process runs in another pid namespace "
        "than memoryd, so the approver key was not used; run it where memoryd runs, and make sure /run/m.sock is "
        "memoryd's own socket (restart memoryd to put it back)")
    assert info.value.details == {"pid": me, "ownPid": me, "socketPid": None}
    with pytest.raises(ApproverRelayed) as info:
        check_challenge(challenge(me + 1, start), None, os.getppid())
    assert info.value.message.startswith(f"the daemon sees this connection as pid {me + 1}, not as this process "
                                         f"(pid {me}): another process relays it (pid {os.getppid()}, ")
    assert info.value.code == "APPROVER_RELAYED"
    # without its own start time (no /proc of its pid namespace) a client cannot tell: it refuses
    monkeypatch.setattr(proof, "own_start", lambda: None)
    with pytest.raises(ApproverRelayed) as info:
        check_challenge(challenge(me, start), Path("/run/m.sock"), 1)
    assert info.value.message == (
        "this process cannot read its own start time (/proc/self/stat), so it cannot tell whether the daemon's "
        "challenge names it, and the approver key was not used; run it where /proc shows its own pid namespace")
