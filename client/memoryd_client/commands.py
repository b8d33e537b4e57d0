"""``memoryctl``'s verbs that talk to a daemon, over the async client
(:mod:`memoryd_client.client`): reads, writes with their approval prompt, ``approve``,
``stop``, and ``--json`` output.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import anyio
import msgspec
from memoryd_protocol import types as T
from memoryd_protocol.constants import ALLOWED_ONCE
from memoryd_protocol.errors import EntryNotFound, ProtocolError

from . import render
from .approvals import DECIDED
from .auditing import audit_offline, cmd_audit
from .autostart import NO_DAEMON_ERRNOS
from .client import Client, connect
from .editing import cmd_edit
from .errors import ApproverKeyUnusable, ClientError, ConnectFailed, ConnectionClosed, Timeout
from .prompt import Approver
from .running import (
    EXIT_OK,
    PROG,
    Ctx,
    UsageError,
    _workspace,
    _write_private,
    autostart,
    fail,
    only_layer,
    prepare,
    warn_db,
)
from .sharing import cmd_share
from .targets import located, target
from .watching import cmd_watch
from .wire import make_session


class StopFailed(ClientError):
    """``memoryctl stop`` could not stop the daemon or confirm that it stopped (exit 3)."""

    CODE = "STOP_FAILED"


async def cmd_list(c: Client, ctx: Ctx) -> None:
    entries = only_layer(await c.list(), ctx.args)
    ctx.result(entries, lambda: render.entry_list(entries, fit=ctx.fit))


async def cmd_query(c: Client, ctx: Ctx) -> None:
    a = ctx.args
    flt = {k: v for k, v in (("text", a.text), ("track", a.track), ("scope", a.scope), ("limit", a.limit))
           if v is not None}
    # the whole store, or with --as-session what the session (--workspace, --agent) sees,
    # its recall audited under the session id
    r = await c.query(flt or None, c.query_opts if a.as_session else None)
    ctx.result(r, lambda: render.query_result(r, fit=ctx.fit))


def _input(ctx: Ctx, **extra: Any) -> dict[str, Any]:
    a = ctx.args
    inp: dict[str, Any] = {"track": a.track, "scope": a.scope, **extra}
    if "text" in ctx.data:
        inp["text"] = ctx.data["text"]
    tags = getattr(a, "tag", None)
    if tags:
        inp["tags"] = tags
    return inp


async def cmd_add(c: Client, ctx: Ctx) -> None:
    r = await c.add(_input(ctx, source=ctx.args.source))
    ctx.result(r, lambda: f"added {render.short(r.entry.id)} ({render.usage(r.usage)})")


async def cmd_replace(c: Client, ctx: Ctx) -> None:
    try:
        r = await c.replace(_input(ctx, **await target(c, ctx)))
    except EntryNotFound as exc:
        raise await located(c, ctx, exc) from None
    ctx.result(
        r, lambda: f"replaced {render.short(r.entry.id)}, now version {r.entry.version} ({render.usage(r.usage)})"
    )


async def cmd_remove(c: Client, ctx: Ctx) -> None:
    try:
        r = await c.remove(_input(ctx, **await target(c, ctx)))
    except EntryNotFound as exc:
        raise await located(c, ctx, exc) from None
    ctx.result(r, lambda: f"removed {render.short(r.entry.id)} ({render.usage(r.usage)})")


async def cmd_consolidate(c: Client, ctx: Ctx) -> None:
    r = await c.consolidate(_input(ctx, matches=ctx.args.matches, source=ctx.args.source))
    ctx.result(
        r, lambda: f"consolidated {len(r.removed)} entries into {render.short(r.entry.id)} ({render.usage(r.usage)})"
    )


async def cmd_budgets(c: Client, ctx: Ctx) -> None:
    rows = await c.budgets()
    ctx.result(rows, lambda: render.budgets_table(rows))


async def _proposal_id(c: Client, prefix: str) -> str:
    if len(prefix) >= 32:
        return prefix
    hits = [p.id for p in await c.proposals_list("pending") if p.id.startswith(prefix)]
    if len(hits) == 1:
        return hits[0]
    return prefix  # zero or several: let the daemon say PROPOSAL_NOT_FOUND


async def cmd_proposals(c: Client, ctx: Ctx) -> None:
    a = ctx.args
    if a.action == "list":
        rows = await c.proposals_list(a.status)
        ctx.result(rows, lambda: render.proposals_table(rows, fit=ctx.fit) if rows else "no proposals")
    elif a.action == "approve":
        r = await c.proposals_approve(await _proposal_id(c, a.id))
        ctx.result(
            r, lambda: f"approved proposal {render.short(r.proposal.id)}: added {render.short(r.entry.id)} ({render.usage(r.usage)})"
        )
    else:
        p = await c.proposals_dismiss(await _proposal_id(c, a.id))
        ctx.result(p, lambda: f"dismissed proposal {render.short(p.id)}")


async def cmd_export(c: Client, ctx: Ctx) -> None:
    doc = await c.export(ctx.args.adapter)
    text = doc if isinstance(doc, str) else render.to_json(doc)
    if not text.endswith("\n"):
        text += "\n"
    if ctx.args.output:
        path = await anyio.to_thread.run_sync(partial(_write_private, ctx.args.output, text, force=ctx.args.force))
        if not ctx.json:
            print(f"exported to {path}", file=sys.stderr)
    else:
        sys.stdout.write(text)
        sys.stdout.flush()


async def _adapter_payload(c: Client, ctx: Ctx) -> Any:
    """The payload for ``--adapter``: parsed JSON for a JSON adapter, the text for a text one
    (``importFormats`` says which); the raw text when JSON does not parse."""
    a = ctx.args
    if "payload" in ctx.data:
        return ctx.data["payload"]
    raw: str = ctx.data["raw"]
    if a.format == "text":
        return raw
    formats = next((ad.import_formats for ad in await c.adapters_list() if ad.id == a.adapter), [])
    wants_json = any("json" in f for f in formats)
    wants_text = any(f.startswith("text/") for f in formats)
    if wants_text and not wants_json:
        return raw
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError:
        return raw
    return parsed if isinstance(parsed, dict | list) else raw


async def cmd_import(c: Client, ctx: Ctx) -> None:
    a = ctx.args
    skip = None if a.allow_duplicates else True
    if a.adapter:
        r = await c.import_(adapter=a.adapter, payload=await _adapter_payload(c, ctx), skip_existing=skip,
                            track=a.track, scope=a.scope)
    else:
        r = await c.import_(envelope=ctx.data["payload"], skip_existing=skip)

    def human() -> str:
        said = f"imported {r.added} entries"
        if not isinstance(r.skipped, msgspec.UnsetType):
            said += f", skipped {r.skipped} already in the store"
        if not isinstance(r.workspace_keys_dropped, msgspec.UnsetType):
            said += (f"; {r.workspace_keys_dropped} user-global entries named a workspace and were imported "
                     "without it")
        return said

    ctx.result(r, human)


async def cmd_adapters(c: Client, ctx: Ctx) -> None:
    rows = await c.adapters_list()
    ctx.result(rows, lambda: render.adapters_table(rows, fit=ctx.fit))


async def cmd_status(c: Client, ctx: Ctx) -> None:
    s = await c.status()
    ctx.result(s, lambda: render.status_lines(s, socket=ctx.socket))


async def cmd_replicate(c: Client, ctx: Ctx) -> None:
    r = (await c.status()).replication
    ctx.result(r, lambda: render.replication_lines(r))


def _pidfd(pid: int) -> int | None:
    """A pidfd for ``pid`` (Linux ≥ 5.3): signal it without a pid-reuse race, and wait for
    its exit. None where there is none."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _terminate(pid: int, pidfd: int | None) -> None:
    try:
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, signal.SIGTERM)
        else:
            os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass  # exiting already: its connection ends all the same
    except OSError as exc:
        raise StopFailed(f"cannot signal memoryd (pid {pid}): {exc.strerror or exc}", {"pid": pid}) from None


