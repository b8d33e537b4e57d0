"""How a store's ledger stands to a replica's (memoryd_protocol.replica_chain): the pure
check behind the daemon's refusal to replicate over another machine's history."""

from __future__ import annotations

from memoryd_protocol.replica_chain import Head, refusal, relation

A, B, C = "a" * 64, "b" * 64, "c" * 64


def test_an_empty_replica_witnesses_nothing() -> None:
    assert relation(Head(5, A), None, None) == "empty"
    assert relation(None, None, None) == "empty"


def test_a_store_level_with_or_ahead_of_the_replica_extends_it() -> None:
    assert relation(Head(5, A), A, Head(5, A)) == "extends"
    assert relation(Head(9, B), A, Head(5, A)) == "extends"


def test_a_store_whose_row_differs_from_the_replicas_newest_has_diverged() -> None:
    assert relation(Head(5, B), B, Head(5, A)) == "diverged"
    assert relation(Head(9, B), C, Head(5, A)) == "diverged"
    assert relation(Head(9, B), None, Head(5, A)) == "diverged"  # row 5 gone from a longer chain


def test_a_store_short_of_the_replica_is_behind_unless_its_newest_row_differs() -> None:
    assert relation(Head(3, C), None, Head(5, A), C) == "behind"
    assert relation(Head(3, C), None, Head(5, A)) == "behind"  # the replica's row 3 not read
    assert relation(Head(3, C), None, Head(5, A), B) == "diverged"
    assert relation(None, None, Head(5, A)) == "behind"


def test_the_refusal_names_both_heads_and_how_to_restore() -> None:
    said = refusal("diverged", Head(9, B), Head(5, A), "file:///r", "/s/memory.db")
    assert said == (
        f"this store's ledger has diverged from the replica's at file:///r: the replica's newest is row 5 (hash "
        f"{A[:16]}), which is not a row of this store's chain (its newest is row 9 (hash {B[:16]})). Another machine "
        "wrote to the replica while this one wrote its own rows. memoryd does not replicate over another machine's "
        "history. To take the replica's history: stop memoryd and run memoryctl restore file:///r --db "
        "/s/memory.db --no-heads (the store you have is kept beside it)")
    behind = refusal("behind", Head(3, C), Head(5, A), "file:///r", "/s/memory.db")
    assert behind.startswith(f"the replica at file:///r holds ledger rows this store does not: its newest is row 5 "
                             f"(hash {A[:16]}), this store's row 3 (hash {C[:16]}).")
    assert behind.endswith("run memoryctl restore file:///r --db /s/memory.db (the store you have is kept beside it)")
