"""What a call sends: the requests :class:`~memoryd_client.client.Client` builds, and the
errors it raises when no daemon answers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from memoryd_protocol import __version__ as __version__

from .errors import ConnectFailed, Timeout

#: The longest line the client buffers. The daemon's own limit is 4 MiB per message it
#: accepts; its answers (an export of 1000 entries) can be larger, so the client allows more.
MAX_LINE_BYTES: Final = 64 * 1024 * 1024


def make_session(id: str, *, cwd: str | None = None, agent_preset: str | None = None) -> dict[str, Any]:
    """A session object ``{id, header: {cwd, agentPreset}}`` for ``connect(session=...)``."""
    header: dict[str, Any] = {}
    if cwd is not None:
        header["cwd"] = cwd
    if agent_preset is not None:
        header["agentPreset"] = agent_preset
    return {"id": id, "header": header} if header else {"id": id}


def initialize_params(protocol: str, client: Any, capabilities: Any) -> dict[str, Any]:
    """``initialize``'s params; ``client`` and ``capabilities`` as plain JSON."""
    return {"protocol": protocol, "client": client, "capabilities": capabilities}


def default_client(name: str) -> dict[str, Any]:
    """The ``client`` an ``initialize`` names by default: ``name`` at this package's version."""
    return {"name": name, "version": __version__}


def query_opts(session: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The ``opts`` a query sends by default: the session's visible set (``agentKey`` = its
    ``agentPreset`` or ``''``, ``workspaceKey`` = its ``cwd`` or ``''``) and, when the session
    has an id, ``sessionId`` (the daemon then audits the recall and sends
    ``memory/recalled``). None without a session: the whole store."""
    if session is None:
        return None
    header = session.get("header")
    header = header if isinstance(header, Mapping) else {}
    opts: dict[str, Any] = {}
    session_id = session.get("id")
    if session_id is not None:
        opts["sessionId"] = session_id
    agent = header.get("agentPreset")
    opts["agentKey"] = agent if agent is not None else ""
    cwd = header.get("cwd")
    opts["workspaceKey"] = cwd if cwd is not None else ""
    return opts


def query_params(filter: Any, opts: Any) -> dict[str, Any]:
    """``memory/query``'s params (``filter`` and ``opts`` as given, None: left out)."""
    params: dict[str, Any] = {}
    if filter is not None:
        params["filter"] = filter
    if opts is not None:
        params["opts"] = opts
    return params


def connect_failed(path: str, exc: OSError) -> ConnectFailed:
    """The :class:`ConnectFailed` for a connect to ``path`` that raised ``exc``."""
    reason = exc.strerror or str(exc) or type(exc).__name__
    return ConnectFailed(f"cannot connect to memoryd at {path}: {reason}", {"path": path, "errno": exc.errno})


def no_answer(method: str, timeout: float) -> Timeout:
    """The :class:`Timeout` for a call to ``method`` that got no answer within ``timeout``."""
    return Timeout(f"{method}: no answer from memoryd within {timeout}s", {"method": method, "timeout": timeout})


__all__ = ["MAX_LINE_BYTES", "connect_failed", "default_client", "initialize_params", "make_session", "no_answer",
           "query_opts", "query_params"]
