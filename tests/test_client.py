"""The Python client (``memoryd_client``) against a real daemon: every method, typed errors,
the approval round trip, events, disconnects, timeouts, and the blocking client.

A few tests use deliberately misbehaving in-test servers (a few lines of anyio) to reach the
client's error paths a correct daemon never takes.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import anyio
import anyio.abc
import memoryd_client as mc
import pytest
from memoryd_client import types as T
from memoryd_protocol.constants import ALLOWED_ONCE, PROTOCOL
from processes import detached_socket

pytestmark = [pytest.mark.anyio, pytest.mark.inprocess]

TIMEOUT = 10
UG = {"track": "user", "scope": "user-global"}


def session(sid: str = "s-1", cwd: str = "/home/u/proj", agent: str = "") -> dict[str, Any]:
    return mc.make_session(sid, cwd=cwd, agent_preset=agent)


def entry(text: str, track: str = "user", scope: str = "user-global", **extra: Any) -> dict[str, Any]:
    return {"track": track, "scope": scope, "text": text, **extra}


def config(tmp_path: Path, text: str, name: str = "cfg.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@asynccontextmanager
async def client(daemon: Any, **kwargs: Any) -> AsyncIterator[mc.Client]:
    kwargs.setdefault("session", session())
    kwargs.setdefault("timeout", TIMEOUT)
    with anyio.fail_after(30):
        async with mc.connect(daemon.socket_path, **kwargs) as c:
            yield c


@asynccontextmanager
async def foreign_client(daemon: Any, **kwargs: Any) -> AsyncIterator[mc.Client]:
    """client(), over a connection that a live process of its own holds (processes.detached_socket):
    a subscribed approver is never asked about a write of its own process or its relatives'."""

    async def connect_unix(path: Any) -> anyio.abc.UNIXSocketStream:
        sock = await anyio.to_thread.run_sync(detached_socket, path)
        return await anyio.abc.UNIXSocketStream.from_socket(sock)

    async with AsyncExitStack() as stack:
        with mock.patch("anyio.connect_unix", connect_unix):
            c = await stack.enter_async_context(client(daemon, **kwargs))
        yield c


# --- connecting --------------------------------------------------------------------------


@pytest.mark.process
async def test_connect_initializes(daemon: Any) -> None:
    async with client(daemon, client_name="pytest") as c:
        assert isinstance(c.server, T.InitializeResult)
        assert c.server.protocol == PROTOCOL
        assert c.server.write_policy == "auto"
        assert [(b.track, b.scope) for b in c.server.budgets] == [
            ("user", "user-global"), ("user", "workspace"), ("agent", "user-global"), ("agent", "workspace")]
        assert c.peer_pid == daemon.proc.pid
        again = await c.initialize()
        assert again.protocol == PROTOCOL
        status = await c.status()
        assert status.connections >= 1
    assert c.closed


async def test_connect_fails_typed_when_no_daemon(tmp_path: Path) -> None:
    with pytest.raises(mc.ConnectFailed) as info:
        async with mc.connect(tmp_path / "nothing.sock"):
            pass
    assert info.value.code == "CONNECT_FAILED"
    assert info.value.details["path"].endswith("nothing.sock")
    assert isinstance(info.value, mc.ClientError) and isinstance(info.value, ConnectionError)


async def test_errors_in_the_body_propagate_unwrapped(daemon: Any) -> None:
    with pytest.raises(mc.EntryNotFound):
        async with client(daemon) as c:
            await c.remove({**UG, "match": "nothing like this"})
    with pytest.raises(KeyError):
        async with client(daemon):
            raise KeyError("mine")


# --- every method --------------------------------------------------------------------------


async def test_write_methods(daemon: Any) -> None:
    async with client(daemon) as c:
        added = await c.add(entry("Prefers tabs over spaces", tags=["style"]))
        assert isinstance(added, T.WriteResult)
        assert added.entry.text == "Prefers tabs over spaces" and added.entry.tags == ["style"]
        assert added.entry.session_id == "s-1" and added.entry.version == 1
        assert added.usage.used == len("Prefers tabs over spaces")

        replaced = await c.replace({**UG, "match": "TABS", "text": "Prefers 4-space indents"})
        assert isinstance(replaced, T.ReplaceResult)
        assert replaced.previous.text == "Prefers tabs over spaces"
        assert replaced.entry.id == added.entry.id and replaced.entry.version == 2
        assert replaced.entry.tags == ["style"]  # kept when not given

        await c.add(entry("Uses vim"))
        await c.add(entry("Uses tmux"))
        merged = await c.consolidate({**UG, "matches": ["vim", "tmux"], "text": "Uses vim inside tmux"})
        assert isinstance(merged, T.ConsolidateResult)
        assert sorted(e.text for e in merged.removed) == ["Uses tmux", "Uses vim"]
        assert merged.entry.version == 1

        removed = await c.remove({**UG, "match": "inside tmux"})
        assert isinstance(removed, T.WriteResult) and removed.entry.text == "Uses vim inside tmux"

        seeded = await c.seed([entry("one"), entry("two", "agent", "workspace")])
        assert isinstance(seeded, T.SeedResult) and seeded.added == 2
        assert [e.text for e in seeded.entries] == ["one", "two"]
        assert seeded.entries[1].workspace_key == "/home/u/proj"

        texts = [e.text for e in await c.list()]
        assert texts == ["Prefers 4-space indents", "one", "two"]


