"""Who is on the other end of a connection, as the kernel says (SO_PEERCRED and /proc), not
as the client claims.

A connection's facts are read when it opens (pid, start time, uid, executable, controlling
terminal, session) and again whenever it makes a decision: a pid that is gone by then, or
whose start time changed, means the socket was handed to another process. The /proc parent
chain, read at decision time, tells an approver apart from the writer's own processes, its
ancestors and its descendants. memoryd's own stdio relay is told apart by its executable
(memoryd's interpreter) and by its saying so; what it says of its harness is a claim.
"""

from __future__ import annotations

import os
import socket
import struct
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memoryd_protocol.approval_types import ProcessFacts

#: How far up the parent chain a lineage goes (a loop in /proc cannot happen; a bound anyway).
MAX_ANCESTORS = 4096


@dataclass(frozen=True, slots=True)
class Facts:
    """One process as /proc/<pid> showed it at one moment."""

    pid: int
    #: clock ticks after boot (stat field 22): with the pid, the process's identity
    start: int
    ppid: int
    uid: int | None
    exe: str | None
    tty: str | None
    session: int

    def wire(self) -> ProcessFacts:
        return ProcessFacts(pid=self.pid, start=self.start, uid=self.uid, exe=self.exe, tty=self.tty,
                            session=self.session)


def _stat_fields(pid: int) -> list[str]:
    """``/proc/<pid>/stat`` after "pid (comm)", which may contain spaces and parens: state
    (field 3) first, so field N is at index N - 3."""
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()


def _proc_uid(pid: int) -> int | None:
    """The effective uid of ``pid`` from /proc (stdio's parent: no socket to ask)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Uid:"):
                return int(line.split()[2])
    except (OSError, ValueError, IndexError):
        pass
    return None


def tty_name(tty_nr: int) -> str | None:
    """The name of a controlling terminal from stat's tty_nr (``pts/3``, ``tty2``), or None
    for none; a device without a well-known name is ``major:minor``."""
    if tty_nr == 0:
        return None
    major, minor = (tty_nr >> 8) & 0xFFF, (tty_nr & 0xFF) | ((tty_nr >> 12) & 0xFFF00)
    if 136 <= major <= 143:  # Unix98 pseudo-terminals
        return f"pts/{(major - 136) * 256 + minor}"
    if major == 4:
        return f"tty{minor}" if minor < 64 else f"ttyS{minor - 64}"
    return f"{major}:{minor}"


def read_facts(pid: int, uid: int | None = None) -> Facts | None:
    """``pid`` as /proc shows it now; None when there is no such process (a zombie has
    exited: only its parent has yet to reap it). ``uid``: the socket's word for it."""
    try:
        fields = _stat_fields(pid)
        if fields[0] in ("Z", "X"):
            return None
        ppid, session, tty_nr, start = int(fields[1]), int(fields[3]), int(fields[4]), int(fields[19])
    except (OSError, ValueError, IndexError):
        return None
    try:
        exe: str | None = os.readlink(f"/proc/{pid}/exe")
    except OSError:  # not ours to inspect
        exe = None
    return Facts(pid, start, ppid, _proc_uid(pid) if uid is None else uid, exe, tty_name(tty_nr), session)


def has_terminal(pid: int) -> bool:
    """The process has a controlling terminal (tty_nr is not 0)."""
    try:
        return int(_stat_fields(pid)[4]) != 0
    except (OSError, ValueError, IndexError):
        return False


def lineage(pids: Iterable[int]) -> set[int]:
    """The pids and every ancestor of theirs, as /proc has them now. Init (pid 1) is left
    out: it is everyone's ancestor, and would make every process related to every other."""
    seen: set[int] = set()
    for pid in pids:
        while pid > 1 and pid not in seen and len(seen) < MAX_ANCESTORS:
            seen.add(pid)
            try:
                pid = int(_stat_fields(pid)[1])
            except (OSError, ValueError, IndexError):
                break
    return seen


