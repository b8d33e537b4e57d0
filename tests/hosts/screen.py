"""A host's interactive TUI in a real terminal: a detached tmux session on a private server.

:class:`Screen` starts a command in a tmux pane of a fixed size (its own tmux server, on a
socket of its own, so parallel tests never meet), types into it (``send-keys``) and reads
what it shows (``capture-pane``). It waits on the terminal's output, not on a clock: the
pane's output is piped (``pipe-pane``) into a FIFO a thread reads, and each chunk that
arrives wakes :meth:`Screen.wait_for`, which captures the pane again and tests it. Every
wait is bounded. Closing it kills the tmux server, and with it the command.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

TMUX = "/usr/bin/tmux"


class Screen:
    def __init__(self, argv: Sequence[str], *, cwd: Path, env: Mapping[str, str], width: int = 200,
                 height: int = 50) -> None:
        self.tmux = shutil.which("tmux") or TMUX
        self._dir = Path(tempfile.mkdtemp(prefix="screen-", dir="/tmp"))  # short: a socket path
        self.socket = self._dir / "tmux.sock"
        self.output = self._dir / "pane.fifo"
        os.mkfifo(self.output, 0o600)
        self._cond = threading.Condition()
        self._chunks = 0  # output chunks the pane has written so far
        self._closed = False
        # the command's environment is exactly ``env`` (not the tmux server's, nor tmux's
        # own TERM): ``env -i``
        command = ["env", "-i", *(f"{k}={v}" for k, v in env.items()), *argv]
        self._run("-f", "/dev/null", "new-session", "-d", "-s", "host", "-x", str(width), "-y", str(height),
                  "-c", str(cwd), *command, ";", "set-option", "-t", "host", "remain-on-exit", "on")
        self._reader = threading.Thread(target=self._read, name="screen-output", daemon=True)
        self._reader.start()
        try:
            self._run("pipe-pane", "-t", "host", f"exec cat > {self.output}")
        except BaseException:
            self.close()
            raise

    # --- tmux ---------------------------------------------------------------------------

    def _run(self, *args: str) -> str:
        r = subprocess.run([self.tmux, "-S", str(self.socket), *args], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, f"tmux {' '.join(args[:3])}: {r.stderr}"
        return r.stdout

    def _read(self) -> None:
        # open blocks until pipe-pane's cat opens the other end
        with open(self.output, "rb", buffering=0) as fifo:
            while fifo.read(65536):
                with self._cond:
                    self._chunks += 1
                    self._cond.notify_all()
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # --- what the test does -------------------------------------------------------------

    def text(self, joined: bool = False) -> str:
        """The pane as it shows now, one line per row, trailing blanks dropped; ``joined``:
        a line the terminal wrapped is one line."""
        out = self._run("capture-pane", "-p", *(["-J"] if joined else []), "-t", "host")
        return "\n".join(line.rstrip() for line in out.splitlines())

    def send(self, *keys: str, literal: bool = False) -> None:
        """``send-keys``: key names (``Enter``, ``Escape``, ``Left``), or with ``literal``
        the characters of a text."""
        self._run("send-keys", "-t", "host", *(["-l"] if literal else []), *keys)

    def type(self, text: str) -> None:
        self.send(text, literal=True)

    def wait_for(self, pred: Callable[[str], bool], timeout: float = 60, what: str = "", joined: bool = False) -> str:
        """The pane's text once ``pred`` accepts it: tested now, then again each time the
        pane writes more output, until ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            with self._cond:
                seen = self._chunks
            text = self.text(joined)
            if pred(text):
                return text
            with self._cond:
                left = deadline - time.monotonic()
                arrived = self._cond.wait_for(lambda seen=seen: self._chunks != seen or self._closed, max(left, 0))
                if not arrived:
                    raise AssertionError(f"the screen never showed {what or pred}; it shows:\n{text}")
                if self._closed and self._chunks == seen:
                    text = self.text(joined)
                    if pred(text):
                        return text
                    raise AssertionError(f"the pane closed its output before it showed {what or pred}:\n{text}")

    def press_until(self, key: str, arrived: Callable[[float], bool], what: str, *, wait: float = 1.0,
                    timeout: float = 60) -> int:
        """Press ``key`` until the event it should cause happens: ``arrived(t)`` waits for
        that event up to ``t`` seconds and says whether it came. Pressed once, then again
        each time ``wait`` seconds pass without it (a TUI may refuse a key that comes too
        soon: Claude Code's dialogs in their first 150 ms). The number of presses it took."""
        deadline = time.monotonic() + timeout
        presses = 0
        while True:
            self.send(key)
            presses += 1
            if arrived(wait):
                return presses
            assert time.monotonic() < deadline, f"{presses} × {key}: never {what}; the screen shows:\n{self.text()}"

    def close(self) -> None:
        subprocess.run([self.tmux, "-S", str(self.socket), "kill-server"], capture_output=True, timeout=30)
        # a reader still blocked in open() (pipe-pane never started): open the write end
        try:
            fd = os.open(self.output, os.O_WRONLY | os.O_NONBLOCK)
            os.close(fd)
        except OSError:
            pass
        self._reader.join(10)
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> Screen:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