async def test_inputs_accept_protocol_structs(daemon: Any) -> None:
    async with client(daemon, session=T.Session(id="s-2", header=T.Header(cwd="/w", agent_preset="coder"))) as c:
        r = await c.add(T.EntryInput(track="agent", scope="workspace", text="Run make check", tags=["ci"]))
        assert (r.entry.workspace_key, r.entry.agent_key, r.entry.session_id) == ("/w", "coder", "s-2")
        r2 = await c.replace(T.ReplaceInput(track="agent", scope="workspace", match="make", text="Run make test"))
        assert r2.entry.text == "Run make test"
        q = await c.query(T.QueryFilter(text="make"), T.QueryOpts(agent_key="coder", workspace_key="/w"))
        assert [e.text for e in q.entries] == ["Run make test"]
        await c.remove(T.RemoveInput(track="agent", scope="workspace", match="make test"))
        assert await c.list() == []


async def test_explicit_write_context_overrides_the_session(daemon: Any) -> None:
    async with client(daemon) as c:
        other = {"agent": {"session": {"id": "other", "header": {"cwd": "/x", "agentPreset": "rev"}}}}
        r = await c.add(entry("mine", "agent", "workspace"), write=other)
        assert (r.entry.session_id, r.entry.workspace_key, r.entry.agent_key) == ("other", "/x", "rev")


async def test_read_methods(daemon: Any) -> None:
    async with client(daemon) as c:
        for text in ("alpha one", "alpha two", "beta"):
            await c.add(entry(text))
        q = await c.query({"text": "ALPHA", "limit": 1})
        assert isinstance(q, T.QueryResult)
        assert (len(q.entries), q.total, q.truncated) == (1, 2, True)
        everything = await c.query()
        assert everything.total == 3

        budgets = await c.budgets()
        assert all(isinstance(b, T.BudgetRow) for b in budgets)
        assert budgets[0].used == len("alpha one") + len("alpha two") + len("beta")

        await c.query({"text": "beta"}, {"sessionId": "s-1"})
        audit = await c.audit_list(limit=2)
        assert len(audit) == 2 and all(isinstance(a, T.AuditRow) for a in audit)
        assert audit[0].action == "recalled" and audit[0].text == "beta"
        assert [a.action for a in await c.audit_list()][-3:] == ["add", "add", "add"]

        snap = await c.snapshot(session("snap-1"))
        assert isinstance(snap, T.SnapshotResult) and "- alpha one" in snap.text
        await c.add(entry("gamma"))
        assert (await c.snapshot("snap-1")).text == snap.text  # frozen per session id
        assert "gamma" in (await c.snapshot(session("snap-2"), language="en")).text

        adapters = await c.adapters_list()
        assert {"mem0", "hermes-memory-md", "claude-code-memory-md"} <= {a.id for a in adapters}
        assert all(isinstance(a, T.AdapterInfo) for a in adapters)

        status = await c.status()
        assert isinstance(status, T.DaemonStatus)
        assert Path(status.store.path) == daemon.db_path and status.store.schema_version == 4


async def test_export_import_round_trip(daemon_factory: Any) -> None:
    a, b = daemon_factory(name="a"), daemon_factory(name="b")
    async with client(a) as ca:
        await ca.add(entry("kept with tags", tags=["x"]))
        await ca.add(entry("workspace fact", "agent", "workspace"))
        envelope = await ca.export()
        assert isinstance(envelope, dict)  # memory/export stays plain JSON
        assert envelope["schema"] == "memory-export-v1" and len(envelope["entries"]) == 2
        markdown = await ca.export(adapter="claude-code-memory-md")
        assert "kept with tags" in json.dumps(markdown)
    async with client(b) as cb:
        r = await cb.import_(envelope)
        assert r.added == 2
        assert [(e.text, e.tags) for e in await cb.list()] == [("kept with tags", ["x"]), ("workspace fact", [])]
        md = await cb.import_(adapter="claude-code-memory-md", payload="## Notes\n\n- Imported bullet\n")
        assert md.added == 1 and md.entries[0].text == "Imported bullet"


