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
            pytest.fail("node is required in CI (.ci/run installs it)")
        pytest.skip("node is not installed; the Node client's tests need node >= 20")
    env = dict(os.environ, MEMORYD_PYTHON=sys.executable)
    r = subprocess.run([node, "--test", "test/"], cwd=JS, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    assert "# fail 0" in r.stdout
