"""The MCP tools of ``memoryd mcp``, derived from the methods table.

Each tool is one method of :mod:`memoryd_protocol.methods`: its arguments are the part of
that method's params a model writes (a write's ``input``, a query's ``filter``), and its
input and output schemas come from the same types and schema patches as
``schemas/dsh-memory-protocol-v1.schema.json``. What the model does not write, the session
does: the write context, the query's session options, the proposal's session. Results that
are a list on the wire are wrapped in an object (MCP's ``structuredContent`` is an
object). Pure: no I/O.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from . import types as t
from .constants import MAX_CONSOLIDATE
from .methods import METHODS, Method
from .schemas import struct_schemas

JSON = dict[str, Any]


@dataclass(frozen=True, slots=True)
class McpTool:
    name: str
    #: the row of the methods table the tool calls
    method: str
    #: the params field the tool's arguments become (None: the params are the session's alone)
    argument: str | None
    #: the type of the arguments (an empty Struct when the tool takes none)
    arguments: type[msgspec.Struct]
    #: the key under which a list result is wrapped (None: the result is an object already)
    wrap: str | None
    #: the model-facing description: what the tool does, and the protocol's habits
    description: str
    title: str

    @property
    def row(self) -> Method:
        return METHODS[self.method]

    @property
    def read_only(self) -> bool:
        return self.row.kind == "read"

    @property
    def destructive(self) -> bool:
        return self.name in DESTRUCTIVE


class NoArguments(msgspec.Struct, forbid_unknown_fields=True):
    """A tool that takes no arguments."""


#: The tools that delete entries.
DESTRUCTIVE: Final = frozenset({"memory_remove", "memory_consolidate"})

_HABITS = (
    "Budgets are hard limits counted in characters per track and scope: an over-budget write fails "
    "with BUDGET_EXCEEDED and nothing is truncated, so make room with memory_consolidate or "
    "memory_replace. Keep one fact per entry; replace or consolidate rather than add a near-duplicate."
)
_MATCH = ("The target is named by `match`, a unique substring: it occurs in exactly one visible entry of that "
          "track and scope (AMBIGUOUS_MATCH lists the candidates: use a longer match or the entry's `id`).")
_GATED = "Every write waits for the user's approval inside memoryd; WRITE_DENIED means they (or the policy) said no."

TOOLS: Final[tuple[McpTool, ...]] = (
    McpTool("memory_query", "memory/query", "filter", t.QueryFilter, None,
            "Search this session's memory: a case-insensitive substring `text` (omit it for every entry), "
            "optionally one track (user: facts about the user; agent: your own working notes) and scope "
            "(user-global: everywhere; workspace: this project only). Returns the best-ranked entries and "
            "the total. Query before you add, so you do not store what is already known.",
            "Search memory"),
    McpTool("memory_budgets", "memory/budgets", None, NoArguments, "budgets",
            "The four budgets (used and limit, in characters) per track and scope. " + _HABITS,
            "Memory budgets"),
    McpTool("memory_add", "memory/add", "input", t.EntryInput, None,
            "Store one new memory entry in a track and scope. New entries land in this session's layer: the one "
            "every agent shares, unless the user gave this host a layer of its own. " + _HABITS + " " + _GATED,
            "Add a memory"),
    McpTool("memory_replace", "memory/replace", "input", t.ReplaceInput, None,
            "Rewrite one entry with new text (its id is kept, its version goes up). " + _MATCH + " " + _GATED,
            "Replace a memory"),
    McpTool("memory_remove", "memory/remove", "input", t.RemoveInput, None,
            "Delete one entry. " + _MATCH + " " + _GATED,
            "Remove a memory"),
    McpTool("memory_consolidate", "memory/consolidate", "input", t.ConsolidateInput, None,
            f"Atomically delete 1 to {MAX_CONSOLIDATE} entries of one track and scope (each named by a unique "
            "substring in `matches`, or by its id in `ids`: one of the two) and store one entry that replaces them: "
            'the way to free budget and merge duplicates. agentKey "" puts the merged entry in the layer every '
            "agent shares. " + _GATED,
            "Consolidate memories"),
    McpTool("memory_propose", "proposals/create", "input", t.ProposalInput, "proposal",
            "Propose an entry for the user to review later (it is not stored until they approve it with "
            "memoryctl). Use it for what you are unsure the user wants kept. A session has at most one "
            "pending proposal of each kind: null means one is already waiting.",
            "Propose a memory"),
    McpTool("memory_list", "memory/list", None, NoArguments, "entries",
            "Every entry this session can see, in creation order, with ids, tags and recall counts.",
            "List memories"),
)

#: tool name → its row
BY_NAME: Final[Mapping[str, McpTool]] = {tool.name: tool for tool in TOOLS}


def _standalone(root: type[Any]) -> JSON:
    """One self-contained JSON Schema for ``root``: an object schema with its ``$defs``."""
    [schema], named = struct_schemas([root], "#/$defs/")
    if "$ref" in schema:
        ref = schema.pop("$ref")
        schema = {**copy.deepcopy(named.pop(ref.removeprefix("#/$defs/"))), **schema}
    if named:
        schema["$defs"] = named
    return schema


#: Arguments the session fills in, not the model: a write's ``source`` is the host that asks.
SESSION_FIELDS: Final = ("source",)
#: What a model API refuses at the top of a tool's input schema (a plain object schema only):
#: the rule they carry (replace and remove take match or id) is the handler's to check.
_COMBINATORS: Final = ("oneOf", "anyOf", "allOf", "not")


def input_schema(tool: McpTool) -> JSON:
    """A plain object schema, as every host's model API takes it."""
    schema = _standalone(tool.arguments)
    for name in (*_COMBINATORS, "title"):
        schema.pop(name, None)
    properties = schema.setdefault("properties", {})
    for name in SESSION_FIELDS:
        properties.pop(name, None)
    return schema


