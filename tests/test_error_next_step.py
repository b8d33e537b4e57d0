"""Every error names the next step: an ambiguous match names its candidates by id, an --id
of another workspace or layer names the options that see it, a replace without its TEXT
says so, an over-budget write names the config key and consolidate, an import over the cap
says how to split it, and Ctrl-C in ``memoryctl approve`` says what becomes of the approval
at its prompt. Each against a real daemon, each showing the store unchanged."""

from __future__ import annotations

import json
import os
import pty
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import memoryd_client as mc
import pytest
from e2e_helpers import sql, state
from mcp_support import PROJ, mcp_client, mcp_daemon, tool_error
from processes import read_pty_until
from rawclient import socket_client, write_ctx
from test_cli import hermetic_env  # noqa: F401 (the autouse fixture: no test touches the real socket or config)

#: daemon_factory's daemons run in the test process (conftest); tests marked process need one of their own
pytestmark = pytest.mark.inprocess

MEMORYCTL = [sys.executable, "-m", "memoryd_client"]
UG = ["--track", "user", "--scope", "user-global"]
AW = ["--track", "agent", "--scope", "workspace"]
PLAIN = {**os.environ, "NO_COLOR": "1"}
AMBIGUOUS = ("match is ambiguous: {n} entries contain it (ids {ids}); name one with its id (memoryctl: --id ID; "
             "details.ids has the full ids) or use a longer substring")



def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """memoryctl as a subprocess in a session of its own (no terminal: policy ask denies)."""
    return subprocess.run([*MEMORYCTL, *args], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=timeout, start_new_session=True)


def sock(d: Any) -> list[str]:
    return ["--socket", str(d.socket_path), "--no-autostart"]


def error_line(r: subprocess.CompletedProcess[str]) -> str:
    """The one ``error:`` line a failed memoryctl prints, and nothing else on stderr."""
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: "), r.stderr
    return r.stderr.rstrip("\n")


def added(d: Any, *args: str) -> str:
    r = run(*sock(d), "--json", "add", *args)
    assert r.returncode == 0, r.stderr
    entry_id: str = json.loads(r.stdout)["entry"]["id"]
    return entry_id


def store(d: Any) -> tuple[list[Any], int]:
    """Entries and ledger length: what a refused command must leave as it was."""
    with mc.connect_sync(d.socket_path, timeout=10) as c:
        return [mc.plain(e) for e in c.list()], len(c.audit_list(10000))


# --- 1. an ambiguous match names its candidates ------------------------------------------


def test_an_ambiguous_match_names_the_visible_candidates_by_id(daemon: Any) -> None:
    d = daemon
    ids = [added(d, *UG, "metric") for _ in range(3)]
    hidden = added(d, "--agent", "coder", *UG, "metric")  # another agent's: not this session's candidate
    before = store(d)
    r = run(*sock(d), "--json", "replace", *UG, "metric", "new")
    shown = AMBIGUOUS.format(n=3, ids=", ".join(i[:8] for i in ids))
    assert (r.returncode, error_line(r)) == (1, f"error: AMBIGUOUS_MATCH: {shown} (match: metric)")
    error = json.loads(r.stdout)["error"]
    assert error["message"] == shown
    assert error["details"] == {"track": "user", "scope": "user-global", "match": "metric", "candidates": 3,
                                "sample": ["metric"] * 3, "ids": ids}
    assert hidden[:8] not in shown
    assert store(d) == before
    # the next step works: the short id names one of them
    r = run(*sock(d), "replace", *UG, "--id", ids[1][:8], "new")
    assert r.returncode == 0 and r.stdout.startswith(f"replaced {ids[1][:8]}, now version 2"), r.stderr


