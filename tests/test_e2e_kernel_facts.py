"""Approvals record what the daemon knows, and claims as claims, against a real daemon and
real processes: every decision row carries the deciding process as the kernel showed it
when the decision arrived (pid, start time, uid, exe, tty, session), and ``by`` only as the
client's claim; a connection whose process is gone cannot decide; a subscribed approver
never decides a write of its own process, an ancestor's or a descendant's; memoryd's stdio
relay is recognised by its executable and its word, not by its argv.

Each attack has its test: a headless writer's pty child subscribing as an "interactive"
approver, an approver's socket handed to the writer after its helper exited, and a process
that merely has ``memoryd serve --stdio`` in its argv. Each shows what the ledger keeps and
that nothing acknowledged was lost.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pty
import re
import shutil
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any
from unittest import mock

import anyio
import anyio.abc
import memoryd_client as mc
import pytest
from e2e_helpers import Gate, add, arrived, entry_input, start_held, state
from memoryd.approvals import KEY_NOT_PROVEN, Approvals, Pending, check_decider
from memoryd.config import Config
from memoryd.peers import PeerProcess, read_facts, tty_name
from memoryd_client import render
from memoryd_protocol import types as T
from memoryd_protocol.approval_types import ProcessFacts
from memoryd_protocol.errors import InvalidInput
from processes import HeadlessAdd, detached_socket, read_pty_until
from rawclient import Raw, _socket_lines, relay_client, running, socket_client, write_ctx

pytestmark = pytest.mark.anyio

MEMORYCTL = [sys.executable, "-m", "memoryd_client"]
PYTHON = os.path.realpath(sys.executable)
#: an agent layer whose writes need no approval: what was acknowledged before each attack
CONFIG = '[write_policies]\n"agent/user-global" = "auto"\n'


def proc_start(pid: int) -> int:
    """Field 22 of /proc/<pid>/stat: the process's start time."""
    return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[19])


