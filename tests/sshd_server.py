"""A real sshd on 127.0.0.1 for the tests: Debian's ``openssh-server`` (tests/system_tools.py
installs it), a host key and a user key made in tmp, key authentication only, waited for by
its own ``Server listening`` line. tests/test_e2e_ssh.py runs remote sessions through it,
tests/test_e2e_replicate.py an SFTP replica."""

from __future__ import annotations

import getpass
import os
import select
import shlex
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from system_tools import require

SSHD_READY_S = 30


@dataclass
class Sshd:
    """A running sshd on 127.0.0.1, and how to reach it with the key made for it."""

    proc: subprocess.Popen[bytes]
    port: int
    key: Path
    known_hosts: Path
    #: the sshd's own public key file (``<type> <base64> …``)
    host_key: Path

    def argv(self, *remote: str, tty: bool = False) -> list[str]:
        """``ssh … 127.0.0.1 <remote>``: the remote words quoted for the remote shell, which
        joins and parses them as one command line."""
        return [require("ssh"), "-F", "/dev/null", "-i", str(self.key), "-p", str(self.port),
                "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-o", "StrictHostKeyChecking=no",
                "-o", f"UserKnownHostsFile={self.known_hosts}", "-o", "LogLevel=ERROR",
                *(["-t"] if tty else ["-T"]), f"{getpass.getuser()}@127.0.0.1",
                " ".join(shlex.quote(word) for word in remote)]

    def host_key_line(self) -> str:
        """The host key as a known-hosts entry's key part: ``<type> <base64>``."""
        kind, key = self.host_key.read_text().split()[:2]
        return f"{kind} {key}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listening(proc: subprocess.Popen[bytes], port: int) -> bool:
    """Read sshd's stderr until it says it listens (True) or exits (False, e.g. the port was
    taken meanwhile); bounded by SSHD_READY_S."""
    assert proc.stderr is not None
    want = f"Server listening on 127.0.0.1 port {port}.".encode()
    seen = b""
    deadline = time.monotonic() + SSHD_READY_S
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([proc.stderr], [], [], left)
        if not ready:
            break
        chunk = os.read(proc.stderr.fileno(), 65536)
        if not chunk:
            return False
        seen += chunk
        if want in seen:
            return True
    raise AssertionError(f"sshd did not listen within {SSHD_READY_S}s: {seen.decode(errors='replace')}")


@contextmanager
def running_sshd(tmp: Path, extra_config: str = "") -> Iterator[Sshd]:
    """An sshd whose keys and config live in ``tmp``, with ``extra_config`` lines added to
    its config; terminated on exit."""
    sshd_bin, keygen = require("sshd"), str(Path(require("ssh")).parent / "ssh-keygen")
    for name in ("host_key", "user_key"):
        subprocess.run([keygen, "-q", "-t", "ed25519", "-N", "", "-f", str(tmp / name)], check=True, timeout=60)
    (tmp / "authorized_keys").write_bytes((tmp / "user_key.pub").read_bytes())
    if os.geteuid() == 0:
        # root's sshd runs its pre-auth child in this empty directory (the init script makes it)
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    for _attempt in range(3):  # a free port can be taken between the probe and sshd's bind
        port = _free_port()
        config = tmp / "sshd_config"
        config.write_text(
            f"Port {port}\nListenAddress 127.0.0.1\nHostKey {tmp / 'host_key'}\n"
            f"AuthorizedKeysFile {tmp / 'authorized_keys'}\n"
            # CI runs as root: a key may log in as root, a password never
            "PermitRootLogin prohibit-password\nPubkeyAuthentication yes\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nUsePAM no\n"
            # pytest's tmp directories are not laid out for sshd's ownership checks
            "StrictModes no\nPidFile none\n" + extra_config)
        proc = subprocess.Popen([sshd_bin, "-D", "-e", "-f", str(config)], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        if _listening(proc, port):
            break
        proc.wait(10)
    else:
        raise AssertionError("sshd could not bind a free port on 127.0.0.1 three times")
    try:
        yield Sshd(proc, port, tmp / "user_key", tmp / "known_hosts", tmp / "host_key.pub")
    finally:
        proc.terminate()
        proc.wait(10)
        if proc.stderr is not None:
            proc.stderr.close()