def _present(path: str) -> bool:
    return os.path.lexists(path)


def _not_running(ctx: Ctx) -> None:
    where = str(ctx.socket)
    ctx.result({"stopped": False, "pid": None, "socket": where}, lambda: f"memoryd is not running on {where}")


async def cmd_stop(c: Client, ctx: Ctx) -> None:
    """SIGTERM the daemon, then wait on what it does as it finishes draining: it unlinks its
    socket and closes every connection (EOF on this one), then exits (its pidfd turns
    readable). No polling."""
    s = await c.status()
    pid, peer = s.pid, c.peer_pid
    if peer is not None and peer != pid:  # another pid namespace, or something in between
        raise StopFailed(
            f"the daemon at {ctx.socket} reports pid {pid} but the socket's peer is pid {peer}; not signalling",
            {"pid": pid, "peerPid": peer},
        )
    pidfd = _pidfd(pid)
    try:
        _terminate(pid, pidfd)
        with anyio.move_on_after(ctx.args.timeout) as waiting:
            await c.wait_closed()
            if s.socket is not None and _present(s.socket):
                raise StopFailed(
                    f"memoryd (pid {pid}) closed its connections but {s.socket} is still there", {"pid": pid}
                )
            if pidfd is not None:
                await anyio.wait_readable(pidfd)
        if waiting.cancelled_caught:
            raise Timeout(f"memoryd (pid {pid}) did not stop within {ctx.args.timeout:g}s", {"pid": pid})
    finally:
        if pidfd is not None:
            os.close(pidfd)
    where = s.socket if s.socket is not None else str(ctx.socket)
    note = "" if s.socket is not None else " (systemd keeps the socket and starts memoryd on the next connection)"
    ctx.result({"stopped": True, "pid": pid, "socket": where}, lambda: f"stopped memoryd (pid {pid}) on {where}{note}")


