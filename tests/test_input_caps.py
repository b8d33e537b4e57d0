"""Caps on what a client names itself, and bytes that are not UTF-8: each a clear
INVALID_INPUT (or -32700), never -32603, never a traceback, and nothing written."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import add, state
from inprocess import memory_daemon

pytestmark = pytest.mark.anyio


def initialize(client: dict[str, Any]) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                       "params": {"protocol": "dsh-memory-protocol/v1", "client": client}}).encode()


@pytest.mark.parametrize(("client", "field", "message"), [
    ({"name": "x" * 257}, "client.name", "client.name longer than 256 characters"),
    ({"name": "n" * 3_000_000}, "client.name", "client.name longer than 256 characters"),
    ({"name": "tool\nname"}, "client.name", "client.name must not contain control characters"),
    ({"name": "tool", "version": "1\u0085"}, "client.version", "client.version must not contain control characters"),
    ({"name": "\ud800"}, "client.name", "client.name contains a lone UTF-16 surrogate"),
], ids=["257-units", "3-MB", "newline", "C1-control", "lone-surrogate"])
async def test_a_client_name_or_version_that_cannot_be_stored_is_invalid_input(
        tmp_path: Path, client: dict[str, Any], field: str, message: str) -> None:
    async with memory_daemon(["--db", str(tmp_path / "m.db"), "--write-policy", "auto",
                              "--config", str(_big_messages(tmp_path))]) as d, d.connect(initialize=False) as raw:
        await raw.send_line(initialize(client))
        reply = await raw.raw_reply()
        assert reply["error"]["data"]["code"] == "INVALID_INPUT"
        assert reply["error"]["data"]["details"] == {"field": field}
        assert reply["error"]["message"] == message
        # the connection goes on, as the name it gave was never taken
        await raw.send_line(initialize({"name": "tool", "version": "1.0"}))
        assert (await raw.raw_reply())["result"]["protocol"] == "dsh-memory-protocol/v1"
        before = await state(raw)
        await add(raw, "written after the refused names")
        listing = await raw.ok("daemon/status", {})
        assert {c["client"]["name"] for c in listing["connectionList"] if c.get("client")} == {"tool"}
        assert (await state(raw))[2] > before[2]


async def test_a_name_of_256_units_is_taken(tmp_path: Path) -> None:
    async with memory_daemon(["--db", str(tmp_path / "m.db"), "--write-policy", "auto"]) as d, \
            d.connect(initialize=False) as raw:
        await raw.send_line(initialize({"name": "é" * 256, "version": "v" * 256}))
        assert "result" in await raw.raw_reply()


async def test_bytes_that_are_not_utf8_inside_params_are_invalid_input_and_write_nothing(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async with memory_daemon(["--db", str(tmp_path / "m.db"), "--write-policy", "auto"]) as d, d.connect() as raw:
        await add(raw, "before")
        before = await state(raw)
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger="memoryd"):
            await raw.send_line(b'{"jsonrpc":"2.0","id":7,"method":"memory/add","params":{"input":{"track":"user",'
                                b'"scope":"user-global","text":"caf\xe9"},"write":{"agent":{}}}}')
            reply = await raw.raw_reply()
            assert reply["id"] == 7
            assert reply["error"]["data"]["code"] == "INVALID_INPUT"
            assert reply["error"]["data"]["details"] == {"field": "params"}
            assert reply["error"]["message"] == "invalid params: a string is not valid UTF-8"
            await raw.send_line(b'{"jsonrpc":"2.0","id":8,"method":"memory/q\xffuery","params":{}}')
            reply = await raw.raw_reply()
            assert (reply["id"], reply["error"]["code"]) == (None, -32700)
        assert [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info] == []
        assert await state(raw) == before


def _big_messages(tmp_path: Path) -> Path:
    """A config that admits a 3 MB line (the default max_message_bytes does too; said here)."""
    cfg = tmp_path / "memoryd.toml"
    cfg.write_text("max_message_bytes = 4194304\n")
    return cfg


async def test_a_connection_binds_at_most_max_sessions_per_connection(tmp_path: Path) -> None:
    """Each session id a connection names is bound to it; one beyond the config's cap is
    refused with INVALID_INPUT naming the key, changes nothing, and the ids it holds go on
    working. Closing the connection lets go of them."""
    cfg = tmp_path / "memoryd.toml"
    cfg.write_text("max_sessions_per_connection = 2\n")
    async with memory_daemon(["--db", str(tmp_path / "m.db"), "--write-policy", "auto",
                              "--config", str(cfg)]) as d:
        async with d.connect() as raw:
            await raw.ok("memory/snapshot", {"session": {"id": "s-a"}})
            await raw.ok("memory/query", {"opts": {"sessionId": "s-b"}})
            before = await state(raw)
            err = await raw.fail("memory/snapshot", {"session": {"id": "s-c"}})
            assert (err.code, err.details) == ("INVALID_INPUT", {"field": "session.id"})
            assert err.error["message"] == ("this connection already holds 2 sessions; reuse one of their ids, open another "
                                            "connection, or raise max_sessions_per_connection in the daemon's config")
            assert await state(raw) == before
            await raw.ok("memory/snapshot", {"session": {"id": "s-a"}})  # held already: not counted again
        async with d.connect() as other:
            await other.ok("memory/snapshot", {"session": {"id": "s-c"}})


async def test_every_query_that_names_its_session_leaves_its_recalled_row(tmp_path: Path) -> None:
    """A query's recall bookkeeping cannot fail for anything its request passed validation
    for: from connections whose names are as odd as initialize admits (non-ASCII, 256
    units, astral characters), every query naming a session has its ``recalled`` row."""
    names = ["é" * 256, "工具🧠" * 60, "x"]
    async with memory_daemon(["--db", str(tmp_path / "m.db"), "--write-policy", "auto"]) as d:
        async with d.connect() as writer:
            await add(writer, "a fact to recall")
        queries = 0
        for n, name in enumerate(names):
            async with d.connect(initialize=False) as raw:
                await raw.send_line(initialize({"name": name, "version": name[:16]}))
                assert "result" in await raw.raw_reply()
                for k in range(3):
                    await raw.ok("memory/query", {"filter": {"text": "fact"}, "opts": {"sessionId": f"s-{n}-{k}"}})
                    queries += 1
        async with d.connect() as reader:
            rows = await reader.ok("audit/list", {"limit": 1000})
    recalled = sorted(r["sessionId"] for r in rows if r["action"] == "recalled")
    assert recalled == sorted(f"s-{n}-{k}" for n in range(len(names)) for k in range(3))
    assert len(recalled) == queries
