"""``memoryctl edit``: one entry's text in the user's editor, then a replace of that entry.

The entry is named as for replace and remove (:func:`memoryd_client.targets.target`) and
found in the session's view as the daemon would find it, with the daemon's own errors
(ENTRY_NOT_FOUND, AMBIGUOUS_MATCH), since its text is needed before the editor opens. The
editor is chosen as git chooses it ($VISUAL, then $EDITOR, then vi; not $VISUAL on a dumb
terminal) and run through ``sh -c`` (an editor may carry arguments, ``code --wait``) on a
private file of its own. The replace names the entry by its full id, so the edit lands on
the entry that was opened, and goes through the normal approval.
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
from collections.abc import Mapping
from functools import partial

import anyio
from memoryd_protocol import types as T
from memoryd_protocol.errors import EntryNotFound
from memoryd_protocol.text import js_trim, normalize_tags
from memoryd_protocol.validation import check_target, resolve_one

from . import render
from .client import Client
from .running import Ctx, UsageError
from .targets import located, target, visible

NO_TERMINAL = ("edit needs a terminal: it opens an editor ($VISUAL, $EDITOR or vi) on the entry's text; "
               "without one, use memoryctl replace")
#: what the editor is run with: the file's path follows as "$1", as git runs an editor
SHELL_FORM = '{editor} "$@"'


def editor_command(env: Mapping[str, str] | None = None) -> tuple[str, str]:
    """The editor to run and where it came from, in git's order: $VISUAL (unless the
    terminal is dumb: TERM unset or "dumb"), $EDITOR, then vi (unless the terminal is
    dumb). An empty variable counts as unset."""
    env = os.environ if env is None else env
    dumb = env.get("TERM", "dumb") == "dumb"
    for name in ("EDITOR",) if dumb else ("VISUAL", "EDITOR"):
        value = env.get(name)
        if value:
            return value, f"${name}"
    if dumb:
        raise UsageError("the terminal is dumb (TERM is unset or dumb) and $EDITOR is not set: set EDITOR to an "
                         "editor that works here, or change the entry with memoryctl replace")
    return "vi", "the default"


def _stdin_is_a_terminal() -> bool:
    try:
        return sys.stdin is not None and sys.stdin.isatty()
    except (ValueError, OSError):
        return False


async def find_entry(c: Client, ctx: Ctx) -> T.Entry:
    """The entry MATCH or --id names, as the daemon's replace would resolve it, with its
    errors: INVALID_INPUT for an empty MATCH, ENTRY_NOT_FOUND, AMBIGUOUS_MATCH."""
    a = ctx.args
    named = await target(c, ctx)
    selector = check_target(named.get("match"), named.get("id"))
    entries = visible(await c.list(), ctx)
    if selector.match is not None:
        found = resolve_one(((e.id, e.text) for e in entries), a.track, a.scope, selector.match)
        return next(e for e in entries if e.id == found)
    for e in entries:
        if e.id == selector.entry_id:
            return e
    raise EntryNotFound("no visible memory entry has this id", selector.details(a.track, a.scope))


def _failed(editor: str, origin: str, status: int) -> UsageError:
    how = f"was killed by signal {-status}" if status < 0 else f"exited with status {status}"
    if status == 127:
        how += " (the shell found no such command)"
    return UsageError(f"the editor '{render.one_line(editor)}' (from {origin}) {how}; the entry is unchanged: fix "
                      "the editor or set $VISUAL or $EDITOR to another one, then run memoryctl edit again")


def edit_in_editor(editor: str, origin: str, text: str, name: str) -> str:
    """``text`` written to a private file (mode 0600, in a directory of its own, mode 0700,
    where the editor's swap and backup files land too), ``editor`` run on it with this
    process's terminal, and what it saved; the directory is removed whatever happens."""
    import shutil
    import subprocess
    import tempfile

    directory = tempfile.mkdtemp(prefix="memoryctl-edit-")
    try:
        path = os.path.join(directory, f"{name}.txt")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text + "\n")
        status = subprocess.run(["sh", "-c", SHELL_FORM.format(editor=editor), editor, path], check=False).returncode
        if status != 0:
            raise _failed(editor, origin, status)
        try:
            with open(path, encoding="utf-8", newline="") as f:
                return f.read()
        except FileNotFoundError:
            raise UsageError(f"the editor '{render.one_line(editor)}' (from {origin}) left no file to read; the "
                             "entry is unchanged: run memoryctl edit again") from None
        except UnicodeDecodeError:
            raise UsageError("the edited text is not UTF-8; the entry is unchanged: save it as UTF-8 and run "
                             "memoryctl edit again") from None
    finally:
        shutil.rmtree(directory, ignore_errors=True)


