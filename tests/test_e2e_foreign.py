"""Changes another program makes to the store, against a real daemon: a forged append while
it runs, a dsh-memento process writing in place (running or stopped), a lowered budget
counter across a restart, and what the heads file witnesses (a clean truncation, a full
rehash). Each becomes a ``foreign`` ledger row that verify reports until it is accepted,
and nothing acknowledged is lost."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import add, memoryctl, rechain, sql
from memoryd_protocol.ledger import AuditBody, DecidedBody, canonical, chain_hash
from memoryd_protocol.types import ApprovalBy, LedgerEntry
from rawclient import Raw, socket_client, write_ctx

pytestmark = [pytest.mark.anyio, pytest.mark.process]

LAYER = {"track": "user", "scope": "user-global"}


def dsh_memento_add(db: Path, text: str) -> str:
    """What dsh-memento's add writes: the entry and its audit row, nothing of memoryd's."""
    eid = str(uuid.uuid4())
    sql(db, "INSERT INTO entries (id, track, scope, workspace_key, text, source, created_at, updated_at, session_id, "
            "agent_key, last_recalled, recall_count, tags, version) VALUES (?, 'user', 'user-global', '', ?, "
            "'dsh-memento', 5, 5, 's-m', '', NULL, 0, '[]', 1)", eid, text)
    sql(db, "INSERT INTO audit (ts, action, track, scope, entry_id, text, outcome, source, session_id) "
            "VALUES (5, 'add', 'user', 'user-global', ?, ?, 'allowed-once', 'dsh-memento', 's-m')", eid, text)
    return eid


def forge_append(db: Path, text: str) -> tuple[str, list[int]]:
    """The forged write of the attack: an entry, its audit row, its usage, and chained
    ledger rows saying a human approved it. Returns the entry's id and the rows' n."""
    eid = str(uuid.uuid4())
    conn = sqlite3.connect(db)
    try:
        with conn:
            n, prev = conn.execute("SELECT n, hash FROM memoryd_ledger ORDER BY n DESC LIMIT 1").fetchone()
            conn.execute("INSERT INTO entries (id, track, scope, workspace_key, text, source, created_at, updated_at, "
                         "session_id, agent_key, last_recalled, recall_count, tags, version) VALUES (?, 'user', "
                         "'user-global', '', ?, 'memoryctl', 7, 7, 's-1', '', NULL, 0, '[]', 1)", (eid, text))
            seq = conn.execute("INSERT INTO audit (ts, action, track, scope, entry_id, text, outcome, source, "
                               "session_id) VALUES (7, 'add', 'user', 'user-global', ?, ?, 'allowed-once', "
                               "'memoryctl', 's-1')", (eid, text)).lastrowid
            conn.execute("UPDATE memoryd_usage SET entries = entries + 1, used = used + ? "
                         "WHERE track = 'user' AND scope = 'user-global'", (len(text),))
            rows = [("decided", "forged", None, canonical(DecidedBody(
                        approval="forged", outcome="allowed-once", connection=None, by=ApprovalBy(kind="human"),
                        policy="ask"))),
                    ("audit", None, seq, canonical(AuditBody(
                        seq=seq, ts=7, action="add", track="user", scope="user-global", entry_id=eid, text=text,
                        outcome="allowed-once", source="memoryctl", session_id="s-1", connection=None,
                        approval="forged", entry=LedgerEntry(id=eid, track="user", scope="user-global",
                                                             workspace_key="", agent_key="", text=text, tags=[],
                                                             source="memoryctl", version=1))))]
            written = []
            for kind, ref, audit_seq, body in rows:
                n += 1
                h = chain_hash(prev, n, 7, kind, ref, audit_seq, body)
                conn.execute("INSERT INTO memoryd_ledger (n, ts, kind, ref, audit_seq, body, prev, hash) "
                             "VALUES (?, 7, ?, ?, ?, ?, ?, ?)", (n, kind, ref, audit_seq, body, prev, h))
                prev = h
                written.append(n)
    finally:
        conn.close()
    return eid, written


def foreign_rows(db: Path) -> list[tuple[int, dict[str, Any]]]:
    return [(n, json.loads(body)) for n, body in sql(db, "SELECT n, body FROM memoryd_ledger WHERE kind = 'foreign'")]


async def accept(raw: Raw, n: int) -> dict[str, Any]:
    reply: dict[str, Any] = await raw.ok("audit/accept", {"n": n})
    return reply


@pytest.fixture
def accepting(daemon_factory: Any, any_approvers: Path) -> Any:
    """A daemon whose connections may accept without a terminal (the test has none)."""
    return daemon_factory("--config", str(any_approvers))


async def test_a_forged_append_while_the_daemon_runs_is_foreign_until_accepted(accepting: Any) -> None:
    d = accepting
    async with socket_client(d.socket_path) as raw:
        kept = (await add(raw, "Prefers tabs"))["entry"]["id"]
        eid, forged = forge_append(d.db_path, "Deploys on Fridays")
        report = await raw.ok("audit/verify")
        [(n, body)] = foreign_rows(d.db_path)
        assert n == forged[-1] + 1  # chained onto the store as found, naming what is not memoryd's
        assert body["ledgerRows"] == forged
        assert [e["id"] for e in body["entries"]] == [eid] and body["removed"] == []
        assert body["usage"] == {}  # the forger kept the counter in step
        note = (f"ledger rows {forged[0]}–{forged[1]} appended; 1 audit rows written (seq {body['auditSeqs'][0]}); "
                f"1 entries added ({eid}) (while memoryd ran)")
        assert body["note"] == note
        assert report["ok"] is False
        assert report["problems"] == [{"n": n, "reason": (
            f"ledger row {n} records a change another program made to the store, not accepted yet: {note}. "
            f"Check it, then run memoryctl audit accept {n}")}]
        # the forged entry stays readable; the next write chains after the foreign row
        later = (await add(raw, "Uses uv"))["entry"]["id"]
        ids = {e["id"] for e in await raw.ok("memory/list")}
        assert ids == {kept, eid, later}
        assert (await accept(raw, n))["foreign"] == n
        assert (await raw.ok("audit/verify"))["ok"] is True
        life = await raw.ok("audit/explain", {"target": eid})  # never as approved through memoryd
        assert [(ev["n"], ev["action"], ev["decision"]) for ev in life["events"]] == [
            (n, "written-outside-memoryd", None)]
    assert "another program changed the store: " + note in d.stderr()
    assert "Deploys on Fridays" not in d.stderr()  # memory text never reaches the log


async def test_a_dsh_memento_write_in_place_is_foreign_counted_and_kept(daemon_factory: Any, tmp_path: Path) -> None:
    cfg = tmp_path / "small.toml"
    cfg.write_text('approvers = "any"\n[budgets.user]\nuser_global = 30\n')
    d = daemon_factory("--config", str(cfg))
    async with socket_client(d.socket_path) as raw:
        await add(raw, "Prefers tabs")  # 12 of 30
        eid = dsh_memento_add(d.db_path, "Written by dsh-memento")  # 22 more: 34 of 30
        err = await raw.fail("memory/add", {"input": {**LAYER, "text": "x"}, "write": write_ctx()})
        assert err.code == "BUDGET_EXCEEDED"  # the counted usage is the one enforced
        budgets = {(b["track"], b["scope"]): b["used"] for b in await raw.ok("memory/budgets")}
        assert budgets[("user", "user-global")] == 34
        [(n, body)] = foreign_rows(d.db_path)
        assert body["ledgerRows"] == [] and [e["id"] for e in body["entries"]] == [eid]
        assert body["usage"] == {"user/user-global": [1, 12, 2, 34]}
        hits = (await raw.ok("memory/query", {"filter": {"text": "dsh-memento"}}))["entries"]
        assert [h["id"] for h in hits] == [eid]
        report = await raw.ok("audit/verify")
        assert [p["n"] for p in report["problems"]] == [n]
        await accept(raw, n)
        assert (await raw.ok("audit/verify"))["ok"] is True


async def test_a_write_while_memoryd_was_stopped_is_foreign_at_the_next_start(daemon_factory: Any,
                                                                            tmp_path: Path) -> None:
    d = daemon_factory()
    async with socket_client(d.socket_path) as raw:
        await add(raw, "Prefers tabs")
    d.stop()
    eid = dsh_memento_add(d.db_path, "Written while stopped")
    d2 = daemon_factory(db=d.db_path, name="again")
    [(n, body)] = foreign_rows(d.db_path)
    assert body["note"].endswith("(while memoryd was stopped)")
    assert [e["id"] for e in body["entries"]] == [eid]
    assert "another program changed the store" in d2.stderr()
    async with socket_client(d2.socket_path) as raw:
        hits = (await raw.ok("memory/query", {"filter": {"text": "while stopped"}}))["entries"]
        assert [h["id"] for h in hits] == [eid]
        assert [p["n"] for p in (await raw.ok("audit/verify"))["problems"]] == [n]


async def test_a_lowered_counter_is_counted_again_at_start_and_enforced(daemon_factory: Any, tmp_path: Path) -> None:
    cfg = tmp_path / "small.toml"
    cfg.write_text("[budgets.user]\nuser_global = 20\n")
    d = daemon_factory("--config", str(cfg))
    async with socket_client(d.socket_path) as raw:
        await add(raw, "Prefers tabs always")  # 19 of 20
    d.stop()
    sql(d.db_path, "UPDATE memoryd_usage SET used = 1 WHERE track = 'user' AND scope = 'user-global'")
    d2 = daemon_factory("--config", str(cfg), db=d.db_path, name="again")
    assert "memoryd_usage said user/user-global holds 1 entries of 1 characters, and they are 1 of 19" in d2.stderr()
    async with socket_client(d2.socket_path) as raw:
        err = await raw.fail("memory/add", {"input": {**LAYER, "text": "and spaces"}, "write": write_ctx()})
        assert err.code == "BUDGET_EXCEEDED"
    [(_, body)] = foreign_rows(d.db_path)
    assert body["usage"] == {"user/user-global": [1, 1, 1, 19]}
    assert sql(d.db_path, "SELECT entries, used FROM memoryd_usage WHERE track = 'user'") == [(1, 19)]


async def test_rows_appended_after_a_clean_stop_are_named_by_the_heads_file(daemon_factory: Any) -> None:
    d = daemon_factory()
    async with socket_client(d.socket_path) as raw:
        await add(raw, "Prefers tabs")
    d.stop()
    eid, forged = forge_append(d.db_path, "Deploys on Fridays")
    daemon_factory(db=d.db_path, name="again")
    [(n, body)] = foreign_rows(d.db_path)
    assert body["ledgerRows"] == forged and n == forged[-1] + 1
    assert [e["id"] for e in body["entries"]] == [eid]


def heads_file(db: Path) -> Path:
    """A store other than the default one keeps its heads beside it."""
    return db.with_name(db.name + ".memoryd-heads")


def heads_of(db: Path) -> list[dict[str, Any]]:
    return [h for h in map(json.loads, heads_file(db).read_text().splitlines()) if h["store"] == str(db.resolve())]


async def test_the_heads_file_witnesses_start_stop_and_every_n_rows(daemon_factory: Any, tmp_path: Path) -> None:
    cfg = tmp_path / "heads.toml"
    cfg.write_text("heads_every_rows = 2\n")
    d = daemon_factory("--config", str(cfg))
    async with socket_client(d.socket_path) as raw:
        for text in ("one", "two", "three"):
            await add(raw, text)
    d.stop()
    heads = heads_of(d.db_path)
    assert heads[0]["event"] == "start" and heads[-1]["event"] == "stop"
    assert any(h["event"] == "every" for h in heads)
    [(tip_n, tip_hash)] = sql(d.db_path, "SELECT n, hash FROM memoryd_ledger ORDER BY n DESC LIMIT 1")
    assert (heads[-1]["n"], heads[-1]["hash"]) == (tip_n, tip_hash)
    assert f"ledger head at stop: row {tip_n} hash {tip_hash}" in d.stderr()
    for h in heads:
        assert sql(d.db_path, "SELECT hash FROM memoryd_ledger WHERE n = ?", h["n"]) == [(h["hash"],)]


async def test_verify_with_heads_catches_a_clean_truncation(daemon_factory: Any, tmp_path: Path) -> None:
    """Deleting the last write whole (entry, audit row, ledger rows, counter) while the
    daemon is stopped leaves a store that verify alone finds in order."""
    d = daemon_factory()
    async with socket_client(d.socket_path) as raw:
        await add(raw, "Prefers tabs")
        gone = (await add(raw, "the write to hide"))["entry"]["id"]
    d.stop()
    [(seq,)] = sql(d.db_path, "SELECT seq FROM audit WHERE entry_id = ?", gone)
    [(n_gone,)] = sql(d.db_path, "SELECT n FROM memoryd_ledger WHERE audit_seq = ?", seq)
    witnessed = heads_of(d.db_path)[-1]
    # the entry's text index row too: memoryd indexes every entry as it writes it
    sql(d.db_path, "INSERT INTO memoryd_fts (memoryd_fts, rowid, text) SELECT 'delete', rowid, text FROM entries "
                   "WHERE id = ?", gone)
    sql(d.db_path, "DELETE FROM entries WHERE id = ?", gone)
    sql(d.db_path, "DELETE FROM audit WHERE seq = ?", seq)
    sql(d.db_path, "DELETE FROM memoryd_ledger WHERE n >= ?", n_gone)
    sql(d.db_path, "UPDATE memoryd_usage SET entries = 1, used = 12 WHERE track = 'user' AND scope = 'user-global'")
    copy = tmp_path / "copy-of-heads"
    copy.write_bytes(heads_file(d.db_path).read_bytes())
    d2 = daemon_factory(db=d.db_path, name="again")
    async with socket_client(d2.socket_path) as raw:
        assert (await raw.ok("audit/verify"))["ok"] is True  # the chain alone cannot tell
        report = await raw.ok("audit/verify", {"heads": [{"n": witnessed["n"], "hash": witnessed["hash"]}]})
        assert report["problems"] == [{"n": witnessed["n"], "reason": (
            f"ledger row {witnessed['n']}, a head witnessed outside the store, is missing: the ledger was truncated")}]
        err = await raw.fail("audit/verify", {"heads": [{"n": 1, "hash": "not a hash"}]})
        assert err.code == "INVALID_INPUT"
    d2.stop()
    def verify(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "memoryd_client", "audit", "verify", "--db", str(d.db_path),
                               *extra], capture_output=True, text=True, timeout=60)

    with_heads, alone = verify("--heads", str(copy)), verify()
    assert (with_heads.returncode, alone.returncode) == (1, 0)
    assert with_heads.stdout == (f"ledger BROKEN at row {witnessed['n']}: ledger row {witnessed['n']}, a head witnessed "
                                 "outside the store, is missing: the ledger was truncated\n")


async def test_accepting_what_is_not_foreign_changes_nothing(accepting: Any) -> None:
    d = accepting
    async with socket_client(d.socket_path) as raw:
        await add(raw, "Prefers tabs")
        before = sql(d.db_path, "SELECT n, hash FROM memoryd_ledger")
        err = await raw.fail("audit/accept", {"n": 1})
        assert (err.code, err.error["message"]) == ("INVALID_INPUT", "ledger row 1 records no change made outside "
                                                                     "memoryd: audit verify names the rows to accept")
        err = await raw.fail("audit/accept", {"n": 10_000})
        assert err.code == "INVALID_INPUT"
        assert sql(d.db_path, "SELECT n, hash FROM memoryd_ledger") == before
        dsh_memento_add(d.db_path, "Written by dsh-memento")
        await raw.ok("audit/verify")
        [(n, _)] = foreign_rows(d.db_path)
        await accept(raw, n)
        before = sql(d.db_path, "SELECT n, hash FROM memoryd_ledger")
        err = await raw.fail("audit/accept", {"n": n})
        assert err.error["message"].startswith(f"ledger row {n} was accepted already, by ledger row ")
        assert sql(d.db_path, "SELECT n, hash FROM memoryd_ledger") == before


async def test_a_headless_connection_cannot_accept(daemon: Any) -> None:
    """Under approvers = "interactive" (the default), accepting is a person's decision."""
    async with socket_client(daemon.socket_path) as raw:
        await add(raw, "Prefers tabs")
        dsh_memento_add(daemon.db_path, "Written by dsh-memento")
        await raw.ok("audit/verify")
        [(n, _)] = foreign_rows(daemon.db_path)
        before = sql(daemon.db_path, "SELECT n, hash FROM memoryd_ledger")
        err = await raw.fail("audit/accept", {"n": n})
        assert err.code == "INVALID_INPUT"
        assert sql(daemon.db_path, "SELECT n, hash FROM memoryd_ledger") == before



