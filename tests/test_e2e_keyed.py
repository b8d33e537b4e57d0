"""``approvers = "keyed"`` against a real daemon: a connection decides only once it answered a
fresh challenge of its own with the approver key ($XDG_CONFIG_HOME/memoryd/approver.key,
made by ``memoryctl approve --init-key``, readable by its owner only), which the daemon
reads itself. A process that cannot read the key, a terminal or not, cannot subscribe,
nor answer its own prompt; memoryctl approve proves the key by itself."""

from __future__ import annotations

import json
import os
import pty
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import memoryd_client as mc
import pytest
from e2e_helpers import Gate, arrived, entry_input, start_held, state
from memoryd_protocol.paths import ApproverKeyError, approver_proof, read_approver_key
from processes import HeadlessAdd, read_pty_until
from rawclient import socket_client, write_ctx

pytestmark = pytest.mark.anyio

MEMORYCTL = [sys.executable, "-m", "memoryd_client"]
PYTHON = os.path.realpath(sys.executable)
NOT_PROVEN_SUBSCRIBE = ('approvers = "keyed": only a connection that proved the approver key can subscribe; send '
                        "approval/challenge, then approval/subscribe with its proof (memoryctl approve does both)")


@pytest.fixture
def config_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """$XDG_CONFIG_HOME of this test, for the daemon and every client it starts."""
    home = tmp_path / "config"
    home.mkdir()
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home))
    return home


def init_key() -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MEMORYCTL, "approve", "--init-key"], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL, start_new_session=True)


@pytest.fixture
def key(config_home: Path) -> Path:
    r = init_key()
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    path = config_home / "memoryd" / "approver.key"
    assert r.stdout == f"{path}\n"
    return path


@pytest.fixture
def keyed(daemon_factory: Any, tmp_path: Path, key: Path) -> Any:
    cfg = tmp_path / "keyed.toml"
    cfg.write_text('approvers = "keyed"\n')
    return daemon_factory("--config", str(cfg), policy="ask")


async def prove(raw: Any, secret: bytes, method: str = "approval/prove") -> dict[str, Any]:
    """A fresh challenge of ``raw``'s, answered with ``secret``: the reply to ``method``."""
    ch = await raw.ok("approval/challenge", {})
    return await raw.call(method, {"proof": approver_proof(secret, ch["nonce"], ch["connection"], ch["pid"],
                                                          ch["start"])})


# --- the key file ------------------------------------------------------------------------------


def test_init_key_makes_a_private_key_once(config_home: Path) -> None:
    r = init_key()
    path = config_home / "memoryd" / "approver.key"
    assert (r.returncode, r.stdout, r.stderr) == (0, f"{path}\n", "")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    text = path.read_text()
    assert len(text) == 65 and text.endswith("\n") and len(bytes.fromhex(text)) == 32
    assert read_approver_key(path) == bytes.fromhex(text)
    again = init_key()
    assert (again.returncode, again.stdout) == (2, "")
    assert again.stderr == (f"error: USAGE: the approver key {path} exists already, and keyed approvers use it as it "
                            "is; remove it first to make a new one\n")
    assert path.read_text() == text  # not replaced


def test_a_key_file_that_is_not_private_or_not_a_key_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "approver.key"
    with pytest.raises(ApproverKeyError) as info:
        read_approver_key(path)
    assert str(info.value) == f"the approver key {path} does not exist: create it with memoryctl approve --init-key"
    path.write_text("ab" * 32 + "\n")
    path.chmod(0o640)
    with pytest.raises(ApproverKeyError) as info:
        read_approver_key(path)
    assert str(info.value) == (f"the approver key {path} is readable by group or others (mode 0640): chmod 600 "
                               f"{path}, or remove it and run memoryctl approve --init-key")
    path.chmod(0o600)
    assert read_approver_key(path) == bytes.fromhex("ab" * 32)
    path.write_text("not a key\n")
    with pytest.raises(ApproverKeyError) as info:
        read_approver_key(path)
    assert str(info.value) == (f"the approver key {path} is not a memoryd approver key (64 hex digits): remove it "
                               "and run memoryctl approve --init-key")
    link = tmp_path / "link.key"
    link.symlink_to(path)
    with pytest.raises(ApproverKeyError) as info:
        read_approver_key(link)
    assert str(info.value) == (f"the approver key {link} is a symbolic link: put the key file itself there "
                               "(memoryctl approve --init-key makes one)")


