"""The text index: every write indexes its entry in its own transaction, so the index holds
every entry once it commits. A store an earlier memoryd left with a tail (its entries above
the index's mark in no index yet) is indexed at the next start, and the mark goes: a store
without one has every entry indexed, which is also how an earlier memoryd reads it."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path
from typing import Any

import anyio
import pytest
from memoryd import ledger, queries, store
from memoryd.atomic import atomic
from memoryd.tx import Tx
from memoryd_protocol.constants import MEMORYD_SCHEMA_VERSION
from rawclient import socket_client, write_ctx
from test_query_plans import (
    assert_index_holds_the_entries,
    chain_newest_audit_row,
    entry,
    hits,
    leave_a_tail,
    opened,
    segments,
    write,
)


def indexed(conn: sqlite3.Connection, needle: str) -> int:
    """How many rows the index itself holds for ``needle``."""
    (n,) = conn.execute("SELECT count(*) FROM memoryd_fts WHERE memoryd_fts MATCH ?",
                        (queries.fts_phrase(needle),)).fetchone()
    return int(n)


def mark_row(path: Path) -> tuple[str, ...] | None:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        row = conn.execute("SELECT value FROM meta WHERE key = ?", (store.TEXT_MARK_KEY,)).fetchone()
        return None if row is None else tuple(row)


def test_a_new_store_has_no_mark_and_every_write_is_indexed_as_it_commits(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    with opened(path) as conn:
        write(conn, lambda c: [store.insert_entry(c, entry(n, f"fact {n}")) for n in range(3)])
        assert indexed(conn, "fact") == 3
        e = entry(1, "edited fact")
        write(conn, lambda c: store.update_entry(c, e))
        write(conn, lambda c: store.delete_entry(c, "e0002"))
        assert (indexed(conn, "fact"), indexed(conn, "edited")) == (2, 1)
        assert_index_holds_the_entries(conn)
    assert mark_row(path) is None


def test_a_batch_writes_its_index_rows_as_one_segment_and_a_rolled_back_step_takes_its_own_back(
        tmp_path: Path) -> None:
    """As the writer runs a batch: each step in its savepoint, a failed one rolled back with
    what it gathered in the Tx. An entry added and then changed or removed in the same batch
    reaches the index as it ends, or not at all; the index is one new segment."""
    with opened(tmp_path / "m.db") as conn:
        write(conn, lambda c: store.insert_entry(c, entry(0, "stored before")))
        before = segments(conn)
        a, b, c = entry(1, "added a"), entry(2, "added b"), entry(3, "added c")

        def edited(tx: Tx) -> None:
            a.text = "added a, edited"
            store.update_entry(tx, a)

        def fails(tx: Tx) -> None:
            store.insert_entry(tx, entry(4, "added d, rolled back"))
            store.delete_entry(tx, "e0000")
            raise RuntimeError("a job's bug")

        steps = [lambda tx: store.insert_entry(tx, a), lambda tx: store.insert_entry(tx, b), edited,
                 lambda tx: store.delete_entry(tx, b.id), fails, lambda tx: store.insert_entry(tx, c),
                 lambda tx: store.delete_entry(tx, "e0000")]
        with ledger.transaction(conn) as tx:
            for step in steps:
                saved = tx.save()
                try:
                    with atomic(conn, "step"):
                        step(tx)
                except RuntimeError:
                    tx.restore(saved)
        assert segments(conn) == before + 1
        assert sorted(hits(conn, "added", "index")) == ["e0001", "e0003"]
        assert (indexed(conn, "added a, edited"), indexed(conn, "before"), indexed(conn, "rolled")) == (1, 0, 0)
        assert_index_holds_the_entries(conn)


def test_a_start_indexes_the_tail_an_earlier_memoryd_left_and_drops_its_mark(tmp_path: Path) -> None:
    """Trusted (nothing rebuilt): only the tail is indexed, in the start's transaction."""
    path = tmp_path / "m.db"
    with opened(path) as conn:
        write(conn, lambda c: [store.insert_entry(c, entry(n, f"fact {n}")) for n in range(5)])
        leave_a_tail(conn, 3)
        chain_newest_audit_row(conn)
        assert store.trusted(conn) and indexed(conn, "fact") == 3
    assert mark_row(path) == ("3",)
    with opened(path) as conn:
        assert store.text_mark(conn) is None
        assert indexed(conn, "fact") == 5
        assert hits(conn, "fact", "index") == hits(conn, "fact", "scan")
        assert_index_holds_the_entries(conn)
    assert mark_row(path) is None


def test_a_rebuild_at_start_drops_the_mark(tmp_path: Path) -> None:
    """A store another program wrote (an entry added with dsh-memento's SQL beside a tail an
    earlier memoryd left) is rebuilt at start; the index then holds every entry, no mark."""
    path = tmp_path / "m.db"
    with opened(path) as conn:
        write(conn, lambda c: [store.insert_entry(c, entry(n, f"mine {n}")) for n in range(4)])
        leave_a_tail(conn, 3)
    with contextlib.closing(sqlite3.connect(path)) as ref:
        ref.execute("INSERT INTO entries (id, track, scope, workspace_key, text, source, created_at, updated_at, "
                    "session_id, agent_key, last_recalled, recall_count, tags, version) VALUES ('m1', 'user', "
                    "'user-global', '', 'theirs, by dsh-memento', 'dsh-memento', 5, 5, NULL, '', NULL, 0, '[]', 1)")
        ref.execute("DELETE FROM entries WHERE id = 'e0001'")
        ref.execute("INSERT INTO audit (ts, action, text) VALUES (6, 'add', 'theirs, by dsh-memento')")
        ref.commit()
    with opened(path) as conn:
        assert store.text_mark(conn) is None
        assert indexed(conn, "mine") == 3 and indexed(conn, "theirs") == 1
        assert sorted(hits(conn, "mine", "index")) == ["e0000", "e0002", "e0003"]
        assert_index_holds_the_entries(conn)


