"""kill -9 during bursts of mixed writes from several clients (issue 8, item 10).

Each trial (tests/faults.py) runs real daemons: it kills one at a seeded moment, checks the
store offline, and restarts a daemon on it. CI runs a few trials from a fixed base seed, so a
failure names a seed that reproduces it (``faults.run_trial(seed)``); MEMORYD_CRASH_TRIALS
sets how many. ``python -m bench.soak`` runs hundreds.

The checker is tested too, on stores written by hand: a check that cannot fail proves nothing.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path

import pytest
from faults import Expected, Pending, Row, TrialFailed, check_store, run_trial, trial_seed

BASE_SEED = 8
TRIALS = int(os.environ.get("MEMORYD_CRASH_TRIALS", "10"))


@pytest.mark.parametrize("n", range(TRIALS))
def test_kill_9_loses_no_acknowledged_write_and_applies_no_write_in_part(n: int, tmp_path: Path) -> None:
    result = run_trial(trial_seed(BASE_SEED, n), tmp_path)
    assert sum(result.acked.values()) + sum(result.unanswered.values()) > 0


# --- the checker, on stores written by hand

UG = ("user", "user-global")


def store(path: Path, rows: dict[str, Row]) -> Path:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE entries (id TEXT PRIMARY KEY, track TEXT, scope TEXT, text TEXT)")
        conn.executemany("INSERT INTO entries VALUES (?, ?, ?, ?)", [(i, *r) for i, r in rows.items()])
        conn.commit()
    return path


def row(text: str) -> Row:
    return (*UG, text)


def test_the_checker_accepts_acknowledged_writes_and_unanswered_ones_whole_or_not(tmp_path: Path) -> None:
    model = Expected(present={"a": row("<a>"), "b": row("<b>"), "c": row("<c>"), "d": row("<d>")}, removed={"x"})
    model.pending = [
        Pending("memory/seed", creates=[row("<s1>"), row("<s2>")]),                       # applied
        Pending("memory/import", creates=[row("<i1>")]),                                  # not applied
        Pending("memory/replace", replaces={"a": (row("<a>"), row("<a2>"))}),             # applied
        Pending("memory/remove", removes={"b": row("<b>")}),                              # not applied
        Pending("memory/consolidate", removes={"c": row("<c>"), "d": row("<d>")}, creates=[row("<cd>")]),  # applied
    ]
    db = store(tmp_path / "ok.db", {"a": row("<a2>"), "b": row("<b>"), "s1": row("<s1>"), "s2": row("<s2>"),
                                    "n": row("<cd>")})
    check_store(db, model, ledger=False)
    assert model.unanswered == {"applied": 3, "not applied": 2}


@pytest.mark.parametrize(("rows", "problem"), [
    ({}, "acknowledged entry a is lost: user/user-global '<a>'"),
    ({"a": row("<a, edited>")}, "acknowledged entry a is user/user-global '<a, edited>', expected user/user-global '<a>'"),
    ({"a": ("agent", "user-global", "<a>")}, "acknowledged entry a is agent/user-global '<a>', expected user/user-global '<a>'"),
    ({"a": row("<a>"), "x": row("<x>")}, "entry x is present, but an acknowledged write removed it"),
    ({"a": row("<a>"), "z": row("<z>")}, "1 entry that no write asked for: user/user-global '<z>'"),
    ({"a": row("<a>"), "s1": row("<s1>")}, ("unanswered memory/seed applied in part: add user/user-global '<s1>': done; "
      "add user/user-global '<s2>': not done")),
    ({"a": row("<a>"), "s1": row("<s1>"), "s2": row("<s2>"), "s3": row("<s2>")},
     "1 entry that no write asked for: user/user-global '<s2>'"),
])
def test_the_checker_names_a_lost_edited_resurrected_stray_or_partial_write(
        tmp_path: Path, rows: dict[str, Row], problem: str) -> None:
    model = Expected(present={"a": row("<a>")}, removed={"x"},
                     pending=[Pending("memory/seed", creates=[row("<s1>"), row("<s2>")])])
    with pytest.raises(TrialFailed) as failed:
        check_store(store(tmp_path / "bad.db", rows), model, ledger=False)
    assert problem in str(failed.value)


@pytest.mark.parametrize(("rows", "problem"), [
    ({"c": row("<c>"), "n": row("<cd>")}, "unanswered memory/consolidate applied in part: remove c: not done; remove d: done; add user/user-global '<cd>': done"),
    ({"c": row("<c>"), "d": row("<d>"), "n": row("<cd>")},
     ("unanswered memory/consolidate applied in part: remove c: not done; remove d: not done; "
      "add user/user-global '<cd>': done")),
    ({"d": row("<d>")}, ("unanswered memory/consolidate applied in part: remove c: done; remove d: not done; "
      "add user/user-global '<cd>': not done")),
    ({"c": row("<c2>"), "d": row("<d>")}, "unanswered memory/consolidate of c: found user/user-global '<c2>', expected user/user-global '<c>' or absent"),
])
def test_the_checker_names_a_consolidate_applied_in_part(tmp_path: Path, rows: dict[str, Row], problem: str) -> None:
    model = Expected(present={"c": row("<c>"), "d": row("<d>")}, pending=[
        Pending("memory/consolidate", removes={"c": row("<c>"), "d": row("<d>")}, creates=[row("<cd>")])])
    with pytest.raises(TrialFailed) as failed:
        check_store(store(tmp_path / "bad.db", rows), model, ledger=False)
    assert problem in str(failed.value)


def test_the_checker_runs_integrity_check(tmp_path: Path) -> None:
    db = store(tmp_path / "corrupt.db", {f"e{n}": row(f"<e{n}> " + "x" * 500) for n in range(200)})
    with contextlib.closing(sqlite3.connect(db)) as conn:
        conn.execute("CREATE INDEX entries_text ON entries (text)")
        conn.commit()
        (root,) = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'entries_text'").fetchone()
        (page_size,) = conn.execute("PRAGMA page_size").fetchone()
    with db.open("r+b") as f:  # zero a page of the index: the table reads fine, the index lies
        f.seek((root - 1) * page_size + 8)
        f.write(b"\0" * 64)
    with pytest.raises(TrialFailed, match="integrity_check"):
        check_store(db, Expected(), ledger=False)