def ledger(db: Path, kind: str) -> list[dict[str, Any]]:
    """The bodies of the store's ledger rows of ``kind``, oldest first (read-only)."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return [json.loads(b) for (b,) in conn.execute("SELECT body FROM memoryd_ledger WHERE kind = ? ORDER BY n",
                                                       (kind,))]
    finally:
        conn.close()


def start_daemon(daemon_factory: Any, tmp_path: Path, extra: str = "") -> Any:
    cfg = tmp_path / "facts.toml"
    cfg.write_text(extra + CONFIG)
    return daemon_factory("--config", str(cfg), policy="ask")


async def acknowledged(d: Any) -> tuple[Any, Any, int]:
    """One write acknowledged before the attack; the state every check compares with."""
    async with socket_client(d.socket_path) as raw:
        await add(raw, "acknowledged before", track="agent")
        return await state(raw)


async def nothing_lost(d: Any, before: tuple[Any, Any, int], denied: int) -> None:
    """The entries and budgets are as acknowledged, ``denied`` denied rows more, and the
    ledger holds."""
    async with socket_client(d.socket_path) as raw:
        entries, budgets, writes = await state(raw)
        assert (entries, budgets, writes) == (before[0], before[1], before[2] + denied)
        assert [e["text"] for e in entries] == ["acknowledged before"]
        assert (await raw.ok("audit/verify", {}))["ok"] is True


# --- what a decision row records -------------------------------------------------------------



@pytest.mark.process
def test_a_decision_records_the_deciding_process_and_its_claim_as_a_claim(daemon_factory: Any,
                                                                            tmp_path: Path) -> None:
    """memoryctl approve on a terminal (the default, "interactive") approves a headless
    agent's write: the decided row holds the approver's pid, start time, uid, exe, tty and
    session as the kernel had them, and "human" as what it claims; explain shows both."""
    d = start_daemon(daemon_factory, tmp_path)
    master, slave = pty.openpty()
    tty = os.ttyname(slave).removeprefix("/dev/")
    approver = subprocess.Popen(["setsid", "--ctty", *MEMORYCTL, "--socket", str(d.socket_path), "--no-autostart",
                                 "approve", "--count", "1"], stdin=slave, stdout=slave, stderr=slave)
    os.close(slave)
    try:
        read_pty_until(master, b"approving writes")
        start = proc_start(approver.pid)
        writer = HeadlessAdd(d.socket_path, "agent-1", "Asked of a human")
        read_pty_until(master, b"Approve? [y/N]")
        os.write(master, b"y\n")
        assert writer.result() == {"text": "Asked of a human"}
        assert approver.wait(30) == 0
    finally:
        if approver.poll() is None:
            approver.kill()
        approver.wait(10)
        os.close(master)
    facts = {"pid": approver.pid, "start": start, "uid": os.geteuid(), "exe": PYTHON,
             "tty": tty, "session": approver.pid}  # setsid: the approver leads a session of its own
    [decided] = ledger(d.db_path, "decided")
    assert decided["outcome"] == "allowed-once" and decided["by"] == {"kind": "human", "name": None}
    assert decided["decider"] == facts
    with mc.connect_sync(d.socket_path, timeout=30) as c:
        [event] = c.audit_explain("Asked of a human").events
    assert event.decision is not None and event.decision.decided_by is not None
    by = event.decision.decided_by  # the approver's connection as it was at connect
    assert {k: getattr(by, k) for k in facts} == facts and by.harness is None
    assert by.client is not None and by.client.name == "memoryctl"
    assert event.decision.decider == ProcessFacts(**facts)
    r = subprocess.run([*MEMORYCTL, "--socket", str(d.socket_path), "--no-autostart", "audit", "explain",
                        "Asked of a human"], capture_output=True, text=True, timeout=60, start_new_session=True)
    assert r.returncode == 0, r.stderr
    assert f"  approved by memoryctl pid {approver.pid} ({PYTHON}, tty {tty}), claimed human  text " in r.stdout


def test_the_explanation_names_the_kernels_facts_then_the_claim() -> None:
    approver = T.LedgerConnection(ref="r/2", run="r", id=2, transport="socket", pid=812, uid=1000,
                                  exe="/usr/bin/python3", client=T.ClientInfo(name="memoryctl", version="1.0"),
                                  opened_at=0, start=7, tty="pts/3", session=812)
    relay = T.LedgerConnection(ref="r/1", run="r", id=1, transport="socket", pid=900, uid=1000, exe="/usr/bin/python3",
                               client=T.ClientInfo(name="claude"), opened_at=0, start=5, tty=None, session=4,
                               harness=899)
    facts = ProcessFacts(pid=812, start=7, uid=1000, exe="/usr/bin/python3", tty="pts/3", session=812)

    def line(outcome: str, by: T.ApprovalBy | None, decided_by: T.LedgerConnection = approver) -> str:
        decision = T.LedgerDecision(approval="a1", outcome=outcome, policy="ask", decided_by=decided_by, by=by,
                                    reason=None, failed=None, decider=facts)
        ev = T.LedgerEvent(n=3, seq=1, ts=0, action="add", outcome=outcome, text=None, session_id="s-1",
                           asked_by=relay, decision=decision)
        return render.entry_life(T.EntryLife(entry_id="e1", current=None, events=[ev], snapshots=[])).splitlines()[3]

    shown = line("allowed-once", T.ApprovalBy(kind="human"))
    assert ("asked by claude (pid 900, /usr/bin/python3; memoryd's relay for harness pid 899, as the relay reports)  "
            "approved by memoryctl pid 812 (/usr/bin/python3, tty pts/3), claimed human") in shown
    assert line("rejected", None).endswith('decided rejected by memoryctl pid 812 (/usr/bin/python3, tty pts/3), '
                                           "claimed nothing")
    assert line("allowed-once", T.ApprovalBy(kind="script", name="memoryctl --yes"), relay).endswith(
        'approved by claude pid 812 (/usr/bin/python3, tty pts/3), the asking connection, claimed script '
        '"memoryctl --yes"')


# --- attack: the writer's pty child as its "interactive" approver ------------------------------

#: A headless writer that gives a child a terminal (pty.fork(), or util-linux script -qc, argv[2])
#: and lets it subscribe as an approver, then writes; the child approves, "by a human",
#: whatever it is asked. Reports on pipes, not the terminal: what each side got.
PTY_CHILD = r"""
import json, os, pty, shlex, socket, subprocess, sys