async def cmd_snapshot(c: Client, ctx: Ctx) -> None:
    r = await c.snapshot(c.session, ctx.args.lang)
    if ctx.json:
        ctx.out(render.to_json(r))
    elif r.text:
        sys.stdout.write(render.visible(r.text) if ctx.fit else r.text)
        sys.stdout.write("\n" if not r.text.endswith("\n") else "")
        sys.stdout.flush()
    else:
        print("(empty snapshot: no entries visible to this session)", file=sys.stderr)


async def cmd_snapshots(c: Client, ctx: Ctx) -> None:
    a = ctx.args
    if getattr(a, "action", None) != "prune":
        raise UsageError("memoryctl snapshots needs an action: prune (see memoryctl snapshots prune --help)")
    if a.older_than is not None and a.older_than < 0:
        raise UsageError("--older-than takes a number of days, 0 or more")
    before = None if a.older_than is None else max(0, int(time.time() * 1000 - a.older_than * 86_400_000))
    r = await c.snapshots_prune(before)
    ctx.result(r, lambda: f"pruned the frozen snapshots of {r.sessions} ended sessions and {r.texts} texts "
                          f"({r.bytes} bytes)" + (f": ledger rows {', '.join(map(str, r.rows))}" if r.rows else ""))


async def cmd_approve(c: Client, ctx: Ctx) -> int:
    """Ctrl-C stops it (exit 0). SIGINT is taken here rather than left to asyncio's
    default, which cancels the main task natively: a cancel scope that happens to be
    exiting at that moment (a prompt that the daemon just resolved, a call's timeout) can
    absorb such a cancellation, and the verb then went on waiting for approvals."""
    import asyncio  # anyio.run's backend here; anyio has no callback-style signal handler

    scope = anyio.CancelScope()
    left: list[str] = []

    def interrupted() -> None:
        ctx.approver.stopping = True
        if ctx.approver.prompting is not None and not left:
            left.append(ctx.approver.prompting)
        print("", file=sys.stderr)
        scope.cancel()

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, interrupted)
    try:
        with scope:
            return await _approve(c, ctx)
    finally:
        loop.remove_signal_handler(signal.SIGINT)
    if left:
        print(f"{PROG}: {LEFT_UNDECIDED.format(id=render.short(left[0]))}", file=sys.stderr, flush=True)
    return EXIT_OK


#: What becomes of the approval at the prompt when memoryctl approve stops: the daemon takes
#: this connection off the approvers it was asked of, and denies the write once none is left.
LEFT_UNDECIDED = ("stopped; approval {id} was left undecided: another approver it was asked of may still decide "
                  "it; if none was, the daemon denies the write (unavailable)")


def init_key(ctx: Ctx) -> int:
    """``memoryctl approve --init-key``: make the approver key; no daemon is contacted."""
    from memoryd_protocol.paths import approver_key_path, create_approver_key

    path = approver_key_path()
    try:
        create_approver_key(path)
    except FileExistsError:
        raise UsageError(f"the approver key {path} exists already, and keyed approvers use it as it is; remove it "
                         "first to make a new one") from None
    except OSError as exc:
        raise UsageError(f"cannot create the approver key {path}: {exc.strerror or exc}") from None
    ctx.out(json.dumps({"key": str(path)}) if ctx.json else str(path))
    return EXIT_OK


#: The commands that answer their own prompt (memoryctl's Approve? [y/N]) or decide, and
#: so, under approvers = "keyed", prove the approver key first: (verb, action or None).
PROMPTING = frozenset({("add", None), ("replace", None), ("remove", None), ("consolidate", None),
                       ("share", None), ("import", None), ("proposals", "approve"), ("audit", "accept"),
                       ("snapshots", "prune")})


async def _prove_for_prompt(c: Client, ctx: Ctx) -> None:
    """Under approvers = "keyed", prove the approver key so that this command's own prompt
    may decide its writes; without a readable key they are asked of a keyed approver."""
    a = ctx.args
    command = (a.verb, getattr(a, "action", None) if a.verb in ("proposals", "audit", "snapshots") else None)
    if c.server is None or c.server.approvers != "keyed" or not c.approvals or command not in PROMPTING:
        return
    try:
        await c.prove_approver_key()
    except ApproverKeyUnusable as exc:
        print(f"memoryctl: not answering approvals here: {exc.message}; this command's writes are asked of "
              "a running 'memoryctl approve'", file=sys.stderr)