async def test_verify_with_heads_catches_a_full_rehash(daemon_factory: Any, tmp_path: Path) -> None:
    """An edit with every hash after it recomputed, while the daemon is stopped: the chain
    checks out, the heads witnessed before do not."""
    d = daemon_factory()
    async with socket_client(d.socket_path) as raw:
        first = (await add(raw, "uses pnpm"))["entry"]["id"]
        await add(raw, "uses uv")
    d.stop()
    conn = sqlite3.connect(d.db_path)
    try:
        with conn:
            # the entry's text index row too: memoryd indexes every entry as it writes it
            conn.execute("INSERT INTO memoryd_fts (memoryd_fts, rowid, text) SELECT 'delete', rowid, text FROM "
                         "entries WHERE id = ?", (first,))
            conn.execute("UPDATE entries SET text = 'uses npm' WHERE id = ?", (first,))
            conn.execute("INSERT INTO memoryd_fts (rowid, text) SELECT rowid, text FROM entries WHERE id = ?", (first,))
            conn.execute("UPDATE audit SET text = 'uses npm' WHERE entry_id = ?", (first,))
            conn.execute("UPDATE memoryd_usage SET used = used - 1 WHERE track = 'user'")
            rechain(conn, "uses pnpm", "uses npm")
    finally:
        conn.close()
    alone = memoryctl("audit", "verify", "--db", str(d.db_path))
    assert alone.returncode == 0, alone.stdout
    with_heads = memoryctl("audit", "verify", "--db", str(d.db_path), "--heads", str(heads_file(d.db_path)))
    assert with_heads.returncode == 1
    stop = heads_of(d.db_path)[-1]["n"]
    assert f"ledger row {stop} is not the head witnessed outside the store: the ledger was rewritten" in with_heads.stdout
    again = daemon_factory(db=d.db_path, name="again")  # and the next start says so
    assert (f"ledger row {stop}, the head the heads file witnessed at memoryd's last stop, is changed: the ledger was "
            "rewritten while memoryd was stopped") in again.stderr()


