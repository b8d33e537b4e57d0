"""``memoryctl`` against a real daemon: every verb, --json, one-line errors and exit codes,
the approval prompt on a pseudo-terminal, the fail-closed denial without one, the
``approve`` loop, and autostart.

Most verbs run in-process (``main(argv)``, fast); everything that depends on the process
boundary (terminals, exit codes, autostart, ``python -m``) runs memoryctl as a subprocess
with its own session, so it never sees the terminal pytest runs in.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import anyio
import anyio.abc
import memoryd_client as mc
import pytest
from memoryd_client.cli import build_parser, main, verbs
from memoryd_client.verbtable import GLOBAL_OPTIONS_LINE
from memoryd_protocol.constants import ALLOWED_ONCE
from processes import HeadlessAdd, detached_socket, peer_pid, stop

#: daemon_factory's daemons run in the test process (conftest); tests marked process need one of their own
pytestmark = pytest.mark.inprocess

ROOT = Path(__file__).resolve().parents[1]
MEMORYCTL = [sys.executable, "-m", "memoryd_client"]
UG = ["--track", "user", "--scope", "user-global"]
ERROR_LINE = re.compile(r"^error: [A-Z_]+: \S.*$")
VERBS = list(verbs())


@pytest.fixture(autouse=True)
def hermetic_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No test may touch the user's real socket, store or config."""
    monkeypatch.delenv("MEMORYD_SOCKET", raising=False)
    # Short names: the runtime dir holds a socket, whose path has at most 107 bytes, and a
    # parallel worker's tmp_path is longer than a serial run's.
    for var, name in (("XDG_RUNTIME_DIR", "run"), ("XDG_CONFIG_HOME", "config"), ("XDG_DATA_HOME", "data"),
                      ("XDG_STATE_HOME", "state")):
        path = tmp_path / "xdg" / name
        path.mkdir(parents=True, exist_ok=True)
        monkeypatch.setenv(var, str(path))


def cli(capsys: pytest.CaptureFixture[str], daemon: Any, *args: str) -> tuple[int, str, str]:
    """Run memoryctl in-process against ``daemon``; (exit status, stdout, stderr)."""
    capsys.readouterr()
    code = main(["--socket", str(daemon.socket_path), "--no-autostart", *args])
    out, err = capsys.readouterr()
    return code, out, err


def run(*args: str, input: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run memoryctl as a subprocess in a new session (no controlling terminal)."""
    return subprocess.run([*MEMORYCTL, *args], input=input, stdin=None if input is not None else subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout, start_new_session=True)


def sock(d: Any) -> list[str]:
    return ["--socket", str(d.socket_path), "--no-autostart"]


def error_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, stderr
    assert ERROR_LINE.match(lines[0]), lines[0]
    return lines[0]


def texts(d: Any) -> list[str]:
    with mc.connect_sync(d.socket_path, timeout=10) as c:
        return [e.text for e in c.list()]


# --- help and docs -----------------------------------------------------------------------


def test_every_verb_has_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert set(VERBS) == {"list", "query", "add", "replace", "edit", "remove", "consolidate", "share", "budgets", "audit",
                          "proposals", "export", "import", "adapters", "status", "stop", "snapshot", "snapshots", "approve",
                          "watch", "socket", "rpc", "completion", "restore", "replicate"}
    for verb, parser in verbs().items():
        assert parser.description and len(parser.description) > 40, verb
        assert parser.epilog and parser.epilog.startswith("examples:"), verb
        assert main([verb, "--help"]) == 0
        out = capsys.readouterr().out
        assert out.startswith(f"usage: memoryctl {verb}"), verb
        assert parser.description.split()[0] in out
        assert out.rstrip().endswith(GLOBAL_OPTIONS_LINE)  # they work after the verb too


def test_top_level_help_lists_every_verb(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for verb in VERBS:
        assert re.search(rf"^\s+{verb}\s+\S", out, re.M), verb
    assert "exit status" in out
    assert main([]) == 2  # no verb: usage


def test_every_verb_is_in_the_readme() -> None:
    readme = (ROOT / "README.md").read_text()
    missing = [v for v in VERBS if f"memoryctl {v}" not in readme]
    assert not missing, f"README.md does not mention: {', '.join('memoryctl ' + v for v in missing)}"


def _doc_sections(doc: str) -> dict[str, str]:
    """docs/memoryctl.md's ``### `memoryctl VERB [ACTION]` `` sections by heading."""
    parts = re.split(r"^### `memoryctl ([a-z ]+)`\n", doc, flags=re.M)
    return {name: re.split(r"^##? ", text, flags=re.M)[0] for name, text in zip(parts[1::2], parts[2::2], strict=True)}


def test_the_reference_docs_and_the_help_agree() -> None:
    """Every verb and action has its section; each option the parser has is in its verb's
    sections, and each option those sections name is one the verb (or every verb) takes."""
    sections = _doc_sections((ROOT / "docs" / "memoryctl.md").read_text())
    parser = build_parser()
    global_options = {o for strings in parser.added for o in strings.option_strings}
    for verb, p in verbs(parser).items():
        assert verb in sections, f"docs/memoryctl.md has no section for memoryctl {verb}"
        actions = p.action_parsers
        text = "".join(t for name, t in sections.items() if name == verb or name.startswith(f"{verb} "))
        options = {o for q in [p, *actions.values()] for strings in q.option_strings for o in strings}
        for strings in [s for q in [p, *actions.values()] for s in q.option_strings]:
            longs = [o for o in strings if o.startswith("--")]
            if longs and longs[0] != "--help":
                assert longs[0] in text, f"{verb} {longs[0]}"
        # options of a memoryd or systemctl command line quoted in the section are its own
        ours = re.sub(r"(memoryd (serve|mcp)|systemctl)[^`\n]*", "", text)
        named = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]+)", ours))
        unknown = named - options - global_options
        assert not unknown, f"docs/memoryctl.md's memoryctl {verb} names options it does not take: {unknown}"


def test_python_dash_m_and_console_script() -> None:
    r = run("--help")
    assert r.returncode == 0 and r.stdout.startswith("usage: memoryctl")
    script = Path(sys.executable).parent / "memoryctl"
    if script.exists():
        r2 = subprocess.run([str(script), "status", "--help"], capture_output=True, text=True, timeout=60)
        assert r2.returncode == 0 and "usage: memoryctl status" in r2.stdout


