"""Policy that only tightens, on every write path, against real daemons.

A write's policy is its layer's (the ``track/scope`` override, else ``write_policy``), made
stricter by the ``source:`` override of every source it touches, never looser. The two
bypasses this closes: consolidate took the default source's policy instead of its removed
entries', and a client-chosen source label opened a layer whose policy is stricter.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import add, entry_input, state
from memoryd_protocol.constants import EXPORT_PLUGIN, EXPORT_SCHEMA
from rawclient import Raw, RpcFailure, socket_client, write_ctx

pytestmark = [pytest.mark.anyio, pytest.mark.inprocess]

SESSION = {"id": "s-1", "header": {"cwd": "/home/u/proj", "agentPreset": "coder"}}
LAYER = {"track": "user", "scope": "user-global"}

#: A write path: (method, params) built from the source its touched entries carry.
WritePath = Callable[[Raw, str], Awaitable[tuple[str, dict[str, Any]]]]


def envelope(*entries: dict[str, Any]) -> dict[str, Any]:
    return {"plugin": EXPORT_PLUGIN, "schema": EXPORT_SCHEMA, "entries": list(entries)}


async def p_add(raw: Raw, source: str) -> tuple[str, dict[str, Any]]:
    return "memory/add", {"input": entry_input("new text", source=source), "write": write_ctx()}


async def p_replace(raw: Raw, source: str) -> tuple[str, dict[str, Any]]:
    return "memory/replace", {"input": {**LAYER, "match": f"{source} one", "text": "replaced"}, "write": write_ctx()}


async def p_remove(raw: Raw, source: str) -> tuple[str, dict[str, Any]]:
    return "memory/remove", {"input": {**LAYER, "match": f"{source} one"}, "write": write_ctx()}


async def p_consolidate(raw: Raw, source: str) -> tuple[str, dict[str, Any]]:
    # one entry of the tested source and one of the default source; the new text is the default's
    return "memory/consolidate", {"input": {**LAYER, "matches": [f"{source} one", "plain one"], "text": "merged"},
                                  "write": write_ctx()}


# A batch spans two layers, every entry with the tested source.
async def p_seed(raw: Raw, source: str) -> tuple[str, dict[str, Any]]:
    return "memory/seed", {"inputs": [entry_input("seeded", "agent", "user-global", source=source),
                                      entry_input("seeded", source=source)], "write": write_ctx()}


async def p_import(raw: Raw, source: str) -> tuple[str, dict[str, Any]]:
    return "memory/import", {"envelope": envelope({"track": "agent", "scope": "user-global", "text": "imported",
                                                   "source": source},
                                                  {**LAYER, "text": "imported", "source": source}),
                             "write": write_ctx()}


async def p_proposal(raw: Raw, source: str) -> tuple[str, dict[str, Any]]:
    # an approved proposal's entry has source "proposal", whatever the proposer labelled it
    p = await raw.ok("proposals/create", {"input": {"kind": "compaction", **LAYER, "text": "proposed",
                                                    "source": source}, "session": SESSION})
    return "proposals/approve", {"id": p["id"], "write": write_ctx()}


PATHS: dict[str, tuple[WritePath, str]] = {
    "add": (p_add, "add"),
    "replace": (p_replace, "replace"),
    "remove": (p_remove, "remove"),
    "consolidate": (p_consolidate, "consolidate"),
    "seed": (p_seed, "seed"),
    "import": (p_import, "seed"),
    "proposals/approve": (p_proposal, "add"),
}


async def populated(daemon_factory: Any, source: str) -> Path:
    """A store holding "<source> one" (source ``source``) and "plain one" (the default
    source) in user/user-global, written by a daemon under ``auto`` that is then stopped."""
    d = daemon_factory(name="populate")
    async with socket_client(d.socket_path) as raw:
        await add(raw, f"{source} one", source=source)
        await add(raw, "plain one")
    assert d.stop() == 0
    return Path(d.db_path)


def strict_daemon(daemon_factory: Any, tmp_path: Path, db: Path, toml: str) -> Any:
    cfg = tmp_path / "policy.toml"
    cfg.write_text(toml)
    return daemon_factory("--config", str(cfg), policy=None, db=db, name="strict")


async def denied(raw: Raw, path: str, source: str, action: str, label: str) -> None:
    """Run ``path`` and check it is denied with ``label``, leaving the store as it was but
    for its one ``<action>-denied`` row."""
    build, _ = PATHS[path]
    method, params = await build(raw, source)
    proposals = await raw.ok("proposals/list", {})
    entries, budgets, rows = await state(raw)
    with pytest.raises(RpcFailure) as info:
        await raw.ok(method, params)
    err = info.value
    assert err.code == "WRITE_DENIED" and err.details == {"outcome": label.split(" ")[0]}
    assert await state(raw) == (entries, budgets, rows + 1)
    assert await raw.ok("proposals/list", {}) == proposals
    row = (await raw.ok("audit/list", {"limit": 1}))[0]
    assert row["action"] == f"{action}-denied"
    assert row["outcome"] == label


# --- a source label never loosens a stricter layer -----------------------------------

LOOSENING = """write_policy = "ask"
[write_policies]
"user/user-global" = "off"
"source:ci-bot" = "auto"
"source:proposal" = "auto"
"""


@pytest.mark.parametrize("path", list(PATHS))
async def test_a_source_label_does_not_open_an_off_layer(daemon_factory: Any, tmp_path: Path, path: str) -> None:
    d = strict_daemon(daemon_factory, tmp_path, await populated(daemon_factory, "ci-bot"), LOOSENING)
    async with socket_client(d.socket_path, approvals=False) as raw:
        await denied(raw, path, "ci-bot", PATHS[path][1], "rejected (via approval, writePolicy off)")
        assert not [n for n in raw.notifications if n["method"] == "approval/asked"]


async def test_a_source_label_does_not_loosen_the_default(daemon_factory: Any, tmp_path: Path) -> None:
    d = strict_daemon(daemon_factory, tmp_path, await populated(daemon_factory, "ci-bot"), LOOSENING)
    async with socket_client(d.socket_path, approvals=False) as raw:
        # agent/workspace has no override: the default "ask" holds against "source:ci-bot" = "auto"
        entries, budgets, rows = await state(raw)
        err = await raw.fail("memory/add", {"input": entry_input("x", "agent", "workspace", source="ci-bot"),
                                            "write": write_ctx()})
        assert err.code == "WRITE_DENIED" and err.details == {"outcome": "unavailable"}
        assert await state(raw) == (entries, budgets, rows + 1)
        row = (await raw.ok("audit/list", {"limit": 1}))[0]
        assert row["action"] == "add-denied" and row["outcome"] == "unavailable (via approval, writePolicy ask)"


# --- every source a write touches can tighten it -------------------------------------

TIGHTENING = """write_policy = "auto"
[write_policies]
"source:claude" = "{policy}"
"source:proposal" = "{policy}"
"""


@pytest.mark.parametrize(("policy", "label"), [("ask", "unavailable (via approval, writePolicy ask)"),
                                               ("off", "rejected (via approval, writePolicy off)")])
@pytest.mark.parametrize("path", list(PATHS))
async def test_a_touched_source_tightens_an_auto_layer(daemon_factory: Any, tmp_path: Path, path: str, policy: str,
                                                       label: str) -> None:
    """A headless tool (no approvals, no approver) under ``auto``: a write touching a
    ``source:claude`` entry is held to that source's policy, consolidate included."""
    d = strict_daemon(daemon_factory, tmp_path, await populated(daemon_factory, "claude"), TIGHTENING.format(policy=policy))
    async with socket_client(d.socket_path, approvals=False) as raw:
        await denied(raw, path, "claude", PATHS[path][1], label)


