"""``daemon/status``'s ``replication``: where the store is replicated, and how far behind.

The lag is the ledger's: the newest row the replica holds against this daemon's head, in
rows and in seconds since the oldest row the replica still lacks was committed.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

#: What each state means is the ``state`` field's description below.
ReplicationState = Literal["starting", "replicating", "behind", "unreachable", "restarting", "stopped", "diverged"]


class ReplicationStatus(msgspec.Struct, rename="camel", kw_only=True):
    """Replication of the store by Litestream ([replicate] in the config)."""

    url: Annotated[str, Meta(description="The replica's URL, without a password or a query.")]
    state: Annotated[ReplicationState, Meta(description=(
        "starting, replicating (the replica held the head when last read), behind, unreachable (the replica "
        "could not be read, or Litestream reported an error), restarting (Litestream exited; started again "
        "after a back-off), stopped, or diverged (the replica's newest ledger row is not a row of this store's "
        "chain: another machine wrote to it, and memoryd does not replicate over it)."))]
    head_n: Annotated[int | None, Meta(description="The local ledger head's row number (null: an empty ledger).")]
    replica_n: Annotated[int | None, Meta(description=(
        "The newest ledger row the replica held when last read (null: none yet, or not read yet)."))]
    lag_rows: Annotated[Annotated[int, Meta(ge=0)] | None, Meta(description=(
        "Ledger rows the replica lacks: headN - replicaN (null: the replica not read yet)."))]
    lag_s: Annotated[Annotated[float, Meta(ge=0)] | None, Meta(description=(
        "Seconds since the oldest row the replica lacks was committed; 0 when it lacks none (null: not read yet)."))]
    read_at: Annotated[int | None, Meta(description=(
        "When the replica was last read (ms since the epoch; null: not yet)."))]
    restarts: Annotated[int, Meta(ge=0, description="How often Litestream was started again after it exited.")]
    error: Annotated[str | None, Meta(description=(
        "The last error reading the replica or reported by Litestream, while the state is unreachable or "
        "restarting (null otherwise). Never holds a credential."))] = None
