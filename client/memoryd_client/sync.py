"""The blocking client for scripts: the async client driven through an anyio blocking portal.

The portal runs an event loop in a background thread; each method blocks the calling thread
until the answer arrives. A plain-function ``on_approval`` handler (and every listener given
to :meth:`SyncClient.on`) runs in a worker thread, so it may prompt, block, and call this
client's methods.
"""

from __future__ import annotations

import builtins
import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from types import TracebackType
from typing import Any

import anyio
from anyio.from_thread import BlockingPortal, start_blocking_portal
from memoryd_protocol import types as T
from memoryd_protocol.approval_types import ApprovalChallenge
from memoryd_protocol.audit_types import AuditAccepted
from memoryd_protocol.snapshot_types import SnapshotPruneResult

from .client import _DEFAULT, Client, Event, EventStream, SessionLike, connect
from .errors import ConnectionClosed


class SyncEventStream:
    """Blocking view of an :class:`EventStream`: ``receive(timeout)``, or iterate until the
    connection closes."""

    def __init__(self, portal: BlockingPortal, stream: EventStream) -> None:
        self._portal = portal
        self._stream = stream

    def receive(self, timeout: float | None = None) -> Event:
        return self._portal.call(self._stream.receive, timeout)

    def __iter__(self) -> Iterator[Event]:
        while True:
            try:
                yield self.receive()
            except ConnectionClosed:
                return

    def close(self) -> None:
        self._portal.call(self._stream.close)

    def __enter__(self) -> SyncEventStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SyncClient:
    """Blocking twin of :class:`Client`: same methods, same results, same exceptions."""

    def __init__(self, path: str | Path | None = None, **kwargs: Any) -> None:
        self._closed = False
        self._portal_cm: AbstractContextManager[BlockingPortal] = start_blocking_portal("asyncio")
        self._portal = self._portal_cm.__enter__()
        try:
            self._conn_cm: AbstractContextManager[Client] = self._portal.wrap_async_context_manager(
                connect(path, **kwargs)
            )
            self._client = self._conn_cm.__enter__()
        except BaseException as exc:
            self._portal_cm.__exit__(type(exc), exc, exc.__traceback__)
            raise

    # --- lifecycle ---------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection and stop the portal's event loop (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._conn_cm.__exit__(None, None, None)
        finally:
            self._portal_cm.__exit__(None, None, None)

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @property
    def client(self) -> Client:
        """The underlying async client (use only from the portal's loop)."""
        return self._client

    @property
    def server(self) -> T.InitializeResult | None:
        return self._client.server

    @property
    def session(self) -> dict[str, Any] | None:
        return self._client.session

    @property
    def peer_pid(self) -> int | None:
        return self._client.peer_pid

    @property
    def closed(self) -> bool:
        return self._closed or self._client.closed

    def _run(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self._closed:
            raise ConnectionClosed("client closed")
        return self._portal.call(functools.partial(func, *args, **kwargs))

    # --- events ------------------------------------------------------------------------

    def on(self, method: str, callback: Callable[[Event], Any]) -> Callable[[], None]:
        """Call ``callback(event)`` in a worker thread for every ``method`` notification
        (``"*"``: all). Returns a function that removes the listener."""

        async def in_thread(event: Event) -> None:
            await anyio.to_thread.run_sync(callback, event)

        off: Callable[[], None] = self._portal.call(self._client.on, method, in_thread)
        return lambda: self._portal.call(off)

    def events(self, *methods: str) -> SyncEventStream:
        return SyncEventStream(self._portal, self._portal.call(functools.partial(self._client.events, *methods)))

    # --- the daemon's methods ----------------------------------------------------------

    def call(self, method: str, params: Any = None, **kwargs: Any) -> Any:
        return self._run(self._client.call, method, params, **kwargs)

    def notify(self, method: str, params: Any = None) -> None:
        self._run(self._client.notify, method, params)

    def initialize(self, **kwargs: Any) -> T.InitializeResult:
        return self._run(self._client.initialize, **kwargs)  # type: ignore[no-any-return]

    def add(self, input: Mapping[str, Any] | T.EntryInput, write: Any = None) -> T.WriteResult:
        return self._run(self._client.add, input, write)  # type: ignore[no-any-return]

    def replace(self, input: Mapping[str, Any] | T.ReplaceInput, write: Any = None) -> T.ReplaceResult:
        return self._run(self._client.replace, input, write)  # type: ignore[no-any-return]

    def remove(self, input: Mapping[str, Any] | T.RemoveInput, write: Any = None) -> T.WriteResult:
        return self._run(self._client.remove, input, write)  # type: ignore[no-any-return]

    def consolidate(self, input: Mapping[str, Any] | T.ConsolidateInput, write: Any = None) -> T.ConsolidateResult:
        return self._run(self._client.consolidate, input, write)  # type: ignore[no-any-return]

    def seed(self, inputs: Sequence[Mapping[str, Any] | T.EntryInput], write: Any = None) -> T.SeedResult:
        return self._run(self._client.seed, inputs, write)  # type: ignore[no-any-return]

    def query(self, filter: Any = None, opts: Any = _DEFAULT) -> T.QueryResult:
        """Without ``opts``, the session's visible set (see :attr:`Client.query_opts`)."""
        return self._run(self._client.query, filter, opts)  # type: ignore[no-any-return]

    def budgets(self) -> builtins.list[T.BudgetRow]:
        return self._run(self._client.budgets)  # type: ignore[no-any-return]

    def list(self) -> builtins.list[T.Entry]:
        return self._run(self._client.list)  # type: ignore[no-any-return]

    def audit_list(self, limit: int | None = None) -> builtins.list[T.AuditRow]:
        return self._run(self._client.audit_list, limit)  # type: ignore[no-any-return]

    def audit_verify(self, heads: Sequence[tuple[int, str]] = ()) -> T.LedgerReport:
        return self._run(self._client.audit_verify, heads)  # type: ignore[no-any-return]

    def audit_accept(self, n: int) -> AuditAccepted:
        return self._run(self._client.audit_accept, n)  # type: ignore[no-any-return]

    def snapshots_prune(self, before: int | None = None) -> SnapshotPruneResult:
        return self._run(self._client.snapshots_prune, before)  # type: ignore[no-any-return]

    def audit_explain(self, target: str) -> T.EntryLife:
        return self._run(self._client.audit_explain, target)  # type: ignore[no-any-return]

    def snapshot(self, session: SessionLike | None = None, language: str | None = None) -> T.SnapshotResult:
        return self._run(self._client.snapshot, session, language)  # type: ignore[no-any-return]

    def watch(self, session: SessionLike | None = None) -> T.Empty:
        """``memory/watch``; receive the events with :meth:`on` or :meth:`events`."""
        return self._run(self._client.watch, session)  # type: ignore[no-any-return]

    def export(self, adapter: str | None = None) -> Any:
        return self._run(self._client.export, adapter)

    def import_(
        self,
        envelope: Any = None,
        adapter: str | None = None,
        payload: Any = None,
        write: Any = None,
        *,
        skip_existing: bool | None = None,
        track: str | None = None,
        scope: str | None = None,
    ) -> T.SeedResult:
        return self._run(  # type: ignore[no-any-return]
            self._client.import_, envelope, adapter, payload, write, skip_existing=skip_existing, track=track,
            scope=scope,
        )

    def adapters_list(self) -> builtins.list[T.AdapterInfo]:
        return self._run(self._client.adapters_list)  # type: ignore[no-any-return]

    def proposals_create(self, input: Any, session: SessionLike | None = None) -> T.Proposal | None:
        return self._run(self._client.proposals_create, input, session)  # type: ignore[no-any-return]

    def proposals_list(self, status: str | None = None) -> builtins.list[T.Proposal]:
        return self._run(self._client.proposals_list, status)  # type: ignore[no-any-return]

    def proposals_approve(self, id: str, write: Any = None) -> T.ProposalApproveResult:
        return self._run(self._client.proposals_approve, id, write)  # type: ignore[no-any-return]

    def proposals_dismiss(self, id: str) -> T.Proposal:
        return self._run(self._client.proposals_dismiss, id)  # type: ignore[no-any-return]

    def approval_decided(self, id: str, outcome: str, by: T.ApprovalBy | Mapping[str, Any] | None = None) -> T.Empty:
        return self._run(self._client.approval_decided, id, outcome, by)  # type: ignore[no-any-return]

    def approval_subscribe(self, proof: str | None = None) -> T.Empty:
        return self._run(self._client.approval_subscribe, proof)  # type: ignore[no-any-return]

    def approval_challenge(self) -> ApprovalChallenge:
        return self._run(self._client.approval_challenge)  # type: ignore[no-any-return]

    def approval_prove(self, proof: str) -> T.Empty:
        return self._run(self._client.approval_prove, proof)  # type: ignore[no-any-return]

    def prove_approver_key(self, key: str | Path | None = None, *, subscribe: bool = False) -> None:
        self._run(self._client.prove_approver_key, key, subscribe=subscribe)

    def status(self) -> T.DaemonStatus:
        return self._run(self._client.status)  # type: ignore[no-any-return]


def connect_sync(path: str | Path | None = None, **kwargs: Any) -> SyncClient:
    """Blocking :func:`connect`: same keyword arguments; use as a context manager or call
    ``close()``."""
    return SyncClient(path, **kwargs)


__all__ = ["SyncClient", "SyncEventStream", "connect_sync"]
