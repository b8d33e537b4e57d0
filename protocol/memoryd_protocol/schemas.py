"""The normative machine-readable contract, generated from the wire types.

Two documents come out of :mod:`memoryd_protocol.types` and the methods table
(:mod:`memoryd_protocol.methods`: each method's params, result, summary and errors):

- ``schemas/dsh-memory-protocol-v1.schema.json``: JSON Schema 2020-12 for the protocol's data
  model (``$defs``: entry, entryInput, budgetRow, exportEnvelope, auditRow, proposal, error,
  rpcError and the write context), with every constraint of the seed spec §2;
- ``schemas/memoryd.openrpc.json``: OpenRPC 1.3 for memoryd's JSON-RPC surface (wire-v1.md §4),
  with the daemon → client notifications in an ``x-notifications`` extension and the error
  table (wire-v1.md §7) in ``components/errors``.

msgspec derives the shapes; this module applies what the Structs cannot say (UUID patterns,
tag limits, unique items, per-code error details, descriptions: :mod:`.schema_patches`) and
renders both documents
deterministically (sorted keys, 2-space indent, trailing newline). Everything here is pure
except :func:`main`, which writes the files (``python -m memoryd_protocol.schemas``) or checks
the committed ones (``--check``).
"""

from __future__ import annotations

import argparse
import copy
import difflib
import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import msgspec

from . import types as t
from .constants import (
    ERROR_CODES,
    EXPORT_SCHEMA,
    PROTOCOL,
    RPC_LEVEL_CODES,
)
from .methods import METHODS
from .schema_patches import (
    ERROR_DETAILS,
    ERROR_MESSAGES,
    FIELD_PATCHES,
    RESULT_PATCHES,
    STRUCT_PATCHES,
    UTF16_COMMENT,
    all_error_codes,
    error_data_schema,
    error_schema,
    rpc_error_schema,
)

JSON = dict[str, Any]

JSON_SCHEMA_FILE: Final = "dsh-memory-protocol-v1.schema.json"
OPENRPC_FILE: Final = "memoryd.openrpc.json"
SCHEMA_ID: Final = "urn:dsh-memory-protocol:v1:schema"
DRAFT_2020_12: Final = "https://json-schema.org/draft/2020-12/schema"
OPENRPC_VERSION: Final = "1.3.2"
#: The version of the OpenRPC document's API description (memoryd's wire contract v1).
API_VERSION: Final = "1.0.0"

JSON_SCHEMA_REF: Final = "#/$defs/"
OPENRPC_REF: Final = "#/components/schemas/"
_PLACEHOLDER: Final = "@@memoryd-ref@@"

# --- schema plumbing -----------------------------------------------------------------------


def def_name(struct_name: str) -> str:
    """``ExportEnvelope`` → ``exportEnvelope``: the name under ``$defs`` / ``components``."""
    return struct_name[:1].lower() + struct_name[1:]


def _rewrite_refs(node: Any, prefix: str) -> Any:
    if isinstance(node, dict):
        out: JSON = {}
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str) and value.startswith(_PLACEHOLDER):
                out[key] = prefix + def_name(value[len(_PLACEHOLDER) :])
            else:
                out[key] = _rewrite_refs(value, prefix)
        return out
    if isinstance(node, list):
        return [_rewrite_refs(item, prefix) for item in node]
    return node


def _merge(target: JSON, patch: Mapping[str, Any]) -> None:
    """Deep-merge ``patch`` into ``target`` (dicts recursively, everything else replaced)."""
    for key, value in patch.items():
        if isinstance(value, Mapping) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


def _patch_property(prop: JSON, patch: Mapping[str, Any]) -> None:
    """Apply a fragment to a property schema; for ``anyOf: [X, null]`` to X (annotations
    such as ``description`` stay on the property itself)."""
    branches = prop.get("anyOf")
    if isinstance(branches, list) and any(b == {"type": "null"} for b in branches):
        notes = {k: v for k, v in patch.items() if k in ("description", "$comment")}
        rest = {k: v for k, v in patch.items() if k not in notes}
        for branch in branches:
            if branch != {"type": "null"} and "$ref" not in branch:
                _merge(branch, rest)
        _merge(prop, notes)
    else:
        _merge(prop, patch)


def _apply_patches(components: dict[str, JSON]) -> None:
    for struct, patches in FIELD_PATCHES.items():
        schema = components.get(struct)
        if schema is None:
            continue
        props = schema["properties"]
        for field_name, patch in patches.items():
            if field_name not in props:
                raise KeyError(f"schema patch for unknown field {struct}.{field_name}")
            _patch_property(props[field_name], patch)
    for struct, patch in STRUCT_PATCHES.items():
        if struct in components:
            _merge(components[struct], patch)


