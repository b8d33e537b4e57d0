"""The blocking client for scripts: the async client driven through an anyio blocking portal.

The portal runs an event loop in a background thread; each method blocks the calling thread
until the answer arrives. A plain-function ``on_approval`` handler (and every listener given
to :meth:`SyncClient.on`) runs in a worker thread, so it may prompt, block, and call this
client's methods.

Each daemon method is one line, ``name = _Blocking(Client.name)``: the async method's
signature, result type and docstring carry over, so mypy checks the blocking calls as
precisely as the async ones, and a test fails when a coroutine of :class:`Client` has no line.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Coroutine, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from types import TracebackType
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

import anyio
from anyio.from_thread import BlockingPortal, start_blocking_portal
from memoryd_protocol import types as T

from .client import Client, connect
from .errors import ConnectionClosed
from .events import Event, EventStream

P = ParamSpec("P")
R = TypeVar("R")


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


class _Blocking(Generic[P, R]):
    """A :class:`SyncClient` method made from one of :class:`Client`'s coroutines: it runs
    the coroutine on the portal's loop and blocks until it returns or raises (the
    coroutine's own exception)."""

    def __init__(self, method: Callable[Concatenate[Client, P], Coroutine[Any, Any, R]]) -> None:
        self.method = method
        self.name = method.__name__
        self.__doc__ = method.__doc__
        self._signature: inspect.Signature | None = None

    def __set_name__(self, owner: type[Any], name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type[Any]) -> _Blocking[P, R]: ...
    @overload
    def __get__(self, obj: SyncClient, owner: type[Any]) -> Callable[P, R]: ...
    def __get__(self, obj: SyncClient | None, owner: type[Any]) -> _Blocking[P, R] | Callable[P, R]:
        if obj is None:
            return self
        method = self.method

        def blocking(*args: P.args, **kwargs: P.kwargs) -> R:
            client = obj._live()

            async def run() -> R:
                return await method(client, *args, **kwargs)

            return obj._portal.call(run)

        if self._signature is None:
            # help() and editors show the async method's parameters, less its self.
            sig = inspect.signature(method)
            self._signature = sig.replace(parameters=list(sig.parameters.values())[1:])
        blocking.__name__ = blocking.__qualname__ = self.name
        blocking.__doc__ = self.__doc__
        blocking.__signature__ = self._signature  # type: ignore[attr-defined]
        return blocking

    def __call__(self, obj: SyncClient, /, *args: P.args, **kwargs: P.kwargs) -> R:
        """``SyncClient.add(c, ...)``, as for any method looked up on the class."""
        return self.__get__(obj, type(obj))(*args, **kwargs)


class SyncClient:
    """Blocking :class:`Client`: same methods, same results, same exceptions."""

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

    def _live(self) -> Client:
        if self._closed:
            raise ConnectionClosed("client closed")
        return self._client

    # --- events ------------------------------------------------------------------------

    def on(self, method: str, callback: Callable[[Event], Any]) -> Callable[[], None]:
        """Call ``callback(event)`` in a worker thread for every ``method`` notification
        (``"*"``: all). Returns a function that removes the listener."""

        async def in_thread(event: Event) -> None:
            await anyio.to_thread.run_sync(callback, event)

        off: Callable[[], None] = self._portal.call(self._client.on, method, in_thread)
        return lambda: self._portal.call(off)

    def events(self, *methods: str) -> SyncEventStream:
        client = self._client
        return SyncEventStream(self._portal, self._portal.call(lambda: client.events(*methods)))

    # --- the daemon's methods: Client's coroutines, blocking ---------------------------

    call = _Blocking(Client.call)
    notify = _Blocking(Client.notify)
    wait_closed = _Blocking(Client.wait_closed)
    initialize = _Blocking(Client.initialize)
    add = _Blocking(Client.add)
    replace = _Blocking(Client.replace)
    remove = _Blocking(Client.remove)
    consolidate = _Blocking(Client.consolidate)
    seed = _Blocking(Client.seed)
    query = _Blocking(Client.query)
    budgets = _Blocking(Client.budgets)
    list = _Blocking(Client.list)
    audit_list = _Blocking(Client.audit_list)
    audit_verify = _Blocking(Client.audit_verify)
    audit_accept = _Blocking(Client.audit_accept)
    audit_explain = _Blocking(Client.audit_explain)
    snapshots_prune = _Blocking(Client.snapshots_prune)
    snapshot = _Blocking(Client.snapshot)
    watch = _Blocking(Client.watch)
    export = _Blocking(Client.export)
    import_ = _Blocking(Client.import_)
    adapters_list = _Blocking(Client.adapters_list)
    proposals_create = _Blocking(Client.proposals_create)
    proposals_list = _Blocking(Client.proposals_list)
    proposals_approve = _Blocking(Client.proposals_approve)
    proposals_dismiss = _Blocking(Client.proposals_dismiss)
    approval_decided = _Blocking(Client.approval_decided)
    approval_subscribe = _Blocking(Client.approval_subscribe)
    approval_challenge = _Blocking(Client.approval_challenge)
    approval_prove = _Blocking(Client.approval_prove)
    prove_approver_key = _Blocking(Client.prove_approver_key)
    status = _Blocking(Client.status)


def connect_sync(path: str | Path | None = None, **kwargs: Any) -> SyncClient:
    """Blocking :func:`connect`: same keyword arguments; use as a context manager or call
    ``close()``."""
    return SyncClient(path, **kwargs)


__all__ = ["SyncClient", "SyncEventStream", "connect_sync"]
