"""The normative schemas: generated from the types, valid, and saying what the protocol says."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import msgspec
import pytest
from contract import (
    JSON_SCHEMA_PATH,
    OPENRPC_PATH,
    ContractRecorder,
    definition_validator,
    validate_definition,
    validate_message,
)
from jsonschema import Draft7Validator, Draft202012Validator
from memoryd_protocol import errors, schemas, types, validation
from memoryd_protocol import methods as methods_table
from memoryd_protocol.constants import ERROR_CODES, RPC_LEVEL_CODES

REPO = Path(__file__).resolve().parents[1]

#: wire-v1.md §4, transcribed independently of memoryd_protocol.methods.PARAMS.
WIRE_METHODS = [
    "initialize",
    "memory/add",
    "memory/replace",
    "memory/remove",
    "memory/consolidate",
    "memory/seed",
    "memory/query",
    "memory/budgets",
    "memory/list",
    "audit/list",
    "memory/snapshot",
    "memory/export",
    "memory/import",
    "adapters/list",
    "proposals/create",
    "proposals/list",
    "proposals/approve",
    "proposals/dismiss",
    "approval/decided",
    "approval/subscribe",
    "approval/challenge",
    "approval/prove",
    "daemon/status",
    "memory/watch",
    "audit/verify",
    "audit/accept",
    "snapshots/prune",
    "audit/explain",
    "mcp/attach",
]
#: wire-v1.md §7 plus the JSON-RPC-level codes.
WIRE_ERRORS = {
    "INVALID_INPUT": -32602,
    "WRITE_REQUIRES_AGENT": -32010,
    "BUDGET_EXCEEDED": -32011,
    "ENTRY_NOT_FOUND": -32012,
    "AMBIGUOUS_MATCH": -32013,
    "WRITE_DENIED": -32014,
    "PROPOSAL_NOT_FOUND": -32015,
    "STORE_CORRUPT": -32016,
    "STORE_UNSUPPORTED_VERSION": -32017,
    "ADAPTER_NOT_FOUND": -32018,
    "ADAPTER_PAYLOAD": -32019,
    "STORE_UNAVAILABLE": -32020,
    "STORE_LOCKED": -32021,
    "PARSE_ERROR": -32700,
    "INVALID_REQUEST": -32600,
    "METHOD_NOT_FOUND": -32601,
    "INTERNAL_ERROR": -32603,
}
WIRE_NOTIFICATIONS = [
    "approval/asked",
    "approval/resolved",
    "memory/added",
    "memory/updated",
    "memory/removed",
    "memory/recalled",
    "memory/snapshot",
]


@pytest.fixture(scope="module")
def schema_doc() -> dict[str, Any]:
    return json.loads(JSON_SCHEMA_PATH.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def openrpc() -> dict[str, Any]:
    return json.loads(OPENRPC_PATH.read_text(encoding="utf-8"))


def make_entry(**over: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "id": str(uuid.uuid4()),
        "track": "user",
        "scope": "user-global",
        "workspaceKey": "",
        "agentKey": "",
        "text": "prefers tabs over spaces",
        "source": "dsh-memento",
        "tags": ["style", "编辑器"],
        "version": 1,
        "createdAt": 1_700_000_000_000,
        "updatedAt": 1_700_000_000_500,
        "lastRecalled": None,
        "recallCount": 0,
        "sessionId": "s-1",
    }
    entry.update(over)
    return entry


def make_rows() -> list[dict[str, Any]]:
    return [
        {"track": "user", "scope": "user-global", "used": 24, "limit": 2000},
        {"track": "user", "scope": "workspace", "used": 0, "limit": 2000},
        {"track": "agent", "scope": "user-global", "used": 0, "limit": 4000},
        {"track": "agent", "scope": "workspace", "used": 0, "limit": 4000},
    ]


def make_envelope(**over: Any) -> dict[str, Any]:
    env: dict[str, Any] = {
        "plugin": "dsh-memento",
        "schema": "memory-export-v1",
        "exportedAt": "2024-05-01T12:00:00.000Z",
        "budgets": make_rows(),
        "entries": [make_entry(), make_entry(scope="workspace", workspaceKey="/home/u/proj", sessionId=None)],
    }
    env.update(over)
    return env


def is_valid(name: str, instance: Any) -> bool:
    return definition_validator(name).is_valid(instance)


# --- (a) drift -----------------------------------------------------------------------------


def test_committed_files_are_what_the_types_generate() -> None:
    generated = schemas.generate()
    assert set(generated) == {JSON_SCHEMA_PATH.name, OPENRPC_PATH.name}
    for name, text in generated.items():
        committed = (REPO / "schemas" / name).read_text(encoding="utf-8")
        assert committed == text, schemas.diff_summary(name, committed, text) + (
            "\nregenerate with: python -m memoryd_protocol.schemas"
        )


def test_generation_is_deterministic() -> None:
    assert schemas.generate() == schemas.generate()
    text = schemas.generate()[JSON_SCHEMA_PATH.name]
    assert text.endswith("}\n") and not text.endswith("\n\n")
    assert text == json.dumps(json.loads(text), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def test_check_mode(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert schemas.main(["--check", "--out", str(tmp_path)]) == 1
    assert "missing" in capsys.readouterr().out
    assert schemas.main(["--out", str(tmp_path)]) == 0
    assert schemas.main(["--check", "--out", str(tmp_path)]) == 0
    target = tmp_path / OPENRPC_PATH.name
    target.write_text(target.read_text(encoding="utf-8").replace('"by-name"', '"by-position"', 1), encoding="utf-8")
    capsys.readouterr()
    assert schemas.main(["--check", "--out", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert f"{OPENRPC_PATH.name}: differs (+1 -1 lines)" in out
    assert '+      "paramStructure": "by-name",' in out


def test_runnable_as_module_check() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "memoryd_protocol.schemas", "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --- (b) validity --------------------------------------------------------------------------


def test_json_schema_is_valid_2020_12(schema_doc: dict[str, Any]) -> None:
    Draft202012Validator.check_schema(schema_doc)
    assert schema_doc["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    for name in ("entry", "entryInput", "budgetRow", "exportEnvelope", "auditRow", "proposal", "error"):
        assert name in schema_doc["$defs"], name
    refs = _refs(schema_doc)
    assert refs and all(r.startswith("#/$defs/") and r.removeprefix("#/$defs/") in schema_doc["$defs"] for r in refs)
    assert "UTF-16" in schema_doc["$comment"] and "code points" in schema_doc["$comment"]


def test_openrpc_document_structure(openrpc: dict[str, Any]) -> None:
    _OPENRPC_SUBSET.validate(openrpc)
    assert openrpc["openrpc"].startswith("1.3.")
    methods = {m["name"]: m for m in openrpc["methods"]}
    assert list(methods) == WIRE_METHODS
    assert set(methods) == set(methods_table.METHODS) == set(methods_table.RESULTS)
    for name, method in methods.items():
        assert method["paramStructure"] == "by-name", name
        fields = msgspec.structs.fields(methods_table.METHODS[name].params)
        assert [p["name"] for p in method["params"]] == [f.encode_name for f in fields], name
        for param, field in zip(method["params"], fields, strict=True):
            assert param["required"] is field.required, (name, param["name"])
        for ref in method["errors"]:
            assert ref["$ref"].removeprefix("#/components/errors/") in openrpc["components"]["errors"]
    # a couple of required flags spelled out
    assert [(p["name"], p["required"]) for p in methods["memory/add"]["params"]] == [("input", True), ("write", True)]
    assert all(not p["required"] for p in methods["memory/query"]["params"])
    assert {p["name"]: p["required"] for p in methods["approval/decided"]["params"]} == {"id": True, "outcome": True,
                                                                                          "by": False}


def test_openrpc_errors_table(openrpc: dict[str, Any]) -> None:
    table = openrpc["components"]["errors"]
    assert {code: e["code"] for code, e in table.items()} == WIRE_ERRORS
    assert {**ERROR_CODES, **{v: k for k, v in RPC_LEVEL_CODES.items()}} == WIRE_ERRORS
    for code, err in table.items():
        Draft7Validator.check_schema(err["data"])
        assert err["data"]["properties"]["code"] == {"const": code}
    assert table["BUDGET_EXCEEDED"]["data"]["properties"]["details"]["required"] == [
        "track",
        "scope",
        "used",
        "limit",
        "needed",
    ]
    assert set(openrpc["components"]["schemas"]["error"]["properties"]["code"]["enum"]) == set(WIRE_ERRORS)


def test_openrpc_notifications(openrpc: dict[str, Any]) -> None:
    ext = openrpc["x-notifications"]
    assert "no first-class" in ext["description"]
    notes = ext["notifications"]
    down = [n["name"] for n in notes if n["direction"] == "daemon→client"]
    up = [n["name"] for n in notes if n["direction"] == "client→daemon"]
    assert down == WIRE_NOTIFICATIONS == list(types.NOTIFICATIONS)
    assert up == ["approval/decided"]
    for note in notes:
        ref = note["paramsSchema"]["$ref"].removeprefix("#/components/schemas/")
        assert ref in openrpc["components"]["schemas"]
        assert note["paramStructure"] == "by-name"


def test_openrpc_component_schemas_are_valid(openrpc: dict[str, Any]) -> None:
    comps = openrpc["components"]["schemas"]
    for schema in comps.values():
        # OpenRPC 1.3 schemas are draft-07; the generator keeps to keywords valid in both.
        Draft7Validator.check_schema(schema)
        Draft202012Validator.check_schema(schema)
    refs = _refs(openrpc)
    assert all(r.removeprefix("#/components/schemas/") in comps for r in refs if r.startswith("#/components/schemas/"))
    assert all(r.startswith(("#/components/schemas/", "#/components/errors/")) for r in refs)


def test_both_documents_share_the_data_model(schema_doc: dict[str, Any], openrpc: dict[str, Any]) -> None:
    comps = openrpc["components"]["schemas"]
    for name, schema in schema_doc["$defs"].items():
        as_openrpc = json.loads(json.dumps(schema).replace('"#/$defs/', '"#/components/schemas/'))
        assert comps[name] == as_openrpc, name


# --- (c) examples: the data model -------------------------------------------------------------


def test_valid_entry_and_envelope_pass() -> None:
    validate_definition("entry", make_entry())
    validate_definition("entry", make_entry(lastRecalled=1_700_000_001_000, recallCount=3, version=4, sessionId=None))
    validate_definition("entry", make_entry(tags=[], scope="workspace", workspaceKey="/w", agentKey="coder"))
    validate_definition("entry", make_entry(tags=[f"t{i}" for i in range(16)]))
    validate_definition("entry", make_entry(tags=["x" * 32, "界" * 32]))
    validate_definition("exportEnvelope", make_envelope())
    validate_definition("exportEnvelope", make_envelope(entries=[]))


def test_msgspec_encoded_structs_pass() -> None:
    entry = types.Entry(
        id=str(uuid.uuid4()),
        track="agent",
        scope="workspace",
        workspace_key="/p",
        agent_key="",
        text="uses uv",
        source="claude",
        tags=["tooling"],
        version=2,
        created_at=1,
        updated_at=2,
        last_recalled=None,
        recall_count=0,
        session_id=None,
    )
    rows = [types.BudgetRow(track=tr, scope=sc, used=0, limit=10) for tr, sc in (("user", "user-global"),) * 4]
    env = types.ExportEnvelope(
        plugin="dsh-memento",
        schema="memory-export-v1",
        exported_at="2024-01-01T00:00:00Z",
        budgets=rows,
        entries=[entry],
    )
    validate_definition("entry", msgspec.to_builtins(entry))
    validate_definition("exportEnvelope", msgspec.to_builtins(env))
    validate_definition("entryInput", msgspec.to_builtins(types.EntryInput(track="user", scope="workspace", text="t")))


@pytest.mark.parametrize(
    ("case", "over"),
    [
        ("bad uuid", {"id": "not-a-uuid"}),
        ("uuid v1", {"id": "6ba7b810-9dad-11d1-80b4-00c04fd430c8"}),
        ("upper-case uuid", {"id": str(uuid.uuid4()).upper()}),
        ("17 tags", {"tags": [f"t{i}" for i in range(17)]}),
        ("33-char tag", {"tags": ["x" * 33]}),
        ("duplicate tags", {"tags": ["a", "b", "a"]}),
        ("empty tag", {"tags": [""]}),
        ("untrimmed tag", {"tags": [" a"]}),
        ("control char in tag", {"tags": ["a\tb"]}),
        ("version 0", {"version": 0}),
        ("unknown track", {"track": "team"}),
        ("unknown scope", {"scope": "global"}),
        ("empty text", {"text": ""}),
        ("negative recallCount", {"recallCount": -1}),
        ("float createdAt", {"createdAt": 1.5}),
        ("string updatedAt", {"updatedAt": "2024-01-01"}),
        ("string lastRecalled", {"lastRecalled": "never"}),
        ("numeric sessionId", {"sessionId": 5}),
        ("user-global with workspaceKey", {"workspaceKey": "/home/u/proj"}),
    ],
)
def test_bad_entries_fail(case: str, over: dict[str, Any]) -> None:
    assert not is_valid("entry", make_entry(**over)), case


@pytest.mark.parametrize("field", ["id", "sessionId", "lastRecalled", "tags", "version", "text", "workspaceKey"])
def test_entry_fields_are_required(field: str) -> None:
    entry = make_entry()
    del entry[field]
    assert not is_valid("entry", entry)


def test_bad_envelopes_fail() -> None:
    assert not is_valid("exportEnvelope", make_envelope(schema="memory-export-v2"))
    assert not is_valid("exportEnvelope", make_envelope(budgets=make_rows()[:3]))
    assert not is_valid("exportEnvelope", make_envelope(entries=[make_entry(version=0)]))
    # the reference provider leaves sessionId out of exported entries; the schema requires it
    no_session = make_entry()
    del no_session["sessionId"]
    assert not is_valid("exportEnvelope", make_envelope(entries=[no_session]))
    del_exported = make_envelope()
    del del_exported["exportedAt"]
    assert not is_valid("exportEnvelope", del_exported)


def test_entry_input() -> None:
    assert is_valid("entryInput", {"track": "user", "scope": "user-global", "text": "x"})
    assert is_valid("entryInput", {"track": "user", "scope": "user-global", "text": "x", "tags": None, "source": None})
    assert is_valid(
        "entryInput", {"track": "agent", "scope": "workspace", "text": "x", "tags": ["a"], "source": "mem0"}
    )
    assert not is_valid("entryInput", {"track": "user", "scope": "user-global", "text": "x", "tag": ["a"]})
    assert not is_valid("entryInput", {"track": "user", "scope": "user-global", "text": ""})
    assert not is_valid("entryInput", {"track": "user", "scope": "user-global", "text": "x", "tags": ["x" * 33]})
    assert not is_valid("entryInput", {"track": "user", "scope": "user-global", "text": "x", "source": "s" * 65})
    assert not is_valid("entryInput", {"track": "user", "text": "x"})


def test_budget_audit_proposal() -> None:
    assert is_valid("budgetRow", make_rows()[0])
    assert not is_valid("budgetRow", {**make_rows()[0], "used": -1})
    row = {
        "seq": 1,
        "ts": 1,
        "action": "add",
        "track": "user",
        "scope": "user-global",
        "entryId": str(uuid.uuid4()),
        "text": "x",
        "outcome": "allowed-once (via approval, writePolicy ask)",
        "source": "dsh-memento",
        "sessionId": "s-1",
    }
    assert is_valid("auditRow", row)
    assert is_valid("auditRow", {**row, "action": "seed", "entryId": None, "track": None, "sessionId": None})
    assert not is_valid("auditRow", {**row, "entryId": "nope"})
    assert not is_valid("auditRow", {**row, "seq": 0})
    proposal = {
        "id": str(uuid.uuid4()),
        "kind": "compaction",
        "track": "agent",
        "scope": "workspace",
        "workspaceKey": "/p",
        "agentKey": "",
        "text": "x",
        "source": "proposal",
        "sessionId": "s-1",
        "status": "pending",
        "createdAt": 1,
        "decidedAt": None,
    }
    assert is_valid("proposal", proposal)
    assert not is_valid("proposal", {**proposal, "status": "maybe"})
    assert not is_valid("proposal", {**proposal, "text": "x" * 2001})


def test_utf16_caveat_is_real_and_documented(schema_doc: dict[str, Any]) -> None:
    """17 emoji are 34 UTF-16 units: over the protocol's 32-unit limit, yet JSON Schema counts
    17 code points. The schema cannot catch this; the root $comment says so."""
    emoji_tag = "😀" * 17
    assert is_valid("entry", make_entry(tags=[emoji_tag]))
    with pytest.raises(errors.InvalidInput):
        from memoryd_protocol.text import normalize_tags

        normalize_tags([emoji_tag])
    assert "UTF-16" in schema_doc["$defs"]["entry"]["properties"]["tags"]["items"]["$comment"]


# --- (c) examples: errors ------------------------------------------------------------------------


def _raised(fn: Any, *args: Any) -> errors.ProtocolError:
    with pytest.raises(errors.ProtocolError) as info:
        fn(*args)
    return info.value


def test_errors_py_wire_objects_match_the_schema() -> None:
    """What memoryd_protocol.errors puts on the wire satisfies rpcError (code table included)."""
    samples = [
        errors.InvalidInput("text must not be empty", "text"),
        errors.InvalidInput("params must be an object"),
        errors.WriteRequiresAgent(),
        _raised(validation.check_budget, "user", "user-global", 90, 100, 150),
        _raised(validation.resolve_one, [("a", "x1"), ("b", "x2")], "user", "workspace", "x"),
        _raised(validation.resolve_one, [], "agent", "user-global", "zzz"),
        errors.WriteDenied("write denied: rejected", {"outcome": "rejected"}),
        errors.ProposalNotFound("proposal not found", {"id": str(uuid.uuid4())}),
        errors.StoreCorrupt("store is corrupt", {"path": "/x/memory.db"}),
        errors.StoreUnsupportedVersion("store is newer", {"path": "/x/memory.db"}),
        errors.AdapterNotFound("adapter not found", {"adapterId": "nope"}),
        errors.AdapterPayload("bad payload", {"adapterId": "mem0"}),
        errors.RpcError(-32700, "parse error"),
        errors.RpcError(-32600, "invalid request"),
        errors.RpcError(-32601, "method not found: x"),
        errors.RpcError(-32603, "internal error"),
    ]
    for exc in samples:
        wire = exc.to_wire()
        validate_definition("rpcError", wire)
        validate_message({"jsonrpc": "2.0", "id": 1, "error": wire})


def test_bad_error_data_fails() -> None:
    good = errors.BudgetExceeded(
        "memory budget exceeded", {"track": "user", "scope": "user-global", "used": 1, "limit": 2, "needed": 5}
    ).to_wire()
    assert is_valid("rpcError", good)
    assert not is_valid("error", {**good["data"], "code": "NOPE"})
    assert not is_valid("error", {**good["data"], "details": {"track": "user"}})
    assert not is_valid("error", {"code": "WRITE_DENIED", "message": "m", "details": {}})
    assert not is_valid("error", {"code": "INVALID_INPUT", "message": "m"})
    assert not is_valid("rpcError", {**good, "code": -32602})
    assert not is_valid("rpcError", {**good, "code": -32602, "data": {**good["data"], "code": "RPC_ERROR"}})


# --- tests/contract.py ------------------------------------------------------------------------


def test_validate_message_results_and_notifications() -> None:
    entry = make_entry()
    row = make_rows()[0]
    validate_message({"jsonrpc": "2.0", "id": 1, "result": {"entry": entry, "usage": row}}, "memory/add")
    validate_message({"jsonrpc": "2.0", "id": "a", "result": make_rows()}, "memory/budgets")
    validate_message({"jsonrpc": "2.0", "id": 2, "result": None}, "proposals/create")
    validate_message({"jsonrpc": "2.0", "id": 2, "result": {}}, "approval/decided")
    validate_message({"jsonrpc": "2.0", "id": 3, "result": make_envelope()}, "memory/export")
    validate_message({"jsonrpc": "2.0", "id": 3, "result": "## user/user-global\n- x\n"}, "memory/export")
    validate_message({"jsonrpc": "2.0", "id": 4, "result": {"whatever": 1}})  # no method: shape only
    asked = types.ApprovalAsked(
        id=str(uuid.uuid4()),
        action="seed",
        track="batch",
        scope="batch",
        text="user/user-global: x",
        source="dsh-memento",
        session_id="s-1",
        reason="[dsh-memento] seed (1 entries) batch/batch\nuser/user-global: x",
        count=1,
    )
    validate_message({"jsonrpc": "2.0", "method": "approval/asked", "params": msgspec.to_builtins(asked)})
    no_count = msgspec.structs.replace(asked, action="add", track="user", scope="user-global", count=None)
    params = msgspec.to_builtins(no_count)
    assert "count" not in params
    validate_message({"jsonrpc": "2.0", "method": "approval/asked", "params": params})
    assert not {"workspaceKey", "agentKey", "tags", "entries", "requestId", "origin"} & set(params)
    full = msgspec.structs.replace(
        asked,
        entries=[types.ApprovalEntry(track="user", scope="user-global", workspace_key="", agent_key="coder",
                                     text="x", tags=["t"])],
        request_id="w-1",
        origin=types.ApprovalOrigin(name="h", pid=12),
    )
    params = msgspec.to_builtins(full)
    assert params["origin"] == {"name": "h", "pid": 12} and params["requestId"] == "w-1"
    validate_message({"jsonrpc": "2.0", "method": "approval/asked", "params": params})
    for bad in ({"origin": {"pid": 0}}, {"requestId": True}, {"entries": []}, {"tags": ["a", "a"]}):
        with pytest.raises(AssertionError):
            validate_message({"jsonrpc": "2.0", "method": "approval/asked", "params": {**params, **bad}})
    validate_message({"jsonrpc": "2.0", "method": "memory/updated", "params": {"previous": entry, "entry": entry}})
    validate_message(
        {"jsonrpc": "2.0", "method": "memory/recalled", "params": {"query": "x", "matches": 2, "sessionId": "s"}}
    )
    with pytest.raises(AssertionError, match="memory/recalled"):  # matches is the hit count, not the entries
        validate_message(
            {"jsonrpc": "2.0", "method": "memory/recalled", "params": {"query": "x", "matches": [entry], "sessionId": "s"}}
        )
    status = types.DaemonStatus(
        version="0.1.0",
        uptime_s=1.5,
        connections=1,
        pending_approvals=0,
        queue_depth=0,
        store=types.StoreInfo(path="/x", schema_version=4),
        pid=42,
        write_policy="ask",
        socket="/run/user/1000/memoryd/memoryd.sock",
        config=None,
        log="/run/user/1000/memoryd/memoryd.log",
        connection_list=[
            types.ConnectionInfo(id=1, transport="socket", pid=7, uid=1000, exe="/usr/bin/node",
                                 client=types.ClientInfo(name="h", version="1"), approver=True, opened_at=1),
            types.ConnectionInfo(id=2, transport="stdio", pid=None, uid=None, exe=None, client=None,
                                 approver=False, opened_at=2),
        ],
    )
    validate_message({"jsonrpc": "2.0", "id": 9, "result": msgspec.to_builtins(status)}, "daemon/status")
    with pytest.raises(AssertionError, match="daemon/status"):  # a listing is not a count
        validate_message({"jsonrpc": "2.0", "id": 9, "result": {**msgspec.to_builtins(status), "connectionList": 2}},
                         "daemon/status")
    unbound = msgspec.structs.replace(status, socket=None, log=None, config="/home/u/.config/memoryd/config.toml")
    validate_message({"jsonrpc": "2.0", "id": 9, "result": msgspec.to_builtins(unbound)}, "daemon/status")


@pytest.mark.parametrize(
    ("msg", "method", "needle"),
    [
        ({"id": 1, "result": {}}, None, "jsonrpc"),
        ({"jsonrpc": "2.0", "id": 1}, None, "exactly one of result/error"),
        ({"jsonrpc": "2.0", "id": 1, "result": {}, "error": {}}, None, "exactly one of result/error"),
        ({"jsonrpc": "2.0", "result": {}}, None, "without id"),
        ({"jsonrpc": "2.0", "id": None, "result": {}}, None, "id null"),
        ({"jsonrpc": "2.0", "id": True, "result": {}}, None, "id is not"),
        ({"jsonrpc": "2.0", "id": 1, "result": {}, "extra": 1}, None, "unexpected members"),
        ({"jsonrpc": "2.0", "id": 1, "method": "x", "params": {}}, None, "request"),
        ({"jsonrpc": "2.0", "method": "memory/exploded", "params": {}}, None, "undocumented notification"),
        ({"jsonrpc": "2.0", "method": "memory/added"}, None, "without params"),
        ({"jsonrpc": "2.0", "method": "memory/added", "params": {"entry": {"id": "x"}}}, None, "memory/added"),
        ({"jsonrpc": "2.0", "id": 1, "result": {"entries": [], "total": 0}}, "memory/query", "truncated"),
        ({"jsonrpc": "2.0", "id": 1, "result": {}}, "memory/frobnicate", "not a documented method"),
        ({"jsonrpc": "2.0", "id": 1, "error": {"code": -32601, "message": "m"}}, None, "without data"),
        (
            {"jsonrpc": "2.0", "id": 1, "error": {"code": -32601, "message": "m", "data": {"code": "X"}}},
            None,
            "error.data",
        ),
        (
            {
                "jsonrpc": "2.0",
                "id": None,
                "error": {
                    "code": -32700,
                    "message": "parse error",
                    "data": {"code": "PARSE_ERROR", "message": "other", "details": {}},
                },
            },
            None,
            "data.message",
        ),
        ("not an object", None, "not a JSON object"),
        ([], None, "empty batch"),
    ],
)
def test_validate_message_rejects(msg: Any, method: str | None, needle: str) -> None:
    with pytest.raises(AssertionError, match=None) as info:
        validate_message(msg, method)
    assert needle in str(info.value)


def test_contract_recorder() -> None:
    rec = ContractRecorder()
    rec.sent(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "memory/budgets", "params": {}}))
    rec.sent(
        [
            {"jsonrpc": "2.0", "id": 2, "method": "proposals/create", "params": {}},
            {"jsonrpc": "2.0", "method": "approval/decided", "params": {"id": "x", "outcome": "rejected"}},
        ]
    )
    assert rec.sent("{not json") is None
    assert set(rec.pending.values()) == {"memory/budgets", "proposals/create"}
    note = {"jsonrpc": "2.0", "method": "memory/snapshot", "params": {"sessionId": "s", "text": ""}}
    rec.received(json.dumps(note).encode())
    rec.received(json.dumps([{"jsonrpc": "2.0", "id": 2, "result": None}]))
    with pytest.raises(AssertionError, match="result of memory/budgets"):
        rec.received(json.dumps({"jsonrpc": "2.0", "id": 1, "result": make_rows()[:2]}))
    with pytest.raises(AssertionError, match="not outstanding"):
        rec.received(json.dumps({"jsonrpc": "2.0", "id": 1, "result": make_rows()}))
    with pytest.raises(AssertionError, match="not JSON"):
        rec.received("garbage")
    parse_error = errors.RpcError(-32700, "parse error").to_wire()
    rec.received(json.dumps({"jsonrpc": "2.0", "id": None, "error": parse_error}))
    rec.assert_all_answered()
    assert rec.notifications_named("memory/snapshot") == [note]
    rec.sent({"jsonrpc": "2.0", "id": 5, "method": "daemon/status"})
    with pytest.raises(AssertionError, match="never answered"):
        rec.assert_all_answered()
    with pytest.raises(AssertionError, match="outstanding"):
        rec.sent({"jsonrpc": "2.0", "id": 5, "method": "daemon/status"})
    lenient = ContractRecorder(strict_ids=False)
    lenient.received({"jsonrpc": "2.0", "id": 99, "result": {"anything": True}})


# --- helpers -------------------------------------------------------------------------------------


def _refs(node: Any) -> list[str]:
    out: list[str] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                out.append(value)
            else:
                out.extend(_refs(value))
    elif isinstance(node, list):
        for item in node:
            out.extend(_refs(item))
    return out


def _obj(required: list[str], properties: dict[str, Any], *, closed: bool = True) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "required": required, "properties": properties}
    if closed:
        schema["patternProperties"] = {"^x-": {}}
        schema["additionalProperties"] = False
    return schema


_STR = {"type": "string"}
_CONTENT_DESCRIPTOR = _obj(
    ["name", "schema"],
    {
        "name": {"type": "string", "minLength": 1},
        "summary": _STR,
        "description": _STR,
        "required": {"type": "boolean"},
        "deprecated": {"type": "boolean"},
        "schema": {"type": ["object", "boolean"]},
    },
)
_REFERENCE = {"type": "object", "required": ["$ref"], "properties": {"$ref": _STR}, "additionalProperties": False}
_ERROR_OBJECT = {
    "type": "object",
    "required": ["code", "message"],
    "properties": {"code": {"type": "integer"}, "message": _STR, "data": {}},
    "additionalProperties": False,
}
#: The parts of the OpenRPC 1.3 meta-schema this document uses (root, info, servers, methods,
#: content descriptors, errors, components), written out here so the test runs offline.
_OPENRPC_SUBSET = Draft202012Validator(
    _obj(
        ["openrpc", "info", "methods"],
        {
            "openrpc": {"type": "string", "pattern": r"^1\.3\.\d+$"},
            "info": _obj(
                ["title", "version"],
                {"title": _STR, "version": _STR, "description": _STR, "license": _obj(["name"], {"name": _STR})},
            ),
            "servers": {
                "type": "array",
                "items": _obj(["url"], {"url": _STR, "name": _STR, "summary": _STR, "description": _STR}),
            },
            "methods": {
                "type": "array",
                "items": _obj(
                    ["name", "params"],
                    {
                        "name": {"type": "string", "minLength": 1},
                        "summary": _STR,
                        "description": _STR,
                        "paramStructure": {"enum": ["by-name", "by-position", "either"]},
                        "params": {"type": "array", "items": {"oneOf": [_CONTENT_DESCRIPTOR, _REFERENCE]}},
                        "result": {"oneOf": [_CONTENT_DESCRIPTOR, _REFERENCE]},
                        "errors": {"type": "array", "items": {"oneOf": [_ERROR_OBJECT, _REFERENCE]}},
                    },
                ),
            },
            "components": {
                "type": "object",
                "properties": {
                    "schemas": {"type": "object", "additionalProperties": {"type": "object"}},
                    "errors": {"type": "object", "additionalProperties": _ERROR_OBJECT},
                },
            },
        },
    )
)


def test_openrpc_subset_rejects_garbage(openrpc: dict[str, Any]) -> None:
    broken = copy.deepcopy(openrpc)
    broken["methods"][0]["params"][0]["required"] = "yes"
    assert not _OPENRPC_SUBSET.is_valid(broken)
    broken = copy.deepcopy(openrpc)
    broken["components"]["errors"]["WRITE_DENIED"]["schema"] = {}
    assert not _OPENRPC_SUBSET.is_valid(broken)


# --- docs/clients.md: its raw lines are contract-valid ----------------------------------------------

DOCS = REPO / "docs" / "clients.md"


def _fenced(text: str, lang: str) -> list[list[str]]:
    blocks: list[list[str]] = []
    current: list[str] | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if current is None and stripped == f"```{lang}":
            current = []
        elif current is not None and stripped == "```":
            blocks.append(current)
            current = None
        elif current is not None:
            current.append(stripped)
    return blocks


def test_docs_examples_follow_the_contract() -> None:
    text = DOCS.read_text(encoding="utf-8")
    blocks = _fenced(text, "ndjson")
    assert len(blocks) >= 8
    daemon_lines = 0
    for block in blocks:
        rec = ContractRecorder(strict_ids=False)
        for line in block:
            arrow, _, payload = line.partition(" ")
            assert arrow in ("→", "←"), line
            if arrow == "→":
                rec.sent(payload)
            else:
                rec.received(payload)
                daemon_lines += 1
    assert daemon_lines >= 25
    for block in _fenced(text, "json"):
        obj = json.loads("\n".join(block))
        assert is_valid("entry", obj) or is_valid("write", obj), obj


def test_docs_cover_the_surface() -> None:
    text = DOCS.read_text(encoding="utf-8")
    for name in (JSON_SCHEMA_PATH.name, OPENRPC_PATH.name, "x-notifications", "4 MiB", "approval/subscribe"):
        assert name in text, name
    for method in WIRE_METHODS + WIRE_NOTIFICATIONS:
        assert f"`{method}`" in text, method
    for code, rpc in WIRE_ERRORS.items():
        assert f"| `{code}` | {rpc} |" in text, code