async def test_proposals(daemon: Any) -> None:
    async with client(daemon) as c:
        prop = {"kind": "compaction", "track": "user", "scope": "user-global", "text": "Likes short answers"}
        p = await c.proposals_create(prop)
        assert isinstance(p, T.Proposal) and p.status == "pending" and p.session_id == "s-1"
        assert await c.proposals_create(prop) is None  # one per (session, kind)
        assert [x.id for x in await c.proposals_list("pending")] == [p.id]
        approved = await c.proposals_approve(p.id)
        assert isinstance(approved, T.ProposalApproveResult)
        assert approved.proposal.status == "approved" and approved.entry.text == "Likes short answers"
        assert approved.entry.source == "proposal"

        q = await c.proposals_create({**prop, "text": "Dismiss me"}, session("s-9"))
        assert q is not None
        dismissed = await c.proposals_dismiss(q.id)
        assert dismissed.status == "dismissed"
        assert {x.status for x in await c.proposals_list()} == {"approved", "dismissed"}
        with pytest.raises(mc.ProposalNotFound) as info:
            await c.proposals_dismiss(q.id)
        assert info.value.details == {"id": q.id}


async def test_generic_call_and_notify(daemon: Any) -> None:
    async with client(daemon) as c:
        rows = await c.call("memory/budgets")
        assert all(isinstance(r, T.BudgetRow) for r in rows)
        with pytest.raises(mc.RpcError) as info:
            await c.call("memory/nope", {})
        assert info.value.code == "METHOD_NOT_FOUND" and info.value.rpc_code == -32601
        # approval/decided is also accepted as a notification: no answer, connection fine.
        await c.notify("approval/decided", {"id": "not-asked", "outcome": "rejected"})
        assert (await c.status()).version


async def test_approval_methods(daemon_factory: Any, any_approvers: Path) -> None:
    async with client(daemon_factory("--config", str(any_approvers))) as c:
        assert isinstance(await c.approval_subscribe(), T.Empty)
        with pytest.raises(mc.InvalidInput) as info:
            await c.approval_decided("never-asked", ALLOWED_ONCE)
        assert info.value.code == "INVALID_INPUT" and info.value.details == {"field": "id"}


# --- typed errors --------------------------------------------------------------------------


async def test_budget_exceeded_is_typed(daemon_factory: Any, tmp_path: Path) -> None:
    d = daemon_factory("--config", config(tmp_path, "[budgets.user]\nuser_global = 10\n"))
    async with client(d) as c:
        await c.add(entry("12345678"))
        with pytest.raises(mc.BudgetExceeded) as info:
            await c.add(entry("abcd"))
        err = info.value
        assert isinstance(err, mc.ProtocolError) and err.code == "BUDGET_EXCEEDED" and err.rpc_code == -32011
        assert err.details == {"track": "user", "scope": "user-global", "used": 8, "limit": 10, "needed": 12}
        with pytest.raises(mc.BudgetExceeded):
            await c.seed([entry("a"), entry("bcd")])
        assert [e.text for e in await c.list()] == ["12345678"]


async def test_ambiguous_and_not_found_are_typed(daemon: Any) -> None:
    async with client(daemon) as c:
        await c.add(entry("Uses vim at work"))
        await c.add(entry("Uses vim at home"))
        with pytest.raises(mc.AmbiguousMatch) as amb:
            await c.replace({**UG, "match": "vim", "text": "x"})
        assert amb.value.code == "AMBIGUOUS_MATCH"
        assert amb.value.details["candidates"] == 2 and amb.value.details["match"] == "vim"
        assert sorted(amb.value.details["sample"]) == ["Uses vim at home", "Uses vim at work"]
        with pytest.raises(mc.EntryNotFound) as nf:
            await c.remove({"track": "agent", "scope": "user-global", "match": "vim"})
        assert nf.value.details == {"track": "agent", "scope": "user-global", "match": "vim"}


async def test_invalid_input_is_typed(daemon: Any) -> None:
    async with client(daemon) as c:
        with pytest.raises(mc.InvalidInput) as info:
            await c.add({"track": "robot", "scope": "user-global", "text": "x"})
        assert info.value.code == "INVALID_INPUT" and info.value.rpc_code == -32602
        with pytest.raises(mc.InvalidInput):
            await c.add({**UG, "text": "x", "tag": ["typo"]})
        with pytest.raises(mc.AdapterNotFound) as anf:
            await c.export(adapter="nope")
        assert anf.value.details == {"adapterId": "nope"}
        with pytest.raises(mc.AdapterPayload):
            await c.import_(adapter="mem0", payload={"messages": [{"role": "user", "content": "hi"}]})
        assert await c.list() == []


async def test_write_requires_agent(daemon: Any) -> None:
    async with mc.connect(daemon.socket_path, timeout=TIMEOUT) as c:  # no session
        with pytest.raises(mc.WriteRequiresAgent) as info:
            await c.add(entry("x"))
        assert info.value.code == "WRITE_REQUIRES_AGENT"
        with pytest.raises(mc.WriteRequiresAgent):
            await c.add(entry("x"), write={"agent": None})


