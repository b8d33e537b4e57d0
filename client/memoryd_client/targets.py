"""How memoryctl names the one entry a replace, remove or edit works on: MATCH or --id."""

from __future__ import annotations

from memoryd_protocol.text import normalize_agent_key, normalize_workspace_key
from memoryd_protocol.validation import SessionView

from .client import Client
from .running import FULL_ID_LENGTH, Ctx, UsageError, _workspace


async def target(c: Client, ctx: Ctx) -> dict[str, str]:
    """``{match}`` or ``{id}``; an --id shorter than a full id is widened to the one entry of
    this track/scope, visible to the session, whose id starts with it."""
    a = ctx.args
    if a.entry_id is None:
        return {"match": a.match}
    prefix: str = a.entry_id
    if len(prefix) >= FULL_ID_LENGTH or not prefix:
        return {"id": prefix}
    view = SessionView(None, normalize_workspace_key(_workspace(a)), normalize_agent_key(a.agent))
    hits = [
        e.id
        for e in await c.list()
        if e.track == a.track
        and e.scope == a.scope
        and e.id.startswith(prefix)
        and view.sees(e.scope, e.workspace_key, e.agent_key)
    ]
    if len(hits) > 1:
        raise UsageError(f"--id {prefix} starts {len(hits)} entries' ids in {a.track}/{a.scope}; give more of it")
    return {"id": hits[0] if hits else prefix}  # none: the daemon answers ENTRY_NOT_FOUND
