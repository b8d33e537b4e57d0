"""The methods table (memoryd_protocol.methods) and what derives from it. Pure: no process."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from memoryd_protocol import methods, types
from memoryd_protocol.constants import ERROR_CODES
from memoryd_protocol.methods import METHODS

#: What connection.py served inline before the table (rpc.py's NEVER_PARK), transcribed.
NEVER_PARKED_BEFORE = {
    "mcp/attach",  # added with the table: a lifecycle method, served inline
    "initialize", "memory/query", "memory/budgets", "memory/list", "audit/list", "audit/verify", "audit/explain",
    "memory/snapshot", "memory/export", "adapters/list", "proposals/create", "proposals/list", "proposals/dismiss",
    "approval/decided", "approval/subscribe", "daemon/status",
    "memory/watch",  # added after the table: it never waits, so it is served inline too
    "approval/challenge", "approval/prove",  # the approver key's (approvers = "keyed"), served inline too
    "audit/accept",  # a lifecycle method: it never waits for an approval, so it is served inline too
    "snapshots/prune",  # the same: a person's decision, never an approval's wait
}


def test_results_derive_from_the_table() -> None:
    assert list(METHODS) == list(methods.RESULTS)
    for name, m in METHODS.items():
        assert m.name == name
        assert methods.RESULTS[name] is m.result
    with pytest.raises(AttributeError):
        types.NO_SUCH_NAME  # type: ignore[attr-defined]  # noqa: B018


def test_the_methods_that_park_are_the_ones_never_served_inline_before() -> None:
    assert {name for name, m in METHODS.items() if not m.parks} == NEVER_PARKED_BEFORE


def test_a_method_parks_exactly_when_it_needs_an_agent_and_carries_a_write_context() -> None:
    for name, m in METHODS.items():
        fields = {f.encode_name: f for f in msgspec.structs.fields(m.params)}
        has_write = "write" in fields and fields["write"].required and fields["write"].type is types.Write
        assert m.parks == m.needs_agent == has_write, name
        if m.parks:
            assert m.kind == "write", name
            assert {"WRITE_REQUIRES_AGENT", "WRITE_DENIED"} <= set(m.errors), name


def test_every_row_names_known_errors_and_has_a_summary() -> None:
    for name, m in METHODS.items():
        assert m.kind in ("read", "write", "lifecycle"), name
        assert m.summary and m.summary == m.summary.strip(), name
        assert len(set(m.errors)) == len(m.errors), name
        assert set(m.errors) <= set(ERROR_CODES), name
        assert "WRITE_REQUIRES_AGENT" not in m.errors or m.needs_agent, name


def test_the_table_is_read_only() -> None:
    with pytest.raises(TypeError):
        METHODS["x/y"] = METHODS["initialize"]  # type: ignore[index]


# --- the clients derive from the table ---------------------------------------------------------


def python_name(method: str) -> str:
    """A method's name on the Python clients: the part after ``memory/`` (``import_`` for
    the keyword), the others with ``/`` as ``_``; ``daemon/status`` is ``status``."""
    special = {"memory/import": "import_", "daemon/status": "status"}
    if method in special:
        return special[method]
    return method.removeprefix("memory/").replace("/", "_")


def test_every_method_of_the_table_is_on_both_python_clients() -> None:
    from memoryd_client import Client, SyncClient
    from memoryd_client.client import WRITE_METHODS

    for name in (name for name, m in METHODS.items() if m.in_clients):
        assert callable(getattr(Client, python_name(name), None)), f"Client lacks {python_name(name)} for {name}"
        assert callable(getattr(SyncClient, python_name(name), None)), f"SyncClient lacks {python_name(name)} for {name}"
    assert {name for name, m in METHODS.items() if m.parks} == WRITE_METHODS


def test_the_node_client_is_generated_from_the_table_and_calls_every_method() -> None:
    from pathlib import Path

    from memoryd_protocol import schemas

    js = Path(__file__).resolve().parents[1] / "client" / "js"
    for name, text in schemas.generate_js().items():
        committed = (js / name).read_text(encoding="utf-8")
        assert committed == text, schemas.diff_summary(name, committed, text) + (
            "\nregenerate with: python -m memoryd_protocol.schemas")
    source = (js / "client.js").read_text(encoding="utf-8")  # the Client's method wrappers
    missing = [name for name, m in METHODS.items() if m.in_clients and f"'{name}'" not in source]
    assert missing == [], f"the Node client never calls {missing}"


#: The Node client's method for each wire method, where the rule (``group/name`` →
#: ``groupName``; ``memory/`` dropped) does not give it.
JS_METHOD_NAMES = {"daemon/status": "status", "initialize": "initialize"}
#: What the declarations say where the table's result is Any: the export envelope without
#: an adapter, an adapter's own payload with one.
JS_ANY_RESULTS = {"memory/export": ["ExportEnvelope", "unknown"]}


def _ts_result(result: Any) -> str:
    """The TypeScript return type the declarations must give a result type of the table."""
    import types as pytypes
    import typing

    if typing.get_origin(result) is list:
        return f"{_ts_result(typing.get_args(result)[0])}[]"
    if isinstance(result, pytypes.UnionType):
        return " | ".join("null" if a is type(None) else _ts_result(a) for a in typing.get_args(result))
    return str(result.__name__)


def test_the_node_declarations_give_every_method_of_the_table_its_result_type() -> None:
    """index.d.ts declares one client method per method of the table, and its Promise's type
    is the table's result type: a method added, renamed or retyped in one and not the other
    fails here."""
    import re
    from pathlib import Path

    declared: dict[str, list[str]] = {}
    source = (Path(__file__).resolve().parents[1] / "client" / "js" / "index.d.ts").read_text(encoding="utf-8")
    for name, result in re.findall(r"^  (\w+)\(.*\): Promise<(.+)>;$", source, re.M):
        declared.setdefault(name, []).append(result)
    expected: dict[str, list[str]] = {}
    for wire, m in METHODS.items():
        if not m.in_clients:
            continue
        group, _, rest = wire.partition("/")
        js = JS_METHOD_NAMES.get(wire) or (rest if group == "memory" else group + rest[:1].upper() + rest[1:])
        expected[js] = JS_ANY_RESULTS.get(wire) or [_ts_result(m.result)]
    assert {k: declared.get(k) for k in expected} == expected
