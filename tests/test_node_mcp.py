"""``memoryd mcp`` against MCP clients we did not write: the official TypeScript client
(``@modelcontextprotocol/client``, tests/node-mcp/mcp.test.js, run with ``node --test``) and
the MCP Inspector's CLI mode.

Their npm packages are pinned by tests/node-mcp/package-lock.json and installed with
``npm ci`` once, into a cache directory outside the checkout (``$MEMORYD_TEST_NODE_CACHE``,
else ``$XDG_CACHE_HOME/memoryd-tests``, else ``~/.cache/memoryd-tests``) named by the hash
of package.json and the lock: later sessions reuse it, a changed lock installs afresh, and
an flock keeps parallel workers to one install. The Node client package (client/js) stays
dependency-free; the checkout is never written to. node and npm are required (CI installs
them): a missing one fails the tests, it does not skip them.

The Inspector (2.12.0, as every release since 0.17) declares ``engines.node >= 22``, and
npm only warns about that; its CLI mode runs here, and in CI, on node 20. The Inspector is
run through its own bin (what ``npx @modelcontextprotocol/inspector`` runs), not npx: no
npm start-up, and nothing to fetch."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from memoryd_protocol import mcp_tools
from npm_cache import npm_install, require

HERE = Path(__file__).resolve().parent / "node-mcp"
RUN_TIMEOUT_S = 300
PROJ = "/home/u/proj"
TOOLS = ["memory_query", "memory_budgets", "memory_add", "memory_replace", "memory_remove",
         "memory_consolidate", "memory_propose", "memory_list"]


def _tool(name: str) -> str:
    return require(name)


@pytest.fixture(scope="session")
def mcp_clients() -> Path:
    """The directory holding node_modules with the pinned MCP clients, installed if needed
    (tests/npm_cache.py; --ignore-scripts: the Inspector's postinstall only sets up a source
    checkout of it)."""
    return npm_install(HERE)


@pytest.fixture
def run_dir(mcp_clients: Path) -> Iterator[Path]:
    """A fresh directory inside the install, holding a copy of the Node tests (ES modules
    resolve their imports from where the file is, so they run from under node_modules' parent)."""
    d = Path(tempfile.mkdtemp(prefix="run-", dir=mcp_clients))
    try:
        for f in HERE.glob("*.test.js"):
            shutil.copy2(f, d / f.name)
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def memoryd_command() -> list[str]:
    """``memoryd`` as a host's MCP config names it: the script the venv installed."""
    script = Path(sys.executable).parent / "memoryd"
    return [str(script)] if script.exists() else [sys.executable, "-m", "memoryd"]


def test_the_official_typescript_client(daemon_factory: Any, run_dir: Path) -> None:
    auto = daemon_factory(name="auto")
    ask = daemon_factory(policy="ask", name="ask")
    env = dict(os.environ, MEMORYD_MCP_COMMAND=json.dumps(memoryd_command()),
               MEMORYD_MCP_AUTO=json.dumps({"socket": str(auto.socket_path), "db": str(auto.db_path)}),
               MEMORYD_MCP_ASK=json.dumps({"socket": str(ask.socket_path), "db": str(ask.db_path)}))
    tests = sorted(p.name for p in run_dir.glob("*.test.js"))
    r = subprocess.run([_tool("node"), "--test", *tests], cwd=run_dir, env=env, capture_output=True, text=True,
                       timeout=RUN_TIMEOUT_S)
    out = r.stdout[-8000:] + r.stderr[-3000:]
    assert r.returncode == 0, out
    assert "# pass 8\n" in r.stdout and "# fail 0\n" in r.stdout, out


@pytest.mark.parametrize("era", ["legacy", "modern"])
def test_the_mcp_inspector_cli_lists_the_tools(daemon_factory: Any, mcp_clients: Path, tmp_path: Path,
                                               era: str) -> None:
    d = daemon_factory()
    home = tmp_path / "home"  # the Inspector keeps a catalog and its client config under ~
    home.mkdir()
    inspector = mcp_clients / "node_modules" / ".bin" / "mcp-inspector"
    # --strict: the Inspector's tool-schema portability check, exit 6 on an error-severity finding
    argv = [str(inspector), "--cli", "--format", "json", "--strict", "--protocol-era", era, "--method", "tools/list",
            "--", *memoryd_command(), "mcp", "--socket", str(d.socket_path), "--db", str(d.db_path), "--cwd", PROJ]
    r = subprocess.run(argv, env=dict(os.environ, HOME=str(home)), capture_output=True, text=True,
                       timeout=RUN_TIMEOUT_S)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    tools = json.loads(r.stdout)["result"]["tools"]
    assert [t["name"] for t in tools] == [t.name for t in mcp_tools.TOOLS] == TOOLS
    for t in tools:
        assert t["annotations"]["readOnlyHint"] is (t["name"] in ("memory_query", "memory_budgets", "memory_list"))
        assert t.get("annotations", {}).get("destructiveHint", False) is (
            t["name"] in ("memory_remove", "memory_consolidate"))
