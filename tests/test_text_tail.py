"""The text index's tail: adds are indexed later, all at once (store.index_tail), and the
entries above the index's mark are every query's candidates meanwhile. Every write of an
indexed entry still keeps the index exact; a rowid reused below the mark is indexed as
written; starts set the mark (rebuild, migration) and keep a tail a daemon left; the
writer indexes the tail in a transaction of its own once it is long enough."""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from pathlib import Path
from typing import Any

import anyio
import pytest
from memoryd import queries, store, storefile, writer
from memoryd.tx import Tx
from memoryd_protocol.constants import MEMORYD_SCHEMA_VERSION
from rawclient import socket_client, write_ctx
from test_query_plans import assert_index_holds_the_entries, chain_newest_audit_row, entry, hits, merge, opened, write


def indexed(conn: sqlite3.Connection, needle: str) -> int:
    """How many rows the index itself (not the tail) holds for ``needle``."""
    (n,) = conn.execute("SELECT count(*) FROM memoryd_fts WHERE memoryd_fts MATCH ?",
                        (queries.fts_phrase(needle),)).fetchone()
    return int(n)


def mark_row(path: Path) -> tuple[str, ...] | None:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        row = conn.execute("SELECT value FROM meta WHERE key = ?", (store.TEXT_MARK_KEY,)).fetchone()
        return None if row is None else tuple(row)


def test_an_add_goes_to_the_tail_and_a_query_finds_it_there(tmp_path: Path) -> None:
    with opened(tmp_path / "m.db") as conn:
        assert store.text_mark(conn) == 0
        write(conn, lambda c: [store.insert_entry(c, entry(n, f"fact {n} tabby")) for n in range(3)])
        assert store.text_tail(conn) == 3 and indexed(conn, "tabby") == 0
        assert sorted(hits(conn, "TABBY", "index")) == ["e0000", "e0001", "e0002"] == sorted(hits(conn, "tabby", "scan"))
        merge(conn)
        assert (store.text_tail(conn), store.text_mark(conn), indexed(conn, "tabby")) == (0, 3, 3)
        assert sorted(hits(conn, "TABBY", "index")) == ["e0000", "e0001", "e0002"]
        assert_index_holds_the_entries(conn)


def test_an_update_or_delete_in_the_tail_writes_nothing_to_the_index(tmp_path: Path) -> None:
    with opened(tmp_path / "m.db") as conn:
        a, b = entry(1, "tail text one"), entry(2, "tail text two")
        write(conn, lambda c: (store.insert_entry(c, a), store.insert_entry(c, b)))
        a.text = "tail text edited"
        write(conn, lambda c: store.update_entry(c, a))
        write(conn, lambda c: store.delete_entry(c, b.id))
        (rows,) = conn.execute("SELECT count(*) FROM memoryd_fts_idx").fetchone()
        assert rows == 0  # not a term of the index written yet
        assert hits(conn, "text one", "index") == [] and hits(conn, "edited", "index") == ["e0001"]
        assert hits(conn, "two", "index") == []
        merge(conn)
        assert indexed(conn, "edited") == 1 and indexed(conn, "text one") == 0
        assert_index_holds_the_entries(conn)


def test_an_update_or_delete_of_an_indexed_entry_takes_its_old_text_out(tmp_path: Path) -> None:
    with opened(tmp_path / "m.db") as conn:
        a, b = entry(1, "indexed alpha"), entry(2, "indexed beta")
        write(conn, lambda c: (store.insert_entry(c, a), store.insert_entry(c, b)))
        merge(conn)
        write(conn, lambda c: store.insert_entry(c, entry(3, "in the tail")))  # above the mark
        a.text = "now gamma"
        write(conn, lambda c: store.update_entry(c, a))
        write(conn, lambda c: store.delete_entry(c, b.id))
        assert store.text_tail(conn) == 1
        assert indexed(conn, "alpha") == 0 and indexed(conn, "gamma") == 1 and indexed(conn, "beta") == 0
        assert hits(conn, "indexed", "index") == [] and hits(conn, "gamma", "index") == ["e0001"]
        assert_index_holds_the_entries(conn)


