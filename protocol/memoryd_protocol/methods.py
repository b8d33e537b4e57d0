"""The methods table: every JSON-RPC method of wire-v1 §4, once.

Each row says what a method takes and returns, what kind of method it is, whether it can
wait for an approval, whether it needs an agent, which ``data.code`` errors it may return
and what it does. Everything else derives from it:

- ``RESULTS`` (and so the Python client's result decoding);
- the JSON Schema and OpenRPC documents (:mod:`memoryd_protocol.schemas`);
- the daemon's handler binding, with its check that every row has exactly one handler
  (``memoryd.app``), the per-method params decoders and the ``WRITE_REQUIRES_AGENT``
  probe (``memoryd.rpc``), and the ordering rule: a method that never parks is served
  inline (``memoryd.connection``).

Adding a method is one row here plus one handler in the daemon. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final, Literal

import msgspec

from . import approval_types as apt
from . import audit_types as at
from . import snapshot_types as st
from . import types as t
from .constants import MAX_CONSOLIDATE, MAX_IMPORT_ENTRIES, MAX_WATCHED_SESSIONS
from .mcp_wire import McpAttachParams, McpAttachResult

#: read: answers from the store and changes no entry or proposal (recall counters, a
#: session's first frozen snapshot and their audit rows are bookkeeping);
#: write: changes entries or proposals;
#: lifecycle: the connection and the daemon (initialize, approvals, status).
Kind = Literal["read", "write", "lifecycle"]


@dataclass(frozen=True, slots=True)
class Method:
    name: str
    params: type[msgspec.Struct]
    #: the result's type (a Struct, a list of one, an optional one, or Any)
    result: Any
    kind: Kind
    #: one line for the OpenRPC ``summary``
    summary: str
    #: the ``data.code`` values it may return besides INTERNAL_ERROR (wire-v1 §7)
    errors: tuple[str, ...]
    #: it can wait for an approval (the write pipeline's gate); a method that cannot is
    #: served inline, in order, by the connection
    parks: bool = False
    #: its params carry ``write.agent``; without one it fails WRITE_REQUIRES_AGENT
    #: before any other check of its params
    needs_agent: bool = False
    #: the clients offer it (False: ``mcp/attach``, after which the connection speaks MCP,
    #: not this protocol; ``memoryd mcp`` sends it)
    in_clients: bool = True


def _gated(name: str, params: type[msgspec.Struct], result: Any, summary: str, errors: tuple[str, ...]) -> Method:
    """A write through the approval gate: it needs an agent and may park on an approval."""
    return Method(name, params, result, "write", summary, errors, parks=True, needs_agent=True)


_WRITE_ERRORS: Final = ("INVALID_INPUT", "WRITE_REQUIRES_AGENT", "BUDGET_EXCEEDED", "WRITE_DENIED", "STORE_UNAVAILABLE")
_MATCH_ERRORS: Final = ("ENTRY_NOT_FOUND", "AMBIGUOUS_MATCH")

_ROWS: Final = (
    Method(
        "initialize", t.InitializeParams, t.InitializeResult, "lifecycle",
        "Open the session: declare the client and its capabilities (approvals: false for a "
        "connection that must not answer approvals); get the protocol, write policy and budgets.",
        ("INVALID_INPUT",),
    ),
    _gated("memory/add", t.AddParams, t.WriteResult, "Insert a new entry (fresh id, version 1) through the "
           "write pipeline.", _WRITE_ERRORS),
    _gated(
        "memory/replace", t.ReplaceParams, t.ReplaceResult,
        "Rewrite exactly one entry located by a unique substring or by its id; id kept, version + 1.",
        (*_WRITE_ERRORS, *_MATCH_ERRORS),
    ),
    _gated(
        "memory/remove", t.RemoveParams, t.WriteResult,
        "Delete exactly one entry located by a unique substring or by its id.",
        ("INVALID_INPUT", "WRITE_REQUIRES_AGENT", "WRITE_DENIED", "STORE_UNAVAILABLE", *_MATCH_ERRORS),
    ),
    _gated(
        "memory/consolidate", t.ConsolidateParams, t.ConsolidateResult,
        f"Atomically delete 1..{MAX_CONSOLIDATE} entries and insert one new entry, under one approval.",
        (*_WRITE_ERRORS, *_MATCH_ERRORS),
    ),
    _gated("memory/seed", t.SeedParams, t.SeedResult, "Insert a batch of entries, all-or-nothing, under one "
           "approval.", _WRITE_ERRORS),
    Method(
        "memory/query", t.QueryParams, t.QueryResult, "read",
        "Substring search (ASCII case-insensitive); hits get recallCount + 1. With opts.sessionId "
        "a 'recalled' audit row and a memory/recalled notification.",
        ("INVALID_INPUT",),
    ),
    Method(
        "memory/budgets", t.EmptyParams, list[t.BudgetRow], "read",
        "The four budget rows, in the order user/user-global, user/workspace, agent/user-global, agent/workspace.",
        ("INVALID_INPUT",),
    ),
    Method("memory/list", t.EmptyParams, list[t.Entry], "read", "Every entry, in creation order (management view).",
           ("INVALID_INPUT",)),
    Method("audit/list", t.AuditListParams, list[t.AuditRow], "read", "Audit rows, newest first (limit default 100).",
           ("INVALID_INPUT",)),
    Method(
        "memory/snapshot", t.SnapshotParams, t.SnapshotResult, "read",
        "The frozen memory block for a session: rendered once per session id, then the same text "
        "forever. The first render sends memory/snapshot and lands a 'snapshot' audit row.",
        ("INVALID_INPUT", "STORE_UNAVAILABLE"),
    ),
    Method(
        "memory/export", t.ExportParams, Any, "read",
        "The memory-export-v1 envelope (read-only, no approval, no audit row), or with 'adapter' "
        "that adapter's document.",
        ("INVALID_INPUT", "ADAPTER_NOT_FOUND", "ADAPTER_PAYLOAD"),
    ),
    _gated(
        "memory/import", t.ImportParams, t.SeedResult,
        "Restore entries through seed: {envelope, write} or {adapter, payload, write}. Fresh ids, "
        f"version 1, recall counts 0; at most {MAX_IMPORT_ENTRIES} entries. skipExisting: true leaves out entries "
        "that already exist (counted in 'skipped').",
        (*_WRITE_ERRORS, "ADAPTER_NOT_FOUND", "ADAPTER_PAYLOAD"),
    ),
    Method("adapters/list", t.EmptyParams, list[t.AdapterInfo], "read", "The registered import/export adapters.",
           ("INVALID_INPUT",)),
    Method(
        "proposals/create", t.ProposalCreateParams, t.Proposal | None, "write",
        "Create a pending proposal; null when the session already has one of that kind.",
        ("INVALID_INPUT", "STORE_UNAVAILABLE"),
    ),
    Method("proposals/list", t.ProposalListParams, list[t.Proposal], "read",
           "Proposals, optionally filtered by status.", ("INVALID_INPUT",)),
    _gated(
        "proposals/approve", t.ProposalApproveParams, t.ProposalApproveResult,
        "Approve a pending proposal: its entry rides the full add pipeline (approval, budget, audit).",
        (*_WRITE_ERRORS, "PROPOSAL_NOT_FOUND"),
    ),
    Method("proposals/dismiss", t.ProposalDismissParams, t.Proposal, "write", "Dismiss a pending proposal; returns it.",
           ("INVALID_INPUT", "PROPOSAL_NOT_FOUND", "STORE_UNAVAILABLE")),
    Method(
        "approval/decided", t.ApprovalDecidedParams, t.Empty, "lifecycle",
        "Answer an approval/asked notification sent to this connection. Also accepted as a "
        "notification (no id, no response).",
        ("INVALID_INPUT",),
    ),
    Method(
        "approval/subscribe", apt.ApprovalProofParams, t.Empty, "lifecycle",
        "Make this connection an approver: approvals of connections that declared "
        "capabilities.approvals false are asked here. Under approvers \"keyed\" it must prove "
        "the approver key first (approval/prove), or here with proof.",
        ("INVALID_INPUT",),
    ),
    Method(
        "approval/challenge", t.EmptyParams, apt.ApprovalChallenge, "lifecycle",
        "A fresh nonce for this connection, to prove the approver key with (approval/prove, or "
        "approval/subscribe's proof) once, within a minute.",
        ("INVALID_INPUT",),
    ),
    Method(
        "approval/prove", apt.ApprovalProofParams, t.Empty, "lifecycle",
        "Prove the approver key for this connection: proof answers its last approval/challenge. "
        "Under approvers \"keyed\" only a connection that did may decide approvals.",
        ("INVALID_INPUT",),
    ),
    Method("daemon/status", t.EmptyParams, t.DaemonStatus, "lifecycle",
           "Daemon health: version, uptime, connections, pending approvals, queue, store.", ()),
    # lifecycle, not read: it reads no entry, it changes what this connection is sent
    # (as approval/subscribe does), for as long as the connection lives
    Method(
        "memory/watch", t.WatchParams, t.Empty, "lifecycle",
        "Send this connection memory/added, memory/updated and memory/removed for every committed "
        "write, by any connection, of an entry the session can see (the query visibility rules); "
        f"at most {MAX_WATCHED_SESSIONS} sessions per connection, until it closes.",
        ("INVALID_INPUT",),
    ),
    Method(
        "audit/verify", at.AuditVerifyParams, t.LedgerReport, "read",
        "Check the ledger: its hash chain, that every audit row since the chain's start is in it "
        "unchanged, that replaying it from its start gives the live entries, that memoryd_usage "
        "counts the entries, that every change made outside memoryd was accepted, and that each "
        "of heads (witnessed outside the store) is still in the chain. ok false names the first "
        "break in problems[0].",
        ("INVALID_INPUT",),
    ),
    Method(
        "audit/accept", at.AuditAcceptParams, at.AuditAccepted, "lifecycle",
        "Accept a change another program made to the store (a 'foreign' ledger row, which "
        "audit/verify reports until then): an 'accepted' row records it, with this connection. "
        "Only a connection that may decide approvals may accept.",
        ("INVALID_INPUT",),
    ),
    Method(
        "snapshots/prune", st.SnapshotPruneParams, st.SnapshotPruneResult, "lifecycle",
        "Delete the frozen snapshots of sessions that ended (no open connection holds them), "
        "frozen before before if given, and the texts no other session names: a 'pruned' ledger "
        "row names each, so audit/verify still holds, and max_snapshots has room again at once. "
        "Only a connection that may decide approvals may prune.",
        ("INVALID_INPUT",),
    ),
    Method(
        "audit/explain", t.AuditExplainParams, t.EntryLife, "read",
        "One entry's life: every ledger row that wrote it, who asked (the connection), who approved "
        "and how, and the sessions whose frozen snapshot showed it. target: an entry id, or a text "
        "that exactly one entry contains.",
        ("INVALID_INPUT",),
    ),
    Method(
        "mcp/attach", McpAttachParams, McpAttachResult, "lifecycle",
        "Turn this connection into an MCP session (memoryd mcp's relay): every later line is MCP, "
        "served by the daemon's MCP front-end as the memory session of this workspace and agent.",
        ("INVALID_INPUT",), in_clients=False,
    ),
)

#: method name → its row, in wire-v1 §4's order (the OpenRPC document's order).
METHODS: Final[Mapping[str, Method]] = MappingProxyType({m.name: m for m in _ROWS})

#: method name → result type.
RESULTS: Final[dict[str, Any]] = {m.name: m.result for m in _ROWS}

__all__ = ["METHODS", "RESULTS", "Kind", "Method"]
