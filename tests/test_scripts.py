"""memoryd and memoryctl are installed as plain scripts (hatchling shared-scripts), not as
entry-point launchers: a launcher imports re before the command starts. The relay started
through its script imports no re at all."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = {"memoryd": "memoryd.cli", "memoryctl": "memoryd_client.cli"}


def test_the_commands_ship_as_scripts_not_entry_points() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "scripts" not in project["project"]  # two files of one name in bin: one would win
    shared = project["tool"]["hatch"]["build"]["targets"]["wheel"]["shared-scripts"]
    assert shared == {f"scripts/{name}": name for name in COMMANDS}
    assert "scripts" in project["tool"]["hatch"]["build"]["targets"]["sdist"]["include"]


@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_script_runs_its_main_and_imports_nothing_else(name: str) -> None:
    path = ROOT / "scripts" / name
    assert os.access(path, os.X_OK)
    text = path.read_text()
    assert text.startswith("#!/usr/bin/env python3\n")  # hatchling makes it #!python; the installer, the env's
    imports = [node for node in ast.parse(text).body if isinstance(node, ast.Import | ast.ImportFrom)]
    assert [ast.unparse(node) for node in imports] == ["import sys", f"from {COMMANDS[name]} import main"]


@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_script_exits_with_mains_status(name: str) -> None:
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / name), "--version"], capture_output=True, text=True,
                       timeout=60)
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout.startswith(f"{name} ")