async def test_consolidate_cannot_remove_what_remove_may_not(daemon_factory: Any, tmp_path: Path) -> None:
    """The reported bypass: denied ``remove`` of a ``source:claude`` entry, the same tool
    deleted it through ``consolidate`` under ``writePolicy auto``."""
    d = strict_daemon(daemon_factory, tmp_path, await populated(daemon_factory, "claude"),
                      TIGHTENING.format(policy="ask"))
    async with socket_client(d.socket_path, approvals=False) as raw:
        label = "unavailable (via approval, writePolicy ask)"
        await denied(raw, "remove", "claude", "remove", label)
        await denied(raw, "consolidate", "claude", "consolidate", label)
        assert sorted(e["text"] for e in await raw.ok("memory/list", {})) == ["claude one", "plain one"]
        # entries of untightened sources still consolidate under auto
        await add(raw, "plain two")
        res = await raw.ok("memory/consolidate", {"input": {**LAYER, "matches": ["plain one", "plain two"],
                                                            "text": "plain merged"}, "write": write_ctx()})
        assert [r["text"] for r in res["removed"]] == ["plain one", "plain two"]
        row = (await raw.ok("audit/list", {"limit": 1}))[0]
        assert row["action"] == "consolidate-add" and row["outcome"] == "allowed-once (via approval, writePolicy auto)"


# --- a layer override still loosens the default --------------------------------------

LAYER_AUTO = """write_policy = "off"
[write_policies]
"user/user-global" = "auto"
"agent/user-global" = "auto"
"source:ci-bot" = "auto"
"""

ACTIONS_ALLOWED = {
    "add": ["add"],
    "replace": ["replace"],
    "remove": ["remove"],
    "consolidate": ["consolidate-remove", "consolidate-remove", "consolidate-add"],
    "seed": ["seed", "add", "add"],
    "import": ["seed", "add", "add"],
    "proposals/approve": ["add"],
}


@pytest.mark.parametrize("path", list(PATHS))
async def test_a_layer_override_loosens_the_default(daemon_factory: Any, tmp_path: Path, path: str) -> None:
    """``"user/user-global" = "auto"`` (and ``"agent/user-global"``, the batches' other layer)
    under ``write_policy = "off"``: every path writes, and its ledger rows show the
    effective policy, not the default."""
    d = strict_daemon(daemon_factory, tmp_path, await populated(daemon_factory, "ci-bot"), LAYER_AUTO)
    async with socket_client(d.socket_path, approvals=False) as raw:
        build, _ = PATHS[path]
        method, params = await build(raw, "ci-bot")
        before = len(await raw.ok("audit/list", {"limit": 1000}))
        await raw.ok(method, params)
        rows = await raw.ok("audit/list", {"limit": 1000})
        new = rows[: len(rows) - before]
        assert sorted(r["action"] for r in new) == sorted(ACTIONS_ALLOWED[path])
        assert {r["outcome"] for r in new} == {"allowed-once (via approval, writePolicy auto)"}
        assert not [n for n in raw.notifications if n["method"] == "approval/asked"]