async def _approve(c: Client, ctx: Ctx) -> int:
    a = ctx.args
    events = c.events("approval/resolved", DECIDED)
    if c.server is not None and c.server.approvers == "keyed":
        try:
            await c.prove_approver_key(subscribe=True)  # approvers = "keyed": the challenge, answered
        except ApproverKeyUnusable as exc:
            raise UsageError(f'the daemon runs with approvers = "keyed": {exc.message}') from None
    else:
        await c.approval_subscribe()
    print(f"memoryctl: approving writes for memoryd at {ctx.socket} (Ctrl-C to stop)", file=sys.stderr, flush=True)
    decided = 0
    async for ev in events:
        p = ev.params
        if ev.method == DECIDED:
            decided += 1
            word = "approved" if p.outcome == ALLOWED_ONCE else p.outcome
            late = f" (too late: {p.refused})" if p.refused else ""
            if ctx.json:
                ctx.out(json.dumps({"id": p.id, "outcome": p.outcome, "refused": p.refused}))
            else:
                ctx.out(f"{word} {render.short(p.id)}{late}")
            if (a.count and decided >= a.count) or ctx.approver.eof:
                return EXIT_OK
        else:
            rid, outcome = (p.id, p.outcome) if isinstance(p, T.ApprovalResolved) else (p.get("id"), p.get("outcome"))
            if ctx.json:
                ctx.out(json.dumps({"id": rid, "outcome": outcome, "resolvedElsewhere": True}))
            else:
                ctx.out(f"approval {render.short(str(rid))} was decided by another approver: {outcome}")
    raise ConnectionClosed("the daemon closed the connection")


COMMANDS: dict[str, Callable[[Client, Ctx], Awaitable[Any]]] = {
    "list": cmd_list,
    "query": cmd_query,
    "add": cmd_add,
    "replace": cmd_replace,
    "edit": cmd_edit,
    "remove": cmd_remove,
    "consolidate": cmd_consolidate,
    "share": cmd_share,
    "budgets": cmd_budgets,
    "audit": cmd_audit,
    "proposals": cmd_proposals,
    "export": cmd_export,
    "import": cmd_import,
    "adapters": cmd_adapters,
    "status": cmd_status,
    "replicate": cmd_replicate,
    "stop": cmd_stop,
    "snapshot": cmd_snapshot,
    "snapshots": cmd_snapshots,
    "approve": cmd_approve,
    "watch": cmd_watch,
}



async def _warn_db(c: Client, ctx: Ctx) -> None:
    try:
        have = (await c.status()).store.path
    except (ProtocolError, ClientError):
        return
    warn_db(ctx, have)



async def run(ctx: Ctx) -> int:
    a = ctx.args
    session = make_session(a.session or f"memoryctl-{os.getpid()}", cwd=_workspace(a), agent_preset=a.agent)
    autostarted = False
    try:
        if a.verb == "approve" and a.init_key:
            return init_key(ctx)  # local only: no connection, no autostart
        prepare(ctx)
        if a.verb == "audit" and a.action != "list" and a.db:
            return audit_offline(ctx)  # the store itself, read-only: no connection, no autostart
        if a.verb == "restore":
            from .restoring import cmd_restore

            return cmd_restore(ctx)  # the replica and the store's file: no connection, no autostart
        command = COMMANDS[a.verb]
        while True:
            try:
                async with connect(
                    ctx.socket,
                    session=session,
                    # --via-approver: this connection declares it cannot approve, so the
                    # daemon routes its writes to subscribed approvers (wire-v1 §5).
                    approvals=not (a.via_approver and a.verb != "approve"),
                    on_approval=ctx.approver,
                    client_name=PROG,
                    timeout=a.timeout,
                ) as c:
                    if a.db and not autostarted:
                        await _warn_db(c, ctx)
                    await _prove_for_prompt(c, ctx)
                    code = await command(c, ctx)
                    return code if isinstance(code, int) else EXIT_OK
            except ConnectFailed as exc:
                if a.verb == "stop" and exc.details.get("errno") in NO_DAEMON_ERRNOS:
                    _not_running(ctx)  # nothing to stop is not an error; never autostart
                    return EXIT_OK
                await anyio.to_thread.run_sync(partial(autostart, ctx, exc, autostarted))
            autostarted = True
    except Exception as exc:
        return fail(ctx, exc)
    finally:
        ctx.approver.close()


def run_async(ctx: Ctx) -> int:
    """Run the verb over the async client, answering approvals at the terminal."""
    a = ctx.args
    ctx.approver = Approver(yes=a.yes, reject=getattr(a, "reject", False))
    return anyio.run(run, ctx)