async def test_memoryctl_prints_heads_and_accepts_with_yes(daemon_factory: Any, any_approvers: Path) -> None:
    d = daemon_factory("--config", str(any_approvers))
    sock = ["--socket", str(d.socket_path), "--no-autostart"]
    async with socket_client(d.socket_path) as raw:
        await add(raw, "Prefers tabs")
    printed = memoryctl(*sock, "audit", "heads")
    assert printed.returncode == 0
    assert [json.loads(line) for line in printed.stdout.splitlines()] == heads_of(d.db_path)
    dsh_memento_add(d.db_path, "Written by dsh-memento")
    verify = memoryctl(*sock, "audit", "verify")
    assert verify.returncode == 1
    [(n, body)] = foreign_rows(d.db_path)
    asked = memoryctl(*sock, "audit", "accept", str(n))  # no terminal, no --yes: nothing accepted
    assert asked.returncode == 2
    assert asked.stderr.endswith("error: USAGE: accepting a change needs a terminal to confirm it; pass --yes to "
                                 "accept without asking\n")
    assert [k for (k,) in sql(d.db_path, "SELECT kind FROM memoryd_ledger WHERE kind = 'accepted'")] == []
    done = memoryctl(*sock, "--yes", "audit", "accept", str(n))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"accepted ledger row {n}: ledger row ")
    assert body["note"] in done.stderr  # what was accepted was shown
    assert memoryctl(*sock, "audit", "verify").returncode == 0
    [eid] = [e["id"] for e in body["entries"]]
    life = memoryctl(*sock, "audit", "explain", eid)
    assert life.returncode == 0
    assert (f"written-outside-memoryd  by another program, never approved through memoryd (ledger row {n} records "
            'it)  text "Written by dsh-memento"') in life.stdout


