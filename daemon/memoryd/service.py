"""The daemon's shared state and its lifecycle methods (initialize, status, watch).

One Service per daemon: the config, the writer and the read connections, the approvals,
the sessions and the watchers, and the helpers the method groups (reads, writes,
snapshots, proposals, transfer) share to read and resolve entries. Every write goes
through ``pipeline`` (pipeline.py draws its steps).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import stat
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from memoryd_protocol.constants import (
    GRID,
    PROTOCOL,
    STORE_SCHEMA_VERSION,
)
from memoryd_protocol.errors import EntryNotFound, InvalidInput
from memoryd_protocol.text import (
    js_trim,
)
from memoryd_protocol.types import (
    BudgetRow,
    DaemonStatus,
    Empty,
    Entry,
    InitializeParams,
    InitializeResult,
    ServerInfo,
    StoreInfo,
    WatchParams,
)
from memoryd_protocol.validation import (
    SessionView,
    Target,
    check_label,
    resolve_one,
    session_view,
)

from . import __version__, store
from .approvals import Approvals
from .config import Config
from .context import Handler, Peer, RequestContext
from .peers import NotThatProcess, declare_relay
from .pipeline import Pipeline
from .readers import Readers
from .sessions import Sessions
from .tx import Usage
from .watchers import Watchers
from .writer import Writer

if TYPE_CHECKING:
    from .connection import Connection
    from .replication import Replication

log = logging.getLogger("memoryd.service")
T = TypeVar("T")

def stderr_file() -> str | None:
    """The file this process's stderr (its log) is appended to, or None when stderr is not
    a regular file (a terminal, a pipe, the journal) or /proc is not there to say."""
    try:
        if not stat.S_ISREG(os.fstat(2).st_mode):
            return None
        return os.readlink("/proc/self/fd/2")
    except OSError:
        return None


class Service:
    def __init__(self, config: Config, writer: Writer, readers: Readers, approvals: Approvals) -> None:
        self.config = config
        self.writer = writer
        #: every read of the store (readers.py)
        self.readers = readers
        self.approvals = approvals
        #: which open connection each session id belongs to (sessions.py)
        self.sessions = Sessions(config)
        self.started = time.monotonic()
        #: the live connections, for ``daemon/status`` (the Daemon's own set)
        self.live: Collection[Connection] = ()
        #: Where the daemon listens, for ``daemon/status``: the socket it bound and unlinks
        #: on shutdown, set by the Daemon once bound. None while it serves no socket of its
        #: own (stdio, or a listener inherited from systemd socket activation).
        self.socket_path: Path | None = None
        #: the peers told of other connections' writes (memory/watch); an in-process
        #: front-end registers its own peers here too
        self.watchers = Watchers()
        #: Litestream's supervisor when [replicate] is configured, for ``daemon/status``
        self.replication: Replication | None = None
        #: every write goes through it (pipeline.py)
        self.pipeline = Pipeline(config, writer, approvals, watchers=self.watchers)

    # --- helpers -----------------------------------------------------------------------

    async def read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """A read of the store on a reader's thread (readers.py), after the recall
        bookkeeping queued so far."""
        await self.writer.settled()
        return await self.readers.read(fn)

    def row(self, usage: Usage, track: str, scope: str) -> BudgetRow:
        return BudgetRow(track=track, scope=scope, used=usage.get((track, scope), 0),  # type: ignore[arg-type]
                         limit=self.config.budgets[(track, scope)])

    def budget_rows(self) -> list[BudgetRow]:
        usage = self.writer.usage
        return [self.row(usage, t, s) for t, s in GRID]

    async def visible(self, view: SessionView, track: str, scope: str) -> list[Entry]:
        cell = await self.read(lambda c: store.cell_entries(c, track, scope))
        return [e for e in cell if view.sees(e.scope, e.workspace_key, e.agent_key)]

    async def resolve_target(self, view: SessionView, track: str, scope: str, target: Target) -> Entry:
        """The entry a replace/remove names: by unique substring, or by id. An id must name
        an entry of this track/scope that the session sees, exactly as a match must."""
        entries = await self.visible(view, track, scope)
        if target.match is not None:
            by_id = {e.id: e for e in entries}
            return by_id[resolve_one(((e.id, e.text) for e in entries), track, scope, target.match)]
        for e in entries:
            if e.id == target.entry_id:
                return e
        raise EntryNotFound("no visible memory entry has this id", target.details(track, scope))

    # --- lifecycle ---------------------------------------------------------------------

    async def initialize(self, ctx: RequestContext, p: InitializeParams) -> InitializeResult:
        if p.protocol is not None and p.protocol != PROTOCOL:
            raise InvalidInput(f"unsupported protocol {p.protocol!r}; this daemon speaks {PROTOCOL}", "protocol")
        if p.client is not None:
            for field, value in (("client.name", p.client.name), ("client.version", p.client.version)):
                if value is not None:
                    check_label(value, field)
        peer = ctx.peer
        if p.relay is not None:
            self._declare_relay(peer, p.relay.harness_pid)
        if p.capabilities is not None and not p.capabilities.approvals:
            # One-way: a connection that cannot approve never becomes one that can, or a
            # model-side tool could re-initialize and approve its own writes.
            peer.can_approve = False
            self.approvals.unsubscribe(peer)
        peer.client = p.client  # shown as the origin of this connection's approvals
        return InitializeResult(
            protocol=PROTOCOL,
            server=ServerInfo(name="memoryd", version=__version__),
            schema_version=STORE_SCHEMA_VERSION,
            write_policy=self.config.write_policy,  # type: ignore[arg-type]
            budgets=self.budget_rows(),
            approvers=self.config.approvers,  # type: ignore[arg-type]
        )

    @staticmethod
    def _declare_relay(peer: Peer, harness_pid: int) -> None:
        """memoryd's stdio relay says what it is: the connection is shown as its harness from
        now on, the relay's own facts kept (peers.declare_relay checks the claim)."""
        if getattr(peer, "name", None) != "socket":
            raise InvalidInput("only a connection to the daemon's socket can be its stdio relay", "relay")
        try:
            peer.peer = declare_relay(peer.peer, harness_pid)
        except NotThatProcess as exc:
            pid = peer.peer.pid if peer.peer is not None else None
            log.warning("connection %d (pid %s) said it is memoryd's stdio relay and is taken for what the kernel "
                        "says it is: %s", peer.id, pid, exc)
            raise InvalidInput(f"this connection is not memoryd's stdio relay: {exc}", "relay") from None

    async def status(self, ctx: RequestContext, p: Any) -> DaemonStatus:
        return DaemonStatus(
            version=__version__,
            uptime_s=round(time.monotonic() - self.started, 3),
            connections=len(self.live),
            pending_approvals=len(self.approvals),
            queue_depth=self.writer.depth,
            store=StoreInfo(path=str(self.config.db_path), schema_version=STORE_SCHEMA_VERSION),
            pid=os.getpid(),
            write_policy=self.config.write_policy,  # type: ignore[arg-type]
            socket=None if self.socket_path is None else str(self.socket_path),
            config=None if self.config.config_path is None else str(self.config.config_path),
            log=stderr_file(),
            connection_list=[c.listing(approver=c in self.approvals.approvers)
                             for c in sorted(self.live, key=lambda c: c.id)],
            replication=None if self.replication is None else await self.replication.status(),
        )

    async def watch(self, ctx: RequestContext, p: WatchParams) -> Empty:
        view = session_view(p.session, self.config.workspace_aliases)
        if view.session_id is not None and not js_trim(view.session_id):
            raise InvalidInput("session.id is required", "session.id")
        self.watchers.watch(ctx.peer, view)
        return Empty()

    def handlers(self) -> dict[str, Handler]:
        return {
            "initialize": self.initialize,
            **self.approvals.handlers(),
            "daemon/status": self.status,
            "memory/watch": self.watch,
        }
