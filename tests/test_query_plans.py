"""Query plans: the trigram index path returns exactly the rows of the plain scan, which
are exactly the protocol's rule (substring, ASCII letters folded), on random stores and
needles with CJK, emoji and LIKE's own metacharacters; and the index follows every write,
including those of another program (rebuilt at start when the entries moved)."""

from __future__ import annotations

import contextlib
import itertools
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from memoryd import foreign, ledger, queries, store, storefile
from memoryd.tx import Tx
from memoryd_protocol.constants import MEMORYD_SCHEMA_VERSION, QUERY_HARD_CAP
from memoryd_protocol.text import ascii_fold, utf16_len
from memoryd_protocol.types import Entry

#: letters that fold, letters that must not (non-ASCII case pairs), CJK, emoji, and
#: the characters LIKE and FTS5 treat specially
ALPHABET = "aAbBzZ01 ÉéßẞİıΣσ記憶漢字😀👍🏽%_\\\"'*^-:()"
texts = st.text(alphabet=ALPHABET, min_size=1, max_size=24)


def reference(entries: list[Entry], needle: str) -> set[str]:
    folded = ascii_fold(needle)
    return {e.id for e in entries if folded in ascii_fold(e.text)}


def entry(n: int, text: str, track: str = "user", scope: str = "user-global") -> Entry:
    return Entry(id=f"e{n:04d}", track=track, scope=scope, workspace_key="", agent_key="",  # type: ignore[arg-type]
                 text=text, source="t", tags=[], version=1, created_at=n, updated_at=n, last_recalled=None,
                 recall_count=0, session_id=None)


@contextlib.contextmanager
def opened(path: Path) -> Iterator[sqlite3.Connection]:
    storefile.prepare_path(path)
    conn = storefile.open_store(path, storefile.inspect(path))
    try:
        foreign.open_chain(conn)  # as the daemon's start: the chain, and the counts
        yield conn
    finally:
        conn.close()


def write(conn: sqlite3.Connection, fn: Callable[[Tx], object]) -> None:
    """``fn(tx)`` in one write transaction, as the writer runs a job."""
    with ledger.transaction(conn) as tx:
        fn(tx)


def chain_newest_audit_row(conn: sqlite3.Connection) -> None:
    """What memoryd's ledger does for every audit row it writes, in miniature."""
    conn.execute("BEGIN IMMEDIATE")
    seq = store.audit(conn, "add", track=None, scope=None, entry_id=None, text=None, outcome=None, source=None,
                      session_id=None, ts=1)
    conn.execute("INSERT INTO memoryd_ledger (n, ts, kind, audit_seq, body, prev, hash) VALUES "
                 "((SELECT coalesce(max(n), 0) + 1 FROM memoryd_ledger), 1, 'audit', ?, '{}', '', '')", (seq,))
    conn.execute("COMMIT")


def computed_usage(conn: sqlite3.Connection) -> dict[tuple[str, str], int]:
    used: dict[tuple[str, str], int] = {}
    for track, scope, text in conn.execute("SELECT track, scope, text FROM entries"):
        used[(track, scope)] = used.get((track, scope), 0) + utf16_len(text)
    return used


def page(conn: sqlite3.Connection, needle: str | None, limit: int, plan: queries.QueryPlan = "auto",
         track: str | None = None) -> tuple[list[str], int]:
    """The ids of query_page's page, and its count of all hits."""
    got, total = queries.query_page(conn, track=track, scope=None, text=needle, agent_key=None, workspace_key=None,
                                    limit=limit, plan=plan)
    return [e.id for e in got], total


def assert_index_holds_the_entries(conn: sqlite3.Connection) -> None:
    """The text index holds exactly the entries' texts (FTS5's integrity-check reads them
    back from entries): each entry once, with its current text."""
    conn.execute("INSERT INTO memoryd_fts (memoryd_fts, rank) VALUES ('integrity-check', 1)")


def hits(conn: sqlite3.Connection, needle: str, plan: queries.QueryPlan) -> list[str]:
    """Every hit, in rank order: a page as large as a query may ask for."""
    return page(conn, needle, QUERY_HARD_CAP, plan)[0]


