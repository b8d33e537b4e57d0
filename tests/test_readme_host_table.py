"""The README's "Tested here" line and host table say what tests/test_real_hosts.py pins
and found: the host versions it installs (its VERSIONS, and the npm locks that install
them) and, per host, the elicitation and ``instructions`` its CAPABILITIES record. So is
tests/hosts/FINDINGS.md's version line. Written by hand, checked here."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from test_real_hosts import CAPABILITIES, VERSIONS

ROOT = Path(__file__).resolve().parent.parent
NAMES = {"Claude Code": "claude-code", "Gemini CLI": "gemini-cli", "Codex": "codex"}
#: each host's npm package, as the lock names it
PACKAGES = {"claude-code": "@anthropic-ai/claude-code", "gemini-cli": "@google/gemini-cli", "codex": "@openai/codex"}
TABLE_HEAD = ("| host | elicitation (the approval dialog) | `instructions` into the model's context "
              "| a tool error, as the model reads it |")


def _locked(lock: str, package: str) -> str:
    packages = json.loads((ROOT / lock).read_text(encoding="utf-8"))["packages"]
    return str(packages[f"node_modules/{package}"]["version"])


def _readme() -> str:
    return (ROOT / "README.md").read_text(encoding="utf-8")


def _table() -> dict[str, list[str]]:
    """The host table's rows, by host: the host's version, then its other cells."""
    lines = _readme().split(TABLE_HEAD + "\n", 1)[1].splitlines()
    rows: dict[str, list[str]] = {}
    for line in lines[1:]:
        if not line.startswith("|"):
            break
        host, *cells = [c.strip() for c in line.strip("|").split(" | ")]
        name, version = host.rsplit(" ", 1)
        rows[NAMES[name]] = [version, *cells]
    return rows


def test_the_pinned_versions_agree_with_the_locks() -> None:
    assert {host: _locked("tests/hosts/package-lock.json", p) for host, p in PACKAGES.items()} == VERSIONS


def test_the_tested_here_line_names_the_pinned_versions() -> None:
    text = " ".join(_readme().split())
    m = re.search(r"Tested here, in CI \(`tests/test_real_hosts\.py`\): Claude Code (\S+), Gemini CLI (\S+) and "
                  r"Codex (\S+), installed from npm at the versions `tests/hosts/package-lock\.json` pins, and the "
                  r"MCP Inspector (\S+)'s CLI\.", text)
    assert m is not None, "README.md has no \"Tested here\" line naming the three hosts' and the Inspector's versions"
    named = dict(zip(["claude-code", "gemini-cli", "codex", "inspector"], m.groups(), strict=True))
    assert named == {**VERSIONS, "inspector": _locked("tests/node-mcp/package-lock.json",
                                                      "@modelcontextprotocol/inspector")}


def test_the_findings_name_the_pinned_versions() -> None:
    first = (ROOT / "tests/hosts/FINDINGS.md").read_text(encoding="utf-8").split("\n\n", 2)[1]
    inspector = _locked("tests/node-mcp/package-lock.json", "@modelcontextprotocol/inspector")
    assert " ".join(first.split()) == (
        f"Versions: Claude Code {VERSIONS['claude-code']}, Gemini CLI {VERSIONS['gemini-cli']}, Codex "
        f"{VERSIONS['codex']} (npm, pinned by tests/hosts/package-lock.json); MCP Inspector {inspector} "
        "(tests/node-mcp).")


def _elicitation(declared: Any) -> str:
    """How the table's elicitation cell begins for what a host declares."""
    return "no" if declared is None else f"yes ({' and '.join(sorted(declared))})"


def test_the_host_table_says_what_the_tests_found() -> None:
    rows = _table()
    assert sorted(rows) == sorted(CAPABILITIES)
    for host, (version, elicitation, instructions, _error) in rows.items():
        found = CAPABILITIES[host]
        assert version == VERSIONS[host], (host, version)
        assert re.match(rf"{re.escape(_elicitation(found['elicitation']))}(?![\w ])", elicitation), (host, elicitation)
        assert re.match(rf"{'yes' if found['instructions'] else 'no'}\b", instructions), (host, instructions)
