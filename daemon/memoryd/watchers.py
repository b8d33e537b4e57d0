"""Watchers: peers told about the committed writes of entries their sessions can see.

A watcher is any :class:`~memoryd.context.Peer` that sent ``memory/watch`` (a socket or stdio
connection, or an in-process front-end's peer). ``peer.notify`` must never wait
(``Connection.notify`` queues the line and returns): the broadcast runs on the writer's
request, so a watcher that does not read must cost the writer nothing. A connection whose
unsent output passes ``max_buffered_bytes`` is dropped by its transport, which ends its
watches with the connection.
"""

from __future__ import annotations

from collections.abc import Sequence

from memoryd_protocol.constants import MAX_WATCHED_SESSIONS
from memoryd_protocol.errors import InvalidInput
from memoryd_protocol.types import EntryEvent, MemoryUpdated
from memoryd_protocol.validation import SessionView

from .context import Peer


def _seen(views: Sequence[SessionView], event: EntryEvent) -> bool:
    # An update is sent when the watcher sees the entry before or after it: either way the
    # watcher's picture changes. (A replace keeps the entry's keys today, so both agree.)
    entries = (event.previous, event.entry) if isinstance(event, MemoryUpdated) else (event.entry,)
    return any(v.sees(e.scope, e.workspace_key, e.agent_key) for v in views for e in entries)


class Watchers:
    def __init__(self) -> None:
        #: peer → its watched sessions (session id → the view), in the order watched
        self._watching: dict[Peer, dict[str, SessionView]] = {}

    def watch(self, peer: Peer, view: SessionView) -> None:
        """``peer`` gets ``memory/added``, ``memory/updated`` and ``memory/removed`` for every
        committed write, by anyone, of an entry ``view`` sees. The same session id again
        replaces that watch's view; a new one beyond ``MAX_WATCHED_SESSIONS`` is refused."""
        session_id = view.session_id
        if not session_id:
            raise InvalidInput("session.id is required", "session.id")
        mine = self._watching.get(peer, {})
        if session_id not in mine and len(mine) >= MAX_WATCHED_SESSIONS:
            raise InvalidInput(f"this connection already watches {MAX_WATCHED_SESSIONS} sessions, the most one "
                               f"connection may (MAX_WATCHED_SESSIONS)", "session.id")
        mine[session_id] = view
        self._watching[peer] = mine

    def drop(self, peer: Peer) -> None:
        self._watching.pop(peer, None)

    def sessions(self, peer: Peer) -> list[str]:
        """The session ids ``peer`` watches, in the order it first watched them."""
        return list(self._watching.get(peer, ()))

    def __len__(self) -> int:
        """Peers watching at least one session."""
        return len(self._watching)

    async def broadcast(self, origin: Peer, events: Sequence[tuple[str, EntryEvent]]) -> None:
        """Once per commit, after ``origin`` (the writing peer) got its own events."""
        if not self._watching or not events:
            return
        # ``origin`` already has every event of its write (the pipeline sent them): never twice.
        for peer, watched in list(self._watching.items()):
            if peer is origin:
                continue
            views = list(watched.values())
            for method, event in events:
                if _seen(views, event):
                    await peer.notify(method, event)