path, how = sys.argv[1], sys.argv[2]


def call(s, f, id_, method, params, notes):
    s.sendall(json.dumps({"jsonrpc": "2.0", "id": id_, "method": method, "params": params}).encode() + b"\n")
    while True:
        msg = json.loads(f.readline())
        if msg.get("id") == id_:
            return msg
        notes.append(msg)


def connect():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    return s, s.makefile("rb")


def child(report_w, go_r):
    s, f = connect()
    notes = []
    call(s, f, 1, "initialize", {"client": {"name": "memoryctl"}}, notes)
    sub = call(s, f, 2, "approval/subscribe", {}, notes)
    os.write(report_w, (json.dumps({"pid": os.getpid(), "tty": os.ttyname(0), "subscribe": sub}) + "\n").encode())
    os.read(go_r, 1)
    call(s, f, 3, "daemon/status", {}, notes)  # every notification sent before it has arrived
    decided = [call(s, f, 10 + i, "approval/decided", {"id": n["params"]["id"], "outcome": "allowed-once",
                                                       "by": {"kind": "human"}}, [])
               for i, n in enumerate(notes) if n["method"] == "approval/asked"]
    os.write(report_w, (json.dumps({"notes": [n["method"] for n in notes], "decided": decided}) + "\n").encode())
    os._exit(0)


if how == "child":
    child(int(sys.argv[3]), int(sys.argv[4]))
report_r, report_w = os.pipe()
go_r, go_w = os.pipe()
if how == "pty.fork":
    pid, _ = pty.fork()
    if pid == 0:
        child(report_w, go_r)
    def done():
        os.waitpid(pid, 0)
else:  # script -qc: the command runs on a terminal of its own, a child of script's
    for fd in (report_w, go_r):
        os.set_inheritable(fd, True)
    command = shlex.join([sys.executable, sys.argv[0], path, "child", str(report_w), str(go_r)])
    script = subprocess.Popen(["script", "-qec", command, "/dev/null"], pass_fds=[report_w, go_r],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    def done():
        script.wait()
reports = os.fdopen(report_r)
child_start = json.loads(reports.readline())
s, f = connect()
call(s, f, 1, "initialize", {"client": {"name": "agent"}, "capabilities": {"approvals": False}}, [])
request = {"jsonrpc": "2.0", "id": 2, "method": "memory/add", "params": {
    "input": {"track": "user", "scope": "user-global", "text": "self-approved?"},
    "write": {"agent": {"session": {"id": "bot"}}}}}
s.sendall(json.dumps(request).encode() + b"\n")  # asked of the approvers (its child, if anyone)
# Served once the add was denied or parked on its approval: then the child is asked, or not.
replies = {}
status = {"jsonrpc": "2.0", "id": 3, "method": "daemon/status", "params": {}}
s.sendall(json.dumps(status).encode() + b"\n")
while 3 not in replies:
    msg = json.loads(f.readline())
    if "id" in msg:
        replies[msg["id"]] = msg
os.write(go_w, b"g")
child_report = json.loads(reports.readline())
done()
while 2 not in replies:
    msg = json.loads(f.readline())
    if "id" in msg:
        replies[msg["id"]] = msg
add = replies[2]
print(json.dumps({"writer": os.getpid(), "child": child_start, "add": add, "child_report": child_report}))
"""


@pytest.mark.process
@pytest.mark.parametrize("how", ["pty.fork", "script"])
def test_a_pty_child_of_a_headless_writer_is_not_its_approver(daemon_factory: Any, tmp_path: Path, how: str) -> None:
    """The child has a controlling terminal, so "interactive" lets it subscribe; it is the
    writer's descendant, so it is never asked about the writer's write (and would be refused
    if it answered): nobody else is subscribed, and the write is denied unavailable without
    a decision row."""
    d = start_daemon(daemon_factory, tmp_path)
    with mc.connect_sync(d.socket_path, session="s-0", timeout=30) as c:
        c.add({"track": "agent", "scope": "user-global", "text": "acknowledged before"})
        before = c.audit_list(10_000)
    code = tmp_path / "pty_child.py"
    code.write_text(PTY_CHILD)
    r = subprocess.run([sys.executable, str(code), str(d.socket_path), how], stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=60, start_new_session=True)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["child"]["subscribe"] == {"jsonrpc": "2.0", "id": 2, "result": {}}  # it had a terminal
    assert got["child"]["tty"].startswith("/dev/pts/")
    assert got["add"]["error"]["data"] == {"code": "WRITE_DENIED", "message": "write denied: unavailable",
                                           "details": {"outcome": "unavailable"}}
    assert got["child_report"] == {"notes": [], "decided": []}  # never asked, so it decided nothing
    assert ledger(d.db_path, "asked") == [] and ledger(d.db_path, "decided") == []
    with mc.connect_sync(d.socket_path, timeout=30) as c:
        assert [e.text for e in c.list()] == ["acknowledged before"]
        rows = c.audit_list(10_000)
        assert rows[1:] == before and (rows[0].action, rows[0].outcome) == (
            "add-denied", "unavailable (via approval, writePolicy ask)")
        assert c.audit_verify().ok


# --- attack: an approver's socket handed to the writer after its helper exited ---------------

#: On a terminal of its own (setsid --ctty), as memoryctl names itself: subscribe, hand the
#: connection to the parent over argv[2] (SCM_RIGHTS), print its pid, exit.
HAND_OVER = r"""
import json, os, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
s.sendall(b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"client":{"name":"memoryctl","version":"0.1.0"}}}\n'
          b'{"jsonrpc":"2.0","id":2,"method":"approval/subscribe"}\n')