def assert_plans_agree(conn: sqlite3.Connection, entries: list[Entry], needles: list[str]) -> None:
    """Every plan returns exactly the plain scan's hits, and a short page of them, and the
    scan returns exactly what the protocol's rule (``reference``) does."""
    for needle in needles:
        scan = hits(conn, needle, "scan")
        assert set(scan) == reference(entries, needle), needle
        plans: list[queries.QueryPlan] = ["scan", "auto", "index"]
        for plan in plans if len(needle) >= queries.INDEX_MIN_NEEDLE else plans[:2]:
            assert hits(conn, needle, plan) == scan, (needle, plan)
            assert page(conn, needle, 3, plan) == (scan[:3], len(scan)), (needle, plan)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(texts, min_size=1, max_size=40), st.lists(texts, min_size=1, max_size=8), st.data())
def test_the_index_plan_returns_exactly_the_scan_and_the_rule(tmp_path_factory: pytest.TempPathFactory,
                                                              corpus: list[str], needles: list[str],
                                                              data: st.DataObject) -> None:
    path = tmp_path_factory.mktemp("plans") / "m.db"
    entries = [entry(n, t) for n, t in enumerate(corpus)]
    with opened(path) as conn:
        write(conn, lambda c: [store.insert_entry(c, e) for e in entries])
        # substrings of stored texts too, so that most needles hit something
        picked = [t[data.draw(st.integers(0, len(t) - 1)):][:data.draw(st.integers(1, 6))] for t in corpus[:4]]
        assert_plans_agree(conn, entries, needles + picked)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(["add", "add", "add", "replace", "remove", "remove newest"]),
                          texts, st.integers(0, 39)), min_size=1, max_size=40),
       st.lists(texts, min_size=1, max_size=6), st.data())
def test_after_any_writes_the_index_holds_the_entries_and_the_index_plan_is_the_scan(
        tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, str, int]], needles: list[str],
        data: st.DataObject) -> None:
    """Adds, replaces and removes, rowids reused (removing the newest entry and adding
    again), each write its own transaction or several in one."""
    path = tmp_path_factory.mktemp("writes") / "m.db"
    live: dict[str, Entry] = {}
    serial = itertools.count()
    with opened(path) as conn:
        n = 0
        while n < len(ops):
            together = data.draw(st.integers(1, 3))  # writes in this transaction
            conn.execute("BEGIN IMMEDIATE")
            for op, text, pick in ops[n:n + together]:
                tx = Tx(conn, {}, None)
                ids = sorted(live, key=lambda i: conn.execute("SELECT rowid FROM entries WHERE id = ?",
                                                                 (i,)).fetchone()[0])
                if op == "add" or not ids:
                    e = entry(next(serial), text)
                    live[e.id] = e
                    store.insert_entry(tx, e)
                elif op == "replace":
                    e = live[ids[pick % len(ids)]]
                    e.text = text
                    store.update_entry(tx, e)
                else:
                    gone = live.pop(ids[-1] if op == "remove newest" else ids[pick % len(ids)])
                    store.delete_entry(tx, gone.id)
                store.flush(tx)
            conn.execute("COMMIT")
            n += together
        entries = list(live.values())
        picked = [e.text[:data.draw(st.integers(3, 8))] for e in entries[:4]]
        assert_plans_agree(conn, entries, needles + picked)
        assert_index_holds_the_entries(conn)


def test_the_index_follows_replace_and_remove(tmp_path: Path) -> None:
    with opened(tmp_path / "m.db") as conn:
        a, b = entry(1, "Prefers TABS over spaces"), entry(2, "uses 記憶 daily")
        write(conn, lambda c: (store.insert_entry(c, a), store.insert_entry(c, b)))
        assert hits(conn, "tabs", "index") == ["e0001"] and hits(conn, "記憶 d", "index") == ["e0002"]
        a.text = "Prefers spaces now"
        write(conn, lambda c: store.update_entry(c, a))
        assert hits(conn, "tabs", "index") == [] and hits(conn, "spaces now", "index") == ["e0001"]
        write(conn, lambda c: store.delete_entry(c, b.id))
        assert hits(conn, "記憶 d", "index") == []
        (n,) = conn.execute("SELECT count(*) FROM memoryd_fts WHERE memoryd_fts MATCH '\"spa\"'").fetchone()
        assert n == 1
        # the index holds exactly the entries' texts (FTS5 reads them back from entries)
        assert_index_holds_the_entries(conn)


