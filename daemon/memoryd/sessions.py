"""Sessions belong to the connection that first names them (in a write context, a
snapshot, a proposal or a query's options), until it closes.

Meanwhile no other connection may take the session's first snapshot or create proposals
for it: otherwise any local process could decide what another live session's system prompt
shows. A frozen snapshot stays readable by all, and a write may carry any session id (it
is only a label). Nothing is stored: after a restart, the first to name a session binds it.
"""

from __future__ import annotations

from typing import Any

from memoryd_protocol.constants import DEFAULT_MAX_SESSIONS_PER_CONNECTION
from memoryd_protocol.errors import InvalidInput

from .context import Handler, Peer, RequestContext

#: Methods that name a session without binding it: watching a session is not acting as it,
#: so a watcher (memoryctl watch, say) must not keep the session's own harness from taking
#: its first snapshot.
UNBOUND_METHODS = frozenset({"memory/watch"})

def named_session(params: Any) -> str | None:
    """The session id a request's params name, wherever the method carries it."""
    sid: Any = None
    write = getattr(params, "write", None)
    if write is not None and write.agent is not None and write.agent.session is not None:
        sid = write.agent.session.id
    session = getattr(params, "session", None)
    if sid is None and session is not None:
        sid = session.id
    opts = getattr(params, "opts", None)
    if sid is None and opts is not None:
        sid = getattr(opts, "session_id", None)
    return sid if isinstance(sid, str) and sid.strip() else None


class Sessions:
    def __init__(self, max_per_connection: int = DEFAULT_MAX_SESSIONS_PER_CONNECTION) -> None:
        self._owner: dict[str, int] = {}
        self._bound: dict[int, set[str]] = {}
        #: session ids one connection may bind (max_sessions_per_connection): a request
        #: naming one more is refused, so no connection grows this table without bound
        self.max_per_connection = max_per_connection

    def bind(self, peer: Peer, session_id: str) -> None:
        """``session_id`` becomes ``peer``'s unless an open connection holds it already."""
        if session_id in self._owner:
            return
        mine = self._bound.setdefault(peer.id, set())
        if len(mine) >= self.max_per_connection:
            raise InvalidInput(f"this connection already holds {self.max_per_connection} sessions; reuse one of "
                               "their ids, open another connection, or raise max_sessions_per_connection in the "
                               "daemon's config", "session.id")
        mine.add(session_id)
        self._owner[session_id] = peer.id

    def require_own(self, peer: Peer, session_id: str, action: str) -> None:
        """Refuse ``action`` on a session that another open connection holds."""
        owner = self._owner.get(session_id)
        if owner is not None and owner != peer.id:
            shown = session_id if len(session_id) <= 128 else session_id[:128] + "…"
            raise InvalidInput(f"session {shown!r} belongs to another open connection: only that connection "
                               f"can {action}", "session.id")

    def release(self, peer: Peer) -> None:
        for session_id in self._bound.pop(peer.id, ()):
            self._owner.pop(session_id, None)

    def binding(self, handler: Handler) -> Handler:
        """``handler``, after the session its params name is bound to the calling connection."""

        async def bound(ctx: RequestContext, params: Any) -> Any:
            sid = named_session(params)
            if sid is not None:
                self.bind(ctx.peer, sid)
            return await handler(ctx, params)

        return bound