def test_a_rowid_reused_below_the_mark_is_indexed_as_written(tmp_path: Path) -> None:
    """entries has no AUTOINCREMENT: once the highest rowid is deleted, the next insert gets
    it again, at or below the mark, where no merge would ever look."""
    with opened(tmp_path / "m.db") as conn:
        write(conn, lambda c: [store.insert_entry(c, entry(n, f"fact {n}")) for n in range(3)])
        merge(conn)
        assert store.text_mark(conn) == 3
        write(conn, lambda c: store.delete_entry(c, "e0002"))
        write(conn, lambda c: store.insert_entry(c, entry(7, "reused rowid")))
        (rowid,) = conn.execute("SELECT rowid FROM entries WHERE id = 'e0007'").fetchone()
        assert rowid == 3 and store.text_mark(conn) == 3
        assert store.text_tail(conn) == 0 and indexed(conn, "reused") == 1
        assert hits(conn, "reused", "index") == ["e0007"]
        write(conn, lambda c: store.insert_entry(c, entry(8, "above it")))
        assert store.text_tail(conn) == 1 and indexed(conn, "above it") == 0
        assert_index_holds_the_entries(conn)


def test_the_tail_is_full_at_its_threshold_counted_not_guessed_from_rowids(tmp_path: Path) -> None:
    with opened(tmp_path / "m.db") as conn:
        t = store.TAIL_MERGE_AT
        write(conn, lambda c: [store.insert_entry(c, entry(n, f"fact {n}")) for n in range(t - 1)])
        assert not store.tail_full(conn)
        write(conn, lambda c: store.insert_entry(c, entry(t, "the last one")))
        assert store.tail_full(conn)
        write(conn, lambda c: store.delete_entry(c, "e0003"))  # rowids reach as far; the tail is shorter
        assert store.text_tail(conn) == t - 1 and not store.tail_full(conn)


def test_a_merge_rolled_back_leaves_the_index_and_the_mark_as_they_were(tmp_path: Path) -> None:
    """The mark moves in the merge's own transaction: a crash (or a fault) before its commit
    leaves the tail a tail, in the index nowhere and found by queries still."""
    with opened(tmp_path / "m.db") as conn:
        write(conn, lambda c: [store.insert_entry(c, entry(n, f"fact {n} kept")) for n in range(4)])
        conn.execute("BEGIN IMMEDIATE")
        assert store.index_tail(conn) == 4
        conn.execute("ROLLBACK")
        assert (store.text_mark(conn), store.text_tail(conn), indexed(conn, "kept")) == (0, 4, 0)
        assert len(hits(conn, "kept", "index")) == 4
        assert_index_holds_the_entries(conn)


def test_a_start_keeps_a_short_tail_and_indexes_a_long_one(tmp_path: Path) -> None:
    """A daemon killed before its merge: the tail is still there, trusted, nothing rebuilt;
    a tail as long as the writer's threshold is indexed by the start itself."""
    path = tmp_path / "m.db"
    with opened(path) as conn:
        write(conn, lambda c: [store.insert_entry(c, entry(n, f"short {n}")) for n in range(5)])
        chain_newest_audit_row(conn)
    with opened(path) as conn:
        assert store.trusted(conn)
        assert (store.text_mark(conn), store.text_tail(conn)) == (0, 5)
        assert len(hits(conn, "short", "index")) == 5
        many = range(5, 5 + store.TAIL_MERGE_AT)
        write(conn, lambda c: [store.insert_entry(c, entry(n, f"long {n}")) for n in many])
        chain_newest_audit_row(conn)
    with opened(path) as conn:
        top = 5 + store.TAIL_MERGE_AT
        assert (store.text_mark(conn), store.text_tail(conn)) == (top, 0)
        assert indexed(conn, "long") == store.TAIL_MERGE_AT and indexed(conn, "short") == 5
        assert_index_holds_the_entries(conn)


