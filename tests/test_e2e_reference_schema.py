"""The store's schema is the reference's (dsh-memento 0.4.4, its DDL copied in
fixtures/reference/store-ddl.sql), with memoryd's own tables beside it: a store memoryd
creates, a store the reference made at each of its schema versions, and a store an older
memoryd made, upgraded in place with its ledger still verifying. Real daemons."""

from __future__ import annotations

import contextlib
import hashlib
import re
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import add, sql
from memoryd import schema, storefile
from memoryd_protocol.constants import MEMORYD_SCHEMA_VERSION
from rawclient import socket_client, write_ctx

pytestmark = [pytest.mark.anyio, pytest.mark.process]

FIXTURE = Path(__file__).parent / "fixtures" / "reference" / "store-ddl.sql"
LAYER = {"track": "user", "scope": "user-global"}
#: the reference's own objects: everything but memoryd's tables, their indexes and shadow tables
REFERENCE_OBJECTS = ("SELECT type, name, tbl_name, sql FROM sqlite_master WHERE name NOT LIKE 'memoryd!_%' "
                     "ESCAPE '!' AND tbl_name NOT LIKE 'memoryd!_%' ESCAPE '!' ORDER BY type, name")

#: The DDL memoryd ran before it ran the reference's (memoryd_schema 7 and older), as the
#: stores it made hold it: no CHECKs on entries, no status DEFAULT or CHECK on proposals,
#: no audit_ts or proposals_status index.
OLD_MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (
        "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
        """CREATE TABLE IF NOT EXISTS entries (
            id TEXT PRIMARY KEY,
            track TEXT NOT NULL,
            scope TEXT NOT NULL,
            workspace_key TEXT NOT NULL DEFAULT '',
            text TEXT NOT NULL,
            source TEXT NOT NULL,
            created_at INTEGER NOT NULL,
            updated_at INTEGER NOT NULL,
            session_id TEXT
        )""",
        """CREATE TABLE IF NOT EXISTS audit (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            ts INTEGER NOT NULL,
            action TEXT NOT NULL,
            track TEXT,
            scope TEXT,
            entry_id TEXT,
            text TEXT,
            outcome TEXT,
            source TEXT,
            session_id TEXT
        )""",
        "CREATE INDEX IF NOT EXISTS entries_track_scope ON entries (track, scope)",
    ),
    2: (
        """CREATE TABLE IF NOT EXISTS proposals (
            id TEXT PRIMARY KEY,
            kind TEXT NOT NULL,
            track TEXT NOT NULL,
            scope TEXT NOT NULL,
            workspace_key TEXT NOT NULL DEFAULT '',
            text TEXT NOT NULL,
            source TEXT NOT NULL,
            session_id TEXT,
            status TEXT NOT NULL,
            created_at INTEGER NOT NULL,
            decided_at INTEGER,
            UNIQUE (session_id, kind)
        )""",
    ),
    3: (
        "ALTER TABLE entries ADD COLUMN agent_key TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE entries ADD COLUMN last_recalled INTEGER",
        "ALTER TABLE entries ADD COLUMN recall_count INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE proposals ADD COLUMN agent_key TEXT NOT NULL DEFAULT ''",
    ),
    4: (
        "ALTER TABLE entries ADD COLUMN tags TEXT NOT NULL DEFAULT '[]'",
        "ALTER TABLE entries ADD COLUMN version INTEGER NOT NULL DEFAULT 1",
    ),
}


def reference_steps() -> dict[int, str]:
    """Step n of the reference's migrations: the text of its constant, as the fixture holds it."""
    parts = re.split(r"^-- step (\d): \w+$", FIXTURE.read_text(encoding="utf-8"), flags=re.MULTILINE)
    return {int(n): text for n, text in zip(parts[1::2], parts[2::2], strict=True)}


def statements(script: str) -> list[str]:
    return [s.strip() for s in script.split(";") if s.strip()]


def reference_store(conn: sqlite3.Connection, version: int) -> None:
    """What the reference's migrate() leaves at schema ``version``: its steps 1..version,
    each one script, and the version recorded."""
    for n in range(1, version + 1):
        for statement in statements(reference_steps()[n]):
            conn.execute(statement)
    conn.execute("INSERT INTO meta (key, value) VALUES ('schema_version', ?)", (str(version),))


def reference_objects(conn: sqlite3.Connection) -> list[tuple[Any, ...]]:
    return conn.execute(REFERENCE_OBJECTS).fetchall()


