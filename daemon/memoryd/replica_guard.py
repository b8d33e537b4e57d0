"""No two writers: before memoryd replicates its store, the replica's newest ledger row must
be a row of the store's own chain.

Litestream ships this store's pages over whatever the replica holds. When another machine
took over (restored the replica and wrote to it), this store's history has parted from the
replica's, and replicating it would overwrite the other machine's. So before each
``litestream replicate``, the replica is copied (:mod:`memoryd.litestream`), its newest row
compared with the store's (:mod:`memoryd_protocol.replica_chain`), and a store that is
behind the replica or diverged from it is refused, naming both heads and the restore that
takes the replica's history. The lag reader judges each copy it reads the same way
(:func:`read`), so a take-over while Litestream runs is found at its next look.
"""

from __future__ import annotations

import contextlib
import sqlite3
import tempfile
from pathlib import Path

import anyio
from memoryd_protocol.replica_chain import Head, Relation, refusal, relation

from . import litestream
from .errors import DaemonError
from .replica import Replica

_NEWEST = "SELECT n, hash FROM memoryd_ledger ORDER BY n DESC LIMIT 1"
_AT = "SELECT hash FROM memoryd_ledger WHERE n = ?"


class ReplicaDiverged(DaemonError):
    """The store's ledger does not extend the replica's chain: replicating would overwrite
    another machine's history. The message names both heads and how to restore."""


def ledger_head(path: Path, at: int | None = None) -> tuple[Head | None, str | None]:
    """The newest row of the store at ``path`` and its hash of row ``at``, read only, in one
    read transaction."""
    with contextlib.closing(sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True,
                                            isolation_level=None)) as conn:
        conn.execute("BEGIN")
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "memoryd_ledger" not in tables:
            return None, None
        row = conn.execute(_NEWEST).fetchone()
        found = conn.execute(_AT, (at,)).fetchone() if at is not None else None
    newest = None if row is None else Head(int(row[0]), str(row[1]))
    return newest, (None if found is None else str(found[0]))


async def read(replica: Replica, store: Path, *, timeout_s: float = litestream.RESTORE_TIMEOUT_S
               ) -> tuple[Relation, Head | None]:
    """How ``store`` stands to a copy of ``replica`` (``empty`` or ``extends``), and the
    copy's newest ledger row (None: no backup yet, or an empty ledger). Raises
    :class:`ReplicaDiverged` when the store is behind the replica or diverged from it, and
    LitestreamError when the replica cannot be read."""
    with tempfile.TemporaryDirectory(prefix="memoryd-replica-check-") as tmp:
        copy = Path(tmp) / "replica.db"
        try:
            await litestream.restore(replica, copy, timeout_s=timeout_s)
        except litestream.NoBackup:
            return "empty", None
        return await anyio.to_thread.run_sync(_judge, replica, copy, store)


def _judge(replica: Replica, copy: Path, store: Path) -> tuple[Relation, Head | None]:
    try:
        theirs, _ = ledger_head(copy)
        ours, ours_at = ledger_head(store, None if theirs is None else theirs.n)
        _, theirs_at = ledger_head(copy, None if ours is None else ours.n)
    except sqlite3.Error as exc:
        raise litestream.LitestreamError(f"the copy restored from {replica.shown_url} cannot be read as a "
                                          f"memoryd store: {exc}") from None
    rel = relation(ours, ours_at, theirs, theirs_at)
    if rel in ("behind", "diverged"):
        raise ReplicaDiverged(refusal(rel, ours, theirs, replica.shown_url, str(store)))
    return rel, theirs
