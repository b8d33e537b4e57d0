"""A mistyped option is named as unknown, with a "did you mean", before any complaint about a
required option it may have been meant to be; and nothing is written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "memoryd_client", *args], capture_output=True, text=True,
                          timeout=60, env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize(("argv", "said"), [
    (["add", "--tarck", "user", "--scope", "user-global", "x"],
     "unrecognized option '--tarck'; did you mean '--track'? (see 'memoryctl add --help')"),
    (["add", "--track", "user", "--scpoe=user-global", "x"],
     "unrecognized option '--scpoe'; did you mean '--scope'? (see 'memoryctl add --help')"),
    (["audit", "verify", "--haeds", "f"],
     "unrecognized option '--haeds'; did you mean '--heads'? (see 'memoryctl audit verify --help')"),
    (["list", "--xyzzy"], "unrecognized option '--xyzzy' (see 'memoryctl list --help')"),
])
def test_an_unknown_option_is_named_first(argv: list[str], said: str, tmp_path: Path) -> None:
    r = run(*argv, env={"MEMORYD_SOCKET": str(tmp_path / "none.sock")})
    assert (r.returncode, r.stdout, r.stderr) == (2, "", f"error: USAGE: {said}\n")


def test_abbreviations_text_after_double_dash_and_real_options_still_work(daemon: Any) -> None:
    sock = {"MEMORYD_SOCKET": str(daemon.socket_path)}
    r = run("add", "--tra", "user", "--scope", "user-global", "--", "--tarck is a word here", env=sock)
    assert r.returncode == 0, r.stderr
    r = run("list", "--json", env=sock)
    assert r.returncode == 0 and "--tarck is a word here" in r.stdout


def test_a_missing_required_option_is_still_named(tmp_path: Path) -> None:
    r = run("add", "--scope", "user-global", "x", env={"MEMORYD_SOCKET": str(tmp_path / "none.sock")})
    assert (r.returncode, r.stderr) == (2, "error: USAGE: the following arguments are required: --track "
                                           "(see 'memoryctl add --help')\n")