@pytest.mark.anyio
async def test_an_ambiguous_match_lists_at_most_ten_ids(daemon: Any) -> None:
    async with socket_client(daemon.socket_path) as raw:
        ids = [(await raw.ok("memory/add", {"input": {"track": "agent", "scope": "user-global", "text": f"tip {n}"},
                                            "write": write_ctx()}))["entry"]["id"] for n in range(12)]
        before = await state(raw)
        err = await raw.fail("memory/remove", {"input": {"track": "agent", "scope": "user-global", "match": "tip"},
                                               "write": write_ctx()})
        assert err.code == "AMBIGUOUS_MATCH"
        assert err.details["ids"] == ids[:10] and err.details["candidates"] == 12
        assert err.error["message"] == AMBIGUOUS.format(n=12, ids=", ".join(i[:8] for i in ids[:10]) + " and 2 more")
        assert "tip" not in err.error["message"]  # ids only: no memory text
        assert await state(raw) == before


@pytest.mark.anyio
async def test_mcp_shows_the_candidates_and_their_ids(tmp_path: Path, sock_dir: Path) -> None:
    ws = {"track": "user", "scope": "workspace"}
    async with mcp_daemon(tmp_path, sock_dir) as d, d.connect() as raw, mcp_client(d) as c:
        ids = [(await c.call_tool("memory_add", {**ws, "text": "metric"})).structured_content["entry"]["id"]  # type: ignore[index]
               for _ in range(2)]
        # the same text in another workspace is no candidate of this session's
        await raw.ok("memory/add", {"input": {**ws, "text": "metric"}, "write": write_ctx(cwd="/home/u/other")})
        before = await state(raw)
        r = await c.call_tool("memory_replace", {**ws, "match": "metric", "text": "new"})
        message = AMBIGUOUS.format(n=2, ids=", ".join(i[:8] for i in ids))
        error = tool_error(r)
        assert (error["code"], error["message"], error["details"]["ids"]) == ("AMBIGUOUS_MATCH", message, ids)
        assert await state(raw) == before
        # the next step: the entry's id
        r = await c.call_tool("memory_replace", {**ws, "id": ids[0], "text": "new"})
        assert not r.is_error and r.structured_content["entry"]["workspaceKey"] == PROJ  # type: ignore[index]


# --- 2. an --id the session cannot see: where it is ----------------------------------------


def test_an_id_elsewhere_names_the_options_that_see_it(daemon: Any, tmp_path: Path) -> None:
    d = daemon
    mine, other = tmp_path / "mine", tmp_path / "other"
    mine.mkdir()
    other.mkdir()
    in_other = added(d, "--cwd", str(other), *AW, "Run tests with make check")
    coders = added(d, "--agent", "coder", *UG, "Prefers tabs")
    shared = added(d, *UG, "Uses vim")
    before = store(d)
    base = "error: ENTRY_NOT_FOUND: no visible memory entry has this id: "
    cases = [
        (["--cwd", str(mine), "replace", *AW, "--id", in_other[:8], "x"],
         f"entry {in_other[:8]} is in agent/workspace of workspace {other}, shared by every agent; "
         f"run again with --cwd {other}"),
        (["remove", *UG, "--id", coders],
         f"entry {coders[:8]} is in user/user-global for agent 'coder'; run again with --agent coder"),
        (["--cwd", str(mine), "replace", *AW, "--id", shared[:6], "x"],
         f"entry {shared[:8]} is in user/user-global, shared by every agent; "
         "run again with --track user --scope user-global"),
        (["remove", *UG, "--id", "0123abcd"],
         "no entry anywhere in the store has an id starting 0123abcd; memoryctl list shows every entry's id"),
        (["remove", *UG, "--id", "01234567-89ab-4def-8123-456789abcdef"],
         "no entry anywhere in the store has this id; memoryctl list shows every entry's id"),
    ]
    for args, hint in cases:
        r = run(*sock(d), *args)
        assert (r.returncode, error_line(r)) == (1, base + hint), args
    # --json keeps the daemon's details, the hint in the message
    r = run(*sock(d), "--json", "remove", *UG, "--id", coders)
    assert json.loads(r.stdout)["error"]["details"] == {"track": "user", "scope": "user-global", "entryId": coders}
    assert store(d) == before
    # the next step works
    r = run(*sock(d), "--cwd", str(other), "replace", *AW, "--id", in_other[:8], "Run tests with make test")
    assert r.returncode == 0, r.stderr


