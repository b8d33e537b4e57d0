"""Snapshots, proposals, export/import and adapters end to end against the real daemon."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import anyio
import pytest
from e2e_helpers import add, entry_input, state
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from memoryd_protocol.constants import MEMORYD_SCHEMA_VERSION
from memoryd_protocol.ledger import snapshot_ref, text_hash
from rawclient import socket_client, write_ctx
from reference_text import HEADER_EN, HEADER_ZH, PROPOSALS_EN, PROPOSALS_ZH

pytestmark = [pytest.mark.anyio, pytest.mark.inprocess]

SESSION = {"id": "snap-1", "header": {"cwd": "/home/u/proj", "agentPreset": "coder"}}


def named(text: str) -> str:
    """How a snapshot audit row names its text: by digest (the text is stored once)."""
    return snapshot_ref(text_hash(text))



async def test_snapshot_text_frozen_and_audited(daemon: Any) -> None:
    async with socket_client(daemon.socket_path) as raw:
        assert (await raw.ok("memory/snapshot", {"session": {"id": "empty-1"}}))["text"] == ""
        await add(raw, "Prefers tabs")
        await add(raw, "uses pnpm", "agent", "workspace")
        await add(raw, "other workspace", "agent", "workspace", session="s-x")  # same cwd via write_ctx
        await raw.ok("memory/add", {"input": entry_input("not mine", "agent", "workspace"),
                                    "write": write_ctx("s-y", cwd="/elsewhere")})
        await raw.ok("memory/add", {"input": entry_input("another agent's", "agent", "user-global"),
                                    "write": write_ctx("s-z", agent="reviewer")})
        n = len(raw.notifications)
        text = (await raw.ok("memory/snapshot", {"session": SESSION}))["text"]
        assert text == (
            f"{HEADER_EN}\n\n"
            "## User profile (global preferences, communication style, landmines) — 12/2000 chars used\n"
            "- Prefers tabs\n\n"
            "## Workspace facts, conventions, and lessons — 32/4000 chars used\n"
            "- uses pnpm\n- other workspace"
        )
        note = await raw.notification("memory/snapshot", n)
        assert note["params"] == {"sessionId": "snap-1", "text": text}
        audit = await raw.ok("audit/list", {"limit": 1})
        assert audit[0]["action"] == "snapshot" and audit[0]["text"] == named(text) and audit[0]["sessionId"] == "snap-1"
        # frozen: later changes do not touch this session's block, and no second row is written
        await add(raw, "Prefers spaces too")
        assert (await raw.ok("memory/snapshot", {"session": SESSION}))["text"] == text
        assert (await raw.ok("audit/list", {"limit": 1}))[0]["action"] == "add"
        # the empty snapshot was frozen as well
        assert (await raw.ok("memory/snapshot", {"session": {"id": "empty-1"}}))["text"] == ""
        zh = (await raw.ok("memory/snapshot", {"session": {"id": "zh-1", "header": SESSION["header"]}, "language": "zh"}))["text"]
        assert zh == (
            f"{HEADER_ZH}\n\n"
            "## 用户画像（全局偏好、沟通风格、雷区） — 30/2000 已用字符\n"
            "- Prefers tabs\n- Prefers spaces too\n\n"
            "## 本工作区的事实、约定与教训 — 32/4000 已用字符\n"
            "- uses pnpm\n- other workspace"
        )
        err = await raw.fail("memory/snapshot", {"session": {"header": {}}})
        assert err.code == "INVALID_INPUT"


async def test_snapshot_survives_restart(daemon_factory: Any, tmp_path: Path) -> None:
    db = tmp_path / "snap.db"
    d = daemon_factory(db=db, name="s1")
    async with socket_client(d.socket_path) as raw:
        await add(raw, "Prefers tabs")
        first = (await raw.ok("memory/snapshot", {"session": SESSION}))["text"]
    assert d.stop() == 0
    d2 = daemon_factory(db=db, name="s2")
    async with socket_client(d2.socket_path) as raw:
        await add(raw, "a new fact after the restart")
        assert (await raw.ok("memory/snapshot", {"session": SESSION}))["text"] == first
        snaps = [a for a in await raw.ok("audit/list", {}) if a["action"] == "snapshot"]
        assert len(snaps) == 1 and snaps[0]["text"] == named(first)


def _session(session_id: str, cwd: str | None = None, agent: str | None = None) -> dict[str, Any]:
    header = {k: v for k, v in (("cwd", cwd), ("agentPreset", agent)) if v is not None}
    return {"id": session_id, "header": header}


def _lines(proposals: list[dict[str, Any]]) -> str:
    """The reference's proposal lines, ordered (createdAt, id) as it lists them."""
    ordered = sorted(proposals, key=lambda p: (p["createdAt"], p["id"]))
    return "\n".join(f"- [{p['id']}] {p['track']}/{p['scope']}: {p['text']}" for p in ordered)