def segments(conn: sqlite3.Connection) -> int:
    (n,) = conn.execute("SELECT count(DISTINCT segid) FROM memoryd_fts_idx").fetchone()
    return int(n)


def test_a_transaction_of_many_writes_adds_one_segment_to_the_index(tmp_path: Path) -> None:
    """FTS5 writes what a transaction indexed as one new segment at COMMIT, unless a
    statement savepoint flushes it earlier (an INSERT ... SELECT opens one): a batch of
    adds must cost the index one segment, not one per add."""
    with opened(tmp_path / "m.db") as conn:
        write(conn, lambda c: store.insert_entry(c, entry(0, "the first entry")))
        assert segments(conn) == 1
        write(conn, lambda c: [store.insert_entry(c, entry(n, f"entry number {n}")) for n in range(1, 17)])
        assert segments(conn) == 2
        a = entry(3, "entry number 3, edited")
        write(conn, lambda c: (store.update_entry(c, a), store.insert_entry(c, entry(20, "one more"))))
        assert segments(conn) == 3
        assert hits(conn, "number 3, ed", "index") == ["e0003"]
        assert_index_holds_the_entries(conn)


def test_a_common_needle_is_scanned_and_a_rare_one_uses_the_index(tmp_path: Path) -> None:
    with opened(tmp_path / "m.db") as conn:
        entries = [entry(n, f"common text {n} {'rare' if n == 7 else ''}") for n in range(queries.INDEX_MIN_ENTRIES)]
        write(conn, lambda c: [store.insert_entry(c, e) for e in entries])
        assert queries.choose_plan(conn, "common") == "scan"
        assert queries.choose_plan(conn, "rare") == "index"
        assert queries.choose_plan(conn, "ra") == "scan"  # shorter than a trigram
        assert hits(conn, "RARE", "auto") == ["e0007"]


def test_a_needle_with_a_nul_is_matched_whole_by_every_plan(tmp_path: Path) -> None:
    """A NUL is a character like any other in a text (JSON's \\u0000), and SQLite's LIKE and
    FTS5's query parser both stop reading their pattern at it: the pattern ``%\\x00qqq%``
    was ``%`` (every entry a hit), and the index's phrase an unterminated string (an
    error). Such a needle is matched whole, by a scan."""
    with opened(tmp_path / "m.db") as conn:
        entries = [entry(n, f"fact {n}" + ("\x00 Tabby" if n % 50 == 3 else "")) for n in range(300)]
        write(conn, lambda c: [store.insert_entry(c, e) for e in entries])
        for needle in ["\x00qqq", "\x00 TAB", "3\x00 tabby", "\x00"]:
            expected = sorted(reference(entries, needle))
            plans: list[queries.QueryPlan] = ["scan", "auto", "index"]
            for plan in plans:
                assert sorted(hits(conn, needle, plan)) == expected, (repr(needle), plan)
                got, total = page(conn, needle, 3, plan)
                assert (got, total) == (hits(conn, needle, "scan")[:3], len(expected)), (repr(needle), plan)


def test_entries_written_by_another_program_are_indexed_at_the_next_start(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    with opened(path) as conn:
        write(conn, lambda c: store.insert_entry(c, entry(1, "written by memoryd")))
        write(conn, lambda c: store.insert_entry(c, entry(2, "also written by memoryd")))
        write(conn, lambda c: store.delete_entry(c, "e0002"))
        # memoryd's own writes keep its counts in step, and each leaves a chained audit row
        # (stood in for here): a start after them, killed or not, does not rebuild the index
        chain_newest_audit_row(conn)
        assert store.trusted(conn)
    # dsh-memento's own SQL, with no idea of the index: add one entry, edit another
    with contextlib.closing(sqlite3.connect(path)) as ref:
        ref.execute("INSERT INTO entries (id, track, scope, workspace_key, text, source, created_at, updated_at, "
                    "session_id, agent_key, last_recalled, recall_count, tags, version) VALUES ('m1', 'user', "
                    "'user-global', '', 'written by dsh-memento', 'dsh-memento', 5, 5, NULL, '', NULL, 0, '[]', 1)")
        ref.execute("UPDATE entries SET text = 'edited by dsh-memento', updated_at = 6, version = 2 "
                    "WHERE id = 'e0001'")
        ref.execute("INSERT INTO audit (ts, action, text) VALUES (6, 'add', 'written by dsh-memento')")
        ref.commit()
    with opened(path) as conn:
        assert hits(conn, "by dsh-memento", "index") == hits(conn, "by dsh-memento", "scan")
        assert sorted(hits(conn, "dsh-memento", "index")) == ["e0001", "m1"]
        assert hits(conn, "by memoryd", "index") == []
        assert store.stored_usage(conn)[("user", "user-global")] == len("edited by dsh-memento") + len(
            "written by dsh-memento")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(["add", "replace", "remove"]), texts,
                          st.sampled_from([("user", "user-global"), ("agent", "workspace")]), st.integers(0, 9)),
                max_size=30))