@dataclass(frozen=True)
class PeerProcess:
    """The process on the other end of a connection, as the kernel reports it. ``pid`` is the
    process shown to people (None when the peer lives in another pid namespace): the socket's
    own, or for memoryd's stdio relay the harness it declared (see :func:`declare_relay`)."""

    pid: int | None
    exe: str | None = None
    uid: int | None = None
    #: the stdio relay's own pid, when ``pid`` is the harness behind it
    via: int | None = None
    #: the kernel's facts of the process on the socket (the relay's own, for a relay), at connect
    facts: Facts | None = None

    @classmethod
    def of(cls, pid: int, uid: int | None = None) -> PeerProcess | None:
        """The peer ``pid`` as it is now (at connect)."""
        if pid <= 0:
            return None if uid is None else cls(None, None, uid)
        facts = read_facts(pid, uid)
        if facts is None:  # gone already, or no /proc
            return cls(pid, None, _proc_uid(pid) if uid is None else uid)
        return cls(pid, facts.exe, facts.uid, facts=facts)

    def pids(self) -> frozenset[int]:
        """The pid shown and the relay's it came through (empty when the kernel gave none)."""
        return frozenset(p for p in (self.pid, self.via) if p is not None)

    def interactive(self) -> bool:
        """Each of its processes has a controlling terminal (and it has a known one)."""
        pids = self.pids()
        return bool(pids) and all(has_terminal(pid) for pid in pids)


class NotThatProcess(Exception):
    """The connection's process is not there to be asked (``str`` says why, and what to do)."""


def now(peer: PeerProcess | None) -> Facts:
    """The connection's socket process as it is now: the one that connected, still running.
    NotThatProcess when memoryd never saw it, it exited, or its pid is another process's."""
    if peer is None or peer.facts is None:
        raise NotThatProcess("memoryd cannot see the process on the other end of this connection (it runs in "
                             "another pid namespace), so it cannot make decisions; run the deciding program where "
                             "memoryd can see it")
    then = peer.facts
    facts = read_facts(then.pid, then.uid)
    if facts is None:
        raise NotThatProcess(f"the process that opened this connection (pid {then.pid}) has exited: its socket was "
                             "handed to another process, which cannot make decisions; decide from a connection "
                             "the deciding process opened itself")
    if facts.start != then.start:
        raise NotThatProcess(f"pid {then.pid} is no longer the process that opened this connection (its start time "
                             "changed): its socket was handed to another process, which cannot make decisions; "
                             "decide from a connection the deciding process opened itself")
    return facts


def related(a: PeerProcess | None, b: PeerProcess | None) -> bool:
    """Whether ``a`` and ``b`` may be one process, or one is the other's ancestor, by the
    /proc parent chains now. Unknown pids (another pid namespace): two unknowns may be one
    process; a known pid is never an unknown one's."""
    pa = a.pids() if a is not None else frozenset()
    pb = b.pids() if b is not None else frozenset()
    if not pa or not pb:
        return not pa and not pb
    return not pa.isdisjoint(lineage(pb)) or not pb.isdisjoint(lineage(pa))


def own_exe() -> str:
    """memoryd's own interpreter: what a process must run to be its stdio relay."""
    try:
        return os.readlink("/proc/self/exe")
    except OSError:
        return os.path.realpath(sys.executable)


def declare_relay(peer: PeerProcess | None, harness_pid: int) -> PeerProcess:
    """The peer of a connection whose process said it is memoryd's stdio relay for
    ``harness_pid``: shown as that harness, with the relay's pid in ``via``. NotThatProcess
    unless the process runs memoryd's own interpreter, is still the one that connected, has
    not declared before, and is a child of ``harness_pid``."""
    facts = now(peer)
    assert peer is not None
    if peer.via is not None:
        raise NotThatProcess("this connection has declared its relay already")
    mine = own_exe()
    if facts.exe != mine:
        raise NotThatProcess(f"its executable {facts.exe or '(unreadable)'} is not memoryd's interpreter {mine}")
    if facts.ppid != harness_pid:
        raise NotThatProcess(f"it names pid {harness_pid} as its harness, but its parent is pid {facts.ppid}")
    if harness_pid <= 1:
        return peer  # orphaned already: nobody to show but the relay
    harness = read_facts(harness_pid)
    return PeerProcess(harness_pid, harness.exe if harness else None, harness.uid if harness else None,
                       via=facts.pid, facts=peer.facts)


_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def peer_credentials(sock: Any) -> tuple[int, int, int] | None:
    """SO_PEERCRED of a connected Unix socket (or asyncio's wrapper of one): the peer's
    (pid, uid, gid) at connect time, or None when the kernel cannot say."""
    try:
        pid, uid, gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    except (OSError, AttributeError, struct.error):  # no socket, not a Unix one, or not Linux
        return None
    return pid, uid, gid
