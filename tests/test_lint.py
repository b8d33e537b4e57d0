"""The checks CI made before the tests, as tests: CI runs only the README's command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), cwd=ROOT, capture_output=True, text=True, timeout=900)


def test_ruff_is_clean() -> None:
    r = _run(str(BIN / "ruff"), "check", ".")
    assert r.returncode == 0, r.stdout + r.stderr


def test_mypy_strict_is_clean() -> None:
    r = _run(str(BIN / "mypy"))
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_protocol_package_imports_alone() -> None:
    r = _run(sys.executable, "-c", "import sys, memoryd_protocol, memoryd_protocol.adapters; "
             "assert 'memoryd' not in sys.modules and 'memoryd_client' not in sys.modules")
    assert r.returncode == 0, r.stderr
