"""A fresh machine with only Python: the README's set-up-and-test command is all CI runs, and
the test run installs the programs the tests need (tests/system_tools.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import system_tools
from system_tools import TOOLS

ROOT = Path(__file__).resolve().parents[1]


def readme_command() -> str:
    text = (ROOT / "README.md").read_text()
    (command,) = re.findall(r"Set up and test .*?```sh\n(.*?)\n```", text, re.S)
    return command


def test_ci_runs_exactly_the_readme_command_and_nothing_else() -> None:
    lines = [ln for ln in (ROOT / ".ci" / "run").read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    assert readme_command() == ("python3 -m venv .venv && . .venv/bin/activate && pip install -e '.[dev]' && "
                                "python -m pytest -q")
    assert lines == ["set -euo pipefail", 'cd "$(dirname "$0")/.."', readme_command()]


def _which_without(*absent: str) -> object:
    return lambda name: None if name in absent else f"/usr/bin/{name}"


def test_a_machine_without_zsh_and_fish_gets_them_from_apt() -> None:
    lacking = system_tools.missing(_which_without("zsh", "fish"), old_node=lambda: False)  # type: ignore[arg-type]
    assert [t.command for t in lacking] == ["zsh", "fish"]
    assert system_tools.install_command(lacking) == [
        ["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "zsh", "fish"]]


def test_an_old_node_is_missing_too() -> None:
    lacking = system_tools.missing(_which_without(), old_node=lambda: True)  # type: ignore[arg-type]
    assert [t.package for t in lacking] == ["nodejs"]


def test_every_program_the_tests_run_is_listed() -> None:
    """What .ci/run installed before, by command: each is the test run's to install now."""
    assert {t.command: t.package for t in TOOLS} == {
        "node": "nodejs", "npm": "npm", "systemd-analyze": "systemd", "zsh": "zsh", "fish": "fish", "man": "man-db",
        "tmux": "tmux", "sshd": "openssh-server", "ssh": "openssh-client"}


def test_without_root_nothing_is_installed_and_the_packages_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    said: list[str] = []
    fish = next(t for t in TOOLS if t.command == "fish")
    monkeypatch.setattr(system_tools, "missing", lambda: [fish])
    monkeypatch.setattr(system_tools.os, "geteuid", lambda: 1000)
    ran: list[object] = []
    monkeypatch.setattr(system_tools.subprocess, "run", lambda *a, **k: ran.append(a))
    assert system_tools.ensure(said.append) == [fish]
    assert ran == []
    assert said == ["memoryd tests: missing fish (fish: tests/test_manual.py (the fish completion)): install them "
                    "with  apt-get install fish (the test run installs them itself only as root)"]


def test_a_missing_program_fails_the_test_naming_its_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(pytest.fail.Exception, match=r"missing zsh .*apt-get install zsh"):
        system_tools.require("zsh")
