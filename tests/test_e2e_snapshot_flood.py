"""Frozen snapshots as a denial of service, against real daemons: a flood of fresh session
ids is capped per connection and per process (another connection, another process, is
still served), and the snapshots of sessions that ended can be pruned live, by a person,
so that a full store never needs a restart; the ledger records each prune, and
``audit verify`` (live and ``--db``) accepts a pruned snapshot as pruned, not as missing."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import add
from rawclient import socket_client
from test_e2e_limits import rss_kib
from test_snapshot_caps import everything, frozen
from test_snapshot_shared import dump, offline_verify, rows, session

pytestmark = pytest.mark.anyio

PER_CONNECTION = ("this connection already took {n} new sessions' first snapshots "
                  "(max_new_snapshots_per_connection); reuse one of their ids, open another connection, or raise "
                  "max_new_snapshots_per_connection in the daemon's config")
PER_PROCESS = ("this process already took {n} new sessions' first snapshots in the last minute "
               "(max_new_snapshots_per_minute); retry in a minute, reuse the id of a session that has one, or raise "
               "max_new_snapshots_per_minute in the daemon's config")
FULL = ("the store already holds {n} frozen snapshots (max_snapshots); reuse the id of a session that has one, free "
        "room with memoryctl snapshots prune (the snapshots of sessions that ended), or raise max_snapshots in the "
        "daemon's config")


def configured(daemon_factory: Any, tmp_path: Path, text: str, name: str = "d") -> Any:
    cfg = tmp_path / f"{name}.toml"
    cfg.write_text(text)
    return daemon_factory("--config", str(cfg), name=name)


def other_process_snapshot(d: Any, sid: str) -> dict[str, Any]:
    """``memory/snapshot`` for ``sid`` from a process other than the test's (memoryctl rpc)."""
    line = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "memory/snapshot", "params": {"session": session(sid)}})
    r = subprocess.run([sys.executable, "-m", "memoryd_client", "--socket", str(d.socket_path), "--no-autostart",
                        "rpc"], input=line + "\n", capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    [reply] = [m for m in map(json.loads, r.stdout.splitlines()) if m.get("id") == 1]
    return reply  # type: ignore[no-any-return]


async def test_one_connections_flood_of_new_sessions_is_capped_and_another_connection_is_served(
        daemon_factory: Any, tmp_path: Path) -> None:
    d = configured(daemon_factory, tmp_path, "max_new_snapshots_per_connection = 3\n")
    async with socket_client(d.socket_path) as flood, socket_client(d.socket_path) as other:
        await add(other, "Prefers tabs")
        for n in range(3):
            await flood.ok("memory/snapshot", {"session": session(f"f-{n}")})
        before = await everything(other, d.db_path)
        events = len(flood.notifications)
        for sid in ("f-3", "f-4"):
            err = await flood.fail("memory/snapshot", {"session": session(sid)})
            assert (err.code, err.details) == ("INVALID_INPUT", {"field": "session.id"})
            assert err.error["message"] == PER_CONNECTION.format(n=3)
        assert await everything(other, d.db_path) == before  # nothing written for a refusal
        assert len(flood.notifications) == events
        # the sessions it froze are still served to it; another connection takes its own
        assert "Prefers tabs" in (await flood.ok("memory/snapshot", {"session": session("f-0")}))["text"]
        assert "Prefers tabs" in (await other.ok("memory/snapshot", {"session": session("o-1")}))["text"]
    assert frozen(d.db_path) == ["f-0", "f-1", "f-2", "o-1"]


async def test_one_processs_new_sessions_are_capped_per_minute_and_another_process_is_served(
        daemon_factory: Any, tmp_path: Path) -> None:
    """Connections of one process share its count; a new connection does not reset it."""
    d = configured(daemon_factory, tmp_path, "max_new_snapshots_per_minute = 3\n")
    async with socket_client(d.socket_path) as one, socket_client(d.socket_path) as two:
        await add(one, "Prefers tabs")
        await one.ok("memory/snapshot", {"session": session("p-0")})
        await one.ok("memory/snapshot", {"session": session("p-1")})
        await two.ok("memory/snapshot", {"session": session("p-2")})
        before = await everything(one, d.db_path)
        async with socket_client(d.socket_path) as three:
            for raw, sid in ((one, "p-3"), (two, "p-4"), (three, "p-5")):
                err = await raw.fail("memory/snapshot", {"session": session(sid)})
                assert (err.code, err.details) == ("INVALID_INPUT", {"field": "session.id"})
                assert err.error["message"] == PER_PROCESS.format(n=3)
        assert await everything(one, d.db_path) == before
        reply = other_process_snapshot(d, "q-1")
        assert "Prefers tabs" in reply["result"]["text"]
    assert frozen(d.db_path) == ["p-0", "p-1", "p-2", "q-1"]


async def test_prune_frees_room_live_and_the_ledger_still_verifies(daemon_factory: Any, tmp_path: Path) -> None:
    """A full store takes new sessions again once the snapshots of sessions that ended are
    pruned, with no restart; sessions an open connection holds are kept; the prune is a
    ledger row; verify holds live and offline, and a pruned session named again freezes a
    new snapshot of its own."""
    d = configured(daemon_factory, tmp_path, 'max_snapshots = 3\napprovers = "any"\n')
    async with socket_client(d.socket_path) as ended:
        await add(ended, "Prefers tabs")
        for sid in ("e-1", "e-2"):
            await ended.ok("memory/snapshot", {"session": session(sid)})
    async with socket_client(d.socket_path) as live, socket_client(d.socket_path) as admin:
        first = (await live.ok("memory/snapshot", {"session": session("l-1")}))["text"]
        err = await live.fail("memory/snapshot", {"session": session("l-2")})
        assert err.error["message"] == FULL.format(n=3)
        pruned = await admin.ok("snapshots/prune", {})
        [(n, body, last)] = rows(d.db_path, "SELECT n, body, (SELECT max(n) FROM memoryd_ledger) FROM memoryd_ledger "
                                            "WHERE kind = 'pruned'")
        assert pruned == {"sessions": 2, "texts": 0, "bytes": 0, "rows": [n]}  # the text l-1 names stays
        assert n == last
        assert frozen(d.db_path) == ["l-1"]
        assert json.loads(body)["sessions"] == ["e-1", "e-2"]
        assert json.loads(body)["before"] is None
        # room again, live
        await live.ok("memory/snapshot", {"session": session("l-2")})
        report = await admin.ok("audit/verify", {})
        assert report["ok"] is True and report["problems"] == []
        # a pruned session's id is a new session: its snapshot is frozen again, now
        await add(live, "Uses pnpm")
        again = (await live.ok("memory/snapshot", {"session": session("e-1")}))["text"]
        assert "Uses pnpm" in again
        report = await admin.ok("audit/verify", {})
        assert report["ok"] is True and report["problems"] == []
        # nothing left to prune while the connections hold their sessions
        again_head = report["rows"]
        assert await admin.ok("snapshots/prune", {}) == {"sessions": 0, "texts": 0, "bytes": 0, "rows": []}
        assert (await admin.ok("audit/verify", {}))["rows"] == again_head
    async with socket_client(d.socket_path) as admin:
        # now they ended: both texts go with the last sessions that named them
        pruned = await admin.ok("snapshots/prune", {})
        assert (pruned["sessions"], pruned["texts"]) == (3, 2)
        assert pruned["bytes"] == len(first.encode()) + len(again.encode())
        assert frozen(d.db_path) == []
        assert rows(d.db_path, "SELECT count(*) FROM memoryd_snapshot_texts") == [(0,)]
        report = await admin.ok("audit/verify", {})
        assert report["ok"] is True and report["problems"] == []
    assert d.stop() == 0
    code, report = offline_verify(d.db_path, tmp_path)
    assert (code, report["ok"], report["problems"]) == (0, True, [])


async def test_prune_before_keeps_the_snapshots_frozen_since(daemon_factory: Any, tmp_path: Path) -> None:
    d = configured(daemon_factory, tmp_path, 'approvers = "any"\n')
    async with socket_client(d.socket_path) as raw:
        await raw.ok("memory/snapshot", {"session": session("s-1")})
        await raw.ok("memory/snapshot", {"session": session("s-2")})
    [(first, last)] = rows(d.db_path, "SELECT min(created_at), max(created_at) FROM memoryd_snapshots")
    async with socket_client(d.socket_path) as admin:
        nothing = await admin.ok("snapshots/prune", {"before": first})  # frozen at or after it: kept
        assert nothing == {"sessions": 0, "texts": 0, "bytes": 0, "rows": []}
        assert frozen(d.db_path) == ["s-1", "s-2"]
        assert (await admin.ok("snapshots/prune", {"before": last + 1}))["sessions"] == 2
        assert frozen(d.db_path) == []
        assert (await admin.ok("audit/verify", {}))["ok"] is True


async def test_prune_is_a_persons_decision(daemon_factory: Any, tmp_path: Path) -> None:
    """Under the default approvers ("interactive") a process without a terminal may not
    prune: the texts are the record of what sessions were shown. Nothing changes."""
    d = daemon_factory()
    async with socket_client(d.socket_path) as raw:
        await add(raw, "Prefers tabs")
        await raw.ok("memory/snapshot", {"session": session("e-1")})
    async with socket_client(d.socket_path) as raw:
        before = dump(d.db_path)
        err = await raw.fail("snapshots/prune", {})
        assert err.code == "INVALID_INPUT"
        assert err.error["message"] == ("only a process with a controlling terminal can prune frozen snapshots; run "
                                        "memoryctl in a terminal")
        assert dump(d.db_path) == before


async def test_a_snapshot_deleted_without_a_prune_is_still_caught(daemon_factory: Any, tmp_path: Path) -> None:
    """Only a ``pruned`` row makes a missing snapshot pruned: one deleted beside memoryd is
    reported, live and offline, with the row that recorded it."""
    d = configured(daemon_factory, tmp_path, 'approvers = "any"\n')
    async with socket_client(d.socket_path) as raw:
        await raw.ok("memory/snapshot", {"session": session("kept")})
        await raw.ok("memory/snapshot", {"session": session("gone")})
    [(n, seq)] = rows(d.db_path, "SELECT n, audit_seq FROM memoryd_ledger WHERE kind = 'audit' AND body LIKE "
                                 "'%\"sessionId\":\"gone\"%'")
    with sqlite3.connect(d.db_path) as rw:
        rw.execute("DELETE FROM memoryd_snapshots WHERE session_id = 'gone'")
    want = [{"n": n, "seq": seq, "reason": "the frozen snapshot of session gone was deleted"}]
    async with socket_client(d.socket_path) as raw:
        report = await raw.ok("audit/verify", {})
        assert (report["ok"], report["problems"]) == (False, want)
    assert d.stop() == 0
    code, report = offline_verify(d.db_path, tmp_path)
    assert (code, report["problems"]) == (1, want)


async def test_a_full_prune_holds_its_journal_in_memory_no_larger_than_the_texts_cap(
        daemon_factory: Any, tmp_path: Path) -> None:
    """A prune is one job: the pages it frees are journaled in memory (temp_store) until it
    commits. Its peak is bounded by what max_snapshot_bytes lets the store hold."""
    cap = 8 * 1024 * 1024
    d = configured(daemon_factory, tmp_path, f'max_snapshot_bytes = {cap}\napprovers = "any"\n'
                                             "[budgets.user]\nuser_global = 10000000\n")
    async with socket_client(d.socket_path) as ended:
        k = held = 0
        while held < cap * 3 // 4:  # each session its own text, each text larger than the last
            await add(ended, f"fact {k}: " + "the quick brown fox jumps over the lazy dog " * 180)
            held += len((await ended.ok("memory/snapshot", {"session": session(f"e-{k}")}))["text"].encode())
            k += 1
    before = rss_kib(d.proc.pid, "VmHWM")
    async with socket_client(d.socket_path) as admin:
        pruned = await admin.ok("snapshots/prune", {})
        assert (pruned["sessions"], pruned["texts"], pruned["bytes"]) == (k, k, held)
        assert (rss_kib(d.proc.pid, "VmHWM") - before) * 1024 < cap, "a prune's journal must stay within the texts' cap"
        report = await admin.ok("audit/verify", {})
        assert report["ok"] is True and report["problems"] == []
