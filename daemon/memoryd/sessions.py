"""Sessions belong to the connection that first names them (in a write context, a
snapshot, a proposal or a query's options), until it closes.

Meanwhile no other connection may take the session's first snapshot or create proposals
for it: otherwise any local process could decide what another live session's system prompt
shows. A frozen snapshot stays readable by all, and a write may carry any session id (it
is only a label). Nothing is stored: after a restart, the first to name a session binds it.

It also counts the new sessions' first snapshots each connection (for its life) and each
peer process (over the last minute) takes: each is a row the store keeps until pruned.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

from memoryd_protocol.errors import InvalidInput

from .config import Config
from .context import Handler, Peer, RequestContext

#: Methods that name a session without binding it: watching a session is not acting as it,
#: so a watcher (memoryctl watch, say) must not keep the session's own harness from taking
#: its first snapshot.
UNBOUND_METHODS = frozenset({"memory/watch"})
#: the window of max_new_snapshots_per_minute, in seconds
NEW_SNAPSHOT_WINDOW_S = 60.0
#: processes whose window is kept before the idle ones are forgotten
_PROCESSES_KEPT = 1024


def shown(session_id: str) -> str:
    """A session id as an error message names it (a long one cut)."""
    return session_id if len(session_id) <= 128 else session_id[:128] + "…"


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
    def __init__(self, config: Config) -> None:
        self._owner: dict[str, int] = {}
        self._bound: dict[int, set[str]] = {}
        #: its max_sessions_per_connection (a request naming one session more is refused, so no
        #: connection grows this table without bound) and max_new_snapshots_per_connection and
        #: _per_minute (each first snapshot is a row kept until pruned, so a loop of fresh
        #: session ids would fill max_snapshots for everyone)
        self._config = config
        self._taken: dict[int, int] = {}
        self._recent: dict[object, deque[float]] = {}

    def held(self) -> frozenset[str]:
        """The session ids an open connection holds: sessions that have not ended."""
        return frozenset(self._owner)

    def admit_first_snapshot(self, peer: Peer) -> Callable[[], None]:
        """Count a new session's first snapshot against ``peer``'s connection and process,
        or refuse it (INVALID_INPUT naming the key); the callable takes the count back,
        for a snapshot that was not taken after all."""
        taken = self._taken.get(peer.id, 0)
        cap = self._config.max_new_snapshots_per_connection
        if taken >= cap:
            raise InvalidInput(f"this connection already took {cap} new sessions' first snapshots "
                               "(max_new_snapshots_per_connection); reuse one of their ids, open another connection, "
                               "or raise max_new_snapshots_per_connection in the daemon's config", "session.id")
        process: object = ("connection", peer.id)
        if peer.peer is not None and peer.peer.pid is not None:
            process = peer.peer.pid
        now = time.monotonic()
        recent = self._recent.get(process)
        if recent is None:
            if len(self._recent) >= _PROCESSES_KEPT:
                self._forget_idle(now)
            recent = self._recent[process] = deque()
        while recent and recent[0] <= now - NEW_SNAPSHOT_WINDOW_S:
            recent.popleft()
        cap = self._config.max_new_snapshots_per_minute
        if len(recent) >= cap:
            raise InvalidInput(f"this process already took {cap} new sessions' first snapshots in the "
                               "last minute (max_new_snapshots_per_minute); retry in a minute, reuse the id of a "
                               "session that has one, or raise max_new_snapshots_per_minute in the daemon's config",
                               "session.id")
        self._taken[peer.id] = taken + 1
        recent.append(now)

        def undo() -> None:
            if peer.id in self._taken:
                self._taken[peer.id] -= 1
            if now in recent:
                recent.remove(now)

        return undo

    def _forget_idle(self, now: float) -> None:
        for process in [p for p, times in self._recent.items() if not times or times[-1] <= now - NEW_SNAPSHOT_WINDOW_S]:
            del self._recent[process]

    def bind(self, peer: Peer, session_id: str) -> None:
        """``session_id`` becomes ``peer``'s unless an open connection holds it already."""
        if session_id in self._owner:
            return
        mine = self._bound.setdefault(peer.id, set())
        cap = self._config.max_sessions_per_connection
        if len(mine) >= cap:
            raise InvalidInput(f"this connection already holds {cap} sessions; reuse one of "
                               "their ids, open another connection, or raise max_sessions_per_connection in the "
                               "daemon's config", "session.id")
        mine.add(session_id)
        self._owner[session_id] = peer.id

    def require_own(self, peer: Peer, session_id: str, action: str) -> None:
        """Refuse ``action`` on a session that another open connection holds."""
        owner = self._owner.get(session_id)
        if owner is not None and owner != peer.id:
            raise InvalidInput(f"session {shown(session_id)!r} belongs to another open connection: only that connection "
                               f"can {action}", "session.id")

    def release(self, peer: Peer) -> None:
        self._taken.pop(peer.id, None)
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