f = s.makefile("rb")
f.readline()
sub = json.loads(f.readline())
socket.send_fds(socket.socket(fileno=int(sys.argv[2])), [b"c"], [s.fileno()])
print(json.dumps({"pid": os.getpid(), "subscribe": sub}))
"""


def handed_over(path: Path) -> tuple[socket.socket, dict[str, Any]]:
    """The approver connection :data:`HAND_OVER` made, once its helper has exited (and was
    reaped: no zombie is left to read)."""
    ours, theirs = socket.socketpair()
    master, slave = pty.openpty()
    try:
        with ours, theirs:
            r = subprocess.run(["setsid", "--ctty", sys.executable, "-c", HAND_OVER, str(path), str(theirs.fileno())],
                               pass_fds=[theirs.fileno()], stdin=slave, capture_output=True, text=True, timeout=30)
            assert r.returncode == 0, r.stderr
            _, fds, _, _ = socket.recv_fds(ours, 1, 1)
    finally:
        os.close(master)
        os.close(slave)
    return socket.socket(fileno=fds[0]), json.loads(r.stdout)


@pytest.mark.process
async def test_a_socket_handed_over_after_its_helper_exited_cannot_decide(daemon_factory: Any,
                                                                          tmp_path: Path) -> None:
    """The helper subscribed on a terminal as "memoryctl" and exited; its connection, now
    held by the writer, is asked and answers "allowed-once, by a human". The daemon refuses
    the decision (its process is gone) and logs why; once the holder hangs up the write is
    denied unavailable, and the decided row names no decider and no claim."""
    d = start_daemon(daemon_factory, tmp_path)
    before = await acknowledged(d)
    sock, helper = await anyio.to_thread.run_sync(handed_over, d.socket_path)
    assert helper["subscribe"] == {"jsonrpc": "2.0", "id": 2, "result": {}}
    stream = await anyio.abc.UNIXSocketStream.from_socket(sock)
    async with socket_client(d.socket_path, approvals=False) as agent, stream, \
            running(Raw(stream.send, _socket_lines(stream)), initialize=False, send_eof=stream.send_eof) as approver:
        gate = Gate()
        approver.on_approval = gate
        async with anyio.create_task_group() as tg:
            box = start_held(tg, agent, "memory/add", {"input": entry_input("self-approved?"), "write": write_ctx()})
            await arrived(gate)
            err = await approver.fail("approval/decided", {"id": gate.asked[0]["id"], "outcome": "allowed-once",
                                                           "by": {"kind": "human"}})
            assert (err.code, err.error["message"]) == ("INVALID_INPUT", (
                f"the process that opened this connection (pid {helper['pid']}) has exited: its socket was handed to "
                "another process, which cannot make decisions; decide from a connection the deciding process opened "
                "itself"))
            assert (await agent.ok("daemon/status", {}))["pendingApprovals"] == 1  # still undecided
            await approver.hang_up()
        assert box["r"]["error"]["data"]["details"] == {"outcome": "unavailable"}
    [decided] = ledger(d.db_path, "decided")
    assert (decided["outcome"], decided["connection"], decided["by"], decided["decider"]) == (
        "unavailable", None, None, None)
    assert re.search(rf" WARNING memoryd\.approvals: connection \d+ refused: the process that opened this "
                     rf"connection \(pid {helper['pid']}\) has exited: its socket was handed to another process",
                     d.stderr())
    await nothing_lost(d, before, denied=1)


# --- attack: a process that only looks like the relay ---------------------------------------

#: Declares itself memoryd's stdio relay for its parent, as the relay does, and writes.
LOOKALIKE = r"""
import json, os, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[-1])
print(os.getpid(), flush=True)
sys.stdin.readline()  # the test has read /proc/<pid>/cmdline
hello = {"jsonrpc": "2.0", "method": "initialize", "params": {"relay": {"harnessPid": os.getppid()}}}
init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"client": {"name": "fake-relay"}, "capabilities": {"approvals": False}}}
add = {"jsonrpc": "2.0", "id": 2, "method": "memory/add",
       "params": {"input": {"track": "user", "scope": "user-global", "text": "from a lookalike"},
                  "write": {"agent": {"session": {"id": "bot"}}}}}
