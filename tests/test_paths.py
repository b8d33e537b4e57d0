"""The default locations: memoryd's Linux fast path agrees with platformdirs."""

from __future__ import annotations

import sys
from pathlib import Path

import platformdirs
import pytest
from memoryd_protocol import paths


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the fast path is Linux's XDG lookup")
@pytest.mark.parametrize("data_home, config_home", [
    (None, None), ("", ""), ("   ", " "), ("/srv/data", "/srv/conf"),
])
def test_xdg_fast_path_equals_platformdirs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                           data_home: str | None, config_home: str | None) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    for var, value in (("XDG_DATA_HOME", data_home), ("XDG_CONFIG_HOME", config_home)):
        if value is None:
            monkeypatch.delenv(var, raising=False)
        else:
            monkeypatch.setenv(var, value)
    assert paths.default_db_path() == Path(platformdirs.user_data_dir("memoryd")) / "memory.db"
    assert paths.default_config_path() == Path(platformdirs.user_config_dir("memoryd")) / "config.toml"


def test_socket_path_prefers_memoryd_socket(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MEMORYD_SOCKET", str(tmp_path / "s.sock"))
    assert paths.default_socket_path() == tmp_path / "s.sock"
    monkeypatch.delenv("MEMORYD_SOCKET")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert paths.default_socket_path() == tmp_path / "memoryd" / "memoryd.sock"


def test_a_relative_xdg_dir_is_ignored_as_the_spec_says(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_DATA_HOME", "relative/data")
    monkeypatch.setenv("XDG_CONFIG_HOME", "relative/conf")
    assert paths.default_db_path() == tmp_path / ".local/share/memoryd/memory.db"
    assert paths.default_config_path() == tmp_path / ".config/memoryd/config.toml"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the default heads file is Linux's XDG state dir")
def test_only_the_default_store_s_heads_go_to_the_users_witness(monkeypatch: pytest.MonkeyPatch,
                                                                tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    witness = tmp_path / "state" / "memoryd" / "heads"
    default = tmp_path / "data" / "memoryd" / "memory.db"
    assert paths.heads_path_for(default) == witness
    # the same store by another name: a link to it, or a path with a detour
    link = tmp_path / "link.db"
    link.symlink_to(default)
    assert paths.heads_path_for(link) == witness
    assert paths.heads_path_for(tmp_path / "data" / "memoryd" / ".." / "memoryd" / "memory.db") == witness
    # any other store, even one in the default store's directory: beside it
    other = tmp_path / "data" / "memoryd" / "scratch.db"
    assert paths.heads_path_for(other) == tmp_path / "data" / "memoryd" / "scratch.db.memoryd-heads"
    assert paths.heads_path_for(tmp_path / "s.db") == tmp_path / "s.db.memoryd-heads"
    assert paths.heads_path_for(tmp_path / "s.db") in paths.store_files(tmp_path / "s.db")
