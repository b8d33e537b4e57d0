"""The default locations, as the README documents them."""

from __future__ import annotations

import os
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


@pytest.mark.parametrize("record", [b"", b"not json", b"\xff", b"[]", b'"pid"', b'{"socket": "/s"}',
                                    b'{"pid": "12", "socket": "/s"}', b'{"pid": 12.0, "socket": "/s"}',
                                    b'{"pid": true, "socket": "/s"}', b'{"pid": 0, "socket": "/s"}',
                                    b'{"pid": -1, "socket": "/s"}'])
def test_an_owner_record_memoryd_would_not_write_reads_as_none(tmp_path: Path, record: bytes) -> None:
    db = tmp_path / "memory.db"
    paths.owner_record_path(db).write_bytes(record)
    assert paths.read_owner_record(db) is None


def test_the_owner_record_the_daemon_writes_reads_back(tmp_path: Path) -> None:
    from memoryd.app import write_owner

    db = tmp_path / "memory.db"
    assert paths.read_owner_record(db) is None
    write_owner(db, "/run/memoryd.sock", stopping=True)
    assert paths.read_owner_record(db) == paths.OwnerRecord(os.getpid(), "/run/memoryd.sock", True)
    write_owner(db, None)
    assert paths.read_owner_record(db) == paths.OwnerRecord(os.getpid(), None, False)
    paths.owner_record_path(db).write_text('{"pid": 7, "socket": 5, "stopping": 1}\n')
    assert paths.read_owner_record(db) == paths.OwnerRecord(7, None, False)