def struct_schemas(roots: Iterable[Any], prefix: str) -> tuple[list[JSON], dict[str, JSON]]:
    """msgspec's schemas for ``roots`` (and everything they reference), patched, refs as
    ``prefix + defName``. Returns (one schema per root, named components)."""
    roots = list(roots)
    raw_roots, raw_components = msgspec.json.schema_components(roots, ref_template=_PLACEHOLDER + "{name}")
    components: dict[str, JSON] = {name: copy.deepcopy(schema) for name, schema in raw_components.items()}
    _apply_patches(components)
    named = {def_name(name): _rewrite_refs(schema, prefix) for name, schema in components.items()}
    return [_rewrite_refs(copy.deepcopy(s), prefix) for s in raw_roots], named


# --- the JSON Schema document ------------------------------------------------------------

DATA_MODEL: Final[tuple[type[msgspec.Struct], ...]] = (
    t.Entry,
    t.EntryInput,
    t.BudgetRow,
    t.ExportEnvelope,
    t.AuditRow,
    t.Proposal,
    t.Write,
)


def json_schema_document() -> JSON:
    _, defs = struct_schemas(DATA_MODEL, JSON_SCHEMA_REF)
    defs["error"] = error_schema()
    defs["rpcError"] = rpc_error_schema(JSON_SCHEMA_REF)
    return {
        "$schema": DRAFT_2020_12,
        "$id": SCHEMA_ID,
        "title": "dsh-memory-protocol v1",
        "description": (
            f"Normative JSON Schema of {PROTOCOL}: the entry model (seed spec §2), entry inputs, budget "
            "rows, the memory-export-v1 envelope, audit rows, proposals, the write context and the "
            "error data memoryd sends. The root accepts anything; validate against a definition, "
            "e.g. '#/$defs/entry' or '#/$defs/exportEnvelope'. Generated from memoryd_protocol.types "
            "by 'python -m memoryd_protocol.schemas'; do not edit by hand."
        ),
        "$comment": UTF16_COMMENT,
        "$defs": defs,
    }


# --- the OpenRPC document ----------------------------------------------------------------

#: notification → summary (daemon → client).
NOTIFICATION_DOCS: Final[dict[str, str]] = {
    "approval/asked": (
        "A write under policy ask waits for a decision. Sent to the connection that issued the write "
        "(or, for a connection with capabilities.approvals false, to every approver). Answer with "
        "approval/decided {id, outcome}."
    ),
    "approval/resolved": (
        "An approval this connection was asked was resolved without its decision (another approver "
        "decided first, it timed out, the issuing connection went away): close the prompt."
    ),
    "memory/added": (
        "A committed add/seed/import/consolidate/proposal entry, with the writing session's sessionId (sent to "
        "the writing connection, and to every connection watching a session that sees the entry: memory/watch)."
    ),
    "memory/updated": (
        "A committed replace: {previous, entry, sessionId}; watchers get it when their session sees the "
        "previous entry or the new one."
    ),
    "memory/removed": "A committed remove (and each consolidated target), with the writing session's sessionId.",
    "memory/recalled": "A query with opts.sessionId ran: {query, matches, sessionId}; matches is the hit count.",
    "memory/snapshot": "The first snapshot of a session was rendered: {sessionId, text}.",
}

OPENRPC_DESCRIPTION: Final = (
    "memoryd speaks JSON-RPC 2.0 over a Unix stream socket or stdio, framed as newline-delimited "
    "JSON (one message per line, UTF-8; a JSON array on one line is a batch; default maximum line "
    "4 MiB). Params are always by name. The normative wire contract is shared/design/wire-v1.md; "
    "the data model is schemas/dsh-memory-protocol-v1.schema.json (same definitions as "
    "components/schemas here).\n\n"
    "Notifications: OpenRPC 1.3 has no first-class way to describe notifications the server sends "
    "to the client, so they are listed in the 'x-notifications' extension at the root (direction "
    "daemon→client), together with the client→daemon notification form of approval/decided. "
    "Clients must route every incoming line by shape: 'method' without 'id' is a notification, "
    "'result' or 'error' is a response.\n\n"
    "Errors (wire-v1.md §7): every error carries data = {code, message, details}; branch on "
    "data.code, never on the message. In components/errors, each Error Object's 'data' member is "
    "the JSON Schema of error.data for that code (the OpenRPC Error Object has no schema field). "
    "Any method may also fail with INTERNAL_ERROR (-32603), and any line with PARSE_ERROR, "
    "INVALID_REQUEST or METHOD_NOT_FOUND.\n\n" + UTF16_COMMENT
)