async def test_write_denied_under_policy_off(daemon_factory: Any) -> None:
    d = daemon_factory(policy="off")
    async with client(d) as c:
        with pytest.raises(mc.WriteDenied) as info:
            await c.add(entry("x"))
        assert info.value.code == "WRITE_DENIED" and info.value.details == {"outcome": "rejected"}
        assert (await c.audit_list())[0].action == "add-denied"


# --- approvals ---------------------------------------------------------------------------


async def test_approval_allowed_shows_the_complete_payload(ask_daemon: Any) -> None:
    asked: list[T.ApprovalAsked] = []

    async def allow(a: T.ApprovalAsked) -> str:
        asked.append(a)
        return ALLOWED_ONCE

    async with client(ask_daemon, on_approval=allow) as c:
        await c.add(entry("Prefers tabs"))
        await c.replace({**UG, "match": "tabs", "text": "Prefers spaces"})
        await c.remove({**UG, "match": "spaces"})
        assert await c.list() == []
    assert [a.action for a in asked] == ["add", "replace", "remove"]
    assert asked[0].text == "Prefers tabs"
    assert asked[1].text == "from:\nPrefers tabs\n\nto:\nPrefers spaces"
    assert asked[2].text == "Prefers spaces"
    assert all(a.session_id == "s-1" and a.track == "user" for a in asked)


@pytest.mark.parametrize("answer", ["rejected", False, None, "maybe"])
async def test_approval_rejected(ask_daemon: Any, answer: Any) -> None:
    async with client(ask_daemon, on_approval=lambda a: answer) as c:
        with pytest.raises(mc.WriteDenied) as info:
            await c.add(entry("x"))
        assert info.value.details["outcome"] == "rejected"
        assert await c.list() == []


async def test_approval_handler_raising_rejects(ask_daemon: Any) -> None:
    async def broken(a: T.ApprovalAsked) -> str:
        raise RuntimeError("handler bug")

    async with client(ask_daemon, on_approval=broken) as c:
        with pytest.raises(mc.WriteDenied) as info:
            await c.add(entry("x"))
        assert info.value.details["outcome"] == "rejected"
        assert (await c.status()).pending_approvals == 0  # and the connection still works


async def test_no_handler_fails_closed(ask_daemon: Any) -> None:
    async with client(ask_daemon) as c:
        with pytest.raises(mc.WriteDenied) as info:
            await c.seed([entry("a"), entry("b")])
        assert info.value.details["outcome"] == "rejected"
        assert (await c.audit_list())[0].action == "seed-denied"


async def test_sync_handler_runs_in_a_thread(ask_daemon: Any) -> None:
    threads: list[int] = []

    def allow(a: T.ApprovalAsked) -> bool:
        threads.append(threading.get_ident())
        return True

    async with client(ask_daemon, on_approval=allow) as c:
        await c.add(entry("x"))
        assert len(await c.list()) == 1
    assert threads and threads[0] != threading.get_ident()


async def test_slow_approval_does_not_count_against_the_timeout(ask_daemon: Any) -> None:
    async def slow(a: T.ApprovalAsked) -> str:
        await anyio.sleep(2.0)
        return ALLOWED_ONCE

    async with client(ask_daemon, on_approval=slow, timeout=1.0) as c:
        r = await c.add(entry("took a while to approve"))
        assert r.entry.text == "took a while to approve"


async def test_approval_pair_is_observable(ask_daemon: Any) -> None:
    async with client(ask_daemon, on_approval=lambda a: ALLOWED_ONCE) as c:
        events = c.events("approval/asked", mc.DECIDED)
        await c.add(entry("x"))
        asked = await events.receive(TIMEOUT)
        decided = await events.receive(TIMEOUT)
    assert asked.method == "approval/asked" and isinstance(asked.params, T.ApprovalAsked)
    assert decided.method == mc.DECIDED
    assert decided.params == mc.Decided(id=asked.params.id, outcome=ALLOWED_ONCE, refused=None)


@pytest.mark.process
async def test_a_handler_may_say_who_decided(ask_daemon: Any) -> None:
    def decide(a: T.ApprovalAsked) -> mc.Decision:
        return mc.Decision(ALLOWED_ONCE, {"kind": "human", "name": "alice"})

    async with client(ask_daemon, on_approval=decide) as c:
        events = c.events(mc.DECIDED)
        await c.add(entry("x"))
        decided = await events.receive(TIMEOUT)
    assert decided.params == mc.Decided(id=decided.params.id, outcome=ALLOWED_ONCE,
                                        by=T.ApprovalBy(kind="human", name="alice"))
    assert f"approval {decided.params.id} decided allowed-once by connection " in ask_daemon.stderr()
    assert "claims human 'alice')" in ask_daemon.stderr()


