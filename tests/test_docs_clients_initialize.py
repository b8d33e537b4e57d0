"""docs/clients.md's transcripts show initialize's result as a real daemon gives it: every
field, none more (the budgets' usage aside, which depends on what the transcript wrote)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from rawclient import socket_client

pytestmark = pytest.mark.anyio

DOC = Path(__file__).resolve().parent.parent / "docs" / "clients.md"
_LINE = re.compile(r"^([→←]) (\{.*\})$")


def initialize_exchanges() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Each ``initialize`` request the document shows, with the reply it shows to it."""
    lines = [(m.group(1), json.loads(m.group(2))) for ln in DOC.read_text(encoding="utf-8").splitlines()
             if (m := _LINE.match(ln))]
    out = []
    for n, (direction, msg) in enumerate(lines):
        if direction == "→" and msg.get("method") == "initialize":
            (reply,) = [m for d, m in lines[n + 1:n + 4] if d == "←" and m.get("id") == msg["id"]]
            out.append((msg, reply))
    return out


def without_usage(result: dict[str, Any]) -> dict[str, Any]:
    return {**result, "budgets": [{k: v for k, v in row.items() if k != "used"} for row in result["budgets"]]}


def test_the_document_shows_its_initialize_exchanges() -> None:
    assert len(initialize_exchanges()) == 2


async def test_each_initialize_result_shown_is_what_the_daemon_says(ask_daemon: Any) -> None:
    for request, shown in initialize_exchanges():
        async with socket_client(ask_daemon.socket_path, initialize=False) as raw:
            result = await raw.ok("initialize", request["params"])
        assert sorted(result) == sorted(shown["result"])
        assert without_usage(result) == without_usage(shown["result"])
