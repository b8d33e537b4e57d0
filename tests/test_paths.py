"""The default locations, as the README documents them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from memoryd_protocol import paths


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
