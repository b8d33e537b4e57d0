"""Values to and from the wire: a ``result`` decoded into its protocol Struct, and any Struct
(or a session given loosely) back to plain JSON for sending.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, TypeAlias

import msgspec
from memoryd_protocol import methods
from memoryd_protocol import types as T

from .errors import BadResponse

#: A session: ``{"id": ..., "header": {"cwd": ..., "agentPreset": ...}}``, a ``types.Session``,
#: or just the id.
SessionLike: TypeAlias = "Mapping[str, Any] | T.Session | str"

_ANY: Final = msgspec.json.Decoder()


class Decoders:
    """One msgspec decoder per name of a table of types (a method's result, a notification's
    params), each made the first time its name is decoded: making one walks its Structs, and
    a process meets only a few of the names."""

    def __init__(self, types: Mapping[str, Any]) -> None:
        self._types = types
        self._made: dict[str, msgspec.json.Decoder[Any]] = {}

    def get(self, name: str) -> msgspec.json.Decoder[Any] | None:
        """``name``'s decoder; ``None`` when the table does not name it."""
        decoder = self._made.get(name)
        if decoder is None and name in self._types:
            decoder = self._made[name] = msgspec.json.Decoder(self._types[name])
        return decoder


_RESULT_DECODERS: Final = Decoders(methods.RESULTS)


def decode_result(method: str, raw: bytes | msgspec.Raw) -> Any:
    """A ``result`` as ``method``'s protocol Struct (``methods.RESULTS``; plain JSON for a
    method it does not name); :class:`BadResponse` when it does not fit."""
    try:
        return (_RESULT_DECODERS.get(method) or _ANY).decode(raw)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise BadResponse(
            f"{method} result does not fit the wire contract: {exc}",
            {"method": method, "result": bytes(raw).decode("utf-8", "replace")[:2000]},
        ) from None


def plain(value: Any) -> Any:
    """A protocol Struct (or anything containing one) as plain JSON data, ``None`` fields left
    out; dicts and lists pass through with their Structs converted."""
    if isinstance(value, msgspec.Struct):
        return _drop_none(msgspec.to_builtins(value))
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def _drop_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v) for v in value]
    return value


def make_session(id: str, *, cwd: str | None = None, agent_preset: str | None = None) -> dict[str, Any]:
    """A session object ``{id, header: {cwd, agentPreset}}`` for ``connect(session=...)``."""
    header: dict[str, Any] = {}
    if cwd is not None:
        header["cwd"] = cwd
    if agent_preset is not None:
        header["agentPreset"] = agent_preset
    return {"id": id, "header": header} if header else {"id": id}


def _session(value: SessionLike | None) -> dict[str, Any] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return {"id": value}
    out = plain(value)
    if not isinstance(out, dict):
        raise TypeError(f"session must be a mapping, a types.Session or an id string, not {type(value).__name__}")
    return out


__all__ = ["SessionLike", "decode_result", "make_session", "plain"]