async def test_headless_writer_is_asked_of_a_subscribed_approver(ask_any_daemon: Any) -> None:
    ask_daemon = ask_any_daemon
    seen: list[T.ApprovalAsked] = []

    async def approve(a: T.ApprovalAsked) -> str:
        seen.append(a)
        return ALLOWED_ONCE

    async with foreign_client(ask_daemon, on_approval=approve, session=None) as approver:
        await approver.approval_subscribe()
        async with client(ask_daemon, approvals=False, session=session("headless")) as writer:
            r = await writer.add(entry("from a headless agent"))
            assert r.entry.session_id == "headless"
    assert [a.session_id for a in seen] == ["headless"]


async def test_headless_writer_without_approver_is_unavailable(ask_daemon: Any) -> None:
    async with client(ask_daemon, approvals=False) as writer:
        with pytest.raises(mc.WriteDenied) as info:
            await writer.add(entry("nobody to ask"))
        assert info.value.details["outcome"] == "unavailable"


async def test_first_approver_wins_and_the_other_sees_resolved(ask_any_daemon: Any) -> None:
    ask_daemon = ask_any_daemon
    hold = anyio.Event()

    async def slow_reject(a: T.ApprovalAsked) -> str:
        await hold.wait()  # never decides: cancelled once the other approver wins
        return "rejected"

    async with (
        foreign_client(ask_daemon, on_approval=slow_reject, session=None) as loser,
        foreign_client(ask_daemon, on_approval=lambda a: ALLOWED_ONCE, session=None) as winner,
    ):
        resolved = loser.events("approval/resolved")
        loser_decided = loser.events(mc.DECIDED)
        await loser.approval_subscribe()
        await winner.approval_subscribe()
        async with client(ask_daemon, approvals=False, session=session("w")) as writer:
            await writer.add(entry("approved by the winner"))
        ev = await resolved.receive(TIMEOUT)
        assert isinstance(ev.params, T.ApprovalResolved) and ev.params.outcome == ALLOWED_ONCE
        hold.set()
        with anyio.move_on_after(0.3):  # the cancelled prompt sends no late decision
            extra = await loser_decided.receive()
            pytest.fail(f"loser answered after being resolved: {extra}")


async def test_daemon_timeout_closes_the_prompt(daemon_factory: Any, tmp_path: Path) -> None:
    d = daemon_factory("--config", config(tmp_path, "approval_timeout_s = 0.3\n"), policy="ask", name="late")
    cancelled = anyio.Event()

    async def too_slow(a: T.ApprovalAsked) -> str:
        try:
            await anyio.sleep(30)
        finally:
            cancelled.set()  # approval/resolved (cancelled) stopped the handler
        return ALLOWED_ONCE

    async with client(d, on_approval=too_slow) as c:
        resolved = c.events("approval/resolved")
        with pytest.raises(mc.WriteDenied) as info:
            await c.add(entry("x"))
        assert info.value.details["outcome"] == "cancelled"
        assert (await resolved.receive(TIMEOUT)).params.outcome == "cancelled"
        with anyio.fail_after(TIMEOUT):
            await cancelled.wait()
        assert (await c.status()).pending_approvals == 0
        assert await c.list() == []


# --- events ------------------------------------------------------------------------------


async def test_events_listeners_and_stream(daemon: Any) -> None:
    got: dict[str, list[Any]] = {}
    every: list[str] = []

    async def on_added(ev: mc.Event) -> None:
        got.setdefault(ev.method, []).append(ev.params)

    async with client(daemon) as c:
        stream = c.events()
        c.on("memory/added", on_added)
        c.on("memory/updated", lambda ev: got.setdefault(ev.method, []).append(ev.params))
        c.on("memory/removed", lambda ev: got.setdefault(ev.method, []).append(ev.params))
        c.on("memory/recalled", lambda ev: got.setdefault(ev.method, []).append(ev.params))
        c.on("memory/snapshot", lambda ev: got.setdefault(ev.method, []).append(ev.params))
        off = c.on("*", lambda ev: every.append(ev.method))
        await c.add(entry("Prefers tabs"))
        await c.replace({**UG, "match": "tabs", "text": "Prefers spaces"})
        await c.query({"text": "spaces"}, {"sessionId": "s-1"})
        await c.snapshot(session("ev-1"))
        await c.remove({**UG, "match": "spaces"})
        methods = [(await stream.receive(TIMEOUT)).method for _ in range(5)]
        off()
        await c.add(entry("after off"))
        await stream.receive(TIMEOUT)
    assert methods == ["memory/added", "memory/updated", "memory/recalled", "memory/snapshot", "memory/removed"]
    assert every == methods
    assert isinstance(got["memory/added"][0], T.MemoryAdded)
    assert got["memory/updated"][0].previous.text == "Prefers tabs"
    assert got["memory/updated"][0].entry.text == "Prefers spaces"
    assert isinstance(got["memory/recalled"][0], T.MemoryRecalled)
    assert got["memory/recalled"][0] == T.MemoryRecalled(query="spaces", matches=1, session_id="s-1")
    assert got["memory/snapshot"][0].session_id == "ev-1"
    assert got["memory/removed"][0].entry.text == "Prefers spaces"


