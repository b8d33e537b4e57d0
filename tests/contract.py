"""Contract checks for end-to-end tests: every daemon → client message against the schemas.

The schemas are the committed files in ``<repo>/schemas/`` (the drift test in
``test_schemas.py`` keeps them equal to what ``memoryd_protocol.types`` generates), so an e2e
test that runs its traffic through here checks the real daemon against the published
contract.

Usage::

    from contract import validate_message, ContractRecorder

    validate_message(obj, method="memory/add")    # one parsed response/notification

    rec = ContractRecorder()
    rec.sent(request_line)          # remembers id → method for requests
    obj = rec.received(reply_line)  # parses, validates (result schema by the request's method)
    rec.assert_all_answered()

Every mismatch raises ``AssertionError`` naming the message and the failing schema path.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

SCHEMA_DIR = Path(__file__).resolve().parents[1] / "schemas"
JSON_SCHEMA_PATH = SCHEMA_DIR / "dsh-memory-protocol-v1.schema.json"
OPENRPC_PATH = SCHEMA_DIR / "memoryd.openrpc.json"
OPENRPC_URI = "urn:memoryd:openrpc"

_RESPONSE_KEYS = {"jsonrpc", "id", "result", "error"}
_NOTIFICATION_KEYS = {"jsonrpc", "method", "params"}


# --- schema loading (once per test session) ------------------------------------------------


@cache
def json_schema_doc() -> dict[str, Any]:
    return json.loads(JSON_SCHEMA_PATH.read_text(encoding="utf-8"))


@cache
def openrpc_doc() -> dict[str, Any]:
    return json.loads(OPENRPC_PATH.read_text(encoding="utf-8"))


@cache
def _registry() -> Registry:
    schema = json_schema_doc()
    return Registry().with_resources(
        [
            (schema["$id"], Resource.from_contents(schema, default_specification=DRAFT202012)),
            # The OpenRPC document is not a schema, but its component schemas are: register it
            # as a 2020-12 resource so that '#/components/schemas/x' refs resolve inside it.
            (OPENRPC_URI, Resource(contents=openrpc_doc(), specification=DRAFT202012)),
        ]
    )


@cache
def _validator(ref: str) -> Draft202012Validator:
    """A validator for the schema at ``ref`` (an absolute URI with a JSON pointer)."""
    return Draft202012Validator({"$ref": ref}, registry=_registry())


def _pointer(*parts: str | int) -> str:
    return "/".join(str(p).replace("~", "~0").replace("/", "~1") for p in parts)


@cache
def method_names() -> tuple[str, ...]:
    return tuple(m["name"] for m in openrpc_doc()["methods"])


@cache
def notification_names() -> tuple[str, ...]:
    return tuple(
        n["name"] for n in openrpc_doc()["x-notifications"]["notifications"] if n["direction"] == "daemon→client"
    )


def result_validator(method: str) -> Draft202012Validator:
    """The RESULTS schema of ``method``."""
    for i, m in enumerate(openrpc_doc()["methods"]):
        if m["name"] == method:
            return _validator(f"{OPENRPC_URI}#/{_pointer('methods', i, 'result', 'schema')}")
    raise AssertionError(f"no such method in the OpenRPC document: {method!r}")


def notification_validator(method: str) -> Draft202012Validator:
    """The params schema of the daemon → client notification ``method``."""
    for i, n in enumerate(openrpc_doc()["x-notifications"]["notifications"]):
        if n["name"] == method and n["direction"] == "daemon→client":
            return _validator(f"{OPENRPC_URI}#/{_pointer('x-notifications', 'notifications', i, 'paramsSchema')}")
    raise AssertionError(f"daemon sent an undocumented notification: {method!r}")


def definition_validator(name: str) -> Draft202012Validator:
    """A ``$defs`` entry of the JSON Schema file, e.g. ``entry``, ``exportEnvelope``, ``error``."""
    return _validator(f"{json_schema_doc()['$id']}#/$defs/{name}")


# --- checks ----------------------------------------------------------------------------------


def _short(obj: Any, limit: int = 600) -> str:
    text = json.dumps(obj, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[:limit] + "…"


def _trim(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def check(validator: Draft202012Validator, instance: Any, what: str, message: Any) -> None:
    """Raise AssertionError with the most relevant schema error, if any."""
    error = best_match(validator.iter_errors(instance))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "(root)"
        raise AssertionError(
            f"{what} violates the contract at {where}: {_trim(error.message)}\n"
            f"  schema path: {'/'.join(str(p) for p in error.absolute_schema_path)}\n"
            f"  message: {_short(message)}"
        )


def _is_id(value: Any) -> bool:
    return value is None or isinstance(value, str) or (isinstance(value, int | float) and not isinstance(value, bool))


def validate_error(error: Any, message: Any = None) -> None:
    """A JSON-RPC ``error`` member: ``{code, message, data: {code, message, details}}`` with
    ``code`` fixed by ``data.code`` and ``data.message`` equal to ``message``."""
    ctx = message if message is not None else error
    if not isinstance(error, dict):
        raise AssertionError(f"error member is not an object: {_short(ctx)}")
    extra = set(error) - {"code", "message", "data"}
    if extra:
        raise AssertionError(f"error object has unexpected members {sorted(extra)}: {_short(ctx)}")
    if "data" not in error:
        raise AssertionError(f"error without data (memoryd always sends data.code): {_short(ctx)}")
    check(definition_validator("error"), error["data"], "error.data", ctx)
    check(definition_validator("rpcError"), error, "error", ctx)
    if error["data"]["message"] != error["message"]:
        raise AssertionError(f"error.data.message differs from error.message: {_short(ctx)}")


def validate_message(line_obj: Any, method: str | Mapping[Any, str] | None = None) -> None:
    """Validate one parsed daemon → client message (or a batch array of responses).

    - Every message must be JSON-RPC 2.0: a response ``{jsonrpc, id, result|error}`` or a
      notification ``{jsonrpc, method, params}``; the daemon never sends requests.
    - A response's ``result`` is checked against the result schema of ``method`` (the method
      that was called; pass ``None`` to check the shape only). For a batch, ``method`` may be
      a mapping of request id → method.
    - An ``error`` is checked against the error schema (and the code table).
    - A notification's ``params`` is checked against its notification schema.
    """
    if isinstance(line_obj, list):
        if not line_obj:
            raise AssertionError("daemon sent an empty batch array")
        for item in line_obj:
            if isinstance(method, Mapping):
                item_method = method.get(item.get("id")) if isinstance(item, dict) else None
            else:
                item_method = method
            validate_message(item, item_method)
        return
    msg = line_obj
    if not isinstance(msg, dict):
        raise AssertionError(f"daemon message is not a JSON object: {_short(msg)}")
    if msg.get("jsonrpc") != "2.0":
        raise AssertionError(f'daemon message lacks "jsonrpc": "2.0": {_short(msg)}')

    if "method" in msg:
        if "id" in msg:
            raise AssertionError(f"daemon sent a request (method with id); it only sends notifications: {_short(msg)}")
        extra = set(msg) - _NOTIFICATION_KEYS
        if extra:
            raise AssertionError(f"notification has unexpected members {sorted(extra)}: {_short(msg)}")
        name = msg["method"]
        if not isinstance(name, str):
            raise AssertionError(f"notification method is not a string: {_short(msg)}")
        if "params" not in msg:
            raise AssertionError(f"notification {name} without params: {_short(msg)}")
        check(notification_validator(name), msg["params"], f"params of notification {name}", msg)
        return

    extra = set(msg) - _RESPONSE_KEYS
    if extra:
        raise AssertionError(f"response has unexpected members {sorted(extra)}: {_short(msg)}")
    if "id" not in msg:
        raise AssertionError(f"response without id: {_short(msg)}")
    if not _is_id(msg["id"]):
        raise AssertionError(f"response id is not a string, number or null: {_short(msg)}")
    has_result, has_error = "result" in msg, "error" in msg
    if has_result == has_error:
        raise AssertionError(f"response must have exactly one of result/error: {_short(msg)}")
    if has_error:
        validate_error(msg["error"], msg)
        return
    if msg["id"] is None:
        raise AssertionError(f"successful response with id null: {_short(msg)}")
    if isinstance(method, str):
        if method not in method_names():
            raise AssertionError(f"not a documented method: {method!r}")
        check(result_validator(method), msg["result"], f"result of {method}", msg)


def validate_definition(name: str, instance: Any) -> None:
    """Validate ``instance`` against ``#/$defs/<name>`` of the JSON Schema file
    (e.g. an exported envelope: ``validate_definition("exportEnvelope", doc)``)."""
    check(definition_validator(name), instance, name, instance)


# --- a recorder around raw-line clients --------------------------------------------------


def _parse(line: str | bytes | Any) -> Any:
    if isinstance(line, bytes | bytearray):
        line = line.decode("utf-8")
    if isinstance(line, str):
        try:
            return json.loads(line)
        except json.JSONDecodeError as exc:
            raise AssertionError(f"daemon line is not JSON ({exc}): {line[:300]!r}") from None
    return line


class ContractRecorder:
    """Validates one connection's traffic: feed it what the client sends and what it receives.

    ``sent`` remembers request id → method (requests in batches too); ``received`` parses a
    daemon line, validates it (results against the schema of the method whose id they answer),
    checks that every response answers an outstanding id exactly once, and returns the parsed
    object. ``messages`` keeps every received message in order.

    With ``strict_ids=False``, responses to ids the recorder never saw are shape-checked only
    (useful when a test sends some lines around the recorder).
    """

    def __init__(self, *, strict_ids: bool = True) -> None:
        self.strict_ids = strict_ids
        self.pending: dict[Any, str] = {}
        self.messages: list[Any] = []
        self.notifications: list[dict[str, Any]] = []

    def sent(self, line: str | bytes | Any) -> Any:
        """Record a client → daemon line (a str/bytes line or the object). Returns the object.
        Lines that are not valid requests are recorded as nothing (the daemon answers them
        with id null)."""
        if isinstance(line, str | bytes | bytearray):
            try:
                obj = _parse(line)
            except AssertionError:
                return None  # a deliberately broken line: the answer will carry id null
        else:
            obj = line
        for item in obj if isinstance(obj, list) else [obj]:
            if isinstance(item, dict) and "id" in item and isinstance(item.get("method"), str):
                key = _key(item["id"])
                if key in self.pending:
                    raise AssertionError(f"test sent id {item['id']!r} while it is still outstanding")
                self.pending[key] = item["method"]
        return obj

    def received(self, line: str | bytes | Any) -> Any:
        """Parse and validate one daemon → client line; returns the parsed object."""
        obj = _parse(line)
        self.messages.append(obj)
        for item in obj if isinstance(obj, list) else [obj]:
            self._one(item)
        return obj

    def _one(self, item: Any) -> None:
        if isinstance(item, dict) and "method" in item and "id" not in item:
            validate_message(item)
            self.notifications.append(item)
            return
        method: str | None = None
        if isinstance(item, dict) and "id" in item and item["id"] is not None:
            key = _key(item["id"])
            if key in self.pending:
                method = self.pending.pop(key)
            elif self.strict_ids:
                raise AssertionError(
                    f"response to an id that is not outstanding (duplicate or unknown): {_short(item)}"
                )
        validate_message(item, method)

    def assert_all_answered(self) -> None:
        if self.pending:
            raise AssertionError(f"requests never answered: {self.pending}")

    def notifications_named(self, method: str) -> list[dict[str, Any]]:
        return [n for n in self.notifications if n.get("method") == method]


def _key(request_id: Any) -> Any:
    # JSON-RPC ids are compared by value and type: 1 and "1" are different ids.
    return (type(request_id).__name__, request_id)


__all__ = [
    "ContractRecorder",
    "definition_validator",
    "notification_validator",
    "result_validator",
    "validate_definition",
    "validate_error",
    "validate_message",
]