async def test_a_ledger_replay_cannot_read_stops_writes_not_reads_nor_the_start(daemon_factory: Any) -> None:
    """Another program leaves the chain's first row unreadable: the check fails (logged), so
    the write it came before commits nothing, verify names the break, and the daemon starts
    again, serving reads and refusing writes while the check cannot run."""
    d = daemon_factory()
    async with socket_client(d.socket_path) as raw:
        await add(raw, "Prefers tabs")
        sql(d.db_path, "UPDATE memoryd_ledger SET body = 'not json' WHERE n = 1")
        before = sql(d.db_path, "SELECT count(*) FROM entries"), sql(d.db_path, "SELECT count(*) FROM memoryd_ledger")
        refused = await raw.fail("memory/add", {"input": {**LAYER, "text": "Uses uv"}, "write": write_ctx()})
        assert refused.code == "STORE_CORRUPT"
        assert (sql(d.db_path, "SELECT count(*) FROM entries"), sql(d.db_path, "SELECT count(*) FROM memoryd_ledger")
                ) == before
        report = await raw.ok("audit/verify")
        assert report["problems"][0] == {"n": 1, "reason": "the row's hash does not match its content: the row was "
                                                           "changed"}
    d.stop()
    assert ("memoryd cannot check the store for changes another program made (JSON is malformed: invalid character "
            "(byte 4)): it writes nothing until it can; audit verify names what is wrong") in d.stderr()
    sql(d.db_path, "UPDATE memoryd_usage SET used = 0")  # so the next start reconciles, and fails to
    again = daemon_factory(db=d.db_path, name="again")
    async with socket_client(again.socket_path) as raw:
        assert len(await raw.ok("memory/list")) == 1
        refused = await raw.fail("memory/add", {"input": {**LAYER, "text": "Uses uv"}, "write": write_ctx()})
        assert refused.code == "STORE_CORRUPT"


