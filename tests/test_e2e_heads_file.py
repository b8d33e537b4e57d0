"""The heads file replaced by a hostile process of the user's, against real daemons: a FIFO
(which would block whoever opens it), a symbolic link and a hard link (which would send the
heads into another file), a file of another uid's. The daemon refuses each, says so once in
its log, keeps serving and stops on SIGTERM; at start it neither blocks on it nor trusts
the stop head it holds; memoryctl refuses to read it."""

from __future__ import annotations

import json
import os
import select
import stat
from pathlib import Path
from typing import Any

import anyio
import pytest
from e2e_helpers import add, memoryctl, stop_promptly, tip
from rawclient import socket_client

pytestmark = [pytest.mark.anyio, pytest.mark.process]

#: a uid that is not the test's
OTHER_UID = 54321
PLANTS = ("fifo", "symlink", "hard-link", "other-uid")
NEXT_STEP = "remove it, and memoryd writes a new one at its next head"


@pytest.fixture
def heads(tmp_path: Path) -> Path:
    """The heads file of the store daemon_factory opens by default (``d.db``, not the
    default store): beside it, in this test's own directory."""
    return tmp_path / "d.db.memoryd-heads"


@pytest.fixture
def every_row(tmp_path: Path) -> Path:
    """A config witnessing the head after every write: each one opens the heads file again."""
    cfg = tmp_path / "every-row.toml"
    cfg.write_text("heads_every_rows = 1\n")
    return cfg


def plant(kind: str, heads: Path, decoy: Path) -> str:
    """Replace ``heads`` with ``kind``; what the refusal says it found. ``decoy`` is a file of
    the test's that a followed link would write to."""
    if kind == "other-uid" and os.geteuid() != 0:
        pytest.skip("planting another uid's file needs root")
    heads.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    heads.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(heads, 0o600)
        return "is a FIFO"
    if kind == "symlink":
        heads.symlink_to(decoy)
        return "is a symbolic link"
    if kind == "hard-link":
        os.link(decoy, heads)
        return "has 2 links"
    heads.write_bytes(decoy.read_bytes())
    os.chown(heads, OTHER_UID, OTHER_UID)
    return f"is owned by uid {OTHER_UID}"


def planted(kind: str, heads: Path, decoy: Path, decoy_bytes: bytes) -> None:
    """What was planted is still there as planted, and nothing was written through it."""
    st = os.lstat(heads)
    assert {"fifo": stat.S_ISFIFO, "symlink": stat.S_ISLNK}.get(kind, stat.S_ISREG)(st.st_mode)
    if kind == "symlink":
        assert os.readlink(heads) == str(decoy)
    if kind == "other-uid":
        assert (st.st_uid, heads.read_bytes()) == (OTHER_UID, decoy_bytes)
    assert decoy.read_bytes() == decoy_bytes


def copy(heads: Path, decoy: Path) -> Path:
    """A copy of the heads file (there: the daemon's start witnessed its head)."""
    decoy.write_bytes(heads.read_bytes())
    return decoy


@pytest.mark.parametrize("kind", PLANTS)
async def test_a_heads_file_replaced_while_running_is_refused_and_the_daemon_serves_on(
        kind: str, heads: Path, every_row: Path, daemon_factory: Any, tmp_path: Path) -> None:
    d = daemon_factory("--config", str(every_row))
    decoy = copy(heads, tmp_path / "decoy")  # the start's head went there
    decoy_bytes = decoy.read_bytes()
    found = plant(kind, heads, decoy)
    with anyio.fail_after(15):
        async with socket_client(d.socket_path) as raw:
            for text in ("uses pnpm", "uses uv", "tabs"):
                await add(raw, text)
        async with socket_client(d.socket_path) as other:
            assert len(await other.ok("memory/list", {})) == 3
            assert (await other.ok("audit/verify"))["ok"] is True
    stop_promptly(d)
    planted(kind, heads, decoy, decoy_bytes)
    log = d.stderr()
    assert log.count(f"the heads file {heads} {found}: ") == 1
    assert NEXT_STEP in log
    # the log still witnesses every head, the stop's included
    n, h = tip(d.db_path)
    assert f"ledger head at stop: row {n} hash {h}" in log


