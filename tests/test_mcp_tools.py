"""The MCP tools as the methods table derives them (memoryd_protocol.mcp_tools). Pure."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from memoryd_protocol import mcp_tools
from memoryd_protocol import types as t
from memoryd_protocol.methods import METHODS
from memoryd_protocol.schemas import json_schema_document

RULES = {"pattern", "format", "minLength", "maxLength", "minItems", "maxItems", "uniqueItems", "minimum", "maximum",
         "const", "if", "then", "else", "allOf", "not", "description", "title", "$comment"}


def _walk(node: Any) -> Any:
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for item in node:
            yield from _walk(item)


def _schemas(schema: dict[str, Any]) -> Any:
    """Every schema inside ``schema`` (not the maps of names to schemas)."""
    yield schema
    for names in ("properties", "$defs"):
        for sub in schema.get(names, {}).values():
            yield from _schemas(sub)
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            yield from _schemas(schema[key])
    for sub in schema.get("anyOf", []):
        yield from _schemas(sub)


def _refs_resolve(schema: dict[str, Any]) -> bool:
    defs = schema.get("$defs", {})
    return all(n["$ref"].removeprefix("#/$defs/") in defs for n in _walk(schema) if "$ref" in n)


@pytest.mark.parametrize("tool", mcp_tools.TOOLS, ids=[x.name for x in mcp_tools.TOOLS])
def test_a_tool_is_a_method_of_the_table_and_its_arguments_are_that_method_s_field(tool: mcp_tools.McpTool) -> None:
    method = METHODS[tool.method]
    if tool.argument is None:
        assert tool.arguments is mcp_tools.NoArguments
    else:
        fields = {f.name: f.type for f in msgspec.structs.fields(method.params)}
        arg_type = fields[tool.argument]
        assert tool.arguments in (arg_type, *getattr(arg_type, "__args__", ()))
    assert tool.read_only is (method.kind == "read")
    assert tool.destructive is (tool.name in ("memory_remove", "memory_consolidate"))


@pytest.mark.parametrize("tool", mcp_tools.TOOLS, ids=[x.name for x in mcp_tools.TOOLS])
def test_schemas_are_self_contained_objects_and_outputs_carry_no_input_rules(tool: mcp_tools.McpTool) -> None:
    inp, out = mcp_tools.input_schema(tool), mcp_tools.output_schema(tool)
    assert inp["type"] == out["type"] == "object" and "properties" in inp
    assert _refs_resolve(inp) and _refs_resolve(out)
    assert [sorted(RULES & set(n)) for n in _schemas(out) if RULES & set(n)] == []


def test_input_schemas_carry_the_protocol_schema_s_rules() -> None:
    """The same patched types as schemas/dsh-memory-protocol-v1.schema.json: a tag's limits
    are in memory_add's schema exactly as in the protocol's entryInput."""
    add = mcp_tools.input_schema(mcp_tools.BY_NAME["memory_add"])
    protocol = json_schema_document()["$defs"]["entryInput"]
    assert add["properties"]["tags"] == protocol["properties"]["tags"]
    assert add["required"] == protocol["required"]


def test_list_results_are_wrapped_and_objects_are_not() -> None:
    rows = [t.BudgetRow(track="user", scope="workspace", used=1, limit=2)]
    assert mcp_tools.structured(mcp_tools.BY_NAME["memory_budgets"], rows) == {
        "budgets": [{"track": "user", "scope": "workspace", "used": 1, "limit": 2}]}
    assert mcp_tools.structured(mcp_tools.BY_NAME["memory_propose"], None) == {"proposal": None}
    result = t.QueryResult(entries=[], total=0, truncated=False)
    assert mcp_tools.structured(mcp_tools.BY_NAME["memory_query"], result) == {"entries": [], "total": 0,
                                                                               "truncated": False}