def append_raw(db: Path, kind: str, body: str, audit_seq: int | None) -> int:
    """A row chained onto the tip, as another program could append it; its n."""
    [(n, prev)] = sql(db, "SELECT n, hash FROM memoryd_ledger ORDER BY n DESC LIMIT 1")
    h = chain_hash(prev, n + 1, 7, kind, None, audit_seq, body)
    sql(db, "INSERT INTO memoryd_ledger (n, ts, kind, ref, audit_seq, body, prev, hash) VALUES (?, 7, ?, NULL, ?, ?, ?, ?)",
        n + 1, kind, audit_seq, body, prev, h)
    return int(n + 1)


async def test_a_row_of_another_program_that_claims_the_next_audit_seq_stops_nothing(accepting: Any) -> None:
    """Another program chains a row of a kind memoryd never writes, claiming the audit seq the
    next write would take: the write still commits, and once the foreign row is accepted
    verify holds again (the row is another program's, not one to read as memoryd's)."""
    d = accepting
    async with socket_client(d.socket_path) as raw:
        await add(raw, "Prefers tabs")
        [(seq,)] = sql(d.db_path, "SELECT seq FROM sqlite_sequence WHERE name = 'audit'")
        note = append_raw(d.db_path, "note", "{}", seq + 1)
        later = (await add(raw, "Uses uv"))["entry"]["id"]
        assert later in {e["id"] for e in await raw.ok("memory/list")}
        [(n, body)] = foreign_rows(d.db_path)
        assert body["ledgerRows"] == [note]
        await accept(raw, n)
        assert (await raw.ok("audit/verify"))["problems"] == []


