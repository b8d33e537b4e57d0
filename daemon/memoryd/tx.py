"""A write transaction's state, handed to every function that writes in it.

The writer makes one :class:`Tx` per batch (``ledger.Anchor.begin``); everything else that
writes (start-up, tools, tests) makes one with ``ledger.transaction``. Store and ledger
functions read and update it instead of asking the store again: the ledger's newest row,
the connection rows already written, and the usage counts and text index rows that are
written once per batch (``store.flush``).
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from typing import NamedTuple

Cell = tuple[str, str]
Usage = dict[Cell, int]


class Saved(NamedTuple):
    tip: tuple[int, str] | None
    written: set[str]
    counts: dict[Cell, tuple[int, int]]
    usage: Usage
    index_rows: dict[int, str]
    unindex_rows: dict[int, str]


@dataclass(eq=False)
class Tx:
    conn: sqlite3.Connection
    #: usage per track × scope as the transaction leaves it: a write job adds its deltas
    usage: Usage
    #: the ledger's newest row (n, hash) in this transaction; None while the ledger is empty
    tip: tuple[int, str] | None
    #: refs of connection rows committed before this transaction (shared, never changed here)
    known: frozenset[str] | set[str] = frozenset()
    #: refs of connection rows this transaction wrote
    written: set[str] = field(default_factory=set)
    #: entries and used units per cell that ``store.flush`` adds to memoryd_usage
    counts: dict[Cell, tuple[int, int]] = field(default_factory=dict)
    #: rowid → text of the entries the text index gets, and of those it loses (with the text
    #: it holds for them), written by ``store.flush``
    index_rows: dict[int, str] = field(default_factory=dict)
    unindex_rows: dict[int, str] = field(default_factory=dict)
    #: the entries' number, when this transaction counted them again (foreign.recount)
    entries: int | None = None

    def save(self) -> Saved:
        """What ``restore`` puts back when the savepoint around a step is rolled back."""
        return Saved(self.tip, set(self.written), dict(self.counts), dict(self.usage), dict(self.index_rows),
                     dict(self.unindex_rows))

    def restore(self, saved: Saved) -> None:
        self.tip, self.written, self.counts, self.usage, self.index_rows, self.unindex_rows = saved