def test_the_kept_counts_follow_every_write(tmp_path_factory: pytest.TempPathFactory,
                                            ops: list[tuple[str, str, tuple[str, str], int]]) -> None:
    path = tmp_path_factory.mktemp("counts") / "m.db"
    live: dict[str, Entry] = {}
    with opened(path) as conn:
        for n, (op, text, (track, scope), pick) in enumerate(ops):
            ids = sorted(live)
            if op == "add" or not ids:
                e = entry(n, text, track, scope)
                live[e.id] = e
                write(conn, lambda c, e=e: store.insert_entry(c, e))
            elif op == "replace":
                e = live[ids[pick % len(ids)]]
                e.text = text
                write(conn, lambda c, e=e: store.update_entry(c, e))
            else:
                gone = live.pop(ids[pick % len(ids)])
                write(conn, lambda c, gone=gone: store.delete_entry(c, gone.id))
        kept = {cell: u for cell, u in store.stored_usage(conn).items() if u}
        assert kept == {cell: u for cell, u in computed_usage(conn).items() if u}
        (n_kept,) = conn.execute("SELECT total(entries) FROM memoryd_usage").fetchone()
        assert int(n_kept) == len(live)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(["ab", "abc", "x", "Abc d"]), st.integers(0, 3), st.integers(0, 5),
                          st.sampled_from([("user", "user-global"), ("agent", "workspace")])),
                min_size=1, max_size=30),
       st.sampled_from([None, "ab", "abc", "zz", "c d", "ABC"]), st.integers(1, 6),
       st.sampled_from([None, "user", "agent"]), st.sampled_from(["scan", "index", "auto"]))
def test_a_page_is_the_page_of_all_hits(tmp_path_factory: pytest.TempPathFactory,
                                        rows: list[tuple[str, int, int, tuple[str, str]]], needle: str | None,
                                        limit: int, track: str | None, plan: queries.QueryPlan) -> None:
    """Every plan of query_page, with a track filter: the first hits in rank order, and
    the count of all of them."""
    if plan == "index" and (needle is None or len(needle) < queries.INDEX_MIN_NEEDLE):
        plan = "scan"
    path = tmp_path_factory.mktemp("pages") / "m.db"
    entries: list[Entry] = []
    for n, (text, recalls, updated, (t, sc)) in enumerate(rows):
        e = entry(n, text, t, sc)
        e.recall_count, e.updated_at = recalls, updated
        entries.append(e)
    with opened(path) as conn:
        write(conn, lambda c: [store.insert_entry(c, e) for e in entries])
        matching = reference(entries, needle) if needle else {e.id for e in entries}
        every = [e.id for e in sorted(entries, key=queries.rank) if e.id in matching and track in (None, e.track)]
        assert page(conn, needle, limit, plan, track) == (every[:limit], len(every))


#: what the texts and needles of the next test are made of: quotes and FTS5's operators,
#: case pairs within ASCII and without (LIKE folds only ASCII), and more than one UTF-8 width
_GRAMS = 'aAb"*( éÉİiß記😀'


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.text(_GRAMS, min_size=3, max_size=16), min_size=1, max_size=12),
       st.text(_GRAMS, min_size=4, max_size=8) | st.sampled_from(["abcabcab", "aAaAaAa", '"a"*"(', "記😀記😀"]),
       st.integers(0, 11), st.integers(0, 3))