def _param_descriptors(cls: type[msgspec.Struct], schema: JSON) -> list[JSON]:
    props = schema["properties"]
    required = set(schema.get("required", []))
    out: list[JSON] = []
    for info in msgspec.structs.fields(cls):
        name = info.encode_name
        prop = copy.deepcopy(props[name])
        descriptor: JSON = {"name": name, "required": name in required, "schema": prop}
        if "description" in prop:
            descriptor["description"] = prop["description"]
        out.append(descriptor)
    return out


def _export_result(prefix: str) -> JSON:
    return {
        "description": (
            "Without 'adapter': the memory-export-v1 envelope. With 'adapter': that adapter's own "
            "document (any JSON value). A document that says schema: memory-export-v1 must be a "
            "valid envelope."
        ),
        "if": {
            "type": "object",
            "properties": {"schema": {"const": EXPORT_SCHEMA}},
            "required": ["schema"],
        },
        "then": {"$ref": prefix + "exportEnvelope"},
    }


def openrpc_document() -> JSON:
    prefix = OPENRPC_REF
    table = list(METHODS.values())
    params_types = [m.params for m in table]
    result_types = [m.result for m in table]
    note_types = list(t.NOTIFICATIONS.values())
    roots = [*DATA_MODEL, *params_types, *result_types, *note_types]
    root_schemas, schemas = struct_schemas(roots, prefix)
    schemas["error"] = error_schema()
    schemas["rpcError"] = rpc_error_schema(prefix)
    n_model, n_params = len(DATA_MODEL), len(params_types)
    result_schemas = root_schemas[n_model + n_params : n_model + 2 * n_params]

    codes = all_error_codes()
    methods: list[JSON] = []
    for m, result_schema in zip(table, result_schemas, strict=True):
        params_schema = schemas[def_name(m.params.__name__)]
        result = _export_result(prefix) if m.name == "memory/export" else copy.deepcopy(result_schema)
        _merge(result, RESULT_PATCHES.get(m.name, {}))
        methods.append(
            {
                "name": m.name,
                "summary": m.summary,
                "paramStructure": "by-name",
                "params": _param_descriptors(m.params, params_schema),
                "result": {"name": "result", "schema": result},
                "errors": [{"$ref": f"#/components/errors/{code}"} for code in m.errors],
                "x-paramsSchema": {"$ref": prefix + def_name(m.params.__name__)},
            }
        )

    notes: list[tuple[str, type[msgspec.Struct], str, str]] = [
        (method, cls, "daemon→client", NOTIFICATION_DOCS[method]) for method, cls in t.NOTIFICATIONS.items()]
    notes.append(("approval/decided", t.ApprovalDecidedParams, "client→daemon",
                  "The notification form of the approval/decided method (no id, so no response): the "
                  "decision is applied the same way; a refused decision is silently dropped."))
    notifications = [
        {
            "name": method,
            "direction": direction,
            "summary": summary,
            "paramStructure": "by-name",
            "params": _param_descriptors(cls, schemas[def_name(cls.__name__)]),
            "paramsSchema": {"$ref": prefix + def_name(cls.__name__)},
        }
        for method, cls, direction, summary in notes
    ]

    errors_doc = {
        code: {"code": rpc, "message": ERROR_MESSAGES[code], "data": error_data_schema(code)}
        for code, rpc in codes.items()
    }
    return {
        "openrpc": OPENRPC_VERSION,
        "info": {
            "title": "memoryd",
            "version": API_VERSION,
            "description": OPENRPC_DESCRIPTION,
            "license": {"name": "MIT"},
        },
        "servers": [
            {
                "name": "unix-socket",
                "url": "unix:$XDG_RUNTIME_DIR/memoryd/memoryd.sock",
                "summary": "Shared daemon: many connections, many sessions.",
                "description": (
                    "Unix stream socket (directory 0700, socket 0600). Without XDG_RUNTIME_DIR: "
                    "<system temp dir>/memoryd-<uid>/memoryd.sock. 'memoryd serve --socket PATH' overrides."
                ),
            },
            {
                "name": "stdio",
                "url": "stdio:memoryd",
                "summary": "A harness spawns 'memoryd serve --stdio' as a child.",
                "description": "Requests on stdin; responses and notifications on stdout; logs on stderr.",
            },
        ],
        "methods": methods,
        "components": {"schemas": schemas, "errors": errors_doc},
        "x-notifications": {
            "description": (
                "OpenRPC 1.3 has no first-class notifications. These are the notifications memoryd "
                "sends (direction daemon→client, at any time between responses, as "
                "{jsonrpc: '2.0', method, params} without id) and the one it accepts "
                "(approval/decided, direction client→daemon). params is by name; paramsSchema is "
                "the schema of the whole params object."
            ),
            "notifications": notifications,
        },
    }


