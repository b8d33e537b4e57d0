"""``memoryctl audit verify`` and ``audit explain`` against real daemons, through the daemon
and offline (``--db`` on a store that no daemon holds), the Python client's
``audit_verify``/``audit_explain``, and the rendering of a report and of an entry's life."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import memoryd_client as mc
import msgspec
import pytest
from memoryd_client import render
from memoryd_client.cli import main
from memoryd_protocol import types as T
from test_cli import UG, cli, error_line, hermetic_env, run, store_state  # noqa: F401 - hermetic_env is autouse
from test_e2e_store import make_store

EXE = os.path.realpath("/proc/self/exe")  # what the daemon reads of this (in-process memoryctl) process
NOT_IN_CHAIN = "is not in the chain: another program wrote it, or it was forged"

#: daemon_factory's daemons run in the test process (conftest); tests marked process need one of their own
pytestmark = pytest.mark.inprocess




def report(d: Any) -> T.LedgerReport:
    with mc.connect_sync(d.socket_path, timeout=10) as c:
        return c.audit_verify()


def ok_line(r: T.LedgerReport) -> str:
    return (f"ledger ok: {r.rows} rows, {r.audit_rows} audit rows chained since audit row {r.after_audit_seq}; "
            f"head {r.head}\n{r.note}\n")


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tamper(db: Path, *sql: str) -> None:
    with sqlite3.connect(db) as conn:
        for statement in sql:
            conn.execute(statement)
    conn.close()


def write_some(capsys: pytest.CaptureFixture[str], d: Any) -> None:
    for args in (["add", *UG, "Uses pnpm"], ["replace", *UG, "pnpm", "Uses pnpm, never npm"],
                 ["add", *UG, "Prefers tabs"], ["snapshot"]):
        code, _, err = cli(capsys, d, "--yes", "--session", "s-1", *args)
        assert code == 0, err


# --- the Python client ---------------------------------------------------------------------


def test_client_audit_verify_and_explain(daemon: Any) -> None:
    with mc.connect_sync(daemon.socket_path, session=mc.make_session("s-1", cwd="/p"), timeout=10) as c:
        added = c.add({"track": "user", "scope": "user-global", "text": "Uses pnpm"})
        r = c.audit_verify()
        assert isinstance(r, T.LedgerReport)
        assert (r.ok, r.audit_rows, r.after_audit_seq, r.problems) == (True, 1, 0, [])
        life = c.audit_explain("PNPM")
        assert isinstance(life, T.EntryLife) and isinstance(life.current, T.LedgerEntry)
        assert life.entry_id == added.entry.id and life.current.text == "Uses pnpm"
        [event] = life.events
        assert isinstance(event, T.LedgerEvent) and isinstance(event.asked_by, T.LedgerConnection)
        assert (event.action, event.session_id, event.asked_by.pid, event.decision) == ("add", "s-1", os.getpid(), None)
        assert c.audit_explain(added.entry.id) == life
        with pytest.raises(mc.InvalidInput) as caught:
            c.audit_explain("no such text")
        assert caught.value.details == {"field": "target"}
        assert str(caught.value.message) == "no entry in the store or its ledger has this id or contains this text"


@pytest.mark.anyio
async def test_async_client_audit_methods(daemon: Any) -> None:
    async with mc.connect(daemon.socket_path, session=mc.make_session("s-1"), timeout=10) as c:
        await c.add({"track": "agent", "scope": "user-global", "text": "CI runs make check"})
        assert (await c.audit_verify()).ok is True
        assert [e.action for e in (await c.audit_explain("make check")).events] == ["add"]


# --- memoryctl audit verify ----------------------------------------------------------------


def test_verify_through_the_daemon_ok_then_broken(capsys: pytest.CaptureFixture[str], daemon: Any) -> None:
    write_some(capsys, daemon)
    good = report(daemon)
    assert good.ok and good.note == "the chain starts with the store"
    assert cli(capsys, daemon, "audit", "verify") == (0, ok_line(good), "")
    code, out, _ = cli(capsys, daemon, "audit", "verify", "--json")
    assert (code, msgspec.json.decode(out, type=T.LedgerReport)) == (0, good)

    tamper(daemon.db_path, "UPDATE audit SET text = 'harmless' WHERE seq = 2",
           "INSERT INTO audit (ts, action, text) VALUES (1, 'add', 'forged')")
    forged = good.audit_rows + 1
    bad = report(daemon)
    changed, foreign = bad.problems
    assert (changed.seq, changed.reason) == (2, "audit row 2 was changed after it was written")
    # the forged row is found as another program's write, and recorded as such
    assert foreign.n == good.rows + 1
    code, out, err = cli(capsys, daemon, "audit", "verify")
    assert (code, err) == (1, "")
    assert out == (f"ledger BROKEN at row {changed.n} (audit row 2): audit row 2 was changed after it was written\n"
                   f"  row {foreign.n}: ledger row {foreign.n} records a change another program made to the store, "
                   f"not accepted yet: 1 audit rows written (seq {forged}) (while memoryd ran). Check it, then run "
                   f"memoryctl audit accept {foreign.n}\n")
    code, out, _ = cli(capsys, daemon, "--json", "audit", "verify")
    assert (code, msgspec.json.decode(out, type=T.LedgerReport)) == (1, bad)


def test_verify_offline_on_a_stopped_daemons_store(capsys: pytest.CaptureFixture[str], daemon_factory: Any) -> None:
    d = daemon_factory()
    write_some(capsys, d)
    online = report(d)
    d.stop()
    before = digest(d.db_path)
    code, out, err = cli(capsys, d, "audit", "verify", "--db", str(d.db_path))
    assert (code, out, err) == (0, ok_line(online), "")
    code, out, _ = cli(capsys, d, "--json", "--db", str(d.db_path), "audit", "verify")  # --db before the verb
    assert (code, msgspec.json.decode(out, type=T.LedgerReport)) == (0, online)
    assert digest(d.db_path) == before  # read-only

    tamper(d.db_path, "UPDATE memoryd_ledger SET body = replace(body, 'never npm', 'always npm') "
                      "WHERE body LIKE '%never npm%' AND kind = 'audit'")
    with sqlite3.connect(d.db_path) as conn:
        (n,) = conn.execute("SELECT min(n) FROM memoryd_ledger WHERE body LIKE '%always npm%'").fetchone()
    conn.close()
    code, out, err = cli(capsys, d, "audit", "verify", "--db", str(d.db_path))
    assert (code, out, err) == (1, f"ledger BROKEN at row {n}: the row's hash does not match its content: "
                                   f"the row was changed\n", "")


@pytest.mark.process
def test_verify_offline_after_a_kill_reads_the_wal_and_ignores_the_stale_owner_record(
    capsys: pytest.CaptureFixture[str], daemon_factory: Any
) -> None:
    d = daemon_factory()
    write_some(capsys, d)
    online = report(d)
    d.proc.kill()
    d.proc.wait()
    owner = d.db_path.with_name(d.db_path.name + ".memoryd-owner")
    assert owner.exists() and Path(f"{d.db_path}-wal").stat().st_size > 0  # what a kill -9 leaves
    assert cli(capsys, d, "audit", "verify", "--db", str(d.db_path)) == (0, ok_line(online), "")


@pytest.mark.process
def test_verify_offline_is_refused_while_a_daemon_holds_the_store(
    capsys: pytest.CaptureFixture[str], daemon: Any, tmp_path: Path
) -> None:
    write_some(capsys, daemon)
    before = store_state(daemon)
    code, out, err = cli(capsys, daemon, "audit", "verify", "--db", str(daemon.db_path))
    held = f"store {daemon.db_path} is held by memoryd pid {daemon.proc.pid}, serving {daemon.socket_path}"
    assert (code, out, err) == (2, "", f"error: USAGE: {held}: ask that daemon instead, run it without --db\n")
    # from elsewhere (another socket): also name the daemon's
    r = run("--socket", str(tmp_path / "other.sock"), "audit", "explain", "--db", str(daemon.db_path), "pnpm")
    assert (r.returncode, r.stdout) == (2, "")
    assert error_line(r.stderr) == (f"error: USAGE: {held}: ask that daemon instead, run it without --db and with "
                                    f"--socket {daemon.socket_path}")
    assert store_state(daemon) == before


def test_verify_offline_on_what_is_not_a_memoryd_store(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    nowhere = ["--socket", str(tmp_path / "none.sock"), "--no-autostart"]

    def offline(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main([*nowhere, "audit", *args])
        out, err = capsys.readouterr()
        return code, out, err

    missing = tmp_path / "missing.db"
    assert offline("verify", "--db", str(missing)) == (2, "", f"error: USAGE: {missing} does not exist\n")
    assert not missing.exists()
    text = tmp_path / "notes.txt"
    text.write_text("hello\n")
    assert offline("verify", "--db", str(text)) == (
        2, "", f"error: USAGE: {text} is not a memory store: file is not a database\n")
    assert offline("verify", "--db", str(tmp_path)) == (2, "", f"error: USAGE: {tmp_path} is not a file\n")
    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.close()
    assert offline("explain", "--db", str(other), "x") == (
        2, "", f"error: USAGE: {other} is not a memory store (it has no entries and audit tables)\n")

    memento = tmp_path / "memento.db"  # a dsh-memento store that memoryd never opened
    make_store(memento, 4)
    before = digest(memento)
    no_ledger = (f"error: NO_LEDGER: this store has no ledger yet: memoryd has never written to it ({memento}); "
                 f"its chain begins when memoryd first opens it\n")
    assert offline("verify", "--db", str(memento)) == (1, "", no_ledger)
    assert offline("explain", "--db", str(memento), "tabs") == (1, "", no_ledger)
    code, out, err = offline("--json", "verify", "--db", str(memento))
    assert (code, err) == (1, no_ledger)
    assert json.loads(out)["error"] == {"code": "NO_LEDGER", "message": no_ledger.split(": ", 2)[2].rstrip("\n"),
                                        "details": {"path": str(memento)}}
    assert digest(memento) == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("memento")) == ["memento.db"]


def test_audit_usage_errors(capsys: pytest.CaptureFixture[str], daemon: Any) -> None:
    for args, message in [(["explain"], "the following arguments are required: TEXT|ID "
                                        "(see 'memoryctl audit explain --help')"),
                          (["verify", "pnpm"], "unrecognized arguments: pnpm (see 'memoryctl --help')"),
                          (["pnpm"], "argument ACTION: invalid choice: 'pnpm' (choose from 'list', 'verify', "
                                     "'explain', 'accept', 'heads') (see 'memoryctl audit --help')"),
                          (["--limit", "3", "verify"], "--limit goes with audit list, not audit verify"),
                          (["explain", "--db", "x.db", "a", "b"], "unrecognized arguments: b (see 'memoryctl --help')")]:
        code, out, err = cli(capsys, daemon, "audit", *args)
        assert (code, out, err) == (2, "", f"error: USAGE: {message}\n"), args
    # the plain listing is unchanged
    code, out, _ = cli(capsys, daemon, "audit", "--limit", "5")
    assert (code, out) == (0, "no audit rows\n")


# --- memoryctl audit explain ---------------------------------------------------------------


def event_line(ev: T.LedgerEvent, action: str, text: str) -> str:
    """An event memoryctl --yes approved at its own prompt: the kernel's facts of the deciding
    process (this one), then its claim."""
    assert ev.decision is not None and ev.decision.decider is not None
    decider = ev.decision.decider
    assert (decider.pid, decider.exe) == (os.getpid(), EXE)
    return (f"  {render.when(ev.ts)}  {action}  allowed-once (via approval, writePolicy ask)  session s-1  "
            f"asked by memoryctl {mc.__version__} (pid {os.getpid()}, {EXE})  approved by memoryctl pid "
            f"{os.getpid()} ({EXE}, tty {decider.tty or 'none'}), the asking connection, "
            f'claimed script "memoryctl --yes"  text {json.dumps(text)}')


def test_explain_through_the_daemon_and_offline(capsys: pytest.CaptureFixture[str], daemon_factory: Any) -> None:
    d = daemon_factory(policy="ask")
    write_some(capsys, d)
    with mc.connect_sync(d.socket_path, timeout=10) as c:
        life = c.audit_explain("pnpm")
    add, replace = life.events
    code, out, err = cli(capsys, d, "audit", "explain", "PNPM")
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        f"entry {life.entry_id}",
        "  now:     user/user-global  workspace -  agent (shared)  tags -  source memoryctl  version 2",
        "  | Uses pnpm, never npm",
        "events (2, oldest first):",
        event_line(add, "add", "Uses pnpm"),
        event_line(replace, "replace", "Uses pnpm, never npm"),
        "in the snapshots of 1 session: s-1",
    ]
    code, out, _ = cli(capsys, d, "--json", "audit", "explain", life.entry_id)
    assert (code, msgspec.json.decode(out, type=T.EntryLife)) == (0, life)

    # errors: the daemon's message, exit 1, nothing written
    before = store_state(d)
    code, out, err = cli(capsys, d, "audit", "explain", "no such text")
    assert (code, out) == (1, "")
    assert err == "error: INVALID_INPUT: no entry in the store or its ledger has this id or contains this text\n"
    code, out, err = cli(capsys, d, "--json", "audit", "explain", "s")
    ids = ", ".join(sorted(e.id for e in before[0]))
    assert (code, err) == (1, f"error: INVALID_INPUT: 2 entries contain this text; name one by id: {ids}\n")
    assert json.loads(out)["error"]["details"] == {"field": "target"}
    assert store_state(d) == before

    # a removed entry is explained from the ledger, through the daemon and offline
    assert cli(capsys, d, "--yes", "--session", "s-1", "remove", *UG, "pnpm")[0] == 0
    code, out, _ = cli(capsys, d, "audit", "explain", "never npm")
    lines = out.splitlines()
    assert code == 0 and lines[1] == "  now:     removed (no longer in the store)" and lines[2] == "events (3, oldest first):"
    with mc.connect_sync(d.socket_path, timeout=10) as c:
        removed = c.audit_explain(life.entry_id)
    assert lines[5] == event_line(removed.events[2], "remove", "Uses pnpm, never npm")
    d.stop()
    code, offline, err = cli(capsys, d, "audit", "explain", "--db", str(d.db_path), "never npm")
    assert (code, offline, err) == (0, out, "")
    code, out, err = cli(capsys, d, "audit", "explain", "--db", str(d.db_path), "nothing like it")
    assert (code, out) == (1, "")
    assert err == "error: INVALID_INPUT: no entry in the store or its ledger has this id or contains this text\n"


# --- rendering (pure) ----------------------------------------------------------------------


def conn(ref: str, pid: int | None, exe: str | None, name: str | None) -> T.LedgerConnection:
    return T.LedgerConnection(ref=ref, run="r", id=1, transport="socket", pid=pid, uid=0, exe=exe,
                              client=None if name is None else T.ClientInfo(name=name), opened_at=0)


def test_render_an_entrys_life() -> None:
    harness, approver = conn("r/1", 10, "/usr/bin/node", "harness"), conn("r/2", 20, None, None)
    entry = T.LedgerEntry(id="e1", track="agent", scope="workspace", workspace_key="/p", agent_key="coder",
                          text="two\nlines\x1b[31m", tags=["a", "b"], source="s", version=1)

    def event(action: str, decision: T.LedgerDecision | None, asked_by: T.LedgerConnection | None = harness,
              text: str | None = "t") -> T.LedgerEvent:
        return T.LedgerEvent(n=1, seq=1, ts=0, action=action, outcome="o", text=text, session_id=None,
                             asked_by=asked_by, decision=decision)

    def decision(outcome: str | None, by: T.LedgerConnection | None, claim: T.ApprovalBy | None = None,
                 failed: str | None = None) -> T.LedgerDecision:
        return T.LedgerDecision(approval="a1", outcome=outcome, policy="ask", decided_by=by, by=claim, reason=None,
                                failed=failed)

    life = T.EntryLife(entry_id="e1", current=entry, snapshots=["s-1", "s-2"], events=[
        T.LedgerEvent(n=1, seq=None, ts=0, action="present-at-start", outcome=None, text="old", session_id=None,
                      asked_by=None, decision=None),
        event("replace", decision("allowed-once", approver, T.ApprovalBy(kind="human", name="ana"))),
        event("add-denied", decision("cancelled", None), text="a\nb"),
        event("remove", decision("allowed-once", harness, None, "STORE_UNAVAILABLE"), asked_by=None, text=None),
        event("add", decision(None, None)),
    ])
    at = render.when(0)
    assert render.entry_life(life).splitlines() == [
        "entry e1",
        '  now:     agent/workspace  workspace "/p"  agent "coder"  tags a, b  source s  version 1',
        "  | two",
        "  | lines\\x1b[31m",
        "events (5, oldest first):",
        f'  {at}  present-at-start  in the store when the ledger\'s chain began  text "old"',
        f'  {at}  replace  o  session -  asked by harness (pid 10, /usr/bin/node)  decided allowed-once by an unnamed '
        f'client (pid 20), who claims human "ana"  text "t"',
        f'  {at}  add-denied  o  session -  asked by harness (pid 10, /usr/bin/node)  decided cancelled, decided by no '
        f'connection (timed out, disconnected or shut down)  text "a\\nb"',
        f"  {at}  remove  o  session -  asked by memoryd itself  decided allowed-once by harness (pid 10, /usr/bin/node); "
        f"its commit failed: STORE_UNAVAILABLE",
        f'  {at}  add  o  session -  asked by harness (pid 10, /usr/bin/node)  decided approval a1 has no decision row  '
        f'text "t"',
        "in the snapshots of 2 sessions: s-1, s-2",
    ]
    empty = T.EntryLife(entry_id="e2", current=None, events=[], snapshots=[])
    assert render.entry_life(empty).splitlines() == [
        "entry e2", "  now:     removed (no longer in the store)", "events: none in the ledger",
        "in no session's snapshot"]


def test_an_mcp_host_s_write_and_its_elicitation_are_shown_as_what_they_are() -> None:
    host = T.LedgerConnection(ref="r/3", run="r", id=3, transport="mcp", pid=30, uid=0, exe="/usr/bin/node",
                              client=T.ClientInfo(name="Claude Code", version="2.1.0"), opened_at=0)
    claim = T.ApprovalBy(kind="human", name="mcp-elicitation")
    event = T.LedgerEvent(n=1, seq=1, ts=0, action="add", outcome="allowed-once", text=None, session_id="s-1",
                          asked_by=host, decision=T.LedgerDecision(approval="a1", outcome="allowed-once", policy="ask",
                                                                   decided_by=host, by=claim, reason=None, failed=None))
    shown = render.entry_life(T.EntryLife(entry_id="e1", current=None, events=[event], snapshots=[]))
    assert ("asked by Claude Code 2.1.0 through memoryd mcp (pid 30, /usr/bin/node)  decided allowed-once by the "
            'asking connection, who claims human "mcp-elicitation"') in shown


def test_render_a_report() -> None:
    ok = T.LedgerReport(ok=True, rows=3, audit_rows=2, after_audit_seq=7, note="n", head="h", problems=[])
    assert render.ledger_report(ok) == "ledger ok: 3 rows, 2 audit rows chained since audit row 7; head h\nn"
    assert render.ledger_report(msgspec.structs.replace(ok, note="")) == (
        "ledger ok: 3 rows, 2 audit rows chained since audit row 7; head h")
    broken = msgspec.structs.replace(ok, ok=False, problems=[
        T.LedgerProblem(reason="first\x07", n=4), T.LedgerProblem(reason="second", n=5, seq=9),
        T.LedgerProblem(reason="third", seq=10), T.LedgerProblem(reason="entry e differs")])
    assert render.ledger_report(broken).splitlines() == [
        "ledger BROKEN at row 4: first\\x07", "  row 5 (audit row 9): second", "  audit row 10: third",
        "  entry e differs"]
    assert render.ledger_report(msgspec.structs.replace(broken, problems=[T.LedgerProblem(reason="x")])) == (
        "ledger BROKEN: x")


def test_memoryctl_loads_the_ledger_code_only_for_the_offline_commands() -> None:
    code = ("import sys, memoryd_client.cli\n"
            "print([m for m in ('sqlite3', 'memoryd_protocol.ledger', 'memoryd_client.offline') if m in sys.modules])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert r.stdout == "[]\n"
