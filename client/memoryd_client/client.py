"""The async client: :class:`Client`, one typed coroutine per daemon method (wire-v1.md §4),
and :func:`connect`. The connection under it (framing, the reader, the pending table, events,
approvals) is :mod:`memoryd_client.connection`.
"""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
from memoryd_protocol import __version__
from memoryd_protocol import types as T
from memoryd_protocol.approval_types import ApprovalChallenge
from memoryd_protocol.audit_types import AuditAccepted
from memoryd_protocol.constants import PROTOCOL
from memoryd_protocol.paths import (
    ApproverKeyError,
    approver_key_path,
    approver_proof,
    default_socket_path,
    read_approver_key,
)
from memoryd_protocol.snapshot_types import SnapshotPruneResult

from .approvals import ApprovalHandler
from .connection import _DEFAULT, WRITE_METHODS, Connection
from .errors import ApproverKeyUnusable, ConnectFailed
from .proof import check_challenge
from .wire import SessionLike, _session, plain


class Client(Connection):
    """One connection to memoryd. Make it with :func:`connect`; every method is a coroutine.

    Results are protocol Structs (``types.WriteResult``, ``list[types.Entry]``, ...);
    failures raise the protocol's typed exceptions (``BudgetExceeded``, ``WriteDenied``, ...)
    or a :class:`ClientError` (``ConnectionClosed``, ``Timeout``).
    """

    async def _write_call(self, method: str, params: dict[str, Any], write: Any) -> Any:
        """``method`` with ``write`` as its write context, else the connection's session."""
        if write is not None:
            params["write"] = plain(write)
        elif self.session is not None:
            params["write"] = {"agent": {"session": self.session}}
        return await self.call(method, params)

    # --- the daemon's methods (wire-v1.md §4) ------------------------------------------

    async def initialize(
        self,
        protocol: str = PROTOCOL,
        client: Mapping[str, Any] | T.ClientInfo | None = None,
        capabilities: Mapping[str, Any] | T.Capabilities | None = None,
    ) -> T.InitializeResult:
        params = {
            "protocol": protocol,
            "client": plain(client) if client is not None else {"name": self.client_name, "version": __version__},
            "capabilities": plain(capabilities) if capabilities is not None else {"approvals": self.approvals},
        }
        result: T.InitializeResult = await self.call("initialize", params)
        self.server = result
        return result

    async def add(self, input: Mapping[str, Any] | T.EntryInput, write: Any = None) -> T.WriteResult:
        return await self._write_call("memory/add", {"input": input}, write)  # type: ignore[no-any-return]

    async def replace(self, input: Mapping[str, Any] | T.ReplaceInput, write: Any = None) -> T.ReplaceResult:
        return await self._write_call("memory/replace", {"input": input}, write)  # type: ignore[no-any-return]

    async def remove(self, input: Mapping[str, Any] | T.RemoveInput, write: Any = None) -> T.WriteResult:
        return await self._write_call("memory/remove", {"input": input}, write)  # type: ignore[no-any-return]

    async def consolidate(
        self, input: Mapping[str, Any] | T.ConsolidateInput, write: Any = None
    ) -> T.ConsolidateResult:
        return await self._write_call("memory/consolidate", {"input": input}, write)  # type: ignore[no-any-return]

    async def seed(self, inputs: Sequence[Mapping[str, Any] | T.EntryInput], write: Any = None) -> T.SeedResult:
        return await self._write_call("memory/seed", {"inputs": builtins.list(inputs)}, write)  # type: ignore[no-any-return]

    @property
    def query_opts(self) -> dict[str, Any] | None:
        """The ``opts`` :meth:`query` sends by default: the connection's session's visible set
        (``agentKey`` = its ``agentPreset`` or ``''``, ``workspaceKey`` = its ``cwd`` or ``''``)
        and, when the session has an id, ``sessionId`` (the daemon then audits the recall and
        sends ``memory/recalled``). None without a session: the whole store."""
        if self.session is None:
            return None
        header = self.session.get("header")
        header = header if isinstance(header, Mapping) else {}
        opts: dict[str, Any] = {} if self.session.get("id") is None else {"sessionId": self.session["id"]}
        agent, cwd = header.get("agentPreset"), header.get("cwd")
        opts["agentKey"] = "" if agent is None else agent
        opts["workspaceKey"] = "" if cwd is None else cwd
        return opts

    async def query(
        self,
        filter: Mapping[str, Any] | T.QueryFilter | None = None,
        opts: Mapping[str, Any] | T.QueryOpts | None = _DEFAULT,
    ) -> T.QueryResult:
        """``memory/query``. Without ``opts``, a connection with a session sees only that
        session's visible set (:attr:`query_opts`); pass ``opts`` to choose, ``None`` (or
        ``{}``) for the whole store."""
        if opts is _DEFAULT:
            opts = self.query_opts
        params = {name: value for name, value in (("filter", filter), ("opts", opts)) if value is not None}
        return await self.call("memory/query", params)  # type: ignore[no-any-return]

    async def budgets(self) -> builtins.list[T.BudgetRow]:
        return await self.call("memory/budgets", {})  # type: ignore[no-any-return]

    async def list(self) -> builtins.list[T.Entry]:
        return await self.call("memory/list", {})  # type: ignore[no-any-return]

    async def audit_list(self, limit: int | None = None) -> builtins.list[T.AuditRow]:
        return await self.call("audit/list", {} if limit is None else {"limit": limit})  # type: ignore[no-any-return]

    async def audit_verify(self, heads: Sequence[tuple[int, str]] = ()) -> T.LedgerReport:
        """``audit/verify``: the daemon checks the ledger's hash chain, that every audit row
        since the chain's start is in it unchanged, that replaying it gives the live
        entries, that every change made outside memoryd was accepted, and that each of
        ``heads`` ((n, hash) witnessed outside the store) is still in the chain. ``ok``
        False names the breaks in ``problems``, the first one first."""
        params = {"heads": [{"n": n, "hash": h} for n, h in heads]} if heads else {}
        return await self.call("audit/verify", params)  # type: ignore[no-any-return]

    async def audit_accept(self, n: int) -> AuditAccepted:
        """``audit/accept``: accept the change another program made to the store that ledger
        row ``n`` (a ``foreign`` row) records; an ``accepted`` row names this connection."""
        return await self.call("audit/accept", {"n": n})  # type: ignore[no-any-return]

    async def snapshots_prune(self, before: int | None = None) -> SnapshotPruneResult:
        """``snapshots/prune``: delete the frozen snapshots of sessions that ended (frozen
        before ``before``, ms since the epoch, when given); ``pruned`` ledger rows name them.
        Only a connection that may decide approvals may prune."""
        return await self.call("snapshots/prune", {} if before is None else {"before": before})  # type: ignore[no-any-return]

    async def audit_explain(self, target: str) -> T.EntryLife:
        """``audit/explain``: one entry's life, from the ledger. ``target`` is the entry's id,
        or a text that exactly one entry contains (case-insensitive; a live entry first, else
        one the ledger knows, a removed one say). No entry, or several: INVALID_INPUT with
        ``details.field`` "target"."""
        return await self.call("audit/explain", {"target": target})  # type: ignore[no-any-return]

    async def snapshot(self, session: SessionLike | None = None, language: str | None = None) -> T.SnapshotResult:
        """The frozen snapshot for ``session`` (default: the connection's session)."""
        params: dict[str, Any] = {"session": _session(session) if session is not None else self.session}
        if language is not None:
            params["language"] = language
        return await self.call("memory/snapshot", params)  # type: ignore[no-any-return]

    async def watch(self, session: SessionLike | None = None) -> T.Empty:
        """``memory/watch``: from now on this connection also gets ``memory/added``,
        ``memory/updated`` and ``memory/removed`` for other connections' writes of entries
        ``session`` (default: the connection's) sees, each with the writer's ``session_id``.
        Receive them as any event: :meth:`on` or :meth:`events` (:data:`WATCH_EVENTS`)."""
        params = {"session": _session(session) if session is not None else self.session}
        return await self.call("memory/watch", params)  # type: ignore[no-any-return]

    async def export(self, adapter: str | None = None) -> Any:
        """The ``memory-export-v1`` envelope (a dict), or the adapter's document."""
        return await self.call("memory/export", {} if adapter is None else {"adapter": adapter})

    async def import_(
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
        """Import an export envelope (``plugin`` "dsh-memento", ``schema`` "memory-export-v1",
        else INVALID_INPUT), or an adapter's ``payload`` (``adapter=`` given).

        ``skip_existing=True`` leaves out entries whose track, scope, workspaceKey, agentKey
        and text already exist (``result.skipped`` counts them); when that is all of them,
        nothing is written and no approval is asked. ``track``/``scope`` (with an adapter)
        put every entry in that layer. User-global entries that name a workspace (as
        dsh-memento's exports do) are imported without it: ``result.workspace_keys_dropped``.
        """
        params: dict[str, Any] = {}
        if adapter is not None:
            params["adapter"] = adapter
            params["payload"] = payload
        else:
            params["envelope"] = envelope
        if skip_existing is not None:
            params["skipExisting"] = skip_existing
        params.update({k: v for k, v in (("track", track), ("scope", scope)) if v is not None})
        return await self._write_call("memory/import", params, write)  # type: ignore[no-any-return]

    async def adapters_list(self) -> builtins.list[T.AdapterInfo]:
        return await self.call("adapters/list", {})  # type: ignore[no-any-return]

    async def proposals_create(
        self, input: Mapping[str, Any] | T.ProposalInput, session: SessionLike | None = None
    ) -> T.Proposal | None:
        """A pending proposal, or ``None`` when the session already has one of that kind."""
        params = {"input": input, "session": _session(session) if session is not None else self.session}
        return await self.call("proposals/create", params)  # type: ignore[no-any-return]

    async def proposals_list(self, status: str | None = None) -> builtins.list[T.Proposal]:
        return await self.call("proposals/list", {} if status is None else {"status": status})  # type: ignore[no-any-return]

    async def proposals_approve(self, id: str, write: Any = None) -> T.ProposalApproveResult:
        return await self._write_call("proposals/approve", {"id": id}, write)  # type: ignore[no-any-return]

    async def proposals_dismiss(self, id: str) -> T.Proposal:
        return await self.call("proposals/dismiss", {"id": id})  # type: ignore[no-any-return]

    async def approval_subscribe(self, proof: str | None = None) -> T.Empty:
        """Make this connection an approver for writes from connections that cannot approve.
        Under ``approvers = "keyed"`` the connection must prove the approver key: with
        ``proof`` here, or by :meth:`approval_prove` first (:meth:`prove_approver_key` does it)."""
        return await self.call("approval/subscribe", {} if proof is None else {"proof": proof})  # type: ignore[no-any-return]

    async def approval_challenge(self) -> ApprovalChallenge:
        """A fresh nonce for this connection, to prove the approver key with, once."""
        return await self.call("approval/challenge", {})  # type: ignore[no-any-return]

    async def approval_prove(self, proof: str) -> T.Empty:
        """Prove the approver key: ``proof`` answers this connection's last challenge."""
        return await self.call("approval/prove", {"proof": proof})  # type: ignore[no-any-return]

    async def prove_approver_key(self, key: str | Path | None = None, *, subscribe: bool = False) -> None:
        """Answer a fresh challenge with the approver key (``key``, by default
        ``$XDG_CONFIG_HOME/memoryd/approver.key``): by ``approval/prove``, or with
        ``subscribe`` by ``approval/subscribe``, which makes this connection an approver too.
        ApproverKeyUnusable when the key cannot be read here; ApproverRelayed, and no proof
        made, when the challenge names another process than this one (proof.check_challenge)."""
        try:
            secret = read_approver_key(Path(key) if key is not None else approver_key_path())
        except ApproverKeyError as exc:
            raise ApproverKeyUnusable(str(exc)) from None
        ch = await self.approval_challenge()
        start = check_challenge(ch, self.path, self.peer_pid)
        proof = approver_proof(secret, ch.nonce, ch.connection, ch.pid, start)
        if subscribe:
            await self.approval_subscribe(proof)
        else:
            await self.approval_prove(proof)

    async def status(self) -> T.DaemonStatus:
        return await self.call("daemon/status", {})  # type: ignore[no-any-return]


def _unwrap(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The one exception inside nested single-member groups, else the group itself."""
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


@asynccontextmanager
async def connect(
    path: str | Path | None = None,
    *,
    session: SessionLike | None = None,
    approvals: bool = True,
    on_approval: ApprovalHandler | None = None,
    client_name: str = "memoryd-client",
    timeout: float | None = 30.0,  # noqa: ASYNC109 - per-call deadline, see Client.call
) -> AsyncIterator[Client]:
    """Connect to memoryd, ``initialize``, and yield a :class:`Client`.

    ``path``: the socket (default ``memoryd_protocol.paths.default_socket_path()``).
    ``session``: the session of this connection's writes, ``{id, header: {cwd, agentPreset}}``
    (the ``write`` context of every write method unless one passes ``write=``); ``query()``
    without ``opts`` then sees only that session's visible set.
    ``approvals``: whether this connection answers approvals itself (``False``: a subscribed
    approver, e.g. ``memoryctl approve``, decides its writes). ``on_approval(asked)`` returns
    the outcome (``"allowed-once"`` or ``True`` approves); a handler that takes a second
    argument also gets the :class:`ApprovalCall` that asked (or None). Without a handler,
    every approval is rejected (fail closed), as it is when the handler raises. ``timeout``:
    seconds per call.

    Raises :class:`ConnectFailed` when no daemon listens there.
    """
    sock = Path(path) if path is not None else default_socket_path()
    try:
        with anyio.fail_after(timeout):
            stream = await anyio.connect_unix(sock)
    except OSError as exc:  # includes TimeoutError
        reason = exc.strerror or str(exc) or type(exc).__name__
        raise ConnectFailed(f"cannot connect to memoryd at {sock}: {reason}", {"path": str(sock), "errno": exc.errno}
                            ) from exc
    client = Client(
        stream,
        session=session,
        approvals=approvals,
        on_approval=on_approval,
        client_name=client_name,
        timeout=timeout,
        path=sock,
    )
    try:
        async with anyio.create_task_group() as tg:
            client._tg = tg
            tg.start_soon(client._read_loop)
            try:
                await client.initialize()
                yield client
            finally:
                await client.aclose()
                tg.cancel_scope.cancel()  # approval handlers and listeners still running
    except BaseExceptionGroup as group:
        # Only the body (or initialize) can fail in here: the reader and the spawned tasks
        # catch their own errors. Give the caller its own exception, not a group, with its
        # chaining untouched.
        inner = _unwrap(group)
        if inner is group:
            raise
        context, cause, suppressed = inner.__context__, inner.__cause__, inner.__suppress_context__
        try:
            raise inner
        finally:
            inner.__context__, inner.__cause__, inner.__suppress_context__ = context, cause, suppressed


__all__ = ["WRITE_METHODS", "Client", "connect"]