async def test_snapshot_lists_the_sessions_visible_pending_proposals(daemon: Any) -> None:
    """After the entry sections: the reference's header, then `- [<id>] <track>/<scope>: <text>` for
    each pending proposal the session made and sees (with the entries' visibility); another
    session's proposal, approved by nobody yet, is never in it."""
    async with socket_client(daemon.socket_path) as raw:
        await add(raw, "Prefers tabs")  # agentKey coder: invisible to the reviewer below

        async def propose(session: dict[str, Any], track: str, scope: str, text: str) -> dict[str, Any]:
            p = await raw.ok("proposals/create", {"input": {"kind": "compaction", "track": track, "scope": scope,
                                                            "text": text}, "session": session})
            assert p is not None
            return p

        ws_coder = await propose(_session("o-1", "/home/u/proj", "coder"), "agent", "workspace", "build with make")
        shared = await propose(_session("o-2"), "user", "user-global", "likes tea")
        reviewer = await propose(_session("o-3", "/home/u/proj", "reviewer"), "user", "user-global", "terse reviews")
        await propose(_session("o-4", "/elsewhere", "coder"), "agent", "workspace", "elsewhere only")
        own = await propose(SESSION, "user", "user-global", "my own idea")
        n = len(raw.notifications)
        text = (await raw.ok("memory/snapshot", {"session": SESSION}))["text"]
        assert text == (
            f"{HEADER_EN}\n\n"
            "## User profile (global preferences, communication style, landmines) — 12/2000 chars used\n"
            "- Prefers tabs\n\n"
            f"{PROPOSALS_EN}\n{_lines([own])}"
        )
        assert (await raw.notification("memory/snapshot", n))["params"] == {"sessionId": "snap-1", "text": text}
        assert (await raw.ok("audit/list", {"limit": 1}))[0]["text"] == named(text)

        # no entry visible, its own proposal visible: the block is still rendered (en and zh);
        # the others' (shared, ws_coder) are not in it
        rev = (await raw.ok("memory/snapshot", {"session": _session("o-3", "/tmp/x", "reviewer")}))["text"]
        assert rev == f"{HEADER_EN}\n\n{PROPOSALS_EN}\n{_lines([reviewer])}"
        rev_zh = (await raw.ok("memory/snapshot", {"session": _session("o-2", "/tmp/x", "reviewer"),
                                                   "language": "zh"}))["text"]
        assert rev_zh == f"{HEADER_ZH}\n\n{PROPOSALS_ZH}\n{_lines([shared])}"
        # a session that made none sees none
        assert (await raw.ok("memory/snapshot", {"session": _session("rev-3", "/tmp/x", "reviewer")}))["text"] == ""

        # frozen: a proposal created (and one dismissed) after the first snapshot changes nothing
        late = await propose(_session("o-5"), "agent", "user-global", "late idea")
        await raw.ok("proposals/dismiss", {"id": ws_coder["id"]})
        assert (await raw.ok("memory/snapshot", {"session": SESSION}))["text"] == text
        assert (await raw.ok("memory/snapshot", {"session": _session("o-3", "/tmp/x", "reviewer")}))["text"] == rev
        # a new session of the same id as o-5 would see its late proposal; another sees no proposal
        fresh = (await raw.ok("memory/snapshot", {"session": {**SESSION, "id": "snap-new"}}))["text"]
        assert PROPOSALS_EN not in fresh and "- Prefers tabs" in fresh
        assert (await raw.ok("memory/snapshot", {"session": _session("o-5")}))["text"].endswith(
            f"{PROPOSALS_EN}\n{_lines([late])}")
        # neither entries nor proposals visible: empty
        await raw.ok("proposals/dismiss", {"id": shared["id"]})
        await raw.ok("proposals/dismiss", {"id": late["id"]})
        assert (await raw.ok("memory/snapshot", {"session": _session("nobody", "/tmp/y", "stranger")}))["text"] == ""


