"""Wire types of the ledger's heads and of accepting a change made outside memoryd (the
rest of the audit methods' types are in types.py)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from .types import _Env, _In, _Out

#: how many witnessed heads one ``audit/verify`` may check (about 90 bytes each: within the
#: default max_message_bytes)
MAX_HEADS = 40_000
#: a ledger row's n is an SQLite integer
RowNumber = Annotated[int, Meta(ge=1, le=2**63 - 1)]
Sha256 = Annotated[str, Meta(pattern="^[0-9a-f]{64}$")]


class StoreFile(_Out):
    """The store file as a clean stop left it (every connection closed, its WAL folded in):
    a write by any program since changes its status-change time, which no process of the
    user can set back."""

    ino: int
    size: int
    ctime_ns: int


class WitnessedHead(_Out, omit_defaults=True):
    """One line of the heads file: the ledger's newest row when the daemon witnessed it."""

    store: str
    n: Annotated[int, Meta(ge=1)]
    hash: str
    ts: int
    event: Literal["start", "stop", "every"]
    #: at a stop: the file as it was left (None when it could not be read, or a WAL remained)
    file: StoreFile | None = None


class HeadRef(_In):
    n: RowNumber
    hash: Sha256


class AuditVerifyParams(_Env):
    #: heads witnessed outside the store (``memoryctl audit heads``): each must still be in
    #: the chain as witnessed
    heads: Annotated[list[HeadRef], Meta(max_length=MAX_HEADS)] | None = None


class AuditAcceptParams(_Env):
    #: the ``foreign`` ledger row to accept
    n: RowNumber


class AuditAccepted(_Out):
    #: the ``accepted`` row that records it
    n: int
    foreign: int


_head_decoder = msgspec.json.Decoder(WitnessedHead)


def parse_heads(data: bytes, store: str | None = None) -> list[WitnessedHead]:
    """The heads a heads file's bytes hold, oldest first (only ``store``'s, when given);
    lines that are not a head are skipped."""
    heads = []
    for line in data.splitlines():
        try:
            head = _head_decoder.decode(line)
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue
        if store is None or head.store == store:
            heads.append(head)
    return heads