def expected_objects() -> list[tuple[Any, ...]]:
    with contextlib.closing(sqlite3.connect(":memory:")) as conn:
        reference_store(conn, 4)
        return reference_objects(conn)


def own_objects_are_memoryds(conn: sqlite3.Connection) -> None:
    """Everything else in the store is one of memoryd's own objects."""
    others = {name for name, table in conn.execute("SELECT name, tbl_name FROM sqlite_master")
              if not (name.startswith("memoryd_") or table.startswith("memoryd_"))}
    assert others == {o[1] for o in expected_objects()}


def schema_foreign_rows(db: Path) -> list[tuple[Any, ...]]:
    return sql(db, "SELECT n, body FROM memoryd_ledger WHERE kind = 'foreign'")


def memoryctl_verify(db: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "memoryd_client", "audit", "verify", "--db", str(db)],
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def test_memoryd_runs_the_reference_text() -> None:
    """memoryd's migrations are the reference's statements, character for character."""
    steps = reference_steps()
    assert sorted(steps) == sorted(storefile.MIGRATIONS) == [1, 2, 3, 4]
    for n, script in steps.items():
        assert list(storefile.MIGRATIONS[n]) == statements(script)


async def test_a_new_store_is_the_reference_schema_with_memoryds_tables(daemon_factory: Any) -> None:
    d = daemon_factory()
    async with socket_client(d.socket_path) as raw:
        await add(raw, "Prefers tabs")
    d.stop()
    with contextlib.closing(sqlite3.connect(d.db_path)) as conn:
        assert reference_objects(conn) == expected_objects()
        own_objects_are_memoryds(conn)
        assert schema.changes(conn) == []


def test_a_table_renamed_away_and_back_is_no_change(tmp_path: Path) -> None:
    """ALTER TABLE RENAME writes the table's name quoted into its indexes: the reference's
    proposals_status then reads ``ON "proposals"``, and is the same index. One defined
    otherwise is still a change."""
    db = tmp_path / "memory.db"
    storefile.prepare_path(db)
    with contextlib.closing(storefile.open_store(db, storefile.inspect(db))) as conn:
        conn.execute("ALTER TABLE proposals RENAME TO proposals_away")
        conn.execute("ALTER TABLE proposals_away RENAME TO proposals")
        assert conn.execute("SELECT sql FROM sqlite_master WHERE name = 'proposals_status'").fetchone() == (
            'CREATE INDEX proposals_status ON "proposals" (status)',)
        assert schema.changes(conn) == []
        conn.execute("DROP INDEX proposals_status")
        conn.execute('CREATE INDEX proposals_status ON "proposals" (status DESC)')
        assert [schema.named(item) for item in schema.changes(conn)] == ["index proposals_status on proposals changed"]


def reference_data(conn: sqlite3.Connection, version: int) -> None:
    """What the reference writes: an entry with its audit row and, from schema 2, a proposal
    whose status is the column's default."""
    conn.execute("INSERT INTO entries (id, track, scope, workspace_key, text, source, created_at, updated_at, "
                 "session_id) VALUES ('3b241101-e2bb-4255-8caf-4136c566a962', 'user', 'user-global', '', "
                 "'Prefers tabs', 'dsh-memento', 1, 2, 's-0')")
    conn.execute("INSERT INTO audit (ts, action, track, scope, entry_id, text, outcome, source, session_id) "
                 "VALUES (2, 'add', 'user', 'user-global', '3b241101-e2bb-4255-8caf-4136c566a962', 'Prefers tabs', "
                 "'allowed-once', 'dsh-memento', 's-0')")
    if version >= 2:
        conn.execute("INSERT INTO proposals (id, kind, track, scope, workspace_key, text, source, session_id, "
                     "created_at) VALUES ('p-0', 'compaction-summary', 'agent', 'workspace', '/home/u/p', "
                     "'Run the linter first', 'dsh-memento', 's-0', 3)")