async def test_proposals_lifecycle(ask_daemon: Any) -> None:
    async with socket_client(ask_daemon.socket_path) as raw:
        raw.on_approval = _allow
        p = await raw.ok("proposals/create", {"input": {"kind": "compaction", "track": "agent", "scope": "workspace",
                                                        "text": "run tests with pytest -q"}, "session": SESSION})
        assert p["status"] == "pending" and p["workspaceKey"] == "/home/u/proj" and p["agentKey"] == "coder"
        assert p["sessionId"] == "snap-1" and p["decidedAt"] is None
        again = await raw.ok("proposals/create", {"input": {"kind": "compaction", "track": "user",
                                                            "scope": "user-global", "text": "x"}, "session": SESSION})
        assert again is None
        assert [x["id"] for x in await raw.ok("proposals/list", {"status": "pending"})] == [p["id"]]
        res = await raw.ok("proposals/approve", {"id": p["id"], "write": write_ctx()})
        assert res["proposal"]["status"] == "approved" and res["proposal"]["decidedAt"] is not None
        assert res["entry"]["source"] == "proposal" and res["entry"]["text"] == "run tests with pytest -q"
        assert res["entry"]["workspaceKey"] == "/home/u/proj"
        asked = (await raw.notification("approval/asked"))["params"]
        assert asked["source"] == "proposal" and asked["action"] == "add"
        before = await state(raw)
        err = await raw.fail("proposals/approve", {"id": p["id"], "write": write_ctx()})
        assert err.code == "PROPOSAL_NOT_FOUND" and err.details == {"id": p["id"]} and err.error["code"] == -32015
        assert (await raw.fail("proposals/dismiss", {"id": p["id"]})).code == "PROPOSAL_NOT_FOUND"
        assert (await raw.fail("proposals/dismiss", {"id": "nope"})).code == "PROPOSAL_NOT_FOUND"
        assert await state(raw) == before
        # a decided proposal makes room for the session's next one of that kind
        p2 = await raw.ok("proposals/create", {"input": {"kind": "compaction", "track": "user", "scope": "user-global",
                                                         "text": "likes tea"}, "session": SESSION})
        d = await raw.ok("proposals/dismiss", {"id": p2["id"]})
        assert d["status"] == "dismissed"
        assert {x["status"] for x in await raw.ok("proposals/list", {})} == {"dismissed"}


async def _allow(params: dict[str, Any]) -> str:
    return "allowed-once"


async def test_proposal_caps(daemon_factory: Any, tmp_path: Path) -> None:
    """proposal_max_pending is each session's (tests/test_e2e_proposal_channel.py)."""
    cfg = tmp_path / "c.toml"
    cfg.write_text("proposal_max_text = 10\nproposal_max_pending = 2\n")
    d = daemon_factory("--config", str(cfg))
    async with socket_client(d.socket_path) as raw:
        inp = {"track": "user", "scope": "user-global"}
        err = await raw.fail("proposals/create", {"input": {**inp, "kind": "k", "text": "x" * 11}, "session": SESSION})
        assert err.code == "INVALID_INPUT"
        for n in range(2):
            await raw.ok("proposals/create", {"input": {**inp, "kind": f"k{n}", "text": "ok"}, "session": {"id": "s0"}})
        err = await raw.fail("proposals/create", {"input": {**inp, "kind": "k9", "text": "ok"}, "session": {"id": "s0"}})
        assert err.code == "INVALID_INPUT"
        assert len(await raw.ok("proposals/list", {})) == 2


