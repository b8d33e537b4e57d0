"""Whether a store's ledger extends a replica's chain: the one check behind the daemon's
refusal to replicate over another machine's history.

A ledger row's hash covers every row before it, so a replica's newest row (n, hash) is in a
store's chain exactly when the store's row n has that hash. Pure: the callers read the heads
(the daemon from its store and a restored copy of the replica, memoryctl likewise) and hand
them here.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

#: how a store's ledger stands to a replica's: ``empty`` the replica has no ledger rows yet;
#: ``extends`` the replica's newest row is a row of the store's chain (the store is level
#: with it or ahead); ``behind`` the store's newest row is a row of the replica's chain and
#: the replica has rows after it; ``diverged`` the two chains part at some row.
Relation = Literal["empty", "extends", "behind", "diverged"]


class Head(NamedTuple):
    """A ledger row as a witness names it: its number and hash."""

    n: int
    hash: str


def relation(local: Head | None, local_at: str | None, replica: Head | None,
             replica_at: str | None = None) -> Relation:
    """How the store whose newest row is ``local`` stands to the replica whose newest row is
    ``replica``. ``local_at``: the store's hash of row ``replica.n`` (None when it has no
    such row); ``replica_at``: the replica's hash of row ``local.n`` (None when it has none,
    or it was not read: a store short of the replica is then taken to be behind it)."""
    if replica is None:
        return "empty"
    if local is None:
        return "behind"
    if replica.n <= local.n:
        return "extends" if local_at == replica.hash else "diverged"
    if replica_at is not None and replica_at != local.hash:
        return "diverged"
    return "behind"


def _row(head: Head | None) -> str:
    return "no ledger rows" if head is None else f"row {head.n} (hash {head.hash[:16]})"


def refusal(rel: Relation, local: Head | None, replica: Head | None, url: str, store: str) -> str:
    """Why a daemon on ``store`` must not replicate to ``url`` when the two stand as ``rel``
    (``behind`` or ``diverged``): both heads, and how to take the replica's history instead.
    Replicating would write this store's older or other history over the replica's."""
    if rel == "behind":
        why = (f"the replica at {url} holds ledger rows this store does not: its newest is {_row(replica)}, "
               f"this store's {_row(local)}. Another machine wrote to it since, or this store was truncated")
    else:
        why = (f"this store's ledger has diverged from the replica's at {url}: the replica's newest is "
               f"{_row(replica)}, which is not a row of this store's chain (its newest is {_row(local)}). "
               "Another machine wrote to the replica while this one wrote its own rows")
    # A diverged store's own heads file witnessed rows the replica lacks: the restore must be
    # told not to hold the copy to them.
    flag = " --no-heads" if rel == "diverged" else ""
    return (f"{why}. memoryd does not replicate over another machine's history. To take the replica's "
            f"history: stop memoryd and run memoryctl restore {url} --db {store}{flag} (the store you have is "
            "kept beside it)")


__all__ = ["Head", "Relation", "refusal", "relation"]