@pytest.mark.parametrize("version", [1, 2, 3, 4])
async def test_a_store_the_reference_made_takes_writes(daemon_factory: Any, tmp_path: Path, version: int) -> None:
    """At each of its schema versions: memoryd migrates it as the reference does, sees no
    schema of another program in it, writes, and its ledger verifies."""
    db = tmp_path / "memory.db"
    with contextlib.closing(sqlite3.connect(db)) as conn:
        reference_store(conn, version)
        reference_data(conn, version)
        conn.commit()
    d = daemon_factory(db=db)
    async with socket_client(d.socket_path) as raw:
        await add(raw, "Deploys on Fridays")
        created = await raw.ok("proposals/create", {"session": {"id": "s-1"},
                                                    "input": {**LAYER, "kind": "habit", "text": "proposed"}})
        await raw.ok("proposals/approve", {"id": created["id"], "write": write_ctx()})
        assert sorted(e["text"] for e in await raw.ok("memory/list", {})) == [
            "Deploys on Fridays", "Prefers tabs", "proposed"]
        report = await raw.ok("audit/verify")
        assert report["ok"] is True and report["problems"] == []
    d.stop()
    assert "changed the store's schema" not in d.stderr()
    assert schema_foreign_rows(db) == []
    with contextlib.closing(sqlite3.connect(db)) as conn:
        assert reference_objects(conn) == expected_objects()
        own_objects_are_memoryds(conn)
        assert schema.changes(conn) == []
        if version >= 2:  # the reference's default, kept
            assert conn.execute("SELECT status FROM proposals WHERE id = 'p-0'").fetchone() == ("pending",)
    assert memoryctl_verify(db).returncode == 0