def test_the_index_plan_finds_what_the_scan_finds_for_needles_of_several_trigrams(
        tmp_path_factory: pytest.TempPathFactory, texts: list[str], needle: str, pick: int, start: int) -> None:
    """The index is asked for some of a needle's trigrams, ANDed: a superset, of which the
    LIKE keeps exactly the scan's hits, whatever the needle holds."""
    source = texts[pick % len(texts)]
    if len(source) - start >= 4 and pick % 2:  # half the needles are cut from a text: hits
        needle = source[start:start + 4 + pick % 5]
    entries = [entry(n, text) for n, text in enumerate(texts)]
    with opened(tmp_path_factory.mktemp("grams") / "m.db") as conn:
        write(conn, lambda c: [store.insert_entry(c, e) for e in entries])
        every = [e.id for e in sorted(entries, key=queries.rank) if e.id in reference(entries, needle)]
        assert page(conn, needle, 100, "index") == page(conn, needle, 100, "scan") == (every, len(every))


def test_the_statements_of_each_plan_read_the_entries_as_intended(tmp_path: Path) -> None:
    """The index plan looks its candidates up by rowid; a page without the index walks the
    rank index."""
    with opened(tmp_path / "m.db") as conn:
        where, args, _ = queries._filters(conn, "user", None, "abc", None, None, "index")
        steps = [r[3] for r in conn.execute(f"EXPLAIN QUERY PLAN SELECT rowid FROM entries NOT INDEXED{where}"
                                            f"{queries.RANK_ORDER}", args)]
        assert steps[0] == "SEARCH entries USING INTEGER PRIMARY KEY (rowid=?)", steps
        where, args, _ = queries._filters(conn, None, None, "abc", None, None, "scan")
        steps = [r[3] for r in conn.execute(f"EXPLAIN QUERY PLAN SELECT 1 FROM entries{where}{queries.RANK_ORDER} "
                                            "LIMIT ?", [*args, 20])]
        assert steps == ["SCAN entries USING INDEX memoryd_entries_rank"]


# --- memoryd_schema 4: the text index without docsize rows, the ledger's ref index partial ----

#: memoryd_schema 3's definitions, as stores written by it hold them
SCHEMA_3 = ("CREATE VIRTUAL TABLE memoryd_fts USING fts5(text, content='entries', content_rowid='rowid', "
            "tokenize='trigram')",
            "CREATE INDEX memoryd_ledger_ref ON memoryd_ledger (kind, ref)")


