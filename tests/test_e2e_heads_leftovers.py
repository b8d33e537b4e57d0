"""The heads file's directory and mode, and how much of it a start reads, against real daemons.

The user's witness, ``$XDG_STATE_HOME/memoryd/heads``, is only as good as who can write it: a
directory replaced by a symbolic link sends the heads into another directory, a file left
writable by the group or others lets another user append a forged ``stop`` head, and a
directory others may write lets them remove or replace it. The daemon refuses each, says so
once in its log, keeps serving, and trusts no stop head from it at start; memoryctl refuses
to read it. A start reads only the file's tail (the newest heads are what it checks), so a
heads file grown without bound cannot make the start read all of it."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import anyio
import pytest
from e2e_helpers import add, memoryctl, stop_promptly, tip
from memoryd_protocol.heads_file import HEADS_TAIL_BYTES, read_heads_tail
from memoryd_protocol.paths import default_db_path
from rawclient import socket_client

pytestmark = [pytest.mark.anyio, pytest.mark.process]

PLANTS = ("dir-symlink", "dir-0777", "file-0666", "file-0620")


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The default store of this test's own data and state homes: its heads go to the user's
    witness, ``$XDG_STATE_HOME/memoryd/heads``."""
    for var, name in (("XDG_DATA_HOME", "data"), ("XDG_STATE_HOME", "state")):
        monkeypatch.setenv(var, str(tmp_path / "xdg" / name))
    db = default_db_path()
    db.parent.mkdir(mode=0o700, parents=True)
    return db


@pytest.fixture
def heads(tmp_path: Path) -> Path:
    return tmp_path / "xdg" / "state" / "memoryd" / "heads"


@pytest.fixture
def every_row(tmp_path: Path) -> Path:
    """A config witnessing the head after every write: each one opens the heads file again."""
    cfg = tmp_path / "every-row.toml"
    cfg.write_text("heads_every_rows = 1\n")
    return cfg


def plant(kind: str, heads: Path, content: bytes, decoy: Path) -> str:
    """Make ``heads`` hold ``content`` in the way ``kind`` says; the refusal it should meet.
    ``decoy``: the directory a followed link leads to."""
    directory = heads.parent
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    heads.unlink(missing_ok=True)
    if kind == "dir-symlink":
        decoy.mkdir(mode=0o700)
        (decoy / "heads").write_bytes(content)
        (decoy / "heads").chmod(0o600)
        directory.rmdir()
        directory.symlink_to(decoy)
        return (f"the heads file's directory {directory} is a symbolic link: memoryd keeps ledger heads only in a "
                "directory it reaches without following a link; remove the link, and memoryd makes the directory "
                "anew at its next head")
    heads.write_bytes(content)
    heads.chmod(0o600)
    if kind == "dir-0777":
        directory.chmod(0o777)
        return (f"the heads file's directory {directory} is writable by other users (mode 0777): they could remove "
                f"or replace the heads file; chmod o-w {directory}, and memoryd witnesses there again at its next head")
    mode = int(kind.removeprefix("file-"), 8)
    heads.chmod(mode)
    return (f"the heads file {heads} is writable by its group or others (mode {mode:04o}): memoryd keeps ledger heads "
            f"only in a file no other user can write; check it with memoryctl audit verify --heads {heads}, then "
            f"chmod 600 {heads} or remove it, and memoryd witnesses there again at its next head")


def unchanged(kind: str, heads: Path, content: bytes, decoy: Path) -> None:
    """What was planted is as planted, and nothing was written through it."""
    if kind == "dir-symlink":
        assert os.readlink(heads.parent) == str(decoy)
        assert (decoy / "heads").read_bytes() == content
        return
    assert heads.read_bytes() == content
    st = os.stat(heads.parent if kind == "dir-0777" else heads)
    assert stat.S_IMODE(st.st_mode) == (0o777 if kind == "dir-0777" else int(kind.removeprefix("file-"), 8))


def read(path: Path) -> bytes:
    return path.read_bytes()


def write(path: Path, data: bytes) -> int:
    """``path`` holds ``data`` now; its size."""
    path.write_bytes(data)
    return path.stat().st_size


def forged_stop(db: Path) -> tuple[bytes, str]:
    """A stop head the store does not hold, and what a start that trusted it would log."""
    n = tip(db)[0] + 50
    head = {"store": str(db.resolve()), "n": n, "hash": "0" * 64, "ts": 1, "event": "stop"}
    return (json.dumps(head).encode() + b"\n",
            f"ledger row {n}, the head the heads file witnessed at memoryd's last stop, is missing")


