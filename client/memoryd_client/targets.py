"""How memoryctl names the one entry a replace, remove or edit works on: MATCH or --id; and
where an --id that names no entry the session sees lives instead."""

from __future__ import annotations

import functools
import shlex
from pathlib import Path

from memoryd_protocol import types as T
from memoryd_protocol.constants import SHORT_ID_LENGTH
from memoryd_protocol.errors import EntryNotFound, ProtocolError
from memoryd_protocol.paths import default_config_path
from memoryd_protocol.text import normalize_agent_key, normalize_workspace_key
from memoryd_protocol.validation import SessionView
from memoryd_protocol.workspaces import Aliases, AliasTableError, parse_aliases

from .client import Client
from .errors import ClientError
from .running import FULL_ID_LENGTH, Ctx, UsageError, _workspace


def _view(ctx: Ctx) -> SessionView:
    """The set of entries this run's session (--cwd, --agent) sees: its workspace mapped by
    the config's workspace aliases, as the daemon maps the cwd memoryctl sends it."""
    a = ctx.args
    config = Path(a.config) if a.config else default_config_path()
    return SessionView(None, normalize_workspace_key(_workspace(a), _aliases(config)), normalize_agent_key(a.agent))


@functools.cache  # per file: share asks for the view once per entry
def _aliases(path: Path) -> Aliases:
    """``[workspace_aliases]`` of the config file a daemon memoryctl starts reads (--config,
    else the default file): the choices memoryctl makes itself (edit, share, an --id prefix)
    must see the workspace the daemon does. A daemon refuses a bad table at start; here it is
    a usage error naming the file."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read the config file {path}: {exc}") from None
    import tomllib  # only with a config file: most runs have none

    try:
        raw = tomllib.loads(text).get("workspace_aliases")
        return {} if raw is None else parse_aliases(raw)
    except (tomllib.TOMLDecodeError, AliasTableError) as exc:
        raise UsageError(f"the config file {path}: {exc}; fix it (memoryd refuses it too)") from None


def visible(entries: list[T.Entry], ctx: Ctx) -> list[T.Entry]:
    """The entries of this command's track/scope that its session sees, in the daemon's order."""
    a, view = ctx.args, _view(ctx)
    return [e for e in entries
            if e.track == a.track and e.scope == a.scope and view.sees(e.scope, e.workspace_key, e.agent_key)]


async def target(c: Client, ctx: Ctx) -> dict[str, str]:
    """``{match}`` or ``{id}``; an --id shorter than a full id is widened to the one entry of
    this track/scope, visible to the session, whose id starts with it."""
    a = ctx.args
    if a.entry_id is None:
        return {"match": a.match}
    prefix: str = a.entry_id
    if len(prefix) >= FULL_ID_LENGTH or not prefix:
        return {"id": prefix}
    hits = [e.id for e in visible(await c.list(), ctx) if e.id.startswith(prefix)]
    if len(hits) > 1:
        raise UsageError(f"--id {prefix} starts {len(hits)} entries' ids in {a.track}/{a.scope}; give more of it")
    return {"id": hits[0] if hits else prefix}  # none: the daemon answers ENTRY_NOT_FOUND


def options_to_see(e: T.Entry, ctx: Ctx) -> list[str]:
    """The options that would make this command see ``e``: its track, scope, workspace and
    agent where they are not the command's (a --track or --scope not given takes any)."""
    a, view = ctx.args, _view(ctx)
    options = [f"--track {e.track}"] if a.track is not None and e.track != a.track else []
    if a.scope is not None and e.scope != a.scope:
        options.append(f"--scope {e.scope}")
    if e.scope == "workspace" and e.workspace_key != view.workspace_key:
        options.append(f"--cwd {shlex.quote(e.workspace_key)}")
    if e.agent_key not in ("", view.agent_key):
        options.append(f"--agent {shlex.quote(e.agent_key)}")
    return options


def _located(e: T.Entry, ctx: Ctx) -> str:
    """Where ``e`` lives, and the options that make this command see it."""
    where = f"entry {e.id[:SHORT_ID_LENGTH]} is in {e.track}/{e.scope}"
    if e.scope == "workspace":
        where += f" of workspace {e.workspace_key}"
    where += f" for agent {e.agent_key!r}" if e.agent_key else ", shared by every agent"
    options = options_to_see(e, ctx)
    if not options:  # it is visible now: written since the daemon looked
        return f"{where}, which this command sees now; run it again"
    return f"{where}; run again with {' '.join(options)}"


async def located(c: Client, ctx: Ctx, exc: EntryNotFound) -> EntryNotFound:
    """ENTRY_NOT_FOUND for an --id, saying where that entry is when it is in another layer,
    workspace or agent's set (from the management view, which memoryctl may read and the
    session's daemon answer must not reveal), or that the store has no such entry. Any
    other ENTRY_NOT_FOUND comes back as it is."""
    given = ctx.args.entry_id
    if not given or "entryId" not in exc.details:
        return exc
    try:
        hits = [e for e in await c.list() if e.id.startswith(given)]
    except (ProtocolError, ClientError):
        return exc  # the daemon's own answer still stands
    id_words = "this id" if len(given) >= FULL_ID_LENGTH else f"an id starting {given}"
    if not hits:
        hint = f"no entry anywhere in the store has {id_words}; memoryctl list shows every entry's id"
    elif len(hits) > 1:
        hint = f"{len(hits)} entries elsewhere in the store have {id_words}; give more of the id (memoryctl list)"
    else:
        hint = _located(hits[0], ctx)
    return EntryNotFound(f"{exc.message}: {hint}", exc.details)