async def _edit(editor: str, origin: str, entry: T.Entry) -> str:
    """:func:`edit_in_editor` on a worker thread, this process deaf to Ctrl-C and Ctrl-\\ for
    as long as the editor runs, as git is: the terminal sends them to the editor and to
    memoryctl alike, and the editor decides what they mean. The editor still gets them (a
    handler, unlike SIG_IGN, does not survive exec)."""
    import asyncio  # anyio.run's backend here; anyio has no callback-style signal handler

    loop = asyncio.get_running_loop()
    signals = (signal.SIGINT, signal.SIGQUIT)
    for signum in signals:
        loop.add_signal_handler(signum, lambda: None)
    try:
        return await anyio.to_thread.run_sync(partial(edit_in_editor, editor, origin, entry.text,
                                                      f"memory-{render.short(entry.id)}"))
    finally:
        for signum in signals:
            loop.remove_signal_handler(signum)


def _not_saved(text: str) -> None:
    """The edited text on stderr, so that a refused edit does not lose it."""
    lines = "\n".join(render.gutter_lines(text))
    print(f"memoryctl: your edited text, not saved:\n{lines}", file=sys.stderr, flush=True)


async def _still_the_same(c: Client, ctx: Ctx, entry: T.Entry, text: str) -> None:
    """Refuse the edit when ``entry`` changed or went while the editor was open: the wire's
    replace takes no expected version, so the entry is read again just before it is sent."""
    a = ctx.args
    now = next((e for e in visible(await c.list(), ctx) if e.id == entry.id), None)
    details = {"track": a.track, "scope": a.scope, "entryId": entry.id}
    if now is None:
        _not_saved(text)
        raise EntryNotFound("the entry was removed while it was being edited; your text was not saved: add it "
                            "again with memoryctl add", details)
    if now.version != entry.version or now.text != entry.text:
        _not_saved(text)
        raise EntryNotFound(f"the entry changed while it was being edited (version {entry.version} is now version "
                            f"{now.version}); your text was not saved: run memoryctl edit again to edit its new text",
                            details)


async def cmd_edit(c: Client, ctx: Ctx) -> None:
    """``memoryctl edit ID|MATCH``: the entry's text in the editor, then a replace by its full
    id. No change, or text left empty, writes nothing."""
    a = ctx.args  # MATCH or --id, not both: checked before connecting (running.prepare)
    if not _stdin_is_a_terminal():
        raise UsageError(NO_TERMINAL)
    editor, origin = editor_command()
    tags = None if a.tag is None else normalize_tags(a.tag)  # a bad tag is refused before the editor opens
    try:
        entry = await find_entry(c, ctx)
    except EntryNotFound as exc:  # an --id in another layer: say where, as replace does
        raise await located(c, ctx, exc) from None
    edited = await _edit(editor, origin, entry)
    text = js_trim(edited)  # as the daemon stores it: the editor's final newline goes too
    short = render.short(entry.id)
    if not text:
        agent = f" --agent {shlex.quote(a.agent)}" if a.agent else ""  # the set the entry was found in
        raise UsageError(f"the edited text is empty; the entry is unchanged: to delete it, run memoryctl{agent} "
                         f"remove --track {a.track} --scope {a.scope} --id {short}")
    if text == entry.text and (tags is None or tags == entry.tags):
        ctx.result({"changed": False, "entry": entry}, lambda: f"no change: {short} is as it was; nothing was written")
        return
    await _still_the_same(c, ctx, entry, text)
    inp: dict[str, object] = {"track": a.track, "scope": a.scope, "id": entry.id, "text": text}
    if a.tag is not None:
        inp["tags"] = a.tag
    r = await c.replace(inp)
    ctx.result(
        r, lambda: f"replaced {short}, now version {r.entry.version} ({render.usage(r.usage)})"
    )
