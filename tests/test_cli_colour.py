"""memoryctl's colour: on a terminal only, decided per stream; off under NO_COLOR, on a dumb
terminal and through a pipe; FORCE_COLOR forces it. Tables keep their columns (widths are
the visible text's), and the approval prompt shows what a write removes in red and what it
adds in green, never guessing where a text that looks like the prompt's own format ends."""

from __future__ import annotations

import os
import pty
import re
import subprocess
from pathlib import Path
from typing import Any

import memoryd_client as mc
import pytest
from memoryd_client import colour, watching
from memoryd_client.events import Event
from memoryd_protocol import types as T
from memoryd_protocol.approval_text import approval_request, table
from test_cli_edit import MEMORYCTL, UG, add, hermetic_env, on_pty, sock

#: daemon_factory's daemons run in the test process (conftest), memoryctl is a subprocess,
#: and no memoryctl here touches the user's real socket or config
pytestmark = [pytest.mark.inprocess, pytest.mark.usefixtures(hermetic_env.__name__)]

SGR = re.compile(r"\x1b\[[0-9;]*m")
BOLD, DIM, RED, GREEN, RESET = "\x1b[1m", "\x1b[2m", "\x1b[31m", "\x1b[32m", "\x1b[0m"


def visible(text: str) -> str:
    return SGR.sub("", text)


def coloured_env(**values: str) -> dict[str, str]:
    """A terminal that takes colour (TERM set, neither NO_COLOR nor FORCE_COLOR)."""
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    return {**env, "TERM": "xterm-256color", "COLUMNS": "120", "LINES": "40", **values}


# --- the decision --------------------------------------------------------------------------


