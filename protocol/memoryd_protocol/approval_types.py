"""Wire types of who decides: the kernel's facts of a process, the stdio relay's claim, and
the approver key's challenge (``approvers = "keyed"``). The rest of the approval types are
in types.py, which imports this module (so this one imports nothing of the package's).
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

#: an HMAC-SHA256 in hex, as ``approval/prove`` and ``approval/subscribe`` carry it
Proof = Annotated[str, Meta(min_length=1, max_length=128)]


class ProcessFacts(msgspec.Struct, rename="camel", kw_only=True):
    """A process as the kernel showed memoryd (SO_PEERCRED and /proc/<pid>, not as the client
    claims): ``start`` is its start time (clock ticks after boot, /proc/<pid>/stat field 22),
    which tells a reused pid apart; ``tty`` its controlling terminal (e.g. ``pts/3``; null:
    none); ``session`` its session id (stat field 6)."""

    pid: int
    start: int
    uid: int | None
    exe: str | None
    tty: str | None
    session: int


class RelayInfo(msgspec.Struct, rename="camel", kw_only=True):
    """What memoryd's own stdio relay (``memoryd serve --stdio``, ``memoryd mcp``) says of
    itself in its ``initialize``: the harness it copies lines for, its parent process. A
    claim, taken only from a process running memoryd's own interpreter whose parent it is."""

    harness_pid: Annotated[int, Meta(ge=1)]


class ApprovalChallenge(msgspec.Struct, rename="camel", kw_only=True):
    """``approval/challenge``: a fresh nonce for this connection, answered once, within a
    minute, by ``approval/prove`` or ``approval/subscribe`` with ``proof`` = hex
    HMAC-SHA256(approver key, "memoryd-approver-v2" NUL nonce NUL connection NUL pid NUL start).
    ``pid`` and ``start`` name the process memoryd sees on the connection: a client answers
    only a challenge that names itself, pid and start time, else something relays its
    connection and the proof would make that relay an approver."""

    nonce: str
    #: this connection as the ledger names it (``<run>/<id>``)
    connection: str
    #: the pid memoryd sees on this connection's socket
    pid: int
    #: that process's start time (clock ticks after boot, /proc/<pid>/stat field 22); a
    #: client refuses a challenge without it (an older daemon, or a relay that removed it)
    start: int | None = None


class ApprovalProofParams(msgspec.Struct, rename="camel", kw_only=True):
    """``approval/prove`` (``proof`` required) and ``approval/subscribe`` (optional: with it,
    the connection proves the key and subscribes in one call)."""

    proof: Proof | None = None


__all__ = ["ApprovalChallenge", "ApprovalProofParams", "ProcessFacts", "Proof", "RelayInfo"]