def failing_merge(message: str, code: int) -> Any:
    """``store.index_tail`` that fails with a store fault (``code``: SQLite's result code)
    after it has written the index rows and the mark: the rollback must take them out."""
    real = store.index_tail

    def failing(conn: sqlite3.Connection) -> int:
        real(conn)
        fault = sqlite3.OperationalError(message)
        fault.sqlite_errorcode = code
        raise fault

    return failing


def test_a_start_whose_merge_fails_opens_with_its_tail_unchanged(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The start's merge is optional, as the writer's is: a store fault in it (a full disk,
    say, where a start that writes nothing else opens) leaves the tail as it was, found by
    queries, and the store opens; the writer indexes it after its next commit."""
    path = tmp_path / "m.db"
    with opened(path) as conn:
        write(conn, lambda c: [store.insert_entry(c, entry(n, f"kept {n}")) for n in range(store.TAIL_MERGE_AT)])
        chain_newest_audit_row(conn)
    real = store.index_tail
    monkeypatch.setattr(store, "index_tail", failing_merge("database or disk is full", 13))  # SQLITE_FULL
    with opened(path) as conn:
        assert (store.text_mark(conn), store.text_tail(conn), indexed(conn, "kept")) == (0, store.TAIL_MERGE_AT, 0)
        assert len(hits(conn, "kept", "index")) == store.TAIL_MERGE_AT
    assert mark_row(path) == ("0",)
    monkeypatch.setattr(store, "index_tail", real)
    with opened(path) as conn:
        assert (store.text_mark(conn), store.text_tail(conn)) == (store.TAIL_MERGE_AT, 0)
        assert_index_holds_the_entries(conn)


def test_a_rebuild_at_start_sets_the_mark(tmp_path: Path) -> None:
    """A store another program wrote (here: an entry added with dsh-memento's SQL beside a
    tail memoryd left) is rebuilt at start; the index then holds every entry."""
    path = tmp_path / "m.db"
    with opened(path) as conn:
        write(conn, lambda c: [store.insert_entry(c, entry(n, f"mine {n}")) for n in range(3)])
        merge(conn)
        write(conn, lambda c: store.insert_entry(c, entry(3, "mine 3, in the tail")))
    with contextlib.closing(sqlite3.connect(path)) as ref:
        ref.execute("INSERT INTO entries (id, track, scope, workspace_key, text, source, created_at, updated_at, "
                    "session_id, agent_key, last_recalled, recall_count, tags, version) VALUES ('m1', 'user', "
                    "'user-global', '', 'theirs, by dsh-memento', 'dsh-memento', 5, 5, NULL, '', NULL, 0, '[]', 1)")
        ref.execute("DELETE FROM entries WHERE id = 'e0001'")
        ref.execute("INSERT INTO audit (ts, action, text) VALUES (6, 'add', 'theirs, by dsh-memento')")
        ref.commit()
    with opened(path) as conn:
        assert (store.text_mark(conn), store.text_tail(conn)) == (5, 0)
        assert indexed(conn, "mine") == 3 and indexed(conn, "theirs") == 1
        assert sorted(hits(conn, "mine", "index")) == ["e0000", "e0002", "e0003"]
        assert_index_holds_the_entries(conn)


# --- memoryd_schema 5: the mark ---------------------------------------------------------


def as_schema_4(conn: sqlite3.Connection) -> None:
    """What memoryd_schema 4 left: every entry indexed as written, no mark."""
    conn.execute("BEGIN IMMEDIATE")
    store.index_tail(conn)
    conn.execute("DELETE FROM meta WHERE key = ?", (store.TEXT_MARK_KEY,))
    conn.execute("UPDATE meta SET value = '4' WHERE key = 'memoryd_schema'")
    conn.execute("COMMIT")


def test_a_schema_4_store_gets_its_mark_at_the_highest_rowid(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    with opened(path) as conn:
        write(conn, lambda c: [store.insert_entry(c, entry(n, f"fact number {n}")) for n in range(4)])
        chain_newest_audit_row(conn)
        as_schema_4(conn)
        assert store.text_mark(conn) is None and store.trusted(conn)
        # without a mark, every write indexes as it did
        write(conn, lambda c: store.insert_entry(c, entry(4, "fact number 4")))
        assert indexed(conn, "number 4") == 1
        chain_newest_audit_row(conn)
    with opened(path) as conn:
        assert conn.execute("SELECT value FROM meta WHERE key = 'memoryd_schema'").fetchone() == (
            str(MEMORYD_SCHEMA_VERSION),)
        assert (store.text_mark(conn), store.text_tail(conn)) == (5, 0)
        assert indexed(conn, "fact number") == 5
        write(conn, lambda c: store.insert_entry(c, entry(9, "fact number 9")))
        assert store.text_tail(conn) == 1
        assert len(hits(conn, "fact number", "index")) == 6
        assert_index_holds_the_entries(conn)


def test_a_store_a_memoryd_without_the_tail_wrote_again_is_rebuilt(tmp_path: Path) -> None:
    """An older memoryd writes memoryd_schema 4 over 5, indexes its own adds and never the
    tail it found: the next migration rebuilds, as the mark no longer says what is indexed."""
    path = tmp_path / "m.db"
    with opened(path) as conn:
        write(conn, lambda c: [store.insert_entry(c, entry(n, f"tail of 5 {n}")) for n in range(3)])
        chain_newest_audit_row(conn)
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("UPDATE meta SET value = '4' WHERE key = 'memoryd_schema'")
        conn.execute("INSERT INTO memoryd_fts (rowid, text) SELECT rowid, text FROM entries WHERE 0")
        conn.execute("COMMIT")
        assert store.trusted(conn)
    with opened(path) as conn:
        assert (store.text_mark(conn), store.text_tail(conn)) == (3, 0)
        assert indexed(conn, "tail of 5") == 3
        assert_index_holds_the_entries(conn)


# --- the writer ---------------------------------------------------------------------------


def add_job(n: int, text: str) -> Any:
    def job(tx: Tx) -> None:
        store.insert_entry(tx, entry(n, text))
    return job


async def run_writer(path: Path, body: Any) -> None:
    storefile.prepare_path(path)
    w = await writer.Writer.open(path, storefile.inspect(path), 1000)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(w.run)
            await body(w)
            w.close()
    finally:
        await w.aclose()


@pytest.mark.anyio
async def test_the_writer_indexes_the_tail_once_it_is_long_enough(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    below = store.TAIL_MERGE_AT - 1

    async def body(w: writer.Writer) -> None:
        await w.submit(lambda t: [add_job(n, f"fact {n}")(t) for n in range(below)])
        await w.submit(writer._noop)
        assert await w.submit(lambda t: store.text_tail(t.conn)) == below  # not yet
        await w.submit(add_job(below, "the one that fills it"))
        # the merge ran after that commit, in its own transaction, before this job's
        assert await w.submit(lambda t: (store.text_tail(t.conn), store.text_mark(t.conn))) == (0, store.TAIL_MERGE_AT)
        await w.submit(add_job(below + 1, "the next tail"))
        assert await w.submit(lambda t: store.text_tail(t.conn)) == 1

    await run_writer(path, body)
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert indexed(conn, "fills it") == 1 and indexed(conn, "next tail") == 0
        assert_index_holds_the_entries(conn)


@pytest.mark.anyio
async def test_a_failed_merge_leaves_the_store_as_it_was_and_writes_go_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "m.db"
    real = store.index_tail

    async def body(w: writer.Writer) -> None:
        monkeypatch.setattr(store, "index_tail", failing_merge("disk I/O error", 10))  # SQLITE_IOERR
        with caplog.at_level(logging.ERROR, "memoryd.writer"):
            await w.submit(lambda t: [add_job(n, f"fact {n}")(t) for n in range(store.TAIL_MERGE_AT)])
            # (not durable: a batch of bookkeeping adds no entry, and no merge follows it)
            state = await w.submit(lambda t: (store.text_tail(t.conn), store.text_mark(t.conn), indexed(t.conn, "fact")),
                                   durable=False)
        assert state == (store.TAIL_MERGE_AT, 0, 0)
        assert [r.getMessage() for r in caplog.records] == [
            "indexing the text index's tail failed: STORE_UNAVAILABLE (io): disk I/O error"]
        monkeypatch.setattr(store, "index_tail", real)
        await w.submit(add_job(900, "after the fault"))  # the next commit tries again
        assert await w.submit(lambda t: store.text_tail(t.conn), durable=False) == 0

    await run_writer(path, body)
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert indexed(conn, "fact") == store.TAIL_MERGE_AT and indexed(conn, "the fault") == 1
        assert_index_holds_the_entries(conn)


# --- end to end: seed, import and approve land in the tail; queries find them -----------

BUDGETS = "[budgets.agent]\nworkspace = 10000000\nuser_global = 10000000\n"


@pytest.mark.inprocess
def test_seeded_imported_and_approved_entries_are_found_before_and_after_the_merge(
        daemon_factory: Any, tmp_path: Path) -> None:
    cfg = tmp_path / "big.toml"
    cfg.write_text(BUDGETS)
    n = store.TAIL_MERGE_AT + 20
    rare = sorted(f"seeded fact {i} rare" for i in range(n) if i % 97 == 5)

    async def found(raw: Any, text: str) -> list[str]:
        res = await raw.ok("memory/query", {"filter": {"text": text, "limit": 50}})
        assert res["total"] == len(res["entries"])
        return sorted(h["text"] for h in res["entries"])

    async def run(a: Any, b: Any) -> None:
        async with socket_client(a.socket_path) as raw:
            inputs = [{"track": "agent", "scope": "user-global",
                       "text": f"seeded fact {i}{' rare' if i % 97 == 5 else ''}"} for i in range(n)]
            await raw.ok("memory/seed", {"inputs": inputs, "write": write_ctx()})
            assert await found(raw, "RARE") == rare
            env = await raw.ok("memory/export", {})
            p = await raw.ok("proposals/create", {"input": {"kind": "compaction", "track": "agent",
                                                            "scope": "user-global", "text": "approved rare text"},
                                                  "session": {"id": "s-p"}})
            await raw.ok("proposals/approve", {"id": p["id"], "write": write_ctx()})
            assert await found(raw, "rare") == sorted([*rare, "approved rare text"])
        async with socket_client(b.socket_path) as raw:
            assert (await raw.ok("memory/import", {"envelope": env, "write": write_ctx("imp")}))["added"] == n
            await raw.ok("memory/add", {"input": {"track": "agent", "scope": "user-global", "text": "added rare"},
                                        "write": write_ctx()})
            assert await found(raw, "rare") == sorted([*rare, "added rare"])

    a = daemon_factory("--config", str(cfg), db=tmp_path / "a.db", name="a")
    b = daemon_factory("--config", str(cfg), db=tmp_path / "b.db", name="b")
    anyio.run(run, a, b)
    a.stop()
    b.stop()
    for db, tail in ((tmp_path / "a.db", 1), (tmp_path / "b.db", 1)):
        with contextlib.closing(sqlite3.connect(db)) as conn:
            # the seed (the import) was indexed after its commit; what came after is the tail
            assert store.text_tail(conn) == tail and indexed(conn, "seeded fact") == n
            assert_index_holds_the_entries(conn)
        assert mark_row(db) == (str(n),)