@pytest.mark.parametrize(("env", "on_pty_", "on_pipe"), [
    ({"TERM": "xterm"}, True, False),
    ({"TERM": "xterm", "NO_COLOR": "1"}, False, False),
    ({"TERM": "xterm", "NO_COLOR": ""}, True, False),  # NO_COLOR counts only when it is not empty
    ({"TERM": "dumb"}, False, False),
    ({}, False, False),  # no TERM: as git has it, a dumb terminal
    ({"TERM": "xterm", "FORCE_COLOR": "1"}, True, True),
    ({"FORCE_COLOR": "1"}, True, True),
    ({"TERM": "xterm", "FORCE_COLOR": "1", "NO_COLOR": "1"}, False, False),  # no says no
    ({"TERM": "xterm", "FORCE_COLOR": "0"}, True, False),
])
def test_colour_is_decided_per_stream(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], on_pty_: bool,
                                      on_pipe: bool) -> None:
    for var in ("TERM", "NO_COLOR", "FORCE_COLOR"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    master, slave = pty.openpty()
    read, write = os.pipe()
    try:
        with open(slave, "w", closefd=False) as terminal, open(write, "w", closefd=False) as pipe:
            assert (colour.enabled(terminal), colour.enabled(pipe)) == (on_pty_, on_pipe)
            assert (colour.painter(terminal), colour.painter(pipe)) == (
                colour.paint if on_pty_ else colour.plain, colour.paint if on_pipe else colour.plain)
        assert (colour.enabled(slave), colour.enabled(write)) == (on_pty_, on_pipe)
    finally:
        for fd in (master, slave, read, write):
            os.close(fd)


def test_paint() -> None:
    assert colour.paint("x", "red") == f"{RED}x{RESET}"
    assert colour.paint("x", "red bold") == f"\x1b[31;1mx{RESET}"
    assert colour.paint("", "red") == "" and colour.paint("x", "") == "x"
    assert colour.plain("x", "red") == "x"


# --- tables --------------------------------------------------------------------------------


def test_tables_keep_their_columns_in_colour(monkeypatch: pytest.MonkeyPatch) -> None:
    headers = ["ID", "TRACK", "TEXT"]
    rows = [["1a2b3c4d", "user", "Prefers tabs"], ["9f8e7d6c", "agent", "Uses vim\tinside tmux, every day"]]
    plain = table(headers, rows)
    painted = table(headers, rows, paint=colour.paint, dim=(0,))
    assert visible(painted) == plain
    assert painted.splitlines() == [
        f"{BOLD}ID        TRACK  TEXT{RESET}",
        f"{DIM}1a2b3c4d{RESET}  user   Prefers tabs",
        f"{DIM}9f8e7d6c{RESET}  agent  Uses vim\\tinside tmux, every day",
    ]
    # cut to the terminal's width on the visible text, the colour closed before the cut
    monkeypatch.setenv("COLUMNS", "26")
    cut = table(headers, rows, fit=True, paint=colour.paint, dim=(0, 2))
    assert visible(cut) == table(headers, rows, fit=True)
    assert cut.splitlines()[2] == f"{DIM}9f8e7d6c{RESET}  agent  {DIM}Uses vim…{RESET}"
    assert [len(line) for line in visible(cut).splitlines()] == [21, 26, 26]


# --- the approval prompt -----------------------------------------------------------------


def asked(action: str, text: str, **kw: Any) -> T.ApprovalAsked:
    return T.ApprovalAsked(id="a5ce79ce-e74e-4435-8d88-b4d64e70de0a", action=action, track="user",  # type: ignore[arg-type]
                           scope="user-global", text=text, source="memoryctl", session_id="s-1", reason="-", **kw)


def payload(shown: str) -> list[str]:
    """The change: the lines between the headline and the details."""
    lines = shown.split("\n")
    return lines[1:next(n for n, ln in enumerate(lines) if ln.startswith("  source:"))]


@pytest.mark.parametrize(("action", "text", "lines"), [
    ("add", "Prefers tabs\nalways", [f"  + {GREEN}Prefers tabs{RESET}", f"  + {GREEN}always{RESET}"]),
    ("remove", "Prefers tabs", [f"  - {RED}Prefers tabs{RESET}"]),
    ("replace", "from:\nPrefers tabs\n\nto:\nPrefers spaces",
     [f"  + {GREEN}Prefers spaces{RESET}", f"  - {RED}Prefers tabs{RESET}"]),
    ("consolidate", "remove: vim\nUses vim\nremove: tmux\nUses tmux\nnew text: Uses vim in tmux",
     [f"  + {GREEN}Uses vim in tmux{RESET}", f"  - {RED}remove: vim{RESET}", f"  - {RED}Uses vim{RESET}",
      f"  - {RED}remove: tmux{RESET}", f"  - {RED}Uses tmux{RESET}"]),
    # an old text that holds the separator itself: which "to:" is the real one cannot be
    # told, so the payload is shown whole, unmarked and unpainted
    ("replace", "from:\nPrefers tabs\n\nto:\nPrefers spaces\n\nto:\nPrefers spaces",
     ["  | from:", "  | Prefers tabs", "  | ", "  | to:", "  | Prefers spaces", "  | ", "  | to:",
      "  | Prefers spaces"]),
    ("consolidate", "remove: a\nnew text: b\nnew text: b", ["  | remove: a", "  | new text: b", "  | new text: b"]),
])
def test_the_prompt_shows_what_goes_in_red_and_what_comes_in_green(action: str, text: str,
                                                                   lines: list[str]) -> None:
    shown = approval_request(asked(action, text), paint=colour.paint)
    word = {"add": "to", "remove": "from", "replace": "in"}.get(action, "into one, in")
    assert shown.startswith(f"{BOLD}{action} {word} user/user-global:{RESET}\n")
    assert payload(shown) == lines
    assert visible(shown) == approval_request(asked(action, text))


def test_a_painted_prompt_is_cut_as_the_plain_one() -> None:
    long = "x" * 90
    shown = approval_request(asked("replace", f"from:\n{long}\n\nto:\n{long}"), width=50, paint=colour.paint)
    assert visible(shown) == approval_request(asked("replace", f"from:\n{long}\n\nto:\n{long}"), width=50)
    # a cut line's rest goes on under the gutter, in the colour of its line
    assert payload(shown)[:3] == [f"  + {GREEN}{'x' * 45}{RESET}", f"  | {GREEN}{'x' * 45}{RESET}",
                                  f"  - {RED}{'x' * 45}{RESET}"]


def test_a_seeds_entries_are_green() -> None:
    entry = T.ApprovalEntry(track="user", scope="user-global", workspace_key="", agent_key="", text="fact", tags=[])
    shown = approval_request(asked("seed", "(payload)", count=1, entries=[entry]), paint=colour.paint)
    assert f"  entries:\n  [1] user/user-global  workspace -  agent (shared)  tags -\n  + {GREEN}fact{RESET}\n" \
        in shown
    assert "\x1b" not in shown.split("\n  entries:")[0].split("\n", 1)[1]  # the summary stays plain


def test_a_watch_line_in_colour() -> None:
    entry = T.Entry(id="1a2b3c4d-0000-4000-8000-000000000000", track="user", scope="user-global", workspace_key="",
                    agent_key="", text="Prefers tabs", source="memoryctl", tags=[], version=1, created_at=0,
                    updated_at=0, last_recalled=None, recall_count=0, session_id=None)
    ev = Event("memory/removed", T.MemoryRemoved(entry=entry, session_id="s-1"))
    assert watching.event_line(ev, colour.paint) == (f"{RED}removed{RESET}  {DIM}1a2b3c4d{RESET} user/user-global  "
                                                     "Prefers tabs  (session s-1)")
    assert watching.event_line(ev) == "removed  1a2b3c4d user/user-global  Prefers tabs  (session s-1)"


# --- memoryctl on a terminal, through a pipe, under NO_COLOR -----------------------------


def piped(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MEMORYCTL, *args], env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=60, start_new_session=True)