async def test_a_failing_listener_does_not_break_the_connection(daemon: Any) -> None:
    async def bad_async(ev: mc.Event) -> None:
        raise RuntimeError("async listener bug")

    def bad_sync(ev: mc.Event) -> None:
        raise RuntimeError("sync listener bug")

    async with client(daemon) as c:
        stream = c.events("memory/added")
        c.on("memory/added", bad_async)
        c.on("memory/added", bad_sync)
        await c.add(entry("x"))
        await stream.receive(TIMEOUT)
        assert len(await c.list()) == 1


async def test_event_stream_iterates_until_the_connection_closes(daemon: Any) -> None:
    async with client(daemon) as c:
        stream = c.events("memory/added")
        await c.add(entry("a"))
        await c.add(entry("b"))
    texts = [ev.params.entry.text async for ev in stream]
    assert texts == ["a", "b"]


# --- disconnects and timeouts --------------------------------------------------------------


@pytest.mark.process
async def test_pending_calls_fail_when_the_daemon_dies(ask_daemon: Any) -> None:
    asked = anyio.Event()

    async def never(a: T.ApprovalAsked) -> str:
        asked.set()
        await anyio.sleep_forever()
        return "rejected"

    async with client(ask_daemon, on_approval=never) as c:
        stream = c.events()
        errors: list[BaseException] = []

        async def write() -> None:
            try:
                await c.add(entry("in flight"))
            except mc.ClientError as exc:
                errors.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(write)
            tg.start_soon(write)
            with anyio.fail_after(TIMEOUT):
                await asked.wait()
            ask_daemon.proc.kill()
        assert len(errors) == 2 and all(isinstance(e, mc.ConnectionClosed) for e in errors)
        assert errors[0].code == "CONNECTION_CLOSED" and errors[0].details["method"] == "memory/add"
        assert c.closed
        with pytest.raises(mc.ConnectionClosed):
            await c.list()
        remaining = [ev.method async for ev in stream]
        assert "approval/asked" in remaining  # buffered events drain, then the stream ends


async def test_aclose_fails_pending_calls(ask_daemon: Any) -> None:
    asked = anyio.Event()

    async def hold(a: T.ApprovalAsked) -> str:
        asked.set()
        await anyio.sleep_forever()
        return "rejected"

    async def close_soon(c: mc.Client) -> None:
        await asked.wait()
        await c.aclose()

    # A copy of the connection's socket, kept so that the test sees the daemon let go of it.
    kept: list[socket.socket] = []
    connect_unix = anyio.connect_unix

    async def connect_and_keep(path: Any) -> anyio.abc.UNIXSocketStream:
        stream = await connect_unix(path)
        kept.append(stream.extra(anyio.abc.SocketAttribute.raw_socket).dup())
        return stream

    with mock.patch("anyio.connect_unix", connect_and_keep):
        async with client(ask_daemon, on_approval=hold) as c:
            async with anyio.create_task_group() as tg:
                tg.start_soon(close_soon, c)
                with pytest.raises(mc.ConnectionClosed) as info:
                    await c.add(entry("x"))
            assert info.value.message == "connection closed by the client"
            assert c.closed
            with pytest.raises(mc.ConnectionClosed):
                await c.status()
    # The daemon saw the asking connection go: the write is denied as unavailable. The
    # connection ends with the copy (EOF), and the daemon closes its end once every request
    # it read is done, the denied write included: that EOF is the event to wait for.
    async with await anyio.abc.UNIXSocketStream.from_socket(kept[0]) as copy:
        await copy.send_eof()
        with anyio.fail_after(TIMEOUT):
            while True:
                try:
                    await copy.receive()
                except anyio.EndOfStream:
                    break
    async with client(ask_daemon) as c2:
        rows = await c2.audit_list()
        assert rows[0].action == "add-denied" and rows[0].outcome.startswith("unavailable")


