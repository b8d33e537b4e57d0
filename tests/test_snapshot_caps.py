"""max_snapshots: the frozen snapshots a store holds (sessions, each naming its text by
digest), against a real daemon. A new session's first snapshot beyond it is INVALID_INPUT
naming the key and writes nothing (no snapshot, no audit or ledger row, no event), even when
its text is stored already; sessions frozen already go on being served, the ledger still
verifies, and the count is the store's, not one daemon run's. (max_snapshot_bytes, the
bytes of the distinct texts: test_snapshot_shared.py.)"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import anyio
import pytest
from e2e_helpers import add, state
from rawclient import socket_client
from test_snapshot_shared import dump

pytestmark = pytest.mark.anyio

REFUSED = ("the store already holds {n} frozen snapshots (max_snapshots); reuse the id of a session that has one, "
           "free room with memoryctl snapshots prune (the snapshots of sessions that ended), or raise max_snapshots in "
           "the daemon's config")


def capped(daemon_factory: Any, tmp_path: Path, n: int, name: str = "d", db: Path | None = None) -> Any:
    cfg = tmp_path / f"{name}.toml"
    cfg.write_text(f"max_snapshots = {n}\n")
    return daemon_factory("--config", str(cfg), name=name, db=db)


def frozen(db: Path) -> list[str]:
    """The sessions the store holds a frozen snapshot of (read beside the daemon)."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as ro:
        return [sid for (sid,) in ro.execute("SELECT session_id FROM memoryd_snapshots ORDER BY session_id")]


async def everything(raw: Any, db: Path) -> tuple[Any, ...]:
    """What a refused snapshot must leave as it was: entries, budgets, audit rows, the
    ledger's length and head, the frozen snapshots, and every row of the store."""
    report = await raw.ok("audit/verify", {})
    assert report["ok"] is True and report["problems"] == []
    return (*await state(raw), report["rows"], report["head"], frozen(db), dump(db))


async def test_a_first_snapshot_beyond_max_snapshots_is_refused_and_writes_nothing(daemon_factory: Any,
                                                                                  tmp_path: Path) -> None:
    d = capped(daemon_factory, tmp_path, 3)
    async with socket_client(d.socket_path) as raw:
        await add(raw, "Prefers tabs")
        texts = {sid: (await raw.ok("memory/snapshot", {"session": {"id": sid}}))["text"]
                 for sid in ("s-a", "s-b", "s-c")}
        assert len(set(texts.values())) == 1  # one stored text: the count is of sessions, not texts
        before = await everything(raw, d.db_path)
        events = len(raw.notifications)
        for _ in range(2):  # (refused before rendering: the daemon knows the count by now)
            err = await raw.fail("memory/snapshot", {"session": {"id": "s-d"}})
            assert (err.code, err.details) == ("INVALID_INPUT", {"field": "session.id"})
            assert err.error["message"] == REFUSED.format(n=3)
        assert await everything(raw, d.db_path) == before
        assert len(raw.notifications) == events  # no memory/snapshot event either
        # the sessions frozen already are served as before, byte for byte
        for sid, text in texts.items():
            assert (await raw.ok("memory/snapshot", {"session": {"id": sid}}))["text"] == text
        assert await everything(raw, d.db_path) == before
        # writes and queries are not snapshots: they go on
        await add(raw, "Uses pnpm")
        assert (await raw.ok("memory/query", {"opts": {"sessionId": "s-e"}}))["total"] == 2


async def test_the_count_is_the_stores_across_restarts(daemon_factory: Any, tmp_path: Path) -> None:
    """A daemon started on a full store refuses at once; one with a higher cap takes more."""
    db = tmp_path / "m.db"
    first = capped(daemon_factory, tmp_path, 2, name="a", db=db)
    async with socket_client(first.socket_path) as raw:
        for sid in ("s-a", "s-b"):
            await raw.ok("memory/snapshot", {"session": {"id": sid}})
    assert first.stop() == 0
    again = capped(daemon_factory, tmp_path, 2, name="b", db=db)
    async with socket_client(again.socket_path) as raw:
        before = await everything(raw, db)
        err = await raw.fail("memory/snapshot", {"session": {"id": "s-c"}})
        assert err.error["message"] == REFUSED.format(n=2)
        assert await everything(raw, db) == before
    assert again.stop() == 0
    raised = capped(daemon_factory, tmp_path, 3, name="c", db=db)
    async with socket_client(raised.socket_path) as raw:
        await raw.ok("memory/snapshot", {"session": {"id": "s-c"}})
        err = await raw.fail("memory/snapshot", {"session": {"id": "s-d"}})
        assert err.error["message"] == REFUSED.format(n=3)
        report = await raw.ok("audit/verify", {})
        assert report["ok"] is True and report["problems"] == []
    assert frozen(db) == ["s-a", "s-b", "s-c"]


async def test_two_sessions_racing_for_the_last_snapshot_get_one(daemon_factory: Any, tmp_path: Path) -> None:
    """The cap is checked where the snapshot is frozen: of two first snapshots in flight at
    once for the one place left, exactly one is taken."""
    d = capped(daemon_factory, tmp_path, 2)
    async with socket_client(d.socket_path) as one, socket_client(d.socket_path) as other:
        await one.ok("memory/snapshot", {"session": {"id": "s-0"}})
        replies: dict[str, dict[str, Any]] = {}

        async def take(raw: Any, sid: str) -> None:
            replies[sid] = await raw.call("memory/snapshot", {"session": {"id": sid}})

        async with anyio.create_task_group() as tg:
            tg.start_soon(take, one, "s-1")
            tg.start_soon(take, other, "s-2")
        taken = sorted(sid for sid, r in replies.items() if "result" in r)
        refused = [r["error"]["message"] for r in replies.values() if "error" in r]
        assert len(taken) == 1 and refused == [REFUSED.format(n=2)]
        assert frozen(d.db_path) == ["s-0", *taken]
        report = await one.ok("audit/verify", {})
        assert report["ok"] is True and report["problems"] == []
