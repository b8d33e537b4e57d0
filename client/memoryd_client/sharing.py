"""``memoryctl share``: move entries out of an agent's own layer into the shared layer.

Each entry moves as one ``memory/consolidate`` of that entry alone, named by its id, with
its own text, tags and source and ``agentKey: ''``: one approval per entry, and in the ledger a
consolidate-remove and a consolidate-add row per entry. The entries are picked from the
management view (``memory/list``), as the session of this run (``--agent``, ``--cwd``)
sees them; everything that can be wrong with the command line is found before the first
write, so an error there changes nothing.
"""

from __future__ import annotations

import shlex
import sys
from collections import Counter
from typing import Any

from memoryd_protocol import types as T
from memoryd_protocol.constants import SHORT_ID_LENGTH
from memoryd_protocol.errors import AmbiguousMatch, EntryNotFound, ProtocolError, WriteDenied
from memoryd_protocol.text import ascii_fold

from . import render
from .client import Client
from .errors import ClientError
from .running import FULL_ID_LENGTH, Ctx, UsageError
from .targets import _view, options_to_see

NO_AGENT = ("share moves entries out of an agent's own layer into the shared one: name that agent with "
            "--agent NAME (memoryctl list shows each entry's AGENT)")


def _elsewhere(outside: list[T.Entry], ctx: Ctx) -> str:
    """Where the agent's entries that this command did not pick are, as the options that
    would pick them: '; run again with --cwd /x (2 entries) or --track agent (1 entry)'."""
    ways = Counter(" ".join(options_to_see(e, ctx)) for e in outside)
    if not ways:
        return ""
    shown = [f"{way} ({_entries(n)})" for way, n in ways.most_common(3)]
    more = f" or {len(ways) - 3} other places" if len(ways) > 3 else ""
    return f"; run again with {' or '.join(shown)}{more}"


def _here(ctx: Ctx) -> str:
    """The part of the agent's layer this command looks at, in words."""
    a, view = ctx.args, _view(ctx)
    track = f"track {a.track}, " if a.track is not None else ""
    workspace = f"workspace {view.workspace_key}"
    scope = {"user-global": "user-global", "workspace": workspace}.get(a.scope, f"user-global or {workspace}")
    return track + scope


def _picked(everything: list[T.Entry], ctx: Ctx) -> tuple[list[T.Entry], list[T.Entry]]:
    """The agent's entries this command picks (``--track``/``--scope``, and workspace entries
    of ``--cwd`` only), in creation order, and the agent's other entries."""
    a, view = ctx.args, _view(ctx)
    mine = [e for e in everything if e.agent_key == view.agent_key]
    here = [e for e in mine if (a.track is None or e.track == a.track) and (a.scope is None or e.scope == a.scope)
            and view.sees(e.scope, e.workspace_key, e.agent_key)]
    ids = {e.id for e in here}
    return here, [e for e in mine if e.id not in ids]


def _no_such_agent(everything: list[T.Entry], agent: str) -> EntryNotFound:
    agents = sorted({e.agent_key for e in everything if e.agent_key})
    known = f"agents with entries of their own: {', '.join(agents)}" if agents else "no agent has entries of its own"
    return EntryNotFound(f"agent {agent!r} has no entries of its own, so there is nothing to share ({known}); "
                         "memoryctl list shows each entry's AGENT", {"agentKey": agent})


def _by_id(here: list[T.Entry], outside: list[T.Entry], everything: list[T.Entry], ctx: Ctx) -> T.Entry:
    """The one entry of ``here`` whose id is, or starts with, ``--id``."""
    a, agent = ctx.args, _view(ctx).agent_key
    given: str = a.entry_id
    hits = [e for e in here if e.id == given or (len(given) < FULL_ID_LENGTH and e.id.startswith(given))]
    if len(hits) == 1:
        return hits[0]
    if len(hits) > 1:
        raise UsageError(f"--id {given} starts {len(hits)} entries' ids in agent {agent!r}'s layer; give more of it")
    details = {"agentKey": agent, "entryId": given}
    found = [e for e in everything if e.id.startswith(given)]
    if len(found) != 1:
        raise EntryNotFound(f"no entry in agent {agent!r}'s layer has the id {given}; memoryctl list shows every "
                            "entry's id and AGENT", details)
    e = found[0]
    short = e.id[:SHORT_ID_LENGTH]
    if not e.agent_key:
        raise EntryNotFound(f"entry {short} is in the shared layer already: every agent sees it; nothing to move",
                            details)
    if any(o.id == e.id for o in outside):
        raise EntryNotFound(f"entry {short} is not among the entries this command looks at ({_here(ctx)})"
                            f"{_elsewhere([e], ctx)}", details)
    raise EntryNotFound(f"entry {short} is agent {e.agent_key!r}'s, not agent {agent!r}'s; run again with "
                        f"--agent {shlex.quote(e.agent_key)}", details)