async def test_timeout_is_typed_and_the_late_answer_is_dropped(ask_any_daemon: Any) -> None:
    ask_daemon = ask_any_daemon
    approver_asked: list[T.ApprovalAsked] = []
    release = anyio.Event()

    async def later(a: T.ApprovalAsked) -> str:
        approver_asked.append(a)
        await release.wait()
        return ALLOWED_ONCE

    async with foreign_client(ask_daemon, on_approval=later, session=None) as approver:
        decided = approver.events(mc.DECIDED)
        await approver.approval_subscribe()
        async with client(ask_daemon, approvals=False, session=session("h")) as writer:
            added = writer.events("memory/added")
            params = {"input": entry("slow"), "write": {"agent": {"session": session("h")}}}
            with pytest.raises(mc.Timeout) as info:
                await writer.call("memory/add", params, timeout=0.3)
            assert info.value.code == "TIMEOUT" and isinstance(info.value, TimeoutError)
            assert not writer._pending  # the finally removed the entry
            release.set()
            assert (await decided.receive(TIMEOUT)).params.outcome == ALLOWED_ONCE
            assert (await added.receive(TIMEOUT)).params.entry.text == "slow"
            # The late response was dropped; the connection keeps working.
            assert [e.text for e in await writer.list()] == ["slow"]


# --- misbehaving servers -------------------------------------------------------------------


Handler = Callable[[dict[str, Any], Callable[[Any], Awaitable[None]]], Awaitable[bool]]


@asynccontextmanager
async def fake_server(tmp_path: Path, handle: Handler) -> AsyncIterator[Path]:
    """A Unix socket server that answers initialize correctly and everything else with
    ``handle(request, send)``; ``handle`` returns False to close the connection."""
    path = Path(tmp_path) / "fake.sock"
    listener = await anyio.create_unix_listener(path)
    init = {"protocol": PROTOCOL, "server": {"name": "fake", "version": "0"}, "schemaVersion": 4,
            "writePolicy": "auto", "budgets": []}

    async def serve(stream: Any) -> None:
        async with stream:
            async def send(msg: Any) -> None:
                await stream.send(json.dumps(msg).encode() + b"\n")

            buf = b""
            while True:
                try:
                    buf += await stream.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    return
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    req = json.loads(line)
                    if req.get("method") == "initialize":
                        await send({"jsonrpc": "2.0", "id": req["id"], "result": init})
                    elif "id" in req and not await handle(req, send):
                        return

    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, serve)
        try:
            yield path
        finally:
            tg.cancel_scope.cancel()


async def test_result_that_breaks_the_contract_is_bad_response(tmp_path: Path) -> None:
    async def handle(req: dict[str, Any], send: Callable[[Any], Awaitable[None]]) -> bool:
        await send({"jsonrpc": "2.0", "id": req["id"], "result": {"entries": "not a list"}})
        return True

    async with fake_server(tmp_path, handle) as path, mc.connect(path, timeout=TIMEOUT) as c:
        with pytest.raises(mc.BadResponse) as info:
            await c.query()
        assert info.value.code == "BAD_RESPONSE" and info.value.details["method"] == "memory/query"
        export = await c.export()  # memory/export is plain JSON: anything goes
        assert export == {"entries": "not a list"}


async def test_routing_by_shape_batches_and_noise(tmp_path: Path) -> None:
    async def handle(req: dict[str, Any], send: Callable[[Any], Awaitable[None]]) -> bool:
        # Garbage, an unknown notification, an answer to nobody, then the real answer
        # inside a batch together with an event.
        await send("not an object")
        await send({"jsonrpc": "2.0", "method": "vendor/ping", "params": {"n": 1}})
        await send({"jsonrpc": "2.0", "id": 99999, "result": {}})
        await send([{"jsonrpc": "2.0", "method": "memory/snapshot", "params": {"sessionId": "s", "text": "t"}},
                    {"jsonrpc": "2.0", "id": req["id"], "result": []}])
        return True

    async with fake_server(tmp_path, handle) as path, mc.connect(path, timeout=TIMEOUT) as c:
        events = c.events()
        assert await c.list() == []
        first, second = await events.receive(TIMEOUT), await events.receive(TIMEOUT)
        assert (first.method, first.params) == ("vendor/ping", {"n": 1})
        assert second.params == T.MemorySnapshot(session_id="s", text="t")


async def test_refused_late_decision_is_swallowed(tmp_path: Path) -> None:
    decisions: list[dict[str, Any]] = []
    add_id: list[Any] = []

    async def handle(req: dict[str, Any], send: Callable[[Any], Awaitable[None]]) -> bool:
        if req["method"] == "memory/add":
            add_id.append(req["id"])
            await send({"jsonrpc": "2.0", "method": "approval/asked", "params": {
                "id": "ap-1", "action": "add", "track": "user", "scope": "user-global", "text": "x",
                "source": "dsh-memento", "sessionId": None, "reason": "[dsh-memento] add user/user-global\nx"}})
        elif req["method"] == "approval/decided":  # too late: refused, then the write is denied
            decisions.append(req["params"])
            await send({"jsonrpc": "2.0", "id": req["id"], "error": {
                "code": -32602, "message": "no pending approval with this id was asked of this connection",
                "data": {"code": "INVALID_INPUT", "details": {"field": "id"}}}})
            await send({"jsonrpc": "2.0", "id": add_id[0], "error": {
                "code": -32014, "message": "write denied: cancelled",
                "data": {"code": "WRITE_DENIED", "details": {"outcome": "cancelled"}}}})
        return True

    async with fake_server(tmp_path, handle) as path, mc.connect(path, on_approval=lambda a: True,
                                                                 timeout=TIMEOUT) as c:
        decided = c.events(mc.DECIDED)
        with pytest.raises(mc.WriteDenied) as info:
            await c.add(entry("x"), write={"agent": {"session": {"id": "s"}}})
        assert info.value.details == {"outcome": "cancelled"}
        ev = await decided.receive(TIMEOUT)
        assert ev.params == mc.Decided(id="ap-1", outcome=ALLOWED_ONCE, refused="INVALID_INPUT")
        assert not c.closed
    assert decisions == [{"id": "ap-1", "outcome": ALLOWED_ONCE}]


