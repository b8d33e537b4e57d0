"""What a consolidate and an import say of their source and layer: memoryctl's consolidate
labels its entry ``memoryctl`` (as ``add`` does), not the protocol's default ``dsh-memento``;
an import's approval names the entries' own layers, never the seed's ``batch/batch``."""

from __future__ import annotations

import json
import subprocess
import sys
from functools import partial
from typing import Any

import anyio
import msgspec
import pytest
from memoryd_protocol import types as T
from memoryd_protocol.approval_text import approval_request
from rawclient import socket_client, write_ctx

pytestmark = pytest.mark.anyio
UG = ["--track", "user", "--scope", "user-global"]


async def memoryctl(daemon: Any, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "memoryd_client", "--socket", str(daemon.socket_path), "--no-autostart", *args]
    return await anyio.to_thread.run_sync(partial(subprocess.run, argv, capture_output=True, text=True, timeout=60,
                                                  stdin=subprocess.DEVNULL, start_new_session=True))


async def sources(daemon: Any) -> dict[str, str]:
    r = await memoryctl(daemon, "list", "--json")
    assert r.returncode == 0, r.stderr
    return {e["text"]: e["source"] for e in json.loads(r.stdout)}


async def imported(daemon: Any, entries: list[dict[str, Any]]) -> T.ApprovalAsked:
    """Import ``entries`` (an envelope), allowed: the one approval it asked."""
    asked: list[dict[str, Any]] = []

    async def allow(params: dict[str, Any]) -> str:
        asked.append(params)
        return "allowed-once"

    envelope = {"plugin": "dsh-memento", "schema": "memory-export-v1", "entries": entries}
    async with socket_client(daemon.socket_path) as raw:
        raw.on_approval = allow
        result = await raw.ok("memory/import", {"envelope": envelope, "write": write_ctx()})
    assert result["added"] == len(entries)
    (params,) = asked
    return msgspec.convert(params, T.ApprovalAsked)


async def test_consolidate_labels_its_entry_memoryctl_unless_told(daemon: Any) -> None:
    for text in ("Uses vim", "Uses tmux", "Uses zsh", "Uses fish"):
        assert (await memoryctl(daemon, "add", *UG, text)).returncode == 0
    r = await memoryctl(daemon, "consolidate", *UG, "-m", "vim", "-m", "tmux", "Uses vim inside tmux")
    assert r.returncode == 0, r.stderr
    r = await memoryctl(daemon, "consolidate", *UG, "-m", "zsh", "-m", "fish", "--source", "dotfiles", "Uses zsh, fish")
    assert r.returncode == 0, r.stderr
    assert await sources(daemon) == {"Uses vim inside tmux": "memoryctl", "Uses zsh, fish": "dotfiles"}


async def test_an_import_s_approval_names_its_layers_not_batch(ask_daemon: Any) -> None:
    text = approval_request(await imported(ask_daemon, [
        {"track": "user", "scope": "user-global", "text": "Prefers tea", "source": "claude"},
        {"track": "agent", "scope": "user-global", "text": "Runs pytest", "source": "claude"}]))
    assert "batch" not in text
    assert text.splitlines()[0] == "seed 2 entries into 2 layers:"
    assert "  source:  claude" in text.splitlines()


async def test_an_import_of_several_sources_names_each_never_the_default(ask_daemon: Any) -> None:
    asked = await imported(ask_daemon, [
        {"track": "user", "scope": "user-global", "text": "Prefers tea", "source": "claude"},
        {"track": "user", "scope": "user-global", "text": "Uses vim", "source": "memoryctl"},
        {"track": "user", "scope": "user-global", "text": "Runs pytest", "source": "claude"}])
    assert [e.source for e in asked.entries or []] == ["claude", "memoryctl", "claude"]
    lines = approval_request(asked).splitlines()
    assert "  sources: claude (2 entries), memoryctl (1 entry)" in lines
    assert not any("dsh-memento" in line for line in lines)


def test_a_source_with_the_list_s_punctuation_is_quoted() -> None:
    def entry(source: str) -> T.ApprovalEntry:
        return T.ApprovalEntry(track="user", scope="user-global", workspace_key="", agent_key="", text="x", tags=[],
                               source=source)

    asked = T.ApprovalAsked(id="i", action="seed", track="batch", scope="batch", text="", source="dsh-memento",
                            session_id=None, reason="", entries=[entry("a"), entry("b, c (9 entries)"), entry("a")])
    lines = approval_request(asked).splitlines()
    assert '  sources: a (2 entries), "b, c (9 entries)" (1 entry)' in lines
    # from a daemon that names no entry's source: the write's own
    asked.entries = [entry("")]
    assert "  source:  dsh-memento" in approval_request(asked).splitlines()