@pytest.mark.parametrize("verb", [["list"], ["audit", "--limit", "5"]])  # an entry table, and the ledger's
def test_tables_on_a_terminal_are_coloured_and_nowhere_else(daemon: Any, verb: list[str]) -> None:
    tabs, vim = add(daemon, "Prefers tabs", "Uses vim")
    code, shown = on_pty([*sock(daemon), *verb], coloured_env())
    assert code == 0, shown
    header, *rows = shown.splitlines()
    assert header.startswith(f"{BOLD}") and header.endswith(RESET)
    assert f"{DIM}{vim[:8]}{RESET}" in "\n".join(rows) and f"{DIM}{tabs[:8]}{RESET}" in "\n".join(rows)
    # the same columns as through a pipe, which has no colour at all
    r = piped([*sock(daemon), *verb], coloured_env())
    assert r.returncode == 0 and "\x1b" not in r.stdout, r.stderr
    if verb == ["list"]:
        assert visible(shown) == r.stdout
    # NO_COLOR on a terminal: none either
    code, shown = on_pty([*sock(daemon), *verb], coloured_env(NO_COLOR="1"))
    assert code == 0 and "\x1b" not in shown, shown
    # FORCE_COLOR through a pipe: colour
    r = piped([*sock(daemon), *verb], coloured_env(FORCE_COLOR="1"))
    assert r.returncode == 0 and f"{DIM}{vim[:8]}{RESET}" in r.stdout, r.stderr


def test_the_prompt_on_a_terminal_is_coloured(ask_daemon: Any) -> None:
    d = ask_daemon
    add(d, "Prefers tabs")
    code, shown = on_pty([*sock(d), "replace", *UG, "tabs", "Prefers spaces"], coloured_env(), answers=[b"y"])
    assert code == 0, shown
    assert shown.startswith(f"{BOLD}replace in user/user-global, shared by every agent:{RESET}\n"
                            f"  + {GREEN}Prefers spaces{RESET}\n  - {RED}Prefers tabs{RESET}\n")
    code, shown = on_pty([*sock(d), "add", *UG, "Uses vim"], coloured_env(NO_COLOR="1"), answers=[b"y"])
    assert code == 0 and "\x1b" not in shown, shown
    with mc.connect_sync(d.socket_path, timeout=10) as c:
        assert [e.text for e in c.list()] == ["Prefers spaces", "Uses vim"]


def test_the_prompt_is_coloured_by_the_stream_it_goes_to(ask_daemon: Any, tmp_path: Path) -> None:
    """A terminal on stdin, stderr a file: the --yes prompt goes to stderr, without colour."""
    master, slave = pty.openpty()
    try:
        r = subprocess.run([*MEMORYCTL, *sock(ask_daemon), "--yes", "add", *UG, "Prefers tabs"], env=coloured_env(),
                           stdin=slave, capture_output=True, text=True, timeout=60)
    finally:
        os.close(master)
        os.close(slave)
    assert r.returncode == 0, r.stderr
    assert "\n  + Prefers tabs\n" in r.stderr and "\x1b" not in r.stderr
    assert r.stderr.endswith("\nmemoryctl: approved (--yes)\n")
    # the same on a terminal: coloured
    code, shown = on_pty([*sock(ask_daemon), "--yes", "add", *UG, "Uses vim"], coloured_env())
    assert code == 0 and f"\n  + {GREEN}Uses vim{RESET}\n" in shown and "\nmemoryctl: approved (--yes)\n" in shown, shown