def assert_schema_4(path: Path, texts: dict[str, str]) -> None:
    """The definitions of memoryd_schema 4, an index that holds every entry, and the ledger's
    connection-row lookup on its index."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert conn.execute("SELECT value FROM meta WHERE key = 'memoryd_schema'").fetchone() == (
            str(MEMORYD_SCHEMA_VERSION),)
        defs = dict(conn.execute("SELECT name, sql FROM sqlite_master WHERE name IN ('memoryd_fts', "
                                 "'memoryd_ledger_ref', 'memoryd_fts_docsize')"))
        assert defs == {"memoryd_fts": "CREATE VIRTUAL TABLE memoryd_fts USING fts5(text, content='entries', "
                                       "content_rowid='rowid', tokenize='trigram', columnsize=0)",
                        "memoryd_ledger_ref": "CREATE INDEX memoryd_ledger_ref ON memoryd_ledger (kind, ref) "
                                              "WHERE ref IS NOT NULL"}
        assert_index_holds_the_entries(conn)
        [(_, _, _, plan)] = conn.execute("EXPLAIN QUERY PLAN SELECT 1 FROM memoryd_ledger WHERE kind = 'connection' "
                                         "AND ref = ?", ("r/1",)).fetchall()
        assert "USING COVERING INDEX memoryd_ledger_ref" in plan
        for eid, text in texts.items():
            assert hits(conn, text[2:], "index") == hits(conn, text[2:], "scan") == [eid]


def test_a_schema_3_store_gets_the_new_text_index_with_every_entry(tmp_path: Path) -> None:
    """A store memoryd_schema 3 wrote, trusted at start (its counts and ledger as memoryd left
    them, so no rebuild would run for it): the migration rebuilds the index it redefines."""
    path = tmp_path / "m.db"
    with opened(path) as conn:
        write(conn, lambda c: [store.insert_entry(c, entry(n, f"fact number {n}")) for n in range(3)])
        chain_newest_audit_row(conn)
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("DROP TABLE memoryd_fts")
        conn.execute("DROP INDEX memoryd_ledger_ref")
        for sql in SCHEMA_3:
            conn.execute(sql)
        conn.execute("INSERT INTO memoryd_fts (memoryd_fts) VALUES ('rebuild')")
        conn.execute("UPDATE meta SET value = '3' WHERE key = 'memoryd_schema'")
        conn.execute("COMMIT")
        assert store.trusted(conn)
    with opened(path) as conn:
        write(conn, lambda c: store.insert_entry(c, entry(9, "fact number 9")))
    assert_schema_4(path, {f"e{n:04d}": f"fact number {n}" for n in (0, 1, 2, 9)})


def test_a_store_of_the_reference_gets_the_new_definitions(tmp_path: Path) -> None:
    from test_e2e_store import make_store

    path = tmp_path / "m.db"
    make_store(path, 4)
    with opened(path) as conn:
        write(conn, lambda c: store.insert_entry(c, entry(9, "fact number 9")))
    assert_schema_4(path, {"3b241101-e2bb-4255-8caf-4136c566a962": "Prefers tabs", "e0009": "fact number 9"})


# --- memoryd_schema 6: the rank index ascending, walked backwards -------------------------

#: memoryd_schema 5's rank index, as stores written by it hold it
RANK_5 = "CREATE INDEX memoryd_entries_rank ON entries (recall_count DESC, updated_at DESC, id)"
RANK_6 = "CREATE INDEX memoryd_entries_rank ON entries (recall_count, updated_at, id DESC)"


def page_plan(conn: sqlite3.Connection) -> list[str]:
    """The plan of a page without a text (query_page's statement)."""
    return [r[3] for r in conn.execute(f"EXPLAIN QUERY PLAN SELECT {store.ENTRY_COLUMNS} FROM entries"
                                       f"{queries.RANK_ORDER} LIMIT ?", (5,))]


def leave_a_tail(conn: sqlite3.Connection, mark: int) -> None:
    """What an earlier memoryd left: the entries above rowid ``mark`` in no index yet, and
    the mark that says so."""
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("INSERT INTO memoryd_fts (memoryd_fts, rowid, text) SELECT 'delete', rowid, text FROM entries "
                 "WHERE rowid > ?", (mark,))
    store.set_meta(conn, store.TEXT_MARK_KEY, str(mark))
    conn.execute("COMMIT")


def test_a_schema_5_store_gets_the_ascending_rank_index_and_its_tail_indexed(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    with opened(path) as conn:
        rows = [entry(n, f"fact number {n}") for n in range(6)]
        for n, e in enumerate(rows):
            e.recall_count, e.updated_at = n % 3, 100 - n
        write(conn, lambda c: [store.insert_entry(c, e) for e in rows])
        leave_a_tail(conn, 4)
        chain_newest_audit_row(conn)
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("DROP INDEX memoryd_entries_rank")
        conn.execute(RANK_5)
        conn.execute("UPDATE meta SET value = '5' WHERE key = 'memoryd_schema'")
        conn.execute("COMMIT")
        assert store.trusted(conn)
    with opened(path) as conn:
        assert conn.execute("SELECT value FROM meta WHERE key = 'memoryd_schema'").fetchone() == (
            str(MEMORYD_SCHEMA_VERSION),)
        assert conn.execute("SELECT sql FROM sqlite_master WHERE name = 'memoryd_entries_rank'").fetchone() == (RANK_6,)
        assert store.text_mark(conn) is None  # the tail indexed
        assert page_plan(conn) == ["SCAN entries USING INDEX memoryd_entries_rank"]  # no temp B-tree
        expected = [e.id for e in sorted(rows, key=queries.rank)]
        got, total = queries.query_page(conn, track=None, scope=None, text=None, agent_key=None, workspace_key=None,
                                        limit=6)
        assert [e.id for e in got] == expected and total == 6
        assert hits(conn, "number", "index") == expected
        assert_index_holds_the_entries(conn)
