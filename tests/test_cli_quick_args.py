"""memoryctl's read commands read a plain command line without argparse
(cli.quick_args): the Namespace it makes is the parser's, and it imports no argparse."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from memoryd_client import cli
from memoryd_protocol import approval_text

pytestmark = pytest.mark.inprocess


def parsed(argv: list[str]) -> dict[str, Any] | None:
    """What argparse makes of ``argv`` (None: it refused it, or printed help)."""
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        try:
            return vars(cli._parse(cli.build_parser(), argv))
        except SystemExit:
            return None


@pytest.mark.parametrize("argv", [
    ["query", "postgres"], ["query"], ["status"], ["budgets"], ["list"], ["query", ""],
    ["--socket", "/s.sock", "--no-autostart", "query", "postgres"],
    ["query", "postgres", "--socket", "/s.sock", "--no-autostart"],
    ["--socket=/a", "query", "--socket", "/b", "x"],
    ["query", "--limit", "5", "--track", "user", "--scope", "workspace", "--as-session", "x"],
    ["query", "--limit= 7", "x", "--agent", "", "--session", "s-1", "--workspace", "~/proj"],
    ["--cwd", "/w", "-y", "--yes", "--via-approver", "--timeout", "1e3", "status", "--timeout=2.5"],
    ["--db", "d.db", "--config", "c.toml", "budgets"], ["list", "--track", "agent", "--scope", "user-global"],
    ["--agent", "query", "query", "list"], ["query", "--limit", "5_0", "status"],
])
def test_a_plain_read_command_is_read_as_the_parser_reads_it(argv: list[str]) -> None:
    quick = cli.quick_args(argv)
    assert quick is not None
    assert vars(quick) == parsed(argv)


@pytest.mark.parametrize("argv", [
    [], ["--help"], ["query", "-h"], ["--version"], ["query", "--json", "x"], ["--json", "status"], ["add", "x"],
    ["query", "a", "b"], ["list", "x"], ["status", "x"], ["query", "--lim", "5"], ["--sock", "/s", "status"],
    ["query", "--limit", "-5"], ["query", "--limit", "five"], ["--timeout", "0", "status"], ["--timeout", "nan", "status"],
    ["query", "--track", "users"], ["--track", "user", "query"], ["query", "--", "x"], ["query", "-x"],
    ["--socket", "status"], ["status", "--socket"], ["--agent=", "status"], ["--no-autostart=1", "status"],
    ["-yh", "status"], ["status", "--as-session"], ["socket"], ["x", "status"],
])
def test_anything_else_is_the_parsers(argv: list[str]) -> None:
    assert cli.quick_args(argv) is None


WORDS = st.sampled_from([
    "query", "list", "status", "budgets", "add", "socket", "--socket", "--db", "--config", "--no-autostart",
    "--timeout", "--json", "-y", "--yes", "--via-approver", "--workspace", "--cwd", "--agent", "--session",
    "--track", "--scope", "--limit", "--as-session", "--tag", "-h", "--", "--lim", "--socket=/s", "--limit=3",
    "--timeout=0", "--agent=", "user", "agent", "user-global", "workspace", "5", " 7", "x", "", "-1", "1e3", "0",
    "nan", "inf", "/tmp/s.sock", "~/w",
])


@settings(max_examples=600, deadline=None)
@given(st.lists(WORDS, max_size=8))
def test_what_quick_args_reads_the_parser_reads_the_same(argv: list[str]) -> None:
    quick = cli.quick_args(argv)
    if quick is not None:
        assert vars(quick) == parsed(argv)


def test_memoryctl_query_imports_no_argparse(daemon: Any, tmp_path: Path) -> None:
    """A read command in a fresh interpreter: no argparse, gettext or locale (argparse's
    messages), no parser classes, no importlib, no json or re (leanjson reads its lines)."""
    code = ("import sys\n"
            "from memoryd_client.cli import main\n"
            f"rc = main(['--socket', {str(daemon.socket_path)!r}, '--no-autostart', 'query', 'x'])\n"
            "lean = ('argparse', 'gettext', 'locale', 'memoryd_client.parsing', 'importlib', 'pathlib', 'json', 're')\n"
            "print(rc, [m for m in lean if m in sys.modules], file=sys.stderr)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       stdin=subprocess.DEVNULL)
    assert r.stderr.splitlines()[-1] == "0 []", r.stderr


def test_ascii_escapes_are_the_regular_expressions() -> None:
    """render.visible's ASCII path (str.translate) escapes what the pattern it replaced did."""
    import re

    from memoryd_client import render

    pattern = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
    text = "".join(chr(c) for c in range(128)) * 2
    assert render.visible(text) == pattern.sub(lambda m: approval_text._escape_char(m.group()), text).replace("\r", "\\r")
