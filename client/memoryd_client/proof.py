"""The approver key's proof binds to the connection it proves: the daemon's
``approval/challenge`` names the process it sees on the connection (pid and start time), and
the client answers only a challenge that names itself. A process that put itself between the
client and memoryd (a proxy at the socket path) is what the daemon sees on its own connection:
a proof of that challenge would make the proxy an approver, so none is made.
"""

from __future__ import annotations

import os
from pathlib import Path

from memoryd_protocol.approval_types import ApprovalChallenge

from .errors import ApproverRelayed


def own_start() -> int | None:
    """This process's start time (clock ticks after boot, /proc/self/stat field 22), as the
    daemon reads it; None without /proc."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            # after "pid (comm)", which may hold spaces and parens: field N is at index N - 3
            return int(f.read().rpartition(")")[2].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _exe(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None


def check_challenge(ch: ApprovalChallenge, socket: Path | None, socket_pid: int | None) -> int:
    """The challenge's start time, to sign, when ``ch`` names this process, pid and start time;
    else :class:`ApproverRelayed`. ``socket``, ``socket_pid``: the socket this client connected
    to and the process its peer credentials name, for the message."""
    me, start = os.getpid(), own_start()
    if ch.pid == me and ch.start is not None and ch.start == start:
        return ch.start
    where = str(socket) if socket is not None else "the socket"
    details = {"pid": ch.pid, "ownPid": me, "socketPid": socket_pid}
    # A pid alone may name another process: one in another pid namespace has this pid too.
    if ch.pid == me and ch.start is None:
        raise ApproverRelayed(f"the daemon's challenge names pid {ch.pid} without its start time, so it may name "
                              "another process than this one: another process relays this connection and removed it, "
                              "or memoryd is older than this client, so the approver key was not used; make sure "
                              f"{where} is memoryd's own socket (restart memoryd to put it back), then retry", details)
    if ch.pid == me and start is None:
        raise ApproverRelayed("this process cannot read its own start time (/proc/self/stat), so it cannot tell "
                              "whether the daemon's challenge names it, and the approver key was not used; run it where "
                              "/proc shows its own pid namespace", details)
    if ch.pid == me:  # the same pid, another process: a pid reused, or another pid namespace
        seen, mine = f"pid {ch.pid} started at clock tick {ch.start}", f"started at clock tick {start}"
    else:
        seen, mine = f"pid {ch.pid}", f"pid {me}"
    if socket_pid is not None:
        exe = _exe(socket_pid)
        message = (f"the daemon sees this connection as {seen}, not as this process ({mine}): another process "
                   f"relays it (pid {socket_pid}{', ' + exe if exe else ''}, serves {where}), so the approver key "
                   f"was not used; stop that process and restart memoryd, so that {where} is memoryd's own socket "
                   "again, then retry")
    else:
        message = (f"the daemon sees this connection as {seen}, not as this process ({mine}): another process "
                   f"relays it, or this process runs in another pid namespace than memoryd, so the approver key "
                   f"was not used; run it where memoryd runs, and make sure {where} is memoryd's own socket "
                   "(restart memoryd to put it back)")
    raise ApproverRelayed(message, details)


__all__ = ["check_challenge", "own_start"]
