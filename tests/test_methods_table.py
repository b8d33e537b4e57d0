"""The methods table (memoryd_protocol.methods) and what derives from it. Pure: no process."""

from __future__ import annotations

import msgspec
import pytest
from memoryd_protocol import methods, types
from memoryd_protocol.constants import ERROR_CODES
from memoryd_protocol.methods import METHODS

#: What connection.py served inline before the table (rpc.py's NEVER_PARK), transcribed.
NEVER_PARKED_BEFORE = {
    "initialize", "memory/query", "memory/budgets", "memory/list", "audit/list", "audit/verify", "audit/explain",
    "memory/snapshot", "memory/export", "adapters/list", "proposals/create", "proposals/list", "proposals/dismiss",
    "approval/decided", "approval/subscribe", "daemon/status",
}


def test_params_and_results_derive_from_the_table() -> None:
    assert list(types.PARAMS) == list(METHODS) == list(types.RESULTS)
    for name, m in METHODS.items():
        assert m.name == name
        assert types.PARAMS[name] is m.params and types.RESULTS[name] is m.result
    assert types.PARAMS is methods.PARAMS and types.RESULTS is methods.RESULTS
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