s.sendall(b"".join(json.dumps(m).encode() + b"\n" for m in (hello, init, add)))
f = s.makefile("rb")
while (reply := json.loads(f.readline())).get("id") != 2:  # initialize's answer, events
    pass
print(json.dumps(reply), flush=True)
"""


async def detached_unix(path: Any) -> anyio.abc.UNIXSocketStream:
    """anyio.connect_unix, the connection held by a process of its own (processes.detached_socket)."""
    sock = await anyio.to_thread.run_sync(detached_socket, path)
    return await anyio.abc.UNIXSocketStream.from_socket(sock)


@pytest.mark.process
def test_a_process_that_only_looks_like_the_relay_is_shown_as_itself(daemon_factory: Any, tmp_path: Path) -> None:
    """Its argv says ``memoryd serve --stdio`` and it says it is the relay for its parent (a
    shell that wrote nothing), but its executable is not memoryd's interpreter: the claim is
    refused and logged, and the approver and the ledger are shown the process itself."""
    d = start_daemon(daemon_factory, tmp_path, 'approvers = "any"\n')
    with mc.connect_sync(d.socket_path, session="s-0", timeout=30) as c:
        c.add({"track": "agent", "scope": "user-global", "text": "acknowledged before"})
        before = c.audit_list(10_000)
    lookalike = Path(os.path.realpath(tmp_path)) / "lookalike"
    shutil.copy(PYTHON, lookalike)  # the same program under another name: another executable
    asked: list[T.ApprovalAsked] = []

    def approve(a: T.ApprovalAsked) -> str:
        asked.append(a)
        return "allowed-once"

    # the approver is a process of its own: the lookalike is this test's descendant
    with mock.patch("anyio.connect_unix", detached_unix), \
            mc.connect_sync(d.socket_path, on_approval=approve, timeout=30) as approver:
        approver.approval_subscribe()
        shell = subprocess.Popen(["bash", "-c", '( exec -a memoryd "$0" -I -S -c "$1" serve --stdio --socket "$2" )',
                                  str(lookalike), LOOKALIKE, str(d.socket_path)], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
        with shell:
            assert shell.stdin is not None and shell.stdout is not None
            pid = int(shell.stdout.readline())
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
            assert (argv[0], argv[-4:-2]) == (b"memoryd", [b"serve", b"--stdio"])  # the argv of the relay
            assert int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1]) == shell.pid
            shell.stdin.write("go\n")
            shell.stdin.flush()
            reply = json.loads(shell.stdout.readline())
        assert shell.returncode == 0 and reply["result"]["entry"]["text"] == "from a lookalike"
    [a] = asked
    assert a.origin == T.ApprovalOrigin(name="fake-relay", pid=pid, exe=str(lookalike))  # not the shell
    with mc.connect_sync(d.socket_path, timeout=30) as c:
        [event] = c.audit_explain("from a lookalike").events
        assert event.asked_by is not None and event.decision is not None and event.decision.decider is not None
        assert (event.asked_by.pid, event.asked_by.exe, event.asked_by.harness) == (pid, str(lookalike), None)
        assert event.decision.decided_by is not None
        assert event.decision.decider.pid == event.decision.decided_by.pid != os.getpid()
        assert [e.text for e in c.list()] == ["acknowledged before", "from a lookalike"]
        assert c.audit_list(10_000)[1:] == before and c.audit_verify().ok
    assert (f"(pid {pid}) said it is memoryd's stdio relay and is taken for what the kernel says it is: its "
            f"executable {lookalike} is not memoryd's interpreter {PYTHON}") in d.stderr()


@pytest.mark.process
async def test_the_relay_is_recognised_by_its_executable_and_its_word(daemon_factory: Any, tmp_path: Path) -> None:
    """memoryd serve --stdio runs memoryd's interpreter and says it relays for its parent:
    approvers are shown the harness, and the ledger records the relay's own facts with the
    harness as the relay's report."""
    d = start_daemon(daemon_factory, tmp_path, 'approvers = "any"\n')
    async with socket_client(d.socket_path, foreign=True) as approver, \
            relay_client(d.socket_path, approvals=False) as agent:
        gate = Gate()
        approver.on_approval = gate
        await approver.ok("approval/subscribe", {})
        async with anyio.create_task_group() as tg:
            box = start_held(tg, agent, "memory/add", {"input": entry_input("through the relay"),
                                                       "write": write_ctx()})
            await arrived(gate)
            assert gate.asked[0]["origin"] == {"name": "raw", "version": "0", "pid": os.getpid(), "exe": PYTHON}
            await approver.ok("approval/decided", {"id": gate.asked[0]["id"], "outcome": "allowed-once"})
        assert box["r"]["result"]["entry"]["text"] == "through the relay"
        relay = agent.process.pid
        start = proc_start(relay)
        life = await agent.ok("audit/explain", {"target": "through the relay"})
    asked_by = life["events"][0]["askedBy"]
    assert (asked_by["pid"], asked_by["start"], asked_by["exe"], asked_by["harness"]) == (
        relay, start, PYTHON, os.getpid())


