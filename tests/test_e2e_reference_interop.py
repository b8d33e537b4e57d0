"""The reference provider's own documents, against real daemons (tests/fixtures/reference).

- dsh-memento stores the session's cwd as ``workspaceKey`` even on user-global entries: its
  exports (envelope and mem0) import, the key dropped and counted in the result and in
  the approval.
- A saved ``{plugin, text}`` markdown export imports as the reference reads it, through
  the wire and through memoryctl; a JSON document without markdown is refused, the store
  unchanged.
- ``--track``/``--scope`` on import choose another layer.
- Small rules: a query's ``limit: 0`` means the default, a budget of 0 is refused at start.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
from e2e_helpers import state
from memoryd_client.cli import main
from memoryd_protocol import types as T
from memoryd_protocol.approval_text import approval_request
from rawclient import Raw, socket_client, write_ctx

pytestmark = pytest.mark.anyio

REF = Path(__file__).resolve().parent / "fixtures" / "reference"
#: the importing session: another workspace, no agent preset (memoryctl's default)
IMPORTER = write_ctx("imp", cwd="/home/u/elsewhere", agent="")
NOTE = ("user-global entries have no workspace: 3 of these named one (dsh-memento writes the session's cwd "
        "there) and are imported without it")


def fixture(name: str) -> Any:
    return json.loads((REF / name).read_text(encoding="utf-8"))


def reference_entries(name: str) -> list[tuple[str, str, str, list[str]]]:
    return [(e["track"], e["scope"], e["text"], e.get("tags", [])) for e in fixture(f"expected/{name}")["entries"]]


class Recorder:
    def __init__(self) -> None:
        self.asked: list[dict[str, Any]] = []

    async def __call__(self, params: dict[str, Any]) -> str:
        self.asked.append(params)
        return "allowed-once"


def layers(entries: list[dict[str, Any]]) -> list[tuple[str, str, str, str, str]]:
    return sorted((e["track"], e["scope"], e["workspaceKey"], e["agentKey"], e["text"]) for e in entries)


async def _import_dropping_keys(raw: Raw, params: dict[str, Any]) -> None:
    asked = Recorder()
    raw.on_approval = asked
    res = await raw.ok("memory/import", {**params, "write": IMPORTER})
    assert (res["added"], res["workspaceKeysDropped"]) == (5, 3)
    assert layers(await raw.ok("memory/list", {})) == [
        ("agent", "user-global", "", "", "Line one\nline two"),
        ("agent", "user-global", "", "coder", "Uses pnpm, never npm"),
        ("agent", "workspace", "/home/u/proj", "coder", "Run make check before pushing"),
        ("user", "user-global", "", "", "Prefers tea"),
        ("user", "workspace", "/home/u/proj", "", "Wants short answers in this repo"),
    ]
    (ask,) = asked.asked
    assert ask["workspaceKeysDropped"] == 3
    assert ask["text"].endswith("\n" + NOTE) and ask["reason"].endswith("\n" + NOTE)
    shown = approval_request(msgspec.convert(ask, T.ApprovalAsked))
    assert f"  note:    {NOTE}" in shown.split("\n")


async def test_the_references_envelope_imports_with_user_global_keys_dropped(ask_daemon: Any) -> None:
    async with socket_client(ask_daemon.socket_path) as raw:
        await _import_dropping_keys(raw, {"envelope": fixture("exports/envelope.json")})


async def test_the_references_mem0_export_imports_with_user_global_keys_dropped(ask_daemon: Any) -> None:
    async with socket_client(ask_daemon.socket_path) as raw:
        await _import_dropping_keys(raw, {"adapter": "mem0", "payload": fixture("exports/mem0.json")})


async def test_the_issues_minimal_envelope_imports(daemon: Any) -> None:
    envelope = {"plugin": "dsh-memento", "schema": "memory-export-v1", "entries": [
        {"track": "user", "scope": "user-global", "workspaceKey": "/home/u/proj", "text": "Prefers tea"}]}
    async with socket_client(daemon.socket_path) as raw:
        res = await raw.ok("memory/import", {"envelope": envelope, "write": IMPORTER})
        assert (res["added"], res["workspaceKeysDropped"], res["entries"][0]["workspaceKey"]) == (1, 1, "")
        # nothing to drop: the field stays out, as before
        envelope["entries"][0].update(workspaceKey="", text="Prefers coffee")
        res = await raw.ok("memory/import", {"envelope": envelope, "write": IMPORTER})
        assert res["added"] == 1 and "workspaceKeysDropped" not in res


@pytest.mark.parametrize("adapter", ["hermes-memory-md", "claude-code-memory-md"])
async def test_a_saved_markdown_export_imports_as_the_reference_reads_it(daemon: Any, adapter: str) -> None:
    """The file's raw text, as memoryctl sends it to a markdown adapter."""
    raw_text = (REF / "exports" / f"{adapter}.json").read_text(encoding="utf-8")
    async with socket_client(daemon.socket_path) as raw:
        res = await raw.ok("memory/import", {"adapter": adapter, "payload": raw_text, "write": IMPORTER})
        got = [(e["track"], e["scope"], e["text"], e["tags"]) for e in await raw.ok("memory/list", {})]
        assert got == reference_entries(f"exports--{adapter}.json--{adapter}.json")
        assert res["added"] == 5 and not any("plugin" in e[2] for e in got)


