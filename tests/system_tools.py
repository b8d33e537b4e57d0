"""The programs the tests run that a fresh machine may lack, installed when the run starts.

The README's one set-up-and-test command has to pass on a machine that has only Python (and
what the machine image ships beside it), and CI runs exactly that command. So the test run
itself installs what it needs, once, before any worker starts: each missing command's
Debian package, through apt-get, when it runs as root (as CI and a fresh machine of this
kind do). Elsewhere it installs nothing and says which packages to install; the tests that
need one then fail naming it, they never skip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pytest


@dataclass(frozen=True)
class Tool:
    command: str
    package: str
    #: who runs it, for the message that names what is missing
    used_by: str


TOOLS = (
    Tool("node", "nodejs", "the Node client's tests and the MCP hosts (node >= 20)"),
    Tool("npm", "npm", "the README's runnable blocks and the npm packages the tests install"),
    Tool("systemd-analyze", "systemd", "tests/test_systemd_units.py"),
    Tool("zsh", "zsh", "tests/test_manual.py (the zsh completion)"),
    Tool("fish", "fish", "tests/test_manual.py (the fish completion)"),
    Tool("man", "man-db", "tests/test_manual.py (the man page)"),
    Tool("tmux", "tmux", "tests/test_real_hosts.py (the hosts' terminal UIs)"),
    Tool("sshd", "openssh-server", "tests/test_e2e_ssh.py (remote sessions through a real sshd on 127.0.0.1)"),
    Tool("ssh", "openssh-client", "tests/test_e2e_ssh.py (the ssh client and ssh-keygen)"),
)
NODE_MAJOR = 20
APT_TIMEOUT_S = 900


def node_too_old(which: Callable[[str], str | None] = shutil.which) -> bool:
    node = which("node")
    if node is None:
        return False
    r = subprocess.run([node, "-p", "process.versions.node"], capture_output=True, text=True, timeout=60)
    return r.returncode != 0 or int(r.stdout.split(".")[0]) < NODE_MAJOR


def missing(which: Callable[[str], str | None] = shutil.which,
            old_node: Callable[[], bool] = node_too_old) -> list[Tool]:
    """The tools whose command is not on PATH (node: or older than NODE_MAJOR)."""
    return [t for t in TOOLS if which(t.command) is None or (t.command == "node" and old_node())]


def install_command(tools: Sequence[Tool]) -> list[list[str]]:
    packages = list(dict.fromkeys(t.package for t in tools))
    return [["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages]]


def can_install(euid: int, which: Callable[[str], str | None] = shutil.which) -> bool:
    return euid == 0 and which("apt-get") is not None


def advice(tools: Sequence[Tool]) -> str:
    packages = " ".join(dict.fromkeys(t.package for t in tools))
    uses = "; ".join(f"{t.command}: {t.used_by}" for t in tools)
    return f"missing {', '.join(t.command for t in tools)} ({uses}): install them with  apt-get install {packages}"


def ensure(say: Callable[[str], object] = lambda line: print(line, file=sys.stderr)) -> list[Tool]:
    """Install the missing tools when this process may; the ones still missing after."""
    lacking = missing()
    if not lacking:
        return []
    if not can_install(os.geteuid()):
        say(f"memoryd tests: {advice(lacking)} (the test run installs them itself only as root)")
        return lacking
    say(f"memoryd tests: installing {' '.join(dict.fromkeys(t.package for t in lacking))} "
        f"({', '.join(t.command for t in lacking)} are missing)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in install_command(lacking):
        r = subprocess.run(argv, capture_output=True, text=True, timeout=APT_TIMEOUT_S, env=env)
        if r.returncode != 0:
            say(f"memoryd tests: {' '.join(argv[:2])} failed ({r.returncode}): {r.stderr.strip()[-2000:]}")
            break
    still = missing()
    if still:
        say(f"memoryd tests: still {advice(still)}")
    return still


def require(command: str) -> str:
    """The path of ``command``; the test fails, naming its package, when it is missing."""
    path = shutil.which(command)
    if path is None:
        tool = next(t for t in TOOLS if t.command == command)
        pytest.fail(f"{advice([tool])} (the test run installs it itself when run as root)")
    return path