# --- the challenge on the wire ------------------------------------------------------------------


async def test_subscribing_takes_a_fresh_proof_of_this_connection(keyed: Any, key: Path) -> None:
    secret = read_approver_key(key)
    async with socket_client(keyed.socket_path) as raw:
        init = await raw.ok("initialize", {"client": {"name": "raw", "version": "0"}})
        assert init["approvers"] == "keyed"
        err = await raw.fail("approval/subscribe", {})
        assert (err.code, err.error["message"]) == ("INVALID_INPUT", NOT_PROVEN_SUBSCRIBE)
        ch = await raw.ok("approval/challenge", {})
        assert ch["pid"] == os.getpid() and len(ch["nonce"]) == 64 and ch["connection"].endswith("/" + str(
            (await raw.ok("daemon/status", {}))["connectionList"][0]["id"]))
        wrong = approver_proof(b"\0" * 32, ch["nonce"], ch["connection"], ch["pid"], ch["start"])
        err = await raw.fail("approval/subscribe", {"proof": wrong})
        assert (err.code, err.details, err.error["message"]) == ("INVALID_INPUT", {"field": "proof"}, (
            f"the proof does not answer this connection's challenge with the approver key {key}: make sure the "
            "program reads that key, then send approval/challenge again"))
        # a challenge is answered once, right or wrong
        right = approver_proof(secret, ch["nonce"], ch["connection"], ch["pid"], ch["start"])
        err = await raw.fail("approval/subscribe", {"proof": right})
        assert err.error["message"] == ("this connection has no challenge to answer (none was asked, it was answered, "
                                        "or it is older than 60 s): send approval/challenge first")
        # a proof made for another connection's challenge does not answer this one's
        async with socket_client(keyed.socket_path) as other:
            theirs = await other.ok("approval/challenge", {})
            await raw.ok("approval/challenge", {})
            err = await raw.fail("approval/subscribe", {"proof": approver_proof(
                secret, theirs["nonce"], theirs["connection"], theirs["pid"], theirs["start"])})
            assert err.details == {"field": "proof"}
        assert (await prove(raw, secret, "approval/subscribe"))["result"] == {}
        assert [c["approver"] for c in (await raw.ok("daemon/status", {}))["connectionList"]] == [True]
    log = keyed.stderr()
    assert "refused: the proof does not answer this connection's challenge" in log
    assert "proved the approver key" in log


# --- memoryctl approve, and a process that cannot read the key ---------------------------------

#: On a terminal of its own, without the key: the challenge is there to answer, the key is not.
NO_KEY = r"""
import json, os, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
f = s.makefile("rb")
def call(id_, method, params):
    s.sendall(json.dumps({"jsonrpc": "2.0", "id": id_, "method": method, "params": params}).encode() + b"\n")
    return json.loads(f.readline())
try:
    open(sys.argv[2]).read()
    readable = True
except OSError:
    readable = False
call(1, "initialize", {"client": {"name": "memoryctl"}})
ch = call(2, "approval/challenge", {})["result"]
print(json.dumps({"tty": os.ttyname(0), "readable": readable,
                  "bare": call(3, "approval/subscribe", {}),
                  "guessed": call(4, "approval/subscribe", {"proof": "00" * 32})}))
"""