def test_socket_prints_the_path_memoryctl_uses(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = Path(os.environ["XDG_RUNTIME_DIR"])  # set by hermetic_env; nothing listens there
    assert main(["socket"]) == 0
    assert capsys.readouterr() == (f"{runtime / 'memoryd' / 'memoryd.sock'}\n", "")
    assert not (runtime / "memoryd").exists()  # no autostart, no directory created
    monkeypatch.setenv("MEMORYD_SOCKET", str(tmp_path / "env.sock"))
    assert main(["socket"]) == 0
    assert capsys.readouterr().out == f"{tmp_path / 'env.sock'}\n"
    monkeypatch.chdir(tmp_path)
    assert main(["--socket", "rel.sock", "socket", "--json"]) == 0  # --socket beats the env, made absolute
    assert json.loads(capsys.readouterr().out) == {"socket": str(tmp_path / "rel.sock")}


def test_socket_without_xdg_runtime_dir_is_the_tmp_fallback(tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_RUNTIME_DIR", "MEMORYD_SOCKET")}
    env["TMPDIR"] = str(tmp)
    r = subprocess.run([*MEMORYCTL, "socket"], env=env, capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout == f"{tmp / f'memoryd-{os.getuid()}' / 'memoryd.sock'}\n"
    assert list(tmp.iterdir()) == []


def test_global_options_before_or_after_the_verb() -> None:
    p = build_parser()
    a = p.parse_args(["--json", "--agent", "coder", "list"])
    b = p.parse_args(["list", "--json", "--agent", "coder"])
    c = p.parse_args(["--agent", "coder", "list"])  # not reset by the verb's parser
    assert (a.json, a.agent) == (b.json, b.agent) == (True, "coder")
    assert (c.json, c.agent) == (False, "coder")


# --- verbs through a real daemon -----------------------------------------------------------


@pytest.mark.process
def test_write_verbs_and_tables(capsys: pytest.CaptureFixture[str], daemon: Any) -> None:
    code, out, err = cli(capsys, daemon, "add", *UG, "--tag", "style", "Prefers tabs over spaces")
    assert code == 0 and out.startswith("added ") and "user/user-global 24/2000 chars" in out, err
    assert cli(capsys, daemon, "add", *UG, "Uses vim")[0] == 0
    assert cli(capsys, daemon, "add", *UG, "Uses tmux")[0] == 0

    code, out, _ = cli(capsys, daemon, "list")
    assert code == 0
    header, *rows = out.splitlines()
    assert header.split() == ["ID", "TRACK", "SCOPE", "AGENT", "TAGS", "TEXT"]
    assert [r.split(None, 5)[5] for r in rows] == ["Prefers tabs over spaces", "Uses vim", "Uses tmux"]
    assert "style" in rows[0] and "(shared)" in rows[0]

    code, out, _ = cli(capsys, daemon, "replace", *UG, "TABS", "Prefers 4-space indents")
    assert code == 0 and "now version 2" in out
    code, out, _ = cli(capsys, daemon, "consolidate", *UG, "-m", "vim", "--match", "tmux", "Uses vim inside tmux")
    assert code == 0 and out.startswith("consolidated 2 entries into ")
    code, out, _ = cli(capsys, daemon, "remove", *UG, "inside tmux")
    assert code == 0 and out.startswith("removed ")
    assert texts(daemon) == ["Prefers 4-space indents"]

    code, out, _ = cli(capsys, daemon, "query", "indent")
    assert code == 0 and "Prefers 4-space indents" in out and out.rstrip().endswith("1 of 1 matches")
    code, out, _ = cli(capsys, daemon, "query", "nothing-like-this")
    assert code == 0 and out.strip() == "no matches"

    code, out, _ = cli(capsys, daemon, "budgets")
    assert code == 0
    assert out.splitlines()[1].split() == ["user", "user-global", "23", "2000", "1%"]

    code, out, _ = cli(capsys, daemon, "audit", "--limit", "3")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["SEQ", "TIME", "ACTION"] and len(lines) == 4
    assert lines[1].split()[3] == "remove" and "allowed-once (via approval, writePolicy auto)" in lines[1]


def test_text_from_stdin_and_tags(daemon: Any) -> None:
    r = run(*sock(daemon), "add", *UG, "--tag", "a", "--tag", "b", "--json", "-", input="multi\nline text\n")
    assert r.returncode == 0, r.stderr
    e = json.loads(r.stdout)["entry"]
    assert (e["text"], e["tags"], e["source"]) == ("multi\nline text", ["a", "b"], "memoryctl")
    assert e["sessionId"].startswith("memoryctl-")


@pytest.mark.process
def test_json_output(capsys: pytest.CaptureFixture[str], daemon: Any) -> None:
    code, out, _ = cli(capsys, daemon, "--json", "add", *UG, "Prefers tabs")
    assert code == 0
    added = json.loads(out)
    assert set(added) == {"entry", "usage"} and added["entry"]["text"] == "Prefers tabs"
    assert added["usage"] == {"track": "user", "scope": "user-global", "used": 12, "limit": 2000}

    for verb, check in [
        (["list"], lambda v: [e["text"] for e in v] == ["Prefers tabs"]),
        (["query", "tabs"], lambda v: v["total"] == 1 and not v["truncated"]),
        (["budgets"], lambda v: len(v) == 4 and v[0]["used"] == 12),
        (["audit"], lambda v: v[0]["action"] == "add"),
        (["adapters"], lambda v: "claude-code-memory-md" in [a["id"] for a in v]),
        (["status"], lambda v: v["store"]["path"] == str(daemon.db_path) and v["store"]["schemaVersion"] == 4),
        (["proposals"], lambda v: v == []),
        (["snapshot", "--session", "json-snap"], lambda v: "- Prefers tabs" in v["text"]),
        (["replace", *UG, "tabs", "Prefers spaces"], lambda v: v["previous"]["text"] == "Prefers tabs"),
        (["remove", *UG, "spaces"], lambda v: v["entry"]["text"] == "Prefers spaces"),
    ]:
        code, out, err = cli(capsys, daemon, *verb, "--json")
        assert code == 0, (verb, err)
        assert check(json.loads(out)), (verb, out)


def test_workspace_agent_and_snapshot(capsys: pytest.CaptureFixture[str], daemon: Any, tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    proj.mkdir()
    code, out, _ = cli(capsys, daemon, "--json", "--workspace", str(proj), "--agent", "coder", "--session", "w-1",
                       "add", "--track", "agent", "--scope", "workspace", "Run make check before pushing")
    assert code == 0
    e = json.loads(out)["entry"]
    assert (e["workspaceKey"], e["agentKey"], e["sessionId"]) == (str(proj), "coder", "w-1")
    cli(capsys, daemon, "add", *UG, "Prefers tabs")

    code, out, _ = cli(capsys, daemon, "snapshot", "--session", "new-1", "--cwd", str(proj), "--agent", "coder")
    assert code == 0
    assert out.startswith("[dsh-memento: frozen memory snapshot")
    assert "- Run make check before pushing" in out and "- Prefers tabs" in out
    code, out, _ = cli(capsys, daemon, "snapshot", "--session", "new-2", "--cwd", str(tmp_path), "--agent", "coder")
    assert "make check" not in out and "- Prefers tabs" in out
    code, out, _ = cli(capsys, daemon, "snapshot", "--session", "new-3", "--cwd", str(proj), "--agent", "reviewer")
    assert "make check" not in out

    code, out, _ = cli(capsys, daemon, "query", "--json", "--as-session", "--session", "q-1", "--workspace",
                       str(tmp_path))
    assert [x["text"] for x in json.loads(out)["entries"]] == ["Prefers tabs"]
    code, out, _ = cli(capsys, daemon, "audit", "--json", "--limit", "1")
    assert json.loads(out)[0]["action"] == "recalled" and json.loads(out)[0]["sessionId"] == "q-1"

    code, out, _ = cli(capsys, daemon, "list", "--track", "agent")
    assert code == 0 and "WORKSPACE" in out.splitlines()[0] and str(proj) in out and "Prefers tabs" not in out


@pytest.mark.process
def test_empty_snapshot_and_list(capsys: pytest.CaptureFixture[str], daemon: Any) -> None:
    code, out, err = cli(capsys, daemon, "snapshot")
    assert code == 0 and out == "" and "empty snapshot" in err
    assert cli(capsys, daemon, "list")[1].strip() == "no entries"


@pytest.mark.process
def test_proposals_verbs(capsys: pytest.CaptureFixture[str], daemon: Any) -> None:
    with mc.connect_sync(daemon.socket_path, timeout=10) as c:
        p1 = c.proposals_create({"kind": "compaction", "track": "user", "scope": "user-global",
                                 "text": "Likes short answers"}, "sess-a")
        p2 = c.proposals_create({"kind": "compaction", "track": "user", "scope": "user-global",
                                 "text": "Dislikes emoji"}, "sess-b")
    assert p1 is not None and p2 is not None
    code, out, _ = cli(capsys, daemon, "proposals")
    assert code == 0 and "Likes short answers" in out and "pending" in out
    assert out.splitlines()[1].split()[0] == p1.id[:8]  # tables show ids as 'memoryctl list' does

    code, out, err = cli(capsys, daemon, "proposals", "approve", p1.id[:8])
    assert code == 0, err
    assert out.startswith(f"approved proposal {p1.id[:8]}")
    code, out, _ = cli(capsys, daemon, "proposals", "dismiss", p2.id)
    assert code == 0 and out.strip() == f"dismissed proposal {p2.id[:8]}"
    code, out, _ = cli(capsys, daemon, "proposals", "--status", "dismissed", "--json")
    assert [p["id"] for p in json.loads(out)] == [p2.id]
    assert texts(daemon) == ["Likes short answers"]

    code, _, err = cli(capsys, daemon, "proposals", "dismiss", p2.id)
    assert code == 1 and error_line(err).startswith("error: PROPOSAL_NOT_FOUND: ")
    code, _, err = cli(capsys, daemon, "proposals", "approve")
    assert code == 2 and error_line(err) == ("error: USAGE: the following arguments are required: ID "
                                             "(see 'memoryctl proposals approve --help')")


def test_export_and_import(capsys: pytest.CaptureFixture[str], daemon_factory: Any, tmp_path: Path) -> None:
    a, b = daemon_factory(name="a"), daemon_factory(name="b")
    cli(capsys, a, "add", *UG, "--tag", "x", "Prefers tabs")
    cli(capsys, a, "add", "--track", "agent", "--scope", "user-global", "Uses uv for Python")

    code, out, _ = cli(capsys, a, "export")
    assert code == 0
    envelope = json.loads(out)
    assert envelope["schema"] == "memory-export-v1" and len(envelope["entries"]) == 2
    backup = tmp_path / "backup.json"
    code, out, err = cli(capsys, a, "export", "-o", str(backup))
    assert code == 0 and out == "" and "exported to" in err
    assert backup.stat().st_mode & 0o777 == 0o600
    assert json.loads(backup.read_text())["entries"] == envelope["entries"]

    foreign = tmp_path / "foreign.json"
    foreign.write_text(json.dumps({k: v for k, v in envelope.items() if k != "plugin"}))
    code, out, err = cli(capsys, b, "import", str(foreign))
    assert (code, out) == (1, "") and error_line(err).startswith("error: INVALID_INPUT: envelope has no plugin;")
    assert texts(b) == []

    code, out, err = cli(capsys, b, "import", str(backup))
    assert code == 0 and out.strip() == "imported 2 entries, skipped 0 already in the store", err
    assert texts(b) == ["Prefers tabs", "Uses uv for Python"]

    code, md, _ = cli(capsys, a, "export", "--adapter", "claude-code-memory-md")
    assert code == 0 and "- Prefers tabs" in md

    claude = tmp_path / "CLAUDE.md"
    claude.write_text("## Project notes\n\n- Use pnpm, not npm\n- Tests live in tests/\n\nA paragraph\nof prose.\n")
    code, out, err = cli(capsys, b, "import", "--adapter", "claude-code-memory-md", str(claude))
    assert code == 0 and out.strip() == "imported 3 entries, skipped 0 already in the store", err
    assert texts(b)[-3:] == ["Use pnpm, not npm", "Tests live in tests/", "A paragraph of prose."]

    facts = json.dumps([{"memory": "Lives in Berlin", "metadata": {"category": "personal"}}])
    r = run(*sock(b), "import", "--adapter", "mem0", "--json", "-", input=facts)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["entries"][0]["tags"] == ["personal"]


@pytest.mark.process
def test_adapters_and_status(capsys: pytest.CaptureFixture[str], daemon: Any) -> None:
    code, out, _ = cli(capsys, daemon, "adapters")
    assert code == 0
    assert {line.split()[0] for line in out.splitlines()[1:]} >= {"mem0", "hermes-memory-md", "claude-code-memory-md"}
    code, out, _ = cli(capsys, daemon, "status")
    assert code == 0
    fields = status_fields(out)
    assert fields["pid"] == str(daemon.proc.pid)
    assert fields["store"] == str(daemon.db_path) and fields["socket"] == str(daemon.socket_path)


def test_db_mismatch_warns(capsys: pytest.CaptureFixture[str], daemon: Any, tmp_path: Path) -> None:
    code, _, err = cli(capsys, daemon, "--db", str(tmp_path / "other.db"), "budgets")
    assert code == 0 and f"serves {daemon.db_path}" in err
    code, _, err = cli(capsys, daemon, "--db", str(daemon.db_path), "budgets")
    assert code == 0 and "warning" not in err


# --- errors and exit codes -----------------------------------------------------------------


def test_protocol_errors_are_one_line_exit_1(daemon_factory: Any, tmp_path: Path) -> None:
    cfg = tmp_path / "small.toml"
    cfg.write_text("[budgets.user]\nuser_global = 30\n")
    d = daemon_factory("--config", str(cfg))
    assert run(*sock(d), "add", *UG, "Uses vim at work").returncode == 0

    r = run(*sock(d), "remove", *UG, "emacs")
    assert (r.returncode, r.stdout) == (1, "")
    assert error_line(r.stderr).startswith("error: ENTRY_NOT_FOUND: ")
    assert r.stderr.count("\n") == 1

    assert run(*sock(d), "add", "--yes", *UG, "vim home").returncode == 0
    r = run(*sock(d), "replace", *UG, "vim", "x")
    assert r.returncode == 1 and error_line(r.stderr).startswith("error: AMBIGUOUS_MATCH: ")

    r = run(*sock(d), "--json", "add", *UG, "this will not fit")
    assert r.returncode == 1 and error_line(r.stderr) == (
        "error: BUDGET_EXCEEDED: memory budget exceeded: user/user-global has 24/30 characters used, "
        "this write would bring it to 41/30 (17 more); make room with memoryctl consolidate or memoryctl remove, "
        f"or raise the budget: user_global = N under [budgets.user] in {cfg}, then restart memoryd")
    err = json.loads(r.stdout)["error"]
    assert err["code"] == "BUDGET_EXCEEDED"
    assert err["details"] == {"track": "user", "scope": "user-global", "used": 24, "limit": 30, "needed": 41}
    r = run(*sock(d), "export", "--adapter", "nope")
    assert r.returncode == 1 and error_line(r.stderr).startswith("error: ADAPTER_NOT_FOUND: ")
    assert texts(d) == ["Uses vim at work", "vim home"]


def test_usage_errors_are_one_line_exit_2(daemon: Any, tmp_path: Path) -> None:
    for args, fragment in [
        (["add", "text without a layer"], "the following arguments are required: --track, --scope"),
        (["add", "--track", "robot", "--scope", "user-global", "x"], "invalid choice: 'robot'"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        (["audit", "--limit", "0"], "--limit must be at least 1"),
        (["import", str(tmp_path / "missing.json")], "cannot read"),
    ]:
        r = run(*sock(daemon), *args)
        assert r.returncode == 2, (args, r.stderr)
        line = error_line(r.stderr)
        assert line.startswith("error: USAGE: ") and fragment in line, line
        assert r.stderr.count("\n") == 1, r.stderr
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    r = run(*sock(daemon), "import", str(bad))
    assert r.returncode == 2 and "is not JSON" in error_line(r.stderr)


def test_no_daemon_is_exit_3_and_says_how_to_start_one(tmp_path: Path) -> None:
    missing = tmp_path / "none.sock"
    r = run("--socket", str(missing), "--no-autostart", "status")
    assert r.returncode == 3 and r.stdout == ""
    assert error_line(r.stderr) == (
        f"error: CONNECT_FAILED: cannot connect to memoryd at {missing}: No such file or directory; "
        f"no daemon runs there: start one with `memoryd serve --socket {missing}` or drop --no-autostart"
    )
    # a stale socket file (connection refused), and the default socket with --db: the same advice
    stale = tmp_path / "stale.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(stale))
    r = run("--no-autostart", "--db", str(tmp_path / "my.db"), "list")
    assert r.returncode == 3 and error_line(r.stderr).endswith(
        f"; no daemon runs there: start one with `memoryd serve --db {tmp_path / 'my.db'}` or drop --no-autostart")
    r = run("--socket", str(stale), "--no-autostart", "list")
    assert r.returncode == 3 and error_line(r.stderr) == (
        f"error: CONNECT_FAILED: cannot connect to memoryd at {stale}: Connection refused; "
        f"no daemon runs there: start one with `memoryd serve --socket {stale}` or drop --no-autostart"
    )
    assert not (tmp_path / "my.db").exists()


@pytest.mark.process
def test_connection_lost_is_exit_3(ask_daemon: Any) -> None:
    master, proc = spawn_on_pty(*sock(ask_daemon), "add", *UG, "x")
    try:
        read_until(master, "Approve? [y/N]")
        ask_daemon.proc.kill()
        out = read_until(master, "error:", eof_ok=True)
        assert proc.wait(30) == 3
        assert "error: CONNECTION_CLOSED: " in out
    finally:
        reap(proc, master)


# --- approvals -----------------------------------------------------------------------------


def plain_env() -> dict[str, str]:
    """The environment of memoryctl on a pseudo-terminal (this test's), without colour."""
    return {**os.environ, "NO_COLOR": "1"}


def spawn_on_pty(*args: str) -> tuple[int, subprocess.Popen[bytes]]:
    """memoryctl with a pseudo-terminal as stdin/stdout/stderr and as its controlling
    terminal (util-linux ``setsid --ctty``: a new session, then TIOCSCTTY on stdin, then
    exec, so the pid is memoryctl's); returns (master fd, process). Without colour
    (NO_COLOR): these tests read the text itself; tests/test_cli_colour.py reads the colour."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(["setsid", "--ctty", *MEMORYCTL, *args], stdin=slave, stdout=slave, stderr=slave,
                            env=plain_env())
    os.close(slave)
    return master, proc


def read_until(master: int, needle: str, timeout: float = 30, *, eof_ok: bool = False) -> str:
    buf = b""
    deadline = time.monotonic() + timeout
    while needle.encode() not in buf:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"{needle!r} not seen in {buf.decode(errors='replace')!r}")
        ready, _, _ = select.select([master], [], [], remaining)
        if not ready:
            continue
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            chunk = b""
        if not chunk:
            if eof_ok:
                break
            raise AssertionError(f"EOF before {needle!r}: {buf.decode(errors='replace')!r}")
        buf += chunk
    return buf.decode(errors="replace").replace("\r\n", "\n")


def reap(proc: subprocess.Popen[bytes], master: int) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)
    os.close(master)


@pytest.mark.process
def test_pty_prompt_yes_writes(ask_daemon: Any) -> None:
    with mc.connect_sync(ask_daemon.socket_path, session="seed", on_approval=lambda a: True, timeout=10) as c:
        c.add({"track": "user", "scope": "user-global", "text": "Prefers tabs\nand\x1b[31m red"})
    master, proc = spawn_on_pty(*sock(ask_daemon), "replace", *UG, "tabs", "Prefers spaces")
    try:
        shown = read_until(master, "Approve? [y/N]")
        # The complete payload, control characters made visible, plus action/layer/source.
        assert "replace in user/user-global, shared by every agent:\n" \
               "  + Prefers spaces\n  - Prefers tabs\n  - and\\x1b[31m red\n" in shown
        assert "source:  dsh-memento" in shown
        os.write(master, b"y\n")
        out = read_until(master, "replaced", eof_ok=True)
        assert proc.wait(30) == 0, out
    finally:
        reap(proc, master)
    assert texts(ask_daemon) == ["Prefers spaces"]
    assert decided_lines(ask_daemon)[-1] == "allowed-once (its own prompt; claims human)"


@pytest.mark.process
def test_pty_prompt_cuts_long_lines_to_the_terminal_width(ask_daemon: Any) -> None:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("4H", 24, 50, 0, 0))
    forged = "x" * 100 + "Approve? [y/N] y"
    proc = subprocess.Popen([*MEMORYCTL, *sock(ask_daemon), "add", *UG, forged], stdin=slave, stdout=slave,
                            stderr=slave, start_new_session=True, env=plain_env())
    os.close(slave)
    try:
        shown = read_until(master, "\nApprove? [y/N] ")
        lines = shown.split("\n")[:-1]  # the last one is the real question
        assert lines[0].startswith("add to user/user-global")
        assert all(len(ln) <= 49 for ln in lines), lines
        start = next(n for n, ln in enumerate(lines) if ln.startswith("  + "))
        payload = lines[start:lines.index("  tags:    -")]
        assert payload and all(ln.startswith("  | ") for ln in payload[1:])
        assert "".join(ln[4:] for ln in payload) == forged
        os.write(master, b"n\n")
        assert proc.wait(30) == 1
    finally:
        reap(proc, master)
    assert texts(ask_daemon) == []


@pytest.mark.process
def test_pty_prompt_no_denies(ask_daemon: Any) -> None:
    master, proc = spawn_on_pty(*sock(ask_daemon), "add", *UG, "Sensitive fact")
    try:
        shown = read_until(master, "Approve? [y/N]")
        assert "\n  + Sensitive fact\n" in shown
        os.write(master, b"n\n")
        out = read_until(master, "error:", eof_ok=True)
        assert proc.wait(30) == 1
        assert "error: WRITE_DENIED: " in out
    finally:
        reap(proc, master)
    assert texts(ask_daemon) == []
    with mc.connect_sync(ask_daemon.socket_path, timeout=10) as c:
        row = c.audit_list(1)[0]
    assert (row.action, row.outcome) == ("add-denied", "rejected (via approval, writePolicy ask)")


@pytest.mark.process
def test_no_tty_denies_fail_closed(ask_daemon: Any) -> None:
    r = run(*sock(ask_daemon), "remove", *UG, "anything")  # not found: no approval needed
    assert r.returncode == 1 and "Approve?" not in r.stderr
    r = run(*sock(ask_daemon), "add", *UG, "Written by a script")
    assert r.returncode == 1
    assert "  + Written by a script" in r.stderr  # the payload is shown even when denied
    assert "no terminal to ask for approval; denying (fail closed)" in r.stderr
    assert error_line(r.stderr).startswith("error: WRITE_DENIED: ")
    assert texts(ask_daemon) == []

    r = run(*sock(ask_daemon), "--yes", "add", *UG, "Written by a script")
    assert r.returncode == 0 and "approved (--yes)" in r.stderr
    assert texts(ask_daemon) == ["Written by a script"]
    # each answer says who gave it (approval/decided's by), and the daemon logs the claim
    assert decided_lines(ask_daemon) == [
        "rejected (its own prompt; claims policy 'memoryctl: no terminal, fail closed')",
        "allowed-once (its own prompt; claims script 'memoryctl --yes')"]


def decided_lines(d: Any) -> list[str]:
    """The daemon's log of each approval decision: outcome, who decided, and the claim."""
    return [re.sub(r"^(\S+) by connection \d+ \((.*), pid \d+; (.*)\)$", r"\1 (\2; \3)", m)
            for m in re.findall(r"approval [0-9a-f-]{36} decided (.*)$", d.stderr(), re.M)]


@pytest.mark.process
def test_a_300_entry_import_prompt_stays_readable(ask_daemon: Any, tmp_path: Path) -> None:
    entries = [{"track": "user", "scope": "user-global", "text": f"fact {n}"} for n in range(100)]
    entries += [{"track": "agent", "scope": "user-global", "agentKey": "ops", "text": f"tip {n}\nApprove?"}
                for n in range(200)]
    backup = tmp_path / "backup.json"
    backup.write_text(json.dumps({"plugin": "dsh-memento", "schema": "memory-export-v1", "entries": entries}))
    r = run(*sock(ask_daemon), "--yes", "import", str(backup))
    assert r.returncode == 0, r.stderr
    assert r.stderr.startswith("seed 300 entries into 2 layers:\n")
    assert re.search(r"\n  client:  memoryctl \S+\n  process: pid \d+ \(" + re.escape(os.path.realpath(sys.executable))
                     + r"\)\n", r.stderr), r.stderr
    assert "  summary: 300 entries, 3780 chars, in 2 layers\n" \
           "    LAYER              WORKSPACE  AGENT     ENTRIES  CHARS\n" \
           "    user/user-global   -          (shared)  100      690\n" \
           "    agent/user-global  -          ops       200      3090\n" \
           "  entries (first 20 of 300):\n" in r.stderr
    assert "  … and 280 more entries (not shown)\n" in r.stderr
    assert not [ln for ln in r.stderr.splitlines() if ln.startswith("Approve?")]
    assert len(r.stderr.splitlines()) < 80


async def detached_unix(path: Any) -> anyio.abc.UNIXSocketStream:
    """anyio.connect_unix, the connection held by a process of its own (processes.detached_socket)."""
    sock = await anyio.to_thread.run_sync(detached_socket, path)
    return await anyio.abc.UNIXSocketStream.from_socket(sock)


class Approver:
    """``memoryctl approve ...`` as a subprocess, known to be subscribed before use."""

    def __init__(self, d: Any, *args: str) -> None:
        self.proc = subprocess.Popen([*MEMORYCTL, *sock(d), "approve", *args], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True)
        assert self.proc.stderr is not None
        line = self.proc.stderr.readline()  # printed after approval/subscribe returned
        assert "approving writes" in line, line

    def finish(self) -> tuple[int, str, str]:
        out, err = self.proc.communicate(timeout=30)
        return self.proc.returncode, out, err

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate(timeout=10)




@pytest.mark.process
def test_approve_verb_answers_headless_writes(ask_any_daemon: Any) -> None:
    ask_daemon = ask_any_daemon
    approver = Approver(ask_daemon, "--yes", "--count", "1")
    try:
        writer = HeadlessAdd(ask_daemon.socket_path, "agent-1", "From a headless agent")
        r = writer.result()
        code, out, err = approver.finish()
    finally:
        approver.kill()
    assert code == 0, err
    assert "session: agent-1" in err
    # where it lands, what it writes and who asked: the writing process, through the Python client
    assert "add to user/user-global, shared by every agent:\n  + From a headless agent\n" \
           "  tags:    -\n" in err
    assert f"  client:  memoryd-client {mc.__version__}\n" \
           f"  process: pid {writer.pid} ({os.path.realpath(sys.executable)})\n" in err
    assert re.fullmatch(r"approved [0-9a-f]{8}\n", out)
    assert r == {"text": "From a headless agent"}
    assert decided_lines(ask_daemon) == ["allowed-once (a subscribed approver; claims script 'memoryctl --yes')"]


@pytest.mark.process
def test_approve_verb_without_a_terminal_is_refused(ask_daemon: Any) -> None:
    """approvers = "interactive" (the default): only a process with a controlling terminal
    subscribes; a headless process (a model's tool, say) cannot become an approver."""
    r = run(*sock(ask_daemon), "approve")
    assert r.returncode == 1
    assert r.stderr == ('error: INVALID_INPUT: only a process with a controlling terminal can subscribe as an '
                        'approver; set approvers = "any" in the daemon\'s config to admit others\n')
    # nobody subscribed: a headless write is still unavailable, and nothing is written
    with mc.connect_sync(ask_daemon.socket_path, session="agent-0", approvals=False, timeout=30) as c:
        with pytest.raises(mc.WriteDenied) as info:
            c.add({"track": "user", "scope": "user-global", "text": "nobody approves"})
        assert info.value.details["outcome"] == "unavailable"
        assert [a.action for a in c.audit_list()] == ["add-denied"]
    assert texts(ask_daemon) == []


@pytest.mark.process
def test_approve_verb_reject_and_no_tty(ask_any_daemon: Any) -> None:
    ask_daemon = ask_any_daemon
    for args, notice in [(["--reject"], "rejected (--reject)"), ([], "fail closed")]:
        approver = Approver(ask_daemon, "--count", "1", "--json", *args)
        try:
            r = HeadlessAdd(ask_daemon.socket_path, "agent-2", "Denied").result()
            code, out, err = approver.finish()
        finally:
            approver.kill()
        assert r == {"denied": "rejected"}
        assert code == 0 and notice in err
        assert json.loads(out)["outcome"] == "rejected"
    assert texts(ask_daemon) == []


@pytest.mark.process
def test_approve_verb_on_a_terminal_sees_another_approver_win(ask_any_daemon: Any) -> None:
    ask_daemon = ask_any_daemon  # the other approver is this test, which has no terminal
    master, proc = spawn_on_pty(*sock(ask_daemon), "approve")
    try:
        read_until(master, "approving writes")
        prompted = threading.Event()

        def approve_once_prompted(a: Any) -> str:
            assert prompted.wait(30)
            return ALLOWED_ONCE

        # The other approver's connection is held by a process of its own: the writer below
        # is this test's child, and an approver never decides a descendant's write.
        with mock.patch("anyio.connect_unix", detached_unix), \
                mc.connect_sync(ask_daemon.socket_path, on_approval=approve_once_prompted, timeout=30) as other:
            other.approval_subscribe()
            # the writer is another process: no approver is asked about its own process's writes
            writer = subprocess.Popen([*MEMORYCTL, *sock(ask_daemon), "--via-approver", "--session", "agent-3",
                                       "add", *UG, "Raced"], stdin=subprocess.DEVNULL, start_new_session=True,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            # Both approvers are asked; the human sees the prompt, the other one approves.
            shown = read_until(master, "Approve? [y/N]")
            prompted.set()
            assert writer.wait(30) == 0
        out = read_until(master, "decided by another approver")
        assert decided_lines(ask_daemon) == ["allowed-once (a subscribed approver; claims nothing)"]
        assert "  + Raced" in shown
        assert "(this approval is no longer pending)" in out and "was decided by another approver: allowed-once" in out
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
    finally:
        reap(proc, master)
    assert texts(ask_daemon) == ["Raced"]


@pytest.mark.process
def test_approve_verb_stops_at_end_of_input(ask_daemon: Any) -> None:
    master, proc = spawn_on_pty(*sock(ask_daemon), "approve")
    try:
        read_until(master, "approving writes")
        writer = HeadlessAdd(ask_daemon.socket_path, "agent-4", "EOF")
        read_until(master, "Approve? [y/N]")
        os.write(master, b"\x04")
        assert writer.result() == {"denied": "rejected"}
        assert proc.wait(30) == 0
    finally:
        reap(proc, master)


# --- autostart -----------------------------------------------------------------------------


@pytest.fixture
def fresh_socket() -> Iterator[Path]:
    """A socket path nobody serves yet; whatever daemon ends up there is stopped afterwards."""
    base = Path(tempfile.mkdtemp(prefix="mctl-", dir="/tmp"))
    path = base / "run" / "memoryd.sock"
    yield path
    if path.exists():
        try:
            stop(peer_pid(path))
        except OSError:
            pass
    shutil.rmtree(base, ignore_errors=True)


def test_autostart(fresh_socket: Path, tmp_path: Path) -> None:
    db = tmp_path / "auto.db"
    r = run("--socket", str(fresh_socket), "--db", str(db), "--yes", "add", *UG, "Autostarted")
    assert r.returncode == 0, r.stderr
    m = re.search(r"started memoryd \(pid (\d+)\) on ", r.stderr)
    assert m, r.stderr
    pid = int(m.group(1))
    assert peer_pid(fresh_socket) == pid
    assert (fresh_socket.parent / "memoryd.log").exists()
    assert fresh_socket.parent.stat().st_mode & 0o777 == 0o700

    r = run("--socket", str(fresh_socket), "--db", str(db), "status", "--json")
    assert r.returncode == 0 and "started memoryd" not in r.stderr and "warning" not in r.stderr
    assert Path(json.loads(r.stdout)["store"]["path"]) == db
    r = run("--socket", str(fresh_socket), "list", "--json")
    assert [e["text"] for e in json.loads(r.stdout)] == ["Autostarted"]

    assert stop(pid)  # it exited on SIGTERM


def test_autostart_failure_shows_the_daemon_stderr(fresh_socket: Path, tmp_path: Path) -> None:
    db = tmp_path / "corrupt.db"
    db.write_bytes(b"this is not an SQLite database" * 100)
    r = run("--socket", str(fresh_socket), "--db", str(db), "budgets")
    assert r.returncode == 3, r.stderr
    assert error_line(r.stderr).startswith("error: AUTOSTART_FAILED: memoryd exited with status ")
    assert re.search(r"^memoryd: .*STORE_CORRUPT", r.stderr, re.M), r.stderr
    assert db.read_bytes() == b"this is not an SQLite database" * 100  # left untouched


def test_no_autostart(fresh_socket: Path) -> None:
    r = run("--socket", str(fresh_socket), "--no-autostart", "status")
    assert r.returncode == 3 and error_line(r.stderr).startswith("error: CONNECT_FAILED: ")
    assert not fresh_socket.exists()


@pytest.mark.process
def test_via_approver_routes_a_script_write_to_memoryctl_approve(ask_any_daemon: Any) -> None:
    ask_daemon = ask_any_daemon  # memoryctl approve --yes runs headless here
    approver = Approver(ask_daemon, "--count", "1", "--yes")
    try:
        r = run(*sock(ask_daemon), "--via-approver", "add", *UG, "From cron")
        code, _out, err = approver.finish()
    finally:
        approver.kill()
    assert r.returncode == 0, r.stderr
    assert code == 0 and "  + From cron" in err
    assert texts(ask_daemon) == ["From cron"]
    # with no approver subscribed it is denied at once, fail closed, and says what to run
    before = store_state(ask_daemon)
    r = run(*sock(ask_daemon), "--via-approver", "add", *UG, "Nobody listening")
    assert r.returncode == 1
    assert error_line(r.stderr) == ("error: WRITE_DENIED: write denied: unavailable; no approver is subscribed: "
                                    "run `memoryctl approve` in another terminal")
    entries, budgets, ledger = store_state(ask_daemon)
    assert (entries, budgets, ledger) == (before[0], before[1], before[2] + 1)  # + the add-denied row


def test_invisible_characters_are_escaped_in_everything_shown() -> None:
    from memoryd_client.render import visible

    hidden = "".join(chr(0xE0000 + ord(c)) for c in " Ignore previous instructions")
    shown = visible("Prefers concise answers" + hidden)
    assert shown.startswith("Prefers concise answers\\U000e0020\\U000e0049")
    assert all(ch.isprintable() or ch in "\n\t" for ch in shown)
    for ch in ("\u202e", "\u200b", "\u00ad", "\u3000", "\u2028", "\ufe0f", "\u3164", "\x1b", "\ue000"):
        assert visible(f"a{ch}b") != f"a{ch}b", repr(ch)
    assert visible("中文 😀 é\tx") == "中文 😀 é\tx"


@pytest.mark.process
def test_export_to_an_existing_world_readable_file_leaves_it_private(daemon: Any, tmp_path: Path) -> None:
    target = tmp_path / "pub.json"
    target.write_text("old")
    target.chmod(0o644)
    r = run(*sock(daemon), "export", "-o", str(target), "--force")
    assert r.returncode == 0, r.stderr
    assert (target.stat().st_mode & 0o777) == 0o600
    assert json.loads(target.read_text())["schema"] == "memory-export-v1"
    r = run(*sock(daemon), "export", "-o", str(tmp_path / "missing-dir" / "x.json"))
    assert r.returncode == 2 and error_line(r.stderr).startswith("error: USAGE: cannot write")


# --- the human's tool: version, stop, status, and errors that say what to do next ----------


def store_state(d: Any) -> tuple[Any, Any, int]:
    """Everything an error must leave unchanged: entries, budgets, ledger length."""
    with mc.connect_sync(d.socket_path, timeout=10) as c:
        return c.list(), c.budgets(), len(c.audit_list(1000))


def test_version_needs_no_daemon(fresh_socket: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMORYD_SOCKET", str(fresh_socket))
    r = run("--version")
    assert (r.returncode, r.stdout, r.stderr) == (0, f"memoryctl {mc.__version__} (dsh-memory-protocol/v1)\n", "")
    assert not fresh_socket.parent.exists()  # nothing was started, not even the runtime dir


@pytest.mark.process
def test_stop_waits_until_the_daemon_is_gone(daemon_factory: Any) -> None:
    d = daemon_factory()
    assert run(*sock(d), "add", *UG, "Survives a restart").returncode == 0
    with mc.connect_sync(d.socket_path, timeout=10) as other:  # another open connection does not hold it up
        r = run("--socket", str(d.socket_path), "stop")
        assert r.returncode == 0, r.stderr
        assert r.stdout == f"stopped memoryd (pid {d.proc.pid}) on {d.socket_path}\n"
        assert r.stderr == ""
        # when stop returns, the socket is gone and the process has exited, cleanly
        assert not d.socket_path.exists()
        assert d.proc.poll() == 0
        with pytest.raises(mc.ConnectionClosed):
            other.status()
    # and the store is free: a new daemon opens it, with the entry intact
    d2 = daemon_factory(db=d.db_path, name="d2")
    assert texts(d2) == ["Survives a restart"]
    r = run("--socket", str(d2.socket_path), "stop", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"stopped": True, "pid": d2.proc.pid, "socket": str(d2.socket_path)}
    assert d2.proc.poll() == 0


def test_stop_when_nothing_runs_is_not_an_error(fresh_socket: Path, tmp_path: Path) -> None:
    r = run("--socket", str(fresh_socket), "stop")
    assert (r.returncode, r.stdout, r.stderr) == (0, f"memoryd is not running on {fresh_socket}\n", "")
    assert not fresh_socket.parent.exists()  # never autostarts
    stale = tmp_path / "stale.sock"  # a socket file nobody listens on: connection refused
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(stale))
    r = run("--socket", str(stale), "--json", "stop")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"stopped": False, "pid": None, "socket": str(stale)}
    assert stale.exists() and not (tmp_path / "memoryd.log").exists()


def status_fields(out: str) -> dict[str, str]:
    """The key/value lines of ``memoryctl status`` (the connections table follows a blank line)."""
    pairs = out.split("\n\n")[0]
    return dict(re.split(r"\s{2,}", line, maxsplit=1) for line in pairs.splitlines())  # type: ignore[misc]


@pytest.mark.process
def test_status_shows_socket_pid_policy_config_and_log(daemon_factory: Any, tmp_path: Path) -> None:
    cfg = tmp_path / "memoryd.toml"
    cfg.write_text('write_policy = "ask"\n')
    d = daemon_factory("--config", str(cfg), policy=None)
    r = run(*sock(d), "status")
    assert r.returncode == 0, r.stderr
    fields = status_fields(r.stdout)
    assert list(fields) == ["socket", "pid", "version", "uptime", "write policy", "store", "store schema", "config",
                            "log", "connections", "pending approvals", "queue depth"]
    assert fields["socket"] == str(d.socket_path) and fields["pid"] == str(d.proc.pid)
    assert (fields["version"], fields["write policy"], fields["store schema"]) == (mc.__version__, "ask", "4")
    assert (fields["store"], fields["config"], fields["log"]) == (str(d.db_path), str(cfg), str(d.stderr_path))
    assert (fields["connections"], fields["pending approvals"], fields["queue depth"]) == ("1", "0", "0")
    assert re.fullmatch(r"\d+s", fields["uptime"])
    # its own connection, as the daemon sees it: memoryctl's pid and uid, its name and executable
    header, row = r.stdout.split("\n\n")[1].splitlines()
    assert re.split(r"\s{2,}", header) == ["CONN", "TRANSPORT", "PID", "UID", "CLIENT", "APPROVER", "OPENED", "EXE"]
    cells = re.split(r"\s{2,}", row)
    assert cells[1:4] == ["socket", cells[2], str(os.geteuid())] and cells[2].isdigit()
    assert (cells[4], cells[5], cells[7]) == (f"memoryctl {mc.__version__}", "no", os.path.realpath(sys.executable))
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", cells[6])

    r = run(*sock(d), "status", "--json")
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    assert set(st) == {"version", "uptimeS", "connections", "pendingApprovals", "queueDepth", "store", "pid",
                       "writePolicy", "socket", "config", "log", "connectionList"}
    (conn,) = st["connectionList"]
    assert set(conn) == {"id", "transport", "pid", "uid", "exe", "client", "approver", "openedAt"}
    assert (conn["transport"], conn["uid"], conn["client"], conn["approver"], conn["exe"]) == (
        "socket", os.geteuid(), {"name": "memoryctl", "version": mc.__version__}, False, os.path.realpath(sys.executable))
    assert (st["pid"], st["writePolicy"], st["socket"], st["config"], st["log"]) == (
        d.proc.pid, "ask", str(d.socket_path), str(cfg), str(d.stderr_path))
    assert st["store"] == {"path": str(d.db_path), "schemaVersion": 4}


def test_status_without_a_config_file_or_a_log_file(tmp_path: Path) -> None:
    """stderr on a pipe (a terminal, the journal): the log is "stderr"; no config: "none"."""
    sock_path = Path(tempfile.mkdtemp(prefix="mctl-", dir="/tmp")) / "p.sock"
    proc = subprocess.Popen([sys.executable, "-m", "memoryd", "serve", "--socket", str(sock_path), "--db",
                             str(tmp_path / "p.db")], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # ready once it says so (it binds first)
            if "memoryd ready" in line:
                break
        r = run("--socket", str(sock_path), "--no-autostart", "status")
        assert r.returncode == 0, r.stderr
        fields = status_fields(r.stdout)
        assert (fields["config"], fields["log"], fields["write policy"]) == ("none", "stderr", "ask")
        assert json.loads(run("--socket", str(sock_path), "status", "--json").stdout)["log"] is None
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
        shutil.rmtree(sock_path.parent, ignore_errors=True)


def test_export_never_overwrites_without_force(daemon: Any, tmp_path: Path) -> None:
    assert run(*sock(daemon), "add", *UG, "Prefers tabs").returncode == 0
    (tmp_path / "out").mkdir()
    target = tmp_path / "out" / "backup.json"
    target.write_text("yesterday's backup")
    target.chmod(0o644)
    before = store_state(daemon)
    r = run(*sock(daemon), "export", "-o", str(target))
    assert (r.returncode, r.stdout) == (2, "")
    assert error_line(r.stderr) == f"error: USAGE: {target} exists; pass --force to overwrite it"
    assert target.read_text() == "yesterday's backup" and target.stat().st_mode & 0o777 == 0o644
    assert [p.name for p in target.parent.iterdir()] == ["backup.json"]  # no temp file left
    assert store_state(daemon) == before

    r = run(*sock(daemon), "export", "-o", str(target), "--force")
    assert r.returncode == 0, r.stderr
    assert [e["text"] for e in json.loads(target.read_text())["entries"]] == ["Prefers tabs"]
    assert target.stat().st_mode & 0o777 == 0o600


def test_export_refuses_a_file_that_appeared_meanwhile(tmp_path: Path) -> None:
    """-o checks before connecting; a file created between that check and the write is not
    replaced either (link, not rename)."""
    from memoryd_client.running import UsageError, _write_private

    target = tmp_path / "late.json"
    target.write_text("someone else's")
    with pytest.raises(UsageError, match=r"late\.json exists; pass --force to overwrite it"):
        _write_private(str(target), "{}\n", force=False)
    assert target.read_text() == "someone else's"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["late.json", "xdg"]  # no temp file left
    fresh = tmp_path / "new.json"
    assert _write_private(str(fresh), "{}\n", force=False) == str(fresh)
    assert fresh.read_text() == "{}\n" and fresh.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["late.json", "new.json", "xdg"]


def test_markdown_import_without_adapter_names_the_adapters(daemon: Any, tmp_path: Path) -> None:
    claude = tmp_path / "CLAUDE.md"
    claude.write_text("## Project notes\n\n- Use pnpm, not npm\n- Tests live in tests/\n")
    prose = tmp_path / "notes.md"  # no markdown syntax at all: known by its name
    prose.write_text("Just a paragraph.\n")
    before = store_state(daemon)
    hint = ("is markdown, not a memory-export-v1 envelope: import it through an adapter "
            "(hermes-memory-md, claude-code-memory-md; 'memoryctl adapters' lists all): ")
    for name, args, shown, fixed in [
        (claude, [str(claude)], str(claude), f"memoryctl import --adapter claude-code-memory-md {claude}"),
        (prose, [str(prose)], str(prose), f"memoryctl import --adapter claude-code-memory-md {prose}"),
        (claude, ["-"], "stdin", "memoryctl import --adapter claude-code-memory-md -"),
    ]:
        r = run(*sock(daemon), "import", *args, input=name.read_text())
        assert (r.returncode, r.stdout) == (2, ""), r.stderr
        assert error_line(r.stderr) == f"error: USAGE: {shown} {hint}{fixed}"
        assert r.stderr.count("\n") == 1
    memory = tmp_path / "MEMORY.md"
    memory.write_text("## Facts\n- Lives in Berlin\n")
    r = run(*sock(daemon), "import", str(memory))
    assert error_line(r.stderr).endswith(f": memoryctl import --adapter hermes-memory-md {memory}")
    assert store_state(daemon) == before
    # the command it shows is the one that works
    r = run(*sock(daemon), "import", "--adapter", "claude-code-memory-md", str(claude))
    assert r.returncode == 0 and r.stdout.startswith("imported 2 entries"), r.stderr


def test_a_socket_directory_that_cannot_be_made_is_one_line_exit_3(
    fresh_socket: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = fresh_socket.parent.parent
    base.joinpath("run").symlink_to(base / "nowhere")  # something in the way (a dangling link)
    monkeypatch.setenv("MEMORYD_SOCKET", str(fresh_socket))
    r = run("status")
    assert (r.returncode, r.stdout) == (3, "")
    assert r.stderr == f"error: AUTOSTART_FAILED: cannot create the socket directory {base / 'run'}: File exists\n"
    blocker = base / "file"
    blocker.write_text("")
    monkeypatch.setenv("MEMORYD_SOCKET", str(blocker / "run" / "memoryd.sock"))
    r = run("status")
    assert (r.returncode, r.stdout) == (3, "")
    assert r.stderr == (f"error: CONNECT_FAILED: cannot connect to memoryd at {blocker / 'run' / 'memoryd.sock'}: "
                        "Not a directory\n")
    assert not (base / "nowhere").exists() and blocker.read_text() == ""


@pytest.mark.process
def test_autostart_on_a_locked_store_prints_the_daemons_reason(
    daemon: Any, fresh_socket: Path
) -> None:
    before = store_state(daemon)
    r = run("--socket", str(fresh_socket), "--db", str(daemon.db_path), "status")
    assert (r.returncode, r.stdout) == (3, "")
    reason, error = r.stderr.splitlines()
    assert reason.startswith("memoryd: STORE_LOCKED: ") and str(daemon.db_path) in reason
    assert error == (f"error: AUTOSTART_FAILED: memoryd exited with status 1 before it was ready "
                     f"(log: {fresh_socket.parent / 'memoryd.log'})")
    assert store_state(daemon) == before
# --- harness-facing details: --id, import skipping what exists ------------------------------


def ledger(d: Any) -> tuple[list[Any], int]:
    """Entries and ledger length: what a no-op must leave as it was."""
    with mc.connect_sync(d.socket_path, timeout=10) as c:
        return [mc.plain(e) for e in c.list()], len(c.audit_list(10000))


@pytest.mark.process
def test_reimporting_a_backup_or_claude_md_is_a_no_op(ask_daemon: Any, tmp_path: Path) -> None:
    d = ask_daemon  # policy ask, and memoryctl has no terminal: any approval it is asked is denied
    for text in ("Prefers tabs", "Prefers tabs", "Uses uv for Python"):
        assert run(*sock(d), "--yes", "add", *UG, text).returncode == 0
    backup = tmp_path / "backup.json"
    assert run(*sock(d), "export", "-o", str(backup)).returncode == 0
    before = ledger(d)
    r = run(*sock(d), "import", str(backup))
    assert (r.returncode, r.stdout.strip()) == (0, "imported 0 entries, skipped 3 already in the store"), r.stderr
    assert "memoryd asks" not in r.stderr  # no approval was asked
    assert ledger(d) == before
    r = run(*sock(d), "--json", "import", str(backup))
    assert json.loads(r.stdout) == {"added": 0, "entries": [], "skipped": 3}

    claude = tmp_path / "CLAUDE.md"
    claude.write_text("## Project notes\n\n- Use pnpm, not npm\n- Tests live in tests/\n")
    md = ["import", "--adapter", "claude-code-memory-md", str(claude)]
    r = run(*sock(d), "--yes", *md)
    assert (r.returncode, r.stdout.strip()) == (0, "imported 2 entries, skipped 0 already in the store"), r.stderr
    before = ledger(d)
    r = run(*sock(d), *md)
    assert (r.returncode, r.stdout.strip()) == (0, "imported 0 entries, skipped 2 already in the store"), r.stderr
    assert ledger(d) == before
    # an edited file brings in only its new line, and that one is asked (denied here: no terminal)
    claude.write_text(claude.read_text() + "- CI runs make check\n")
    r = run(*sock(d), *md)
    assert r.returncode == 1 and "WRITE_DENIED" in error_line(r.stderr)
    with mc.connect_sync(d.socket_path, timeout=10) as c:
        denied = c.audit_list(1)[0]
    assert (denied.action, denied.text) == ("seed-denied", "user/user-global: CI runs make check")
    r = run(*sock(d), "--yes", *md)
    assert (r.returncode, r.stdout.strip()) == (0, "imported 1 entries, skipped 2 already in the store"), r.stderr

    # --allow-duplicates is the plain restore
    r = run(*sock(d), "--yes", "import", "--allow-duplicates", str(backup))
    assert (r.returncode, r.stdout.strip()) == (0, "imported 3 entries"), r.stderr
    assert texts(d).count("Prefers tabs") == 4


def test_replace_and_remove_by_id(daemon: Any) -> None:
    d = daemon
    coder = [*sock(d), "--agent", "coder"]  # private to the coder preset: another agent cannot see them
    for text in ("Prefers tabs", "Prefers tabs"):
        assert run(*coder, "add", *UG, text).returncode == 0
    first, second = (e["id"] for e in json.loads(run(*sock(d), "list", "--json").stdout))
    before = ledger(d)
    r = run(*coder, "remove", *UG, "tabs")
    assert r.returncode == 1 and error_line(r.stderr).startswith("error: AMBIGUOUS_MATCH: ")

    for args, fragment in [(["remove", *UG], "remove needs MATCH or --id"),
                           (["remove", *UG, "--id", second, "tabs"], "give MATCH or --id, not both"),
                           (["replace", *UG, "--id", second, "tabs", "x"], "give MATCH or --id, not both"),
                           (["replace", *UG, "x"], "replace needs the new TEXT after MATCH")]:
        r = run(*coder, *args)
        assert r.returncode == 2 and fragment in error_line(r.stderr), (args, r.stderr)
    # an id in another layer, or one the session cannot see, is not found
    for args, track, entry_id in (
        (["--agent", "coder", "remove", "--track", "agent", "--scope", "user-global", "--id", second], "agent", second),
        (["--agent", "reviewer", "remove", *UG, "--id", second], "user", second),
        (["--agent", "reviewer", "remove", *UG, "--id", second[:8]], "user", second[:8]),
        (["remove", *UG, "--id", second], "user", second),  # memoryctl's default: the shared layer only
    ):
        r = run(*sock(d), "--json", *args)
        assert r.returncode == 1 and error_line(r.stderr).startswith("error: ENTRY_NOT_FOUND: "), r.stderr
        details = json.loads(r.stdout)["error"]["details"]
        assert details == {"track": track, "scope": "user-global", "entryId": entry_id}
    assert ledger(d) == before

    r = run(*coder, "--json", "remove", *UG, "--id", second[:8])  # the prefix 'memoryctl list' shows
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["entry"]["id"] == second
    r = run(*coder, "--json", "replace", *UG, "--id", first, "Prefers spaces")  # a full id
    assert r.returncode == 0, r.stderr
    assert (json.loads(r.stdout)["entry"]["id"], json.loads(r.stdout)["entry"]["version"]) == (first, 2)
    assert texts(d) == ["Prefers spaces"]


def test_id_prefix_that_starts_several_ids_is_refused(daemon: Any) -> None:
    with mc.connect_sync(daemon.socket_path, timeout=10) as c:
        # 17 ids over 16 hex digits: at least two share their first character
        entries = c.seed([{"track": "user", "scope": "user-global", "text": f"fact {n}"} for n in range(17)],
                         write={"agent": {"session": {"id": "s", "header": {"cwd": os.getcwd()}}}}).entries
    firsts = [e.id[0] for e in entries]
    shared = next(ch for ch in firsts if firsts.count(ch) > 1)
    before = ledger(daemon)
    r = run(*sock(daemon), "remove", *UG, "--id", shared)
    assert r.returncode == 2, r.stderr
    assert f"--id {shared} starts {firsts.count(shared)} entries' ids in user/user-global" in error_line(r.stderr)
    assert ledger(daemon) == before
