"""Daemon errors (memoryd.errors.DaemonError): ``memoryd`` says them in one line and exits
with their code, never with a traceback, and a refusal at start creates nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from memoryd import cli
from memoryd.adapter_registry import AdapterRegistryError
from memoryd.config import ConfigError
from memoryd.errors import DaemonError
from memoryd.relay import RelayError
from memoryd.rundir import UnsafeDir
from memoryd.transports import SocketInUse
from memoryd.units import UnitError


def test_every_start_up_refusal_is_a_daemon_error() -> None:
    for cls in (AdapterRegistryError, ConfigError, RelayError, SocketInUse, UnitError, UnsafeDir):
        assert issubclass(cls, DaemonError), cls
    assert ConfigError.exit_code == 2 and SocketInUse.exit_code == 1


def test_the_command_line_turns_a_daemon_error_into_one_line_and_its_exit_code(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def refuse(argv: list[str] | None) -> int:
        raise ConfigError("config: nope")

    monkeypatch.setattr(cli, "_main", refuse)
    assert cli.main(["serve"]) == 2
    assert capsys.readouterr().err == "memoryd: config: nope\n"


def test_a_bad_adapter_stops_serve_with_one_line_and_touches_no_store(tmp_path: Path) -> None:
    site = tmp_path / "site"
    dist = site / "memoryd_test_broken_adapter-0.1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: memoryd_test_broken_adapter\nVersion: 0.1.0\n")
    (dist / "entry_points.txt").write_text("[memoryd.adapters]\nbroken = memoryd_test_no_such_module:Adapter\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    db, sock = tmp_path / "m.db", tmp_path / "run" / "m.sock"
    r = subprocess.run([sys.executable, "-m", "memoryd", "serve", "--db", str(db), "--socket", str(sock)],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 1
    assert r.stderr == ("memoryd: adapter entry point 'broken' (memoryd_test_no_such_module:Adapter) refused: it "
                        "failed to load: ModuleNotFoundError: No module named 'memoryd_test_no_such_module'\n")
    assert not db.exists() and not sock.exists()