async def test_concurrent_proposal_decisions_one_wins(ask_daemon: Any) -> None:
    path = ask_daemon.socket_path
    async with socket_client(path) as a, socket_client(path) as b, socket_client(path) as c:
        p = await a.ok("proposals/create", {"input": {"kind": "k", "track": "user", "scope": "user-global",
                                                      "text": "only once"}, "session": SESSION})
        gate = anyio.Event()

        async def held(params: dict[str, Any]) -> str:
            await gate.wait()
            return "allowed-once"

        a.on_approval = held
        replies: dict[str, Any] = {}
        async with anyio.create_task_group() as tg:

            async def approve() -> None:
                replies["a"] = await a.call("proposals/approve", {"id": p["id"], "write": write_ctx()})

            tg.start_soon(approve)
            await a.notification("approval/asked")
            replies["b"] = await b.call("proposals/approve", {"id": p["id"], "write": write_ctx("s-b")})
            replies["c"] = await c.call("proposals/dismiss", {"id": p["id"]})
            gate.set()
        assert "result" in replies["a"]
        assert replies["b"]["error"]["data"]["code"] == "PROPOSAL_NOT_FOUND"
        assert replies["c"]["error"]["data"]["code"] == "PROPOSAL_NOT_FOUND"
        assert len(await a.ok("memory/list", {})) == 1


async def test_export_envelope_and_import(daemon: Any, daemon_factory: Any, tmp_path: Path) -> None:
    async with socket_client(daemon.socket_path) as raw:
        await add(raw, "Prefers tabs", tags=["style"], source="claude")
        await add(raw, "uses pnpm", "agent", "workspace")
        await raw.ok("memory/query", {"filter": {"text": "tabs"}})
        before_audit = len(await raw.ok("audit/list", {}))
        env = await raw.ok("memory/export", {})
        assert env["plugin"] == "dsh-memento" and env["schema"] == "memory-export-v1"
        assert env["exportedAt"].endswith("Z") and len(env["budgets"]) == 4
        assert [e["text"] for e in env["entries"]] == ["Prefers tabs", "uses pnpm"]
        assert all("sessionId" in e for e in env["entries"])
        assert len(await raw.ok("audit/list", {})) == before_audit  # export is not audited
    other = daemon_factory(name="other", db=tmp_path / "other.db")
    async with socket_client(other.socket_path) as raw:
        res = await raw.ok("memory/import", {"envelope": env, "write": write_ctx("imp")})
        assert res["added"] == 2
        got = await raw.ok("memory/list", {})
        assert [(e["text"], e["tags"], e["source"], e["workspaceKey"], e["agentKey"], e["version"], e["recallCount"])
                for e in got] == [("Prefers tabs", ["style"], "claude", "", "coder", 1, 0),
                                  ("uses pnpm", [], "dsh-memento", "/home/u/proj", "coder", 1, 0)]
        assert {e["id"] for e in got}.isdisjoint({e["id"] for e in env["entries"]})
        audit = await raw.ok("audit/list", {})
        assert [a["action"] for a in audit] == ["add", "add", "seed"]
        before = await state(raw)
        for bad, code in [({"envelope": {**env, "schema": "memory-export-v9"}}, "INVALID_INPUT"),
                          ({"envelope": {"plugin": "dsh-memento", "schema": "memory-export-v1",
                                         "entries": [{"text": "x"}]}}, "INVALID_INPUT"),
                          ({"envelope": {**env, "entries": env["entries"] * 501}}, "INVALID_INPUT"),
                          ({"envelope": env, "adapter": "mem0", "payload": []}, "INVALID_INPUT"),
                          ({}, "INVALID_INPUT"),
                          ({"adapter": "nope", "payload": "x"}, "ADAPTER_NOT_FOUND"),
                          ({"adapter": "hermes-memory-md", "payload": "## Notes\n- ok\nstray prose\n"},
                           "ADAPTER_PAYLOAD"),
                          ({"adapter": "mem0", "payload": {"messages": [{"role": "user", "content": "hi"}]}},
                           "ADAPTER_PAYLOAD")]:
            err = await raw.fail("memory/import", {**bad, "write": write_ctx("imp")})
            assert err.code == code, (bad, err.error)
        err = await raw.fail("memory/import", {"adapter": "hermes-memory-md", "payload": "## N\n- ok\nstray\n",
                                               "write": write_ctx("imp")})
        assert err.details["line"] == 3 and err.details["adapterId"] == "hermes-memory-md"
        assert await state(raw) == before


