"""Notifications as the client hands them on: :class:`Event`, and :class:`EventStream`, the
buffered async iterator a connection feeds.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, Final, Protocol, TypeAlias

import anyio
from memoryd_protocol import types as T

from .errors import ConnectionClosed, Timeout

log = logging.getLogger("memoryd_client")

#: Events buffered per :meth:`Client.events` stream before new ones are dropped (logged).
EVENT_BUFFER: Final = 10_000

#: Every notification the daemon sends (wire-v1.md §5, §6).
EVENT_METHODS: Final = frozenset(T.NOTIFICATIONS)
#: The events :meth:`Client.watch` subscribes to, for ``c.events(*WATCH_EVENTS)``.
WATCH_EVENTS: Final = ("memory/added", "memory/updated", "memory/removed")

Listener: TypeAlias = "Callable[[Event], Any]"


@dataclass(frozen=True, slots=True)
class Event:
    """One notification from the daemon. ``params`` is the protocol Struct for known methods
    (``types.MemoryAdded``, ``types.ApprovalAsked``, ...), plain JSON for anything else."""

    method: str
    params: Any


class _Source(Protocol):
    """What a stream needs of its connection: a protocol, as the connection's module imports this one."""

    @property
    def closed(self) -> bool: ...

    _streams: list[EventStream]


class EventStream:
    """Events as an async iterator (and a queue: :meth:`receive`). Subscribed from creation
    on, so nothing sent after ``c.events()`` returns is missed; ends when the connection
    closes (after the buffered events) or on :meth:`close`."""

    def __init__(self, client: _Source, methods: frozenset[str]) -> None:
        self._client = client
        self.methods = methods
        self._buffer: deque[Event] = deque()
        self._wakeup = anyio.Event()
        self._ended = client.closed
        if not self._ended:
            client._streams.append(self)

    def _offer(self, event: Event) -> None:
        if self._ended or (self.methods and event.method not in self.methods):
            return
        if len(self._buffer) >= EVENT_BUFFER:
            log.warning("event stream full (%d); dropping %s", EVENT_BUFFER, event.method)
            return
        self._buffer.append(event)
        self._wakeup.set()

    def _end(self) -> None:
        self._ended = True
        self._wakeup.set()

    async def _next(self) -> Event | None:
        while not self._buffer:
            if self._ended:
                return None
            self._wakeup = anyio.Event()
            await self._wakeup.wait()
        return self._buffer.popleft()

    async def receive(self, timeout: float | None = None) -> Event:  # noqa: ASYNC109 - a queue's receive(timeout)
        """The next event; :class:`Timeout` after ``timeout`` seconds, :class:`ConnectionClosed`
        once the stream has ended."""
        try:
            with anyio.fail_after(timeout):
                event = await self._next()
        except TimeoutError:
            raise Timeout(f"no event within {timeout}s", {"timeout": timeout}) from None
        if event is None:
            raise ConnectionClosed("event stream ended")
        return event

    def close(self) -> None:
        """Stop receiving; buffered events are dropped."""
        with suppress(ValueError):
            self._client._streams.remove(self)
        self._buffer.clear()
        self._end()

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> Event:
        event = await self._next()
        if event is None:
            raise StopAsyncIteration
        return event

    async def __aenter__(self) -> EventStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


__all__ = ["EVENT_BUFFER", "EVENT_METHODS", "WATCH_EVENTS", "Event", "EventStream", "Listener"]
