"""``memoryctl watch`` as a user runs it: a subprocess against a real daemon process,
its lines read as the events arrive. It says on stderr once its watch is in place (the
readiness this test waits for); a change then prints one line on stdout."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import memoryd_client as mc
import msgspec

MEMORYCTL = [sys.executable, "-m", "memoryd_client"]
PROJ = "/home/u/proj"


class Lines:
    """The lines a child writes to one pipe, each waited for (bounded) as it arrives."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buf = b""
        self.eof = False

    def next(self, timeout: float = 30) -> str | None:
        """The next line, or None at EOF."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf and not self.eof:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no line within {timeout}s; so far {self.buf!r}"
            ready, _, _ = select.select([self.fd], [], [], remaining)
            if ready:
                chunk = os.read(self.fd, 65536)
                self.eof = not chunk
                self.buf += chunk
        if b"\n" not in self.buf:
            return None
        line, _, self.buf = self.buf.partition(b"\n")
        return line.decode()

    def rest(self, timeout: float = 30) -> list[str]:
        out: list[str] = []
        while (line := self.next(timeout)) is not None:
            out.append(line)
        return out


@contextmanager
def watching(d: Any, *args: str) -> Iterator[tuple[subprocess.Popen[bytes], Lines, Lines]]:
    proc = subprocess.Popen([*MEMORYCTL, "--socket", str(d.socket_path), "--no-autostart", "watch", *args],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    assert proc.stdout is not None and proc.stderr is not None
    out, err = Lines(proc.stdout.fileno()), Lines(proc.stderr.fileno())
    try:
        ready = err.next()
        assert ready is not None and ready.startswith("memoryctl: watching what session"), ready
        yield proc, out, err
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        proc.stdout.close()
        proc.stderr.close()


def writer(d: Any) -> mc.SyncClient:
    return mc.connect_sync(d.socket_path, session=mc.make_session("s-2", cwd=PROJ, agent_preset="coder"), timeout=30)


def test_watch_prints_a_line_per_visible_change_and_stops_quietly_on_ctrl_c(daemon: Any) -> None:
    with watching(daemon, "--session", "w-1", "--cwd", PROJ, "--agent", "coder") as (proc, out, err), \
            writer(daemon) as c:
        added = c.add({"track": "user", "scope": "user-global", "text": "Prefers tabs\nand more"})
        c.add({"track": "agent", "scope": "workspace", "text": "elsewhere"},
              {"agent": {"session": mc.make_session("s-3", cwd="/elsewhere", agent_preset="coder")}})
        c.add({"track": "agent", "scope": "workspace", "text": "Tests run with pnpm test"})
        c.remove({"track": "user", "scope": "user-global", "id": added.entry.id})
        short = added.entry.id[:8]
        assert out.next() == f"added    {short} user/user-global  Prefers tabs…  (session s-2)"
        second = out.next()
        assert second is not None and re.fullmatch(
            r"added    [0-9a-f]{8} agent/workspace  Tests run with pnpm test  \(session s-2\)", second), second
        assert out.next() == f"removed  {short} user/user-global  Prefers tabs…  (session s-2)"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        assert out.rest() == [] and err.rest() == []  # quiet


def test_watch_json_prints_each_event_and_stops_on_sigterm(daemon: Any) -> None:
    with watching(daemon, "--json", "--cwd", PROJ, "--agent", "coder") as (proc, out, _err), writer(daemon) as c:
        r = c.add({"track": "user", "scope": "user-global", "text": "Prefers tabs"})
        c.replace({"track": "user", "scope": "user-global", "match": "tabs", "text": "Prefers spaces"})
        first, second = json.loads(out.next() or ""), json.loads(out.next() or "")
        assert first == {"event": "memory/added", "params": {"entry": msgspec.to_builtins(r.entry), "sessionId": "s-2"}}
        assert second["event"] == "memory/updated" and second["params"]["sessionId"] == "s-2"
        assert (second["params"]["previous"]["text"], second["params"]["entry"]["text"]) == ("Prefers tabs",
                                                                                            "Prefers spaces")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


def test_watch_exits_3_when_the_daemon_goes_away(daemon: Any) -> None:
    d = daemon
    with watching(d) as (proc, out, err):
        assert d.stop() == 0
        assert proc.wait(timeout=30) == 3
        assert out.rest() == []
        (line,) = err.rest()
        assert line.startswith("error: CONNECTION_CLOSED: stopped watching: connection closed by the daemon"), line