# --- 3. replace without its new text -------------------------------------------------------


def test_replace_without_text_names_text(daemon: Any) -> None:
    d = daemon
    added(d, *UG, "metric")
    before = store(d)
    r = run(*sock(d), "replace", *UG, "metric")
    assert (r.returncode, error_line(r)) == (
        2, "error: USAGE: replace needs the new TEXT after MATCH: memoryctl replace --track user --scope user-global "
           "MATCH TEXT (or --id ID TEXT)")
    r = run(*sock(d), "remove", *UG)
    assert (r.returncode, error_line(r)) == (2, "error: USAGE: remove needs MATCH or --id")
    assert store(d) == before


# --- 4. over budget: the config key, and consolidate -----------------------------------------


def _over_budget(used: int, limit: int, needed: int, more: int, where: Path) -> str:
    return (f"memory budget exceeded: agent/workspace has {used}/{limit} characters used, this write would bring "
            f"it to {needed}/{limit} ({more} more); make room with memoryctl consolidate or memoryctl remove, or "
            f"raise the budget: workspace = N under [budgets.agent] in {where}, then restart memoryd")


def test_budget_exceeded_names_the_config_key_and_consolidate(daemon_factory: Any, tmp_path: Path) -> None:
    cfg = tmp_path / "small.toml"
    cfg.write_text("[budgets.agent]\nworkspace = 20\n")
    d = daemon_factory("--config", str(cfg))
    added(d, "--cwd", str(tmp_path), *AW, "x" * 15)
    before = store(d)
    r = run(*sock(d), "--cwd", str(tmp_path), "--json", "add", *AW, "y" * 10)
    message = _over_budget(15, 20, 25, 10, cfg)
    assert (r.returncode, error_line(r)) == (1, f"error: BUDGET_EXCEEDED: {message}")
    assert json.loads(r.stdout)["error"]["details"] == {"track": "agent", "scope": "workspace", "used": 15,
                                                        "limit": 20, "needed": 25}
    assert store(d) == before


def test_budget_exceeded_without_a_config_names_the_default_file(daemon: Any, tmp_path: Path) -> None:
    d = daemon
    default = Path(os.environ["XDG_CONFIG_HOME"]) / "memoryd" / "config.toml"
    assert not default.exists()
    before = store(d)
    r = run(*sock(d), "--cwd", str(tmp_path), "add", *AW, "z" * 4001)
    assert (r.returncode, error_line(r)) == (1, f"error: BUDGET_EXCEEDED: {_over_budget(0, 4000, 4001, 4001, default)}")
    assert store(d) == before


# --- 5. an import over the cap: how to split it --------------------------------------------


def test_an_import_over_the_cap_says_how_to_split_it(daemon: Any, tmp_path: Path) -> None:
    d = daemon
    entries = [{"track": "user", "scope": "user-global", "text": f"fact {n}"} for n in range(1001)]
    backup = tmp_path / "big.json"
    backup.write_text(json.dumps({"plugin": "dsh-memento", "schema": "memory-export-v1", "entries": entries}))
    notes = tmp_path / "CLAUDE.md"
    notes.write_text("".join(f"- fact {n}\n" for n in range(1001)))
    split = ("at most 1000 entries per import, and this one has 1001: split it into parts of at most 1000 entries "
             "and import each (with skipExisting, as memoryctl import sends it, entries already in the store are "
             "skipped, so re-running a part is safe)")
    before = store(d)
    r = run(*sock(d), "import", str(backup))
    assert (r.returncode, error_line(r)) == (1, f"error: INVALID_INPUT: {split}")
    r = run(*sock(d), "import", "--adapter", "claude-code-memory-md", str(notes))
    assert (r.returncode, error_line(r)) == (1, f"error: INVALID_INPUT: {split}")
    assert store(d) == before