def test_a_schema_4_store_keeps_every_entry_indexed_without_a_mark(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    with opened(path) as conn:
        write(conn, lambda c: [store.insert_entry(c, entry(n, f"fact number {n}")) for n in range(4)])
        chain_newest_audit_row(conn)
        conn.execute("UPDATE meta SET value = '4' WHERE key = 'memoryd_schema'")
        assert store.trusted(conn)
    with opened(path) as conn:
        assert conn.execute("SELECT value FROM meta WHERE key = 'memoryd_schema'").fetchone() == (
            str(MEMORYD_SCHEMA_VERSION),)
        assert store.text_mark(conn) is None and indexed(conn, "fact number") == 4
        write(conn, lambda c: store.insert_entry(c, entry(9, "fact number 9")))
        assert len(hits(conn, "fact number", "index")) == 5
        assert_index_holds_the_entries(conn)


def test_a_store_a_memoryd_without_the_tail_wrote_again_is_rebuilt(tmp_path: Path) -> None:
    """A memoryd of schema 4 or older writes over a store of 5 with a tail: it indexes its own
    adds and never the tail it found, so the mark no longer says what is indexed. The next
    migration rebuilds."""
    path = tmp_path / "m.db"
    with opened(path) as conn:
        write(conn, lambda c: [store.insert_entry(c, entry(n, f"tail of 5 {n}")) for n in range(3)])
        leave_a_tail(conn, 0)
        write(conn, lambda c: store.insert_entry(c, entry(3, "tail of 5, and 4's own add")))
        chain_newest_audit_row(conn)
        conn.execute("UPDATE meta SET value = '4' WHERE key = 'memoryd_schema'")
        assert store.trusted(conn)
    with opened(path) as conn:
        assert store.text_mark(conn) is None
        assert indexed(conn, "tail of 5") == 4
        assert_index_holds_the_entries(conn)


BUDGETS = "[budgets.agent]\nworkspace = 10000000\nuser_global = 10000000\n"


@pytest.mark.inprocess
def test_seeded_imported_and_approved_entries_are_in_the_index_once_answered(
        daemon_factory: Any, tmp_path: Path) -> None:
    cfg = tmp_path / "big.toml"
    cfg.write_text(BUDGETS)
    n = 300
    rare = sorted(f"seeded fact {i} rare" for i in range(n) if i % 97 == 5)

    def in_index(db: Path, needle: str) -> int:
        with contextlib.closing(sqlite3.connect(db)) as conn:
            return indexed(conn, needle)

    async def found(raw: Any, text: str) -> list[str]:
        res = await raw.ok("memory/query", {"filter": {"text": text, "limit": 50}})
        assert res["total"] == len(res["entries"])
        return sorted(h["text"] for h in res["entries"])

    async def run(a: Any, b: Any) -> None:
        async with socket_client(a.socket_path) as raw:
            inputs = [{"track": "agent", "scope": "user-global",
                       "text": f"seeded fact {i}{' rare' if i % 97 == 5 else ''}"} for i in range(n)]
            await raw.ok("memory/seed", {"inputs": inputs, "write": write_ctx()})
            assert in_index(a.db_path, "seeded fact") == n
            assert await found(raw, "RARE") == rare
            env = await raw.ok("memory/export", {})
            p = await raw.ok("proposals/create", {"input": {"kind": "compaction", "track": "agent",
                                                            "scope": "user-global", "text": "approved rare text"},
                                                  "session": {"id": "s-p"}})
            await raw.ok("proposals/approve", {"id": p["id"], "write": write_ctx()})
            assert in_index(a.db_path, "approved rare") == 1
            assert await found(raw, "rare") == sorted([*rare, "approved rare text"])
        async with socket_client(b.socket_path) as raw:
            assert (await raw.ok("memory/import", {"envelope": env, "write": write_ctx("imp")}))["added"] == n
            assert in_index(b.db_path, "seeded fact") == n
            await raw.ok("memory/add", {"input": {"track": "agent", "scope": "user-global", "text": "added rare"},
                                        "write": write_ctx()})
            assert in_index(b.db_path, "added rare") == 1
            assert await found(raw, "rare") == sorted([*rare, "added rare"])

    a = daemon_factory("--config", str(cfg), db=tmp_path / "a.db", name="a")
    b = daemon_factory("--config", str(cfg), db=tmp_path / "b.db", name="b")
    anyio.run(run, a, b)
    a.stop()
    b.stop()
    for db in (tmp_path / "a.db", tmp_path / "b.db"):
        with contextlib.closing(sqlite3.connect(db)) as conn:
            assert_index_holds_the_entries(conn)
        assert mark_row(db) is None
