"""Helpers shared by the end-to-end suites."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
from memoryd_protocol.ledger import chain_hash
from rawclient import Raw, write_ctx


def entry_input(text: str, track: str = "user", scope: str = "user-global", **extra: Any) -> dict[str, Any]:
    return {"track": track, "scope": scope, "text": text, **extra}


async def add(raw: Raw, text: str, track: str = "user", scope: str = "user-global", session: str = "s-1",
              **extra: Any) -> dict[str, Any]:
    return await raw.ok("memory/add", {"input": entry_input(text, track, scope, **extra), "write": write_ctx(session)})


async def state(raw: Raw) -> tuple[Any, Any, int]:
    """Everything an error must leave unchanged: entries, budgets, ledger length."""
    entries = await raw.ok("memory/list", {})
    budgets = await raw.ok("memory/budgets", {})
    audit = await raw.ok("audit/list", {"limit": 10000})
    writes = [a for a in audit if a["action"] != "recalled"]
    return entries, budgets, len(writes)


class Gate:
    """An approval handler that records each ask and leaves it open (the test decides)."""

    def __init__(self) -> None:
        self.asked: list[dict[str, Any]] = []
        self.arrived = anyio.Event()

    async def __call__(self, params: dict[str, Any]) -> None:
        self.asked.append(params)
        self.arrived.set()
        return None


def start_held(tg: Any, raw: Any, method: str, params: dict[str, Any]) -> dict[str, Any]:
    """Send ``method`` in the background; its raw reply lands in the returned box["r"]."""
    box: dict[str, Any] = {}

    async def send() -> None:
        box["r"] = await raw.call(method, params)

    tg.start_soon(send)
    return box


async def arrived(gate: Gate) -> None:
    """Wait (bounded) until ``gate`` has been asked."""
    with anyio.fail_after(10):
        await gate.arrived.wait()


def unaccepted(n: int, note: str) -> dict[str, Any]:
    """audit/verify's problem for the foreign row ``n`` that nobody accepted yet."""
    return {"n": n, "reason": f"ledger row {n} records a change another program made to the store, not accepted "
                              f"yet: {note}. Check it, then run memoryctl audit accept {n}"}


def sql(db: Path, statement: str, *args: Any) -> list[tuple[Any, ...]]:
    """One statement on the store file itself, as another program would run it, committed."""
    conn = sqlite3.connect(db)
    try:
        with conn:
            return conn.execute(statement, args).fetchall()
    finally:
        conn.close()


def rechain(conn: sqlite3.Connection, old: str, new: str) -> None:
    """A forger's full rehash: every ledger row's body with ``old`` replaced by ``new``, and
    the whole chain recomputed over it, in ``conn``'s open transaction."""
    prev = ""
    for n, ts, kind, ref, seq, body in conn.execute(
            "SELECT n, ts, kind, ref, audit_seq, body FROM memoryd_ledger ORDER BY n").fetchall():
        body = body.replace(old, new)
        h = chain_hash(prev, n, ts, kind, ref, seq, body)
        conn.execute("UPDATE memoryd_ledger SET body = ?, prev = ?, hash = ? WHERE n = ?", (body, prev, h, n))
        prev = h


def stop_promptly(d: Any) -> None:
    """SIGTERM, and the daemon's exit (status 0) within the drain's bound."""
    d.proc.terminate()
    assert d.proc.wait(timeout=10) == 0


def tip(db: Path) -> tuple[int, str]:
    """The ledger's newest row: its n and hash."""
    [(n, h)] = sql(db, "SELECT n, hash FROM memoryd_ledger ORDER BY n DESC LIMIT 1")
    return int(n), str(h)


def memoryctl(*args: str) -> subprocess.CompletedProcess[str]:
    """memoryctl as a user runs it: its own process and session, no terminal."""
    return subprocess.run([sys.executable, "-m", "memoryd_client", *args], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL, start_new_session=True)