async def test_import_refuses_an_envelope_from_another_plugin(daemon: Any) -> None:
    """Only plugin "dsh-memento" is an envelope (a missing plugin too is refused), like a schema
    other than memory-export-v1; nothing is written, nothing is asked."""
    async with socket_client(daemon.socket_path) as raw:
        await add(raw, "Prefers tabs")
        env = await raw.ok("memory/export", {})
        assert env["plugin"] == "dsh-memento"  # our own export imports
        before = await state(raw)
        no_plugin = {k: v for k, v in env.items() if k != "plugin"}
        for bad, field, says in [
            (no_plugin, "envelope.plugin", "envelope has no plugin; expected 'dsh-memento'"),
            ({**env, "plugin": None}, "envelope.plugin", "envelope has a plugin of type null;"),
            ({**env, "plugin": "mem0"}, "envelope.plugin", "envelope has plugin 'mem0';"),
            ({**env, "plugin": "DSH-MEMENTO"}, "envelope.plugin", "envelope has plugin 'DSH-MEMENTO';"),
            ({**env, "plugin": "dsh-memento "}, "envelope.plugin", "envelope has plugin 'dsh-memento ';"),
            ({**env, "plugin": ""}, "envelope.plugin", "envelope has plugin '';"),
            ({**env, "plugin": 1}, "envelope.plugin", "envelope has a plugin of type number;"),
            ({**env, "plugin": ["dsh-memento"]}, "envelope.plugin", "envelope has a plugin of type array;"),
            ({"plugin": "mem0", "facts": [{"memory": "x"}]}, "envelope.plugin", "envelope has plugin 'mem0';"),
            ({**env, "plugin": "mem0", "schema": "memory-export-v9"}, "envelope.plugin", "envelope has plugin"),
            ({**env, "schema": "memory-export-v9"}, "envelope.schema", "unknown envelope schema"),
            ({**no_plugin, "schema": "memory-export-v1"}, "envelope.plugin", "envelope has no plugin"),
        ]:
            err = await raw.fail("memory/import", {"envelope": bad, "write": write_ctx("imp")})
            assert (err.code, err.details) == ("INVALID_INPUT", {"field": field}), bad
            assert err.error["message"].startswith(says), err.error
        assert await state(raw) == before
        res = await raw.ok("memory/import", {"envelope": env, "write": write_ctx("imp")})
        assert res["added"] == 1


async def test_import_plugin_refusal_asks_nobody(ask_daemon: Any) -> None:
    async with socket_client(ask_daemon.socket_path) as raw:
        raw.on_approval = _allow
        before = await state(raw)
        env = {"schema": "memory-export-v1", "exportedAt": "2026-01-01T00:00:00.000Z", "budgets": [],
               "entries": [entry_input("x")]}
        err = await raw.fail("memory/import", {"envelope": env, "write": write_ctx()})
        assert (err.code, err.details) == ("INVALID_INPUT", {"field": "envelope.plugin"})
        assert [n for n in raw.notifications if n["method"] == "approval/asked"] == []
        assert await state(raw) == before