#: What an input must satisfy, not what a stored entry always does: a store dsh-memento
#: wrote (or an older version) may hold ids, tags or counters outside them, and a host's
#: SDK refuses a result that breaks its output schema. The prose goes too: the input
#: schemas carry it, and every session's tools/list is that much shorter.
_INPUT_RULES: Final = frozenset({"description", "$comment", "title", "pattern", "format", "minLength", "maxLength", "minItems", "maxItems", "uniqueItems",
                                 "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "const", "if", "then",
                                 "else", "allOf", "not"})


def _shapes(node: Any) -> Any:
    if isinstance(node, list):
        return [_shapes(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {k: _shapes(v) for k, v in node.items() if k not in _INPUT_RULES and k not in ("properties", "$defs")}
    for names in ("properties", "$defs"):  # maps of names to schemas: every name kept
        if names in node:
            out[names] = {name: _shapes(schema) for name, schema in node[names].items()}
    return out


def output_schema(tool: McpTool) -> JSON:
    """The schema of ``structuredContent``: the method's result (wrapped when it is a list
    or may be null), its shapes and names without the rules its inputs obey."""
    if tool.wrap is None:
        return _shapes(_standalone(tool.row.result))  # type: ignore[no-any-return]
    [inner], named = struct_schemas([tool.row.result], "#/$defs/")
    schema: JSON = {"type": "object", "properties": {tool.wrap: inner}, "required": [tool.wrap]}
    if named:
        schema["$defs"] = named
    return _shapes(schema)  # type: ignore[no-any-return]


def structured(tool: McpTool, result: Any) -> JSON:
    """The method's result as ``structuredContent``."""
    value = msgspec.to_builtins(result)
    return {tool.wrap: value} if tool.wrap is not None else value


__all__ = ["BY_NAME", "DESTRUCTIVE", "SESSION_FIELDS", "TOOLS", "McpTool", "NoArguments", "input_schema", "output_schema",
           "structured"]
