"""The Node.js client's own suite (node --test), against real daemons it starts itself."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

JS = Path(__file__).resolve().parent.parent / "client" / "js"


def test_node_client_suite() -> None:
    node = shutil.which("node")
    if node is None:
        if os.environ.get("CI"):
            pytest.fail("node is required (the test run installs it when run as root: tests/system_tools.py)")
        pytest.skip("node is not installed; the Node client's tests need node >= 20")
    env = dict(os.environ, MEMORYD_PYTHON=sys.executable)
    r = subprocess.run([node, "--test", "test/"], cwd=JS, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "# fail 0" in r.stdout, _failures(r.stdout) + r.stdout[-3000:] + r.stderr[-3000:]


def _failures(tap: str) -> str:
    """Each failed test's TAP block first: the tail alone may not reach it."""
    lines = tap.splitlines()
    out = []
    for i, line in enumerate(lines):
        if line.lstrip().startswith("not ok"):
            out += lines[i:i + 40]
    return "\n".join(out) + "\n---\n"