async def test_adapters_list_and_markdown_import(daemon: Any) -> None:
    async with socket_client(daemon.socket_path) as raw:
        ids = [a["id"] for a in await raw.ok("adapters/list", {})]
        assert ids == ["mem0", "hermes-memory-md", "claude-code-memory-md"]
        claude_md = "## Project\n\nUse pnpm, never npm.\n\n## Style\n- tabs for indentation\n- no semicolons\n"
        res = await raw.ok("memory/import", {"adapter": "claude-code-memory-md", "payload": claude_md,
                                             "write": write_ctx()})
        assert res["added"] == 3
        assert [(e["text"], e["tags"], e["source"]) for e in res["entries"]] == [
            ("Use pnpm, never npm.", ["Project"], "claude-code-memory-md"),
            ("tabs for indentation", ["Style"], "claude-code-memory-md"),
            ("no semicolons", ["Style"], "claude-code-memory-md")]
        md = await raw.ok("memory/export", {"adapter": "hermes-memory-md"})
        assert md["plugin"] == "hermes-memory-md"
        assert "## user/user-global\n- Use pnpm, never npm." in md["text"]
        err = await raw.fail("memory/export", {"adapter": "nope"})
        assert err.code == "ADAPTER_NOT_FOUND" and err.details == {"adapterId": "nope"}


entry_st = st.fixed_dictionaries({
    "track": st.sampled_from(["user", "agent"]),
    "scope": st.sampled_from(["user-global", "workspace"]),
    "text": st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=40)
    .map(str.strip).filter(bool),
    "tags": st.lists(st.text(alphabet="abcdefghij", min_size=1, max_size=8), max_size=3, unique=True),
})


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(entries=st.lists(entry_st, min_size=1, max_size=8))
def test_export_import_round_trip_property(daemon_factory: Any, tmp_path: Path,
                                           entries: list[dict[str, Any]]) -> None:
    """export → import into a fresh store gives the same content (texts, tags, layers)."""
    src = daemon_factory(name="src", db=tmp_path / f"src-{len(list(tmp_path.iterdir()))}.db")
    dst = daemon_factory(name="dst", db=tmp_path / f"dst-{len(list(tmp_path.iterdir()))}.db")

    async def run() -> None:
        async with socket_client(src.socket_path) as a:
            await a.ok("memory/seed", {"inputs": entries, "write": write_ctx("p")})
            env = await a.ok("memory/export", {})
        async with socket_client(dst.socket_path) as b:
            await b.ok("memory/import", {"envelope": env, "write": write_ctx("q")})
            again = await b.ok("memory/export", {})

        def content(doc: dict[str, Any]) -> list[tuple[Any, ...]]:
            return [(e["track"], e["scope"], e["text"], e["tags"], e["source"], e["workspaceKey"], e["agentKey"])
                    for e in doc["entries"]]

        assert content(again) == content(env)
        assert again["budgets"] == env["budgets"]

    anyio.run(run)
    src.stop()
    dst.stop()


def test_store_stays_readable_by_reference_layout(daemon_factory: Any, tmp_path: Path) -> None:
    db = tmp_path / "ref.db"
    d = daemon_factory(db=db)

    async def run() -> None:
        async with socket_client(d.socket_path) as raw:
            await add(raw, "Prefers tabs", tags=["a"])
            await raw.ok("memory/snapshot", {"session": SESSION})

    anyio.run(run)
    d.stop()
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == ("4",)
    assert conn.execute("SELECT value FROM meta WHERE key = 'memoryd_schema'").fetchone() == (str(MEMORYD_SCHEMA_VERSION),)
    assert conn.execute("SELECT text, tags, version FROM entries").fetchall() == [("Prefers tabs", '["a"]', 1)]
    conn.close()