def _by_match(here: list[T.Entry], outside: list[T.Entry], ctx: Ctx) -> T.Entry:
    """The one entry of ``here`` whose text contains MATCH (ASCII case-insensitive, as the
    daemon matches)."""
    a, agent = ctx.args, _view(ctx).agent_key
    needle = ascii_fold(a.match)
    hits = [e for e in here if needle in ascii_fold(e.text)]
    details: dict[str, Any] = {"agentKey": agent, "match": a.match}
    if not hits:
        elsewhere = _elsewhere([e for e in outside if needle in ascii_fold(e.text)], ctx)
        raise EntryNotFound(f"no entry of agent {agent!r} in {_here(ctx)} contains MATCH{elsewhere}", details)
    if len(hits) > 1:
        ids = [e.id for e in hits[:AmbiguousMatch.MAX_IDS]]
        raise AmbiguousMatch(f"MATCH is ambiguous: {len(hits)} entries of agent {agent!r} contain it (ids "
                             f"{', '.join(i[:SHORT_ID_LENGTH] for i in ids)}); name one with --id ID, use a longer "
                             "MATCH, or give neither to share them all", {**details, "candidates": len(hits), "ids": ids})
    return hits[0]


def pick(everything: list[T.Entry], ctx: Ctx) -> list[T.Entry]:
    """The entries ``memoryctl share`` moves, in creation order; an error that names the
    next step when there are none, or MATCH or --id names no single one."""
    a, agent = ctx.args, _view(ctx).agent_key
    if not agent:
        raise UsageError(NO_AGENT)
    here, outside = _picked(everything, ctx)
    if not here and not outside:
        raise _no_such_agent(everything, agent)
    if a.entry_id is not None:
        return [_by_id(here, outside, everything, ctx)]
    if a.match is not None:
        return [_by_match(here, outside, ctx)]
    if not here:
        raise EntryNotFound(f"agent {agent!r} has no entries in {_here(ctx)}{_elsewhere(outside, ctx)}",
                            {"agentKey": agent})
    return here


def _left_off(exc: Exception, moved: int, total: int, agent: str) -> Exception:
    """``exc`` (a failure after ``moved`` of ``total`` entries) saying what was done before it."""
    if moved and isinstance(exc, ProtocolError | ClientError):
        exc.message = (f"{exc.message}; {moved} of {total} entries were shared before it, the rest are still in "
                       f"agent {agent!r}'s layer: run the same memoryctl share again to move them")
    return exc


async def cmd_share(c: Client, ctx: Ctx) -> None:
    """One consolidate per entry, each asked on its own. A 'no' typed at this prompt keeps
    that entry where it is and goes on with the next; any other failure stops there."""
    picked = pick(await c.list(), ctx)
    agent = _view(ctx).agent_key
    moved: list[T.ConsolidateResult] = []
    declined: list[str] = []
    for n, e in enumerate(picked, 1):
        print(f"memoryctl: sharing entry {render.short(e.id)} ({e.track}/{e.scope}) of agent {agent!r} with every "
              f"agent [{n}/{len(picked)}]", file=sys.stderr, flush=True)
        noes = ctx.approver.declined
        try:
            r = await c.consolidate({"track": e.track, "scope": e.scope, "ids": [e.id], "text": e.text,
                                     "tags": list(e.tags), "source": e.source,
                                     "agentKey": ""})
        except WriteDenied as exc:
            if exc.details.get("outcome") == "rejected" and ctx.approver.declined > noes:
                declined.append(e.id)  # the human said no to this one entry: keep asking about the rest
                continue
            raise _left_off(exc, len(moved), len(picked), agent) from None
        except (ProtocolError, ClientError) as exc:
            raise _left_off(exc, len(moved), len(picked), agent) from None
        moved.append(r)
        if not ctx.json:
            ctx.out(f"shared {render.short(e.id)} as {render.short(r.entry.id)} ({render.usage(r.usage)})")
    if declined:
        shown = ", ".join(render.short(i) for i in declined)
        them = "it" if len(declined) == 1 else "them"
        raise WriteDenied(f"write denied: rejected: {len(declined)} of {_entries(len(picked))} stayed in agent "
                          f"{agent!r}'s layer ({shown}), {len(moved)} shared; run memoryctl share again to be asked "
                          f"about {them} again",
                          {"outcome": "rejected", "declined": declined, "shared": [r.entry.id for r in moved]})
    ctx.result({"agentKey": agent, "shared": moved},
               lambda: f"shared {_entries(len(moved))} of agent {agent!r} with every agent")


def _entries(n: int) -> str:
    return f"{n} entry" if n == 1 else f"{n} entries"
