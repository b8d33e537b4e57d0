"""``memoryctl watch``: one line per change to the entries a session sees, as it happens.

Runs over the async client (imported only for this verb, as memoryd_client.commands is).
Ctrl-C and SIGTERM end it quietly with status 0; the daemon going away ends it with
CONNECTION_CLOSED (status 3).
"""

from __future__ import annotations

import signal
import sys

import anyio
import msgspec
from memoryd_protocol import types as T

from . import colour, render
from .client import Client
from .errors import ConnectionClosed
from .events import WATCH_EVENTS, Event
from .running import EXIT_OK, Ctx

#: Characters of an entry's first line shown before it is cut with "…".
SHOWN_TEXT = 80

_WORDS = {"memory/added": "added", "memory/updated": "updated", "memory/removed": "removed"}
_COLOURS = {"memory/added": "green", "memory/updated": "yellow", "memory/removed": "red"}
_ENCODER = msgspec.json.Encoder()


def event_line(ev: Event, paint: colour.Paint = colour.plain) -> str:
    """``added    1a2b3c4d user/workspace  Prefers tabs…  (session s-1)``; with a colour
    ``paint``, the change in its colour and the id dim."""
    p = ev.params
    entry: T.Entry = p.entry
    lines = entry.text.splitlines() or [""]
    text = lines[0]
    if len(text) > SHOWN_TEXT or len(lines) > 1:
        text = text[:SHOWN_TEXT] + "…"
    who = f"  (session {render.one_line(p.session_id)})" if p.session_id else ""
    word = _WORDS[ev.method]
    return (f"{paint(word, _COLOURS[ev.method])}{' ' * (8 - len(word))} {paint(render.short(entry.id), 'dim')} "
            f"{entry.track}/{entry.scope}  {render.one_line(text)}{who}")


def json_line(ev: Event) -> str:
    """``{"event": "memory/added", "params": {...}}``: the notification's params as sent."""
    return _ENCODER.encode({"event": ev.method, "params": ev.params}).decode()


async def cmd_watch(c: Client, ctx: Ctx) -> int:
    import asyncio  # anyio.run's backend here; anyio has no callback-style signal handler

    scope = anyio.CancelScope()
    loop = asyncio.get_running_loop()
    # Taken here, not left to asyncio's default, for the reason memoryd_client.commands'
    # approve gives; SIGTERM too, so that a supervisor's stop is as quiet as Ctrl-C.
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, scope.cancel)
    try:
        with scope:
            await _watch(c, ctx)
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
    return EXIT_OK


async def _watch(c: Client, ctx: Ctx) -> None:
    events = c.events(*WATCH_EVENTS)  # subscribed before the watch: nothing is missed
    await c.watch()
    session = c.session or {}
    header = session.get("header") or {}
    print(f"memoryctl: watching what session {session.get('id')} (workspace {header.get('cwd')}, agent "
          f"{header.get('agentPreset') or '(shared)'}) sees at {ctx.socket} (Ctrl-C to stop)",
          file=sys.stderr, flush=True)
    paint = render.stdout_paint()
    async for ev in events:
        ctx.out(json_line(ev) if ctx.json else event_line(ev, paint))
    # The stream ends only when the connection does: the daemon stopped or dropped us.
    raise ConnectionClosed(f"stopped watching: {c.close_reason or 'the connection ended'} (memoryd at {ctx.socket})")
