"""Wire types of pruning frozen snapshots (``snapshots/prune``; the snapshot itself is in
types.py)."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from .types import _Env, _Out

#: how many pruned sessions one ``pruned`` ledger row names (a prune of more writes more rows)
PRUNE_ROW_SESSIONS = 1000


class SnapshotPruneParams(_Env):
    #: prune only the snapshots frozen before this time (ms since the epoch); None: all
    before: Annotated[int, Meta(ge=0, le=2**63 - 1)] | None = None


class SnapshotPruneResult(_Out):
    #: the sessions whose frozen snapshot was deleted (each had ended: no open connection held it)
    sessions: int
    #: the distinct texts deleted with them (no remaining session named them), and their UTF-8 bytes
    texts: int
    bytes: int
    #: the ``pruned`` ledger rows that record it (their n), oldest first; empty when nothing was pruned
    rows: list[int]


__all__ = ["PRUNE_ROW_SESSIONS", "SnapshotPruneParams", "SnapshotPruneResult"]