def old_definitions() -> dict[str, str]:
    """The tables' definitions as memoryd_schema 7 left them."""
    with contextlib.closing(sqlite3.connect(":memory:")) as conn:
        for n in sorted(OLD_MIGRATIONS):
            for statement in OLD_MIGRATIONS[n]:
                conn.execute(statement)
        return dict(conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'"))


def make_old(db: Path) -> None:
    """Turn a store memoryd wrote into the one memoryd_schema 7 would have written: each of
    the reference's tables rebuilt with the old definition (every row and rowid kept), the
    two indexes it never made dropped, and its schema number."""
    old = old_definitions()
    with contextlib.closing(sqlite3.connect(db, isolation_level=None)) as conn:
        conn.execute("PRAGMA legacy_alter_table = ON")
        conn.execute("BEGIN IMMEDIATE")
        for table in ("entries", "audit", "proposals"):
            columns = ", ".join(r[1] for r in conn.execute(f"PRAGMA table_info({table})"))
            indexes = [s for (s,) in conn.execute("SELECT sql FROM sqlite_master WHERE type = 'index' AND "
                                                  "tbl_name = ? AND sql IS NOT NULL", (table,))]
            (sequence,) = conn.execute("SELECT coalesce(max(seq), 0) FROM sqlite_sequence WHERE name = ?",
                                       (table,)).fetchone()
            conn.execute(f"ALTER TABLE {table} RENAME TO made_old")
            conn.execute(old[table])
            conn.execute(f"INSERT INTO {table} (rowid, {columns}) SELECT rowid, {columns} FROM made_old")
            conn.execute("DROP TABLE made_old")
            if sequence:
                conn.execute("UPDATE sqlite_sequence SET seq = ? WHERE name = ?", (sequence, table))
            for s in indexes:
                if " audit_ts " not in s and " proposals_status " not in s:
                    conn.execute(s)
        conn.execute("UPDATE meta SET value = '7' WHERE key = 'memoryd_schema'")
        conn.execute("COMMIT")


def snapshot(db: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of the reference's tables and of the ledger, with its rowid."""
    return {table: sql(db, f"SELECT rowid, * FROM {table} ORDER BY rowid")
            for table in ("entries", "audit", "proposals", "memoryd_ledger", "sqlite_sequence")}


async def old_store(daemon_factory: Any) -> Path:
    """A store with entries, proposals and a chained ledger, as memoryd_schema 7 left it."""
    d = daemon_factory(name="old")
    async with socket_client(d.socket_path) as raw:
        for text in ("Prefers tabs", "Deploys on Fridays", "Reads the changelog"):
            await add(raw, text)
        created = await raw.ok("proposals/create", {"session": {"id": "s-1"},
                                                    "input": {**LAYER, "kind": "habit", "text": "proposed"}})
        await raw.ok("proposals/approve", {"id": created["id"], "write": write_ctx()})
        await raw.ok("proposals/create", {"session": {"id": "s-2"},
                                          "input": {**LAYER, "kind": "lesson", "text": "still pending"}})
        await raw.ok("memory/query", {"filter": {"text": "tabs"}})
    d.stop()
    make_old(d.db_path)
    assert memoryctl_verify(d.db_path).returncode == 0  # a store the old memoryd would verify
    return Path(d.db_path)


async def test_an_older_memoryds_store_is_upgraded_in_place(daemon_factory: Any) -> None:
    db = await old_store(daemon_factory)
    with contextlib.closing(sqlite3.connect(db)) as conn:
        assert "CHECK" not in conn.execute("SELECT sql FROM sqlite_master WHERE name = 'entries'").fetchone()[0]
    before = snapshot(db)
    d = daemon_factory(db=db, name="new")
    async with socket_client(d.socket_path) as raw:
        report = await raw.ok("audit/verify")
        assert report["ok"] is True and report["problems"] == []
        await add(raw, "Written after the upgrade")
        assert (await raw.ok("audit/verify"))["ok"] is True
    d.stop()
    after = snapshot(db)
    for table in ("entries", "audit", "proposals", "memoryd_ledger"):  # every row and rowid kept
        assert after[table][:len(before[table])] == before[table]
    assert len(after["entries"]) == len(before["entries"]) + 1
    assert [r[1:] for r in after["sqlite_sequence"]] == [("audit", after["audit"][-1][0])]
    assert schema_foreign_rows(db) == []
    assert "changed the store's schema" not in d.stderr()
    with contextlib.closing(sqlite3.connect(db)) as conn:
        assert conn.execute("SELECT value FROM meta WHERE key = 'memoryd_schema'").fetchone() == (
            str(MEMORYD_SCHEMA_VERSION),)
        # the upgraded tables (the audit table too, whose text differed in whitespace only)
        # and the new indexes are the reference's text
        assert reference_objects(conn) == expected_objects()
        own_objects_are_memoryds(conn)
        assert schema.changes(conn) == []
    assert memoryctl_verify(db).returncode == 0


def serve(db: Path, socket_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "memoryd", "serve", "--socket", str(socket_path), "--db", str(db)],
                          capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


async def test_an_older_store_with_an_entry_the_checks_refuse_is_refused_untouched(daemon_factory: Any,
                                                                                   tmp_path: Path) -> None:
    """A track the reference's CHECK does not allow, written in by another program: the
    upgrade cannot keep that row, so memoryd does not start, names the entry and the next
    step, and leaves the file as it was."""
    db = await old_store(daemon_factory)
    [(eid,)] = sql(db, "SELECT id FROM entries WHERE text = 'Deploys on Fridays'")
    sql(db, "UPDATE entries SET track = 'team' WHERE id = ?", eid)
    sql(db, "PRAGMA wal_checkpoint(TRUNCATE)")
    before = digest(db)
    r = serve(db, tmp_path / "s.sock")
    assert r.returncode != 0
    assert "STORE_CORRUPT" in r.stderr and str(db) in r.stderr
    assert (f"store entry {eid} has track 'team' and scope 'user-global', which dsh-memento's schema does not "
            "allow: correct or delete it (sqlite3 can), then start memoryd again") in r.stderr
    assert "Deploys on Fridays" not in r.stderr
    assert digest(db) == before
    with contextlib.closing(sqlite3.connect(db)) as conn:
        assert conn.execute("SELECT value FROM meta WHERE key = 'memoryd_schema'").fetchone() == ("7",)


async def test_an_upgrade_stopped_half_way_leaves_the_older_store_as_it_was(daemon_factory: Any,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The upgrade is one transaction with the schema number: a failure after ``entries`` was
    rebuilt and before ``proposals`` was leaves every row, definition and number as they
    were, and the next start upgrades it."""
    from memoryd import reference_ddl

    db = await old_store(daemon_factory)
    sql(db, "PRAGMA wal_checkpoint(TRUNCATE)")
    before, definitions = snapshot(db), sql(db, "SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY name")
    rebuild = reference_ddl._rebuild

    def stopping(conn: sqlite3.Connection, table: str, definition: str) -> None:
        if table == "proposals":
            raise RuntimeError("stopped half way")
        rebuild(conn, table, definition)

    monkeypatch.setattr(reference_ddl, "_rebuild", stopping)
    with pytest.raises(RuntimeError, match="stopped half way"):
        storefile.open_store(db, storefile.inspect(db))
    assert snapshot(db) == before
    assert sql(db, "SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY name") == definitions
    assert sql(db, "SELECT value FROM meta WHERE key = 'memoryd_schema'") == [("7",)]
    monkeypatch.undo()
    storefile.open_store(db, storefile.inspect(db)).close()
    assert snapshot(db) == before
    with contextlib.closing(sqlite3.connect(db)) as conn:
        assert reference_objects(conn) == expected_objects()
    assert memoryctl_verify(db).returncode == 0