def hidden(key: Path, *command: str) -> list[str]:
    """``command`` in a mount namespace whose tmpfs hides the key's directory, on the
    terminal that is its stdin (setsid --ctty)."""
    unshare = ["unshare", "--mount"] if os.geteuid() == 0 else ["unshare", "--mount", "--map-root-user"]
    return [*unshare, "sh", "-c", 'mount -t tmpfs tmpfs "$0" && exec setsid --ctty "$@"', str(key.parent), *command]


def on_terminal(args: list[str]) -> subprocess.CompletedProcess[str]:
    master, slave = pty.openpty()
    try:
        return subprocess.run(args, stdin=slave, capture_output=True, text=True, timeout=60)
    finally:
        os.close(master)
        os.close(slave)




@pytest.fixture
def approver_on_a_terminal(keyed: Any) -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    """memoryctl approve --count 1 on a terminal, subscribed (it proved the key)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(["setsid", "--ctty", *MEMORYCTL, "--socket", str(keyed.socket_path), "--no-autostart",
                             "approve", "--count", "1"], stdin=slave, stdout=slave, stderr=slave)
    os.close(slave)
    try:
        read_pty_until(master, b"approving writes")
        yield master, proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        os.close(master)


@pytest.mark.process
def test_a_process_that_cannot_read_the_key_cannot_subscribe_even_on_a_terminal(
        keyed: Any, key: Path, approver_on_a_terminal: tuple[int, subprocess.Popen[bytes]]) -> None:
    """The key's directory hidden by a tmpfs in its mount namespace: memoryctl approve there
    fails with the reason, and a raw attempt (no proof, a guessed one) is refused. The
    memoryctl approve that read the key is subscribed, and decides a headless write."""
    sock = str(keyed.socket_path)
    r = on_terminal(hidden(key, *MEMORYCTL, "--socket", sock, "--no-autostart", "approve"))
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == (f'error: USAGE: the daemon runs with approvers = "keyed": the approver key {key} does not '
                        "exist: create it with memoryctl approve --init-key\n")
    r = on_terminal(hidden(key, sys.executable, "-c", NO_KEY, sock, str(key)))
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["tty"].startswith("/dev/pts/") and got["readable"] is False
    assert got["bare"]["error"]["message"] == NOT_PROVEN_SUBSCRIBE
    assert got["guessed"]["error"]["data"]["details"] == {"field": "proof"}
    assert got["guessed"]["error"]["message"].startswith("the proof does not answer this connection's challenge")
    # the approver that read the key decides a headless agent's write
    master, approver = approver_on_a_terminal
    writer = HeadlessAdd(sock, "agent-1", "Keyed approval")
    read_pty_until(master, b"Approve? [y/N]")
    os.write(master, b"y\n")
    assert writer.result() == {"text": "Keyed approval"}
    assert approver.wait(30) == 0
    with mc.connect_sync(keyed.socket_path, timeout=30) as c:
        [event] = c.audit_explain("Keyed approval").events
    assert event.decision is not None and event.decision.decider is not None
    assert (event.decision.decider.pid, event.decision.decider.exe) == (approver.pid, PYTHON)
    assert event.decision.by is not None and event.decision.by.kind == "human"


# --- a connection's own prompt ------------------------------------------------------------------


async def test_a_connections_own_prompt_decides_only_once_it_proved_the_key(keyed: Any, key: Path) -> None:
    """Unproven, a connection that can approve is not asked about its own write: a keyed
    approver is. Once it proved the key, its own prompt decides its writes."""
    secret = read_approver_key(key)
    async with socket_client(keyed.socket_path) as writer, socket_client(keyed.socket_path, foreign=True) as approver:
        own, theirs = Gate(), Gate()
        writer.on_approval, approver.on_approval = own, theirs
        assert (await prove(approver, secret, "approval/subscribe"))["result"] == {}
        before = await state(writer)
        async with anyio.create_task_group() as tg:
            box = start_held(tg, writer, "memory/add", {"input": entry_input("asked elsewhere"), "write": write_ctx()})
            await arrived(theirs)
            await approver.ok("approval/decided", {"id": theirs.asked[0]["id"], "outcome": "allowed-once"})
        assert box["r"]["result"]["entry"]["text"] == "asked elsewhere" and own.asked == []
        assert (await prove(writer, secret))["result"] == {}
        async with anyio.create_task_group() as tg:
            box = start_held(tg, writer, "memory/add", {"input": entry_input("asked here"), "write": write_ctx()})
            await arrived(own)
            await writer.ok("approval/decided", {"id": own.asked[0]["id"], "outcome": "allowed-once",
                                                 "by": {"kind": "script", "name": "test"}})
        assert box["r"]["result"]["entry"]["text"] == "asked here" and len(theirs.asked) == 1
        entries, _, writes = await state(writer)
        assert [e["text"] for e in entries] == ["asked elsewhere", "asked here"] and writes == before[2] + 2
        life = await writer.ok("audit/explain", {"target": "asked here"})
        decision = life["events"][0]["decision"]
        assert decision["decider"]["pid"] == os.getpid() and decision["by"] == {"kind": "script", "name": "test"}


@pytest.mark.process
def test_memoryctl_proves_the_key_for_its_own_prompt(keyed: Any, config_home: Path, tmp_path: Path) -> None:
    """memoryctl add --yes proves the key first, so its own prompt decides; without the key
    it says so, and its write is asked of a keyed approver (none here: unavailable)."""
    sock = ["--socket", str(keyed.socket_path), "--no-autostart"]
    r = subprocess.run([*MEMORYCTL, *sock, "--yes", "add", "--track", "user", "--scope", "user-global", "With the key"],
                       capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, start_new_session=True)
    assert r.returncode == 0, r.stderr
    elsewhere = tmp_path / "no-config"
    elsewhere.mkdir()
    r = subprocess.run([*MEMORYCTL, *sock, "--yes", "add", "--track", "user", "--scope", "user-global", "No key"],
                       capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, start_new_session=True,
                       env={**os.environ, "XDG_CONFIG_HOME": str(elsewhere)})
    missing = elsewhere / "memoryd" / "approver.key"
    assert r.returncode == 1
    assert r.stderr.splitlines()[0] == (f"memoryctl: not answering approvals here: the approver key {missing} does "
                                        "not exist: create it with memoryctl approve --init-key; this command's writes "
                                        "are asked of a running 'memoryctl approve'")
    assert r.stderr.splitlines()[-1].startswith("error: WRITE_DENIED: write denied: unavailable")
    with mc.connect_sync(keyed.socket_path, timeout=30) as c:
        assert [e.text for e in c.list()] == ["With the key"]
        [event] = c.audit_explain("With the key").events
    assert event.decision is not None and event.decision.by is not None
    assert (event.decision.by.kind, event.decision.by.name) == ("script", "memoryctl --yes")


async def test_a_key_readable_by_others_is_refused_by_the_daemon_and_by_memoryctl(keyed: Any, key: Path) -> None:
    secret = read_approver_key(key)
    os.chmod(key, 0o644)
    async with socket_client(keyed.socket_path) as raw:
        reply = await prove(raw, secret)
        assert reply["error"]["message"] == (
            f"the daemon cannot use its approver key: the approver key {key} is readable by group or others (mode "
            f"0644): chmod 600 {key}, or remove it and run memoryctl approve --init-key")
        assert (await raw.fail("approval/subscribe", {})).error["message"] == NOT_PROVEN_SUBSCRIBE
    r = await anyio.run_process([*MEMORYCTL, "--socket", str(keyed.socket_path), "--no-autostart", "approve"],
                                check=False, start_new_session=True)
    assert r.returncode == 2
    assert r.stderr.decode() == (f'error: USAGE: the daemon runs with approvers = "keyed": the approver key {key} is '
                                 f"readable by group or others (mode 0644): chmod 600 {key}, or remove it and run "
                                 "memoryctl approve --init-key\n")