@pytest.mark.parametrize("adapter", ["hermes-memory-md", "claude-code-memory-md"])
@pytest.mark.parametrize(("doc", "says"), [
    ("exports/envelope.json", "payload is a memory-export-v1 envelope: import it without an adapter "
                              "(memoryctl import FILE)"),
    ("exports/mem0.json", "payload is a mem0 document: import it with the mem0 adapter "
                          "(memoryctl import --adapter mem0 FILE)"),
])
async def test_a_json_document_without_markdown_is_refused_and_changes_nothing(ask_daemon: Any, adapter: str,
                                                                               doc: str, says: str) -> None:
    async with socket_client(ask_daemon.socket_path) as raw:
        raw.on_approval = Recorder()
        await raw.ok("memory/add", {"input": {"track": "user", "scope": "user-global", "text": "Prefers tabs"},
                                    "write": write_ctx()})
        before = await state(raw)
        seen = len(raw.notifications)
        err = await raw.fail("memory/import", {"adapter": adapter, "payload": (REF / doc).read_text(encoding="utf-8"),
                                               "write": IMPORTER})
        assert (err.code, err.details, err.error["message"]) == ("ADAPTER_PAYLOAD", {"adapterId": adapter},
                                                                 f"{adapter}: {says}")
        assert [n for n in raw.notifications[seen:] if n["method"] == "approval/asked"] == []
        assert await state(raw) == before


async def test_track_and_scope_choose_the_layer_of_an_adapter_import(daemon_factory: Any, tmp_path: Path) -> None:
    claude_md = (REF / "real" / "python-sdk-CLAUDE.md").read_text(encoding="utf-8")
    cfg = tmp_path / "roomy.toml"
    cfg.write_text("[budgets.agent]\nworkspace = 10000\n")  # the file is 6,206 characters
    d = daemon_factory("--config", str(cfg))
    async with socket_client(d.socket_path) as raw:
        res = await raw.ok("memory/import", {"adapter": "claude-code-memory-md", "payload": claude_md,
                                             "track": "agent", "scope": "workspace", "write": IMPORTER})
        want = reference_entries("real--python-sdk-CLAUDE.md--claude-code-memory-md.json")
        assert res["added"] == len(want)
        assert [(e["track"], e["scope"], e["workspaceKey"], e["text"], e["tags"]) for e in res["entries"]] == [
            ("agent", "workspace", "/home/u/elsewhere", text, tags) for _, _, text, tags in want]
        before = await state(raw)
        err = await raw.fail("memory/import", {"envelope": fixture("exports/envelope.json"), "track": "agent",
                                               "write": IMPORTER})
        assert (err.code, err.details) == ("INVALID_INPUT", {"field": "track"})
        assert err.error["message"] == ("track and scope go with an adapter import: an envelope names each "
                                        "entry's track and scope")
        assert await state(raw) == before


async def test_query_limit_zero_is_the_default_limit(daemon_factory: Any, tmp_path: Path) -> None:
    """As the reference: a limit below 1 means max_entries_per_query."""
    cfg = tmp_path / "limit.toml"
    cfg.write_text("max_entries_per_query = 2\n")
    d = daemon_factory("--config", str(cfg))
    async with socket_client(d.socket_path) as raw:
        for text in ("one", "two", "three"):
            await raw.ok("memory/add", {"input": {"track": "user", "scope": "user-global", "text": text},
                                        "write": write_ctx()})
        for limit in (0, -1):
            res = await raw.ok("memory/query", {"filter": {"limit": limit}})
            assert (len(res["entries"]), res["total"], res["truncated"]) == (2, 3, True)


def test_a_budget_of_zero_is_refused_at_start(tmp_path: Path) -> None:
    """As the reference: every budget is a positive integer; the store is never created."""
    cfg = tmp_path / "zero.toml"
    cfg.write_text("[budgets.agent]\nworkspace = 0\n")
    sock_dir = tmp_path / "run"
    sock_dir.mkdir(mode=0o700)
    db = tmp_path / "memory.db"
    proc = subprocess.run([sys.executable, "-m", "memoryd", "serve", "--config", str(cfg), "--db", str(db),
                           "--socket", str(sock_dir / "m.sock")], capture_output=True, text=True, timeout=30,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 2
    assert "config: budgets.agent.workspace must be an integer from 1 to 10000000, got 0" in proc.stderr
    assert not db.exists()


def memoryctl(capsys: pytest.CaptureFixture[str], daemon: Any, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["--socket", str(daemon.socket_path), "--no-autostart", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_memoryctl_imports_the_references_saved_exports(daemon: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's command: a saved markdown export through a markdown adapter is read for its
    text; the envelope goes in with its user-global keys dropped, and the output says so."""
    code, out, err = memoryctl(capsys, daemon, "import", "--adapter", "claude-code-memory-md",
                               str(REF / "exports" / "claude-code-memory-md.json"))
    assert (code, out, err) == (0, "imported 5 entries, skipped 0 already in the store\n", "")
    code, out, _ = memoryctl(capsys, daemon, "--json", "list")
    stored = [(e["track"], e["scope"], e["text"], e["tags"]) for e in json.loads(out)]
    assert stored == reference_entries("exports--claude-code-memory-md.json--claude-code-memory-md.json")
    code, out, err = memoryctl(capsys, daemon, "import", str(REF / "exports" / "envelope.json"))
    # "Prefers tea" came in with the markdown already: same layer, same text. Its dropped key
    # is not counted, as nothing of it is written.
    assert (code, out, err) == (0, "imported 4 entries, skipped 1 already in the store; 2 user-global entries "
                                   "named a workspace and were imported without it\n", "")
    code, out, err = memoryctl(capsys, daemon, "import", "--track", "agent", str(REF / "exports" / "envelope.json"))
    assert (code, out) == (2, "")
    assert "import: --track and --scope go with --adapter" in err