@pytest.mark.anyio
async def test_a_seed_over_the_cap_says_how_to_split_it(daemon: Any) -> None:
    async with socket_client(daemon.socket_path) as raw:
        before = await state(raw)
        inputs = [{"track": "user", "scope": "user-global", "text": f"fact {n}"} for n in range(1001)]
        err = await raw.fail("memory/seed", {"inputs": inputs, "write": write_ctx()})
        assert (err.code, err.details) == ("INVALID_INPUT", {"field": "inputs"})
        assert err.error["message"] == ("at most 1000 entries per batch, and this one has 1001: send them as "
                                        "several memory/seed calls of at most 1000 entries each")
        assert await state(raw) == before


# --- 7. Ctrl-C in memoryctl approve ------------------------------------------------------------


def spawn_on_pty(*args: str) -> tuple[int, subprocess.Popen[bytes]]:
    """memoryctl on a pseudo-terminal that is its controlling terminal (``setsid --ctty``)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(["setsid", "--ctty", *MEMORYCTL, *args], stdin=slave, stdout=slave, stderr=slave,
                            env=PLAIN)
    os.close(slave)
    return master, proc


def read_to_exit(master: int) -> bytes:
    """Everything the terminal shows until the process on it closes it."""
    buf = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the last process on the terminal is gone
            return buf
        if not chunk:
            return buf
        buf += chunk


@pytest.mark.process
def test_ctrl_c_at_the_approve_prompt_says_what_becomes_of_the_approval(ask_daemon: Any) -> None:
    d = ask_daemon
    master, proc = spawn_on_pty(*sock(d), "approve")
    writer: subprocess.Popen[str] | None = None
    try:
        read_pty_until(master, b"(Ctrl-C to stop)")
        writer = subprocess.Popen([*MEMORYCTL, *sock(d), "--via-approver", "--session", "agent-7", "add", *UG,
                                   "Pending at Ctrl-C"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, start_new_session=True)
        read_pty_until(master, b"Approve? [y/N] ")
        os.write(master, b"\x03")  # Ctrl-C, as the terminal sends it: SIGINT to memoryctl
        shown = read_to_exit(master).decode().replace("\r\n", "\n")
        assert proc.wait(30) == 0
        _, err = writer.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        os.close(master)
        if writer is not None and writer.poll() is None:
            writer.kill()
            writer.communicate(timeout=10)
    # the approval the prompt showed, as the ledger recorded it (its asked row is committed with the denial)
    [(approval,)] = sql(d.db_path, "SELECT ref FROM memoryd_ledger WHERE kind = 'asked'")
    lines = [ln for ln in shown.split("\n") if ln.strip() and ln.strip() != "^C"]
    assert lines == [f"memoryctl: stopped; approval {approval[:8]} was left undecided: another approver it was asked of "
                     "may still decide it; if none was, the daemon denies the write (unavailable)"]
    assert "no longer pending" not in shown
    # it was the only approver asked: the daemon denied the write as unavailable, and nothing was written
    assert (writer.returncode, err) == (1, "error: WRITE_DENIED: write denied: unavailable; no approver is "
                                           "subscribed: run `memoryctl approve` in another terminal\n")
    [(outcome,)] = sql(d.db_path, "SELECT json_extract(body, '$.outcome') FROM memoryd_ledger WHERE kind = 'decided' "
                                  "AND ref = ?", approval)
    assert outcome == "unavailable"
    with mc.connect_sync(d.socket_path, timeout=10) as c:
        assert c.list() == [] and [a.action for a in c.audit_list()] == ["add-denied"]


@pytest.mark.process
def test_ctrl_c_without_a_pending_approval_stays_quiet(ask_daemon: Any) -> None:
    master, proc = spawn_on_pty(*sock(ask_daemon), "approve")
    try:
        read_pty_until(master, b"(Ctrl-C to stop)\r\n")
        proc.send_signal(signal.SIGINT)
        shown = read_to_exit(master).decode()
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        os.close(master)
    assert re.fullmatch(r"\s*", shown), shown
    with mc.connect_sync(ask_daemon.socket_path, timeout=10) as c:
        assert c.list() == []