# --- rendering and the command line ------------------------------------------------------


def render(doc: Mapping[str, Any]) -> str:
    """Deterministic JSON text: sorted keys, 2-space indent, UTF-8 characters, trailing newline."""
    return json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def generate() -> dict[str, str]:
    """File name → file text, for every generated document."""
    return {
        JSON_SCHEMA_FILE: render(json_schema_document()),
        OPENRPC_FILE: render(openrpc_document()),
    }


#: The Node client's generated module (beside its hand-written ones in client/js).
JS_PROTOCOL_FILE: Final = "protocol.js"
JS_PROTOCOL_TYPES_FILE: Final = "protocol.d.ts"
_JS_HEADER = (
    "// Generated by `python -m memoryd_protocol.schemas` from memoryd_protocol's methods table\n"
    "// and error table. Do not edit: the test suite checks it is what the generator writes.\n"
)


def _js_object(items: Sequence[tuple[str, str]], indent: str = "  ") -> str:
    body = "".join(f"{indent}{json.dumps(k)}: {v},\n" for k, v in items)
    return "Object.freeze({\n" + body + indent[:-2] + "})"


def js_error_class(code: str) -> str:
    """The Node client's class of an error code: ``BUDGET_EXCEEDED`` → ``BudgetExceededError``."""
    name = "".join(word.capitalize() for word in code.split("_"))
    return name if name.endswith("Error") else name + "Error"


def _ts_type(schema: JSON) -> str:
    """The TypeScript type of an error detail's JSON Schema (the few forms ERROR_DETAILS uses)."""
    if "enum" in schema:
        return " | ".join(json.dumps(v).replace(chr(34), chr(39)) for v in schema["enum"])
    kind = schema.get("type")
    if isinstance(kind, list):
        return " | ".join(_ts_type({"type": k}) for k in kind)
    if kind == "array":
        return f"{_ts_type(schema['items'])}[]"
    return {"string": "string", "integer": "number", "number": "number", "boolean": "boolean",
            "null": "null"}[str(kind)]


def _ts_details(details: JSON) -> str:
    props = details.get("properties", {})
    if not props:
        return "Record<string, never>"
    required = set(details.get("required", []))
    fields = [f"{k}{'' if k in required else '?'}: {_ts_type(v)}" for k, v in props.items()]
    return "{ " + "; ".join(fields) + " }"


