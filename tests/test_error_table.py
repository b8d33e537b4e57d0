"""One error table: constants.ERROR_CODES (wire-v1 §7). Every place that lists the protocol's
errors again (the classes, the by-code map, each package's exports, the Node client's
constants and classes) lists exactly its codes: a code added or dropped in one place and
not another fails here. Pure: reads the packages and the Node client's source."""

from __future__ import annotations

import re
from pathlib import Path

import memoryd_client
import memoryd_client.errors as client_errors
from memoryd_protocol import errors
from memoryd_protocol.constants import ERROR_CODES, RPC_LEVEL_CODES

JS = Path(__file__).resolve().parents[1] / "client" / "js"


def _camel(code: str) -> str:
    return "".join(word.capitalize() for word in code.split("_"))


CLASSES = {_camel(code) for code in ERROR_CODES}


def test_each_code_has_one_class_and_the_by_code_map_is_theirs() -> None:
    assert {name for name in CLASSES if isinstance(getattr(errors, name, None), type)} == CLASSES
    for code, rpc in ERROR_CODES.items():
        cls = getattr(errors, _camel(code))
        assert (cls.CODE, cls.RPC_CODE) == (code, rpc)
        assert errors.from_wire({"code": rpc, "message": "m", "data": {"code": code, "details": {}}}).__class__ is cls


def test_the_python_packages_export_every_class_once() -> None:
    """The protocol's errors module names every class; the client package re-exports them
    (its users catch ``memoryd_client.BudgetExceeded``) beside its own, which are not the
    protocol's."""
    own = {"ProtocolError", "RpcError", "from_wire"}
    assert set(errors.__all__) == CLASSES | own
    assert CLASSES | own <= set(memoryd_client.__all__)
    for name in CLASSES | own:
        assert getattr(memoryd_client, name) is getattr(errors, name)
    assert not set(client_errors.__all__) & (CLASSES | own)


def test_the_node_client_derives_every_code_and_class_from_the_table() -> None:
    """The Node client's constants and classes for the protocol's codes are generated
    (protocol.js, protocol.d.ts: test_methods_table checks they are what the generator
    writes); only the client's own failures are written by hand, once each."""
    from memoryd_protocol.schemas import generate_js, js_error_class

    generated = generate_js()
    every = set(ERROR_CODES) | set(RPC_LEVEL_CODES.values())
    js, dts = generated["protocol.js"], generated["protocol.d.ts"]
    assert set(re.findall(r"^export const ([A-Z_]+) = '\1';$", js, re.M)) == every
    assert set(re.findall(r"^export class (\w+) extends MemorydError \{\}$", js, re.M)) == {
        js_error_class(c) for c in every}
    assert set(re.findall(r"^export declare class (\w+) extends MemorydError<", dts, re.M)) == {
        js_error_class(c) for c in every}
    source = (JS / "errors.js").read_text(encoding="utf-8")
    client_codes = {"CONNECTION_CLOSED", "CONNECTION_FAILED", "TIMEOUT", "ABORTED", "PROTOCOL_ERROR"}
    assert set(re.findall(r"^  ([A-Z_]+): '\1',$", source, re.M)) == client_codes
    assert not every & client_codes
    assert set(re.findall(r"^export class (\w+)", source, re.M)) == {
        "ConnectionClosedError", "ConnectionFailedError", "CallTimeoutError", "AbortedError"}
    assert not set(re.findall(r"\b([A-Z][A-Z_]+)\b", source)) & every
