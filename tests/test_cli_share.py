"""``memoryctl share`` against a real daemon, memoryctl a subprocess: entries that MCP
sessions wrote into their host's own layer (``claude-code``, ``gemini-cli``) move to the
shared layer, one consolidate per entry, each with its own approval; a 'no' at the prompt
keeps that entry; a command line that picks no single entry writes nothing."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import memoryd_client as mc
import pytest
from rawclient import write_ctx
from test_cli_edit import MEMORYCTL, env_with, hermetic_env, on_pty, sock

#: daemon_factory's daemons run in the test process (conftest), memoryctl is a subprocess,
#: and no memoryctl here touches the user's real socket or config
pytestmark = [pytest.mark.inprocess, pytest.mark.usefixtures(hermetic_env.__name__)]

AW = {"track": "agent", "scope": "workspace"}


def run(d: Any, *args: str) -> subprocess.CompletedProcess[str]:
    """memoryctl without a terminal: an approval it is asked is denied unless --yes."""
    return subprocess.run([*MEMORYCTL, *sock(d), *args], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=60, start_new_session=True)


def write_as(d: Any, agent: str, cwd: Path, text: str, tags: list[str] | None = None,
             layer: dict[str, str] | None = None) -> Any:
    """An entry written over the socket by a session of ``agent`` (its agentPreset) in ``cwd``,
    as an MCP session of that host wrote it before sessions defaulted to the shared layer."""
    with mc.connect_sync(d.socket_path, on_approval=lambda a: True, timeout=10) as c:
        inp = {**(layer or {"track": "user", "scope": "user-global"}), "text": text, "tags": tags or [],
               "source": agent or None}  # the host, as an MCP write names it
        return c.add(inp, write=write_ctx(f"s-{agent}", cwd=str(cwd), agent=agent)).entry


def state(d: Any) -> tuple[list[Any], list[Any], list[Any]]:
    """Entries, budgets and the ledger's audit rows."""
    with mc.connect_sync(d.socket_path, timeout=10) as c:
        return [mc.plain(e) for e in c.list()], [mc.plain(b) for b in c.budgets()], c.audit_list(10000)


def entries(d: Any) -> dict[str, Any]:
    with mc.connect_sync(d.socket_path, timeout=10) as c:
        return {e.text: e for e in c.list()}


def test_share_moves_each_agents_entries_to_the_shared_layer(ask_daemon: Any, tmp_path: Path) -> None:
    d = ask_daemon  # policy ask: each move is approved (--yes), one approval per entry
    proj, other = tmp_path / "proj", tmp_path / "other"
    for path in (proj, other):
        path.mkdir()
    tabs = write_as(d, "claude-code", proj, "Prefers tabs", ["style"])
    make = write_as(d, "claude-code", proj, "Run tests with make check", ["ci", "make"], AW)
    pnpm = write_as(d, "claude-code", other, "Uses pnpm", layer=AW)  # another workspace: stays
    english = write_as(d, "gemini-cli", proj, "Answers in English")
    shared = write_as(d, "", proj, "Already shared")
    assert {tabs.agent_key, make.agent_key, pnpm.agent_key, english.agent_key, shared.agent_key} == {
        "claude-code", "gemini-cli", ""}
    _, budgets, rows = state(d)

    r = run(d, "--yes", "--agent", "claude-code", "--cwd", str(proj), "share")
    assert r.returncode == 0, r.stderr
    moved = entries(d)
    assert r.stdout.splitlines() == [
        f"shared {tabs.id[:8]} as {moved['Prefers tabs'].id[:8]} (user/user-global 44/2000 chars)",
        f"shared {make.id[:8]} as {moved['Run tests with make check'].id[:8]} (agent/workspace 34/4000 chars)",
        "shared 2 entries of agent 'claude-code' with every agent"]
    assert "[1/2]" in r.stderr and "[2/2]" in r.stderr and r.stderr.count("approved (--yes)") == 2
    r = run(d, "--yes", "--json", "--agent", "gemini-cli", "share", "--track", "user")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert result["agentKey"] == "gemini-cli" and [x["removed"][0]["id"] for x in result["shared"]] == [english.id]

    now, after_budgets, after_rows = state(d)
    moved = entries(d)
    for old in (tabs, make, english):
        new = moved[old.text]
        assert (new.agent_key, new.track, new.scope, new.workspace_key, new.tags, new.source) == (
            "", old.track, old.scope, old.workspace_key, old.tags, old.source)
        assert new.source in ("claude-code", "gemini-cli")  # who wrote it is kept
        assert new.id != old.id
    assert moved["Uses pnpm"] == pnpm and moved["Already shared"] == shared
    assert len(now) == 5
    assert after_budgets == budgets  # same texts in the same cells
    # one consolidate per entry: its remove row, then its add row, the same text
    new_rows = [(x.action, x.entry_id, x.text) for x in reversed(after_rows[:len(after_rows) - len(rows)])]
    assert new_rows == [row for old in (tabs, make, english) for row in (
        ("consolidate-remove", old.id, old.text), ("consolidate-add", moved[old.text].id, old.text))]
    assert run(d, "audit", "verify").returncode == 0

    # every session now sees them: the shared layer (agentPreset '') and another host
    for agent in ("", "codex"):
        with mc.connect_sync(d.socket_path, session={"id": f"s-{agent}", "header": {"cwd": str(proj),
                                                                                     "agentPreset": agent}},
                             timeout=10) as c:
            seen = {e.text for e in c.query({"limit": 50}).entries}
            snapshot = c.snapshot().text
        assert seen == {"Prefers tabs", "Run tests with make check", "Answers in English", "Already shared"}
        assert "Prefers tabs" in snapshot and "Answers in English" in snapshot


