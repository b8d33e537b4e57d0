"""The protocol's structured errors: one class per code, one way onto and off the wire.

Messages are English and stable (they are audit contracts); callers branch on ``code``.
Messages never contain memory text: details carry match strings and samples only where the
wire contract asks for them.
"""

from __future__ import annotations

from typing import Any, ClassVar

from .constants import ERROR_CODES, INTERNAL_ERROR, RPC_LEVEL_CODES


class ProtocolError(Exception):
    """Base of every error that crosses the wire with a ``data.code``."""

    CODE: ClassVar[str] = "INTERNAL_ERROR"
    RPC_CODE: ClassVar[int] = INTERNAL_ERROR

    def __init_subclass__(cls, code: str | None = None, **kwargs: Any) -> None:
        # A class names its code once (``class X(ProtocolError, code="...")``); the JSON-RPC
        # code comes from the one table, so the two cannot drift apart.
        super().__init_subclass__(**kwargs)
        if code is not None:
            cls.CODE, cls.RPC_CODE = code, ERROR_CODES[code]

    def __init__(self, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = details if details is not None else {}

    @property
    def code(self) -> str:
        return self.CODE

    @property
    def rpc_code(self) -> int:
        return self.RPC_CODE

    def to_wire(self) -> dict[str, Any]:
        """The JSON-RPC ``error`` object."""
        return {
            "code": self.rpc_code,
            "message": self.message,
            "data": {"code": self.code, "message": self.message, "details": self.details},
        }

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, details={self.details!r})"


class InvalidInput(ProtocolError, code="INVALID_INPUT"):
    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message, {"field": field} if field else {})


class WriteRequiresAgent(ProtocolError, code="WRITE_REQUIRES_AGENT"):
    def __init__(self, message: str = "write requires an agent session", details: dict[str, Any] | None = None) -> None:
        super().__init__(message, details or {})


class BudgetExceeded(ProtocolError, code="BUDGET_EXCEEDED"):
    pass


class EntryNotFound(ProtocolError, code="ENTRY_NOT_FOUND"):
    pass


class AmbiguousMatch(ProtocolError, code="AMBIGUOUS_MATCH"):
    #: how many candidates' ids ``details.ids`` carries, so the caller can name one by id
    MAX_IDS: ClassVar[int] = 10


class WriteDenied(ProtocolError, code="WRITE_DENIED"):
    pass


class ProposalNotFound(ProtocolError, code="PROPOSAL_NOT_FOUND"):
    pass


class StoreCorrupt(ProtocolError, code="STORE_CORRUPT"):
    pass


class StoreUnsupportedVersion(ProtocolError, code="STORE_UNSUPPORTED_VERSION"):
    pass


class StoreUnavailable(ProtocolError, code="STORE_UNAVAILABLE"):
    """The store cannot take a write right now (``details``: ``reason``, one of busy, full,
    readonly, io, and ``path``). Reads may still work; a busy or full store recovers by
    itself once the other writer lets go or space is freed."""


class StoreLocked(ProtocolError, code="STORE_LOCKED"):
    """Another memoryd owns the store (``details``: ``path``, and the holder's ``pid`` and
    ``socket`` when it recorded them)."""


class AdapterNotFound(ProtocolError, code="ADAPTER_NOT_FOUND"):
    pass


class AdapterPayload(ProtocolError, code="ADAPTER_PAYLOAD"):
    pass


class RpcError(ProtocolError):
    """A JSON-RPC-level failure (parse error, invalid request, unknown method, internal)."""

    def __init__(self, rpc_code: int, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message, details)
        self._rpc_code = rpc_code

    @property
    def code(self) -> str:
        return RPC_LEVEL_CODES.get(self._rpc_code, "INTERNAL_ERROR")

    @property
    def rpc_code(self) -> int:
        return self._rpc_code


#: data.code → its class: every protocol error class, one per code of constants.ERROR_CODES
#: (tests/test_error_table.py checks each code has one, and every list of them).
_BY_CODE: dict[str, type[ProtocolError]] = {
    cls.CODE: cls for cls in ProtocolError.__subclasses__() if cls.CODE in ERROR_CODES}


def from_wire(error: Any) -> ProtocolError:
    """Rebuild the typed exception from a JSON-RPC ``error`` object."""
    if not isinstance(error, dict):
        return RpcError(INTERNAL_ERROR, "malformed error object")
    rpc_code = error.get("code")
    message = str(error.get("message", ""))
    data = error.get("data")
    code = data.get("code") if isinstance(data, dict) else None
    details = data.get("details") if isinstance(data, dict) else None
    if not isinstance(details, dict):
        details = {}
    cls = _BY_CODE.get(code) if isinstance(code, str) else None
    if cls is None:
        return RpcError(rpc_code if isinstance(rpc_code, int) else INTERNAL_ERROR, message, details)
    exc = cls.__new__(cls)
    ProtocolError.__init__(exc, message, details)
    return exc


__all__ = [
    "AdapterNotFound",
    "AdapterPayload",
    "AmbiguousMatch",
    "BudgetExceeded",
    "EntryNotFound",
    "InvalidInput",
    "ProposalNotFound",
    "ProtocolError",
    "RpcError",
    "StoreCorrupt",
    "StoreLocked",
    "StoreUnavailable",
    "StoreUnsupportedVersion",
    "WriteDenied",
    "WriteRequiresAgent",
    "from_wire",
]
