"""What approvals carry: the outcome an approval handler returns, who decided, and the call
an ask is about. Plain values and pure helpers; the connection does the asking and answering.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

import msgspec
from memoryd_protocol import types as T
from memoryd_protocol.constants import ALLOWED_ONCE

#: ``on_approval(asked)`` or ``on_approval(asked, call)``: ``call`` is the :class:`ApprovalCall`
#: that asked, or None.
ApprovalHandler: TypeAlias = (
    "Callable[[T.ApprovalAsked], str | bool | Decision | Awaitable[str | bool | Decision | None] | None]"
    " | Callable[[T.ApprovalAsked, ApprovalCall | None],"
    " str | bool | Decision | Awaitable[str | bool | Decision | None] | None]"
)

#: A client-side event (not a daemon notification): this connection answered an approval.
#: Its params are a :class:`Decided`; with ``approval/asked`` it is the approval pair a
#: harness appends to its session log.
DECIDED: Final = "approval/decided"


@dataclass(frozen=True, slots=True)
class Decided:
    """What this client answered to ``approval/asked`` ``id``; ``refused`` is the error code
    when the daemon did not take the decision (already decided elsewhere, timed out)."""

    id: str
    outcome: str
    refused: str | None = None
    #: who decided, as this client claimed it in ``approval/decided``
    by: T.ApprovalBy | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    """What an approval handler may return instead of a bare outcome: the outcome, and who
    decided (``approval/decided``'s ``by``: a human at a prompt, a policy, a script), which
    the daemon keeps with the decision. ``by`` may be a :class:`types.ApprovalBy` or a mapping
    ``{"kind": ..., "name": ...}``."""

    outcome: str | bool
    by: T.ApprovalBy | Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class ApprovalCall:
    """The call of this connection that an ``approval/asked`` is about: the ask's
    ``requestId`` is that request's JSON-RPC id. ``params`` are the params as sent (plain
    JSON). A two-argument approval handler gets it (None when the ask names no call of this
    connection, e.g. at an approver)."""

    request_id: int | str
    method: str
    params: Any


def _takes_call(handler: Callable[..., Any]) -> bool:
    """Whether an approval handler takes a second positional argument (the asking call);
    one-argument handlers keep working as they are."""
    try:
        params = inspect.signature(handler).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = 0
    for p in params:
        if p.kind is inspect.Parameter.VAR_POSITIONAL:
            return True
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
            positional += 1
    return positional >= 2


def _by(value: T.ApprovalBy | Mapping[str, Any] | None) -> T.ApprovalBy | None:
    return value if value is None or isinstance(value, T.ApprovalBy) else msgspec.convert(value, T.ApprovalBy)


def _outcome(value: Any) -> str:
    """What a handler returned, as an approval outcome: ``True`` approves, a string is sent as
    is (only ``"allowed-once"`` lets the write through), anything else rejects."""
    if isinstance(value, Decision):
        return _outcome(value.outcome)
    if value is True:
        return ALLOWED_ONCE
    if isinstance(value, str) and value:
        return value
    return "rejected"


__all__ = ["DECIDED", "ApprovalCall", "ApprovalHandler", "Decided", "Decision"]
