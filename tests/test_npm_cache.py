"""Where the tests' npm installs write: the cache directory alone, never npm's ``~/.npm``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from npm_cache import npm_install


def test_an_install_leaves_only_the_cache_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = tmp_path / "tiny"
    source.mkdir()
    manifest = {"name": "tiny", "version": "1.0.0", "private": True}
    (source / "package.json").write_text(json.dumps(manifest))
    (source / "package-lock.json").write_text(json.dumps({
        "name": "tiny", "version": "1.0.0", "lockfileVersion": 3, "requires": True,
        "packages": {"": {"name": "tiny", "version": "1.0.0"}}}))
    home, cache, tmp = tmp_path / "home", tmp_path / "cache", tmp_path / "tmp"
    for d in (home, tmp):
        d.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("MEMORYD_TEST_NODE_CACHE", str(cache))
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setattr("tempfile.tempdir", None)  # read TMPDIR again
    installed = npm_install(source)
    assert installed.parent == cache
    assert sorted(p.name for p in cache.iterdir()) == sorted([installed.name, f"{installed.name}.lock"])
    assert (installed / ".installed").exists()
    assert list(home.iterdir()) == []  # no ~/.npm, no ~/.config
    assert list(tmp.iterdir()) == []  # npm's download cache went with its temporary directory