def witnessed_in(heads: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in heads.read_text().splitlines()]


def hung_up(reader: int) -> None:
    """Wait until a writer has opened the FIFO ``reader`` reads and closed it again."""
    poll = select.poll()
    poll.register(reader, select.POLLHUP)
    assert poll.poll(10_000) == [(reader, select.POLLHUP)]


async def test_once_the_fifo_is_gone_the_heads_go_to_a_new_heads_file(heads: Path, every_row: Path,
                                                                      daemon_factory: Any) -> None:
    """Refused while a FIFO is there, even one with a reader (which a blocking open would
    have written the head into); once it is removed, the next head creates the file again."""
    d = daemon_factory("--config", str(every_row))
    os.unlink(heads)
    os.mkfifo(heads, 0o600)
    reader = os.open(heads, os.O_RDONLY | os.O_NONBLOCK)
    try:
        with anyio.fail_after(15):
            async with socket_client(d.socket_path) as raw:
                await add(raw, "uses pnpm")
                await anyio.to_thread.run_sync(hung_up, reader)  # the daemon opened it, and let go
                assert os.read(reader, 4096) == b""
                os.unlink(heads)
                await add(raw, "uses uv")
    finally:
        os.close(reader)
    stop_promptly(d)
    witnessed = witnessed_in(heads)
    assert [h["event"] for h in witnessed] == ["every", "stop"]
    assert (witnessed[-1]["n"], witnessed[-1]["hash"]) == tip(d.db_path)
    log = d.stderr()
    assert log.count(f"the heads file {heads} is a FIFO: ") == 1
    assert log.count(f"the heads file {heads} is a regular file of memoryd's user again: the ledger heads are "
                     "witnessed there again") == 1


@pytest.mark.parametrize("kind", PLANTS)
async def test_a_heads_file_planted_before_the_start_is_refused_and_its_stop_head_not_trusted(
        kind: str, heads: Path, every_row: Path, daemon_factory: Any, tmp_path: Path) -> None:
    d = daemon_factory("--config", str(every_row))
    async with socket_client(d.socket_path) as raw:
        await add(raw, "uses pnpm")
    stop_promptly(d)
    # a stop head that the store does not hold: trusted, it would be reported as a truncation
    n, _ = tip(d.db_path)
    forged = {"store": str(d.db_path.resolve()), "n": n + 50, "hash": "0" * 64, "ts": 1, "event": "stop"}
    decoy = tmp_path / "decoy"
    decoy_bytes = json.dumps(forged).encode() + b"\n"
    decoy.write_bytes(decoy_bytes)
    found = plant(kind, heads, decoy)
    with anyio.fail_after(15):
        again = await anyio.to_thread.run_sync(lambda: daemon_factory("--config", str(every_row), db=d.db_path,
                                                                      name="again"))
        async with socket_client(again.socket_path) as raw:
            await add(raw, "uses uv")
            assert (await raw.ok("audit/verify"))["ok"] is True
    stop_promptly(again)
    planted(kind, heads, decoy, decoy_bytes)
    log = again.stderr()
    assert log.count(f"the heads file {heads} {found}: ") == 1
    assert "the start trusts no stop head from it" in log
    assert "the head the heads file witnessed at memoryd's last stop" not in log
    n, h = tip(d.db_path)
    assert f"ledger head at stop: row {n} hash {h}" in log



@pytest.mark.parametrize("kind", PLANTS)
async def test_memoryctl_refuses_a_planted_heads_file(kind: str, heads: Path, daemon_factory: Any,
                                                      tmp_path: Path) -> None:
    """``memoryctl audit heads`` reads the daemon's heads file: a FIFO there must not hang
    it, nor a link lead it to another file."""
    d = daemon_factory()
    decoy = copy(heads, tmp_path / "decoy")
    decoy_bytes = decoy.read_bytes()
    found = plant(kind, heads, decoy)
    r = await anyio.to_thread.run_sync(lambda: memoryctl("--socket", str(d.socket_path), "audit", "heads"))
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == f"error: USAGE: the heads file {heads} {found}: memoryd keeps ledger heads only in a regular " \
                       f"file with one link that its own user owns; {NEXT_STEP}\n"
    planted(kind, heads, decoy, decoy_bytes)