async def test_a_dropped_usage_table_is_counted_again(daemon_factory: Any) -> None:
    d = daemon_factory()
    async with socket_client(d.socket_path) as raw:
        await add(raw, "Prefers tabs")
        sql(d.db_path, "DROP TABLE memoryd_usage")
        await add(raw, "Uses uv")
        assert sql(d.db_path, "SELECT entries, used FROM memoryd_usage WHERE track = 'user'") == [(2, 19)]
    d.stop()
    sql(d.db_path, "DROP TABLE memoryd_usage")
    again = daemon_factory(db=d.db_path, name="again")
    async with socket_client(again.socket_path) as raw:
        budgets = {(b["track"], b["scope"]): b["used"] for b in await raw.ok("memory/budgets")}
        assert budgets[("user", "user-global")] == 19
        await add(raw, "and more")


async def test_a_start_after_a_kill_names_the_rows_nothing_witnessed(daemon_factory: Any) -> None:
    d = daemon_factory()
    async with socket_client(d.socket_path) as raw:
        await add(raw, "Prefers tabs")
    d.proc.kill()
    d.proc.wait()
    [(tip,)] = sql(d.db_path, "SELECT max(n) FROM memoryd_ledger")
    witnessed = heads_of(d.db_path)[-1]
    assert witnessed["event"] == "start" and witnessed["n"] < tip
    again = daemon_factory(db=d.db_path, name="again")
    assert (f"memoryd did not stop cleanly: ledger rows {witnessed['n'] + 1}–{tip} came after the last head "
            f"witnessed outside the store (row {witnessed['n']})") in again.stderr()


async def test_row_numbers_beyond_sqlite_integers_are_invalid_input(accepting: Any) -> None:
    async with socket_client(accepting.socket_path) as raw:
        for method, params in (("audit/accept", {"n": 2**63}),
                               ("audit/verify", {"heads": [{"n": 2**63, "hash": "0" * 64}]})):
            err = await raw.fail(method, params)
            assert err.code == "INVALID_INPUT"
