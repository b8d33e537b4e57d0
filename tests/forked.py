"""Daemon processes forked from a preloaded server, for the process tier's daemons.

A daemon started with ``python -m memoryd serve`` spends about 0.3 s of CPU on the
interpreter's start and its imports before it opens the store, and the suite starts
hundreds of them: most of its time on a 2-core machine. Here each test daemon is still a
process of its own, running the real ``memoryd serve`` entry point (``memoryd.cli.main``)
on its own socket and store, in its own session, with its own environment and stderr,
waited for with the launcher's own readiness wait (``memoryd.launch.start_ready``:
``READY=1`` from that pid, and its pidfd). Only the interpreter and the imports come
forked from multiprocessing's forkserver, which imported the daemon once.

What an exec'd start does differently is tested where it matters, with real
``python -m memoryd`` processes: the start/stop contract, ``--detach`` and autostart, the
relay, the README, systemd's ``ExecStart=``. ``MEMORYD_TEST_SPAWN=exec`` starts every
test daemon that way.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import memoryd.cli

_context: Any = None


def _forkserver() -> Any:
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        # The daemon's modules, not this one: the forkserver of Python 3.11 does not take
        # the tests' sys.path for its preload, and the child imports this module cheaply.
        _context.set_forkserver_preload(["memoryd.app", "memoryd.cli"])
    return _context


def _serve(args: list[str], env: dict[str, str], log: Path | None) -> None:
    """The child: what ``spawn_ready``'s Popen sets up (a new session, cwd ``/``, stdin and
    stdout on /dev/null, stderr on the log, exactly this environment), then the entry
    point."""
    os.setsid()
    os.chdir("/")
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    err = null if log is None else os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(err, 2)
    for fd in {null, err} - {0, 1, 2}:
        os.close(fd)
    os.environ.clear()
    os.environ.update(env)
    sys.exit(memoryd.cli.main(["serve", *args]))


class Forked:
    """The part of ``subprocess.Popen`` the tests use, for a forked daemon."""

    def __init__(self, process: Any) -> None:
        self._process = process
        self.pid: int = process.pid
        self.returncode: int | None = None
        self.args = [sys.executable, "-m", "memoryd", "serve"]

    def poll(self) -> int | None:
        if self.returncode is None and self._process.exitcode is not None:
            self.returncode = self._process.exitcode
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self.poll() is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def spawn_ready(serve_args: Sequence[str], *, log: Path | None, env: dict[str, str] | None = None) -> Forked:
    """``memoryd.launch.spawn_ready``'s twin: the same readiness wait, a forked child."""
    from memoryd.launch import start_ready

    def start(child_env: dict[str, str], _stderr: int) -> Forked:
        # The child opens the log itself, for appending, as the launcher's own descriptor
        # is: the same file and the same offset, with no descriptor to pass.
        process = _forkserver().Process(target=_serve, args=(list(serve_args), child_env, log), daemon=True)
        process.start()
        return Forked(process)

    return start_ready(start, log=log, env=env)