def test_share_one_entry_by_match_or_id(daemon: Any, tmp_path: Path) -> None:
    d = daemon
    tabs = write_as(d, "codex", tmp_path, "Prefers tabs")
    vim = write_as(d, "codex", tmp_path, "Uses vim")
    uv = write_as(d, "codex", tmp_path, "Uses uv")
    r = run(d, "--yes", "--agent", "codex", "share", "TABS")  # case-insensitive, as the daemon matches
    assert r.returncode == 0, r.stderr
    r = run(d, "--yes", "--agent", "codex", "share", "--id", vim.id[:8])
    assert r.returncode == 0, r.stderr
    now = entries(d)
    assert (now["Prefers tabs"].agent_key, now["Uses vim"].agent_key, now["Uses uv"]) == ("", "", uv)
    assert tabs.id not in {e.id for e in now.values()}


def test_a_no_at_the_prompt_moves_nothing(ask_daemon: Any, tmp_path: Path) -> None:
    d = ask_daemon
    tabs = write_as(d, "claude-code", tmp_path, "Prefers tabs", ["style"])
    entries_before, budgets_before, rows_before = state(d)
    code, shown = on_pty([*sock(d), "--agent", "claude-code", "share"], env_with(), answers=[b"n\n"])
    assert code == 1, shown
    assert "consolidate into one, in user/user-global, shared by every agent:" in shown.replace(
        "\n  | ", "")  # the headline, cut at the terminal's width
    assert f"  - remove: id {tabs.id}\n" in shown and "  + Prefers tabs\n" in shown
    assert f"error: WRITE_DENIED: write denied: rejected: 1 of 1 entry stayed in agent 'claude-code''s layer " \
           f"({tabs.id[:8]}), 0 shared; run memoryctl share again to be asked about it again\n" in shown
    entries_after, budgets_after, rows_after = state(d)
    assert (entries_after, budgets_after) == (entries_before, budgets_before)
    assert [x.action for x in rows_after[:len(rows_after) - len(rows_before)]] == ["consolidate-denied"]


def test_a_no_keeps_that_entry_and_asks_about_the_next(ask_daemon: Any, tmp_path: Path) -> None:
    d = ask_daemon
    tabs = write_as(d, "claude-code", tmp_path, "Prefers tabs")
    vim = write_as(d, "claude-code", tmp_path, "Uses vim")
    code, shown = on_pty([*sock(d), "--agent", "claude-code", "share"], env_with(), answers=[b"n\n", b"y\n"])
    assert code == 1, shown
    assert shown.count("Approve? [y/N]") == 2
    assert f"1 of 2 entries stayed in agent 'claude-code''s layer ({tabs.id[:8]}), 1 shared;" in shown
    now = entries(d)
    assert now["Prefers tabs"] == tabs and now["Uses vim"].agent_key == "" and now["Uses vim"].id != vim.id