@pytest.mark.parametrize("kind", PLANTS)
async def test_a_loose_heads_file_while_running_is_refused_and_the_daemon_serves_on(
        kind: str, store: Path, heads: Path, every_row: Path, daemon_factory: Any, tmp_path: Path) -> None:
    d = daemon_factory("--config", str(every_row), db=store)
    content = read(heads)  # the start's head
    decoy = tmp_path / "decoy"
    refusal = plant(kind, heads, content, decoy)
    with anyio.fail_after(15):
        async with socket_client(d.socket_path) as raw:
            for text in ("uses pnpm", "uses uv", "tabs"):
                await add(raw, text)
            assert len(await raw.ok("memory/list", {})) == 3
            assert (await raw.ok("audit/verify"))["ok"] is True
    stop_promptly(d)
    unchanged(kind, heads, content, decoy)
    log = d.stderr()
    assert log.count(f"{refusal} (until it is, the ledger heads are witnessed in this log only)") == 1
    n, h = tip(store)
    assert f"ledger head at stop: row {n} hash {h}" in log


@pytest.mark.parametrize("kind", PLANTS)
async def test_a_loose_heads_file_before_the_start_is_refused_and_its_stop_head_not_trusted(
        kind: str, store: Path, heads: Path, every_row: Path, daemon_factory: Any, tmp_path: Path) -> None:
    d = daemon_factory("--config", str(every_row), db=store)
    async with socket_client(d.socket_path) as raw:
        await add(raw, "uses pnpm")
    stop_promptly(d)
    content, trusted = forged_stop(store)
    decoy = tmp_path / "decoy"
    refusal = plant(kind, heads, content, decoy)
    with anyio.fail_after(15):
        again = await anyio.to_thread.run_sync(lambda: daemon_factory("--config", str(every_row), db=store,
                                                                      name="again"))
        async with socket_client(again.socket_path) as raw:
            await add(raw, "uses uv")
            assert (await raw.ok("audit/verify"))["ok"] is True
    stop_promptly(again)
    unchanged(kind, heads, content, decoy)
    log = again.stderr()
    assert log.count(f"{refusal} (the start trusts no stop head from it, and checks the store without it)") == 1
    assert trusted not in log
    n, h = tip(store)
    assert f"ledger head at stop: row {n} hash {h}" in log



@pytest.mark.parametrize("kind", PLANTS)
async def test_memoryctl_refuses_a_loose_heads_file(kind: str, store: Path, heads: Path, daemon_factory: Any,
                                                    tmp_path: Path) -> None:
    d = daemon_factory(db=store)
    content = read(heads)
    decoy = tmp_path / "decoy"
    refusal = plant(kind, heads, content, decoy)
    r = await anyio.to_thread.run_sync(lambda: memoryctl("--socket", str(d.socket_path), "audit", "heads"))
    assert (r.returncode, r.stdout, r.stderr) == (2, "", f"error: USAGE: {refusal}\n")
    unchanged(kind, heads, content, decoy)


@pytest.mark.parametrize("where", ["before-the-tail", "in-the-tail"])
async def test_the_start_reads_only_the_heads_files_tail(where: str, store: Path, heads: Path,
                                                         daemon_factory: Any) -> None:
    """A forged stop head with more than the tail's worth of other heads after it is never
    read: the start says it read the tail only, and checks the store without a stop head; the
    same head within the tail is read (and reported, being forged)."""
    d = daemon_factory(db=store)
    async with socket_client(d.socket_path) as raw:
        await add(raw, "uses pnpm")
    stop_promptly(d)
    other = json.dumps({"store": "/elsewhere/memory.db", "n": 1, "hash": "a" * 64, "ts": 1, "event": "stop"}).encode()
    filler = (other + b"\n") * (HEADS_TAIL_BYTES // len(other) + 2)
    forged, trusted = forged_stop(store)
    size = write(heads, forged + filler if where == "before-the-tail" else filler + forged)
    again = await anyio.to_thread.run_sync(lambda: daemon_factory(db=store, name="again"))
    async with socket_client(again.socket_path) as raw:
        await add(raw, "uses uv")
        assert (await raw.ok("audit/verify"))["ok"] is True
    stop_promptly(again)
    log = again.stderr()
    read = f"the heads file {heads} holds {size} bytes: the start reads its last {HEADS_TAIL_BYTES} only"
    assert log.count(read) == 1
    if where == "before-the-tail":
        assert trusted not in log
        assert log.count(f"no head of this store in the last {HEADS_TAIL_BYTES} bytes of the heads file {heads}: the "
                         "start checks the store without a stop head") == 1
    else:
        assert trusted in log
        assert "no head of this store" not in log


def test_the_tail_holds_whole_lines_only(tmp_path: Path) -> None:
    """The tail starts at a line: one cut inside a line drops that line's piece, one at a
    line's start keeps it."""
    path = tmp_path / "heads"
    path.write_bytes(b"a\nbb\nccc\n")
    path.chmod(0o600)
    got = {limit: read_heads_tail(path, limit) for limit in range(1, 11)}
    assert got == {1: (b"", 9), 2: (b"", 9), 3: (b"", 9), 4: (b"ccc\n", 9), 5: (b"ccc\n", 9), 6: (b"ccc\n", 9),
                   7: (b"bb\nccc\n", 9), 8: (b"bb\nccc\n", 9), 9: (b"a\nbb\nccc\n", 9), 10: (b"a\nbb\nccc\n", 9)}