async def test_server_closing_mid_call_is_connection_closed(tmp_path: Path) -> None:
    async def handle(req: dict[str, Any], send: Callable[[Any], Awaitable[None]]) -> bool:
        return False

    async with fake_server(tmp_path, handle) as path, mc.connect(path, timeout=TIMEOUT) as c:
        with pytest.raises(mc.ConnectionClosed):
            await c.status()


# --- the blocking client -----------------------------------------------------------------


@pytest.mark.process
def test_sync_client(daemon_factory: Any, any_approvers: Path) -> None:
    daemon = daemon_factory("--config", str(any_approvers))
    with mc.connect_sync(daemon.socket_path, session=session(), timeout=TIMEOUT) as c:
        assert c.server is not None and c.server.protocol == PROTOCOL
        assert c.peer_pid == daemon.proc.pid
        events = c.events("memory/added")
        seen: list[str] = []
        done = threading.Event()

        def on_added(ev: mc.Event) -> None:
            seen.append(ev.params.entry.text)
            assert c.budgets()[0].used > 0  # listeners run in a thread: blocking calls are fine
            done.set()

        c.on("memory/added", on_added)
        r = c.add(entry("Prefers tabs"))
        assert isinstance(r, T.WriteResult)
        assert events.receive(TIMEOUT).params.entry.id == r.entry.id
        assert done.wait(TIMEOUT) and seen == ["Prefers tabs"]
        c.replace({**UG, "match": "tabs", "text": "Prefers spaces"})
        c.seed([entry("seed-1"), entry("seed-2")])
        c.consolidate({**UG, "matches": ["seed-1"], "text": "merged"})
        assert c.query({"text": "spaces"}).total == 1
        assert [e.text for e in c.list()] == ["Prefers spaces", "seed-2", "merged"]
        c.remove({**UG, "match": "spaces"})
        assert len(c.budgets()) == 4 and c.audit_list(1)[0].action == "remove"
        assert c.snapshot(session("sync-snap")).text
        env = c.export()
        assert c.import_(env).added == 2
        assert c.adapters_list()
        p = c.proposals_create({"kind": "k", "track": "user", "scope": "user-global", "text": "prop"})
        assert p is not None and c.proposals_list("pending")[0].id == p.id
        assert c.proposals_approve(p.id).entry.text == "prop"
        q = c.proposals_create({"kind": "k2", "track": "user", "scope": "user-global", "text": "prop2"})
        assert q is not None and c.proposals_dismiss(q.id).status == "dismissed"
        assert isinstance(c.approval_subscribe(), T.Empty)
        with pytest.raises(mc.InvalidInput):
            c.approval_decided("nope", "rejected")
        assert c.status().connections >= 1
        assert c.call("memory/list")
        c.notify("approval/decided", {"id": "nope", "outcome": "rejected"})
        with pytest.raises(mc.EntryNotFound) as info:
            c.remove({**UG, "match": "no such entry"})
        assert info.value.details["match"] == "no such entry"
    assert c.closed
    with pytest.raises(mc.ConnectionClosed):
        c.list()
    c.close()  # idempotent


def test_sync_client_approvals(ask_daemon: Any) -> None:
    asked: list[str] = []

    def decide(a: T.ApprovalAsked) -> str:
        asked.append(a.text)
        return ALLOWED_ONCE if "yes" in a.text else "rejected"

    c = mc.connect_sync(ask_daemon.socket_path, session=session(), on_approval=decide, timeout=TIMEOUT)
    try:
        c.add(entry("yes please"))
        with pytest.raises(mc.WriteDenied):
            c.add(entry("no thanks"))
        assert [e.text for e in c.list()] == ["yes please"]
    finally:
        c.close()
    assert asked == ["yes please", "no thanks"]


def test_sync_connect_failure_is_typed(tmp_path: Path) -> None:
    with pytest.raises(mc.ConnectFailed):
        mc.connect_sync(tmp_path / "missing.sock")