# --- the rules, on peers made here ------------------------------------------------------------


class _Peer:
    """What the approvals need of a connection, around a process made here."""

    def __init__(self, n: int, peer: PeerProcess | None) -> None:
        self.id, self.peer, self.can_approve, self.gone, self.client = n, peer, True, False, None

    def listing(self, *, approver: bool) -> T.ConnectionInfo:
        raise NotImplementedError

    def describe(self) -> T.ApprovalOrigin | None:
        return None

    async def notify(self, method: str, params: object) -> None:
        pass


def _pending(approvals: Approvals, origin: _Peer, *targets: _Peer) -> Pending:
    asked = T.ApprovalAsked(id=f"a-{len(approvals.pending)}", action="add", track="user", scope="user-global",
                            text="t", source="s", session_id=None, reason="r")
    p = Pending(asked, origin, list(targets))  # type: ignore[arg-type]
    approvals.pending[asked.id] = p
    return p


#: prints its pid once reparented (its parent exits at once), then waits for EOF on stdin
ORPHAN = "import os, sys\nif os.fork():\n    os._exit(0)\nprint(os.getpid(), flush=True)\nsys.stdin.read()\n"


def test_a_decision_is_checked_against_the_processes_as_they_are_when_it_arrives() -> None:
    """Asked before, refused now: an approver related to the writer, a pid whose start time
    changed (the pid was reused), a writer whose process is gone. An unrelated, live
    approver decides, and its facts are what the decision keeps."""
    config = Config()
    config.approvers = "any"
    approvals = Approvals(config=config)
    me = _Peer(1, PeerProcess.of(os.getpid()))
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    orphan = subprocess.Popen([sys.executable, "-c", ORPHAN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    with orphan:
        assert orphan.stdout is not None
        stranger = _Peer(3, PeerProcess.of(int(orphan.stdout.readline())))
        kid = _Peer(2, PeerProcess.of(child.pid))
        p = _pending(approvals, kid, me)  # the writer's parent, asked (say, before a fork)
        with pytest.raises(InvalidInput) as info:
            approvals.decide(me, p.asked.id, "allowed-once")  # type: ignore[arg-type]
        assert info.value.message == (f"this approver (pid {os.getpid()}) is the writing process, its ancestor or "
                                      "its descendant, so it cannot decide this write; approve from a process of its "
                                      "own, such as memoryctl approve in another terminal")
        assert p.outcome is None
        assert me.peer is not None and me.peer.facts is not None
        reused = _Peer(4, dataclasses.replace(me.peer, facts=dataclasses.replace(me.peer.facts,
                                                                              start=me.peer.facts.start + 1)))
        p = _pending(approvals, stranger, reused)
        with pytest.raises(InvalidInput) as info:
            approvals.decide(reused, p.asked.id, "allowed-once")  # type: ignore[arg-type]
        assert info.value.message == (f"pid {os.getpid()} is no longer the process that opened this connection (its "
                                      "start time changed): its socket was handed to another process, which cannot "
                                      "make decisions; decide from a connection the deciding process opened itself")
        p = _pending(approvals, kid, stranger)
        approvals.decide(stranger, p.asked.id, "allowed-once", T.ApprovalBy(kind="human"))  # type: ignore[arg-type]
        assert stranger.peer is not None and stranger.peer.facts is not None
        assert p.outcome == "allowed-once" and p.decider == stranger.peer.facts.wire()
        p = _pending(approvals, kid, stranger)
        with child:  # the writer exits now, and is reaped: nobody can tell whose write it is then
            pass
        with pytest.raises(InvalidInput) as info:
            approvals.decide(stranger, p.asked.id, "allowed-once")  # type: ignore[arg-type]
        assert info.value.message == (f"the process that asked this write (pid {child.pid}) has exited or its pid "
                                      "was reused: memoryd cannot tell whose write it is, so no approver can decide "
                                      "it; the writer has to write again")
        assert p.outcome is None


def test_check_decider_returns_the_facts_to_record_or_refuses() -> None:
    """The check audit/accept reuses: the deciding process's facts now, or INVALID_INPUT."""
    config = Config()
    me = _Peer(1, PeerProcess.of(os.getpid()))
    facts = check_decider(me, config)  # type: ignore[arg-type]
    now = read_facts(os.getpid())
    assert now is not None and facts == now.wire()
    assert (facts.pid, facts.start, facts.uid, facts.exe) == (os.getpid(), proc_start(os.getpid()), os.geteuid(),
                                                              PYTHON)
    config.approvers = "keyed"
    with pytest.raises(InvalidInput) as info:
        check_decider(me, config)  # type: ignore[arg-type]
    assert info.value.message == KEY_NOT_PROVEN
    with pytest.raises(InvalidInput, match="another pid namespace"):
        check_decider(_Peer(2, PeerProcess(None, uid=0)), Config())  # type: ignore[arg-type]


def test_tty_names_from_tty_nr() -> None:
    assert tty_name(0) is None
    assert tty_name((136 << 8) | 3) == "pts/3"
    assert tty_name((137 << 8) | 4) == "pts/260"
    assert tty_name((136 << 8) | 5 | (4096 << 12)) == "pts/4101"  # a minor's high bits sit above the major
    assert (tty_name((4 << 8) | 2), tty_name((4 << 8) | 65)) == ("tty2", "ttyS1")
    assert tty_name((188 << 8) | 0) == "188:0"
