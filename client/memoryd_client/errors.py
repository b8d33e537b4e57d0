"""Errors a client can raise.

Two families, on purpose:

* :class:`memoryd_protocol.errors.ProtocolError` and its subclasses (``BudgetExceeded``,
  ``AmbiguousMatch``, ``WriteDenied``, ...): the daemon answered and said no. They are rebuilt
  from the wire's ``data.code`` by :func:`memoryd_protocol.errors.from_wire`, so ``.code`` and
  ``.details`` are exactly what the daemon sent. The package re-exports them.
* :class:`ClientError` and its subclasses: the answer never arrived (no daemon, the
  connection dropped, the wait timed out, the answer was not understood). They carry a
  ``.code`` and ``.details`` too, so a caller can print either family the same way.
"""

from __future__ import annotations

from typing import Any, ClassVar


class ClientError(Exception):
    """Base of the client-side failures: the daemon's answer did not arrive or was unusable."""

    CODE: ClassVar[str] = "CLIENT_ERROR"

    def __init__(self, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = details if details is not None else {}

    @property
    def code(self) -> str:
        return self.CODE

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, details={self.details!r})"


class ConnectFailed(ClientError, ConnectionError):
    """No daemon accepted the connection (socket missing, refused, permission denied)."""

    CODE = "CONNECT_FAILED"


class ConnectionClosed(ClientError, ConnectionError):
    """The connection dropped; every call still waiting for an answer fails with this."""

    CODE = "CONNECTION_CLOSED"


class Timeout(ClientError, TimeoutError):
    """No answer within the call's timeout. The request may still complete on the daemon."""

    CODE = "TIMEOUT"


class BadResponse(ClientError):
    """The daemon's answer does not fit the wire contract (wire-v1.md) for that method."""

    CODE = "BAD_RESPONSE"


class ApproverKeyUnusable(ClientError):
    """The approver key (``approvers = "keyed"``) cannot be read here: missing, not private,
    or no key; the message says which, and what to do."""

    CODE = "APPROVER_KEY"


class ApproverRelayed(ClientError):
    """The daemon's ``approval/challenge`` names another process than this one, or this pid
    without a start time: something may relay the connection (a proxy at the socket path), so
    the approver key was not used.
    ``details``: ``pid`` (the daemon's view), ``ownPid``, ``socketPid`` (SO_PEERCRED)."""

    CODE = "APPROVER_RELAYED"


__all__ = [
    "ApproverKeyUnusable",
    "ApproverRelayed",
    "BadResponse",
    "ClientError",
    "ConnectFailed",
    "ConnectionClosed",
    "Timeout",
]