def generate_js() -> dict[str, str]:
    """File name → text of the Node client's generated module and its types: the error
    codes, their string constants and classes, each error's details, and every method
    (kind, whether it can wait for an approval, whether it needs an agent), so the Node
    client derives from the same tables as the daemon."""
    rpc_level = {name: code for code, name in RPC_LEVEL_CODES.items()}
    every = [*ERROR_CODES, *rpc_level]
    methods = [(name, f"Object.freeze({{ kind: {json.dumps(m.kind)}, parks: {json.dumps(m.parks)}, "
                      f"needsAgent: {json.dumps(m.needs_agent)} }})") for name, m in METHODS.items()]
    js = (_JS_HEADER + "\n"
          "import { MemorydError } from './error-base.js';\n\n"
          "/** Protocol error codes (`error.data.code` on the wire) → JSON-RPC error code. */\n"
          f"export const ERROR_CODES = {_js_object([(k, str(v)) for k, v in ERROR_CODES.items()])};\n\n"
          "/** JSON-RPC-level failures (they also carry `data.code` on the wire). */\n"
          f"export const RPC_LEVEL_CODES = {_js_object([(k, str(v)) for k, v in rpc_level.items()])};\n\n"
          "// Every code as a string constant: `import { BUDGET_EXCEEDED } from 'memoryd-client'`.\n"
          + "".join(f"export const {c} = '{c}';\n" for c in every) + "\n"
          "// One class per code: `err instanceof BudgetExceededError`.\n"
          + "".join(f"export class {js_error_class(c)} extends MemorydError {{}}\n" for c in every) + "\n"
          "/** Code → its class. */\n"
          f"export const ERROR_CLASSES = {_js_object([(c, js_error_class(c)) for c in every])};\n\n"
          "/** Every method of the wire contract: its kind, whether it can wait for an approval (a write\n"
          " * through the gate), and whether it needs `write.agent`. */\n"
          f"export const METHODS = {_js_object(methods)};\n")

    def union(names: Sequence[str]) -> str:
        return "".join(f"\n  | {json.dumps(n).replace(chr(34), chr(39))}" for n in names)

    def details(code: str) -> str:
        return f"ErrorDetails['{code}']" if code in ERROR_DETAILS else "Record<string, unknown>"

    dts = (_JS_HEADER + "\n"
           "import type { MemorydError } from './index.js';\n\n"
           f"export type ProtocolErrorCode ={union(list(ERROR_CODES))};\n"
           f"export type RpcLevelErrorCode ={union(list(rpc_level))};\n"
           f"export type MethodName ={union(list(METHODS))};\n\n"
           "/** `error.data.details` of each protocol error (wire-v1 §7). */\n"
           "export interface ErrorDetails {\n"
           + "".join(f"  {c}: {_ts_details(d)};\n" for c, d in ERROR_DETAILS.items()) + "}\n\n"
           "export interface MethodInfo {\n"
           "  readonly kind: 'read' | 'write' | 'lifecycle';\n"
           "  readonly parks: boolean;\n"
           "  readonly needsAgent: boolean;\n"
           "}\n\n"
           "export declare const ERROR_CODES: Readonly<Record<ProtocolErrorCode, number>>;\n"
           "export declare const RPC_LEVEL_CODES: Readonly<Record<RpcLevelErrorCode, number>>;\n"
           + "".join(f"export declare const {c}: '{c}';\n" for c in every) + "\n"
           + "".join(f"export declare class {js_error_class(c)} extends MemorydError<{details(c)}> {{}}\n"
                     for c in every) + "\n"
           "export declare const ERROR_CLASSES: Readonly<Record<ProtocolErrorCode | RpcLevelErrorCode, "
           "typeof MemorydError>>;\n"
           "export declare const METHODS: Readonly<Record<MethodName, MethodInfo>>;\n")
    return {JS_PROTOCOL_FILE: js, JS_PROTOCOL_TYPES_FILE: dts}


def default_js_dir() -> Path:
    """``<repo>/client/js`` for a source checkout (the Node client lives there)."""
    return Path(__file__).resolve().parents[2] / "client" / "js"


def default_out_dir() -> Path:
    """``<repo>/schemas`` for a source checkout, else ``./schemas``."""
    repo = Path(__file__).resolve().parents[2]
    if (repo / "pyproject.toml").is_file():
        return repo / "schemas"
    return Path.cwd() / "schemas"


def diff_summary(name: str, committed: str | None, generated: str, max_lines: int = 40) -> str:
    if committed is None:
        return f"{name}: missing (would be created, {generated.count(chr(10))} lines)"
    diff = list(
        difflib.unified_diff(
            committed.splitlines(), generated.splitlines(), f"committed/{name}", f"generated/{name}", lineterm=""
        )
    )
    added = sum(1 for line in diff if line.startswith("+") and not line.startswith("+++"))
    removed = sum(1 for line in diff if line.startswith("-") and not line.startswith("---"))
    shown = diff[:max_lines]
    more = [f"... ({len(diff) - max_lines} more diff lines)"] if len(diff) > max_lines else []
    return "\n".join([f"{name}: differs (+{added} -{removed} lines)", *shown, *more])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m memoryd_protocol.schemas",
        description="Generate the JSON Schema and OpenRPC documents from memoryd_protocol.types.",
    )
    parser.add_argument("--out", type=Path, default=None, help="output directory (default: <repo>/schemas)")
    parser.add_argument(
        "--check", action="store_true", help="do not write; exit 1 with a diff summary if the files differ"
    )
    args = parser.parse_args(argv)
    out: Path = args.out if args.out is not None else default_out_dir()
    targets = {out / name: text for name, text in generate().items()}
    if args.out is None and default_js_dir().is_dir():
        targets.update({default_js_dir() / name: text for name, text in generate_js().items()})
    if args.check:
        stale = []
        for path, text in targets.items():
            name = path.name
            committed = path.read_text(encoding="utf-8") if path.is_file() else None
            if committed != text:
                stale.append(diff_summary(name, committed, text))
        if stale:
            print("\n\n".join(stale))
            print(f"\nschemas out of date in {out}; run: python -m memoryd_protocol.schemas", file=sys.stderr)
            return 1
        print(f"schemas up to date in {out}")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    for path, text in targets.items():
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