def test_without_a_terminal_the_first_denial_stops(ask_daemon: Any, tmp_path: Path) -> None:
    d = ask_daemon
    for text in ("Prefers tabs", "Uses vim"):
        write_as(d, "claude-code", tmp_path, text)
    entries_before, _, rows_before = state(d)
    r = run(d, "--agent", "claude-code", "share")
    assert r.returncode == 1 and "error: WRITE_DENIED: write denied: rejected" in r.stderr
    assert r.stderr.count("no terminal to ask for approval") == 1  # not asked again for the second
    entries_after, _, rows_after = state(d)
    assert entries_after == entries_before and len(rows_after) == len(rows_before) + 1


def test_a_command_line_that_picks_no_single_entry_writes_nothing(daemon: Any, tmp_path: Path) -> None:
    d = daemon
    proj, elsewhere = tmp_path / "proj", tmp_path / "elsewhere"
    for path in (proj, elsewhere):
        path.mkdir()
    tabs = write_as(d, "claude-code", proj, "Prefers tabs")
    write_as(d, "claude-code", proj, "Prefers tabs, always")
    make = write_as(d, "claude-code", proj, "Run make check", layer=AW)
    other = write_as(d, "gemini-cli", proj, "Answers in English")
    shared = write_as(d, "", proj, "Already shared")
    before = state(d)

    def fails(*args: str, cwd: Path = proj) -> tuple[int, str, dict[str, Any]]:
        r = run(d, "--json", "--cwd", str(cwd), *args)
        lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error: ")]
        assert len(lines) == 1, r.stderr
        return r.returncode, lines[0], json.loads(r.stdout)["error"]["details"] if r.stdout else {}

    code, line, _ = fails("share")
    assert (code, line) == (2, "error: USAGE: share moves entries out of an agent's own layer into the shared "
                               "one: name that agent with --agent NAME (memoryctl list shows each entry's AGENT)")
    code, line, details = fails("--agent", "cursor", "share")
    assert code == 1 and line == (
        "error: ENTRY_NOT_FOUND: agent 'cursor' has no entries of its own, so there is nothing to share (agents with "
        "entries of their own: claude-code, gemini-cli); memoryctl list shows each entry's AGENT")
    assert details == {"agentKey": "cursor"}
    code, line, _ = fails("--agent", "claude-code", "share", "--scope", "workspace", cwd=elsewhere)
    assert code == 1 and line == (f"error: ENTRY_NOT_FOUND: agent 'claude-code' has no entries in workspace "
                                  f"{elsewhere}; run again with --scope user-global (2 entries) or --cwd {proj} "
                                  "(1 entry)")
    code, line, _ = fails("--agent", "claude-code", "share", "--track", "agent", cwd=elsewhere)
    assert code == 1 and line == (f"error: ENTRY_NOT_FOUND: agent 'claude-code' has no entries in track agent, "
                                  f"user-global or workspace {elsewhere}; run again with --track user (2 entries) "
                                  f"or --cwd {proj} (1 entry)")
    code, line, details = fails("--agent", "claude-code", "share", "tabs")
    assert code == 1 and line.startswith("error: AMBIGUOUS_MATCH: MATCH is ambiguous: 2 entries of agent "
                                         "'claude-code' contain it (ids ")
    assert "name one with --id ID" in line and details["ids"][0] == tabs.id
    code, line, _ = fails("--agent", "claude-code", "share", "--track", "user", "make check")
    assert code == 1 and line == ("error: ENTRY_NOT_FOUND: no entry of agent 'claude-code' in track user, "
                                  f"user-global or workspace {proj} contains MATCH; run again with --track agent "
                                  "(1 entry) (match: make check)")
    code, line, _ = fails("--agent", "claude-code", "share", "--id", shared.id)
    assert code == 1 and f"entry {shared.id[:8]} is in the shared layer already" in line
    code, line, _ = fails("--agent", "claude-code", "share", "--id", other.id[:8])
    assert code == 1 and line.endswith("is agent 'gemini-cli''s, not agent 'claude-code''s; run again with "
                                       "--agent gemini-cli")
    code, line, _ = fails("--agent", "claude-code", "share", "--id", make.id, "make")
    assert (code, line) == (2, "error: USAGE: share: give MATCH or --id, not both (or neither, to share every "
                               "entry of the layer)")
    assert state(d) == before
